"""Hopper-legal decoders: low-precision codes to float16 / float32 with integer operations only.

On sm_90 Mosaic GPU rejects ``float4_e2m1fn`` and ``float8_e8m0fnu`` casts, and the H200's ptxas
(ISA 9.0) rejects fp8 -> bf16 (NVIDIA PTX ISA, ``cvt``). These decoders build the
target's bit pattern from the code with shifts, masks and selects, then reinterpret it, so they
lower on sm_90a and sm_100a, run in GPU interpret mode, and give the same bits under NumPy and
jitted JAX on any backend (no float arithmetic, so no flush-to-zero can touch them).

They are kernel building blocks: call them on register arrays inside a Pallas kernel, or on whole
arrays outside one. Every element value of E2M1, E4M3 and E5M2 is exact in float16, so
"decode to f16, then a 16-bit wgmma with f32 accumulation" computes exact products.

========================  ======================================================================
``e2m1_to_f16(codes)``    FP4 code (low 4 bits; sign bit 3) -> float16 (±0 .. ±6)
``e4m3_to_f16(codes)``    OCP E4M3 (fn) code -> float16; ``S.1111.111`` -> NaN with that sign
``e5m2_to_f16(codes)``    E5M2 code -> float16 (the code is the top byte of the float16)
``e8m0_to_f32(codes)``    UE8M0 scale code -> float32 ``2^(code-127)``; 0x00 -> 2^-127 (the
                          float32 subnormal, as bits), 0xFF -> NaN
``e8m0_exponent(codes)``  UE8M0 code -> int32 exponent ``code - 127`` (0xFF gives 128)
``ue4m3_to_f32(codes)``   NVFP4 UE4M3 scale code -> float32 (via the E4M3 decoder, sign ignored)
``unpack_e2m1(packed)``   one packed byte -> (even code, odd code): even index in the low nibble
========================  ======================================================================

Inputs may be any unsigned or signed integer dtype holding the code in its low bits (higher bits
are ignored), e.g. uint8 codes, or uint32 words after a widening. Outputs have the input's shape.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fp4sim._xp import bitcast_in_kernel as bitcast
from fp4sim._xp import namespace

__all__ = [
    "e2m1_to_f16",
    "e4m3_to_f16",
    "e5m2_to_f16",
    "e8m0_to_f32",
    "e8m0_exponent",
    "ue4m3_to_f32",
    "unpack_e2m1",
]

_U32 = np.uint32


def _u32(codes: Any) -> Any:
    """The codes widened to uint32 (an integer conversion; no float operation)."""
    dt = np.dtype(codes.dtype)
    if dt.kind not in "ui":
        raise TypeError(f"codes has dtype {dt}; allowed: an integer dtype holding the codes")
    return codes.astype(np.uint32)


def e2m1_to_f16(codes: Any) -> Any:
    """E2M1 (FP4) codes -> float16. Normal: f16 exponent field ``e + 14``, mantissa bit 9;
    subnormal (e == 0): ``m · 0.5`` = bits ``m · 0x3800``."""
    xp = namespace(codes)
    c = _u32(codes)
    s, e, m = (c >> _U32(3)) & _U32(1), (c >> _U32(1)) & _U32(3), c & _U32(1)
    mag = xp.where(e == 0, m * _U32(0x3800), ((e + _U32(14)) << _U32(10)) | (m << _U32(9)))
    return bitcast((mag | (s << _U32(15))).astype(np.uint16), np.float16)


def e4m3_to_f16(codes: Any) -> Any:
    """OCP E4M3 (``float8_e4m3fn``) codes -> float16, exactly.

    Normal: f16 exponent field ``e + 8`` (bias 7 -> 15), mantissa shifted up by 7. Subnormal
    ``m · 2^-9`` (m = 1..7) is normal in f16: the leading one of m sets the exponent field
    ``6 + floor(log2 m)`` and the bits below it the mantissa. ``S.1111.111`` is NaN.
    """
    xp = namespace(codes)
    c = _u32(codes)
    s, e, m = (c >> _U32(7)) & _U32(1), (c >> _U32(3)) & _U32(15), c & _U32(7)
    normal = ((e + _U32(8)) << _U32(10)) | (m << _U32(7))
    lead = xp.where(m >= _U32(4), _U32(2), xp.where(m >= _U32(2), _U32(1), _U32(0)))
    sub = ((lead + _U32(6)) << _U32(10)) | ((m << (_U32(10) - lead)) & _U32(0x3FF))
    mag = xp.where(e == 0, xp.where(m == 0, _U32(0), sub), normal)
    mag = xp.where((e == _U32(15)) & (m == _U32(7)), _U32(0x7E00), mag)
    return bitcast((mag | (s << _U32(15))).astype(np.uint16), np.float16)


def e5m2_to_f16(codes: Any) -> Any:
    """E5M2 codes -> float16: E5M2 is float16 with the low 8 mantissa bits dropped."""
    c = _u32(codes)
    return bitcast(((c & _U32(0xFF)) << _U32(8)).astype(np.uint16), np.float16)


def e8m0_to_f32(codes: Any) -> Any:
    """UE8M0 scale codes -> float32 ``2^(code-127)``; 0x00 is 2^-127 = bits 0x00400000 (an f32
    subnormal, built as bits so no flush-to-zero touches it); 0xFF is NaN."""
    xp = namespace(codes)
    b = _u32(codes) & _U32(0xFF)
    bits = xp.where(b == 0, _U32(0x00400000), b << _U32(23))
    bits = xp.where(b == _U32(0xFF), _U32(0x7FC00000), bits)
    return bitcast(bits, np.float32)


def e8m0_exponent(codes: Any) -> Any:
    """UE8M0 scale codes -> int32 power-of-two exponents ``code - 127`` (0xFF gives 128)."""
    return (_u32(codes) & _U32(0xFF)).astype(np.int32) - np.int32(127)


def ue4m3_to_f32(codes: Any) -> Any:
    """UE4M3 (NVFP4 block scale) codes -> float32; the sign bit is ignored, 0x7F is NaN."""
    return e4m3_to_f16(_u32(codes) & _U32(0x7F)).astype(np.float32)


def unpack_e2m1(packed: Any) -> tuple[Any, Any]:
    """Packed FP4 bytes -> (even-index codes, odd-index codes): the even element is the low
    nibble (fp4sim's and PTX's packing order)."""
    p = _u32(packed)
    return p & _U32(0xF), (p >> _U32(4)) & _U32(0xF)

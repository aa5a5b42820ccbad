"""Sub-byte storage of element codes: two FP4 codes per byte, four FP6 codes per three bytes.

This module owns how unpacked codes (one per uint8, as :mod:`fp4sim.formats.codec` returns them)
are laid out in memory, along the last axis:

* FP4, ``NibbleOrder.LOW_FIRST`` (default; torchao ``pack_uint4``, TransformerEngine, triton,
  FlashInfer, CUTLASS): byte ``k`` holds element ``2k`` in bits 0-3 and element ``2k+1`` in bits 4-7.
  (PTX ``cvt.rn.satfinite.e2m1x2.f32 d, a, b`` puts ``a`` in the *high* nibble, so kernels pass
  ``(odd, even)``.)
* FP4, ``NibbleOrder.SPLIT_HALF`` (llama.cpp/ggml ``block_mxfp4``): within each group of 32
  elements, byte ``j`` holds element ``j`` in the low and element ``j + 16`` in the high nibble.
* FP6 (E2M3, E3M2): each group of four codes is a little-endian 24-bit word
  ``c0 | c1 << 6 | c2 << 12 | c3 << 18`` stored as three bytes, least significant first.

``pack``/``unpack`` are exact inverses on valid codes, written once for NumPy and jax arrays.
"""

from __future__ import annotations

import enum
from typing import Any

import numpy as np

from fp4sim._xp import is_jax, namespace
from fp4sim.formats.spec import FloatFormat

__all__ = ["NibbleOrder", "pack", "unpack", "packed_length"]

_SPLIT = 32  # ggml's MXFP4 block


class NibbleOrder(enum.Enum):
    """Pairing of FP4 codes into bytes."""

    LOW_FIRST = "low_first"
    SPLIT_HALF = "split_half"


def _bits(elem: FloatFormat) -> int:
    if not isinstance(elem, FloatFormat):
        raise TypeError(f"elem={elem!r} must be a FloatFormat")
    if elem.nbits not in (4, 6):
        raise ValueError(f"elem={elem} has {elem.nbits}-bit codes; packing is defined for 4-bit "
                         f"(E2M1) and 6-bit (E2M3, E3M2) formats")
    return elem.nbits


def packed_length(n: int, elem: FloatFormat) -> int:
    """Bytes that ``n`` codes of ``elem`` occupy."""
    return n // 2 if _bits(elem) == 4 else n * 3 // 4


def _check_order(order: Any, bits: int) -> None:
    if not isinstance(order, NibbleOrder):
        raise TypeError(f"order={order!r} must be a NibbleOrder; allowed: "
                        f"{[o.name for o in NibbleOrder]}")
    if bits == 6 and order is not NibbleOrder.LOW_FIRST:
        raise ValueError(f"order={order.name} applies to FP4 only; FP6 packing has one layout")


def pack(codes: Any, elem: FloatFormat, *, order: NibbleOrder = NibbleOrder.LOW_FIRST) -> Any:
    """Pack uint8 ``codes`` of a 4- or 6-bit ``elem`` along the last axis."""
    bits = _bits(elem)
    _check_order(order, bits)
    xp = namespace(codes)
    codes = xp.asarray(codes)
    if np.dtype(codes.dtype) != np.uint8:
        raise TypeError(f"codes has dtype {codes.dtype}; allowed: uint8")
    if codes.ndim == 0:
        raise ValueError("codes must have at least one dimension")
    n = codes.shape[-1]
    group = {4: 2, 6: 4}[bits] if order is NibbleOrder.LOW_FIRST else _SPLIT
    if n % group:
        raise ValueError(f"codes has a last axis of length {n}; {elem} packing with "
                         f"{order.name} needs a multiple of {group}")
    if not is_jax(codes) and codes.size and int(codes.max()) >> bits:
        raise ValueError(f"codes contains {int(codes.max()):#x}, not a {bits}-bit {elem} code")
    lead = codes.shape[:-1]
    c = codes & np.uint8((1 << bits) - 1)
    if bits == 4:
        if order is NibbleOrder.LOW_FIRST:
            pairs = xp.reshape(c, lead + (n // 2, 2))
            lo, hi = pairs[..., 0], pairs[..., 1]
        else:
            halves = xp.reshape(c, lead + (n // _SPLIT, 2, _SPLIT // 2))
            lo = xp.reshape(halves[..., 0, :], lead + (n // 2,))
            hi = xp.reshape(halves[..., 1, :], lead + (n // 2,))
        return (lo | (hi << np.uint8(4))).astype(np.uint8)
    q = xp.reshape(c.astype(np.uint32), lead + (n // 4, 4))
    word = q[..., 0] | (q[..., 1] << 6) | (q[..., 2] << 12) | (q[..., 3] << 18)
    out = xp.stack([word & 0xFF, (word >> 8) & 0xFF, (word >> 16) & 0xFF], axis=-1)
    return xp.reshape(out.astype(np.uint8), lead + (n * 3 // 4,))


def unpack(packed: Any, elem: FloatFormat, *, order: NibbleOrder = NibbleOrder.LOW_FIRST) -> Any:
    """Inverse of :func:`pack`: one uint8 code per element."""
    bits = _bits(elem)
    _check_order(order, bits)
    xp = namespace(packed)
    packed = xp.asarray(packed)
    if np.dtype(packed.dtype) != np.uint8:
        raise TypeError(f"packed has dtype {packed.dtype}; allowed: uint8")
    if packed.ndim == 0:
        raise ValueError("packed must have at least one dimension")
    m = packed.shape[-1]
    lead = packed.shape[:-1]
    if bits == 4:
        group = 1 if order is NibbleOrder.LOW_FIRST else _SPLIT // 2
        if m % group:
            raise ValueError(f"packed has a last axis of length {m}; SPLIT_HALF needs a multiple "
                             f"of {group} bytes")
        lo, hi = packed & np.uint8(0xF), packed >> np.uint8(4)
        if order is NibbleOrder.LOW_FIRST:
            return xp.reshape(xp.stack([lo, hi], axis=-1), lead + (2 * m,))
        lo = xp.reshape(lo, lead + (m // group, 1, group))
        hi = xp.reshape(hi, lead + (m // group, 1, group))
        return xp.reshape(xp.concatenate([lo, hi], axis=-2), lead + (2 * m,))
    if m % 3:
        raise ValueError(f"packed has a last axis of length {m}; FP6 needs a multiple of 3 bytes")
    b = xp.reshape(packed.astype(np.uint32), lead + (m // 3, 3))
    word = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16)
    out = xp.stack([(word >> s) & 0x3F for s in (0, 6, 12, 18)], axis=-1)
    return xp.reshape(out.astype(np.uint8), lead + (m // 3 * 4,))

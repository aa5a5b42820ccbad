"""Float32 arithmetic that gives the same bits on NumPy and under ``jax.jit`` (XLA CPU and GPU).

The attention emulator does its softmax, normalizer and accumulator arithmetic in float32, as
the kernels do. Three XLA behaviours would make a naive jitted expression differ from NumPy
(all measured on XLA CPU, jax 0.11.2):

* ``a*b + c`` is contracted into a fused multiply-add (about 1 in 4 random inputs differ);
* ``a / broadcast(b)`` (also a scalar divisor) is rewritten as ``a * (1/b)``;
* subnormal results and inputs are flushed to zero (FTZ/DAZ).

The emulator's arithmetic is therefore defined as **float32 round-to-nearest-even with
flush-to-zero**: every result below 2^-126 in magnitude becomes zero (what ``.ftz`` SIMT
instructions do). :func:`ftz` applies that flush explicitly, on the bit pattern (an integer
AND), so it is also a barrier no compiler can contract a multiply through. :func:`mul` and
:func:`div` use it; under jax :func:`div` divides with integer operations, so neither XLA's
reciprocal rewrite nor a GPU's float division can change its bits. Exact
error-free transformations (:func:`two_sum`, :func:`two_prod` with a bit-mask split) and an
exactly emulated :func:`fma` (Boldo-Melquiond round-to-odd) build the correctly rounded exp2 of
:mod:`fp4sim.attention.exp2` and FA4's polynomial.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fp4sim._xp import bitcast, namespace
from fp4sim.formats.blocks import div_f32

__all__ = ["TINY", "ftz", "mul", "div", "add", "pow2", "ldexp", "two_sum", "two_prod", "fma",
           "tree_sum"]

TINY = np.float32(2.0**-126)
_F32 = np.float32


def ftz(x: Any) -> Any:
    """Flush |x| < 2^-126 to +0 (NaN and Inf pass); a contraction barrier under XLA.

    Done on the bit pattern (an integer AND with a mask that is all ones unless the exponent
    field is zero), so no compiler can fold it into a neighbouring float operation (a float
    ``select`` can be hoisted by LLVM and re-expose ``a*b + c`` to FMA contraction)."""
    xp = namespace(x)
    x = xp.asarray(x, dtype=np.float32)
    bits = bitcast(x, np.int32)
    # mask = all ones when the exponent field e is nonzero, else 0: the sign of (0 - e)
    # spread by an arithmetic shift (integer ops only; ~25 % faster than compare + select)
    mask = (np.int32(0) - (bits & np.int32(0x7F800000))) >> np.int32(31)
    return bitcast(bits & mask, np.float32)


def mul(a: Any, b: Any) -> Any:
    """float32 ``a·b`` rounded to nearest even, flushed (never fused into a later add)."""
    return ftz(a * b)


def add(a: Any, b: Any) -> Any:
    """float32 ``a + b``, flushed."""
    return ftz(a + b)


def div(a: Any, b: Any) -> Any:
    """float32 ``a / b`` correctly rounded (IEEE round-to-nearest-even), then flushed.

    The quotient is :func:`fp4sim.formats.blocks.div_f32`, computed with integer operations on
    NumPy and under jax alike: on the H200 XLA's jitted float32 division differed from NumPy's in
    the last bit (measured 2026-11-29: 11 of 16,384 outputs of the exact-f32 attention recipe,
    whose numerator and normalizer were bit-identical), and XLA CPU rewrites ``a / broadcast(b)``
    as ``a * (1/b)``. Integer division is exact everywhere."""
    return ftz(div_f32(a, b))


def pow2(k: Any, like: Any = None) -> Any:
    """float32 2^k for integer k in [−126, 127] (built from bits, exact)."""
    xp = namespace(k if like is None else like, k)
    k = xp.asarray(k, dtype=np.int32)
    return bitcast(((k + 127).astype(np.uint32) << np.uint32(23)), np.float32)


def ldexp(x: Any, k: Any) -> Any:
    """``x·2^k`` for float32 x and integer k in [−300, 300]: exact when the result is normal,
    0 when it is below 2^-126 (flushed), ±Inf on overflow (x = ±Inf/NaN pass unchanged).

    Integer arithmetic on the exponent field (inputs below 2^-126 count as zero)."""
    xp = namespace(x, k)
    x = xp.asarray(x, dtype=np.float32)
    k = xp.clip(xp.asarray(k, dtype=np.int32), -300, 300)
    bits = bitcast(x, np.uint32)
    field = ((bits >> np.uint32(23)) & np.uint32(0xFF)).astype(np.int32)
    new = field + k
    sign = bits & np.uint32(0x80000000)
    moved = bitcast(bits + (k.astype(np.uint32) << np.uint32(23)), np.float32)
    inf = bitcast(sign | np.uint32(0x7F800000), np.float32)
    zero = bitcast(sign & np.uint32(0), np.float32)
    out = xp.where(new >= 255, inf, xp.where(new <= 0, zero, moved))
    return xp.where((field == 0) | (field == 255), xp.where(field == 0, zero, x), out)


def two_sum(a: Any, b: Any) -> tuple[Any, Any]:
    """(s, e) with s = fl(a + b) and a + b = s + e exactly (Knuth; no multiplications)."""
    s = ftz(a + b)
    bv = ftz(s - a)
    e = ftz(ftz(a - ftz(s - bv)) + ftz(b - bv))
    return s, e


def _split12(xp: Any, a: Any) -> tuple[Any, Any]:
    bits = bitcast(xp.asarray(a, dtype=_F32), np.uint32)
    hi = bitcast(bits & np.uint32(0xFFFFF000), np.float32)
    return hi, ftz(a - hi)


def two_prod(a: Any, b: Any) -> tuple[Any, Any]:
    """(p, e) with p = fl(a·b) and a·b = p + e exactly (Dekker with an exact bit-mask split;
    every partial product is exact, so fusing them into FMAs cannot change a bit). Exact unless
    an intermediate falls below 2^-126 (then flushed)."""
    xp = namespace(a, b)
    p = mul(a, b)
    ah, al = _split12(xp, a)
    bh, bl = _split12(xp, b)
    e = ftz(ftz(ftz(ftz(ftz(ah * bh) - p) + ftz(ah * bl)) + ftz(al * bh)) + ftz(al * bl))
    return p, e


def _round_to_odd_sum(xp: Any, a: Any, b: Any) -> Any:
    s, e = two_sum(a, b)
    sb = bitcast(s, np.uint32)
    inexact = e != 0
    even = (sb & np.uint32(1)) == 0
    same = (e > 0) == (s > 0)
    step = xp.where(same, np.uint32(1), np.uint32(0xFFFFFFFF))  # +1 or -1 on the magnitude
    fixed = bitcast(sb + step, np.float32)
    return xp.where(inexact & even, fixed, s)


def fma(a: Any, b: Any, c: Any) -> Any:
    """float32 fused multiply-add ``RN(a·b + c)`` emulated exactly without an FMA
    (Boldo & Melquiond 2008: exact product, exact sum, round-to-odd, one final RN), flushed."""
    xp = namespace(a, b, c)
    uh, ul = two_prod(a, b)
    th, tl = two_sum(c, uh)
    v = _round_to_odd_sum(xp, tl, ul)
    return ftz(th + v)


def tree_sum(x: Any, axis: int = -1) -> Any:
    """Sum along ``axis`` by a fixed pairwise tree (adjacent pairs first, zero-padded to a power
    of two), float32 with flush: the same order on every backend."""
    xp = namespace(x)
    x = xp.moveaxis(xp.asarray(x), axis, -1)
    n = x.shape[-1]
    width = 1
    while width < n:
        width *= 2
    if width != n:
        pad = [(0, 0)] * (x.ndim - 1) + [(0, width - n)]
        x = xp.pad(x, pad)
    while x.shape[-1] > 1:
        x = ftz(x[..., 0::2] + x[..., 1::2])
    return x[..., 0]

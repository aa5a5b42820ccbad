"""Ordered float32 sums of products: when the plain loop gives the flushed chain's bits.

This module owns the proof and the switch behind the emulator's fast sequential products. The
emulator's float32 arithmetic flushes every result below 2^-126 (:mod:`fp4sim.formats.f32`),
so an ordered sum of products is, by definition, the *flushed chain*
``acc_0 = fl(a_0·b_0)``, ``acc_k = fl(acc_{k−1} + fl(a_k·b_k))`` (each step flushed, the
multiply never fused into the add). :func:`plain_sum_is_exact` proves, from a few
:class:`OperandStats` of the operands, that the plain ``acc + a_k·b_k`` (fused or not, with
one final flush) gives the same bits — about 3-5x cheaper per term (no bit-mask flushes, FMA
allowed). :func:`ordered_product` picks one of two implementations by that predicate: a Python
branch on NumPy, one ``lax.cond`` under jax (:func:`plain_or_chain`, whose predicate stays
unbatched under ``vmap``). Used by the forward's PV partial products
(:mod:`fp4sim.attention.forward`) and the backward's matrix products
(:mod:`fp4sim.attention.backward`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from fp4sim._xp import Array, bitcast, is_jax, materialize, namespace
from fp4sim.formats import f32

__all__ = [
    "OperandStats",
    "operand_stats",
    "quantized_stats",
    "plain_sum_is_exact",
    "plain_or_chain",
    "ordered_product",
]


class OperandStats(NamedTuple):
    """float32 scalars over every element of an operand (:func:`operand_stats`)."""

    min_abs: Array  # smallest nonzero |x| (+Inf when all are zero)
    max_abs: Array  # largest |x| (+Inf when any is NaN or ±Inf)
    min_lsb: Array  # 2^tz: the lowest set bit of any 24-bit significand (2^23 when all are zero)


def operand_stats(x: Array) -> OperandStats:
    """The :class:`OperandStats` of ``x`` (float reductions: fast on XLA CPU)."""
    xp = namespace(x)
    x = xp.asarray(x, dtype=np.float32)
    a = xp.abs(x)
    lo = xp.min(xp.where(a > 0, a, np.float32(np.inf)))
    # barriers: XLA CPU fuses sibling reductions into one slow multi-output loop (7x slower)
    x, lo = materialize((x, lo))
    # NaN and ±Inf count as +Inf: XLA CPU's max reduction drops NaN (measured)
    hi = xp.max(xp.where(xp.isfinite(x), xp.abs(x), np.float32(np.inf)))
    x, hi = materialize((x, hi))
    a = xp.abs(x)
    sig = (bitcast(x, np.int32) & np.int32(0x7FFFFF)) | np.int32(0x800000)
    lsb = (sig & -sig).astype(np.float32)  # a power of two <= 2^23: exact
    return OperandStats(lo, hi, xp.min(xp.where(a > 0, lsb, np.float32(2.0**23))))


def quantized_stats(exps: Array, live: Array, nonfinite: Array, elem: Any) -> OperandStats:
    """Bounds on the :func:`operand_stats` of a dequantized operand, from its block exponents
    instead of a pass over its elements: ``lo ≤ min_abs``, ``hi ≥ max_abs``, ``lsb ≤ min_lsb``.

    The operand is ``y = RN_f32(c·2^e)`` per element (:func:`fp4sim.formats.blocks.dequantize`
    of power-of-two block scales: correctly rounded, so f32 subnormals may appear), ``c`` a
    code value of the element format ``elem`` under a *saturating* encoder, ``e`` its block's
    exponent; ``exps`` (int32, any shape) holds the blocks' ``e``, ``live`` (bool, same shape)
    is False only for blocks whose elements are all ±0 (their input's max-abs is 0), and
    ``nonfinite`` (bool scalar) is True when some input is NaN or ±Inf. Then:

    * nonzero ``|c| ≥ c_min`` (the format's smallest positive value, 2^-9 for E4M3), so every
      nonzero ``|y| ≥ 2^(e + log2 c_min)`` ≥ ``2^lo_exp`` with ``lo_exp`` the smallest over live
      blocks (RN is monotone and 2^lo_exp representable); ``lo = 2^lo_exp`` when
      ``lo_exp ≥ −126``, else 0 (no claim: a bound of 0 fails every test below);
    * when ``lo_exp ≥ −126`` every nonzero y is a normal float32 equal to ``c·2^e`` (no
      rounding: ``c`` has at most ``mbits + 1`` significant bits), so its 24-bit significand's
      lowest set bit is at least ``2^(23 − mbits)`` (an overflow to Inf has 2^23); else
      ``lsb = 1``, below any significand's;
    * finite inputs give finite ``|c| ≤ c_max`` (saturation; ±Inf inputs too, but those are
      flagged), so ``|y| ≤ RN(c_max·2^e_max) = hi`` (Inf if it overflows); with a NaN or Inf
      input ``hi = +Inf``, as :func:`operand_stats` counts them. A block holding NaN or Inf
      is the only one with the NaN scale code (``nonfinite``), and NaN elements come only from
      NaN inputs.
    * no live block: every y is ±0, and (+Inf, 0, 2^23) are :func:`operand_stats`'s values.

    :func:`plain_sum_is_exact` is monotone in each statistic (a smaller minimum or lsb, a
    larger maximum can only turn it False), so with these bounds it implies the predicate of
    the true statistics: the plain loop runs only where it gives the chain's bits, and where
    the bounds are looser than a scan, the chain runs and gives those same bits.
    """
    from fp4sim.formats.codec import value_table

    xp = namespace(exps)
    table = np.asarray(value_table(elem), dtype=np.float64)
    finite = table[np.isfinite(table)]
    c_min = float(np.min(finite[finite > 0]))
    c_max = float(np.max(np.abs(finite)))
    c_min_exp = int(np.floor(np.log2(c_min)))
    assert c_min == 2.0**c_min_exp
    big = np.int32(1 << 20)
    e = xp.asarray(exps, dtype=np.int32)
    live = xp.broadcast_to(xp.asarray(live, dtype=bool), e.shape)
    e_lo = xp.min(xp.where(live, e, big))
    e_hi = xp.max(xp.where(live, e, -big))
    any_live = e_lo < big
    lo_exp = e_lo + np.int32(c_min_exp)
    normal = lo_exp >= -126
    lo = xp.where(
        any_live,
        xp.where(normal, f32.pow2(xp.clip(lo_exp, -126, 127), e), np.float32(0.0)),
        np.float32(np.inf),
    )
    lsb = xp.where(
        any_live,
        xp.where(normal, np.float32(2.0 ** (23 - elem.mbits)), np.float32(1.0)),
        np.float32(2.0**23),
    )
    with np.errstate(over="ignore"):
        top = np.float32(c_max) * f32.pow2(xp.clip(e_hi, -126, 127), e)
    hi = xp.where(
        xp.asarray(nonfinite), np.float32(np.inf), xp.where(any_live, top, np.float32(0.0))
    )
    return OperandStats(
        xp.asarray(lo, dtype=np.float32),
        xp.asarray(hi, dtype=np.float32),
        xp.asarray(lsb, dtype=np.float32),
    )


def plain_sum_is_exact(a_stats: OperandStats, b_stats: OperandStats, k: int) -> Array:
    """True (a boolean scalar) when the plain float32 sum ``acc + a_k·b_k`` of ``a @ b`` over
    ``k`` terms (any fusion of the multiply into the add allowed), in contraction order, gives
    the bits of the flushed SEQUENTIAL chain after one final :func:`~fp4sim.formats.f32.ftz`:

    1. short significands: ``lsb_a·lsb_b ≥ 2^24`` (E4M3 × E5M2: 2^20·2^21), so each product
       of two significands has at most 24 bits — every product is exact in float32 and
       ``fma(a, b, acc) = fl(fl(a·b) + acc)``;
    2. no tiny product: ``min|a|·min|b| ≥ 2^-103`` over nonzero elements, so each nonzero
       product is a multiple of its ulp ≥ 2^-126 (and no operand is subnormal);
    3. no overflow, no NaN: ``fl(max|a|·max|b|)·2^⌈log2 k⌉ ≤ 2^126``.

    Proof. By 1 and 2 every product is exact, and zero or a multiple of 2^-126. A rounded sum
    of two multiples of 2^-126 is again one (where the float32 spacing at the sum is below
    2^-126 the sum is representable, else it rounds onto multiples of a larger power of two),
    so every partial sum is zero or at least 2^-126 in magnitude: the flushes of the SEQUENTIAL
    chain change only the sign of zeros (``ftz`` maps −0 to +0). Two chains whose terms agree
    up to the sign of zeros agree up to the sign of zeros (x + ±0 = x; a cancelling sum is +0
    in round-to-nearest), and the final flush makes them equal. By 3 every |partial sum| is at
    most ``k·max|a|·max|b|`` (plus rounding) < 2^128: no Inf; no operand is Inf or NaN (their
    maximum counts as +Inf and fails the comparison). Where a backend treats subnormal operands
    as zero (XLA CPU), both loops see zeros there alike. The tests compare both loops on each
    boundary. ∎
    """
    a_min, a_max, a_lsb = a_stats
    b_min, b_max, b_lsb = b_stats
    log2k = max(0, (int(k) - 1).bit_length())
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        short = a_lsb * b_lsb >= np.float32(2.0**24)
        small = f32.ftz(a_min * b_min) >= np.float32(2.0**-103)
        large = a_max * b_max <= np.float32(2.0 ** (126 - log2k))
    return short & small & large


@functools.cache
def plain_or_chain(plain: Callable, chain: Callable) -> Callable:
    """A jax function ``(a, b, a_stats, b_stats, *extra)``: ``plain(a, b, *extra)`` where
    ``plain_sum_is_exact(a_stats, b_stats, b.shape[-2])`` holds, else ``chain(a, b, *extra)``,
    as one ``lax.cond``. A ``custom_vmap``: under ``vmap`` the statistics are reduced over the
    batch first (min of the minima, max of the maxima), so the predicate stays unbatched and
    the cond a branch (a batched predicate would turn it into a select that runs both); the
    batch then passes through both branches as a leading axis. The predicate for the whole
    batch implies it for every member, so the plain branch is exact wherever it runs. ``plain``
    and ``chain`` must treat leading axes as batch axes; keep them stable objects (this is
    cached by identity)."""
    import jax
    from jax import lax

    @jax.custom_batching.custom_vmap
    def fn(a, b, a_stats, b_stats, *extra):
        ok = plain_sum_is_exact(a_stats, b_stats, b.shape[-2])
        return lax.cond(ok, plain, chain, a, b, *extra)

    @fn.def_vmap
    def _rule(axis_size, in_batched, a, b, a_stats, b_stats, *extra):
        arrays = [
            x if batched else jax.numpy.broadcast_to(x, (axis_size,) + x.shape)
            for x, batched in zip((a, b) + extra, in_batched[:2] + in_batched[4:])
        ]
        stats = []
        for st, batched in zip((a_stats, b_stats), in_batched[2:4]):
            lo, hi, lsb = st
            lo_b, hi_b, lsb_b = batched
            stats.append(
                (lo.min(0) if lo_b else lo, hi.max(0) if hi_b else hi, lsb.min(0) if lsb_b else lsb)
            )
        return fn(arrays[0], arrays[1], *stats, *arrays[2:]), True

    return fn


def ordered_product(
    plain: Callable,
    chain: Callable,
    a: Array,
    b: Array,
    a_stats: OperandStats,
    b_stats: OperandStats,
    *extra: Array,
) -> Array:
    """``plain(a, b, *extra)`` when :func:`plain_sum_is_exact` holds for the stats (of every
    element of ``a`` and ``b``; the contraction length is ``b.shape[-2]``), else
    ``chain(a, b, *extra)``: a Python branch on NumPy, :func:`plain_or_chain` under jax."""
    if not any(is_jax(x) for x in (a, b) + tuple(a_stats) + tuple(b_stats) + extra):
        if bool(plain_sum_is_exact(a_stats, b_stats, b.shape[-2])):
            return plain(a, b, *extra)
        return chain(a, b, *extra)
    return plain_or_chain(plain, chain)(a, b, tuple(a_stats), tuple(b_stats), *extra)

"""exp2 models: a correctly rounded float32 exp2 and FA4's polynomial ex2 emulation, bit-exact.

Both run on NumPy and under ``jax.jit`` with identical bits: they use only float32 operations
whose results are exact or correctly rounded by construction (:mod:`fp4sim.formats.f32`),
integer bit manipulation, and flush-to-zero of results below 2^-126.

:func:`exp2_rn` — "exact" exp2 of fp4sim: the float32 nearest
(ties to even) to the real 2^x, with results below 2^-126 flushed to +0 (the SIMT path is FTZ);
x ≥ 128 gives +Inf, x = −Inf gives +0, NaN gives NaN. Method: ``x = n + r`` with
``n = rint(x)``, ``r = j/256 + s`` (exact), ``2^r = T_j·e^{s·ln 2}`` with the table
``T_j = 2^{j/256}`` stored as three float32 words (from 50-digit decimal arithmetic), the
exponential of ``|s·ln 2| ≤ 2^-9.5`` by a degree-5 series in double-float32 arithmetic built from
error-free transformations, and one final rounding. The approximation error before that rounding
is below 2^-53 relative, so a result can only be misrounded when 2^x lies within 2^-53 relative
of a midpoint between two float32 numbers; the tests compare against float64 ``exp2`` rounded
to float32 on millions of inputs, including every float32 in chosen intervals.

Why the double-float32 steps carry no flush: inputs with ``|x| < 2^-30`` take the path of
``x = 0`` (their correctly rounded result is exactly 1, since ``|x·ln 2|`` is below half an ulp
of 1), so ``s = 0`` or ``|s| ≥ 2^-30``. Every intermediate is then exactly zero or at least
2^-126 in magnitude: the smallest are the error terms of ``w·w`` (multiples of ulp(w)² ≥ 2^-108)
and ``w³/6`` (≥ 2^-93). Flushing them would be the identity, so :func:`exp2_rn` uses the
unflushed :func:`~fp4sim.formats.f32.two_sum` and :func:`~fp4sim.formats.f32.two_prod`. It
keeps :func:`~fp4sim.formats.f32.ftz` only as the contraction barrier after an inexact product
that feeds an addition. The bits are those of the fully flushed formulation; this was checked
for all 2^32 inputs on XLA CPU, and NumPy gives the same bits. It is 1.5x faster there.

:func:`exp2_rn_e4m3` — the E4M3 code of :func:`exp2_rn`'s result, read from thresholds on x
(the code is a non-decreasing step function of x); what the exact converter's FP8 P uses.

:func:`exp2_fa4` — FA4's software ex2 (github.com/Dao-AILab/flash-attention ``flash_attn/cute/utils.py``):
``xc = max(x, −127)``, ``n = floor(xc)``, ``f = fl(xc − n)``,
``p = fma(fma(fma(c3, f, c2), f, c1), f, c0)`` with the degree-3 coefficients ``POLY_EX2``, and
the result bits ``(n << 23) + bits(p)`` (integer add into the exponent field). The FMAs are
emulated exactly (:func:`fp4sim.formats.f32.fma_ftz`).

:func:`exp2_model` applies an :class:`~fp4sim.attention.recipe.Exp2Model` to a tile: FA4's
schedule picks, per fragment and element pair, which elements use the polynomial.
"""

from __future__ import annotations

import decimal
import functools
from typing import Any

import numpy as np

from fp4sim._checks import as_f32
from fp4sim._xp import Array, bitcast, namespace
from fp4sim.attention.recipe import Exp2Kind, Exp2Model
from fp4sim.formats import f32

__all__ = [
    "exp2_rn",
    "exp2_rn_e4m3",
    "e4m3_thresholds",
    "step_thresholds",
    "exp2_fa4",
    "exp2_model",
    "fa4_emulated_mask",
    "log2_f32",
    "POLY_EX2",
]

POLY_EX2 = (
    np.float32(1.0),
    np.float32(0.6951461434364319),
    np.float32(0.22756439447402954),
    np.float32(0.07711908966302872),
)
"""FA4's degree-3 ex2 polynomial coefficients c0..c3 (float32)."""


def _build_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.float32, np.float32]:
    ctx = decimal.Context(prec=60)
    words = np.zeros((3, 257), dtype=np.float32)
    for j in range(-128, 129):
        t = ctx.power(decimal.Decimal(2), ctx.divide(decimal.Decimal(j), decimal.Decimal(256)))
        for w in range(3):
            word = np.float32(float(t))
            words[w, j + 128] = word
            t = ctx.subtract(t, decimal.Decimal(float(word)))
    ln2 = decimal.Decimal(2).ln(ctx)
    ln2_0 = np.float32(float(ln2))
    ln2_1 = np.float32(float(ctx.subtract(ln2, decimal.Decimal(float(ln2_0)))))
    return words[0], words[1], words[2], ln2_0, ln2_1


_T0, _T1, _T2, _LN2_0, _LN2_1 = _build_tables()
_INV6 = np.float32(1 / 6)
_INV24 = np.float32(1 / 24)
_INV120 = np.float32(1 / 120)


def exp2_rn(x: Array) -> Array:
    """Correctly rounded float32 ``2^x`` with flush-to-zero of results below 2^-126."""
    xp = namespace(x)
    x = f32.ftz(as_f32("x", x, xp))
    finite = xp.isfinite(x)
    # |x| < 2^-30 gives exactly 1 (|x ln2| is below the half ulp of 1), so such x take the path
    # of x = 0; every other x has s = 0 or |s| >= 2^-30, which keeps every intermediate below
    # either exactly zero or at least 2^-126 in magnitude (module docstring)
    keep = finite & (xp.abs(x) >= np.float32(2.0**-30))
    xs = xp.where(keep, xp.clip(x, np.float32(-127.0), np.float32(128.0)), np.float32(0.0))
    n = xp.round(xs)  # half to even: exact integer
    r = xs - n  # exact, |r| <= 1/2
    j = xp.round(r * np.float32(256.0))  # exact scaling, |j| <= 128
    s = r - j * np.float32(1.0 / 256)  # exact
    ji = j.astype(np.int32) + 128
    t0, t1, t2 = (xp.asarray(t)[ji] for t in (_T0, _T1, _T2))

    # No intermediate can be subnormal, so the only flushes kept are the contraction barriers
    # after inexact products that feed an addition (f32.ftz is the identity on their values).
    bar = f32.ftz
    half = np.float32(0.5)
    # w = s ln2 in double-float32
    w, we = f32.two_prod(s, _LN2_0)
    we = we + bar(s * _LN2_1)
    # delta = e^w - 1 = w + w^2/2 + w^3/6 + w^4/24 + w^5/120
    q, qe = f32.two_prod(w, w)
    tail = bar((q * w) * (_INV6 + bar(w * (_INV24 + bar(w * _INV120)))))
    small = (we + (qe * half + bar(w * we))) + tail
    d_hi, d_e = f32.two_sum(w, q * half)
    d_hi, d_lo = f32.two_sum(d_hi, d_e + small)
    # 2^r = T (1 + delta)
    m, me = f32.two_prod(t0, d_hi)
    c_small = (me + bar(t0 * d_lo)) + (bar(t1 * d_hi) + t2)
    c_hi, c_e = f32.two_sum(m, t1)
    s_hi, s_e = f32.two_sum(t0, c_hi)
    res = s_hi + (s_e + (c_e + c_small))  # one rounding of the double-float32 value

    # scale by 2^n on the bit pattern (exact; below 2^-126 -> 0, above max -> Inf)
    rb = bitcast(res, np.uint32).astype(np.int32)
    field = (rb >> 23) + n.astype(np.int32)
    out_bits = (rb & np.int32(0x7FFFFF)) | (xp.clip(field, 0, 255) << 23)
    out = bitcast(out_bits.astype(np.uint32), np.float32)
    out = xp.where(field <= 0, np.float32(0.0), xp.where(field >= 255, np.float32(np.inf), out))
    out = xp.where(x < np.float32(-126.0), np.float32(0.0), out)
    out = xp.where(x >= np.float32(128.0), np.float32(np.inf), out)
    return xp.where(
        finite | xp.isnan(x),
        xp.where(xp.isnan(x), x, out),
        xp.where(x > 0, np.float32(np.inf), np.float32(0.0)),
    )


def _ordered_key(bits: np.ndarray) -> np.ndarray:
    """int64 keys of float32 bit patterns, ordered like the floats (−0 and +0 both 0)."""
    b = bits.astype(np.int64)
    return np.where(b & 0x80000000, -(b & 0x7FFFFFFF), b)


def _key_floats(key: np.ndarray) -> np.ndarray:
    """The float32 values of :func:`_ordered_key` keys."""
    bits = np.where(key < 0, 0x80000000 | (-key), key).astype(np.uint32)
    return bits.view(np.float32)


@functools.cache
def e4m3_thresholds() -> np.ndarray:
    """``τ`` (127 float32, ``τ[0] = −Inf``): ``τ[c]`` is the smallest float32 x (not NaN) with
    ``encode(exp2_rn(x), E4M3) ≥ c``, for the codes c = 1 … 126 (0x7E = 448, where E4M3's
    saturating encoder puts every larger value and +Inf). Found by a bisection over the
    ordered float32 patterns, all codes at once (32 steps of :func:`exp2_rn` on 126 values);
    exact because that code is a non-decreasing function of x (a correctly rounded exp2 and a
    round-to-nearest encoder are monotone), which the tests check on every float32."""
    from fp4sim.formats.codec import encode
    from fp4sim.formats.spec import E4M3

    def code(x: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore"):
            return encode(exp2_rn(x), E4M3)

    return np.concatenate([np.float32([-np.inf]), step_thresholds(code, np.arange(1, 127))])


def step_thresholds(code: Any, levels: Any) -> np.ndarray:
    """For ``code`` (NumPy float32 array -> integer array) a non-decreasing function of x:
    the smallest float32 x, from −Inf to +Inf, with ``code(x) >= c`` for each level c
    (float32; −Inf where −Inf already reaches c, NaN where not even +Inf does). One bisection
    over the ordered float32 patterns for all levels at once (32 evaluations of ``code``);
    then ``code(x) = #{c : x >= T_c}`` counted from the lowest code, for every non-NaN x."""
    c = np.asarray(levels, dtype=np.int64)
    ends = _ordered_key(np.array([0xFF800000, 0x7F800000], dtype=np.uint32))  # −Inf, +Inf

    def at(key: np.ndarray) -> np.ndarray:
        return np.asarray(code(_key_floats(key))).astype(np.int64)

    reach = at(ends)
    lo, hi = np.full(c.shape, ends[0]), np.full(c.shape, ends[1])
    while np.any(hi - lo > 1):  # code(lo) < c <= code(hi) where the level is reached at all
        mid = (lo + hi) // 2
        up = at(mid) >= c
        hi, lo = np.where(up, mid, hi), np.where(up, lo, mid)
    out = np.where(c <= reach[0], np.float32(-np.inf), _key_floats(hi))
    return np.where(c > reach[1], np.float32(np.nan), out).astype(np.float32)


def exp2_rn_e4m3(x: Array) -> Array:
    """``encode(exp2_rn(x), E4M3)`` (uint8, the saturating OCP encoder: 0x7E for 2^x above
    448 and for +Inf, 0x7F or 0xFF for a NaN by its sign, 0 for −Inf) for every float32 x,
    without evaluating the exp2: the code is a non-decreasing step function of x with the
    thresholds :func:`e4m3_thresholds`, counted in three ranges.

    * x ≥ 0 or x ≤ −1, above −6: ``x = n + f`` with ``n = floor(x)`` and ``f = x − n`` exact
      (|x| ≥ 1 or x ∈ [0, 1)); there ``exp2_rn(n + f) = 2^n·exp2_rn(f)`` and the code is
      ``8·(n + 7)`` plus how many of the thresholds of [0, 1) (``τ[57..64]``: the mantissa
      steps of 2^f and its carry into 2) are at most f, saturated at 0x7E.
    * −1 < x < 0, where ``x − floor(x) = 1 + x`` may round: the global thresholds ``τ[49..56]``
      on x itself (codes 48 … 56).
    * x < −6 (E4M3's subnormals and zero): ``τ[1..8]`` on x.

    About 30 integer and compare operations per element instead of the exp2's double-float32
    evaluation and the encoder: 2.1x faster on XLA CPU (1.5 against 3.2 ns per element over
    all 2^32 inputs) and 1.8x on the H200. Equal to the composition on all 2^32 float32 inputs
    on XLA CPU and on the H200, and on NumPy for a 2^26 sample (one-off runs, 2026-12-03);
    ``tests/attention/test_exp2.py`` keeps every threshold's neighbourhood, whole binades, the
    special values and a random sample, on NumPy and under jax."""
    xp = namespace(x)
    x = as_f32("x", x, xp)
    tau = e4m3_thresholds()

    def count(v: Array, lo: int, hi: int) -> Array:  # #{c in [lo, hi] : v >= τ[c]}
        acc = (v >= tau[lo]).astype(np.int32)
        for c in range(lo + 1, hi + 1):
            acc = acc + (v >= tau[c]).astype(np.int32)
        return acc

    xf = xp.where(xp.isfinite(x), x, np.float32(0.0))
    n = xp.floor(xf)
    f = xf - n
    ni = xp.clip(n, np.float32(-7.0), np.float32(9.0)).astype(np.int32)
    code = np.int32(8) * (ni + np.int32(7)) + count(f, 57, 64)
    code = xp.where((x > np.float32(-1.0)) & (x < 0), np.int32(48) + count(x, 49, 56), code)
    code = xp.where(x < np.float32(-6.0), count(x, 1, 8), code)
    code = xp.where(x >= tau[126], np.int32(126), xp.minimum(code, np.int32(126)))
    # a NaN x passes exp2_rn unchanged, and the encoder keeps its sign: 0x7F or 0xFF
    nan_code = np.int32(0x7F) | ((bitcast(x, np.int32) >> np.int32(24)) & np.int32(0x80))
    return xp.where(xp.isnan(x), nan_code, code).astype(np.uint8)


def exp2_fa4(x: Array) -> Array:
    """FA4's polynomial ``ex2`` emulation, bit-exact (see the module docstring), flushed.
    Valid for x <= 127 (larger x wraps, as on the GPU); NaN gives NaN, −Inf gives +0."""
    xp = namespace(x)
    x = f32.ftz(as_f32("x", x, xp))
    xc = xp.maximum(xp.where(xp.isnan(x), np.float32(0.0), x), np.float32(-127.0))
    xc = xp.minimum(xc, np.float32(127.0))
    n = xp.floor(xc)
    f = f32.ftz(xc - n)
    c0, c1, c2, c3 = POLY_EX2
    p = f32.fma_ftz(f32.fma_ftz(f32.fma_ftz(xp.full_like(f, c3), f, c2), f, c1), f, c0)
    bits = (n.astype(np.int32) << 23) + bitcast(p, np.uint32).astype(np.int32)
    out = f32.ftz(bitcast(bits.astype(np.uint32), np.float32))
    return xp.where(xp.isnan(x), x, out)


def fa4_emulated_mask(n_keys: int, model: Exp2Model, *, fragment: int, tile: int) -> np.ndarray:
    """bool (n_keys,): True where FA4's schedule emulates the exp2 of a key position.

    Keys are split into tiles of ``tile`` and fragments of ``fragment``; within a fragment,
    the pair starting at even element k is emulated iff ``k mod freq >= freq − res`` and the
    fragment is not among the last ``native_last_fragments`` of its tile."""
    pos = np.arange(n_keys)
    k = pos % fragment
    frag = (pos % tile) // fragment
    n_frag = tile // fragment
    pair = k - (k % 2)
    emulate = (pair % model.emulate_freq) >= (model.emulate_freq - model.emulate_res)
    native_tail = frag >= n_frag - model.native_last_fragments
    return emulate & ~native_tail


def exp2_model(t: Array, model: Exp2Model, *, fragment: int, tile: int) -> Array:
    """exp2 of a tile ``t`` (..., keys) under ``model``: correctly rounded everywhere, or FA4's
    polynomial on the pairs its schedule picks (the rest correctly rounded)."""
    if model.kind is Exp2Kind.CORRECTLY_ROUNDED:
        return exp2_rn(t)
    xp = namespace(t)
    mask = fa4_emulated_mask(t.shape[-1], model, fragment=fragment, tile=tile)
    if mask.all():
        return exp2_fa4(t)
    if not mask.any():
        return exp2_rn(t)
    return xp.where(xp.asarray(mask), exp2_fa4(t), exp2_rn(t))


def log2_f32(x: Array) -> Array:
    """float32 log2 with the same bits on every backend (a few ulp of error; not correctly
    rounded): exponent from the bit pattern, ``log2(m)`` for m in [√½, √2) by the series
    ``2/ln2·atanh((m−1)/(m+1))`` to the 11th power. 0 gives −Inf, negative or NaN gives NaN,
    +Inf gives +Inf. Used for the LSE."""
    xp = namespace(x)
    x = f32.ftz(as_f32("x", x, xp))
    bits = bitcast(x, np.uint32)
    e = ((bits >> np.uint32(23)) & np.uint32(0xFF)).astype(np.int32) - 127
    mant = bitcast((bits & np.uint32(0x7FFFFF)) | np.uint32(0x3F800000), np.float32)
    big = mant > np.float32(1.4142135)
    mant = xp.where(big, mant * np.float32(0.5), mant)
    e = xp.where(big, e + 1, e)
    f = f32.div_ftz(mant - np.float32(1.0), mant + np.float32(1.0))
    f2 = f32.mul_ftz(f, f)
    poly = np.float32(1 / 11)
    for c in (1 / 9, 1 / 7, 1 / 5, 1 / 3, 1.0):
        poly = f32.add_ftz(f32.mul_ftz(poly, f2), np.float32(c))
    lm = f32.mul_ftz(f32.mul_ftz(f, poly), np.float32(2 / np.log(2)))
    out = f32.add_ftz(e.astype(np.float32), lm)
    out = xp.where(x == 0, np.float32(-np.inf), out)
    out = xp.where(xp.isinf(x) & (x > 0), np.float32(np.inf), out)
    return xp.where((x < 0) | xp.isnan(x), np.float32(np.nan), out)

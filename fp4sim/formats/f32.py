"""Exact float32 arithmetic that gives the same bits on NumPy and under ``jax.jit`` (XLA CPU, GPU).

This module owns every float32 operation of fp4sim whose result must not depend on the backend,
in two named flavours:

**IEEE flavour** (round to nearest even, *gradual underflow*: subnormal results are kept), used
by block quantization (:mod:`fp4sim.formats.blocks`), the block-scaled matmul
(:mod:`fp4sim.formats.matmul`) and the GPU quantizer's host side:

* :func:`mul_f32` — ``a·b``: significands multiplied natively in [1, 4) (exact rounding to 24
  bits: normal in, normal out), the exponent applied with integers; equal to IEEE whenever the
  result is normal, on every platform, FTZ or not (a product below 2^-126 may be rounded twice:
  the one documented deviation; NumPy and jax still agree bit for bit); a NaN product is the
  canonical NaN 0x7FC00000;
* :func:`div_f32` — ``a/b``: an IEEE division whose significand quotient is a float32
  reciprocal estimate made exact by integer remainder corrections (no float division, no
  integer division), exact on every backend;
* :func:`ldexp_f32` — ``x·2^k``, correctly rounded, also into the subnormal range;
* the integer building blocks :func:`split` (sign, significand, exponent of float32 bits),
  :func:`compose` (their correctly rounded float32 bits), :func:`bitlen`, :func:`f32_bits`.

**Flush-to-zero flavour** (``*_ftz``): float32 round to nearest even, then every result below
2^-126 in magnitude becomes +0, what ``.ftz`` SIMT instructions do. The attention emulator's
softmax, normalizer and accumulator arithmetic is defined this way (:mod:`fp4sim.attention`),
because three XLA behaviours would make a naive jitted expression differ from NumPy (measured on
XLA CPU, jax 0.11.2): ``a*b + c`` is contracted into a fused multiply-add (about 1 in 4 random
inputs differ); ``a / broadcast(b)`` (also a scalar divisor) is rewritten as ``a * (1/b)``;
subnormal results and inputs are flushed (FTZ/DAZ). :func:`ftz` applies the flush explicitly on
the bit pattern (an integer AND), so it is also a barrier no compiler can contract a multiply
through; :func:`mul_ftz`, :func:`add_ftz`, :func:`div_ftz` (the IEEE quotient of
:func:`div_f32`, then flushed), :func:`ldexp_ftz` use it. Exact error-free transformations
(:func:`two_sum_ftz`, :func:`two_prod_ftz` with a bit-mask split) and an exactly emulated
:func:`fma_ftz` (Boldo-Melquiond round-to-odd) build the correctly rounded exp2 of
:mod:`fp4sim.attention.exp2` and FA4's polynomial; :func:`tree_sum_ftz` is the fixed pairwise
sum order.

Exact in both flavours: :func:`pow2` (2^k built from bits) and :data:`TINY` (2^-126).

This module is not star-imported into :mod:`fp4sim.formats` (its short names would crowd the
flat namespace); ``mul_f32``, ``div_f32`` and ``ldexp_f32`` are also reachable as
``fp4sim.formats.blocks.*`` and ``fp4sim.*``, where they were first published.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np

from fp4sim._checks import as_f32
from fp4sim._xp import Array, bitcast, materialize, namespace

__all__ = [
    # IEEE flavour (gradual underflow)
    "mul_f32",
    "div_f32",
    "ldexp_f32",
    "split",
    "compose",
    "bitlen",
    "f32_bits",
    # flush-to-zero flavour
    "ftz",
    "mul_ftz",
    "add_ftz",
    "div_ftz",
    "ldexp_ftz",
    "two_sum_ftz",
    "two_prod_ftz",
    "two_sum",
    "two_prod",
    "fma_ftz",
    "tree_sum_ftz",
    # exact in both
    "pow2",
    "TINY",
]


# === IEEE flavour: round to nearest even, gradual underflow ==================================
_U = np.uint32


def bitlen(xp: ModuleType, v: Array) -> Array:
    """Bit length of uint32 ``v`` (0 for 0) as int32 (exact on both backends; ``xp`` is the
    array namespace, :func:`fp4sim._xp.namespace`)."""
    if xp is np:
        return np.frexp(v.astype(np.float64))[1].astype(np.int32)
    from jax import lax

    return (32 - lax.clz(v)).astype(np.int32)


def split(xp: ModuleType, bits: Array) -> tuple[Array, Array, Array]:
    """(sign, significand, exponent) with |x| = sig · 2^exp for finite float32 bits."""
    field = ((bits >> _U(23)) & _U(0xFF)).astype(np.int32)
    mant = bits & _U(0x7FFFFF)
    sig = xp.where(field == 0, mant, mant | _U(0x800000))
    exp = xp.where(field == 0, np.int32(-149), field - np.int32(150))
    return bits >> _U(31), sig, exp


def compose(xp: ModuleType, sign: Array, sig: Array, exp: ModuleType) -> Array:
    """float32 bits of (-1)^sign · sig · 2^exp, correctly rounded (RNE); sig < 2^31 uint32."""
    n = bitlen(xp, sig)
    q = xp.maximum(exp + n - 24, np.int32(-149))  # exponent of the last kept bit
    shift = q - exp
    rs = xp.clip(shift, 1, 31).astype(np.uint32)
    kept = sig >> rs
    rem = sig & ((_U(1) << rs) - _U(1))
    half = _U(1) << (rs - _U(1))
    up = (rem > half) | ((rem == half) & ((kept & _U(1)) == 1))
    rounded = kept + up.astype(np.uint32)
    rounded = xp.where(shift >= 32, _U(0), rounded)
    ls = xp.clip(-shift, 0, 31).astype(np.uint32)
    m = xp.where(shift > 0, rounded, sig << ls)
    carry = m >= _U(1 << 24)
    m = xp.where(carry, m >> _U(1), m)
    q = q + carry.astype(np.int32)
    field = q + 150
    normal = (xp.clip(field, 0, 255).astype(np.uint32) << _U(23)) | (m & _U(0x7FFFFF))
    mag = xp.where(m < _U(1 << 23), m, xp.where(field >= 255, _U(0x7F800000), normal))
    mag = xp.where(sig == 0, _U(0), mag)
    return (sign << _U(31)) | mag


def f32_bits(xp: ModuleType, x: Array) -> Array:
    """uint32 bit patterns of ``x`` as float32 (``xp``: the array namespace of the result)."""
    return bitcast(xp.asarray(x, dtype=np.float32), np.uint32)


def ldexp_f32(x: Array, k: Array) -> Array:
    """``x · 2^k`` for float32 ``x`` and int ``k``, correctly rounded, FTZ-proof (integer ops)."""
    xp = namespace(x, k)
    bits = f32_bits(xp, as_f32("x", x, xp, ints=True))
    sign, sig, exp = split(xp, bits)
    k = xp.asarray(k)
    if np.dtype(k.dtype).kind not in "iu":
        raise TypeError(f"k has dtype {k.dtype}; allowed: integers")
    k = xp.clip(k.astype(np.int32), -400, 400)
    out = compose(xp, sign, sig, exp + k)
    special = (bits & _U(0x7F800000)) == _U(0x7F800000)
    return bitcast(xp.where(special, bits, out), np.float32)


def _mul_operand(xp: ModuleType, x: Array) -> tuple[Array, Array, Array, Array, Array]:
    """``(m, e, proxy, plain, bits)`` of float32 ``x``: ``|x| = m·2^e`` with ``m`` a float32 in
    [1, 2) when ``x`` is finite and nonzero (``plain``; garbage otherwise), ``proxy`` = ±1 there
    and ``x`` itself for zeros, Inf and NaN. A subnormal is normalized through the exact, normal
    float32 of its integer significand (no flush-to-zero can touch it)."""
    u, i = np.uint32, np.int32
    bits = bitcast(x, u)
    mag = bits & u(0x7FFFFFFF)
    sub = bitcast(mag.astype(i).astype(np.float32), u) - u(149 << 23)  # exponent may wrap < 0
    mag = xp.where(mag <= u(0x7FFFFF), sub, mag)
    e = (bitcast(mag, i) >> 23) - 127
    m = bitcast(u(0x3F800000) | (mag & u(0x7FFFFF)), np.float32)
    plain = ((bits & u(0x7FFFFFFF)) != 0) & ((bits & u(0x7F800000)) != u(0x7F800000))
    proxy = xp.where(plain, bitcast((bits & u(0x80000000)) | u(0x3F800000), np.float32), x)
    return m, e, proxy, plain, bits


def _mul_f32(xp: ModuleType, a: Array, b: Array) -> Array:
    # Each operand is prepared at its own shape (a per-block factor once per block), then the
    # significands are multiplied natively in [1, 4) (exact IEEE rounding to 24 bits: normal in,
    # normal out) and the exponent is applied with integers, rounding again only when the result
    # is subnormal.
    u = np.uint32
    ma, ea, pa, plain_a, ab = _mul_operand(xp, xp.asarray(a, dtype=np.float32))
    mb, eb, pb, plain_b, bb = _mul_operand(xp, xp.asarray(b, dtype=np.float32))
    with np.errstate(all="ignore"):  # lanes holding zeros/Inf/NaN are replaced below
        p = bitcast(ma * mb, u)
    field = ((p >> u(23)) & u(0xFF)).astype(np.int32) + ea + eb  # biased exponent of a·b
    mant = p & u(0x7FFFFF)
    normal = (xp.clip(field, 1, 254).astype(u) << u(23)) | mant
    s = xp.clip(1 - field, 1, 25).astype(u)  # subnormal result: drop s bits, ties to even
    sig = mant | u(0x800000)
    sub = (sig + ((u(1) << (s - u(1))) - u(1)) + ((sig >> s) & u(1))) >> s
    mag = xp.where(field >= 1, xp.where(field >= 255, u(0x7F800000), normal), sub)
    res = bitcast(((ab ^ bb) & u(0x80000000)) | mag, np.float32)
    with np.errstate(all="ignore"):  # 0/0, Inf*0 are the IEEE special cases we want
        special = bitcast(pa * pb, u)
    # a NaN product is the canonical 0x7FC00000 (NumPy keeps an operand's payload and sign,
    # XLA need not)
    special = xp.where((special & u(0x7FFFFFFF)) > u(0x7F800000), u(0x7FC00000), special)
    return materialize(xp.where(plain_a & plain_b, res, bitcast(special, np.float32)))


def mul_f32(a: Array, b: Array) -> Array:
    """IEEE float32 ``a·b`` (RNE), also for subnormal operands on FTZ backends (see module doc)."""
    xp = namespace(a, b)
    return _mul_f32(xp, as_f32("a", a, xp, ints=True), as_f32("b", b, xp, ints=True))


def div_f32(a: Array, b: Array) -> Array:
    """IEEE float32 ``a/b`` (RNE, gradual underflow), exact on both paths and every backend.

    No float division is involved (the significand quotient is an estimate corrected exactly
    with integers, :func:`_quotient25`), so the result cannot depend on the backend: XLA CPU
    rewrites ``a / broadcast(b)`` into ``a * (1/b)`` and flushes subnormals, and on the H200 the
    jitted float32 division differed from IEEE in the last bit (measured 2026-11-29). NaN
    results follow one rule (:func:`_nan_quotient_bits`). Checked on the H200 on 2026-11-29: 0
    of 16.6 M random bit-pattern quotients differ from IEEE."""
    xp = namespace(a, b)
    a = as_f32("a", a, xp, ints=True)
    b = as_f32("b", b, xp, ints=True)
    a, b = xp.broadcast_arrays(a, b)
    return _div_rn_bits(xp, a, b)


def _div_rn_bits(xp: ModuleType, a: Array, b: Array) -> Array:
    """IEEE float32 ``a / b`` (round to nearest even, subnormal results kept), exact.

    Significands (subnormal operands normalized with a count of leading zeros) give a quotient
    of 25 bits (24 + the round bit) and a sticky bit, found exactly by :func:`_quotient25`; the
    result is then rounded like any IEEE division, including gradual underflow (the caller
    flushes)."""
    u = np.uint32
    ab, bb = bitcast(a, u), bitcast(b, u)
    sign = (ab ^ bb) & u(0x80000000)
    ea = ((ab >> u(23)) & u(0xFF)).astype(np.int32)
    eb = ((bb >> u(23)) & u(0xFF)).astype(np.int32)
    fa, fb = ab & u(0x7FFFFF), bb & u(0x7FFFFF)
    zero_a, zero_b = (ab & u(0x7FFFFFFF)) == 0, (bb & u(0x7FFFFFFF)) == 0
    inf_a, inf_b = (ea == 255) & (fa == 0), (eb == 255) & (fb == 0)
    nan_a, nan_b = (ea == 255) & (fa != 0), (eb == 255) & (fb != 0)

    def significand(e: Array, f: Array) -> tuple[Array, Array]:
        m = xp.where(e == 0, f, f | u(1 << 23))
        exp = xp.where(e == 0, 1, e) - 127
        shift = xp.maximum(24 - bitlen(xp, m), 0)  # normalize into [2^23, 2^24)
        return m << shift.astype(u), exp - shift

    ma, xa = significand(ea, fa)
    mb, xb = significand(eb, fb)
    mb = xp.where(zero_b | (eb == 255), u(1 << 23), mb)  # keep the division defined
    ma = xp.where(zero_a | (ea == 255), u(1 << 23), ma)
    lower = ma < mb  # quotient below 1: take one more dividend bit
    num = xp.where(lower, ma << u(1), ma)  # now num / mb in [1, 2)
    e = xa - xb - lower.astype(np.int32)  # unbiased exponent of the quotient
    quo, rem = _quotient25(xp, num, mb)
    sticky = (rem != 0).astype(u)
    biased = e + 127
    # gradual underflow: shift the 25-bit quotient right by s extra places (s = 0 when normal)
    s = xp.clip(1 - biased, 0, 26).astype(u)
    sticky = sticky | ((quo & ((u(1) << s) - u(1))) != 0).astype(u)
    quo = quo >> s
    mant = quo >> u(1)
    rnd = quo & u(1)
    mant = mant + (rnd & (sticky | (mant & u(1))))  # ties to even; a carry moves up a binade
    # assemble: normal results carry the exponent field (biased - 1) + the hidden bit in mant;
    # subnormal ones (biased < 1) have field 0 and their mant already shifted
    field = xp.where(biased >= 1, biased - 1, 0).astype(u)
    out = sign | ((field << u(23)) + mant)
    overflow = (biased >= 1) & (biased - 1 + (mant >> u(23)).astype(np.int32) >= 255)
    out = xp.where(overflow, sign | u(0x7F800000), out)
    out = xp.where(inf_a | zero_b, sign | u(0x7F800000), out)
    out = xp.where(zero_a | inf_b, sign, out)
    special_nan = nan_a | nan_b | (zero_a & zero_b) | (inf_a & inf_b)
    # No float division anywhere in this graph: with one present, XLA CPU returned the float
    # quotient (flushed operands) in lanes where the select chose the integer result.
    return bitcast(xp.where(special_nan, _nan_quotient_bits(xp, ab, bb), out), np.float32)


def _quotient25(xp: ModuleType, num: Array, mb: Array) -> tuple[Array, Array]:
    """``(q, r)`` with ``num·2^24 = q·mb + r``, ``0 <= r < mb``, for uint32 ``mb`` in
    [2^23, 2^24) and ``num`` in [mb, 2·mb): the 25-bit quotient in [2^24, 2^25).

    Exact, with no integer division (which vectorizes nowhere). A float32 estimate comes first:
    the reciprocal of ``y = mb·2^-23`` in [1, 2) from a linear start (relative error below
    1/17) and three Newton steps ``r += r·(1 − y·r)``, then ``q ≈ num·2·r``, within a few units
    of the truth. Whatever rounding, FMA contraction or flushing a backend applies, the rest is
    exact integer arithmetic: the remainder ``num·2^24 − q·mb`` is far below 2^31 in magnitude,
    so the wrapping uint32 product gives it exactly (mod 2^32, read as int32); one float step
    ``q += ⌊r_rem/mb⌋`` (estimate off by at most one) and one ±1 fix put it in [0, mb)."""
    with np.errstate(over="ignore"):  # NumPy scalars warn on the intended uint32 wrap-around
        return _quotient25_body(xp, num, mb)


def _quotient25_body(xp: ModuleType, num: Array, mb: Array) -> tuple[Array, Array]:
    u, i = np.uint32, np.int32
    y = bitcast(u(0x3F800000) | (mb & u(0x7FFFFF)), np.float32)  # mb·2^-23, exact
    r = np.float32(24.0 / 17.0) - np.float32(8.0 / 17.0) * y
    for _ in range(3):
        r = r + r * (np.float32(1.0) - y * r)
    q = (num.astype(np.float32) * (np.float32(2.0) * r)).astype(u)  # num < 2^25 and even if >= 2^24
    rem = bitcast((num << u(24)) - q * mb, i)  # exact: |num·2^24 − q·mb| < 2^31

    def correct(q: Array, rem: Array) -> tuple[Array, Array]:
        d = xp.floor(rem.astype(np.float32) * r * np.float32(2.0**-23)).astype(i)
        return bitcast(bitcast(q, i) + d, u), rem - d * bitcast(mb, i)

    q, rem = correct(q, rem)  # now −mb <= rem < 2·mb
    mbi = bitcast(mb, i)
    neg, big = rem < 0, rem >= mbi
    q = xp.where(neg, q - u(1), xp.where(big, q + u(1), q))
    rem = xp.where(neg, rem + mbi, xp.where(big, rem - mbi, rem))
    return q, bitcast(rem, u)


def _nan_quotient_bits(xp: ModuleType, ab: Array, bb: Array) -> Array:
    """The NaN that a NaN-producing division returns, as bits, by one rule on every platform
    (x86 SSE's): a NaN ``a`` quieted, else a NaN ``b`` quieted, else the default NaN 0xFFC00000
    (0/0, Inf/Inf)."""
    u = np.uint32
    quiet = u(0x00400000)
    nan_a = (ab & u(0x7FFFFFFF)) > u(0x7F800000)
    nan_b = (bb & u(0x7FFFFFFF)) > u(0x7F800000)
    return xp.where(nan_a, ab | quiet, xp.where(nan_b, bb | quiet, u(0xFFC00000)))


# === flush-to-zero flavour: round to nearest even, results below 2^-126 become +0 ============
TINY = np.float32(2.0**-126)


def ftz(x: Array) -> Array:
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


def mul_ftz(a: Array, b: Array) -> Array:
    """float32 ``a·b`` rounded to nearest even, flushed (never fused into a later add)."""
    return ftz(a * b)


def add_ftz(a: Array, b: Array) -> Array:
    """float32 ``a + b``, flushed."""
    return ftz(a + b)


def div_ftz(a: Array, b: Array) -> Array:
    """float32 ``a / b`` correctly rounded (IEEE round-to-nearest-even), then flushed.

    The quotient is :func:`div_f32`, computed with integer operations on
    NumPy and under jax alike: on the H200 XLA's jitted float32 division differed from NumPy's in
    the last bit (measured 2026-11-29: 11 of 16,384 outputs of the exact-f32 attention recipe,
    whose numerator and normalizer were bit-identical), and XLA CPU rewrites ``a / broadcast(b)``
    as ``a * (1/b)``. Integer division is exact everywhere."""
    return ftz(div_f32(a, b))


def pow2(k: Array, like: Array | None = None) -> Array:
    """float32 2^k for integer k in [−126, 127] (built from bits, exact)."""
    xp = namespace(k if like is None else like, k)
    k = xp.asarray(k, dtype=np.int32)
    return bitcast(((k + 127).astype(np.uint32) << np.uint32(23)), np.float32)


def ldexp_ftz(x: Array, k: Array) -> Array:
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


def _identity(x: Array) -> Array:
    return x


def _two_sum(a: Array, b: Array, fl) -> tuple[Array, Array]:
    s = fl(a + b)
    bv = fl(s - a)
    return s, fl(fl(a - fl(s - bv)) + fl(b - bv))


def two_sum_ftz(a: Array, b: Array) -> tuple[Array, Array]:
    """(s, e) with s = fl(a + b) and a + b = s + e exactly (Knuth; no multiplications)."""
    return _two_sum(a, b, ftz)


def two_sum(a: Array, b: Array) -> tuple[Array, Array]:
    """:func:`two_sum_ftz` without the flushes, for callers whose every intermediate is provably
    zero or at least 2^-126 in magnitude (then the flushes are the identity, and leaving them out
    cannot change a bit on any backend; there is no product to contract)."""
    return _two_sum(a, b, _identity)


def _split12(xp: ModuleType, a: Array, fl) -> tuple[Array, Array]:
    bits = bitcast(xp.asarray(a, dtype=np.float32), np.uint32)
    hi = bitcast(bits & np.uint32(0xFFFFF000), np.float32)
    return hi, fl(a - hi)


def _two_prod(a: Array, b: Array, fl) -> tuple[Array, Array]:
    xp = namespace(a, b)
    p = mul_ftz(a, b)  # flushed in both flavours: the barrier that keeps p a rounded product
    ah, al = _split12(xp, a, fl)
    bh, bl = _split12(xp, b, fl)
    return p, fl(fl(fl(fl(fl(ah * bh) - p) + fl(ah * bl)) + fl(al * bh)) + fl(al * bl))


def two_prod_ftz(a: Array, b: Array) -> tuple[Array, Array]:
    """(p, e) with p = fl(a·b) and a·b = p + e exactly (Dekker with an exact bit-mask split;
    every partial product is exact, so fusing them into FMAs cannot change a bit). Exact unless
    an intermediate falls below 2^-126 (then flushed)."""
    return _two_prod(a, b, ftz)


def two_prod(a: Array, b: Array) -> tuple[Array, Array]:
    """:func:`two_prod_ftz` without the flushes of the exact partial terms, for callers whose
    every intermediate is provably zero or at least 2^-126 in magnitude. ``p`` keeps its flush:
    it is the barrier that stops a compiler from fusing ``a·b`` into the following subtraction
    (the partial products are exact, so contracting them changes nothing)."""
    return _two_prod(a, b, _identity)


def _round_to_odd_sum(xp: ModuleType, a: Array, b: Array) -> Array:
    s, e = two_sum_ftz(a, b)
    sb = bitcast(s, np.uint32)
    inexact = e != 0
    even = (sb & np.uint32(1)) == 0
    same = (e > 0) == (s > 0)
    step = xp.where(same, np.uint32(1), np.uint32(0xFFFFFFFF))  # +1 or -1 on the magnitude
    fixed = bitcast(sb + step, np.float32)
    return xp.where(inexact & even, fixed, s)


def fma_ftz(a: Array, b: Array, c: Array) -> Array:
    """float32 fused multiply-add ``RN(a·b + c)`` emulated exactly without an FMA
    (Boldo & Melquiond 2008: exact product, exact sum, round-to-odd, one final RN), flushed."""
    xp = namespace(a, b, c)
    uh, ul = two_prod_ftz(a, b)
    th, tl = two_sum_ftz(c, uh)
    v = _round_to_odd_sum(xp, tl, ul)
    return ftz(th + v)


def tree_sum_ftz(x: Array, axis: int = -1) -> Array:
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

"""exp2 models: correctly rounded float32 exp2, FA4's polynomial emulation, the exact FMA it
needs, the FA4 schedule, log2; NumPy vs jit bit-identity."""

from __future__ import annotations

from fractions import Fraction

import jax
import numpy as np
import pytest

from fp4sim.attention.exp2 import (
    POLY_EX2,
    e4m3_thresholds,
    exp2_fa4,
    exp2_model,
    exp2_rn,
    exp2_rn_e4m3,
    fa4_emulated_mask,
    log2_f32,
)
from fp4sim.attention.recipe import Exp2Kind, Exp2Model
from fp4sim.formats import f32
from fp4sim.formats.codec import encode
from fp4sim.formats.spec import E4M3

TINY = 2.0**-126


def _oracle_exp2(x: np.ndarray) -> np.ndarray:
    """float64 exp2 rounded to float32, results below 2^-126 flushed (independent oracle)."""
    with np.errstate(over="ignore"):
        y = np.exp2(x.astype(np.float64)).astype(np.float32)
    y[np.abs(y) < TINY] = 0
    return y


def _bits(a):
    return np.asarray(a).view(np.uint32)


def test_exp2_rn_every_float32_in_minus_one_to_minus_half():
    # every float32 in [-1, -1/2): 2^23 inputs, the binade of attention's log2 scores
    x = (np.arange(1 << 23, dtype=np.uint32) | np.uint32(0xBF000000)).view(np.float32)
    np.testing.assert_array_equal(_bits(exp2_rn(x)), _bits(_oracle_exp2(x)))


def _neighbours(x: np.ndarray, k: int) -> np.ndarray:
    """float32 patterns within k ulps of each x (stepping through the float order)."""
    bits = np.asarray(x, dtype=np.float32).view(np.int32).astype(np.int64)
    key = np.where(bits < 0, -(bits & 0x7FFFFFFF), bits)[:, None] + np.arange(-k, k + 1)
    key = np.clip(key, -0x7F800000, 0x7F800000)
    out = np.where(key < 0, 0x80000000 | (-key), key).astype(np.uint32).view(np.float32)
    return out.reshape(-1)


def test_e4m3_thresholds_are_where_the_code_steps_up():
    # independent oracle: float64 exp2 rounded to float32, then the encoder
    tau = e4m3_thresholds()
    assert tau.dtype == np.float32 and tau.shape == (127,) and tau[0] == -np.inf
    assert np.all(np.diff(tau[1:]) > 0)
    below = np.nextafter(tau[1:], np.float32(-np.inf))
    with np.errstate(invalid="ignore"):
        at = encode(_oracle_exp2(tau[1:]), E4M3).astype(int)
        under = encode(_oracle_exp2(below), E4M3).astype(int)
    codes = np.arange(1, 127)
    np.testing.assert_array_equal(at >= codes, True)
    np.testing.assert_array_equal(under < codes, True)
    # the carry of the mantissa into 2.0 and the saturation point, by value
    assert encode(_oracle_exp2(tau[64:65]), E4M3)[0] == 0x40  # 2.0
    # 2^x rounds to 448 (0x7E, saturated above) from the tie at 432 on
    assert abs(float(tau[126]) - np.log2(432.0)) < 1e-6


def test_exp2_rn_e4m3_equals_encode_of_exp2_rn():
    # the composition it replaces, on: every float32 in [-1, -1/2), [1/2, 1), [-8, -6) and
    # [8, 16); every threshold's neighbourhood; special values; random bit patterns
    rng = np.random.default_rng(5)
    ranges = [
        (np.arange(1 << 23, dtype=np.uint32) | np.uint32(hi)).view(np.float32)
        for hi in (0xBF000000, 0x3F000000, 0x41000000)
    ]
    ranges.append((np.arange(1 << 22, dtype=np.uint32) + np.uint32(0xC0C00000)).view(np.float32))
    specials = np.float32(
        [
            0.0,
            -0.0,
            np.inf,
            -np.inf,
            np.nan,
            -np.nan,
            1e-45,
            -1e-45,
            2.0**-126,
            -(2.0**-30),
            -1.0,
            -6.0,
            -7.0,
            -10.0,
            -11.0,
            9.0,
            128.0,
            -126.0,
            3e38,
            -3e38,
        ]
    )
    x = np.concatenate(
        ranges
        + [
            _neighbours(e4m3_thresholds()[1:], 300),
            _neighbours(np.arange(-12, 11, dtype=np.float32), 300),
            specials,
            rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32).view(np.float32),
            rng.uniform(-12, 10, 1 << 20).astype(np.float32),
        ]
    )
    want = np.asarray(jax.jit(lambda v: encode(exp2_rn(v), E4M3))(x))
    with np.errstate(invalid="ignore"):
        got_np = exp2_rn_e4m3(x)
        assert np.array_equal(want[::97], encode(exp2_rn(x[::97]), E4M3))  # the jit is NumPy's
    got_jit = np.asarray(jax.jit(exp2_rn_e4m3)(x))
    for got in (got_np, got_jit):
        bad = np.nonzero(got != want)[0]
        assert bad.size == 0, (x[bad[:5]], got[bad[:5]], want[bad[:5]])
    assert got_np.dtype == np.uint8 and got_jit.dtype == np.uint8


def test_exp2_rn_random_ranges_and_jit_bits():
    rng = np.random.default_rng(11)
    x = np.concatenate(
        [
            rng.uniform(-130, 130, 400_000),
            rng.uniform(-0.5, 0.5, 400_000),
            rng.uniform(-1e-4, 1e-4, 100_000),
            rng.standard_normal(100_000) * 1e-30,
        ]
    ).astype(np.float32)
    y = exp2_rn(x)
    np.testing.assert_array_equal(_bits(y), _bits(_oracle_exp2(x)))
    np.testing.assert_array_equal(_bits(jax.jit(exp2_rn)(x)), _bits(y))


def test_exp2_rn_where_s_is_smallest():
    # exp2_rn drops the flushes inside its double-float32 steps because |x| < 2^-30 takes the
    # path of x = 0 and every other input has s = 0 or |s| >= 2^-30 (module docstring); these are
    # the inputs nearest that argument's edges: every 16th float32 of the binades on either side
    # of 2^-30 (both signs), and x = n + j/256 + a few ulps for every n and j
    mags = (np.arange(0, 2 << 23, 16, dtype=np.uint32) + np.uint32((127 - 31) << 23)).view(
        np.float32
    )
    n = np.arange(-126, 128, dtype=np.float32)[:, None, None]
    j = np.arange(-128, 129, dtype=np.float32)[None, :, None] / np.float32(256)
    base = (n + j).astype(np.float32)
    k = np.array([-3, -1, 1, 2, 5], dtype=np.int32)
    near = (base.view(np.int32) + k).view(np.float32).ravel()
    x = np.concatenate([mags, -mags, near, np.array([2.0**-30, -(2.0**-30)], np.float32)])
    x = x[np.isfinite(x)]
    y = exp2_rn(x)
    np.testing.assert_array_equal(_bits(y), _bits(_oracle_exp2(x)))
    np.testing.assert_array_equal(_bits(jax.jit(exp2_rn)(x)), _bits(y))
    assert (y[np.abs(x) < 2.0**-30] == 1).all()


@pytest.mark.parametrize("flavour", ["flushed", "unflushed"])
def test_error_free_transforms_are_exact_and_jit_identical(flavour):
    two_sum = f32.two_sum_ftz if flavour == "flushed" else f32.two_sum
    two_prod = f32.two_prod_ftz if flavour == "flushed" else f32.two_prod
    rng = np.random.default_rng(5)

    def sample():  # sign, [1, 2) and 2^[-20, 20]: every intermediate stays far above 2^-126
        mag = rng.uniform(1, 2, 20_000) * np.exp2(rng.integers(-20, 21, 20_000))
        return (mag * rng.choice([-1.0, 1.0], 20_000)).astype(np.float32)

    a, b = sample(), sample()
    s, e = two_sum(a, b)
    p, pe = two_prod(a, b)
    exact_sum = [Fraction(float(u)) + Fraction(float(v)) for u, v in zip(a, b)]
    assert [Fraction(float(u)) + Fraction(float(v)) for u, v in zip(s, e)] == exact_sum
    # a float32 product is exact in float64 (48 significant bits), and so is p + e here
    np.testing.assert_array_equal(p.astype(np.float64) + pe, a.astype(np.float64) * b)
    np.testing.assert_array_equal(_bits(p), _bits(a * b))
    for got, want in zip(jax.jit(lambda u, v: two_sum(u, v) + two_prod(u, v))(a, b), (s, e, p, pe)):
        np.testing.assert_array_equal(_bits(got), _bits(want))


def test_exp2_rn_special_values():
    x = np.array(
        [
            -np.inf,
            np.inf,
            np.nan,
            0.0,
            -0.0,
            1.0,
            -126.0,
            -126.00001,
            127.99,
            128.0,
            1e-45,
            -1e-45,
            -149.0,
        ],
        dtype=np.float32,
    )
    y = exp2_rn(x)
    assert y[0] == 0 and np.isinf(y[1]) and y[1] > 0 and np.isnan(y[2])
    assert y[3] == 1 and y[4] == 1 and y[5] == 2
    assert y[6] == np.float32(TINY) and y[7] == 0 and y[12] == 0  # flush below 2^-126
    assert y[8] == np.float32(2.0 ** float(np.float32(127.99))) and np.isinf(y[9])
    assert y[10] == 1 and y[11] == 1  # subnormal inputs are flushed to 0 first
    np.testing.assert_array_equal(_bits(jax.jit(exp2_rn)(x)), _bits(y))


def _rn_f32(fr: Fraction) -> np.float32:
    """Round an exact rational to float32, nearest-even, by comparing neighbours exactly."""
    c = np.float32(float(fr))
    best = None
    for cand in (np.nextafter(c, np.float32(-np.inf)), c, np.nextafter(c, np.float32(np.inf))):
        err = abs(Fraction(float(cand)) - fr)
        key = (err, int(np.array(cand).view(np.uint32)) & 1)
        if best is None or key < best[0]:
            best = (key, cand)
    return best[1]


def test_fma_emulation_is_exact():
    rng = np.random.default_rng(3)
    n = 3000
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    c = np.concatenate(
        [rng.standard_normal(n // 2), -(a[n // 2 :].astype(np.float64) * b[n // 2 :])]
    ).astype(np.float32)
    got = f32.fma_ftz(a, b, c)
    want = np.array(
        [
            _rn_f32(Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z)))
            for x, y, z in zip(a, b, c)
        ],
        dtype=np.float32,
    )
    np.testing.assert_array_equal(_bits(got), _bits(want))
    np.testing.assert_array_equal(_bits(jax.jit(f32.fma_ftz)(a, b, c)), _bits(got))
    # a*b+c written plainly is NOT what the emulation gives on every input (FMA differs)
    assert np.any(_bits((a * b) + c) != _bits(got))


def _fa4_oracle(x: np.ndarray) -> np.ndarray:
    """FA4 ex2 spec with exact rational FMAs (independent of fp4sim's emulation)."""
    out = []
    c0, c1, c2, c3 = (Fraction(float(v)) for v in POLY_EX2)
    for xv in x:
        xc = max(float(xv), -127.0)
        n = int(np.floor(xc))
        f = np.float32(np.float32(xc) - np.float32(n))
        F = Fraction(float(f))
        p = _rn_f32(c3 * F + c2)
        p = _rn_f32(Fraction(float(p)) * F + c1)
        p = _rn_f32(Fraction(float(p)) * F + c0)
        bits = (np.int64(n) << 23) + int(np.array(p).view(np.uint32))
        out.append(np.array(bits & 0xFFFFFFFF, dtype=np.uint32).view(np.float32))
    y = np.array(out, dtype=np.float32)
    y[np.abs(y) < TINY] = 0
    return y


def test_fa4_exp2_matches_spec_oracle():
    rng = np.random.default_rng(5)
    x = np.concatenate(
        [rng.uniform(-127, 0, 2000), [-127.5, -127.0, -126.2, -1e-8, 0.0, -0.5, -3.0]]
    ).astype(np.float32)
    np.testing.assert_array_equal(_bits(exp2_fa4(x)), _bits(_fa4_oracle(x)))


def test_fa4_exp2_error_bound_and_jit():
    # FA4's polynomial: |rel err| <= 9e-5 over x in [-126, 0]
    x = np.concatenate(
        [np.linspace(-126, 0, 500_001), np.random.default_rng(0).uniform(-126, 0, 500_000)]
    ).astype(np.float32)
    y = exp2_fa4(x)
    rel = y.astype(np.float64) / np.exp2(x.astype(np.float64)) - 1
    assert np.max(np.abs(rel)) <= 9e-5
    assert rel.min() < -8.4e-5 and rel.max() > 8.6e-5  # the polynomial's extremes are reached
    np.testing.assert_array_equal(_bits(jax.jit(exp2_fa4)(x)), _bits(y))
    assert exp2_fa4(np.float32(-np.inf)) == 0 and np.isnan(exp2_fa4(np.float32(np.nan)))


def test_fa4_schedule_defaults_emulate_a_quarter_except_last_fragment():
    m = fa4_emulated_mask(128, Exp2Model(kind=Exp2Kind.FA4_POLY), fragment=32, tile=128)
    want = np.zeros(128, bool)
    for frag in range(3):  # the last fragment stays native
        for k in (12, 13, 14, 15, 28, 29, 30, 31):
            want[frag * 32 + k] = True
    np.testing.assert_array_equal(m, want)
    all_emul = Exp2Model(kind=Exp2Kind.FA4_POLY, emulate_res=16, native_last_fragments=0)
    assert fa4_emulated_mask(128, all_emul, fragment=32, tile=128).all()


def test_exp2_model_mixes_the_two_exp2s():
    t = -np.random.default_rng(2).uniform(0, 20, (3, 128)).astype(np.float32)
    model = Exp2Model(kind=Exp2Kind.FA4_POLY)
    y = exp2_model(t, model, fragment=32, tile=128)
    m = fa4_emulated_mask(128, model, fragment=32, tile=128)
    np.testing.assert_array_equal(_bits(y[:, m]), _bits(exp2_fa4(t[:, m])))
    np.testing.assert_array_equal(_bits(y[:, ~m]), _bits(exp2_rn(t[:, ~m])))
    assert np.any(y[:, m] != exp2_rn(t[:, m]))


def test_log2_accuracy_specials_and_jit():
    x = np.exp(np.random.default_rng(1).uniform(-80, 80, 200_000)).astype(np.float32)
    y = log2_f32(x)
    ref = np.log2(x.astype(np.float64))
    assert np.max(np.abs(y - ref) / np.maximum(np.abs(ref), 1.0)) < 8 * 2.0**-24
    np.testing.assert_array_equal(_bits(jax.jit(log2_f32)(x)), _bits(y))
    s = log2_f32(np.array([0, 1, 2, 8, -1, np.inf, np.nan], np.float32))
    assert s[0] == -np.inf and s[1] == 0 and s[2] == 1 and s[3] == 3
    assert np.isnan(s[4]) and s[5] == np.inf and np.isnan(s[6])


@pytest.mark.parametrize("fn", [exp2_rn, exp2_fa4])
def test_exp2_rejects_nothing_silently_on_shapes(fn):
    assert fn(np.zeros((2, 0), np.float32)).shape == (2, 0)


def _division_operands(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random float32 pairs over the whole exponent range, plus the hard classes: subnormal
    operands and quotients, overflow, exact and near ties, specials, signed zeros."""
    rng = np.random.default_rng(seed)
    bits_a = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    bits_b = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    a, b = bits_a.view(np.float32).copy(), bits_b.view(np.float32).copy()
    m = n // 8  # quotients near 1, where the rounding decision is made on few bits
    with np.errstate(all="ignore"):
        b[:m] = (a[:m] * (1 + rng.uniform(-1e-6, 1e-6, m))).astype(np.float32)
    # results exactly halfway between two float32: (odd 25-bit integer) / 2
    odd = (rng.integers(2**23, 2**24, m) * 2 + 1).astype(np.float32)
    a[m : 2 * m], b[m : 2 * m] = odd, np.float32(2.0)
    special = np.array(
        [
            0.0,
            -0.0,
            np.inf,
            -np.inf,
            np.nan,
            1e-45,
            -1e-45,
            1e-39,
            2.0**-126,
            3.4e38,
            1.0,
            -1.0,
            3.0,
        ],
        np.float32,
    )
    a[-169:] = np.repeat(special, 13)
    b[-169:] = np.tile(special, 13)
    return a, b


def test_f32_division_under_jit_is_ieee_from_integer_ops():
    """div_f32 divides with integers on both paths; it must equal IEEE float32 division (NumPy's
    native one) bit for bit, NaN positions aside, and f32.div_ftz must agree NumPy vs jit."""
    from fp4sim.formats.blocks import div_f32

    a, b = _division_operands(400_000, 4)
    with np.errstate(all="ignore"):
        want = a / b
    got = np.asarray(jax.jit(div_f32)(a, b))
    np.testing.assert_array_equal(_bits(div_f32(a, b)), _bits(got))  # NumPy path, same bits
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(_bits(got[~nan]), _bits(want[~nan]))
    # NaN results carry one documented payload rule on both paths, and NumPy == jit in every bit
    flushed = np.asarray(jax.jit(f32.div_ftz)(a, b))
    np.testing.assert_array_equal(_bits(flushed), _bits(f32.div_ftz(a, b)))
    nan_a = np.isnan(a)
    np.testing.assert_array_equal(_bits(got[nan_a]), _bits(a[nan_a]) | 0x00400000)
    assert set(_bits(got[nan & ~np.isnan(a) & ~np.isnan(b)]).tolist()) == {0xFFC00000}
    # the classes the operands were built to hit are really there
    assert np.count_nonzero((np.abs(want) < 2.0**-126) & (want != 0)) > 100  # gradual underflow
    assert np.count_nonzero(np.isinf(want) & np.isfinite(a) & (b != 0)) > 100  # overflow


def test_f32_ftz_on_bits():
    x = np.array([1e-39, -1e-39, -0.0, 2.0**-126, np.nan, -np.inf, 3.0], np.float32)
    y = f32.ftz(x)
    np.testing.assert_array_equal(_bits(y[:3]), [0, 0, 0])
    assert y[3] == np.float32(2.0**-126) and np.isnan(y[4]) and y[5] == -np.inf and y[6] == 3
    np.testing.assert_array_equal(_bits(jax.jit(f32.ftz)(x)), _bits(y))


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=200)
@given(st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), min_size=1, max_size=64))
def test_exp2_rn_property_matches_oracle(xs):
    x = np.array(xs, dtype=np.float32)
    y = exp2_rn(x)
    want = _oracle_exp2(np.where(np.abs(x) < TINY, np.float32(0), x))
    nan = np.isnan(x)
    assert np.isnan(y[nan]).all()
    np.testing.assert_array_equal(_bits(y[~nan]), _bits(want[~nan]))

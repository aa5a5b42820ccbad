"""Probability converters: worked examples, code-match rates on the
8M-point grid, block-exponent invariants, masking, NumPy vs jit bit-identity."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

from fp4sim.attention import recipe as R
from fp4sim.attention.converters import (
    LOG2_6,
    convert_tile,
    direct_p_coordinate,
    direct_p_payload,
    direct_p_payload_definition,
    e2m1_payload_thresholds,
    mitchell_exp2,
)
from fp4sim.attention.exp2 import exp2_rn
from fp4sim.attention.metrics import uniform_grid
from fp4sim.formats.codec import decode, encode
from fp4sim.formats.spec import E2M1, E4M3, UE4M3


def _vals(codes):
    return decode(codes, E2M1)


def test_e2m1_rne_goldens_through_the_affine_path():
    # with a = 1, b = 0 the affine converter is exactly RN_E2M1_sat(max(0, x))
    x = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.19, 100.0], np.float32)
    got = _vals(direct_p_payload(R.AffineP(a=1.0, b=0.0), x))
    np.testing.assert_array_equal(got, [0, 1, 1, 2, 2, 4, 4, 6, 6])


def test_affine_and_exact_behaviour_table():
    # the affine behaviour table (x=0 -> 1 both; x=1 -> affine 3, exact 2)
    x = np.array([-1, -0.5, 0, math.log2(1.5), 1, math.log2(3), 2, math.log2(6)], np.float32)
    exact = _vals(direct_p_payload(R.ExactP(), x))
    affine = _vals(direct_p_payload(R.AffineP(), x))
    np.testing.assert_array_equal(exact, [0.5, 0.5, 1, 1.5, 2, 3, 4, 6])
    np.testing.assert_array_equal(affine, [0, 0.5, 1, 2, 3, 4, 4, 6])


def test_mitchell_golden_rows():
    # Mitchell-P golden rows: x -> (exact, Mitchell s=0, Mitchell s=log2(1.25)-1/4)
    rows = [
        (0.30, 1, 1.5, 1),
        (0.78, 1.5, 2, 1.5),
        (0.81, 2, 2, 1.5),
        (1.30, 2, 3, 2),
        (2.30, 4, 6, 4),
        (-1.5, 0.5, 0.5, 0.5),
    ]
    x = np.array([r[0] for r in rows], np.float32)
    np.testing.assert_array_equal(_vals(direct_p_payload(R.ExactP(), x)), [r[1] for r in rows])
    np.testing.assert_array_equal(
        _vals(direct_p_payload(R.MitchellP(shift=0.0), x)), [r[2] for r in rows]
    )
    np.testing.assert_array_equal(_vals(direct_p_payload(R.MitchellP(), x)), [r[3] for r in rows])


def test_mitchell_error_extrema():
    # s = 0: max(A/T-1) = 0.0614757 at frac 0.442695; max(1-T/A) = 0.0579153;
    # max log2 error 0.0860713
    y = np.linspace(-3, 3, 6_000_001).astype(np.float32)
    a = mitchell_exp2(y).astype(np.float64)
    t = np.exp2(y.astype(np.float64))
    r = a / t - 1
    assert r.max() == pytest.approx(0.0614757, abs=2e-7) and r.min() >= -1e-7
    frac = (y - np.floor(y))[np.argmax(r)]
    assert frac == pytest.approx(0.442695, abs=1e-5)
    assert (1 - t / a).max() == pytest.approx(0.0579153, abs=2e-7)
    assert np.max(np.log2(a) - y) == pytest.approx(0.0860713, abs=2e-7)


def test_code_match_rates_on_the_8m_grid():
    # the published grid rates: affine 0.632884; Mitchell s=0 0.95161; s=0.0576 0.98504; boundary 0.98671
    x = uniform_grid()
    assert x.size == 8_000_000 and x.min() > -6 and x.max() < math.log2(6)
    exact = direct_p_payload(R.ExactP(), x)
    for conv, want in [
        (R.AffineP(), 0.632884),
        (R.MitchellP(shift=0.0), 0.95161),
        (R.MitchellP(shift=0.0576), 0.98504),
        (R.MitchellP(), 0.98671),
    ]:
        rate = np.count_nonzero(direct_p_payload(conv, x) == exact) / x.size
        assert rate == pytest.approx(want, abs=1e-4), conv


def _recipe(conv, fmt, **kw):
    v = R.VFormat.NVFP4_TOKENS if fmt.block == 16 else R.VFormat.FP8
    kw.setdefault("normalization", R.Normalization.MISMATCHED)
    return R.AttentionRecipe(converter=conv, p_format=fmt, v=v, **kw)


def test_hao_log_domain_group_golden():
    # HAO's log-domain example: t=[0,-0.4,-1.3,-3.0] -> P=[6,4.5471,2.4368,0.75] -> E2M1 [6,4,2,1], sf 1,
    # row_acc 13.7339069; shifted by -2.7: sf 0.153893 -> E4M3 0.15625
    rec = _recipe(R.LogGroupP(), R.PFormat.NVFP4)
    t = np.full((1, 32), -np.inf, np.float32)
    t[0, :4] = [0.0, -0.4, -1.3, -3.0]
    p = convert_tile(rec, t, need_mismatched=True)
    np.testing.assert_array_equal(_vals(p.codes[0, :4]), [6, 4, 2, 1])
    assert decode(p.scales, UE4M3)[0, 0] == 1.0
    assert p.mismatched[0] == pytest.approx(13.7339069, abs=2e-6)
    assert np.all(p.codes[0, 4:] == 0) and p.scales[0, 1] == 0  # fully masked group -> sf 0
    t2 = t.copy()
    t2[0, :4] -= np.float32(2.7)
    p2 = convert_tile(rec, t2, need_mismatched=True)
    assert decode(p2.scales, UE4M3)[0, 0] == 0.15625
    sf = float(exp2_rn(np.float32(-2.7)))
    assert sf == pytest.approx(0.153893, abs=1e-6)
    np.testing.assert_array_equal(_vals(p2.codes[0, :4]), [6, 4, 2, 1])


def _random_t(rows=6, keys=128, seed=0):
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((rows, keys)).astype(np.float32) * np.float32(2.5)
    t = (z - z.max(-1, keepdims=True)).astype(np.float32)
    t[1, 32:64] = -np.inf  # a fully masked block
    t[2, 5::7] = -np.inf
    return t


def test_direct_p_block_exponent_rules():
    t = _random_t()
    p = convert_tile(R.HW_FP4_DIRECT_P.replace(converter=R.ExactP()), t)
    vals = _vals(p.codes).reshape(6, 4, 32)
    bmax = np.where(np.isfinite(t), t, -np.inf).reshape(6, 4, 32).max(-1)
    live = np.isfinite(bmax)
    np.testing.assert_array_equal(p.k[live], np.ceil(bmax[live]).astype(np.int32))
    assert np.all(p.k[~live] == -127) and np.all(vals[~live] == 0)
    top = vals.max(-1)[live]
    assert np.all((top >= 3) & (top <= 6))  # 2^x of the block max lies in (3, 6]
    np.testing.assert_array_equal(p.scales, (p.k + 127).astype(np.uint8))
    assert p.pdiv == 6.0 and p.block == 32
    anchored = convert_tile(R.HW_FP4_DIRECT_P.replace(block_exponent=R.BlockExponent.ROW_ANCHOR), t)
    assert np.all(anchored.k == 0)
    assert np.count_nonzero(anchored.codes) < np.count_nonzero(p.codes)
    np.testing.assert_array_equal(p.codes[~np.isfinite(t)], 0)
    # the coordinate is exact: x = t + (log2 6 - k)
    x = direct_p_coordinate(t[0].reshape(4, 32), p.k[0][:, None])
    bias = (LOG2_6 - p.k[0][:, None].astype(np.float32)).astype(np.float32)
    np.testing.assert_array_equal(x, t[0].reshape(4, 32) + bias)


def test_exact_mxfp8_and_nvfp4_and_fixed_scale():
    t = _random_t()
    m8 = convert_tile(_recipe(R.ExactP(), R.PFormat.MXFP8), t)
    v8 = decode(m8.codes, E4M3).reshape(6, 4, 32)
    live = np.isfinite(t.reshape(6, 4, 32)).any(-1)
    top = v8.max(-1)[live]
    assert np.all((top >= 224) & (top <= 448))
    p = exp2_rn(t)
    nv = convert_tile(_recipe(R.ExactP(), R.PFormat.NVFP4), t)
    sf = decode(
        encode((p.reshape(6, 8, 16).max(-1) / np.float32(6)).astype(np.float32), UE4M3), UE4M3
    )
    np.testing.assert_array_equal(decode(nv.scales, UE4M3), sf)
    np.testing.assert_array_equal(nv.values, _vals(nv.codes) * np.repeat(sf, 16, axis=-1))
    fx = convert_tile(_recipe(R.FixedScaleP(), R.PFormat.FP8), t)
    np.testing.assert_array_equal(fx.codes, encode(p * np.float32(16), E4M3))
    assert fx.factor_exp == -4


def test_sage_two_level_group_max_maps_to_six():
    t = _random_t()
    s = convert_tile(_recipe(R.SageTwoLevelP(), R.PFormat.NVFP4), t, need_mismatched=True)
    vals = _vals(s.codes).reshape(6, 8, 16)
    live = np.isfinite(t.reshape(6, 8, 16)).any(-1)
    assert np.all(vals.max(-1)[live] == 6)
    pmax = exp2_rn(np.where(np.isfinite(t), t, -np.inf).reshape(6, 8, 16).max(-1))
    np.testing.assert_allclose(decode(s.scales, UE4M3)[live], (448 * pmax)[live], rtol=2**-4)
    np.testing.assert_allclose(s.mismatched, 2688 * exp2_rn(t).sum(-1), rtol=1e-5)


def test_schraudolph_codes():
    t = np.array([[0.0, -1.0, -0.5, -np.inf] * 8], np.float32)
    b = convert_tile(_recipe(R.SchraudolphP(shift=0.0), R.PFormat.BF16), t)
    assert b.codes.dtype == np.uint16
    np.testing.assert_array_equal(b.codes[0, :4], [0x3F80, 0x3F00, 0x3F40, 0])  # 1, .5, .75, 0
    f = convert_tile(_recipe(R.SchraudolphP(scale_log2=8), R.PFormat.FP8), t)
    vals = decode(f.codes, E4M3)[0, :4] * 2.0**f.factor_exp
    rel = vals[:3] / np.exp2(t[0, :3].astype(np.float64)) - 1
    assert np.all(np.abs(rel) <= 0.0615 + 2**-3)  # piecewise-linear error + E4M3 grid


def test_converters_numpy_equals_jit_bitwise():
    t = _random_t(rows=4, seed=3)
    t[3, 7] = np.nan
    recipes = [
        R.HW_FP4_DIRECT_P,
        R.HW_FP4_DIRECT_P_MITCHELL,
        R.HW_FP4_DIRECT_P.replace(converter=R.ExactP(), exp2=R.Exp2Model(kind=R.Exp2Kind.FA4_POLY)),
        R.HAO_LOG_NVFP4,
        R.HAO_LOG_MXFP8,
        R.SAGE3_TWO_LEVEL,
        R.CUDNN_FP8_FIXED,
        _recipe(R.SchraudolphP(), R.PFormat.BF16),
        _recipe(R.ExactP(), R.PFormat.NVFP4),
    ]

    def all_tiles(t):
        return [convert_tile(r, t, need_mismatched=True) for r in recipes]

    want = all_tiles(t)
    got = jax.jit(all_tiles)(t)
    for r, a, b in zip(recipes, want, got):
        for name in ("codes", "scales", "values", "mismatched", "k"):
            x, y = getattr(a, name), getattr(b, name)
            if x is None:
                assert y is None
                continue
            np.testing.assert_array_equal(np.asarray(y), x, err_msg=f"{r.converter} {name}")


def test_bad_input():
    with pytest.raises(TypeError, match="Direct-P"):
        direct_p_payload(R.SageTwoLevelP(), np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="multiple"):
        convert_tile(R.HW_FP4_DIRECT_P, np.zeros((2, 48), np.float32))


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=100)
@given(st.lists(st.floats(min_value=-200, max_value=10, width=32), min_size=2, max_size=64))
def test_direct_p_payloads_are_monotone_codes(xs):
    x = np.sort(np.array(xs, dtype=np.float32))
    for conv in (R.ExactP(), R.AffineP(), R.MitchellP(), R.MitchellP(shift=0.0)):
        codes = direct_p_payload(conv, x)
        assert codes.max() <= 7  # non-negative E2M1 magnitudes only
        assert np.all(np.diff(_vals(codes)) >= 0), conv


_STEP_CONVERTERS = (
    R.ExactP(),
    R.AffineP(),
    R.MitchellP(),
    R.MitchellP(shift=0.0),
    R.MitchellP(shift=-3.25),
    R.AffineP(a=1.0, b=0.0),
    R.AffineP(a=0.001, b=10.0),
    R.AffineP(a=3.0, b=-2.0),
    R.AffineP(a=1e-30, b=0.1),
)


def _oracle_payload(conv, x):
    """Independent of fp4sim's float32 helpers and encoder: float64 arithmetic rounded once to
    float32 where the definition rounds, then ml_dtypes' E2M1 (RNE; clipped to 6 first)."""
    import ml_dtypes

    x = np.asarray(x, np.float32)
    with np.errstate(all="ignore"):
        if isinstance(conv, R.ExactP):
            v = np.exp2(x.astype(np.float64)).astype(np.float32)
        elif isinstance(conv, R.AffineP):
            # a float32 product is exact in float64: one rounding, as the definition's
            prod = (np.float64(np.float32(conv.a)) * x.astype(np.float64)).astype(np.float32)
            prod = np.where(np.abs(prod) < np.float32(2.0**-126), np.float32(0.0), prod)
            v = np.maximum(prod + np.float32(conv.b), np.float32(0.0))
        else:
            y = (x - np.float32(conv.shift)).astype(np.float64)
            ys = np.minimum(y, 127.0)
            n = np.floor(ys)
            frac = np.floor((ys - n) * 2.0**23) / 2.0**23
            v = np.where(y >= -126.0, np.exp2(n) * (1.0 + frac), 0.0).astype(np.float32)
        v = np.where(np.isnan(x), np.float32(0.0), np.clip(v, 0.0, 6.0)).astype(np.float32)
    return v.astype(ml_dtypes.float4_e2m1fn).view(np.uint8).astype(int)


@pytest.mark.parametrize("conv", _STEP_CONVERTERS, ids=repr)
def test_e2m1_payload_thresholds_are_where_the_code_steps_up(conv):
    th = np.array(e2m1_payload_thresholds(conv), np.float64)
    assert th.shape == (7,)
    finite = th[~np.isnan(th)]
    assert np.all(np.diff(finite) > 0)
    top = _oracle_payload(conv, np.float32([np.inf]))[0]
    for level, t in enumerate(th, start=1):
        if np.isnan(t):  # never reached: not even by +inf
            assert top < level, (conv, level)
            continue
        t32 = np.float32(t)
        assert _oracle_payload(conv, [t32])[0] >= level, (conv, level, t)
        if t32 > -np.inf:
            below = np.nextafter(t32, np.float32(-np.inf))
            assert _oracle_payload(conv, [below])[0] < level, (conv, level, t)


def _near_thresholds(conv, rng, n_random):
    th = np.array([t for t in e2m1_payload_thresholds(conv) if np.isfinite(t)], np.float32)
    bits = th.view(np.int32)
    steps = np.arange(-300, 301, dtype=np.int32)
    near = (bits[:, None] + steps[None, :]).ravel().view(np.float32)  # ±300 ulps of each
    specials = np.float32(
        [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-45, 2.0**-126, 6.0, -200.0]
    )
    random = rng.integers(0, 2**32, n_random, dtype=np.uint64).astype(np.uint32).view(np.float32)
    dense = rng.uniform(-12.0, 8.0, n_random).astype(np.float32)
    return np.concatenate([near, specials, random, dense])


@pytest.mark.parametrize("conv", _STEP_CONVERTERS, ids=repr)
def test_direct_p_payload_equals_its_definition(conv):
    # the threshold count against the value-then-encode definition, NumPy and jit (all 2^32
    # inputs agree on XLA CPU for the presets' converters, a one-off check of 2026-12-03)
    x = _near_thresholds(conv, np.random.default_rng(11), 1 << 18)
    with np.errstate(all="ignore"):
        want = direct_p_payload_definition(conv, x)
    got = direct_p_payload(conv, x)
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(_oracle_payload(conv, x), want)
    jitted = jax.jit(lambda v: (direct_p_payload(conv, v), direct_p_payload_definition(conv, v)))
    g, w = (np.asarray(a) for a in jitted(x))
    np.testing.assert_array_equal(g, want)
    np.testing.assert_array_equal(w, want)


@settings(max_examples=60, deadline=None)
@given(
    st.floats(min_value=2.0**-20, max_value=2.0**20, width=32),
    st.floats(min_value=-1e4, max_value=1e4, width=32),
    st.floats(min_value=-50.0, max_value=50.0, width=32),
)
def test_direct_p_payload_thresholds_for_any_parameters(a, b, shift):
    rng = np.random.default_rng(0)
    for conv in (R.AffineP(a=a, b=b), R.MitchellP(shift=shift)):
        x = _near_thresholds(conv, rng, 1 << 10)
        with np.errstate(all="ignore"):
            want = direct_p_payload_definition(conv, x)
        np.testing.assert_array_equal(direct_p_payload(conv, x), want)
        np.testing.assert_array_equal(_oracle_payload(conv, x), want)


def test_e2m1_payload_thresholds_refuse_other_converters():
    with pytest.raises(TypeError, match="converter"):
        e2m1_payload_thresholds(R.SchraudolphP())


_PAIRS = [(R.ExactP(), f) for f in R.PFormat] + [
    (R.AffineP(), R.PFormat.MXFP4),
    (R.MitchellP(), R.PFormat.MXFP4),
    (R.SchraudolphP(), R.PFormat.BF16),
    (R.SchraudolphP(scale_log2=8), R.PFormat.FP8),
    (R.LogGroupP(), R.PFormat.NVFP4),
    (R.LogGroupP(), R.PFormat.MXFP8),
    (R.SageTwoLevelP(), R.PFormat.NVFP4),
    (R.FixedScaleP(scale=16.0), R.PFormat.FP8),
    (R.FixedScaleP(scale=256.0), R.PFormat.FP8),
]


@pytest.mark.parametrize("conv, fmt", _PAIRS, ids=lambda x: getattr(x, "name", type(x).__name__))
def test_p_tiles_carry_the_declared_constants(conv, fmt):
    """The block, fixed exponent, payload divisor and block exponents of every converter's P
    tile are the facts its P format and converter declare (the backward and the kernels read
    the declarations instead of converting a probe tile)."""
    recipe = R.AttentionRecipe(converter=conv, p_format=fmt)
    t = (np.random.default_rng(0).standard_normal((3, 128)) * 4).astype(np.float32)
    t = t - t.max(axis=-1, keepdims=True)
    t[2, 50:] = -np.inf
    p = convert_tile(recipe, t, need_mismatched=True)
    assert (p.block, p.factor_exp, p.pdiv) == (fmt.block, conv.factor_exp(fmt), fmt.divisor)
    assert (p.exps is not None) == fmt.block_exponents
    if fmt.element is not None:
        np.testing.assert_array_equal(np.asarray(p.codes).max() < fmt.element.num_codes, True)

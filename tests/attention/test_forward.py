"""Tiled forward emulator: NumPy == jit bits, invariants, policies, route errors, bad input."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

from fp4sim.attention import recipe as R
from fp4sim.attention.converters import convert_tile
from fp4sim.attention.forward import attention_forward, hadamard, log2_scores, scores
from fp4sim.attention.metrics import error_summary
from fp4sim.attention.reference import attention_mask, attention_reference


def _qkv(shape_q, skv, dv=None, seed=0):
    rng = np.random.default_rng(seed)
    *lead, sq, d = shape_q
    q = rng.standard_normal(shape_q).astype(np.float32)
    k = rng.standard_normal((*lead, skv, d)).astype(np.float32)
    v = rng.standard_normal((*lead, skv, dv or d)).astype(np.float32)
    return q, k, v


def _bits(a):
    return np.asarray(a).view(np.uint32)


SMALL_TILES = dict(block_kv=64)
CASES = [
    ("direct_p causal segments", R.HW_FP4_DIRECT_P.replace(**SMALL_TILES), True, True),
    ("hao mxfp8 causal", R.HAO_LOG_MXFP8.replace(**SMALL_TILES), True, False),
    ("sage3", R.SAGE3_TWO_LEVEL.replace(**SMALL_TILES), False, False),
    ("cudnn fixed threshold", R.CUDNN_FP8_FIXED.replace(**SMALL_TILES), False, False),
]


@pytest.mark.parametrize("name, rec, causal, segs", CASES, ids=[c[0] for c in CASES])
def test_numpy_equals_jit_bitwise(name, rec, causal, segs, monkeypatch):
    import fp4sim.attention.forward as fwd

    monkeypatch.setattr(fwd, "_ROW_CHUNK", 32)  # jit maps over 3 row chunks (the last padded)
    monkeypatch.setattr(fwd, "_NP_ROW_CHUNK", 40)  # NumPy works in 2 other row blocks
    q, k, v = _qkv((2, 72, 32), 200, seed=1)
    q *= np.float32(2.0)  # sharper rows: the running max moves across tiles
    kw = dict(causal=causal)
    if segs:
        kw["q_segment_ids"] = np.repeat(np.array([0, 1, 2, 5]), 18)  # segment 5 has no keys
        kw["kv_segment_ids"] = np.repeat(np.array([0, 1, 2, 3]), 50)
    want = attention_forward(q, k, v, rec, return_intermediates=True, **kw)

    def f(q, k, v):
        r = attention_forward(q, k, v, rec, return_intermediates=True, **kw)
        return r.out, r.lse, r.intermediates.p_codes, r.intermediates.anchors

    out, lse, codes, anchors = jax.jit(f)(q, k, v)
    np.testing.assert_array_equal(_bits(out), _bits(want.out))
    np.testing.assert_array_equal(_bits(lse), _bits(want.lse))
    np.testing.assert_array_equal(np.asarray(codes), want.intermediates.p_codes)
    np.testing.assert_array_equal(_bits(anchors), _bits(want.intermediates.anchors))
    assert not np.isnan(want.out).any()
    if segs:  # fully masked rows: O = 0, LSE = -inf
        assert np.all(want.out[:, 54:] == 0) and np.all(want.lse[:, 54:] == -np.inf)


def test_exact_f32_converges_to_the_reference():
    q, k, v = _qkv((2, 72, 32), 200, seed=2)
    qs = np.repeat(np.arange(4), 18)
    ks = np.repeat(np.arange(4), 50)
    for causal in (False, True):
        r = attention_forward(
            q,
            k,
            v,
            R.EXACT_F32.replace(block_kv=64),
            causal=causal,
            q_segment_ids=qs,
            kv_segment_ids=ks,
        )
        ref = attention_reference(q, k, v, causal=causal, q_segment_ids=qs, kv_segment_ids=ks)
        # float32 arithmetic with D=32-term score sums and <=200-term accumulations
        np.testing.assert_allclose(r.out, ref.out, rtol=0, atol=2.0**-16)
        live = np.isfinite(ref.lse)
        np.testing.assert_allclose(r.lse[live], ref.lse[live], rtol=0, atol=2.0**-16)
        assert np.all(r.lse[~live] == -np.inf) and np.all(r.out[~live] == 0)


def test_constant_v_exact_under_consistent_normalization_only():
    q, k, _ = _qkv((1, 64, 32), 256, seed=3)
    v = np.ones((1, 256, 32), np.float32)  # MXFP4 V represents 1 exactly (beta=1, payload 6)
    cons = attention_forward(q * 3, k, v, R.HW_FP4_DIRECT_P)
    assert np.max(np.abs(cons.out - 1)) <= 8 * 2.0**-23  # a few float32 roundings
    mism = attention_forward(
        q * 3, k, v, R.HW_FP4_DIRECT_P.replace(normalization=R.Normalization.MISMATCHED)
    )
    assert np.max(np.abs(mism.out - 1)) > 1e-3


def test_noncausal_permutation_invariance():
    q, k, v = _qkv((1, 40, 32), 128, seed=4)
    perm_blocks = np.array([2, 0, 3, 1])
    perm = (perm_blocks[:, None] * 32 + np.arange(32)).reshape(-1)  # whole 32-key P blocks
    rec = R.AttentionRecipe(converter=R.ExactP(), p_format=R.PFormat.MXFP8, v=R.VFormat.FP8)
    a = attention_forward(q, k, v, rec)
    b = attention_forward(q, k[:, perm], v[:, perm], rec)
    np.testing.assert_allclose(b.out, a.out, rtol=0, atol=2.0**-18)  # only summation order
    np.testing.assert_allclose(b.lse, a.lse, rtol=0, atol=2.0**-18)
    full = np.random.default_rng(0).permutation(128)
    e1 = attention_forward(q, k, v, R.EXACT_F32)
    e2 = attention_forward(q, k[:, full], v[:, full], R.EXACT_F32)
    np.testing.assert_allclose(e2.out, e1.out, rtol=0, atol=2.0**-18)


def test_causal_rows_independent_of_later_keys_with_per_token_scales():
    q, k, v = _qkv((1, 256, 32), 256, seed=5)
    k2, v2 = k.copy(), v.copy()
    k2[:, 150:] *= 4
    v2[:, 150:] *= 64
    safe = R.AttentionRecipe(converter=R.ExactP(), v=R.VFormat.FP8)  # NVFP4 Q/K per token
    a = attention_forward(q, k, v, safe, causal=True)
    b = attention_forward(q, k2, v2, safe, causal=True)
    np.testing.assert_array_equal(_bits(b.out[:, :150]), _bits(a.out[:, :150]))
    np.testing.assert_array_equal(_bits(b.lse[:, :150]), _bits(a.lse[:, :150]))
    assert np.any(b.out[:, 150:] != a.out[:, 150:])
    # V scaled along tokens (MXFP4, 32 tokens) leaks: rows 128..149 share V's block 128..159
    leaky = R.HW_FP4_DIRECT_P
    c = attention_forward(q, k, v, leaky, causal=True)
    d = attention_forward(q, k2, v2, leaky, causal=True)
    np.testing.assert_array_equal(_bits(d.out[:, :128]), _bits(c.out[:, :128]))
    assert np.any(d.out[:, 128:150] != c.out[:, 128:150])


def test_nan_policy_rows():
    q, k, v = _qkv((1, 64, 32), 128, seed=6)
    clean = attention_forward(q, k, v, R.HW_FP4_DIRECT_P, causal=True)
    qn = q.copy()
    qn[0, 10, 3] = np.nan
    r = attention_forward(qn, k, v, R.HW_FP4_DIRECT_P, causal=True)
    assert np.isnan(r.out[0, 10]).all() and np.isnan(r.lse[0, 10])
    rows = np.arange(64) != 10
    np.testing.assert_array_equal(_bits(r.out[0, rows]), _bits(clean.out[0, rows]))
    kn = k.copy()
    kn[0, 100, 0] = np.nan  # key 100 (causal, end-aligned: rows >= 36 see it)
    r = attention_forward(q, kn, v, R.HW_FP4_DIRECT_P, causal=True)
    assert np.isnan(r.out[0, 36:]).all() and np.isnan(r.lse[0, 36:]).all()
    np.testing.assert_array_equal(_bits(r.out[0, :36]), _bits(clean.out[0, :36]))


@pytest.mark.parametrize(
    "rec", [R.HW_FP4_DIRECT_P, R.HW_FP4_DIRECT_P_MITCHELL], ids=["direct_p", "mitchell"]
)
@pytest.mark.parametrize("causal", [False, True])
def test_one_nan_in_v_is_nan_in_its_whole_column(rec, causal):
    """One NaN in V: its output column is NaN in every row, on NumPy and under jit alike (as in
    the float64 reference), the other columns are those of V with a zero there (V's scale
    blocks are per column), and LSE does not depend on V (issue 15, item 2)."""
    q, k, v = _qkv((1, 96, 32), 160, seed=9)
    v0 = v.copy()
    v0[0, 77, 5] = 0.0
    vn = v.copy()
    vn[0, 77, 5] = np.nan
    clean = attention_forward(q, k, v0, rec, causal=causal)
    got = attention_forward(q, k, vn, rec, causal=causal)
    jit = jax.jit(lambda a, b, c: attention_forward(a, b, c, rec, causal=causal))(q, k, vn)
    ref = attention_reference(
        q.astype(np.float64), k.astype(np.float64), vn.astype(np.float64), causal=causal
    )
    ref = ref[0] if isinstance(ref, tuple) else ref
    assert np.isnan(ref[0, :, 5]).all()
    for r in (got, jit):
        out = np.asarray(r.out)
        np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
        others = np.arange(32) != 5
        np.testing.assert_array_equal(_bits(out[..., others]), _bits(clean.out[..., others]))
        np.testing.assert_array_equal(_bits(r.lse), _bits(clean.lse))


def _u(fmt: str) -> float:
    """Max relative rounding error of an element format (half its relative spacing)."""
    # float32: 2^-24 per rounding, times the <= 256-term sums of this test
    return {"e2m1": 0.25, "e4m3": 2.0**-4, "bf16": 2.0**-8, "f32": 256 * 2.0**-24}[fmt]


_QK = {R.QKFormat.NVFP4: "e2m1", R.QKFormat.MXFP8: "e4m3", R.QKFormat.FLOAT32: "f32"}
_V = {
    R.VFormat.MXFP4_TOKENS: "e2m1",
    R.VFormat.NVFP4_TOKENS: "e2m1",
    R.VFormat.MXFP8_TOKENS: "e4m3",
    R.VFormat.TOKEN_BLOCK_FP8: "e4m3",
    R.VFormat.FLOAT32: "f32",
}
_P = {
    R.PFormat.MXFP4: "e2m1",
    R.PFormat.NVFP4: "e2m1",
    R.PFormat.MXFP8: "e4m3",
    R.PFormat.FP8: "e4m3",
    R.PFormat.FLOAT32: "f32",
}


def _bound(rec: R.AttentionRecipe) -> float:
    """Independent-error model: root-sum-square of the max relative rounding errors of Q, K,
    P and V, plus the worst relative payload error of an approximate converter (affine: one
    E2M1 step, up to 1/2; Mitchell: 6.15 %)."""
    rss = math.sqrt(2 * _u(_QK[rec.qk]) ** 2 + _u(_P[rec.p_format]) ** 2 + _u(_V[rec.v]) ** 2)
    extra = {R.AffineP: 0.5, R.MitchellP: 0.0615}.get(type(rec.converter), 0.0)
    return rss + extra


def test_route_errors_against_the_exact_reference():
    q, k, v = _qkv((2, 256, 64), 256, seed=7)
    ref = attention_reference(q, k, v).out
    errs = {}
    for name, rec in R.PRESETS.items():
        e = error_summary(attention_forward(q, k, v, rec).out, ref)
        errs[name] = e.rel_l2
        assert e.rel_l2 <= _bound(rec), (name, e)
        assert e.cosine >= 1 - _bound(rec) ** 2, (name, e)
    assert errs["exact_f32"] < 1e-6
    # converter quality ordering on the Direct-P route
    exact_p = error_summary(
        attention_forward(q, k, v, R.HW_FP4_DIRECT_P.replace(converter=R.ExactP())).out, ref
    ).rel_l2
    assert exact_p < errs["hw_fp4_direct_p_mitchell"] < errs["hw_fp4_direct_p"]
    assert errs["hao_log_mxfp8"] < errs["hao_log_nvfp4"]


def test_intermediates_rebuild_p_bit_identically():
    q, k, v = _qkv((1, 48, 32), 256, seed=8)
    rec = R.HW_FP4_DIRECT_P
    r = attention_forward(q, k, v, rec, causal=True, return_intermediates=True)
    it = r.intermediates
    assert it.anchors.shape == (1, 48, 2) and np.all(np.diff(it.anchors, axis=-1) >= 0)
    mask = attention_mask(48, 256, causal=True)
    for tile in range(2):
        sl = slice(tile * 128, (tile + 1) * 128)
        kt = it.k._replace(
            values=it.k.values[:, sl], post=None if it.k.post is None else it.k.post[:, sl]
        )
        u = log2_scores(scores(it.q, kt), it.score_scale, mask[:, sl])
        m = it.anchors[..., tile : tile + 1]
        t = np.where(np.isfinite(m), u - m, np.float32(-np.inf)).astype(np.float32)
        np.testing.assert_array_equal(convert_tile(rec, t).codes, it.p_codes[..., sl])


def test_hadamard():
    x = np.random.default_rng(9).standard_normal((3, 64)).astype(np.float32)
    y = hadamard(x)
    np.testing.assert_allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-6)
    np.testing.assert_allclose(hadamard(y), x, atol=1e-6)
    q, k, v = _qkv((1, 32, 64), 128, seed=9)
    a = attention_forward(q, k, v, R.EXACT_F32)
    b = attention_forward(q, k, v, R.EXACT_F32.replace(hadamard=True))
    np.testing.assert_allclose(b.out, a.out, atol=2.0**-16)
    with pytest.raises(ValueError, match="power-of-two"):
        hadamard(np.zeros((2, 48), np.float32))


@pytest.mark.parametrize(
    "shapes, kw, exc, words",
    [
        (((1, 8, 32), (1, 8, 16), (1, 8, 32)), {}, ValueError, "head dim"),
        (((1, 8, 24), (1, 8, 24), (1, 8, 24)), {}, ValueError, "multiple of the NVFP4"),
        (((1, 8, 32), (1, 9, 32), (1, 8, 32)), {}, ValueError, "keys"),
        (((2, 8, 32), (1, 8, 32), (1, 8, 32)), {}, ValueError, "leading"),
        (((8, 32), (1, 8, 32), (1, 8, 32)), {}, ValueError, "rank"),
        (
            ((1, 8, 32), (1, 8, 32), (1, 8, 32)),
            dict(softmax_scale=0.0),
            ValueError,
            "softmax_scale",
        ),
        (((1, 8, 32), (1, 8, 32), (1, 8, 32)), dict(causal="yes"), TypeError, "causal"),
        (
            ((1, 8, 32), (1, 8, 32), (1, 8, 32)),
            dict(q_segment_ids=np.zeros(7, int)),
            ValueError,
            "segment",
        ),
        (
            ((1, 8, 32), (1, 8, 32), (1, 8, 32)),
            dict(q_segment_ids=np.zeros(8)),
            TypeError,
            "integer",
        ),
    ],
)
def test_bad_input(shapes, kw, exc, words):
    q, k, v = (np.zeros(s, np.float32) for s in shapes)
    with pytest.raises(exc, match=words):
        attention_forward(q, k, v, R.HW_FP4_DIRECT_P, **kw)


def test_bad_recipe_and_dtype():
    q = np.zeros((1, 8, 32), np.float32)
    with pytest.raises(TypeError, match="AttentionRecipe"):
        attention_forward(q, q, q, "hw_fp4_direct_p")
    with pytest.raises(TypeError, match="dtype"):
        attention_forward(q.astype(np.int32), q, q, R.HW_FP4_DIRECT_P)


OTHER_FORMATS = [
    R.AttentionRecipe(
        qk=R.QKFormat.BF16, converter=R.ExactP(), p_format=R.PFormat.BF16, v=R.VFormat.BF16
    ),
    R.AttentionRecipe(
        qk=R.QKFormat.FP8_PER_TENSOR,
        converter=R.ExactP(),
        p_format=R.PFormat.FP8,
        v=R.VFormat.FP8,
        normalization=R.Normalization.MISMATCHED,
    ),
    R.AttentionRecipe(
        qk=R.QKFormat.TOKEN_BLOCK_FP8,
        converter=R.SchraudolphP(scale_log2=8),
        p_format=R.PFormat.FP8,
        v=R.VFormat.TOKEN_BLOCK_FP8,
    ),
    R.AttentionRecipe(
        qk_global=R.QKGlobalScale.PER_TOKEN,
        converter=R.ExactP(),
        exp2=R.Exp2Model(kind=R.Exp2Kind.FA4_POLY),
        v=R.VFormat.MXFP8_TOKENS,
        normalization=R.Normalization.MISMATCHED,
        rescale_threshold=8.0,
    ),
]


def test_other_operand_formats_numpy_jit_and_error():
    q, k, v = _qkv((1, 64, 32), 128, seed=10)
    ref = attention_reference(q, k, v, causal=True).out
    bounds = [2.0**-6, 4 * 2.0**-4, 4 * 2.0**-4 + 0.0615, 0.25 + 0.25]  # RSS-style, see _bound
    for rec, bound in zip(OTHER_FORMATS, bounds):
        want = attention_forward(q, k, v, rec, causal=True)
        assert error_summary(want.out, ref).rel_l2 <= bound, rec
        got = jax.jit(lambda q, k, v, rec=rec: attention_forward(q, k, v, rec, causal=True)[:2])(
            q, k, v
        )
        np.testing.assert_array_equal(_bits(got[0]), _bits(want.out))
        np.testing.assert_array_equal(_bits(got[1]), _bits(want.lse))


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=15)
@given(
    seed=st.integers(0, 2**31 - 1),
    shift=st.integers(-20, 20),
    causal=st.booleans(),
    sq=st.integers(1, 40),
    skv=st.integers(1, 100),
)
def test_power_of_two_v_scaling_is_exact(seed, shift, causal, sq, skv):
    # V in MXFP4 along tokens has power-of-two block scales: V·2^s gives exactly O·2^s
    q, k, v = _qkv((1, sq, 32), skv, seed=seed)
    a = attention_forward(q, k, v, R.HW_FP4_DIRECT_P, causal=causal)
    b = attention_forward(q, k, v * np.float32(2.0**shift), R.HW_FP4_DIRECT_P, causal=causal)
    np.testing.assert_array_equal(_bits(b.out), _bits(a.out * np.float32(2.0**shift)))
    np.testing.assert_array_equal(_bits(b.lse), _bits(a.lse))
    assert not np.isnan(a.out).any()


def test_infinite_float32_inputs_follow_the_nan_row_policy():
    q, k, v = _qkv((1, 16, 32), 64, seed=11)
    q[0, 3, 0] = np.inf  # unquantized route: the scores of row 3 are +-Inf/NaN
    r = attention_forward(q, k, v, R.EXACT_F32)
    assert np.isnan(r.out[0, 3]).all() and np.isnan(r.lse[0, 3])
    assert np.isfinite(np.delete(r.out[0], 3, axis=0)).all()

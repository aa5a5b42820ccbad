"""Forward/backward consistency: the two-key golden case, matched recipes pass, mismatches detected."""

from __future__ import annotations

import numpy as np
import pytest

from fp4sim.attention.backward import softmax_grad
from fp4sim.attention.normalization import normalize
from fp4sim.attention.recipe import Normalization
from fp4sim.formats.codec import decode, encode
from fp4sim.formats.spec import E2M1


def _two_element(normalization):
    """The two-key case: w = [1, 0.4], α = 1, V = [0, 6], dO = 1, d = 1."""
    w = np.array([1.0, 0.4])
    payloads = decode(encode((6 * w).astype(np.float32), E2M1), E2M1).astype(np.float64)
    assert payloads.tolist() == [6.0, 2.0]
    w_rep = payloads / 6  # [1, 1/3]
    v = np.array([0.0, 6.0])
    res = normalize(w, w_rep, v, normalization)
    p = w_rep / res.denominator  # the P̃ the PV product effectively used
    d_out = 1.0
    dp = d_out * v
    delta = np.array([d_out * res.out])  # D = rowsum(dO ∘ O)
    ds = softmax_grad(p[None], dp[None], delta)[0]
    return p, res.out, delta[0], ds


def test_golden_two_element_consistent():
    p, out, delta, ds = _two_element(Normalization.CONSISTENT)
    np.testing.assert_allclose(p, [0.75, 0.25], rtol=1e-15)
    assert out == pytest.approx(1.5, rel=1e-15) and delta == pytest.approx(1.5, rel=1e-15)
    np.testing.assert_allclose(ds, [-1.125, 1.125], rtol=1e-15)
    assert abs(ds.sum()) < 1e-15


def test_golden_two_element_mismatched():
    p, out, delta, ds = _two_element(Normalization.MISMATCHED)
    np.testing.assert_allclose(p, [1 / 1.4, (1 / 3) / 1.4], rtol=1e-15)
    assert out == pytest.approx(10 / 7, rel=1e-15) and delta == pytest.approx(10 / 7, rel=1e-15)
    np.testing.assert_allclose(ds, [-1.020408, 1.088435], atol=5e-7)
    assert ds.sum() == pytest.approx(0.068027, abs=5e-7)
    # the invariant: Σ dS = D·(1 − Σ P̃) when D = Σ P̃ dP
    assert ds.sum() == pytest.approx(delta * (1 - p.sum()), rel=1e-13)


# --- the checker on the emulated training path ---------------------------------------------------
from fp4sim.attention import recipe as R  # noqa: E402
from fp4sim.attention.consistency import Mismatch, check_consistency, with_mismatch  # noqa: E402
from fp4sim.attention.recipe import TRAINING_PRESETS, _route  # noqa: E402


def _inputs(seed=3, n=128, d=64):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((n, d)).astype(np.float32) for _ in range(4))


@pytest.mark.parametrize(
    "name",
    [
        "float32",
        "direct_p_fp8_training",
        "direct_p_fp4_forward",
        "direct_p_affine_fp4",
        "flamia_mxfp8_training",
    ],
)
def test_matched_recipes_pass(name):
    rep = check_consistency(TRAINING_PRESETS[name], *_inputs())
    assert rep.ok, rep


def test_mismatched_normalizer_breaks_only_the_row_sum():
    # cuDNN-like route: D = rowsum(dO ∘ O) still equals Σ P̃ dP, but Σ_j P̃_ij ≠ 1
    rep = check_consistency(TRAINING_PRESETS["cudnn_mxfp8_like"], *_inputs())
    assert rep.p_bitwise and rep.delta_ok and not rep.ds_row_sum_ok, rep


EXPECTED_FAILURES = {
    Mismatch.BACKWARD_TILING: {"p_bitwise", "delta", "ds_row_sum"},
    Mismatch.FORWARD_APPROX_EXP: {"p_bitwise", "delta", "ds_row_sum"},
    Mismatch.D_OUT_REPRESENTATION: {"delta", "ds_row_sum"},
    Mismatch.P_BITS: {"p_bitwise", "delta", "ds_row_sum"},
}


@pytest.mark.parametrize("mismatch", list(Mismatch), ids=lambda m: m.name)
def test_each_deliberate_mismatch_is_detected(mismatch):
    base = TRAINING_PRESETS["direct_p_fp4_forward"]
    causal_ = True
    if mismatch is Mismatch.FORWARD_APPROX_EXP:
        # FA4's polynomial is within 9e-5 of exp2, so it flips only the few codes next to a
        # rounding boundary (about 1 in 2000 live E4M3 codes, fewer in E2M1, where most small
        # weights round to 0): 8-bit P, no mask, to have several of them
        base, causal_ = TRAINING_PRESETS["direct_p_fp8_training"], False
    rep = check_consistency(with_mismatch(base, mismatch), *_inputs(), causal=causal_)
    assert not rep.ok
    assert set(rep.failed) == EXPECTED_FAILURES[mismatch], rep


# every converter family of the forward: the backward rebuilds its P bit for bit
FORWARDS = {
    "hw_fp4_direct_p_mitchell": R.HW_FP4_DIRECT_P_MITCHELL,
    "hao_log_nvfp4": R.HAO_LOG_NVFP4,
    "hao_log_mxfp8": R.HAO_LOG_MXFP8,
    "sage3_two_level": R.SAGE3_TWO_LEVEL,
    "cudnn_fp8_fixed": R.CUDNN_FP8_FIXED,
    "schraudolph_fp8": R.AttentionRecipe(
        converter=R.SchraudolphP(scale_log2=8), p_format=R.PFormat.FP8, v=R.VFormat.FLOAT32
    ),
    "exact_nvfp4_row_anchor": R.AttentionRecipe(
        converter=R.ExactP(), p_format=R.PFormat.NVFP4, block_exponent=R.BlockExponent.ROW_ANCHOR
    ),
    "fa4_poly_exp2": R.HW_FP4_FP8_PV.replace(exp2=R.Exp2Model(kind=R.Exp2Kind.FA4_POLY)),
}


@pytest.mark.parametrize("name", list(FORWARDS))
def test_backward_rebuilds_every_converter_bitwise(name):
    fwd = FORWARDS[name].replace(v=R.VFormat.FLOAT32, block_kv=64, pv_group=64)
    rep = check_consistency(_route(name, fwd), *_inputs(n=128, d=64))
    assert rep.p_bitwise, rep
    assert rep.delta_ok, rep


def test_with_mismatch_bad_arguments():
    base = TRAINING_PRESETS["direct_p_fp8_training"]
    with pytest.raises(TypeError, match="Mismatch"):
        with_mismatch(base, "p_bits")
    with pytest.raises(ValueError, match="MXFP4"):
        with_mismatch(base, Mismatch.P_BITS)  # its forward P is already 8-bit


def test_attn_qat_route_consistent_with_its_own_p():
    # dS from the unquantized p, D from the high-precision output: consistent (Attn-QAT's
    # principle 2) although the forward's normalizer is mismatched
    recipe = TRAINING_PRESETS["attn_qat_nvfp4"]
    rep = check_consistency(recipe, *_inputs())
    assert rep.ok, rep
    # the same route with D from the quantized-P output breaks the D identity
    from fp4sim.attention.backward import DeltaSource

    broken = recipe.replace(name="qat, D from O", delta=DeltaSource.QUANTIZED_D_OUT)
    rep = check_consistency(broken, *_inputs())
    assert not rep.delta_ok and rep.p_bitwise, rep
    with pytest.raises(ValueError, match="D_OUT_REPRESENTATION"):
        with_mismatch(recipe, Mismatch.D_OUT_REPRESENTATION)  # its dO is not quantized


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=12, deadline=None)
@given(
    n=st.integers(1, 80),
    d=st.sampled_from([32, 64]),
    causal_=st.booleans(),
    n_docs=st.integers(1, 4),
    name=st.sampled_from(sorted(TRAINING_PRESETS)),
    seed=st.integers(0, 2**16),
)
def test_property_matched_recipes_rebuild_p_and_keep_the_identities(
    n, d, causal_, n_docs, name, seed
):
    rng = np.random.default_rng(seed)
    q, k, v, do = (rng.standard_normal((n, d)).astype(np.float32) for _ in range(4))
    cuts = (
        np.sort(rng.choice(np.arange(1, n), size=min(n_docs - 1, n - 1), replace=False))
        if n > 1
        else np.array([], int)
    )
    ids = np.zeros(n, np.int32)
    for c in cuts:
        ids[c:] += 1
    recipe = TRAINING_PRESETS[name]
    rep = check_consistency(recipe, q, k, v, do, causal=causal_, segment_ids=ids)
    assert rep.p_bitwise and rep.delta_ok, rep
    if (
        recipe.forward.normalization is not R.Normalization.MISMATCHED
        or recipe.ds_probabilities.name == "HIGH_PRECISION"
    ):
        assert rep.ds_row_sum_ok, rep

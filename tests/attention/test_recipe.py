"""AttentionRecipe: validation, hashability (static jit argument), presets, bad input."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from fp4sim.attention import recipe as R


def test_presets_are_valid_hashable_and_named():
    assert len(set(R.PRESETS.values())) == len(R.PRESETS)  # all distinct
    for name, rec in R.PRESETS.items():
        assert isinstance(rec, R.AttentionRecipe)
        assert hash(rec) == hash(dataclasses.replace(rec))
        assert R.preset_by_name(name.upper()) is rec
    assert R.HW_FP4_DIRECT_P.converter == R.AffineP(a=1.5, b=1.2)
    assert R.HW_FP4_DIRECT_P.p_format is R.PFormat.MXFP4
    assert R.HW_FP4_DIRECT_P.normalization is R.Normalization.CONSISTENT
    assert R.HAO_LOG_NVFP4.normalization is R.Normalization.MISMATCHED
    assert abs(R.MITCHELL_BOUNDARY_SHIFT - 0.071928) < 1e-6


def test_recipe_is_a_static_jit_argument():
    calls = []

    def f(x, rec):
        calls.append(rec)
        return x * rec.block_kv

    g = jax.jit(f, static_argnums=1)
    g(np.float32(1), R.HW_FP4_DIRECT_P)
    g(np.float32(2), R.AttentionRecipe())  # equal recipe: cache hit, no retrace
    assert len(calls) == 1


def test_properties():
    assert R.HW_FP4_DIRECT_P.qk_block == 16 and R.HAO_LOG_MXFP8.qk_block == 32
    assert R.HW_FP4_DIRECT_P.v_block == 32 and R.SAGE3_TWO_LEVEL.v_block == 16
    assert R.PFormat.NVFP4.block == 16 and R.PFormat.FP8.block == 1
    assert R.HW_FP4_DIRECT_P.replace(block_kv=256).block_kv == 256


@pytest.mark.parametrize(
    "changes, exc, words",
    [
        (dict(converter=R.AffineP(), p_format=R.PFormat.NVFP4), ValueError, "cannot produce"),
        (dict(converter=R.LogGroupP(), p_format=R.PFormat.MXFP4), ValueError, "cannot produce"),
        (dict(converter=R.FixedScaleP(), p_format=R.PFormat.MXFP8), ValueError, "cannot produce"),
        (dict(converter="affine"), TypeError, "converter"),
        (dict(qk="nvfp4"), TypeError, "QKFormat"),
        (dict(block_kv=100), ValueError, "block_kv"),
        (dict(fragment=24), ValueError, "fragment"),
        (dict(block_kv=0), ValueError, "block_kv"),
        (dict(block_q=1.5), TypeError, "block_q"),
        (dict(rescale_threshold=-1.0), ValueError, "rescale_threshold"),
        (dict(rescale_threshold=float("nan")), TypeError, "rescale_threshold"),
        (dict(hadamard=1), TypeError, "hadamard"),
        (dict(normalization=R.Normalization.EXACT), ValueError, "FLOAT32"),
        (
            dict(
                converter=R.ExactP(),
                p_format=R.PFormat.FLOAT32,
                normalization=R.Normalization.MISMATCHED,
            ),
            ValueError,
            "MISMATCHED",
        ),
        (dict(qk=R.QKFormat.MXFP8, qk_global=R.QKGlobalScale.PER_TENSOR), ValueError, "qk_global"),
        (dict(exp2="fa4"), TypeError, "Exp2Model"),
    ],
)
def test_invalid_recipes_name_the_field(changes, exc, words):
    with pytest.raises(exc, match=words):
        R.AttentionRecipe(**changes)


def test_converter_and_model_validation():
    with pytest.raises(ValueError, match="power of two"):
        R.FixedScaleP(scale=10.0)
    with pytest.raises(ValueError, match="448"):
        R.AttentionRecipe(
            qk=R.QKFormat.MXFP8,
            converter=R.FixedScaleP(scale=256.0),
            p_format=R.PFormat.FP8,
            v=R.VFormat.MXFP8_TOKENS,
            normalization=R.Normalization.MISMATCHED,
            rescale_threshold=4.0,
        )
    with pytest.raises(ValueError, match="> 0"):
        R.AffineP(a=0.0)
    with pytest.raises(TypeError, match="finite"):
        R.MitchellP(shift=float("inf"))
    with pytest.raises(ValueError, match="even"):
        R.Exp2Model(emulate_freq=9)
    with pytest.raises(ValueError, match="emulate_res"):
        R.Exp2Model(emulate_res=20)
    with pytest.raises(ValueError, match="unknown"):
        R.preset_by_name("fastest")
    with pytest.raises(TypeError):
        R.AttentionRecipe(R.QKFormat.NVFP4)  # keyword-only

"""Causal-safe scaling options: the leak classification and document-aligned scale groups.

The classification is derived from format properties; here it is checked against the published
table (FLAMIA) and against direct observation on the quantized operand alone:
a future row that becomes its group's max must leave every earlier row bitwise identical for
``NONE``, change only elements in the element format's subnormal range for ``SUBNORMAL``.
"""

from __future__ import annotations

import numpy as np
import pytest

from fp4sim.attention import causal, operands
from fp4sim.attention.causal import LeakClass, leak_class
from fp4sim.attention.operands import OperandScaling
from fp4sim.formats.blocks import MXFP8_E4M3, NVFP4, GlobalScale, ScaleRule
from fp4sim.formats.spec import E4M3

EXPECTED = {
    "float32": LeakClass.NONE,
    "E4M3 cast": LeakClass.NONE,
    "per-token pow2 E4M3": LeakClass.NONE,
    "token-block 32xD pow2 E4M3": LeakClass.SUBNORMAL,
    "MXFP8 32 tokens RCEIL": LeakClass.SUBNORMAL,
    "MXFP8 32 tokens OCP floor": LeakClass.LARGE,
    "MXFP4 32 tokens RCEIL": LeakClass.LARGE,
    "NVFP4 16 tokens": LeakClass.LARGE,
    "FP8 per-tensor amax/448": LeakClass.LARGE,
    "per-tensor pow2 E4M3": LeakClass.SUBNORMAL,
}


def test_v_options_classified_as_the_seed_table():
    assert {o.name: leak_class(o) for o in causal.V_OPTIONS} == EXPECTED


@pytest.mark.parametrize(
    "scaling, expected",
    [
        (operands.NVFP4_HEAD_DIM, LeakClass.NONE),
        (operands.NVFP4_HEAD_DIM_PER_TOKEN, LeakClass.NONE),
        (operands.NVFP4_HEAD_DIM_PER_TENSOR, LeakClass.LARGE),
        (operands.MXFP8_HEAD_DIM, LeakClass.NONE),
        (operands.DS_PER_ROW, LeakClass.NONE),
        (operands.DS_SQUARE_RCEIL, LeakClass.SUBNORMAL),
        (operands.DS_SQUARE_FLOOR, LeakClass.LARGE),
        (
            OperandScaling(name="even", fmt=MXFP8_E4M3, axis=-2, rule=ScaleRule.EVEN),
            LeakClass.LARGE,
        ),
    ],
)
def test_other_operands_classified(scaling, expected):
    assert leak_class(scaling) is expected


def _raise_future_row(scaling, seed=0, n=64, d=16, target=45, gain=64.0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)).astype(np.float32)
    x1 = x.copy()
    x1[target] *= np.float32(gain)
    return x, operands.fake_quantize(x, scaling), operands.fake_quantize(x1, scaling), target


@pytest.mark.parametrize("scaling", causal.V_OPTIONS, ids=lambda s: s.name)
def test_classification_observed_on_the_operand(scaling):
    x, a, b, target = _raise_future_row(scaling)
    changed = a[:target] != b[:target]
    cls = leak_class(scaling)
    if cls is LeakClass.NONE:
        assert not changed.any()
    elif cls is LeakClass.SUBNORMAL:
        # only elements whose quantized value sits in E4M3's subnormal range of the new scale
        # (below 2^-6 of the scale unit, i.e. below 2^-14.8 of the group max) may change
        amax = np.max(np.abs(b))
        assert np.all(np.abs(a[:target][changed]) < 2.0**-6 * amax / 448 * 2)
    else:
        assert changed.any(), "a LARGE-class scaling should re-round some past element here"


def test_segmented_quantization_keeps_documents_apart():
    rng = np.random.default_rng(3)
    ids = np.repeat(np.arange(4), [10, 30, 4, 20])
    x = rng.standard_normal((64, 8)).astype(np.float32)
    for scaling in (
        operands.MXFP8_TOKENS_FLOOR,
        operands.NVFP4_TOKENS,
        operands.FP8_PER_TENSOR_AMAX,
        operands.TOKEN_BLOCK_POW2,
    ):
        base = causal.fake_quantize_segmented(x, scaling, ids)
        for doc in range(4):
            x1 = x.copy()
            x1[ids == doc] *= np.float32(37.0)
            other = ids != doc
            after = causal.fake_quantize_segmented(x1, scaling, ids)
            assert np.array_equal(base[other], after[other]), (scaling.name, doc)
        # one document alone, placed at the same rows, quantizes the same
        alone = np.where((ids == 1)[:, None], x, 0).astype(np.float32)
        np.testing.assert_array_equal(
            operands.fake_quantize(alone, scaling)[ids == 1], base[ids == 1]
        )


def test_segmented_quantization_jit_matches_numpy():
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(4)
    ids = np.repeat(np.arange(3), [7, 33, 24])
    x = rng.standard_normal((64, 8)).astype(np.float32)
    f = jax.jit(causal.fake_quantize_segmented, static_argnums=1)
    got = f(jnp.asarray(x), operands.MXFP8_TOKENS_RCEIL, jnp.asarray(ids))
    np.testing.assert_array_equal(
        np.asarray(got), causal.fake_quantize_segmented(x, operands.MXFP8_TOKENS_RCEIL, ids)
    )


def test_bad_scaling_arguments_named():
    with pytest.raises(ValueError, match="axis"):
        OperandScaling(name="x", fmt=MXFP8_E4M3, axis=0)
    with pytest.raises(TypeError, match="fmt"):
        OperandScaling(name="x", fmt=E4M3)
    with pytest.raises(ValueError, match="CONSTANT"):
        OperandScaling(name="x", fmt=NVFP4.replace(global_scale=GlobalScale.CONSTANT))
    with pytest.raises(TypeError, match="geometry"):
        OperandScaling(name="x", fmt=MXFP8_E4M3, geometry="square")
    with pytest.raises(ValueError, match="rule"):
        OperandScaling(name="x", fmt=NVFP4, rule=ScaleRule.FLOOR)

"""``attention_forward(..., accumulation=ForwardAccumulation.TCGEN05)``: the forward whose S and
P·V are Blackwell's block-scaled ``tcgen05.mma`` (what fp4sim's sm_100a kernels issue).

Checked against an independent path: the block-scaled matmul model of
:func:`fp4sim.formats.matmul.scaled_matmul` on the emulator's own quantized operands (scores ->
``t`` -> :func:`convert_tile` rebuilds the P codes; one key tile's numerator is one P·V
product); NumPy and jit give the same bits; the default accumulation is untouched (the golden
vectors check that); the head-dim zero padding the MXFP8 kernel uses is bit-neutral.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from fp4sim.attention import forward as fw
from fp4sim.attention import recipe as r
from fp4sim.attention.converters import convert_tile
from fp4sim.formats import blocks
from fp4sim.formats.matmul import Accumulation, BLayout, scaled_matmul
from fp4sim.formats.mma import MMA_MODELS, MmaKind, mma_dot
from fp4sim.formats.spec import E4M3, UE8M0

TC = r.ForwardAccumulation.TCGEN05
RECIPES = {
    "flamia_mxfp8": r.FLAMIA_MXFP8,
    "mxfp8_tokens_v": r.FLAMIA_MXFP8.replace(v=r.VFormat.MXFP8_TOKENS),
    "direct_p": r.HW_FP4_DIRECT_P,
}


def _qkv(rng, sq=64, skv=128, d=64, h=2, scale=1.0):
    q = (rng.standard_normal((h, sq, d)) * scale).astype(np.float32)
    k = rng.standard_normal((h, skv, d)).astype(np.float32)
    v = rng.standard_normal((h, skv, d)).astype(np.float32)
    return q, k, v


@pytest.mark.parametrize("name", list(RECIPES))
def test_p_codes_rebuilt_from_scaled_matmul_scores(name):
    recipe = RECIPES[name]
    q, k, v = _qkv(np.random.default_rng(1), scale=3.0)
    res = fw.attention_forward(q, k, v, recipe, accumulation=TC, return_intermediates=True)
    it = res.intermediates
    z = scaled_matmul(it.q.quantized, it.k.quantized, accumulation=Accumulation.TCGEN05)
    u = fw.log2_scores(z, it.score_scale, np.ones(z.shape, bool))
    t = u - it.anchors[..., 0][..., None]  # one key tile: its anchor is the row max of u
    p = convert_tile(recipe, t.astype(np.float32))
    assert np.array_equal(p.codes, it.p_codes)
    if recipe.qk is r.QKFormat.MXFP8:  # E4M3 sums truncate at 25 bits: SEQUENTIAL differs
        seq = fw.attention_forward(q, k, v, recipe, return_intermediates=True).intermediates
        assert not np.array_equal(seq.numerator.view(np.uint32), it.numerator.view(np.uint32))


@pytest.mark.parametrize("name", ["flamia_mxfp8", "mxfp8_tokens_v"])
def test_one_tile_numerator_is_one_scaled_pv_product(name):
    recipe = RECIPES[name]
    q, k, v = _qkv(np.random.default_rng(2))
    res = fw.attention_forward(q, k, v, recipe, accumulation=TC, return_intermediates=True)
    it = res.intermediates
    pq = blocks.QuantizedArray(
        codes=np.asarray(it.p_codes, np.uint8),
        scales=np.asarray(it.p_scales, np.uint8),
        global_scale=None,
        format=blocks.MXFP8_E4M3,
    )
    want = scaled_matmul(pq, it.v.quantized, accumulation=Accumulation.TCGEN05, b_layout=BLayout.KN)
    assert np.array_equal(it.numerator.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize(
    ("name", "causal"),
    [
        ("flamia_mxfp8", False),
        ("flamia_mxfp8", True),
        ("mxfp8_tokens_v", False),
        ("direct_p", True),
    ],
)
def test_numpy_and_jit_give_the_same_bits(name, causal):
    recipe = RECIPES[name]
    q, k, v = _qkv(np.random.default_rng(3), sq=128, skv=256)
    a = fw.attention_forward(q, k, v, recipe, causal=causal, accumulation=TC)
    b = jax.jit(
        lambda q, k, v: fw.attention_forward(q, k, v, recipe, causal=causal, accumulation=TC)
    )(q, k, v)
    for x, y in ((a.out, b.out), (a.lse, b.lse)):
        assert np.array_equal(np.asarray(x).view(np.uint32), np.asarray(y).view(np.uint32))


def test_zero_padding_the_head_dim_is_bit_neutral():
    """The MXFP8 sm_100a kernel pads D = 64 to 128 (zero codes, unit scales) for QK."""
    rng = np.random.default_rng(4)
    model = MMA_MODELS[MmaKind.MXF8F6F4]
    a = rng.standard_normal((64, 1, 64)).astype(np.float32) * 8
    b = rng.standard_normal((1, 96, 64)).astype(np.float32) * 8
    a, b = (x.astype(E4M3.np_dtype).astype(np.float32) for x in (a, b))
    sa = np.exp2(rng.integers(-6, 7, (64, 1, 2))).astype(np.float32)
    sb = np.exp2(rng.integers(-6, 7, (1, 96, 2))).astype(np.float32)
    kw = dict(model=model, a_format=E4M3, b_format=E4M3, scale_format=UE8M0, block=32)
    short = mma_dot(a, b, a_scale=sa, b_scale=sb, **kw)
    pad = lambda x, n: np.concatenate([x, np.full(x.shape[:-1] + (n,), 0, np.float32)], -1)  # noqa: E731
    one = lambda x, n: np.concatenate([x, np.ones(x.shape[:-1] + (n,), np.float32)], -1)  # noqa: E731
    long = mma_dot(pad(a, 64), pad(b, 64), a_scale=one(sa, 2), b_scale=one(sb, 2), **kw)
    assert np.array_equal(short.view(np.uint32), long.view(np.uint32))


def test_errors():
    q, k, v = _qkv(np.random.default_rng(5))
    with pytest.raises(ValueError, match="accumulation=TCGEN05"):
        fw.attention_forward(q, k, v, r.HAO_LOG_NVFP4, accumulation=TC)  # NVFP4 P
    with pytest.raises(ValueError, match="qk=BF16"):
        fw.attention_forward(q, k, v, r.FLAMIA_MXFP8.replace(qk=r.QKFormat.BF16), accumulation=TC)
    with pytest.raises(TypeError, match="ForwardAccumulation"):
        fw.attention_forward(q, k, v, r.FLAMIA_MXFP8, accumulation="tcgen05")

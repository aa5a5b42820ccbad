"""Tests of the Hopper Direct-P FP4 attention kernel (fp4sim.kernels.attention_directp_mgpu).

The oracle is the emulator itself (:func:`fp4sim.attention.forward.attention_forward` with the
same recipe): on inputs whose scores are exact in float32 (Q and K already on the E2M1 grid with a
±6 in every 16-element block, so the NVFP4 scale is 1 and every partial sum is a multiple of
1/4), the kernel's block exponents k_B, running maxima and E2M1 payloads must equal the
emulator's bit for bit; O and LSE differ only by float32 summation order and exp2 rounding.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4sim.attention import forward as fw
from fp4sim.attention import recipe as rc
from fp4sim.formats.codec import decode
from fp4sim.formats.spec import E2M1
from fp4sim.kernels import attention_directp_mgpu as dp
from fp4sim.kernels import harness

U32 = 2.0**-24
_E2 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])


def _e2m1_grid_data(rng, shape):
    x = _E2[rng.integers(0, 8, shape)] * rng.choice([-1.0, 1.0], shape)
    x = x.reshape(*shape[:-1], shape[-1] // 16, 16)
    x[..., 0] = 6.0 * rng.choice([-1.0, 1.0], x.shape[:-1])  # block amax 6: NVFP4 scale 1
    return x.reshape(shape).astype(np.float32)


def _inputs(seed, b, t, hq, hkv, d):
    rng = np.random.default_rng(seed)
    return (
        _e2m1_grid_data(rng, (b, t, hq, d)),
        _e2m1_grid_data(rng, (b, t, hkv, d)),
        rng.standard_normal((b, t, hkv, d)).astype(np.float32),
    )


def _emulate(q, k, v, cfg, scale):
    g = q.shape[2] // k.shape[2]
    rep = lambda x: np.repeat(x, g, axis=2).transpose(0, 2, 1, 3)  # noqa: E731
    return fw.attention_forward(
        q.transpose(0, 2, 1, 3),
        rep(k),
        rep(v),
        cfg.recipe,
        causal=cfg.causal,
        softmax_scale=scale,
        return_intermediates=True,
    )


def _check(out, res, cfg, *, o_rtol):
    o, lse, dbg = out
    it = res.intermediates
    j, bkv = cfg.debug_step, cfg.block_kv
    nb = bkv // 32
    t_len = np.asarray(dbg.m).shape[-1]
    r0 = (np.arange(t_len) // cfg.block_q) * cfg.block_q  # first row of each warpgroup tile
    steps = -(-(r0 + cfg.block_q) // bkv) if cfg.causal else np.full(t_len, 10**9)
    reached = np.broadcast_to(steps > j, np.asarray(dbg.m).shape)  # rows that reach tile j
    kk = np.asarray(dbg.k).transpose(0, 1, 3, 2)
    ck = it.p_k[..., j * nb : (j + 1) * nb]
    np.testing.assert_array_equal(kk[reached], ck[reached])
    np.testing.assert_array_equal(np.asarray(dbg.m)[reached], it.anchors[..., j][reached])
    codes = decode(it.p_codes[..., j * bkv : (j + 1) * bkv], E2M1)
    kel = np.repeat(ck, 32, axis=-1)
    exact = (kel >= -23) & reached[..., None]  # float16 holds α_B·q exactly down to 2^-24
    got = np.asarray(dbg.p).astype(np.float64) * np.exp2(-kel.astype(np.float64))
    np.testing.assert_array_equal(got[exact], codes[exact])
    assert (codes[exact] != 0).mean() > 0.05
    ro = res.out.transpose(0, 2, 1, 3)
    assert np.abs(np.asarray(o) - ro).max() <= o_rtol * np.abs(ro).max()
    lse_ref = res.lse / math.log(2)
    assert np.abs(np.asarray(lse) - lse_ref).max() <= 1e-4 * max(1.0, np.abs(lse_ref).max())


@pytest.mark.parametrize(
    "recipe,causal",
    [(rc.HW_FP4_DIRECT_P, False), (rc.HW_FP4_DIRECT_P_MITCHELL, True)],
    ids=["affine", "mitchell-causal"],
)
def test_interpret_matches_emulator_bitwise(recipe, causal):
    q, k, v = _inputs(1 + causal, 1, 128, 1, 1, 64)
    cfg = dp.DirectPConfig(
        recipe=recipe.replace(block_kv=64), causal=causal, debug_step=1, out_type=dp.OutType.FLOAT32
    )
    scale = 0.08
    out = harness.interpret(
        lambda: dp.attention_directp(
            jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), softmax_scale=scale, config=cfg
        )
    )
    # f32 sums of <= 128 products in another order, and the rescale's exp2: a few ulps each.
    _check(out, _emulate(q, k, v, cfg, scale), cfg, o_rtol=8 * 128 * U32)


def test_interpret_tail_length_matches_emulator():
    """T = S = 100 (a masked tail tile, padded query rows, a partial V token block)."""
    q, k, v = _inputs(5, 1, 100, 1, 1, 64)
    cfg = dp.DirectPConfig(
        recipe=rc.HW_FP4_DIRECT_P.replace(block_kv=64), debug_step=1, out_type=dp.OutType.FLOAT32
    )
    scale = 0.03  # flatter weights: more non-zero codes in the tail tile
    out = harness.interpret(
        lambda: dp.attention_directp(
            jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), softmax_scale=scale, config=cfg
        )
    )
    assert out[0].shape == (1, 100, 1, 64) and out[2].m.shape == (1, 1, 100)
    _check(out, _emulate(q, k, v, cfg, scale), cfg, o_rtol=8 * 128 * U32)


@pytest.mark.parametrize(
    "cfg",
    dp.SHIPPED_CONFIGS,
    ids=lambda c: f"{type(c.recipe.converter).__name__}-{c.causal}-{c.debug_step}",
)
@pytest.mark.parametrize(
    "shape", [(2, 4096, 16, 16, 128), (1, 1024, 8, 2, 64)], ids=["D128", "D64-GQA4"]
)
def test_cross_lowers_for_sm90a(cfg, shape):
    b, t, hq, hkv, d = shape
    f16, S = jnp.float16, jax.ShapeDtypeStruct
    avals = dp.DirectPOperands(
        S((b, t, hq, d), f16), S((b, t, hkv, d), f16), S((b, hkv, d, t), f16)
    )
    text = harness.cross_lower(
        lambda *a: dp.attention_directp_prepared(dp.DirectPOperands(*a), config=cfg), *avals
    )
    assert "mosaic_gpu" in text


def test_config_validation():
    with pytest.raises(ValueError, match="converter"):
        dp.DirectPConfig(recipe=rc.HAO_LOG_MXFP8)
    with pytest.raises(ValueError, match="normalization"):
        dp.DirectPConfig(
            recipe=rc.HW_FP4_DIRECT_P.replace(normalization=rc.Normalization.MISMATCHED)
        )
    with pytest.raises(TypeError, match="recipe"):
        dp.DirectPConfig(recipe="hw_fp4_direct_p")
    with pytest.raises(ValueError, match="block_q"):
        dp.DirectPConfig(block_q=32)
    q = jnp.zeros((1, 128, 1, 64), jnp.float16)
    ops = dp.DirectPOperands(q, q, jnp.zeros((1, 1, 64, 128), jnp.float16))
    with pytest.raises(ValueError, match="debug_step"):
        dp.attention_directp_prepared(ops, config=dp.DirectPConfig(debug_step=1))
    with pytest.raises(TypeError, match="float16"):
        dp.attention_directp_prepared(ops._replace(q=q.astype(jnp.float32)))


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_matches_emulator_bitwise(causal):
    q, k, v = _inputs(11 + causal, 1, 512, 2, 1, 128)
    cfg = dp.DirectPConfig(causal=causal, debug_step=2)  # float16 O (2^-11 relative rounding)
    scale = 0.05
    out = dp.attention_directp(
        jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), softmax_scale=scale, config=cfg
    )
    # On the H200 f16 wgmma sums are correctly rounded in >= 98 % of outputs (fp4sim.kernels.wgmma_probe).
    _check(out, _emulate(q, k, v, cfg, scale), cfg, o_rtol=2.0**-10)


@pytest.mark.gpu
def test_gpu_float_inputs_error_matches_emulator():
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 1024, 2, 128)).astype(np.float32) for _ in range(3))
    cfg = dp.DirectPConfig()
    o, _ = dp.attention_directp(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), config=cfg)
    res = fw.attention_forward(
        q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), cfg.recipe
    )
    ro = res.out.transpose(0, 2, 1, 3)
    # Scores are no longer exact; a P code may flip where a score sits on a boundary, so compare
    # the two outputs' distance with the emulator's own error scale (rel-L2 of FP4 P and V).
    diff = np.linalg.norm(np.asarray(o) - ro) / np.linalg.norm(ro)
    print(f"Direct-P kernel vs emulator rel-L2 on Gaussian inputs: {diff:.3e}")
    assert diff <= 2e-2

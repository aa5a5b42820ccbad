"""The Blackwell (sm_100a) attention bodies: every shipped configuration cross-lowers for sm_100a
and the PTX instructions of its lowering assemble with ``ptxas -arch=sm_100a``; the operand
layouts and the P-scale store permutation are checked on the CPU; ``@pytest.mark.gpu`` runs the
kernels against the emulator on a Blackwell GPU (none has run them).

What cannot be checked here: GPU interpret mode cannot run a block-scaled ``tcgen05_mma``,
and the whole kernel's PTX needs the CUDA plugin's compiler (a GPU machine); ptxas sees the
``tcgen05`` instructions, TMEM allocation and barrier set-up the lowering writes as PTX.
"""

from __future__ import annotations

import re

import jax.numpy as jnp
import numpy as np
import pytest

from fp4sim.attention import forward as fw
from fp4sim.attention import recipe as r
from fp4sim.formats import blocks, layouts
from fp4sim.formats.codec import decode
from fp4sim.formats.spec import E2M1, E4M3
from fp4sim.kernels import ptx_check
from fp4sim.kernels.attention_sm100 import (
    BlackwellAttentionConfig,
    BlackwellRoute,
    attention_sm100,
    kernel_avals,
    kernel_function,
    prepare_operands,
    shipped_cases,
)
from fp4sim.kernels.harness import Arch, device_arch

needs_ptxas = pytest.mark.skipif(
    ptx_check.find_ptxas() is None,
    reason="needs ptxas (pip install nvidia-cuda-nvcc: the dev extra)",
)
# QK and PV instruction kinds per route (Mosaic GPU issues E2M1 with UE8M0 per 32 as
# mxf4nvf4 with scale_vec::2X: the arithmetic of kind::mxf4)
KINDS = {
    BlackwellRoute.MXFP8: {"kind::mxf8f6f4.block_scale.scale_vec::1X"},
    BlackwellRoute.DIRECT_P_FP4: {
        "kind::mxf4nvf4.block_scale.scale_vec::4X",
        "kind::mxf4nvf4.block_scale.scale_vec::2X",
    },
}


def _case_id(case):
    cfg, d = case
    rec = "mitchell" if isinstance(cfg.recipe.converter, r.MitchellP) else cfg.recipe.v.name
    return f"{cfg.route.name}-{'causal' if cfg.causal else 'full'}-d{d}-{rec}"


def test_shipped_cases_listed():
    got = [(c.route.name, c.causal, d) for c, d in shipped_cases()]
    assert got == [
        ("MXFP8", False, 128),
        ("MXFP8", True, 128),
        ("MXFP8", False, 64),
        ("MXFP8", True, 64),
        ("MXFP8", False, 128),
        ("DIRECT_P_FP4", False, 128),
        ("DIRECT_P_FP4", True, 128),
        ("DIRECT_P_FP4", False, 64),
        ("DIRECT_P_FP4", False, 128),
    ]


@needs_ptxas
@pytest.mark.parametrize("case", shipped_cases(), ids=_case_id)
def test_cross_lowers_and_assembles_for_sm100a(case):
    cfg, d = case
    t = 512
    av = kernel_avals(cfg, 1, t, 2, 1, d)
    fn = kernel_function(tuple(av[0].shape), tuple(av[1].shape), d, t - 40, 0.125, cfg)
    snippets = ptx_check.kernel_snippets(fn, *av, arch=Arch.SM100A)
    kinds = {
        re.search(r"kind::\S+", s.asm).group(0) for s in snippets if s.mnemonic == "tcgen05.mma"
    }
    assert kinds == KINDS[cfg.route], kinds
    for needed in (
        "tcgen05.cp",
        "tcgen05.ld",
        "tcgen05.wait::ld",
        "tcgen05.alloc",
        # the TMEM reuse protocol: loads signal before the next MMA into the region
        "tcgen05.fence::before_thread_sync",
        "tcgen05.fence::after_thread_sync",
    ):
        assert any(s.mnemonic == needed for s in snippets), needed
    assert any(s.mnemonic == "tcgen05.dealloc" for s in snippets)
    res = ptx_check.assemble(snippets, Arch.SM100A)
    assert res.ok, res.log
    # the check can fail: Hopper's ptxas target rejects the same instructions
    bad = ptx_check.assemble(snippets, Arch.SM90A)
    assert not bad.ok and "tcgen05" in bad.log


@pytest.mark.parametrize(
    ("route", "causal", "d", "t", "s"),
    [
        (BlackwellRoute.MXFP8, True, 64, 300, 300),
        (BlackwellRoute.DIRECT_P_FP4, False, 128, 200, 330),
    ],
    ids=["mxfp8-causal-d64-T300", "directp-d128-T200-S330"],
)
def test_whole_entry_point_cross_lowers_for_sm100a(route, causal, d, t, s):
    """``attention_sm100`` end to end (quantizers, layouts, padding, the kernel, the crop):
    the operands ``prepare_operands`` makes are the ones the kernel takes."""
    import jax

    from fp4sim.kernels.harness import cross_lower

    cfg = BlackwellAttentionConfig(route=route, causal=causal)
    sds = jax.ShapeDtypeStruct
    text = cross_lower(
        lambda q, k, v: attention_sm100(q, k, v, config=cfg),
        sds((1, t, 2, d), jnp.float32),
        sds((1, s, 1, d), jnp.float32),
        sds((1, s, 1, d), jnp.float32),
        arch=Arch.SM100A,
    )
    assert "mosaic_gpu" in text


def test_p_scale_word_index_is_the_tmem_copy_layout():
    """The kernel stores row r's four E8M0 codes (block 0 in the low byte) as the 32-bit word
    ``(r % 32)·4 + r // 32`` of the P scale tile (attention_common._store_p_scale_words): that
    is :func:`fp4sim.formats.layouts.to_mosaic_tmem`'s layout, which the TMEM copy reads."""
    codes = np.random.default_rng(0).integers(0, 255, (128, 4)).astype(np.uint8)
    words = layouts.to_mosaic_tmem(codes).reshape(-1).view("<u4")
    rows = np.arange(128)
    packed = codes.astype(np.uint32) << (8 * np.arange(4, dtype=np.uint32))
    assert np.array_equal(words[(rows % 32) * 4 + rows // 32], packed.sum(axis=1))


def _p_scale_store_kernel(layout):
    """A one-warpgroup kernel storing row r's codes ``(4r + b) & 0xFF`` (b = 0..3) with the
    attention body's P-scale store, in ``layout``'s row layout; returns the SMEM tile."""
    import jax
    from jax.experimental.pallas import mosaic_gpu as plgpu

    from fp4sim.kernels.attention_common import _store_p_scale_words

    def body(o_ref, smem):
        rows = plgpu.broadcasted_iota(jnp.int32, (128, 8), 0, layout=layout).max(axis=1)
        word = (rows * 4) & 0xFF
        for b in range(1, 4):
            word = word | (((rows * 4 + b) & 0xFF) << (8 * b))
        _store_p_scale_words(word, smem, layout.reduce(1))
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem, o_ref)
        plgpu.wait_smem_to_gmem(0)

    return plgpu.kernel(
        body,
        out_type=jax.ShapeDtypeStruct((1, 1, 32, 16), jnp.uint8),
        scratch_types=[plgpu.SMEM((1, 1, 32, 16), jnp.uint8)],
    )


def _p_scale_want():
    codes = (4 * np.arange(128)[:, None] + np.arange(4)[None, :]) & 0xFF
    return layouts.to_mosaic_tmem(codes.astype(np.uint8))


@pytest.mark.parametrize("arch", [Arch.SM90A, Arch.SM100A], ids=lambda a: a.name)
def test_p_scale_store_kernel_lowers(arch):
    from jax.experimental.pallas import mosaic_gpu as plgpu

    from fp4sim.kernels.harness import cross_lower

    layout = plgpu.Layout.TCGEN05 if arch is Arch.SM100A else plgpu.Layout.WGMMA
    text = cross_lower(lambda: _p_scale_store_kernel(layout)(), arch=arch)
    assert "mosaic_gpu" in text


@pytest.mark.gpu
@pytest.mark.skipif((device_arch() or (0, 0))[0] not in (9, 10), reason="needs sm_90 or sm_100")
def test_p_scale_store_on_gpu():
    """The permuted per-thread store on the hardware (the same code on Hopper, where it runs
    with the WGMMA row layout, as on Blackwell with the TCGEN05 one)."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    blackwell = device_arch()[0] == 10
    layout = plgpu.Layout.TCGEN05 if blackwell else plgpu.Layout.WGMMA
    got = np.asarray(_p_scale_store_kernel(layout)())
    assert np.array_equal(got, _p_scale_want())


@pytest.mark.parametrize("route", list(BlackwellRoute))
@pytest.mark.parametrize("d", [64, 128])
def test_prepare_operands_reinterprets_the_emulator_quantizers(route, d):
    """Codes and scales are the emulator quantizers' (reinterpreted, padded: zero codes, scale
    code 127 in padded head-dim blocks), the scales in the layout the TMEM copy reads."""
    cfg = BlackwellAttentionConfig(route=route)
    rng = np.random.default_rng(1)
    b, t, h = 1, 200, 2
    q, k, v = (rng.standard_normal((b, t, h, d)).astype(np.float32) for _ in range(3))
    ops = prepare_operands(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), cfg)
    dqk = 128 if route is BlackwellRoute.MXFP8 else d
    assert ops.q.shape == (b, 256, h, dqk) and ops.k.shape == (b, 256, h, dqk)
    assert ops.vt.shape == (b, h, d, 256)
    fp4 = route is BlackwellRoute.DIRECT_P_FP4
    elem = E2M1 if fp4 else E4M3

    def values(x):  # the kernel operand's element values
        return np.asarray(x.astype(jnp.float32))

    qa = fw.quantize_qk(np.swapaxes(q, 1, 2), cfg.recipe).quantized
    want_q = np.zeros((b, h, 256, dqk), np.float32)
    want_q[:, :, :t, :d] = decode(np.asarray(qa.unpacked_codes()), elem)
    assert np.array_equal(np.swapaxes(values(ops.q), 1, 2), want_q)
    ncol = qa.scales.shape[-1]
    want_s = np.full((b, h, 256, dqk // qa.format.block_size), 127, np.uint8)
    want_s[:, :, :, :ncol] = 0
    want_s[:, :, :t, :ncol] = np.asarray(qa.scales)
    assert np.array_equal(np.asarray(ops.q_scales.view(jnp.uint8)), layouts.to_mosaic_tmem(want_s))

    vb = np.pad(np.swapaxes(v, 1, 2), ((0, 0), (0, 0), (0, 24), (0, 0)))  # to whole 32-blocks
    va = fw.quantize_v(vb, cfg.recipe).quantized
    want_v = np.zeros((b, h, d, 256), np.float32)
    want_v[..., :224] = np.swapaxes(decode(np.asarray(va.unpacked_codes()), elem), 2, 3)
    assert np.array_equal(values(ops.vt), want_v)
    e = np.broadcast_to(blocks.scale_exponents(va), (b, h, 7, d))
    want_vs = np.full((b, h, d, 8), 127, np.uint8)
    want_vs[..., :7] = np.swapaxes(np.clip(e + 127, 0, 255), 2, 3)
    assert np.array_equal(np.asarray(ops.v_scales.view(jnp.uint8)), layouts.to_mosaic_tmem(want_vs))


@pytest.mark.parametrize(
    "recipe",
    [r.FLAMIA_MXFP8, r.HW_FP4_DIRECT_P, r.HW_FP4_DIRECT_P_MITCHELL],
    ids=lambda x: x.qk.name + "-" + type(x.converter).__name__,
)
@pytest.mark.parametrize("causal", [False, True])
def test_tile_math_matches_the_emulator_bitwise(recipe, causal):
    """The kernels' per-tile numerics (the same functions the kernel traces), run on plain
    arrays under jit on the CPU from the tcgen05 scores of one 128 x 128 tile: P codes, P scale
    codes, the running max and the tile normalizer equal the emulator's
    (``accumulation=TCGEN05``) bit for bit."""
    import jax

    from fp4sim.formats.matmul import Accumulation, scaled_matmul
    from fp4sim.kernels.attention_common import StepContext
    from fp4sim.kernels.attention_sm100 import tile_math

    route = BlackwellRoute.MXFP8 if recipe.qk is r.QKFormat.MXFP8 else BlackwellRoute.DIRECT_P_FP4
    cfg = BlackwellAttentionConfig(route=route, recipe=recipe)
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((1, 128, 128)).astype(np.float32) for _ in range(3))
    q *= 3.0
    it = fw.attention_forward(
        q,
        k,
        v,
        recipe,
        causal=causal,
        accumulation=fw.ForwardAccumulation.TCGEN05,
        return_intermediates=True,
    ).intermediates
    z = scaled_matmul(it.q.quantized, it.k.quantized, accumulation=Accumulation.TCGEN05)[0]
    math = tile_math(cfg, 1 / np.sqrt(128))

    def step(s):
        iota = jnp.broadcast_to(jnp.arange(128, dtype=jnp.int32)[None, :], (128, 128))
        rows = jnp.arange(128, dtype=jnp.int32)[:, None]
        visible = (rows >= iota) if causal else None
        ctx = StepContext(s, None, None, visible, None, 0, lambda: iota)
        res = math.step(ctx, jnp.full((128,), -jnp.inf, jnp.float32), ())
        return res.p.astype(jnp.float32), jnp.stack(res.p_scales, 1), res.m, res.l_tile

    p, ps, m, l_tile = (np.asarray(x) for x in jax.jit(step)(jnp.asarray(z)))
    elem = E2M1 if cfg.fp4 else E4M3
    assert np.array_equal(p, decode(np.asarray(it.p_codes[0]), elem))
    assert np.array_equal(ps, np.asarray(it.p_scales[0]).astype(np.int32))
    assert np.array_equal(m.view(np.uint32), np.asarray(it.anchors[0, :, 0]).view(np.uint32))
    assert np.array_equal(l_tile.view(np.uint32), np.asarray(it.normalizer[0]).view(np.uint32))


def test_div6_rn_is_correctly_rounded_on_every_payload_sum():
    import jax

    from fp4sim.kernels.attention_sm100 import div6_rn

    x = (np.arange(385) / 2).astype(np.float32)  # every block sum of 32 E2M1 payloads
    got = np.asarray(jax.jit(div6_rn)(jnp.asarray(x)))
    want = (x.astype(np.float64) / 6).astype(np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_config_validation():
    with pytest.raises(ValueError, match="qk must be MXFP8"):
        BlackwellAttentionConfig(route=BlackwellRoute.MXFP8, recipe=r.HW_FP4_DIRECT_P)
    with pytest.raises(ValueError, match="v must be MXFP4_TOKENS"):
        BlackwellAttentionConfig(route=BlackwellRoute.DIRECT_P_FP4, recipe=r.HW_FP4_FP8_PV)
    with pytest.raises(ValueError, match="block_kv must be 128"):
        BlackwellAttentionConfig(recipe=r.FLAMIA_MXFP8.replace(block_kv=64))
    with pytest.raises(TypeError, match="BlackwellRoute"):
        BlackwellAttentionConfig(route="mxfp8")
    with pytest.raises(ValueError, match="max_concurrent_steps"):
        BlackwellAttentionConfig(max_concurrent_steps=1)
    q = jnp.zeros((1, 256, 2, 128), jnp.float32)
    with pytest.raises(ValueError, match="causal"):
        attention_sm100(q, q[:, :128], q[:, :128], config=BlackwellAttentionConfig(causal=True))


@pytest.mark.gpu
@pytest.mark.skipif((device_arch() or (0, 0))[0] != 10, reason="needs a Blackwell GPU (sm_100a)")
@pytest.mark.parametrize("case", shipped_cases(), ids=_case_id)
def test_on_blackwell_matches_the_tcgen05_emulator(case):
    from fp4sim.kernels.checks import blackwell_attention_error

    cfg, d = case
    err, lse_err = blackwell_attention_error(cfg, d, t=512)
    assert err <= 1e-4 and lse_err <= 1e-4, (err, lse_err)

"""The Blackwell block-scaled matmul (sm_100a): every shipped configuration cross-lowers for
sm_100a and the PTX instructions it emits assemble with ``ptxas -arch=sm_100a``; the operand
preparation is checked on the CPU; ``@pytest.mark.gpu`` runs the kernel against the emulator
on a Blackwell GPU (none has run it yet).

What cannot be checked here: GPU interpret mode cannot run a block-scaled ``tcgen05_mma``, and
the whole kernel's PTX needs the CUDA plugin's compiler (a GPU machine); ptxas sees the
``tcgen05`` instructions, TMEM allocation and barrier set-up the lowering writes as PTX.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from fp4sim.formats import layouts
from fp4sim.formats.blocks import MXFP4, MXFP8, MXFP8_E5M2, NVFP4, quantize
from fp4sim.formats.matmul import Accumulation, scaled_matmul
from fp4sim.kernels import ptx_check
from fp4sim.kernels.blackwell_matmul_mgpu import (
    BlackwellFormat,
    BlackwellMatmulConfig,
    avals,
    blackwell_scaled_matmul,
    build_kernel,
    kernel_operands,
    shipped_configs,
)
from fp4sim.kernels.harness import Arch, device_arch

SHAPE = (256, 256, 512)
KIND = {
    BlackwellFormat.MXFP8: "kind::mxf8f6f4.block_scale",
    # Mosaic GPU issues E2M1 with UE8M0 per 32 as mxf4nvf4 with scale_vec::2X: the same
    # arithmetic as kind::mxf4 (one model in MMA-Sim and in fp4sim.formats.mma)
    BlackwellFormat.MXFP4: "kind::mxf4nvf4.block_scale.scale_vec::2X",
    BlackwellFormat.NVFP4: "kind::mxf4nvf4.block_scale.scale_vec::4X",
}
needs_ptxas = pytest.mark.skipif(
    ptx_check.find_ptxas() is None,
    reason="needs ptxas (pip install nvidia-cuda-nvcc: the dev extra)",
)


def test_shipped_configs_listed():
    names = [(c.fmt.name, c.tile_n) for c in shipped_configs()]
    assert names == [
        ("MXFP8", 128),
        ("MXFP8", 256),
        ("MXFP4", 128),
        ("MXFP4", 256),
        ("NVFP4", 128),
        ("NVFP4", 256),
    ]


@needs_ptxas
@pytest.mark.parametrize("cfg", shipped_configs(), ids=lambda c: f"{c.fmt.name}-n{c.tile_n}")
def test_cross_lowers_and_assembles_for_sm100a(cfg):
    m, n, k = SHAPE
    snippets = ptx_check.kernel_snippets(
        build_kernel(cfg, m, n, k), *avals(cfg, m, n, k), arch=Arch.SM100A
    )
    mma = [s.asm for s in snippets if s.mnemonic == "tcgen05.mma"]
    assert mma and all(KIND[cfg.fmt] in a for a in mma), mma[:1]
    for needed in ("tcgen05.cp", "tcgen05.ld", "tcgen05.alloc", "tcgen05.dealloc"):
        assert any(s.mnemonic == needed for s in snippets), needed
    res = ptx_check.assemble(snippets, Arch.SM100A)
    assert res.ok, res.log
    # the check can fail: Hopper's ptxas target rejects the same instructions
    bad = ptx_check.assemble(snippets, Arch.SM90A)
    assert not bad.ok and "tcgen05" in bad.log


@pytest.mark.parametrize("fmt", [MXFP8, MXFP4, NVFP4])
def test_kernel_operands_are_reinterpretations(fmt):
    rng = np.random.default_rng(0)
    q = quantize(rng.standard_normal((128, 256)).astype(np.float32), fmt)
    x, s = kernel_operands(q)
    assert x.shape == (128, 256)
    bits = np.asarray(x.view(jnp.uint8) if x.dtype.itemsize == 1 else x)
    if fmt is not MXFP8:  # float4 arrays: compare the decoded values
        assert np.array_equal(np.asarray(x.astype(jnp.float32)), np.asarray(q.values()))
    else:
        assert np.array_equal(bits, q.codes)
    want = layouts.to_mosaic_tmem(q.scales)
    assert np.array_equal(np.asarray(s.view(jnp.uint8)), want)


def test_errors():
    q8 = quantize(np.ones((128, 256), np.float32), MXFP8)
    q4 = quantize(np.ones((128, 256), np.float32), MXFP4)
    with pytest.raises(ValueError, match="same format"):
        blackwell_scaled_matmul(q8, q4)
    with pytest.raises(ValueError, match="not a format of the Blackwell kernel"):
        blackwell_scaled_matmul(*(quantize(np.ones((128, 256), np.float32), MXFP8_E5M2),) * 2)
    with pytest.raises(ValueError, match="multiple of"):
        build_kernel(BlackwellMatmulConfig(fmt=BlackwellFormat.MXFP8), 128, 128, 96)
    with pytest.raises(ValueError, match="tile_n"):
        BlackwellMatmulConfig(fmt=BlackwellFormat.MXFP8, tile_n=64)
    with pytest.raises(TypeError, match="QuantizedArray"):
        blackwell_scaled_matmul(np.ones((128, 256)), q8)


@pytest.mark.gpu
@pytest.mark.skipif((device_arch() or (0, 0))[0] < 10, reason="needs a Blackwell GPU (sm_100a)")
@pytest.mark.parametrize("fmt", [MXFP8, MXFP4, NVFP4])
def test_on_blackwell_equals_emulator(fmt):
    rng = np.random.default_rng(1)
    a = quantize(rng.standard_normal((256, 512)).astype(np.float32), fmt)
    b = quantize(rng.standard_normal((256, 512)).astype(np.float32), fmt)
    got = np.asarray(blackwell_scaled_matmul(a, b))
    want = scaled_matmul(a, b, accumulation=Accumulation.TCGEN05)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))

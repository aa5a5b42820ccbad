"""The quantize kernels, which ``python -m fp4sim validate`` also runs on Blackwell, cross-lower
for sm_100a and the PTX their lowering writes assembles with ``ptxas -arch=sm_100a`` (they have
only run on the H200)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest

from fp4sim.formats import blocks
from fp4sim.kernels import ptx_check
from fp4sim.kernels.harness import Arch
from fp4sim.kernels.quantize_mgpu import gpu_quantize


@pytest.mark.skipif(
    ptx_check.find_ptxas() is None,
    reason="needs ptxas (pip install nvidia-cuda-nvcc: the dev extra)",
)
@pytest.mark.parametrize(
    "fmt", [blocks.MXFP8_E4M3, blocks.MXFP8_E5M2, blocks.MXFP4, blocks.NVFP4], ids=lambda f: f.name
)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=lambda d: d.__name__)
def test_quantize_kernels_lower_and_assemble_for_sm100a(fmt, dtype):
    fn = functools.partial(gpu_quantize, fmt=fmt)
    snippets = ptx_check.kernel_snippets(
        fn, jax.ShapeDtypeStruct((512, 512), dtype), arch=Arch.SM100A
    )
    assert snippets
    res = ptx_check.assemble(snippets, Arch.SM100A)
    assert res.ok, res.log

"""Test-side helper: lower a jax function for ``cuda`` on a host without a GPU, as an H200.

Pallas Triton kernels lower to Triton MLIR at jax lowering time, which asks jax for the GPU's
compute capability; here that question is answered with the H200's (sm_90) for the duration of
one lowering, so that unsupported operations in a kernel fail on the CPU-only host too (the
Triton compilation to PTX itself happens on the GPU). Skips when jax's internals have moved.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest


def cuda_text(fn, *shapes):
    """``fn`` lowered for cuda with float32 arguments of ``shapes``: the StableHLO text."""
    reg = pytest.importorskip("jax._src.pallas.triton.pallas_call_registration")
    gi = pytest.importorskip("jax._src.pallas.triton.gpu_info")
    if not hasattr(reg, "gpu_info_lib") or not hasattr(gi, "get_gpu_info_from_version"):
        pytest.skip("jax's Pallas Triton internals changed: no GPU-less lowering")

    class _H200:
        @staticmethod
        def get_gpu_info():
            return gi.get_gpu_info_from_version(gi.GpuVersion.H200)

    old = reg.gpu_info_lib
    reg.gpu_info_lib = _H200
    try:
        structs = [jax.ShapeDtypeStruct(s, np.float32) for s in shapes]
        return jax.jit(fn).trace(*structs).lower(lowering_platforms=("cuda",)).as_text()
    finally:
        reg.gpu_info_lib = old

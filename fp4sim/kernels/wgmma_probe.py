"""A measurement kernel: one Hopper FP8 ``wgmma`` (E4M3 x E4M3, float32 accumulator) per call.

This module owns the probe that measures what Hopper's FP8 tensor-core accumulation returns, so
:class:`fp4sim.formats.matmul.WgmmaFp8Model` can be fitted to hardware. ``fp8_wgmma(a, b)``
computes ``a (M, K) @ b (N, K).T`` with ``a``/``b`` float8_e4m3fn, both K-major in SMEM, M = 64,
N a multiple of 8 up to 256, K a multiple of 32 up to 512 (one SMEM tile, one ``wgmma`` chain).
``f16_wgmma`` is the same product through the 16-bit ``wgmma`` (float32-exact on the measured
H200) for comparison. Hardware only: interpret mode cannot run FP8 wgmma.
"""

from __future__ import annotations

from typing import Any

__all__ = ["fp8_wgmma", "f16_wgmma"]


def _kernel(m: int, n: int, k: int, dtype: Any) -> Any:
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    from fp4sim.kernels.harness import smem_transforms

    if m != 64 or n % 8 or not 8 <= n <= 256 or k % 32 or not 32 <= k <= 512:
        raise ValueError(
            f"shape (M={m}, N={n}, K={k}) unsupported: need M=64, N a multiple of 8 "
            f"in 8..256, K a multiple of 32 in 32..512"
        )

    def body(a_g, b_g, o_g, a_s, b_s, o_s, bar):
        plgpu.copy_gmem_to_smem(a_g, a_s, bar.at[0])
        plgpu.copy_gmem_to_smem(b_g, b_s, bar.at[1])
        plgpu.barrier_wait(bar.at[0])
        plgpu.barrier_wait(bar.at[1])

        def mm(acc):
            plgpu.wgmma(acc, a_s, b_s.T)
            return acc[...]

        o_s[...] = pl.run_scoped(mm, plgpu.ACC((m, n), jnp.float32))
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_s, o_g)
        plgpu.wait_smem_to_gmem(0)

    return plgpu.kernel(
        body,
        out_type=jax.ShapeDtypeStruct((m, n), jnp.float32),
        scratch_types=[
            plgpu.SMEM((m, k), dtype, transforms=smem_transforms(dtype, k)),
            plgpu.SMEM((n, k), dtype, transforms=smem_transforms(dtype, k)),
            plgpu.SMEM((m, n), jnp.float32),
            plgpu.Barrier(num_barriers=2),
        ],
    )


def fp8_wgmma(a: Any, b: Any) -> Any:
    """``a @ b.T`` through the E4M3 ``wgmma`` (float32 accumulator)."""
    import jax.numpy as jnp

    a = jnp.asarray(a, jnp.float8_e4m3fn)
    b = jnp.asarray(b, jnp.float8_e4m3fn)
    return _kernel(a.shape[0], b.shape[0], a.shape[1], jnp.float8_e4m3fn)(a, b)


def f16_wgmma(a: Any, b: Any) -> Any:
    """``a @ b.T`` through the float16 ``wgmma`` (float32 accumulator)."""
    import jax.numpy as jnp

    a = jnp.asarray(a, jnp.float16)
    b = jnp.asarray(b, jnp.float16)
    return _kernel(a.shape[0], b.shape[0], a.shape[1], jnp.float16)(a, b)

"""A block-scaled matmul for Blackwell (sm_100a) in Pallas Mosaic GPU: MXFP8, MXFP4, NVFP4.

This module owns ``blackwell_scaled_matmul(a, b)``: ``a (M, K)`` and ``b (N, K)``
:class:`~fp4sim.formats.blocks.QuantizedArray` operands (the layouts fp4sim's quantizers write,
:func:`fp4sim.formats.blocks.quantize` or :func:`fp4sim.kernels.quantize_mgpu.gpu_quantize`:
element codes one per byte or FP4 packed two per byte, plain block scales ``(rows, K/block)``)
give the float32 ``a @ b.T`` of one ``tcgen05.mma ... block_scale`` chain per output tile:

* the element codes are reinterpreted (no conversion) as ``float8_e4m3fn`` / ``float4_e2m1fn``
  and the scale codes as ``float8_e8m0fnu`` / ``float8_e4m3fn``; the scales are put in the
  layout ``plgpu.async_copy_scales_to_tmem`` copies into TMEM
  (:func:`fp4sim.formats.layouts.to_mosaic_tmem`, the 128x4 swizzle);
* each CTA owns one ``128 x tile_n`` output tile: per K step of ``tile_k`` elements it TMA-copies
  A, B and their scale tiles into SMEM, copies the scales to TMEM
  (``plgpu.async_copy_scales_to_tmem``) and issues ``plgpu.tcgen05_mma(acc, a, b.T,
  a_scale=, b_scale=)`` into a float32 TMEM accumulator; the epilogue loads TMEM, stores through
  SMEM with TMA and (NVFP4) multiplies the two FP32 global factors in float32;
* the hardware's accumulation is what :class:`~fp4sim.formats.matmul.Accumulation` ``TCGEN05``
  models (MMA-Sim's tcgen05 models), so ``scaled_matmul(a, b, accumulation=TCGEN05)`` defines
  the bits this kernel should return.

Checked without a Blackwell GPU: every configuration of :func:`shipped_configs` is cross-lowered
for sm_100a (:func:`fp4sim.kernels.harness.cross_lower`) and the PTX instructions its lowering
emits are assembled by ``ptxas -arch=sm_100a`` (:mod:`fp4sim.kernels.ptx_check`). GPU
interpret mode cannot run a block-scaled ``tcgen05_mma``, and no Blackwell GPU has run it:
``python -m fp4sim validate`` on a B200 compares it with the emulator.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from fp4sim.formats.blocks import (
    MXFP4,
    MXFP8_E4M3,
    NVFP4,
    NVFP4_SINGLE,
    BlockFormat,
    QuantizedArray,
)

__all__ = [
    "BlackwellFormat",
    "BlackwellMatmulConfig",
    "shipped_configs",
    "build_kernel",
    "blackwell_scaled_matmul",
    "kernel_operands",
    "avals",
]


class BlackwellFormat(enum.Enum):
    """The operand formats of the kernel (the ``tcgen05.mma`` kind each one uses)."""

    MXFP8 = "mxfp8"  # E4M3, UE8M0 per 32: kind::mxf8f6f4.block_scale
    MXFP4 = "mxfp4"  # E2M1, UE8M0 per 32: kind::mxf4nvf4.block_scale.scale_vec::2X (Mosaic's
    # choice; the arithmetic of kind::mxf4.block_scale)
    NVFP4 = "nvfp4"  # E2M1, UE4M3 per 16: kind::mxf4nvf4.block_scale (+ FP32 global factors)

    @property
    def block(self) -> int:
        return 16 if self is BlackwellFormat.NVFP4 else 32

    @property
    def fp4(self) -> bool:
        return self is not BlackwellFormat.MXFP8


_OF_BLOCK_FORMAT = {
    MXFP8_E4M3.name: BlackwellFormat.MXFP8,
    MXFP4.name: BlackwellFormat.MXFP4,
    NVFP4.name: BlackwellFormat.NVFP4,
    NVFP4_SINGLE.name: BlackwellFormat.NVFP4,
}


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class BlackwellMatmulConfig:
    """``fmt``; the output tile ``128 x tile_n`` of one CTA; ``tile_k`` elements per K step
    (128 bytes of a row: 128 for MXFP8, 256 for FP4)."""

    fmt: BlackwellFormat
    tile_n: int = 128

    def __post_init__(self) -> None:
        if not isinstance(self.fmt, BlackwellFormat):
            raise TypeError(f"BlackwellMatmulConfig.fmt={self.fmt!r} must be a BlackwellFormat")
        if self.tile_n not in (128, 256):
            raise ValueError(f"BlackwellMatmulConfig.tile_n={self.tile_n!r}; allowed: 128, 256")

    @property
    def tile_m(self) -> int:
        return 128

    @property
    def tile_k(self) -> int:
        return 256 if self.fmt.fp4 else 128

    def check_shape(self, m: int, n: int, k: int) -> None:
        for name, v, t in (("M", m, self.tile_m), ("N", n, self.tile_n), ("K", k, self.tile_k)):
            if v % t or v == 0:
                raise ValueError(f"{name}={v} must be a positive multiple of {t} for {self}")


def shipped_configs() -> tuple[BlackwellMatmulConfig, ...]:
    """Every configuration fp4sim ships (each cross-lowered and assembled for sm_100a in CI)."""
    return tuple(
        BlackwellMatmulConfig(fmt=f, tile_n=t) for f in BlackwellFormat for t in (128, 256)
    )


def _dtypes(fmt: BlackwellFormat) -> tuple[Any, Any]:
    import jax.numpy as jnp

    elem = jnp.float4_e2m1fn if fmt.fp4 else jnp.float8_e4m3fn
    scale = jnp.float8_e4m3fn if fmt is BlackwellFormat.NVFP4 else jnp.float8_e8m0fnu
    return elem, scale


def build_kernel(cfg: BlackwellMatmulConfig, m: int, n: int, k: int) -> Any:
    """The ``plgpu.kernel`` for ``a (M, K)``, ``b (N, K)`` (element dtype), scales in the
    :func:`~fp4sim.formats.layouts.to_mosaic_tmem` layout ``(M/128, K/block/4, 32, 16)`` and
    ``(N/128, ...)``; returns float32 ``(M, N)``."""
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    from fp4sim.kernels.harness import smem_transforms

    if not isinstance(cfg, BlackwellMatmulConfig):
        raise TypeError(f"cfg={cfg!r} must be a BlackwellMatmulConfig")
    cfg.check_shape(m, n, k)
    elem, scale = _dtypes(cfg.fmt)
    tm, tn, tk = cfg.tile_m, cfg.tile_n, cfg.tile_k
    ks = tk // cfg.fmt.block // 4  # scale columns of one K step, in 4-column tiles
    k_iters = k // tk

    def body(
        a_g, b_g, sa_g, sb_g, o_g, a_s, b_s, sa_s, sb_s, o_s, sa_t, sb_t, acc_t, tma_bar, mma_bar
    ):
        mi = lax.axis_index("m")
        ni = lax.axis_index("n")

        def step(ki, carry):
            plgpu.copy_gmem_to_smem(a_g.at[pl.ds(mi * tm, tm), pl.ds(ki * tk, tk)], a_s, tma_bar)
            plgpu.copy_gmem_to_smem(b_g.at[pl.ds(ni * tn, tn), pl.ds(ki * tk, tk)], b_s, tma_bar)
            plgpu.copy_gmem_to_smem(sa_g.at[pl.ds(mi, 1), pl.ds(ki * ks, ks)], sa_s, tma_bar)
            plgpu.copy_gmem_to_smem(
                sb_g.at[pl.ds(ni * (tn // 128), tn // 128), pl.ds(ki * ks, ks)], sb_s, tma_bar
            )
            plgpu.barrier_wait(tma_bar)
            # issued from the same thread as the MMA: ordered ahead of it, no barrier needed
            plgpu.async_copy_scales_to_tmem(sa_s, sa_t)
            plgpu.async_copy_scales_to_tmem(sb_s, sb_t)
            plgpu.tcgen05_mma(
                acc_t,
                a_s,
                b_s.transpose((1, 0)),
                mma_bar,
                a_scale=sa_t,
                b_scale=sb_t,
                accumulate=ki > 0,
            )
            plgpu.barrier_wait(mma_bar)  # the MMA has read the SMEM tiles
            return carry

        lax.fori_loop(0, k_iters, step, 0)
        o_s[...] = plgpu.async_load_tmem(acc_t)
        plgpu.wait_load_tmem()
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_s, o_g.at[pl.ds(mi * tm, tm), pl.ds(ni * tn, tn)])
        plgpu.wait_smem_to_gmem(0)

    return plgpu.kernel(
        body,
        out_type=jax.ShapeDtypeStruct((m, n), jnp.float32),
        grid=(m // tm, n // tn),
        grid_names=("m", "n"),
        scratch_types=[
            plgpu.SMEM((tm, tk), elem, transforms=smem_transforms(elem, tk)),
            plgpu.SMEM((tn, tk), elem, transforms=smem_transforms(elem, tk)),
            plgpu.SMEM((1, ks, 32, 16), scale),
            plgpu.SMEM((tn // 128, ks, 32, 16), scale),
            plgpu.SMEM((tm, tn), jnp.float32),
            plgpu.TMEM((tm, tk // cfg.fmt.block), scale, layout=plgpu.TMEMLayout.SCALES_LAYOUT),
            plgpu.TMEM((tn, tk // cfg.fmt.block), scale, layout=plgpu.TMEMLayout.SCALES_LAYOUT),
            plgpu.TMEM((tm, tn), jnp.float32),
            plgpu.Barrier(num_arrivals=4),
            plgpu.Barrier(orders_tensor_core=True),
        ],
    )


def _format_of(q: QuantizedArray, name: str) -> BlackwellFormat:
    if not isinstance(q, QuantizedArray):
        raise TypeError(f"{name}={q!r} must be a QuantizedArray")
    fmt: BlockFormat = q.format
    got = _OF_BLOCK_FORMAT.get(fmt.name)
    want = {
        BlackwellFormat.MXFP8: MXFP8_E4M3,
        BlackwellFormat.MXFP4: MXFP4,
        BlackwellFormat.NVFP4: NVFP4,
    }.get(got)
    if want is None or (fmt.elem, fmt.scale, fmt.block_size) != (
        want.elem,
        want.scale,
        want.block_size,
    ):
        raise ValueError(
            f"{name}.format={fmt.name} is not a format of the Blackwell kernel; "
            f"allowed: {sorted(_OF_BLOCK_FORMAT)}"
        )
    if q.ndim != 2 or q.axis not in (-1, 1) or q.geometry.name != "BLOCK":
        raise ValueError(
            f"{name} must be a 2-D operand blocked along its last axis (K); got "
            f"shape {q.shape}, axis {q.axis}, {q.geometry.name}"
        )
    return got


def kernel_operands(q: QuantizedArray) -> tuple[Any, Any]:
    """(elements as float8_e4m3fn / float4_e2m1fn (rows, K), scales in the Mosaic TMEM layout)
    of a quantized operand: reinterpretations and the 128x4 swizzle only."""
    import jax.numpy as jnp
    from jax import lax

    from fp4sim.formats import layouts

    fmt = _format_of(q, "q")
    elem, scale = _dtypes(fmt)
    codes = jnp.asarray(q.unpacked_codes())
    if fmt.fp4:
        x = lax.bitcast_convert_type(codes.astype(jnp.uint4), elem)
    else:
        x = lax.bitcast_convert_type(codes, elem)
    s = lax.bitcast_convert_type(jnp.asarray(layouts.to_mosaic_tmem(jnp.asarray(q.scales))), scale)
    return x, s


def blackwell_scaled_matmul(
    a: QuantizedArray, b: QuantizedArray, *, config: BlackwellMatmulConfig | None = None
) -> Any:
    """float32 ``a @ b.T`` on a Blackwell GPU (sm_100a) through ``tcgen05.mma ... block_scale``;
    ``a (M, K)``, ``b (N, K)`` of the same format (MXFP8 E4M3, MXFP4, NVFP4), M and N multiples
    of 128, K of the configuration's ``tile_k``. The FP32 global factors of NVFP4 multiply the
    result in float32 (``(acc · g_a) · g_b``, as the emulator does)."""
    import jax.numpy as jnp

    fa, fb = _format_of(a, "a"), _format_of(b, "b")
    if fa is not fb:
        raise ValueError(f"a ({fa.name}) and b ({fb.name}) must have the same format")
    cfg = config if config is not None else BlackwellMatmulConfig(fmt=fa)
    if cfg.fmt is not fa:
        raise ValueError(f"config.fmt={cfg.fmt.name} but the operands are {fa.name}")
    (m, k), (n, kb) = a.shape, b.shape
    if k != kb:
        raise ValueError(f"a has K={k} but b has K={kb}")
    ax, asc = kernel_operands(a)
    bx, bsc = kernel_operands(b)
    out = build_kernel(cfg, m, n, k)(ax, bx, asc, bsc)
    for q in (a, b):
        if q.global_scale is not None:
            out = out * jnp.asarray(q.global_scale, jnp.float32).reshape(-1)[0]
    return out


def avals(cfg: BlackwellMatmulConfig, m: int, n: int, k: int) -> tuple[Any, ...]:
    """The ``jax.ShapeDtypeStruct`` operands of :func:`build_kernel` (for cross-lowering)."""
    import jax

    elem, scale = _dtypes(cfg.fmt)
    cols = k // cfg.fmt.block
    return (
        jax.ShapeDtypeStruct((m, k), elem),
        jax.ShapeDtypeStruct((n, k), elem),
        jax.ShapeDtypeStruct((m // 128, cols // 4, 32, 16), scale),
        jax.ShapeDtypeStruct((n // 128, cols // 4, 32, 16), scale),
    )

"""Block-quantization kernels (Pallas Mosaic GPU, Hopper sm_90a): float in, codes + scales out.

This module owns the GPU implementation of :func:`fp4sim.formats.blocks.quantize` for the
formats a kernel needs at full memory bandwidth. Its results are the emulator's, bit for bit,
in the emulator's layouts (a :class:`~fp4sim.formats.blocks.QuantizedArray`), including NaN,
Inf, zero and subnormal inputs; ``tests/kernels/test_quantize_mgpu.py`` checks that in GPU
interpret mode on the CPU and at 8192x8192 on the H200.

What the kernels do
===================
The input is read as 32-bit *words*, never as floats: a bfloat16/float16 tensor is viewed
(free, in XLA) as uint32 words holding an (even, odd) element pair, a float32 tensor as one
element per word. The tensor is then seen as a matrix whose rows are scale blocks
(``BLOCK`` geometry: ``block_size`` consecutive elements of the last axis form one row of
``block_size/2`` pair words). A 1-D grid of CTAs takes ``tiles_per_cta`` tiles of
``block_rows`` rows each. Per tile:

1. the rows are loaded into registers in a *row layout* (:func:`_row_layout`): ``lanes``
   consecutive threads share one row, each holding consecutive words as vectors of
   ``vector_words`` words (16 or 32 bytes), so consecutive lanes read consecutive memory; with
   ``lanes == 1`` a thread may own ``rows_per_thread`` consecutive rows. ``Transfer.DIRECT``
   (the default) loads straight from GMEM with vector loads and no SMEM, barriers or TMA; the
   many resident CTAs keep the loads in flight (with ``tiles_per_cta > 1`` the next tile's
   loads are issued before this tile is converted). ``Transfer.TMA`` copies tiles into a ring
   of ``stages`` SMEM slots first;
2. each row is reduced to its block max-abs: inside a thread when ``lanes == 1`` (plus one or
   two shuffles otherwise); on the hardware FLOAT path as ``max.NaN.f32`` over ``|x|``, on the
   INTEGER path as an integer max over ``bits & 0x7FFFFFFF`` (both exact and NaN-aware);
3. the scale code is derived per row with the emulator's rule;
4. both elements of every word are converted and the two codes packed into one uint16 (FP8)
   or one byte (FP4, even element in the low nibble);
5. codes and scales are stored (DIRECT: straight to GMEM; TMA: through SMEM with TMA stores,
   FP4 output rows of 8 or 16 bytes regrouped into ``tma_row_bytes``-wide TMA rows).

The defaults (:func:`_default_tiling`) are the fastest measured on the H200. From bfloat16
input every format uses ``lanes=1`` (a thread owns whole blocks, so the per-block scale
arithmetic runs once per block instead of once per sharing thread) in 256-row tiles, MXFP8
as two 32-byte vectors per 64-byte block row, NVFP4 as two consecutive blocks of 32-byte
vectors per thread (16 contiguous code bytes, written as two 8-byte stores) with four tiles
per CTA; FP8 from float16 input keeps ``lanes=4`` and 128-row tiles (fully coalesced
16-byte loads).

Where the time goes (H200, bfloat16, 8192 x 8192; SASS of the NVFP4 kernel read with
``MOSAIC_GPU_DUMP_PTX`` + ptxas/cuobjdump): data movement alone (``Variant.MOVE_ONLY``) runs
at the copy bandwidth (0.99 of it), while the conversion is bound by Hopper's integer/logic
pipe (LOP3, SHF, FMNMX, SEL, PRMT: half the float rate). With the packed-byte assembly by
multiply-adds (:func:`_fp4_codes_float`) the NVFP4 kernel has about 15.5 SASS instructions
per element, 7 of them on that pipe (3 FMNMX, 2.75 LOP3; it had 16.5 and 10), and runs at
0.87 of the copy bandwidth (46.0 us; 53 us before). Instructions per element are therefore
what the element code below economises.

``TOKEN_BLOCK`` geometry (32 tokens x the whole head dimension share one power-of-two scale)
uses a second body: each CTA takes ``token_blocks`` such (32, D) blocks, reduces each with a
full warpgroup reduction and converts it with the same element code.

Exactness on every backend
==========================
Mosaic GPU's in-register float ops are IEEE on the GPU, while GPU interpret mode runs them on
XLA:CPU, which flushes subnormals (FTZ/DAZ). Scale codes therefore only use float arithmetic
whose operands and results are normal: the normalised significand of the block max
(subnormals normalised by an exact int->float conversion) times the normalised ``fl(1/M)``
(or the NVFP4 factor), exponents handled as integers (on the hardware FLOAT path the NVFP4
product ``amax·k`` is one IEEE multiply). Element codes have two implementations
(:class:`ElementPath`): ``INTEGER`` scales by exponent arithmetic on the bits, decides FP4 codes
against per-block thresholds ``t·2^k`` (the E2M1 round-to-nearest-even decision points) and
never lets a float op see a subnormal, so it is exact in interpret mode too; ``FLOAT`` (the
hardware default) multiplies once in float32 and converts with ``cvt.rn.satfinite`` (FP8) or
:func:`e2m1_magnitude_float` (FP4: ``fl(a + M) - M`` with ``M = 2^22·max(2^floor(log2 a), 1)``
rounds to E2M1's spacing, ties to even, and ``·2^-126`` turns the value into its code), exact
only where float ops keep subnormals, i.e. on the GPU and in NumPy, where the tests check it
over every bfloat16 pattern. Interpret mode uses ``INTEGER``; both paths are checked bitwise
against the emulator (interpret mode here, both at 8192x8192 on the H200). NaN codes are
patched in by integer selects (the hardware's NaN is canonical, the emulator keeps the sign).

No float division runs in a kernel: Mosaic lowers ``1/x`` to the approximate
``rcp.approx.f32``. NVFP4's per-block encode factor ``fl(1/fl(s·g))`` is instead
``R[j]·2^-e`` for the scale ``s = s_j·2^e`` (``s_j`` one of UE4M3's eight significands), with
the eight ``R[j] = fl(1/fl(s_j·g))`` divided exactly by the emulator's own division outside the
kernel (:data:`NUM_PARAMS` kernel scalars) -- exact whenever every product is a normal float32
(the ``g >= 2^-117`` condition below).

Supported configurations (anything else raises ``ValueError`` before a kernel is built)
=====================================================================================
* formats ``MXFP8_E4M3``, ``MXFP8_E5M2``, ``MXFP4`` (scale rules RCEIL, FLOOR, CEIL, EVEN;
  ``NonFinite.SATFINITE`` or ``NAN``), ``NVFP4`` / ``NVFP4_SINGLE`` (``NEAREST`` UE4M3 scales,
  TransformerEngine order of operations, FP32 factor ``PER_TENSOR``, ``CONSTANT`` scalar or
  none, ``min_scale`` 0);
* the default element :class:`~fp4sim.formats.spec.Policy` (RNE, saturate, NaN kept, signed
  zero kept) and ``Arithmetic.TRANSFORMER_ENGINE``;
* ``Geometry.BLOCK`` along the last axis, or ``Geometry.TOKEN_BLOCK`` along axis -2 for the MX
  formats (D = last axis, 16 <= D <= 256, a multiple of 16);
* bfloat16, float16 or float32 input. FP4 codes are packed in the kernel for 16-bit inputs;
  for float32 the kernel writes one code per byte and XLA packs them.
* the number of scale blocks must be a multiple of 64 (BLOCK) or of ``token_blocks``.

NVFP4 exactness holds whenever the FP32 decode factor ``g`` is at least 2^-117 (tensor amax at
least ~2^-105.6 with the per-tensor factor): then every product the kernel forms is a normal
float32. Below that the emulator rounds ``s·g`` to a float32 subnormal, which the kernel does not
model.

Public names
============
``QuantKernelConfig``  frozen, hashable: ``fmt``, ``geometry``, ``in_dtype``, ``block_rows``
                       (scale blocks per tile), ``tiles_per_cta``, ``lanes``, ``transfer``,
                       ``stages``, ``tma_row_bytes``, ``vector_words``,
                       ``rows_per_thread``, ``token_blocks``/``head_dim``
                       (TOKEN_BLOCK), ``element_path``, ``variant``. Tiling fields left None
                       get the measured defaults.
``ElementPath``        INTEGER / FLOAT (see above); ``Variant``: FULL / MOVE_ONLY (a timing
                       diagnostic: loads, reduction and stores without the conversion math);
                       ``Transfer``: DIRECT / TMA.
``gpu_quantize(x, fmt, *, axis=-1, geometry=Geometry.BLOCK, global_scale=None,
               global_encode_scale=None, pack=None, config=None) -> QuantizedArray``
                       (``pack`` defaults to True for FP4, False otherwise; ``config`` a
                       ``QuantKernelConfig``, e.g. ``QuantKernelConfig.for_array(x, fmt,
                       block_rows=64)``, by default the measured best)
``e2m1_magnitude_float(y)``  the FLOAT path's E2M1 rounding (any array namespace).
``check_supported(fmt, geometry, dtype)``  the validation ``gpu_quantize`` does first.
``build_kernel(config, num_rows)``  the kernel callable ``(words, params) -> (codes, scales)``
                       on uint32 words and ``NUM_PARAMS`` uint32 scalars, for cross-lowering
                       and timing without the XLA wrapper.
``shipped_configs()``  every configuration the benchmarks run (cross-lowered in CI).
``swizzled_scales(q, layout=ScaleLayout.SWIZZLED_128X4)``  the scales in an MMA layout, by the
                       emulator's :func:`fp4sim.formats.layouts.to_layout` (an XLA gather over the
                       1/16 or 1/32-sized scale array; not fused into the kernel).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
from typing import Any

import jax
import ml_dtypes
import numpy as np

from fp4sim.formats.blocks import (
    MXFP4,
    MXFP8_E4M3,
    MXFP8_E5M2,
    NVFP4,
    NVFP4_SINGLE,
    Arithmetic,
    BlockFormat,
    Geometry,
    GlobalScale,
    NonFinite,
    QuantizedArray,
    ScaleRule,
)
from fp4sim.formats.spec import DEFAULT_POLICY, E2M1, E4M3, UE4M3
from fp4sim.kernels.harness import interpreting

__all__ = [
    "QuantKernelConfig",
    "ElementPath",
    "Variant",
    "Transfer",
    "gpu_quantize",
    "check_supported",
    "build_kernel",
    "shipped_configs",
    "swizzled_scales",
    "INPUT_DTYPES",
    "NUM_PARAMS",
    "e2m1_magnitude_float",
    "e2m1_code_bits_float",
    "nv_params",
    "input_words",
]

INPUT_DTYPES = (np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16), np.dtype(np.float32))
_U = np.uint32
_I = np.int32
_F32_INF = 0x7F800000

# E2M1 round-to-nearest-even decision points: code magnitude = number of points passed;
# ties go to the even code, so 0.25, 1.25, 2.5, 5 are passed only when exceeded ("gt") and
# 0.75, 1.75, 3.5 already when reached ("ge").
_E2M1_POINTS = (
    (0x3E800000, True),
    (0x3F400000, False),
    (0x3FA00000, True),
    (0x3FE00000, False),
    (0x40200000, True),
    (0x40600000, False),
    (0x40A00000, True),
)


# --- configuration ----------------------------------------------------------------------------
class ElementPath(enum.Enum):
    """How element codes are computed inside the kernel (scale codes are always FTZ-proof).

    ``INTEGER``: the input is scaled by exponent arithmetic on its bits and FP4 codes are decided
    against per-block thresholds; no float operation sees a subnormal, so XLA:CPU's FTZ/DAZ in
    GPU interpret mode cannot change a code. ``FLOAT``: one IEEE float32 multiply by the
    (power-of-two or NVFP4) factor, then ``cvt.rn.satfinite`` (FP8) or a round-to-nearest-even
    bit trick (FP4); exact on the GPU, whose float ops do not flush subnormals, but not on
    XLA:CPU. The default (``None`` in :class:`QuantKernelConfig`) is ``FLOAT`` on hardware and
    ``INTEGER`` in interpret mode; both are checked bitwise against the emulator.
    """

    INTEGER = "integer"
    FLOAT = "float"


class Transfer(enum.Enum):
    """How a BLOCK kernel moves data. ``TMA``: tiles are copied GMEM -> SMEM by the tensor memory
    accelerator through a ring of ``stages`` slots, loaded into registers, and the codes go back
    through SMEM with TMA stores. ``DIRECT``: every thread loads its rows from GMEM into registers
    with 16-byte vector loads and stores its codes straight to GMEM (no SMEM, no barriers; the
    many resident CTAs keep the loads in flight)."""

    TMA = "tma"
    DIRECT = "direct"


class Variant(enum.Enum):
    """``FULL`` quantizes; ``MOVE_ONLY`` (a diagnostic, never a result) keeps the loads, the block
    max reduction and the stores but writes the low bits of the input instead of codes: the
    kernel's data-movement floor, to say where time goes."""

    FULL = "full"
    MOVE_ONLY = "move_only"


def _fmt_key(fmt: BlockFormat) -> str:
    for base in (MXFP8_E4M3, MXFP8_E5M2, MXFP4, NVFP4, NVFP4_SINGLE):
        if fmt.elem is base.elem and fmt.scale is base.scale and fmt.block_size == base.block_size:
            return "nv" if fmt.scale is UE4M3 else ("mx4" if fmt.elem is E2M1 else "mx8")
    return ""


def check_supported(fmt: Any, geometry: Any = Geometry.BLOCK, dtype: Any = np.float32) -> None:
    """Raise ``ValueError``/``TypeError`` unless a kernel implements this configuration."""
    if not isinstance(fmt, BlockFormat):
        raise TypeError(
            f"fmt={fmt!r} must be a BlockFormat (MXFP8_E4M3, MXFP8_E5M2, MXFP4, "
            f"NVFP4, NVFP4_SINGLE)"
        )
    if not isinstance(geometry, Geometry):
        raise TypeError(f"geometry={geometry!r} must be a Geometry")
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"x has dtype {dtype!r}; allowed: bfloat16, float16, float32") from None
    if dt not in INPUT_DTYPES:
        raise TypeError(f"x has dtype {dt}; allowed: bfloat16, float16, float32")
    kind = _fmt_key(fmt)
    if not kind:
        raise ValueError(
            f"fmt={fmt.name} ({fmt.elem}/{fmt.scale}/{fmt.block_size}) has no GPU "
            f"kernel; allowed: MXFP8_E4M3, MXFP8_E5M2, MXFP4, NVFP4, NVFP4_SINGLE "
            f"(and their variants below)"
        )
    if fmt.policy != DEFAULT_POLICY:
        raise ValueError(f"fmt.policy={fmt.policy} has no GPU kernel; allowed: DEFAULT_POLICY")
    if fmt.arithmetic is not Arithmetic.TRANSFORMER_ENGINE:
        raise ValueError(
            f"fmt.arithmetic={fmt.arithmetic.name} has no GPU kernel; allowed: TRANSFORMER_ENGINE"
        )
    if kind == "nv":
        if fmt.rule is not ScaleRule.NEAREST or fmt.min_scale != 0.0:
            raise ValueError(
                f"{fmt.name}: rule={fmt.rule.name}, min_scale={fmt.min_scale} have "
                f"no GPU kernel; allowed: rule NEAREST, min_scale 0.0"
            )
        if fmt.global_scale not in (GlobalScale.NONE, GlobalScale.PER_TENSOR, GlobalScale.CONSTANT):
            raise ValueError(
                f"{fmt.name}: global_scale={fmt.global_scale.name} has no GPU "
                f"kernel; allowed: NONE, PER_TENSOR, CONSTANT (scalar)"
            )
        if geometry is not Geometry.BLOCK:
            raise ValueError(
                f"geometry={geometry.name} with {fmt.name} has no GPU kernel; allowed: BLOCK"
            )
    else:
        if fmt.rule not in (ScaleRule.RCEIL, ScaleRule.FLOOR, ScaleRule.CEIL, ScaleRule.EVEN):
            raise ValueError(f"{fmt.name}: rule={fmt.rule.name} has no GPU kernel")
        if fmt.nonfinite not in (NonFinite.SATFINITE, NonFinite.NAN):
            raise ValueError(
                f"{fmt.name}: nonfinite={fmt.nonfinite.name} has no GPU kernel; "
                f"allowed: SATFINITE, NAN"
            )
        if fmt.global_scale is not GlobalScale.NONE:
            raise ValueError(
                f"{fmt.name}: an FP32 global factor with UE8M0 scales has no GPU kernel"
            )
        if geometry not in (Geometry.BLOCK, Geometry.TOKEN_BLOCK):
            raise ValueError(
                f"geometry={geometry.name} has no GPU kernel; allowed: BLOCK, TOKEN_BLOCK"
            )


def _default_tiling(cfg: Any) -> dict[str, Any]:
    """The tiling a BLOCK kernel gets unless told otherwise: the fastest measured on the H200
    at 8192 x 8192 (see ``fp4sim/benchmarks/gpu_quant.py``). Direct GMEM <-> register
    transfers. The FP4 formats give each thread whole blocks (their per-block arithmetic then
    runs once per block, not once per thread sharing it) in tiles of 256 rows; FP8 from float16
    input lets four threads share a 64-byte block row (fully coalesced 16-byte loads) in tiles
    of 128 rows (256 from float32 input).

    From bfloat16 input (CUPTI device time, H200 runs on 2026-12-01, each bitwise equal to
    the emulator): MXFP8 gives each thread a whole 64-byte block row as two 32-byte vectors
    in tiles of 256 rows (0.870-0.883 of the copy bandwidth in five runs, against 0.810-0.815
    for four lanes per row; E5M2 0.841-0.857 against 0.806); NVFP4 gives each thread two
    consecutive blocks as 32-byte vectors (16 contiguous code bytes, 8-byte stores) and each
    CTA four tiles, issuing the next tile's loads before converting the current one (with the
    current element code 0.871-0.872, against 0.78 for one tile per CTA, 0.85 for two or eight
    and 0.82 for 16-byte vectors and one block per thread). float16/float32 input and MXFP4
    were not re-measured with these tilings and keep the previous ones."""
    kind = _fmt_key(cfg.fmt)
    mx8 = kind == "mx8"
    paired = np.dtype(cfg.in_dtype).itemsize == 2
    bf16 = np.dtype(cfg.in_dtype) == np.dtype(ml_dtypes.bfloat16)
    transfer = cfg.transfer if cfg.transfer is not None else Transfer.DIRECT
    direct = transfer is Transfer.DIRECT
    lanes = cfg.lanes if cfg.lanes is not None else (4 if mx8 and not (bf16 and direct) else 1)
    wide = bf16 and direct and lanes == 1 and kind in ("nv", "mx8")
    nv_wide = wide and kind == "nv"
    return {
        "transfer": transfer,
        "lanes": lanes,
        "block_rows": 128 if mx8 and paired and not wide else 256,
        "tiles_per_cta": (4 if nv_wide else 1) if direct else 2,
        "vector_words": 8 if wide else 4,
        "rows_per_thread": 2 if nv_wide else 1,
    }


@dataclasses.dataclass(frozen=True, kw_only=True)
class QuantKernelConfig:
    """One compiled quantization kernel: what it converts and how it tiles the work."""

    fmt: BlockFormat
    geometry: Geometry = Geometry.BLOCK
    in_dtype: np.dtype = np.dtype(ml_dtypes.bfloat16)
    block_rows: int | None = None  # BLOCK: scale blocks (rows of the block view) per tile
    token_blocks: int = 2  # (32 x D) token blocks per CTA, TOKEN_BLOCK geometry
    head_dim: int = 128  # D, TOKEN_BLOCK geometry only
    element_path: ElementPath | None = None  # None: FLOAT on hardware, INTEGER interpreted
    variant: Variant = Variant.FULL
    tiles_per_cta: int | None = None  # BLOCK: tiles a CTA loops over
    tma_row_bytes: int = 512  # BLOCK, TMA: output TMA rows of at least this many bytes (block
    #                           rows are regrouped; 16 = minimal). Hardware only.
    lanes: int | None = None  # BLOCK: threads sharing one scale block (1: whole blocks)
    transfer: Transfer | None = None  # BLOCK: DIRECT (GMEM <-> registers) or TMA (SMEM ring)
    stages: int = 2  # BLOCK, TMA: depth of the SMEM ring (tiles in flight per CTA)
    vector_words: int | None = None  # BLOCK: input words per register vector (4: 16-byte
    #                                  loads; 8: 32-byte vectors, i.e. 8-byte FP4 code stores)
    rows_per_thread: int | None = None  # BLOCK, lanes == 1: consecutive rows one thread owns

    def __post_init__(self) -> None:
        object.__setattr__(self, "in_dtype", np.dtype(self.in_dtype))
        check_supported(self.fmt, self.geometry, self.in_dtype)
        if self.element_path is not None and not isinstance(self.element_path, ElementPath):
            raise TypeError(
                f"QuantKernelConfig.element_path={self.element_path!r} must be an "
                f"ElementPath or None"
            )
        if not isinstance(self.variant, Variant):
            raise TypeError(f"QuantKernelConfig.variant={self.variant!r} must be a Variant")
        if self.variant is Variant.MOVE_ONLY and self.geometry is not Geometry.BLOCK:
            raise ValueError("Variant.MOVE_ONLY exists for BLOCK geometry only")
        for name, value in _default_tiling(self).items():  # None: the measured best
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)
        if not isinstance(self.transfer, Transfer):
            raise TypeError(f"QuantKernelConfig.transfer={self.transfer!r} must be a Transfer")
        if self.lanes not in (1, 2, 4):
            raise ValueError(f"QuantKernelConfig.lanes={self.lanes!r}; allowed: 1, 2, 4")
        if self.vector_words not in (4, 8):
            raise ValueError(f"QuantKernelConfig.vector_words={self.vector_words!r}; allowed: 4, 8")
        if self.rows_per_thread not in (1, 2, 4):
            raise ValueError(
                f"QuantKernelConfig.rows_per_thread={self.rows_per_thread!r}; allowed: 1, 2, 4"
            )
        if self.rows_per_thread > 1 and self.lanes != 1:
            raise ValueError(
                f"QuantKernelConfig.rows_per_thread={self.rows_per_thread} needs "
                f"lanes=1 (got lanes={self.lanes})"
            )
        if (
            not isinstance(self.stages, int)
            or isinstance(self.stages, bool)
            or not 1 <= self.stages <= 8
        ):
            raise ValueError(f"QuantKernelConfig.stages={self.stages!r}; allowed: 1 to 8")
        if self.tma_row_bytes not in (16, 64, 128, 256, 512):
            raise ValueError(
                f"QuantKernelConfig.tma_row_bytes={self.tma_row_bytes!r}; allowed: "
                f"16, 64, 128, 256, 512"
            )
        for name in ("block_rows", "token_blocks", "head_dim", "tiles_per_cta"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"QuantKernelConfig.{name}={v!r} must be a positive int")
        if self.block_rows not in (64, 128, 256, 512, 1024):
            raise ValueError(
                f"QuantKernelConfig.block_rows={self.block_rows}; allowed: 64, 128, 256, 512, 1024"
            )
        if self.geometry is Geometry.TOKEN_BLOCK and (
            self.head_dim % 16 or not 16 <= self.head_dim <= 256
        ):
            raise ValueError(
                f"QuantKernelConfig.head_dim={self.head_dim} must be a multiple of 16 in [16, 256]"
            )

    @classmethod
    def for_array(
        cls, x: Any, fmt: BlockFormat, *, geometry: Geometry = Geometry.BLOCK, **tiling: Any
    ) -> QuantKernelConfig:
        """The configuration for quantizing ``x`` (its dtype; for ``TOKEN_BLOCK`` its last axis
        as ``head_dim``) to ``fmt``, with the given tiling fields (the others: measured
        defaults)."""
        if geometry is Geometry.TOKEN_BLOCK and "head_dim" not in tiling:
            tiling["head_dim"] = int(x.shape[-1])
        return cls(fmt=fmt, geometry=geometry, in_dtype=x.dtype, **tiling)

    @property
    def kind(self) -> str:
        return _fmt_key(self.fmt)

    @property
    def paired(self) -> bool:
        """True when a 32-bit input word holds two elements (16-bit input)."""
        return self.in_dtype.itemsize == 2

    @property
    def words_per_block(self) -> int:
        n = self.fmt.block_size if self.geometry is Geometry.BLOCK else self.head_dim
        return n // 2 if self.paired else n

    @property
    def packs_in_kernel(self) -> bool:
        return self.fmt.elem is E2M1 and self.paired


def shipped_configs() -> tuple[QuantKernelConfig, ...]:
    """The configurations ``python -m fp4sim bench gpu --only quant`` runs."""
    bf16 = np.dtype(ml_dtypes.bfloat16)
    out = []
    for fmt in (MXFP8_E4M3, MXFP8_E5M2, MXFP4, NVFP4):
        for dt in INPUT_DTYPES:
            out.append(QuantKernelConfig(fmt=fmt, in_dtype=dt))
    out.append(QuantKernelConfig(fmt=NVFP4_SINGLE, in_dtype=bf16))
    for fmt in (MXFP8_E4M3, NVFP4, MXFP4):  # the TMA-ring variant the benchmark compares
        out.append(
            QuantKernelConfig(
                fmt=fmt, in_dtype=bf16, transfer=Transfer.TMA, lanes=1, block_rows=256
            )
        )
    out.append(
        QuantKernelConfig(
            fmt=MXFP8_E4M3, geometry=Geometry.TOKEN_BLOCK, in_dtype=bf16, head_dim=128
        )
    )
    out.append(
        QuantKernelConfig(fmt=MXFP4, geometry=Geometry.TOKEN_BLOCK, in_dtype=bf16, head_dim=128)
    )
    return tuple(out)


# --- element helpers (work on any register layout; per-block values already broadcast) --------
def _f16_to_f32_bits(h: Any) -> Any:
    """float32 bit patterns of float16 bit patterns ``h`` (uint32, low 16 bits), exactly:
    normal/Inf/NaN by moving fields, subnormals by an exact int->float conversion."""
    import jax.numpy as jnp

    s = (h & _U(0x8000)) << _U(16)
    e = (h >> _U(10)) & _U(0x1F)
    m = h & _U(0x3FF)
    normal = ((e + _U(112)) << _U(23)) | (m << _U(13))
    special = _U(_F32_INF) | (m << _U(13))
    fm = _bits(m.astype(jnp.int32).astype(jnp.float32))  # m >= 1: a normal float
    sub = jnp.where(m == 0, _U(0), fm - _U(24 << 23))
    return s | jnp.where(e == 0, sub, jnp.where(e == _U(31), special, normal))


def _widen(w: Any, cfg: QuantKernelConfig) -> tuple[Any, ...]:
    """float32 bit patterns of the element(s) in each uint32 word: (even, odd) or (x,)."""
    if not cfg.paired:
        return (w,)
    if cfg.in_dtype == np.dtype(ml_dtypes.bfloat16):
        return (w << _U(16), w & _U(0xFFFF0000))
    return (_f16_to_f32_bits(w & _U(0xFFFF)), _f16_to_f32_bits(w >> _U(16)))


def _ds(start: Any, size: int) -> Any:
    """``pl.ds(start, size)`` (imported lazily: importing this module loads no Pallas)."""
    from jax.experimental import pallas as pl

    return pl.ds(start, size)


def _bits(v: Any) -> Any:
    from jax import lax

    return lax.bitcast_convert_type(v, np.uint32)


def _f32(b: Any) -> Any:
    from jax import lax

    return lax.bitcast_convert_type(b, np.float32)


def _normalize(a: Any) -> tuple[Any, Any]:
    """(m, e): float32 m in [1, 2) and int32 e with a = m·2^e, for positive finite a given as
    magnitude bits (garbage for 0). Subnormals are normalised by an exact int->float conversion,
    so no float operation sees a subnormal."""
    import jax.numpy as jnp

    field = (a >> _U(23)).astype(jnp.int32)
    fm = _bits((a & _U(0x7FFFFF)).astype(jnp.int32).astype(jnp.float32))
    sub = field == 0
    src = jnp.where(sub, fm, a)
    m = _f32((src & _U(0x7FFFFF)) | _U(0x3F800000))
    e = jnp.where(sub, (fm >> _U(23)).astype(jnp.int32) - _I(127 + 149), field - _I(127))
    return m, e


def _mx_scale_code(amax: Any, fmt: BlockFormat) -> Any:
    """int32 UE8M0 code (255 = NaN) from block max-abs bits, exactly as the emulator's
    ``_pow2_scale_code``; RCEIL via the normalised product ``fl(m·fl(1/M)·2^(eM+1))``."""
    import jax.numpy as jnp

    e_m = fmt.elem.emax
    field = (amax >> _U(23)).astype(jnp.int32)
    if fmt.rule is ScaleRule.RCEIL:
        c = np.float32(1.0) / np.float32(fmt.elem.max)  # fl(1/M), as the emulator
        c_norm = float(c) * 2.0 ** (e_m + 1)  # exact: c = c_norm·2^-(eM+1), c_norm in [1, 2)
        assert 1.0 <= c_norm < 2.0
        m, e = _normalize(amax)
        p = _bits(m * np.float32(c_norm))  # in [1, 4): a normal product on every backend
        pe = (p >> _U(23)).astype(jnp.int32) - _I(127)
        pm = p & _U(0x7FFFFF)
        t = e - _I(e_m + 1) + pe  # floor(log2 d) for the descale d = amax·fl(1/M)
        up = (pm != 0).astype(jnp.int32)
        code = jnp.where(
            t >= -126,
            jnp.minimum(t + _I(127) + up, _I(254)),
            jnp.where(t == -127, (pm > _U(1)).astype(jnp.int32), _I(0)),
        )
        code = jnp.where(amax == 0, _I(0), code)
    else:
        if fmt.rule is ScaleRule.EVEN:
            half = _U(1 << (23 - fmt.elem.mbits - 1))
            field = (((amax + half) >> _U(23)) & _U(0x1FF)).astype(jnp.int32)
        e = field - _I(e_m)
        if fmt.rule is ScaleRule.CEIL:
            e = e + ((amax & _U(0x7FFFFF)) != 0).astype(jnp.int32)
        code = jnp.clip(e, 0, 254)
    inf_c = 254 if fmt.nonfinite is NonFinite.SATFINITE else 255
    code = jnp.where(amax == _U(_F32_INF), _I(inf_c), code)
    return jnp.where(amax > _U(_F32_INF), _I(255), code)


def _fp8_codes(b: Any, k: Any, fmt: BlockFormat) -> Any:
    """uint32 FP8 codes of x·2^-k (x given as float32 bits ``b``, k int32 broadcast)."""
    import jax.numpy as jnp

    elem = fmt.elem
    a = b & _U(0x7FFFFFFF)
    field = (a >> _U(23)).astype(jnp.int32)
    # |x|·2^-k by exponent arithmetic (normal results only; smaller ones encode to 0 anyway)
    scaled = (a.astype(jnp.int32) - (k << _I(23))).astype(jnp.uint32)
    pow2 = ((_I(-22) - k) << _I(23)).astype(jnp.uint32)  # 2^(-149-k), normal when k <= -23
    sub = _bits((a & _U(0x7FFFFF)).astype(jnp.int32).astype(jnp.float32) * _f32(pow2))
    y = jnp.where(
        (field >= 1) & (field > k), scaled, jnp.where((field == 0) & (k <= -23), sub, _U(0))
    )
    y = jnp.where(field == 255, a, y)
    max_bits = int(np.float32(elem.max).view(np.uint32))
    y = jnp.minimum(y, _U(max_bits))  # saturate (Inf and NaN too; NaN is patched below)
    sign = b & _U(0x80000000)
    dt = jnp.float8_e4m3fn if elem is E4M3 else jnp.float8_e5m2
    code = _bits_u8(_f32(y | sign).astype(dt)).astype(jnp.uint32)
    nan_code = 0x7F if elem is E4M3 else 0x7E
    return jnp.where(a > _U(_F32_INF), _U(nan_code) | (sign >> _U(24)), code)


def _bits_u8(v: Any) -> Any:
    from jax import lax

    return lax.bitcast_convert_type(v, np.uint8)


def _e2m1_thresholds(k: Any) -> list[Any]:
    """The E2M1 decision points t·2^k as float32 bits (exact: t has <= 3 significant bits and
    k >= -127; points above the float32 range become +Inf bits)."""
    import jax.numpy as jnp

    out = []
    for tb, _ in _E2M1_POINTS:
        f = _I(tb >> 23) + k
        normal = (jnp.clip(f, 1, 255).astype(jnp.uint32) << _U(23)) | _U(tb & 0x7FFFFF)
        sub = _U((tb & 0x7FFFFF) | 0x800000) >> jnp.clip(1 - f, 0, 31).astype(jnp.uint32)
        out.append(jnp.where(f >= 255, _U(_F32_INF), jnp.where(f >= 1, normal, sub)))
    return out


def _e2m1_from_points(a: Any, points: list[Any]) -> Any:
    """E2M1 magnitude code of magnitude bits ``a`` (finite) given decision points."""
    import jax.numpy as jnp

    mag = jnp.zeros(a.shape, jnp.uint32)
    for (_, strict), t in zip(_E2M1_POINTS, points):
        hit = (a > t) if strict else (a >= t)
        mag = mag + hit.astype(jnp.uint32)
    return mag


def _e2m1_finish(b: Any, mag: Any) -> Any:
    """Apply sign, Inf (saturates to 6) and NaN (+0, the emulator's E2M1 NaN policy)."""
    import jax.numpy as jnp

    a = b & _U(0x7FFFFFFF)
    mag = jnp.where(a == _U(_F32_INF), _U(7), mag)
    code = mag | ((b >> _U(28)) & _U(8))
    return jnp.where(a > _U(_F32_INF), _U(0), code)


def _mx4_codes(b: Any, points: list[Any]) -> Any:
    a = b & _U(0x7FFFFFFF)
    return _e2m1_finish(b, _e2m1_from_points(a, points))


def _nv_codes(b: Any, enc_m: Any, enc_e: Any, nan_block: Any) -> Any:
    """E2M1 codes of fl(x·enc) (enc = enc_m·2^enc_e, a normal float32; per block)."""
    import jax.numpy as jnp

    a = b & _U(0x7FFFFFFF)
    m, e = _normalize(a)
    p = _bits(m * enc_m)  # normal product in [1, 4): exact IEEE rounding on every backend
    f = (p >> _U(23)).astype(jnp.int32) + e + enc_e  # biased exponent field of fl(x·enc)
    y = (p & _U(0x7FFFFF)) | (jnp.clip(f, 1, 254).astype(jnp.uint32) << _U(23))
    y = jnp.where(f >= 255, _U(_F32_INF), jnp.where(f < 1, _U(0), y))
    y = jnp.where(a == 0, _U(0), y)
    mag = jnp.zeros(a.shape, jnp.uint32)
    for tb, strict in _E2M1_POINTS:
        hit = (y > _U(tb)) if strict else (y >= _U(tb))
        mag = mag + hit.astype(jnp.uint32)
    code = _e2m1_finish(b, mag)
    return jnp.where(nan_block, _U(0), code)


def _fp8_codes_float(b: Any, s: Any, fmt: BlockFormat) -> Any:
    """FLOAT path: FP8 codes of fl(x·s) by the hardware's saturating RNE conversion; NaN inputs
    get the emulator's NaN code with the input's sign (the hardware's NaN is canonical)."""
    import jax.numpy as jnp

    y = _f32(b) * s
    dt = jnp.float8_e4m3fn if fmt.elem is E4M3 else jnp.float8_e5m2
    code = _bits_u8(y.astype(dt)).astype(jnp.uint32)
    nan_code = 0x7F if fmt.elem is E4M3 else 0x7E
    return jnp.where(y != y, _U(nan_code) | ((b >> _U(24)) & _U(0x80)), code)


def _nv_block(
    amax: Any, params: dict[str, Any], *, ieee: bool = False
) -> tuple[Any, Any, Any, Any, Any]:
    """Per block: (UE4M3 scale code, enc significand, enc exponent, NaN-block mask, enc), the
    emulator's TransformerEngine order: s = E4M3(clip(amax·k, 0, 448)),
    enc = min(fl(1/fl(s·g)), max_f32). ``ieee``: float32 operations keep subnormals (the GPU),
    so ``amax·k`` is one multiply; otherwise it is formed from normalised significands (a
    product below 2^-126 becomes 0, which encodes to the same UE4M3 code 0)."""
    import jax.numpy as jnp

    nan = (amax > _U(_F32_INF)) | params["nan"]
    if ieee:
        k = params["k_m"] * _f32(((params["k_e"] + _I(127)) << _I(23)).astype(jnp.uint32))
        s8 = jnp.minimum(_f32(amax) * k, np.float32(448.0)).astype(jnp.float8_e4m3fn)
    else:
        m, e = _normalize(amax)
        p = _bits(m * params["k_m"])
        f = (p >> _U(23)).astype(jnp.int32) + e + params["k_e"]
        s_bits = (p & _U(0x7FFFFF)) | (jnp.clip(f, 1, 254).astype(jnp.uint32) << _U(23))
        s_bits = jnp.where(f < 1, _U(0), s_bits)
        s_bits = jnp.minimum(jnp.where(f >= 255, _U(_F32_INF), s_bits), _U(0x43E00000))
        s_bits = jnp.where(amax == 0, _U(0), s_bits)  # (<= 448 above)
        s8 = _f32(s_bits).astype(jnp.float8_e4m3fn)
    s_code = jnp.where(nan, _U(0x7F), _bits_u8(s8).astype(jnp.uint32))
    # enc = fl(1/fl(s·g)) with s = s_j·2^e: for g >= 2^-117 every product and quotient here is
    # a normal float, so fl(s·g) = fl(s_j·g)·2^e and fl(1/fl(s·g)) = R[j]·2^-e exactly, with
    # R[j] = fl(1/fl(s_j·g)) divided exactly outside the kernel (a float division inside would
    # be lowered to the approximate rcp.approx.f32). s = 0 (a block too small for UE4M3's
    # smallest step) gives 1/0 = Inf, capped to max_f32 as in the emulator.
    sb = _bits(s8.astype(jnp.float32))  # a normal float32 (UE4M3 >= 2^-9) or 0
    j = sb >> _U(20)
    r = params["recip"]
    pick = lambda bit, hi, lo: jnp.where((j & _U(bit)) != 0, hi, lo)  # noqa: E731
    r = [pick(1, r[i + 1], r[i]) for i in range(0, 8, 2)]
    r = [pick(2, r[i + 1], r[i]) for i in range(0, 4, 2)]
    r = pick(4, r[1], r[0])
    inv_pow2 = _f32(_U(254 << 23) - (sb & _U(0x7F800000)))  # 2^-e
    f32max = np.float32(np.finfo(np.float32).max)
    enc = jnp.where(sb == 0, f32max, jnp.minimum(r * inv_pow2, f32max))
    enc_m, enc_e = _normalize(_bits(enc))  # (INTEGER path only; dead code on the FLOAT path)
    return s_code, enc_m, enc_e, nan, enc  # NaN blocks: callers write +0 codes by the mask


# --- kernel bodies ------------------------------------------------------------------------------
def _out_word_dtype(cfg: QuantKernelConfig) -> Any:
    if cfg.kind == "mx8" and cfg.paired:
        return np.uint16
    return np.uint8


def _out_words(cfg: QuantKernelConfig) -> int:
    """Output elements (of ``_out_word_dtype``) per block row: one per input word (a uint16 FP8
    pair, a packed FP4 byte, or, for float32 input, one code byte)."""
    return cfg.words_per_block


def _widen_amax(w: Any, cfg: QuantKernelConfig) -> tuple[tuple[Any, ...], Any]:
    """(float32 bits of the elements of each word, elementwise max of their magnitudes)."""
    import jax.numpy as jnp

    xs = _widen(w, cfg)
    amax = xs[0] & _U(0x7FFFFFFF)
    for x in xs[1:]:
        amax = jnp.maximum(amax, x & _U(0x7FFFFFFF))
    return xs, amax


def _block_amax(xs: tuple[Any, ...], cfg: QuantKernelConfig) -> tuple[Any, Any]:
    """Block max-abs as float32 bits (NaN-aware) of a ``(rows, words)`` tile, reduced along the
    row. INTEGER path: an integer max over magnitude bits (immune to FTZ/DAZ). FLOAT path on
    hardware: ``max.NaN.f32`` over ``|x|`` (IEEE, subnormals kept; one float op per element
    instead of three integer ops; a NaN block gives the canonical NaN, and only "is NaN" is
    used downstream). Returns (block max bits, the float32 magnitudes |x| or None)."""
    import jax.numpy as jnp

    if _path(cfg) is ElementPath.FLOAT and not interpreting():
        mags = tuple(jnp.abs(_f32(x)) for x in xs)
        mag = mags[0]
        for m in mags[1:]:
            mag = jnp.maximum(mag, m)
        return _bits(jnp.max(mag, axis=1)), mags
    mag = xs[0] & _U(0x7FFFFFFF)
    for x in xs[1:]:
        mag = jnp.maximum(mag, x & _U(0x7FFFFFFF))
    return jnp.max(mag, axis=1), None


def e2m1_code_bits_float(y: Any, *, nonnegative: bool = False) -> Any:
    """The E2M1 magnitude code (0..7) of float32 ``y``, round to nearest even, saturating at 6
    (NaN: unspecified; callers mask NaN elements or blocks), *in bits 22-24* of a uint32 (all
    other bits zero), by IEEE float32 steps without integer rounding logic:

    1. ``a = min(|y|, 6)``;
    2. ``M = 2^22·max(2^floor(log2 a), 1)``: then ``fl(a + M)`` lies in M's binade, whose
       spacing is exactly E2M1's spacing around ``a`` (0.5 below 2, then 1, then 2), so
       ``r = fl(a + M) - M`` is ``a`` rounded to E2M1 with ties to the even code;
    3. ``r·2^-126`` puts E2M1's values 0, 0.5, 1, 1.5, 2, 3, 4, 6 at float32 bit patterns whose
       bits 22 and up are the codes 0..7 (0.5·2^-126 is the subnormal 0x00400000).

    The code is left in place so that a caller packing codes moves each into its position with
    one multiply or shift (:func:`_fp4_codes_float`). Exact where float32 operations
    keep subnormals (NumPy; the GPU), not under XLA:CPU's FTZ/DAZ; written against the array
    namespace so NumPy tests check it. The multiplies by powers of two are exact, so a compiler
    that fuses them with the additions into FMAs (the NVPTX backend does) cannot change a
    result. ``nonnegative``: ``y >= 0`` is known (skips the ``abs``)."""
    from fp4sim._xp import bitcast_in_kernel as bitcast
    from fp4sim._xp import namespace

    xp = namespace(y)
    a = xp.minimum(y if nonnegative else xp.abs(y), np.float32(6.0))
    p2 = bitcast(bitcast(a, np.uint32) & _U(0x7F800000), np.float32)  # 2^floor(log2 a), or 0
    m = xp.maximum(p2, np.float32(1.0)) * np.float32(2.0**22)  # float ops: the FP pipe
    r = (a + m) - m
    return bitcast(r * np.float32(2.0**-126), np.uint32)


def e2m1_magnitude_float(y: Any, *, nonnegative: bool = False) -> Any:
    """E2M1 magnitude codes (uint32, 0..7) of float32 ``y``: :func:`e2m1_code_bits_float`
    shifted down (same rounding, saturation and exactness conditions)."""
    return e2m1_code_bits_float(y, nonnegative=nonnegative) >> _U(22)


def _fp4_codes_float(
    xs: tuple[Any, ...], s: Any, *, block_keep: Any = None, absx: Any = None, word: Any = None
) -> Any:
    """FLOAT path, MXFP4 and NVFP4: E2M1 codes of fl(x·s), s > 0 per block, by
    :func:`e2m1_code_bits_float`, packed into one byte per pair of elements for 16-bit input.
    NaN elements give +0: NVFP4 passes ``block_keep`` (a NaN makes its block a NaN block, all
    +0, so no per-element test is needed), uint32 1 for an ordinary block and 0 for a NaN
    block, by which the codes are multiplied; MXFP4 tests each element. ``absx``: the float32
    ``|x|`` already formed for the block max (fl(|x|·s) = |fl(x·s)| for s > 0). ``word``: the
    uint32 input words of a pair (16-bit input, even element in the low half), from which the
    two signs are taken. Written against the array namespace: NumPy runs it with IEEE
    subnormals, as the GPU does.

    A pair's byte is assembled in the top byte of a uint32, then moved down with one shift:
    the even code (bits 22-24) times 4 lands in bits 24-26, the odd code times 64 in bits
    28-30, and ``(word & 0x80008000) · 0x1001`` puts the even sign (bit 15) at bit 27 next to
    the odd sign already at bit 31 (its other copies fall below bit 24 or off the top). The
    fields are disjoint, so additions and ORs agree. The multiplies by powers of two become
    IMAD.SHL and the sign product an IMAD (the FMA pipe, which the logic-bound kernel has
    spare); the sign mask, the OR and the shift are the only logic instructions per pair. An
    NVFP4 NaN block multiplies the byte by 0 (one more IMAD, not a select)."""
    from fp4sim._xp import bitcast_in_kernel as bitcast
    from fp4sim._xp import namespace

    xp = namespace(*xs)
    if absx is None:
        absx = [xp.abs(bitcast(x, np.float32)) for x in xs]
    ys = [a * s for a in absx]
    cs = [e2m1_code_bits_float(y, nonnegative=True) for y in ys]
    if len(xs) == 1:  # float32 input: one code per byte
        code = (cs[0] >> _U(22)) | ((xs[0] >> _U(28)) & _U(0x08))
        code = xp.where(ys[0] != ys[0], _U(0), code) if block_keep is None else code
    else:
        if word is None:  # only the signs (bits 15 and 31) are used: take them from xs
            word = (xs[0] >> _U(16)) | (xs[1] & _U(0xFFFF0000))
        signs = word & _U(0x80008000)
        if block_keep is None:  # MXFP4: a NaN element gives +0 (code and sign)
            nan0, nan1 = (y != y for y in ys)
            cs = [xp.where(n, _U(0), c) for n, c in zip((nan0, nan1), cs)]
            signs = (
                signs
                & xp.where(nan0, _U(0x80000000), _U(0xFFFFFFFF))
                & xp.where(nan1, _U(0x00008000), _U(0xFFFFFFFF))
            )
        # (the odd code is OR-ed in: with a third addition here, ptxas 13 (sm_90a, -O3)
        # dropped the odd element's whole computation from the NVFP4 kernel, so every byte
        # came out with its high code 0; the NVFP4 GPU tests caught it)
        top = (cs[0] * _U(4) + signs * _U(0x1001)) | (cs[1] * _U(64))
        code = top >> _U(24)
    if block_keep is not None:
        code = code * block_keep
    return code.astype(np.uint8)


def _path(cfg: QuantKernelConfig) -> ElementPath:
    if cfg.element_path is not None:
        return cfg.element_path
    return ElementPath.INTEGER if interpreting() else ElementPath.FLOAT


def _codes_from(
    xs: tuple[Any, ...],
    cfg: QuantKernelConfig,
    per_block: dict[str, Any],
    bc: Any,
    absx: Any = None,
    word: Any = None,
) -> Any:
    """The codes of a tile (``xs``: :func:`_widen` of the input words ``word``)."""
    import jax.numpy as jnp

    fmt = cfg.fmt
    flt = _path(cfg) is ElementPath.FLOAT
    if cfg.kind == "mx8":
        if flt:
            s = bc(per_block["s"])
            codes = [_fp8_codes_float(x, s, fmt) for x in xs]
        else:
            k = bc(per_block["k"])
            codes = [_fp8_codes(x, k, fmt) for x in xs]
        if len(codes) == 2:
            return (codes[0] | (codes[1] << _U(8))).astype(jnp.uint16)
        return codes[0].astype(jnp.uint8)
    if flt:
        keep = bc(per_block["keep"]) if cfg.kind == "nv" else None
        return _fp4_codes_float(xs, bc(per_block["s"]), block_keep=keep, absx=absx, word=word)
    if cfg.kind == "mx4":
        points = [bc(t) for t in per_block["points"]]
        codes = [_mx4_codes(x, points) for x in xs]
    else:
        enc_m, enc_e, nan = bc(per_block["enc_m"]), bc(per_block["enc_e"]), bc(per_block["nan"])
        codes = [_nv_codes(x, enc_m, enc_e, nan) for x in xs]
    if len(codes) == 2:
        return (codes[0] | (codes[1] << _U(4))).astype(jnp.uint8)
    return codes[0].astype(jnp.uint8)


def _pow2_factor(k: Any) -> Any:
    """float32 2^-k for k in [-127, 127] (2^-127 built as the subnormal bit pattern)."""
    import jax.numpy as jnp

    return _f32(jnp.where(k <= 126, ((_I(127) - k) << _I(23)).astype(jnp.uint32), _U(0x00400000)))


def _per_block(amax: Any, cfg: QuantKernelConfig, params: dict[str, Any]) -> tuple[Any, dict]:
    """(uint32 scale codes, per-block values the element code needs)."""
    import jax.numpy as jnp

    flt = _path(cfg) is ElementPath.FLOAT
    if cfg.kind == "nv":
        s_code, enc_m, enc_e, nan, enc = _nv_block(amax, params, ieee=flt and not interpreting())
        if flt:  # keep: uint32 0 for a NaN block, else 1 (see _fp4_codes_float)
            return s_code, {"s": enc, "keep": jnp.where(nan, _U(0), _U(1))}
        return s_code, {"enc_m": enc_m, "enc_e": enc_e, "nan": nan}
    code = _mx_scale_code(amax, cfg.fmt)
    k = jnp.where(code == 255, _I(0), code - _I(127))
    if flt:
        return code.astype(jnp.uint32), {"s": _pow2_factor(k)}
    if cfg.kind == "mx8":
        return code.astype(jnp.uint32), {"k": k}
    return code.astype(jnp.uint32), {"points": _e2m1_thresholds(k)}


NUM_PARAMS = 12  # the NVFP4 kernel scalars (see _load_params)


def _load_params(p_ref: Any, shape: tuple[int, ...]) -> dict[str, Any]:
    """NVFP4 scalars from SMEM or GMEM, [k_m (f32 bits), k_e, g (f32 bits), nan flag, R[0..7]
    (f32 bits of fl(1/fl(s_j·g)))], as splat arrays of ``shape`` (Mosaic GPU reinterprets
    bits of arrays, not of scalars)."""
    from jax import lax

    v = [lax.broadcast_in_dim(p_ref[i], shape, ()) for i in range(NUM_PARAMS)]
    return params_dict(v)


def params_dict(v: Any) -> dict[str, Any]:
    """The named NVFP4 scalars from the ``NUM_PARAMS`` uint32 values ``v`` (arrays)."""
    return {
        "k_m": _f32(v[0]),
        "k_e": v[1].astype(np.int32),
        "g": _f32(v[2]),
        "nan": v[3] != _U(0),
        "recip": [_f32(r) for r in v[4:12]],
    }


def build_kernel(cfg: QuantKernelConfig, num_rows: int) -> Any:
    """The Pallas kernel ``(words, params) -> (codes, scales)`` for ``num_rows`` scale blocks.

    ``words``: uint32 ``(num_rows, words_per_block)`` (BLOCK) or ``(num_rows, 32, words)``
    (TOKEN_BLOCK); ``params``: uint32 ``(NUM_PARAMS,)`` NVFP4 scalars (ignored by MX kernels).
    """
    if not isinstance(cfg, QuantKernelConfig):
        raise TypeError(f"cfg={cfg!r} must be a QuantKernelConfig")
    if cfg.geometry is Geometry.TOKEN_BLOCK:
        return _build_token_block(cfg, num_rows)
    return _build_block(cfg, num_rows)


def _row_layout(ww: int, lanes: int, vector_words: int = 4, rows_per_thread: int = 1) -> Any:
    """The register layout of a ``(rows, ww)`` word tile in which ``lanes`` consecutive threads
    share one row (one scale block), each holding ``ww/lanes`` consecutive words as vectors of
    ``vector_words`` words (fewer when a thread holds fewer). Consecutive lanes read
    consecutive memory, so loads are coalesced and SMEM reads conflict at most
    ``4/lanes``-way; with ``lanes == 1`` the block max and the per-block scale arithmetic stay
    inside one thread (no shuffles, no replicated scale math), and a thread may own
    ``rows_per_thread`` consecutive rows (its codes and scales then are contiguous bytes).
    Vectors of 8 words (32 bytes) become two 16-byte loads and, for packed FP4, one 8-byte
    code store per row."""
    from jax.experimental.mosaic.gpu import fragmented_array as fa
    from jax.experimental.pallas import mosaic_gpu as plgpu

    vec = min(vector_words, ww // lanes)
    r = rows_per_thread
    tiling = fa.Tiling(((128 * r // lanes, ww), (32 * r // lanes, ww), (r, ww // lanes), (1, vec)))
    lay = fa.TiledLayout(
        tiling, warp_dims=(-8,), lane_dims=(-6, -5), vector_dim=-1, _check_canonical=False
    ).canonicalize()
    return plgpu.Layout.TILED(
        lay.tiling, warp_dims=lay.warp_dims, lane_dims=lay.lane_dims, vector_dim=lay.vector_dim
    )


def _block_geometry(cfg: QuantKernelConfig, num_rows: int) -> tuple[int, int, int, int]:
    """(rows per tile, tiles per CTA, lanes per block, rows per thread) for ``num_rows``
    scale blocks."""
    if num_rows % 64:
        raise ValueError(
            f"the input has {num_rows} scale blocks; the {cfg.fmt.name} kernel "
            f"needs a multiple of 64 (pad the leading dimensions)"
        )
    tr = math.gcd(cfg.block_rows, num_rows)  # a power of two >= 64
    lanes, rpt = cfg.lanes, cfg.rows_per_thread
    while rpt > 1 and tr % (128 * rpt):  # base tile: 128·rows_per_thread rows (lanes = 1)
        rpt //= 2
    while tr % (128 // lanes):  # the layout's base tile is 128/lanes rows
        lanes *= 2
    tiles = cfg.tiles_per_cta
    while (num_rows // tr) % tiles:
        tiles -= 1
    return tr, tiles, lanes, rpt


def _build_block(cfg: QuantKernelConfig, num_rows: int) -> Any:
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    tr, tiles, lanes, rpt = _block_geometry(cfg, num_rows)
    ww = cfg.words_per_block
    ow, odt = _out_words(cfg), _out_word_dtype(cfg)
    lay = _row_layout(ww, lanes, cfg.vector_words, rpt)
    u8 = jnp.uint8

    def compute(w: Any, params: dict) -> tuple[Any, Any]:
        if cfg.variant is Variant.MOVE_ONLY:
            return w.astype(odt), jnp.max(w, axis=1).astype(u8)
        xs = _widen(w, cfg)
        amax, absx = _block_amax(xs, cfg)
        scales, per_block = _per_block(amax, cfg, params)
        bc = lambda v: plgpu.layout_cast(lax.broadcast_in_dim(v, (tr, ww), [0]), lay)  # noqa: E731
        return (
            _codes_from(xs, cfg, per_block, bc, absx, w if cfg.paired else None),
            scales.astype(u8),
        )

    out_scales = jax.ShapeDtypeStruct((num_rows,), u8)
    grid = (num_rows // (tr * tiles),)

    if cfg.transfer is Transfer.DIRECT:

        def direct_body(x_g, p_g, o_g, s_g):
            i = lax.axis_index("tiles")
            params = _load_params(p_g, (tr,)) if cfg.kind == "nv" else {}

            def rows(t):
                return _ds((i * tiles + t) * tr, tr)

            def load(t):
                return plgpu.load(x_g.at[rows(t)], layout=lay, optimized=False)

            def finish(t, w):
                codes, scales = compute(w, params)
                o_g.at[rows(t)][...] = codes
                s_g.at[rows(t)][...] = scales

            def step(t, w):  # the loads of tile t + 1 are in flight while tile t is converted
                w_next = load(t + 1)
                finish(t, w)
                return w_next

            finish(tiles - 1, lax.fori_loop(0, tiles - 1, step, load(0)))

        # No automatic barriers around loads and stores: each thread reads only its own input
        # rows and writes only its own outputs, and nothing goes through SMEM.
        return plgpu.kernel(
            direct_body,
            grid=grid,
            grid_names=("tiles",),
            out_type=(jax.ShapeDtypeStruct((num_rows, ow), odt), out_scales),
            compiler_params=plgpu.CompilerParams(unsafe_no_auto_barriers=True),
        )

    slots = min(cfg.stages, tiles)
    chunk = min(tr, 256)  # TMA boxes are at most 256 rows
    n = tr // chunk
    # TMA copies move GMEM rows of >= 16 bytes (and are faster with wide rows): `fold` output
    # block rows of 8 or 16 bytes form one TMA row; the SMEM ref is reshaped back for the
    # register stores (Mosaic's layout inference rejects that reshape for rows of >= 32 bytes).
    # The interpreter cannot reshape SMEM refs and has no such limits: it keeps one block row.
    row_bytes = ow * np.dtype(odt).itemsize
    fold = (
        1
        if interpreting() or row_bytes >= 32
        else max(1, min(cfg.tma_row_bytes // row_bytes, chunk))
    )
    oc = chunk // fold

    def body(x_g, p_g, o_g, s_g, x_s, p_s, o_s, s_s, bar):
        i = lax.axis_index("tiles")

        def fetch(t, slot):
            row0 = (i * tiles + t) * tr
            for c in range(n):
                plgpu.copy_gmem_to_smem(
                    x_g.at[_ds(row0 + c * chunk, chunk)],
                    x_s.at[slot, _ds(c * chunk, chunk)],
                    bar.at[slot * n + c],
                )

        plgpu.copy_gmem_to_smem(p_g, p_s, bar.at[slots * n])
        for t in range(slots):
            fetch(t, t)
        plgpu.barrier_wait(bar.at[slots * n])
        params = _load_params(p_s, (tr,)) if cfg.kind == "nv" else {}

        @pl.loop(0, tiles)
        def _(t):
            slot = lax.rem(t, slots)
            for c in range(n):
                plgpu.barrier_wait(bar.at[slot * n + c])
            codes, scales = compute(plgpu.load(x_s.at[slot], layout=lay), params)
            # the TMA stores that last read this slot (tile t - slots) must be done reading
            plgpu.wait_smem_to_gmem(slots - 1, wait_read_only=True)
            if fold == 1:
                o_s.at[slot][...] = codes
            else:
                o_s.at[slot].reshape(tr, ow)[...] = codes
            s_s.at[slot][...] = scales
            plgpu.commit_smem()  # also a warpgroup barrier: every thread has read x_s[slot]
            row0 = (i * tiles + t) * tr
            for c in range(n):
                plgpu.copy_smem_to_gmem(
                    o_s.at[slot, _ds(c * oc, oc)],
                    o_g.at[_ds((row0 + c * chunk) // fold, oc)],
                    commit_group=False,
                )
                plgpu.copy_smem_to_gmem(
                    s_s.at[slot, _ds(c * chunk, chunk)],
                    s_g.at[_ds(row0 + c * chunk, chunk)],
                    commit_group=False,
                )
            plgpu.commit_smem_to_gmem_group()

            @pl.when(t + slots < tiles)
            def _():
                fetch(t + slots, slot)

        plgpu.wait_smem_to_gmem(0)

    return plgpu.kernel(
        body,
        out_type=(jax.ShapeDtypeStruct((num_rows // fold, ow * fold), odt), out_scales),
        grid=grid,
        grid_names=("tiles",),
        scratch_types=[
            plgpu.SMEM((slots, tr, ww), jnp.uint32),
            plgpu.SMEM((NUM_PARAMS,), jnp.uint32),
            plgpu.SMEM((slots, tr // fold, ow * fold), odt),
            plgpu.SMEM((slots, tr), u8),
            plgpu.Barrier(num_barriers=slots * n + 1),
        ],
    )


def _build_token_block(cfg: QuantKernelConfig, num_blocks: int) -> Any:
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental.pallas import mosaic_gpu as plgpu

    tb = cfg.token_blocks
    if num_blocks % tb:
        tb = math.gcd(num_blocks, tb)
    ww = cfg.words_per_block
    ow, odt = _out_words(cfg), _out_word_dtype(cfg)

    def body(x_g, p_g, o_g, s_g, x_s, o_s, s_s, bar):
        i = lax.axis_index("tiles")
        plgpu.copy_gmem_to_smem(x_g.at[_ds(i * tb, tb)], x_s, bar.at[0])
        plgpu.barrier_wait(bar.at[0])
        for j in range(tb):
            w = x_s.at[j][...]
            xs, mag = _widen_amax(w, cfg)
            # Mosaic GPU reinterprets bits of arrays only: do the per-block arithmetic on a
            # (128,) vector (one lane per thread) holding the block max, then reduce back.
            amax = plgpu.layout_cast(
                lax.broadcast_in_dim(jnp.max(mag), (128,), ()), plgpu.Layout.WG_STRIDED((128,), 1)
            )
            scale, per_block = _per_block(amax, cfg, {})
            per_block = jax.tree.map(jnp.max, per_block)
            bc = lambda v, w=w: lax.broadcast_in_dim(v, w.shape, ())  # noqa: E731  (splat)
            o_s.at[j][...] = _codes_from(xs, cfg, per_block, bc, word=w if cfg.paired else None)
            s_s[j, 0] = jnp.max(scale).astype(jnp.uint8)  # TMA rows are >= 16 bytes: byte 0
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_s, o_g.at[_ds(i * tb, tb)])
        plgpu.copy_smem_to_gmem(s_s, s_g.at[_ds(i * tb, tb)])
        plgpu.wait_smem_to_gmem(0)

    return plgpu.kernel(
        body,
        out_type=(
            jax.ShapeDtypeStruct((num_blocks, 32, ow), odt),
            jax.ShapeDtypeStruct((num_blocks, 16), jnp.uint8),
        ),
        grid=(num_blocks // tb,),
        grid_names=("tiles",),
        scratch_types=[
            plgpu.SMEM((tb, 32, ww), jnp.uint32),
            plgpu.SMEM((tb, 32, ow), odt),
            plgpu.SMEM((tb, 16), jnp.uint8),
            plgpu.Barrier(num_barriers=1),
        ],
    )


# --- host-side wrapper --------------------------------------------------------------------------
def nv_params(
    amax_bits: Any, fmt: BlockFormat, global_scale: Any, global_encode_scale: Any
) -> tuple[Any, Any]:
    """(uint32[4] kernel scalars, float32 decode factor or None), with the emulator's own
    functions for the FP32 factor (scalars only, so their cost does not matter)."""
    import jax.numpy as jnp

    from fp4sim.formats import blocks
    from fp4sim.formats.f32 import div_f32, mul_f32

    one = np.float32(1.0)
    g_dec = s_enc = None
    if fmt.global_scale is GlobalScale.CONSTANT:
        if (global_scale is None) == (global_encode_scale is None):
            raise ValueError(
                f"{fmt.name} has a CONSTANT FP32 factor: give exactly one of "
                f"global_scale= (decode) or global_encode_scale= (encode)"
            )
        given = global_scale if global_scale is not None else global_encode_scale
        if np.ndim(given) != 0:
            raise ValueError(
                f"the GPU kernel takes a scalar FP32 factor; got shape {np.shape(given)}"
            )
        if global_scale is not None:
            g_dec = jnp.asarray(global_scale, jnp.float32)
            s_enc = div_f32(one, g_dec)
        else:
            s_enc = jnp.asarray(global_encode_scale, jnp.float32)
            g_dec = div_f32(one, s_enc)
    elif fmt.global_scale is GlobalScale.PER_TENSOR:
        amax_t = _f32(amax_bits)
        s_enc = blocks.global_encode_scale(amax_t, fmt)
        g_dec = div_f32(one, s_enc)
    elif global_scale is not None or global_encode_scale is not None:
        raise ValueError(
            f"global_scale/global_encode_scale given but {fmt.name}.global_scale is "
            f"{fmt.global_scale.name}"
        )
    inv_m = one / np.float32(fmt.elem.max)
    k = jnp.asarray(inv_m) if s_enc is None else mul_f32(s_enc, inv_m)
    g = jnp.asarray(one) if g_dec is None else g_dec
    kb = _bits(jnp.asarray(k, jnp.float32))
    field = (kb >> _U(23)).astype(jnp.int32)
    k_m = (kb & _U(0x7FFFFF)) | _U(0x3F800000)
    k_e = field - 127
    nan = (kb & _U(0x7FFFFFFF)) > _U(_F32_INF)
    # fl(1/fl(s_j·g)) for the eight UE4M3 significands s_j = 1 + j/8, by the emulator's exact
    # division: the kernel's per-block 1/fl(s·g) is R[j(s)]·2^-e(s), exactly (see _nv_block).
    sig = jnp.asarray(1.0 + np.arange(8, dtype=np.float32) / np.float32(8.0), jnp.float32)
    recip = div_f32(one, sig if g_dec is None else mul_f32(sig, g_dec))
    params = jnp.concatenate(
        [
            jnp.stack(
                [
                    k_m,
                    k_e.astype(jnp.uint32),
                    _bits(jnp.asarray(g, jnp.float32)),
                    nan.astype(jnp.uint32),
                ]
            ),
            _bits(recip),
        ]
    )
    return params, g_dec


def input_words(x: Any, cfg: QuantKernelConfig) -> Any:
    """The input as uint32 words (free reinterpretation in XLA)."""
    import jax.numpy as jnp
    from jax import lax

    if cfg.paired:
        u16 = lax.bitcast_convert_type(x, jnp.uint16)
        return lax.bitcast_convert_type(
            u16.reshape(u16.shape[:-1] + (u16.shape[-1] // 2, 2)), jnp.uint32
        )
    return lax.bitcast_convert_type(x, jnp.uint32)


def gpu_quantize(
    x: Any,
    fmt: BlockFormat,
    *,
    axis: int = -1,
    geometry: Geometry = Geometry.BLOCK,
    global_scale: Any = None,
    global_encode_scale: Any = None,
    pack: bool | None = None,
    config: QuantKernelConfig | None = None,
) -> QuantizedArray:
    """Quantize ``x`` on the GPU (or in interpret mode); same result as ``blocks.quantize``.

    ``axis`` must be -1 for ``BLOCK`` and -2 for ``TOKEN_BLOCK`` (transpose first otherwise).
    ``pack`` defaults to True for FP4 and must be False otherwise. ``config`` chooses the
    kernel (its tiling, :class:`ElementPath`, :class:`Variant`; see
    :class:`QuantKernelConfig`, e.g. ``QuantKernelConfig.for_array(x, fmt, block_rows=64)``);
    by default the measured best for ``fmt``, ``geometry`` and ``x``'s dtype. A given config
    must describe this call (its ``fmt``, ``geometry``, ``in_dtype`` and, for ``TOKEN_BLOCK``,
    ``head_dim``). Configuration errors raise before any kernel is built; see the module
    docstring for what is supported.
    """
    import jax.numpy as jnp

    from fp4sim.formats import blocks

    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"x must be an array, got {type(x).__name__}")
    check_supported(fmt, geometry, x.dtype)
    shape = tuple(x.shape)
    nd = len(shape)
    want_axis = -1 if geometry is Geometry.BLOCK else -2
    if not isinstance(axis, int) or isinstance(axis, bool) or not -nd <= axis < nd:
        raise ValueError(f"axis={axis!r} is out of range for x of shape {shape}")
    if axis - nd * (axis >= 0) != want_axis:
        raise ValueError(
            f"axis={axis}: the {geometry.name} kernel quantizes along axis "
            f"{want_axis}; move that axis there first"
        )
    blocks.block_extents(shape, fmt, geometry, axis)  # the emulator's divisibility errors
    if pack is None:
        pack = fmt.elem is E2M1
    if not isinstance(pack, bool) or (pack and fmt.elem is not E2M1):
        raise ValueError(f"pack={pack!r}: only FP4 codes can be packed")
    if config is None:
        config = QuantKernelConfig.for_array(x, fmt, geometry=geometry)
    elif not isinstance(config, QuantKernelConfig):
        raise TypeError(f"config={config!r} must be a QuantKernelConfig or None")
    else:
        want = {"fmt": fmt, "geometry": geometry, "in_dtype": np.dtype(x.dtype)}
        if geometry is Geometry.TOKEN_BLOCK:
            want["head_dim"] = shape[-1]
        wrong = {k: getattr(config, k) for k, v in want.items() if getattr(config, k) != v}
        if wrong:
            raise ValueError(
                f"config has {wrong}; this call needs {want} "
                f"(QuantKernelConfig.for_array(x, fmt, ...) builds one)"
            )
    return _quantize_jit(jnp.asarray(x), global_scale, global_encode_scale, cfg=config, pack=pack)


@functools.partial(jax.jit, static_argnames=("cfg", "pack"))
def _quantize_jit(
    x: Any, global_scale: Any, global_encode_scale: Any, *, cfg: QuantKernelConfig, pack: bool
) -> QuantizedArray:
    import jax.numpy as jnp
    from jax import lax

    fmt = cfg.fmt
    shape = tuple(x.shape)
    words = input_words(x, cfg)
    g_dec = None
    if cfg.kind == "nv":
        if cfg.paired:  # max of the 15 magnitude bits commutes with the exact widening
            top = jnp.max(lax.bitcast_convert_type(x, jnp.uint16) & jnp.uint16(0x7FFF))
            top = top.astype(jnp.uint32)
            amax_bits = (
                top << _U(16)
                if cfg.in_dtype == np.dtype(ml_dtypes.bfloat16)
                else _f16_to_f32_bits(top)
            )
        else:
            amax_bits = jnp.max(words & _U(0x7FFFFFFF))
        params, g_dec = nv_params(amax_bits, fmt, global_scale, global_encode_scale)
    else:  # a constant (an XLA literal: no kernel launch to fill it)
        params = np.zeros((NUM_PARAMS,), np.uint32)
    if cfg.geometry is Geometry.BLOCK:
        rows = x.size // fmt.block_size
        codes, scales = build_kernel(cfg, rows)(words.reshape(rows, cfg.words_per_block), params)
        scale_shape = shape[:-1] + (shape[-1] // fmt.block_size,)
    else:
        rows = x.size // (32 * shape[-1])
        codes, scales = build_kernel(cfg, rows)(
            words.reshape(rows, 32, cfg.words_per_block), params
        )
        scales = scales[:, 0]
        scale_shape = shape[:-2] + (shape[-2] // 32, 1)
    if codes.dtype == jnp.uint16:
        codes = lax.bitcast_convert_type(codes, jnp.uint8)
    if cfg.packs_in_kernel:
        codes = codes.reshape(shape[:-1] + (shape[-1] // 2,))
        q = QuantizedArray(
            codes,
            scales.reshape(scale_shape),
            g_dec,
            fmt,
            cfg.geometry,
            -1 if cfg.geometry is Geometry.BLOCK else -2,
            True,
        )
        return q if pack else q.unpack()
    codes = codes.reshape(shape)
    q = QuantizedArray(
        codes,
        scales.reshape(scale_shape),
        g_dec,
        fmt,
        cfg.geometry,
        -1 if cfg.geometry is Geometry.BLOCK else -2,
        False,
    )
    return q.pack() if pack else q


def swizzled_scales(q: QuantizedArray, layout: Any = None) -> Any:
    """``q``'s scale codes in ``layout`` (default the 128x4 swizzle Blackwell MMAs read)."""
    from fp4sim.formats import layouts

    if not isinstance(q, QuantizedArray):
        raise TypeError(f"q={q!r} must be a QuantizedArray")
    if layout is None:
        layout = layouts.ScaleLayout.SWIZZLED_128X4
    return layouts.to_layout(q.scales, layout)

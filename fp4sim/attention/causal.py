"""Causal-safe scaling: how each training operand is scaled, and whether that can leak the future.

This module owns :class:`OperandScaling` (the quantization of one token-major training operand:
K, V, dO, or the score gradient dS, described with the block formats of
:mod:`fp4sim.formats.blocks`), its application :func:`fake_quantize`, and the classification
:func:`leak_class` (the causal-safety question of FLAMIA, github.com/yandex-research/flamia-blackwell-attention). Under a causal mask, token i's output may depend
only on tokens ≤ i; any scale shared by tokens i < j lets token j reach token i through the
rounding of token i's elements.

Classes (:class:`LeakClass`), derived from the scaling's *properties* (and checked empirically by
:func:`fp4sim.attention.leak.leak_probe` in the tests):

* ``NONE`` — every scale depends on one token only (per-token scales; blocks along the head
  dimension with no or a per-token/constant FP32 factor; unquantized; a plain cast). The earlier
  rows are bitwise identical whatever a future token does.
* ``SUBNORMAL`` — scales shared across tokens are powers of two chosen by rounding *up*
  (``RCEIL``/``CEIL``: the block max never clamps) and the element format has a wide exponent
  range (E4M3, E5M2). Rounding in a floating-point format is invariant under power-of-two scaling
  except at the ends of its range, so a future token that raises the group max changes only the
  past elements that drop into the element format's *subnormal* range: a tiny leak
  (~1e-7..1e-6 relative).
* ``LARGE`` — shared scales that are not powers of two (UE4M3 block scales, an FP32 per-tensor
  amax factor), power-of-two scales that can clamp (OCP ``FLOOR``, torchao ``EVEN``), or shared
  scales over a narrow element format (E2M1, E2M3, E3M2: ~2-4 binades). Every past element of the
  group may be re-rounded.

Token axis convention: operands are (..., tokens, features); ``axis=-1`` runs along features
(head dimension: one token per group), ``axis=-2`` along tokens. dS is (..., queries, keys): its
rows are the *query* tokens, so a per-row dS scale (``PER_ROW`` along ``axis=-1``) is the
"exact" option of FLAMIA's leak table — each dQ row then depends on its own row of dS only.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import numpy as np

from fp4sim._xp import bitcast, is_jax, namespace
from fp4sim.formats import blocks
from fp4sim.formats.blocks import (
    FP8_E4M3_PER_TENSOR,
    MXFP4,
    MXFP8_E4M3,
    NVFP4,
    NVFP4_SINGLE,
    BlockFormat,
    Geometry,
    GlobalScale,
    QuantizedArray,
    ScaleRule,
)
from fp4sim.formats.spec import E4M3, E5M2

__all__ = [
    "LeakClass",
    "OperandScaling",
    "fake_quantize",
    "fake_quantize_stats",
    "fake_quantize_segmented",
    "fake_quantize_segmented_stats",
    "token_group_length",
    "quantize_operand",
    "leak_class",
    "FP8_PER_TENSOR_QK",
    "V_SCALINGS",
    "shares_scales_across_tokens",
    "FLOAT32",
    "E5M2_CAST",
    "E4M3_CAST",
    "PER_TOKEN_POW2",
    "TOKEN_BLOCK_POW2",
    "MXFP8_TOKENS_RCEIL",
    "MXFP8_TOKENS_FLOOR",
    "MXFP4_TOKENS_RCEIL",
    "NVFP4_TOKENS",
    "FP8_PER_TENSOR_AMAX",
    "PER_TENSOR_POW2",
    "NVFP4_HEAD_DIM",
    "NVFP4_HEAD_DIM_PER_TENSOR",
    "NVFP4_HEAD_DIM_PER_TOKEN",
    "MXFP8_HEAD_DIM",
    "DS_SQUARE_RCEIL",
    "DS_SQUARE_FLOOR",
    "DS_PER_ROW",
    "V_OPTIONS",
]


class LeakClass(enum.Enum):
    """How far a future token can reach an earlier token's output (see the module docstring)."""

    NONE = "none"  # bitwise zero
    SUBNORMAL = "subnormal"  # tiny: only past elements in the element format's subnormal range
    LARGE = "large"  # any past element of a shared group may be re-rounded


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class OperandScaling:
    """How one token-major operand is quantized: ``fmt`` (``None`` = float32, unquantized),
    ``geometry`` and ``axis`` as in :func:`fp4sim.formats.blocks.quantize`, ``rule`` overriding
    ``fmt.rule`` (``None`` keeps it). ``name`` labels tables and reports.

    Hashable: usable as a static ``jax.jit`` argument.
    """

    name: str
    fmt: BlockFormat | None = None
    geometry: Geometry = Geometry.BLOCK
    axis: int = -1
    rule: ScaleRule | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"OperandScaling.name={self.name!r} must be a non-empty str")
        if self.fmt is not None and not isinstance(self.fmt, BlockFormat):
            raise TypeError(f"OperandScaling.fmt={self.fmt!r} must be a BlockFormat or None")
        if not isinstance(self.geometry, Geometry):
            raise TypeError(f"OperandScaling.geometry={self.geometry!r} must be a Geometry; "
                            f"allowed: {[g.name for g in Geometry]}")
        if self.axis not in (-1, -2):
            raise ValueError(f"OperandScaling.axis={self.axis!r} must be -1 (features / keys) or "
                             f"-2 (tokens / queries)")
        if self.rule is not None:
            if not isinstance(self.rule, ScaleRule):
                raise TypeError(f"OperandScaling.rule={self.rule!r} must be a ScaleRule or None")
            if self.fmt is not None:
                self.fmt.replace(rule=self.rule)  # validates the rule for the scale format
        if self.fmt is not None and self.fmt.global_scale is GlobalScale.CONSTANT:
            raise ValueError(f"OperandScaling.fmt={self.fmt.name} has a CONSTANT FP32 factor; "
                             f"use GlobalScale.NONE (constant 1) for training operands")

    @property
    def effective_format(self) -> BlockFormat | None:
        """``fmt`` with ``rule`` applied."""
        if self.fmt is None or self.rule is None:
            return self.fmt
        return self.fmt.replace(rule=self.rule)

    def __repr__(self) -> str:
        return self.name


def _block_axes(scaling: OperandScaling) -> tuple[int, ...]:
    """Axes along which ``scaling`` cuts fixed-size blocks (that may need zero padding)."""
    g = scaling.geometry
    if g is Geometry.BLOCK:
        return (scaling.axis,)
    if g is Geometry.TOKEN_BLOCK:
        return (-2,)
    if g is Geometry.SQUARE:
        return (-2, -1)
    return ()


def quantize_operand(x: Any, scaling: OperandScaling) -> QuantizedArray | None:
    """The :class:`QuantizedArray` of ``x`` under ``scaling`` (``None`` when unquantized).

    A partial trailing block is zero padded first (zeros never raise a block's max, so the
    other elements quantize as they would in a whole block — cuDNN's rule for partial dS tiles);
    the result then covers the padded shape."""
    if not isinstance(scaling, OperandScaling):
        raise TypeError(f"scaling={scaling!r} must be an OperandScaling")
    if scaling.fmt is None:
        return None
    return blocks.quantize(_pad_to_blocks(x, scaling), scaling.fmt, axis=scaling.axis,
                           geometry=scaling.geometry, rule=scaling.rule)


def _pad_to_blocks(x: Any, scaling: OperandScaling) -> Any:
    """``x`` zero padded to whole blocks of ``scaling`` (see :func:`quantize_operand`)."""
    xp = namespace(x)
    bs = scaling.fmt.block_size
    widths = [(0, 0)] * x.ndim
    for a in _block_axes(scaling):
        widths[a] = (0, -x.shape[a] % bs)
    if any(w[1] for w in widths):
        x = xp.pad(x, widths)
    return x


def fake_quantize(x: Any, scaling: OperandScaling) -> Any:
    """``dequantize(quantize(x))`` as float32 (``x`` as float32 when unquantized)."""
    q = quantize_operand(x, scaling)
    if q is None:
        return x.astype("float32")
    y = blocks.dequantize(q)
    if y.shape != x.shape:
        y = y[tuple(slice(0, n) for n in x.shape)]
    return y


def fake_quantize_stats(x: Any, scaling: OperandScaling) -> tuple[Any, Any]:
    """``(fake_quantize(x, scaling), stats)``: the same float32 values and
    :class:`~fp4sim.attention._ordered.OperandStats` *bounds* for the backward's ordered
    products. For power-of-two block scales without an FP32 factor, and for plain casts,
    under a saturating element encoder, the bounds come from the quantizer's block exponents
    and block max-abs (:func:`fp4sim.attention._ordered.quantized_stats`, no pass over the
    dequantized elements); otherwise they are :func:`~fp4sim.attention._ordered.operand_stats`
    of the result. Either way ``plain_sum_is_exact`` of the bounds implies it of the true
    statistics (proof there)."""
    from fp4sim.attention._ordered import operand_stats, quantized_stats
    from fp4sim.formats.spec import Overflow

    if not isinstance(scaling, OperandScaling):
        raise TypeError(f"scaling={scaling!r} must be an OperandScaling")
    fmt = scaling.effective_format
    xp = namespace(x)
    saturating = fmt is not None and \
        blocks.element_policy(fmt).overflow is Overflow.SATURATE
    if saturating and fmt.scale is None and fmt.global_scale is GlobalScale.NONE:
        # a plain cast: c = encode(x), y = decode(c), one "block" with exponent 0
        y = fake_quantize(x, scaling)
        bits = xp.asarray(x, dtype=np.float32)
        nonfinite = blocks.tensor_amax_bits(xp, bitcast(bits, np.uint32)) >= np.uint32(0x7F800000)
        return y, quantized_stats(xp.zeros((), np.int32), True, nonfinite, fmt.elem)
    if not (saturating and fmt.pow2 and fmt.global_scale is GlobalScale.NONE):
        y = fake_quantize(x, scaling)
        return y, operand_stats(y)
    q, amax = blocks.quantize_with_block_amax(_pad_to_blocks(x, scaling), scaling.fmt, axis=scaling.axis,
                                              geometry=scaling.geometry, rule=scaling.rule)
    y = blocks.dequantize(q)
    if y.shape != x.shape:
        y = y[tuple(slice(0, n) for n in x.shape)]
    nonfinite = xp.max(amax) >= np.uint32(0x7F800000)
    return y, quantized_stats(q.scales.astype(np.int32) - 127, amax != 0, nonfinite, fmt.elem)


def token_group_length(scaling: OperandScaling, n_tokens: int) -> int:
    """How many consecutive rows (tokens) one scale group spans (1 when none are shared)."""
    if not shares_scales_across_tokens(scaling):
        return 1
    fmt = scaling.fmt
    assert fmt is not None
    if fmt.global_scale is not GlobalScale.NONE or scaling.geometry is Geometry.PER_TENSOR or (
            scaling.geometry is Geometry.PER_ROW and scaling.axis == -2):
        return n_tokens
    return fmt.block_size


def _segment_ranks(xp: Any, segment_ids: Any, group: int) -> Any:
    """Per row, which document of its row group it belongs to: 0 for the group's first document,
    +1 at every change of segment id inside the group (documents are contiguous runs)."""
    n = segment_ids.shape[-1]
    change = (segment_ids[..., 1:] != segment_ids[..., :-1]).astype(np.int32)
    change = xp.concatenate([xp.zeros(change.shape[:-1] + (1,), np.int32), change], axis=-1)
    start = (xp.arange(n) % group) == 0
    change = xp.where(start, 0, change)
    pad = -n % group  # a partial trailing group (zero padded by the quantizer)
    if pad:
        change = xp.pad(change, [(0, 0)] * (change.ndim - 1) + [(0, pad)])
    blocked = xp.reshape(change, change.shape[:-1] + ((n + pad) // group, group))
    return xp.reshape(xp.cumsum(blocked, axis=-1), change.shape)[..., :n]


def fake_quantize_segmented(x: Any, scaling: OperandScaling, segment_ids: Any) -> Any:
    """:func:`fake_quantize` whose token-spanning scale groups never straddle a document.

    ``x`` is (..., tokens, features) and ``segment_ids`` (..., tokens) (documents are contiguous
    runs of equal ids). Each scale group along the tokens is split at document boundaries: the
    part of every document is quantized as if the other documents' rows were zero (they cannot
    raise its max), so no document's scale depends on another document. Scalings that share no
    scale across tokens are applied unchanged. Cost: one quantization per document rank inside
    a group (the number of distinct documents of the busiest group on NumPy; under jax, where
    the ids may be traced, the group length, batched into one vmapped call).
    """
    n = x.shape[-2]
    group = token_group_length(scaling, n)
    if segment_ids is None or group == 1:
        return fake_quantize(x, scaling)
    xp = namespace(x, segment_ids)
    if segment_ids.shape[-1] != n:
        raise ValueError(f"segment_ids.shape={segment_ids.shape} must end in the token count {n} "
                         f"of x.shape={x.shape}")
    ranks = _segment_ranks(xp, segment_ids, group)[..., :, None]
    n_ranks = group if is_jax(segment_ids) else int(np.max(ranks)) + 1
    zero = xp.zeros((), x.dtype)
    if is_jax(segment_ids) or is_jax(x):
        import jax

        # all document ranks in one vmapped quantization (each rank its own tensor)
        sel = ranks[None] == xp.arange(n_ranks).reshape((n_ranks,) + (1,) * ranks.ndim)
        pieces = jax.vmap(lambda xi: fake_quantize(xi, scaling))(xp.where(sel, x[None], zero))
    else:
        pieces = xp.stack([fake_quantize(xp.where(ranks == r, x, zero), scaling)
                           for r in range(n_ranks)])
    index = xp.broadcast_to(ranks, x.shape)[None]
    return xp.take_along_axis(pieces, index, axis=0)[0]


def fake_quantize_segmented_stats(x: Any, scaling: OperandScaling,
                                  segment_ids: Any) -> tuple[Any, Any]:
    """``(fake_quantize_segmented(x, scaling, segment_ids), stats)`` with the statistics bounds
    of :func:`fake_quantize_stats` where no scale group spans tokens (the plain quantizer
    runs), else :func:`~fp4sim.attention._ordered.operand_stats` of the result."""
    from fp4sim.attention._ordered import operand_stats

    if segment_ids is None or token_group_length(scaling, x.shape[-2]) == 1:
        return fake_quantize_stats(x, scaling)
    y = fake_quantize_segmented(x, scaling, segment_ids)
    return y, operand_stats(y)


def shares_scales_across_tokens(scaling: OperandScaling) -> bool:
    """True when some scale (block scale or FP32 factor) covers more than one token (row)."""
    fmt = scaling.fmt
    if fmt is None:
        return False
    g = scaling.geometry
    block_spans_rows = (
        (g is Geometry.BLOCK and scaling.axis == -2 and fmt.block_size > 1)
        or (g is Geometry.PER_ROW and scaling.axis == -2)
        or g in (Geometry.PER_TENSOR, Geometry.TOKEN_BLOCK, Geometry.SQUARE)
    )
    has_block_scale = fmt.scale is not None
    global_spans_rows = (fmt.global_scale is GlobalScale.PER_TENSOR
                         or (fmt.global_scale is GlobalScale.PER_ROW and scaling.axis == -2))
    return (has_block_scale and block_spans_rows) or global_spans_rows


def leak_class(scaling: OperandScaling) -> LeakClass:
    """The :class:`LeakClass` of a causal training operand quantized with ``scaling``."""
    if not isinstance(scaling, OperandScaling):
        raise TypeError(f"scaling={scaling!r} must be an OperandScaling")
    if not shares_scales_across_tokens(scaling):
        return LeakClass.NONE
    fmt = scaling.effective_format
    assert fmt is not None
    if fmt.global_scale is not GlobalScale.NONE:
        return LeakClass.LARGE  # an FP32 amax factor is not a power of two
    wide = fmt.elem.ebits >= 4  # E4M3, E5M2: ~17+ binades; E2M1/E2M3/E3M2 only 2-4
    rounds_up = fmt.rule in (ScaleRule.RCEIL, ScaleRule.CEIL)
    if fmt.pow2 and rounds_up and wide:
        return LeakClass.SUBNORMAL
    return LeakClass.LARGE


# --- named options ---------------------------------------------------------------------------
_E5M2_PLAIN = BlockFormat(name="E5M2", elem=E5M2, scale=None, block_size=1)
_E4M3_PLAIN = BlockFormat(name="E4M3", elem=E4M3, scale=None, block_size=1)

FLOAT32 = OperandScaling(name="float32")
"""Unquantized float32."""
E5M2_CAST = OperandScaling(name="E5M2 cast", fmt=_E5M2_PLAIN)
"""Plain E5M2 element cast, no scale (the Direct-P route's dO)."""
E4M3_CAST = OperandScaling(name="E4M3 cast", fmt=_E4M3_PLAIN)
"""Plain E4M3 element cast, no scale (HAO's "FP8 PV" V)."""
PER_TOKEN_POW2 = OperandScaling(name="per-token pow2 E4M3", fmt=MXFP8_E4M3,
                                geometry=Geometry.PER_ROW, axis=-1)
"""The "exact option": one power-of-two (UE8M0, RCEIL) scale per token row, E4M3 elements."""
TOKEN_BLOCK_POW2 = OperandScaling(name="token-block 32xD pow2 E4M3", fmt=MXFP8_E4M3,
                                  geometry=Geometry.TOKEN_BLOCK, axis=-2)
"""FLAMIA's token block: one power-of-two exponent per 32 tokens × the whole head dimension."""
MXFP8_TOKENS_RCEIL = OperandScaling(name="MXFP8 32 tokens RCEIL", fmt=MXFP8_E4M3, axis=-2)
"""cuDNN-like V: UE8M0 per 32 tokens of one column, rounded up."""
MXFP8_TOKENS_FLOOR = OperandScaling(name="MXFP8 32 tokens OCP floor", fmt=MXFP8_E4M3, axis=-2,
                                    rule=ScaleRule.FLOOR)
"""OCP floor exponent with the clamp at 448, per 32 tokens of one column."""
MXFP4_TOKENS_RCEIL = OperandScaling(name="MXFP4 32 tokens RCEIL", fmt=MXFP4, axis=-2)
"""E2M1 elements, UE8M0 per 32 tokens of one column (rounded up: OCP MX with the RCEIL rule).
Not the forward's ``VFormat.MXFP4_TOKENS``, Direct-P's amplitude rule (β·q/6)."""
NVFP4_TOKENS = OperandScaling(name="NVFP4 16 tokens", fmt=NVFP4_SINGLE, axis=-2)
"""E2M1 elements, UE4M3 scale per 16 tokens of one column (no FP32 factor)."""
FP8_PER_TENSOR_AMAX = OperandScaling(name="FP8 per-tensor amax/448", fmt=FP8_E4M3_PER_TENSOR,
                                     geometry=Geometry.PER_TENSOR)
"""E4M3 with one FP32 factor amax/448 over the whole tensor (not a power of two)."""
PER_TENSOR_POW2 = OperandScaling(name="per-tensor pow2 E4M3", fmt=MXFP8_E4M3,
                                 geometry=Geometry.PER_TENSOR)
"""E4M3 with one power-of-two (RCEIL) scale over the whole tensor."""

NVFP4_HEAD_DIM = OperandScaling(name="NVFP4 along head dim", fmt=NVFP4_SINGLE, axis=-1)
"""Q/K: E2M1 per 16 along the head dimension, UE4M3 scales, no FP32 factor (per token)."""
NVFP4_HEAD_DIM_PER_TENSOR = OperandScaling(name="NVFP4 along head dim, per-tensor FP32 factor",
                                           fmt=NVFP4, axis=-1)
"""Q/K NVFP4 with the per-tensor FP32 amax factor: leaks the future under a causal mask."""
NVFP4_HEAD_DIM_PER_TOKEN = OperandScaling(name="NVFP4 along head dim, per-token FP32 factor",
                                          fmt=NVFP4.replace(global_scale=GlobalScale.PER_ROW),
                                          axis=-1)
"""Q/K NVFP4 with a per-token FP32 factor (amax over each token's row): causal-safe."""
MXFP8_HEAD_DIM = OperandScaling(name="MXFP8 along head dim", fmt=MXFP8_E4M3, axis=-1)
"""E4M3, UE8M0 per 32 along the head dimension (per token)."""

DS_SQUARE_RCEIL = OperandScaling(name="dS 32x32 pow2 RCEIL", fmt=MXFP8_E4M3,
                                 geometry=Geometry.SQUARE)
"""dS in E4M3 with one UE8M0 (rounded up) per 32×32 (query × key) tile: one copy for dQ and dK."""
DS_SQUARE_FLOOR = OperandScaling(name="dS 32x32 pow2 OCP floor", fmt=MXFP8_E4M3,
                                 geometry=Geometry.SQUARE, rule=ScaleRule.FLOOR)
"""dS 32×32 tiles with the OCP floor exponent (clamps)."""
DS_PER_ROW = OperandScaling(name="dS per query row pow2", fmt=MXFP8_E4M3,
                            geometry=Geometry.PER_ROW, axis=-1)
"""The "exact" dS option: one power-of-two exponent per query row (dQ row i sees only row i)."""

V_OPTIONS: tuple[OperandScaling, ...] = (
    FLOAT32, E4M3_CAST, PER_TOKEN_POW2, TOKEN_BLOCK_POW2, MXFP8_TOKENS_RCEIL, MXFP8_TOKENS_FLOOR,
    MXFP4_TOKENS_RCEIL, NVFP4_TOKENS, FP8_PER_TENSOR_AMAX, PER_TENSOR_POW2,
)
"""The V scalings of the leak table (FLAMIA), safest first."""


FP8_PER_TENSOR_QK = OperandScaling(name="FP8 per-tensor amax/448 (Q/K)", fmt=FP8_E4M3_PER_TENSOR)
"""Q/K as ``QKFormat.FP8_PER_TENSOR``: E4M3 with one FP32 factor amax/448 over the tensor."""
V_SCALINGS: dict[str, OperandScaling] = {
    "FP8": E4M3_CAST, "MXFP8_TOKENS": MXFP8_TOKENS_RCEIL, "NVFP4_TOKENS": NVFP4_TOKENS,
    "TOKEN_BLOCK_FP8": TOKEN_BLOCK_POW2}
"""The scaling of each blocked ``VFormat`` member (by name); see
:attr:`fp4sim.attention.recipe.AttentionRecipe.v_scaling`."""

"""Operand quantization: how every attention operand is quantized, in one vocabulary.

This module owns :class:`OperandScaling` (one operand's quantization: a
:class:`~fp4sim.formats.blocks.BlockFormat` with the geometry and axis of its scale groups, or
``None`` for float32), the named scalings of the forward's and the training path's operands
(Q/K along the head dimension, V along tokens, dO, P and dS of the backward), and their one
application :func:`quantize_operand` (and :func:`fake_quantize`, :func:`fake_quantize_stats`:
the dequantized float32 values, with bounds for the backward's ordered sums). Every
block-quantized operand of the emulators goes through :func:`quantize_operand`: the forward's
Q, K and V (:func:`fp4sim.attention.forward.quantize_qk` and
:func:`~fp4sim.attention.forward.quantize_v` quantize with the recipe's declared
:attr:`~fp4sim.attention.recipe.AttentionRecipe.qk_scaling` /
:attr:`~fp4sim.attention.recipe.AttentionRecipe.v_scaling` and build the tensor core's view of
the result), the backward's dO, P and dS (:mod:`fp4sim.attention.backward`), the training
path's V (:mod:`fp4sim.attention.autodiff`, the training study), and the Direct-P kernel's
operands (through ``quantize_qk``/``quantize_v``).

Whether a scaling can leak the future under a causal mask, and the document-aligned variant
for packed sequences, are :mod:`fp4sim.attention.causal`'s.

Token axis convention: operands are (..., tokens, features); ``axis=-1`` runs along features
(head dimension: one token per group), ``axis=-2`` along tokens. dS is (..., queries, keys).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from fp4sim._xp import Array, bitcast, namespace
from fp4sim.formats import blocks
from fp4sim.formats.blocks import (
    FP8_E4M3_PER_TENSOR,
    MXFP4,
    MXFP4_AMPLITUDE,
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
    "OperandScaling",
    "quantize_operand",
    "fake_quantize",
    "fake_quantize_stats",
    "FLOAT32",
    "BF16_CAST",
    "E5M2_CAST",
    "E4M3_CAST",
    "PER_TOKEN_POW2",
    "TOKEN_BLOCK_POW2",
    "MXFP8_TOKENS_RCEIL",
    "MXFP8_TOKENS_FLOOR",
    "MXFP4_TOKENS_RCEIL",
    "DIRECT_P_V",
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
    "FP8_PER_TENSOR_QK",
    "V_SCALINGS",
]


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
            raise TypeError(
                f"OperandScaling.geometry={self.geometry!r} must be a Geometry; "
                f"allowed: {[g.name for g in Geometry]}"
            )
        if self.axis not in (-1, -2):
            raise ValueError(
                f"OperandScaling.axis={self.axis!r} must be -1 (features / keys) or "
                f"-2 (tokens / queries)"
            )
        if self.rule is not None:
            if not isinstance(self.rule, ScaleRule):
                raise TypeError(f"OperandScaling.rule={self.rule!r} must be a ScaleRule or None")
            if self.fmt is not None:
                self.fmt.replace(rule=self.rule)  # validates the rule for the scale format
        if self.fmt is not None and self.fmt.global_scale is GlobalScale.CONSTANT:
            raise ValueError(
                f"OperandScaling.fmt={self.fmt.name} has a CONSTANT FP32 factor; "
                f"use GlobalScale.NONE (constant 1) for training operands"
            )

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


def quantize_operand(x: Array, scaling: OperandScaling) -> QuantizedArray | None:
    """The :class:`QuantizedArray` of ``x`` under ``scaling`` (``None`` when unquantized).

    A partial trailing block is zero padded first (zeros never raise a block's max, so the
    other elements quantize as they would in a whole block — cuDNN's rule for partial dS tiles);
    the result then covers the padded shape."""
    if not isinstance(scaling, OperandScaling):
        raise TypeError(f"scaling={scaling!r} must be an OperandScaling")
    if scaling.fmt is None:
        return None
    return blocks.quantize(
        _pad_to_blocks(x, scaling),
        scaling.fmt,
        axis=scaling.axis,
        geometry=scaling.geometry,
        rule=scaling.rule,
    )


def _pad_to_blocks(x: Array, scaling: OperandScaling) -> Array:
    """``x`` zero padded to whole blocks of ``scaling`` (see :func:`quantize_operand`)."""
    xp = namespace(x)
    bs = scaling.fmt.block_size
    widths = [(0, 0)] * x.ndim
    for a in _block_axes(scaling):
        widths[a] = (0, -x.shape[a] % bs)
    if any(w[1] for w in widths):
        x = xp.pad(x, widths)
    return x


def fake_quantize(x: Array, scaling: OperandScaling) -> Array:
    """``dequantize(quantize(x))`` as float32 (``x`` as float32 when unquantized)."""
    q = quantize_operand(x, scaling)
    if q is None:
        return x.astype("float32")
    y = blocks.dequantize(q)
    if y.shape != x.shape:
        y = y[tuple(slice(0, n) for n in x.shape)]
    return y


def fake_quantize_stats(x: Array, scaling: OperandScaling) -> tuple[Array, Any]:
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
    saturating = fmt is not None and blocks.element_policy(fmt).overflow is Overflow.SATURATE
    if saturating and fmt.scale is None and fmt.global_scale is GlobalScale.NONE:
        # a plain cast: c = encode(x), y = decode(c), one "block" with exponent 0
        y = fake_quantize(x, scaling)
        bits = xp.asarray(x, dtype=np.float32)
        nonfinite = blocks.tensor_amax_bits(xp, bitcast(bits, np.uint32)) >= np.uint32(0x7F800000)
        return y, quantized_stats(xp.zeros((), np.int32), True, nonfinite, fmt.elem)
    if not (
        saturating and fmt.pow2 and fmt.global_scale is GlobalScale.NONE and fmt.divisor == 1.0
    ):  # the bounds assume values code·2^e
        y = fake_quantize(x, scaling)
        return y, operand_stats(y)
    q, amax = blocks.quantize_with_block_amax(
        _pad_to_blocks(x, scaling),
        scaling.fmt,
        axis=scaling.axis,
        geometry=scaling.geometry,
        rule=scaling.rule,
    )
    y = blocks.dequantize(q)
    if y.shape != x.shape:
        y = y[tuple(slice(0, n) for n in x.shape)]
    nonfinite = xp.max(amax) >= np.uint32(0x7F800000)
    return y, quantized_stats(q.scales.astype(np.int32) - 127, amax != 0, nonfinite, fmt.elem)


# --- named scalings -------------------------------------------------------------------------
_E5M2_PLAIN = BlockFormat(name="E5M2", elem=E5M2, scale=None, block_size=1)
_E4M3_PLAIN = BlockFormat(name="E4M3", elem=E4M3, scale=None, block_size=1)

FLOAT32 = OperandScaling(name="float32")
"""Unquantized float32."""
BF16_CAST = OperandScaling(name="BF16 cast")
"""BF16 rounding of every element (no scale; the forward rounds with
:func:`fp4sim.formats.codec.bf16_round`)."""
E5M2_CAST = OperandScaling(name="E5M2 cast", fmt=_E5M2_PLAIN)
"""Plain E5M2 element cast, no scale (the Direct-P route's dO)."""
E4M3_CAST = OperandScaling(name="E4M3 cast", fmt=_E4M3_PLAIN)
"""Plain E4M3 element cast, no scale (HAO's "FP8 PV" V)."""
PER_TOKEN_POW2 = OperandScaling(
    name="per-token pow2 E4M3", fmt=MXFP8_E4M3, geometry=Geometry.PER_ROW, axis=-1
)
"""The "exact option": one power-of-two (UE8M0, RCEIL) scale per token row, E4M3 elements."""
TOKEN_BLOCK_POW2 = OperandScaling(
    name="token-block 32xD pow2 E4M3", fmt=MXFP8_E4M3, geometry=Geometry.TOKEN_BLOCK, axis=-2
)
"""FLAMIA's token block: one power-of-two exponent per 32 tokens × the whole head dimension."""
MXFP8_TOKENS_RCEIL = OperandScaling(name="MXFP8 32 tokens RCEIL", fmt=MXFP8_E4M3, axis=-2)
"""cuDNN-like V: UE8M0 per 32 tokens of one column, rounded up."""
MXFP8_TOKENS_FLOOR = OperandScaling(
    name="MXFP8 32 tokens OCP floor", fmt=MXFP8_E4M3, axis=-2, rule=ScaleRule.FLOOR
)
"""OCP floor exponent with the clamp at 448, per 32 tokens of one column."""
MXFP4_TOKENS_RCEIL = OperandScaling(name="MXFP4 32 tokens RCEIL", fmt=MXFP4, axis=-2)
"""E2M1 elements, UE8M0 per 32 tokens of one column (rounded up: OCP MX with the RCEIL rule).
Not the forward's ``VFormat.MXFP4_TOKENS``, Direct-P's amplitude rule (:data:`DIRECT_P_V`)."""
DIRECT_P_V = OperandScaling(name="Direct-P V 32 tokens β·q/6", fmt=MXFP4_AMPLITUDE, axis=-2)
"""Direct-P's V (the forward's ``VFormat.MXFP4_TOKENS``): E2M1 per 32 tokens of one column with
the amplitude β = 2^ceil(log2 amax) as UE8M0 scale, value β·q/6 (``ScaleRule.AMPLITUDE``)."""
NVFP4_TOKENS = OperandScaling(name="NVFP4 16 tokens", fmt=NVFP4_SINGLE, axis=-2)
"""E2M1 elements, UE4M3 scale per 16 tokens of one column (no FP32 factor)."""
FP8_PER_TENSOR_AMAX = OperandScaling(
    name="FP8 per-tensor amax/448", fmt=FP8_E4M3_PER_TENSOR, geometry=Geometry.PER_TENSOR
)
"""E4M3 with one FP32 factor amax/448 over the whole tensor (not a power of two)."""
PER_TENSOR_POW2 = OperandScaling(
    name="per-tensor pow2 E4M3", fmt=MXFP8_E4M3, geometry=Geometry.PER_TENSOR
)
"""E4M3 with one power-of-two (RCEIL) scale over the whole tensor."""

NVFP4_HEAD_DIM = OperandScaling(name="NVFP4 along head dim", fmt=NVFP4_SINGLE, axis=-1)
"""Q/K: E2M1 per 16 along the head dimension, UE4M3 scales, no FP32 factor (per token)."""
NVFP4_HEAD_DIM_PER_TENSOR = OperandScaling(
    name="NVFP4 along head dim, per-tensor FP32 factor", fmt=NVFP4, axis=-1
)
"""Q/K NVFP4 with the per-tensor FP32 amax factor: leaks the future under a causal mask."""
NVFP4_HEAD_DIM_PER_TOKEN = OperandScaling(
    name="NVFP4 along head dim, per-token FP32 factor",
    fmt=NVFP4.replace(global_scale=GlobalScale.PER_ROW),
    axis=-1,
)
"""Q/K NVFP4 with a per-token FP32 factor (amax over each token's row): causal-safe."""
MXFP8_HEAD_DIM = OperandScaling(name="MXFP8 along head dim", fmt=MXFP8_E4M3, axis=-1)
"""E4M3, UE8M0 per 32 along the head dimension (per token)."""

DS_SQUARE_RCEIL = OperandScaling(
    name="dS 32x32 pow2 RCEIL", fmt=MXFP8_E4M3, geometry=Geometry.SQUARE
)
"""dS in E4M3 with one UE8M0 (rounded up) per 32×32 (query × key) tile: one copy for dQ and dK."""
DS_SQUARE_FLOOR = OperandScaling(
    name="dS 32x32 pow2 OCP floor", fmt=MXFP8_E4M3, geometry=Geometry.SQUARE, rule=ScaleRule.FLOOR
)
"""dS 32×32 tiles with the OCP floor exponent (clamps)."""
DS_PER_ROW = OperandScaling(
    name="dS per query row pow2", fmt=MXFP8_E4M3, geometry=Geometry.PER_ROW, axis=-1
)
"""The "exact" dS option: one power-of-two exponent per query row (dQ row i sees only row i)."""

FP8_PER_TENSOR_QK = OperandScaling(name="FP8 per-tensor amax/448 (Q/K)", fmt=FP8_E4M3_PER_TENSOR)
"""Q/K as ``QKFormat.FP8_PER_TENSOR``: E4M3 with one FP32 factor amax/448 over the tensor."""
V_SCALINGS: dict[str, OperandScaling] = {
    "FP8": E4M3_CAST,
    "MXFP8_TOKENS": MXFP8_TOKENS_RCEIL,
    "MXFP4_TOKENS": DIRECT_P_V,
    "NVFP4_TOKENS": NVFP4_TOKENS,
    "TOKEN_BLOCK_FP8": TOKEN_BLOCK_POW2,
}
"""The scaling of each blocked ``VFormat`` member (by name); see
:attr:`fp4sim.attention.recipe.AttentionRecipe.v_scaling`."""

"""Causal-safe scaling: whether an operand's quantization can leak the future, and the fix.

This module owns the classification :func:`leak_class` (the causal-safety question of FLAMIA,
github.com/yandex-research/flamia-blackwell-attention) of an
:class:`~fp4sim.attention.operands.OperandScaling` (the vocabulary and its application are
:mod:`fp4sim.attention.operands`'), the properties it follows from
(:func:`shares_scales_across_tokens`, :func:`token_group_length`), the leak table's V options
(:data:`V_OPTIONS`), and the document-aligned quantization of packed sequences
(:func:`fake_quantize_segmented`). Under a causal mask, token i's output may depend
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

import enum
from types import ModuleType
from typing import Any

import numpy as np

from fp4sim._checks import as_f32, check_static
from fp4sim._xp import Array, adopt, is_jax, namespace
from fp4sim.attention.operands import (
    E4M3_CAST,
    FLOAT32,
    FP8_PER_TENSOR_AMAX,
    MXFP4_TOKENS_RCEIL,
    MXFP8_TOKENS_FLOOR,
    MXFP8_TOKENS_RCEIL,
    NVFP4_TOKENS,
    PER_TENSOR_POW2,
    PER_TOKEN_POW2,
    TOKEN_BLOCK_POW2,
    OperandScaling,
    fake_quantize,
    fake_quantize_stats,
)
from fp4sim.formats.blocks import Geometry, GlobalScale, ScaleRule

__all__ = [
    "LeakClass",
    "leak_class",
    "shares_scales_across_tokens",
    "token_group_length",
    "fake_quantize_segmented",
    "fake_quantize_segmented_stats",
    "V_OPTIONS",
]


class LeakClass(enum.Enum):
    """How far a future token can reach an earlier token's output (see the module docstring)."""

    NONE = "none"  # bitwise zero
    SUBNORMAL = "subnormal"  # tiny: only past elements in the element format's subnormal range
    LARGE = "large"  # any past element of a shared group may be re-rounded


def token_group_length(scaling: OperandScaling, n_tokens: int) -> int:
    """How many consecutive rows (tokens) one scale group spans (1 when none are shared)."""
    if not shares_scales_across_tokens(scaling):
        return 1
    fmt = scaling.fmt
    assert fmt is not None
    if (
        fmt.global_scale is not GlobalScale.NONE
        or scaling.geometry is Geometry.PER_TENSOR
        or (scaling.geometry is Geometry.PER_ROW and scaling.axis == -2)
    ):
        return n_tokens
    return fmt.block_size


def _segment_ranks(xp: ModuleType, segment_ids: Array, group: int) -> Array:
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


def fake_quantize_segmented(x: Array, scaling: OperandScaling, segment_ids: Array | None) -> Array:
    """:func:`fake_quantize` whose token-spanning scale groups never straddle a document.

    ``x`` is (..., tokens, features) and ``segment_ids`` (..., tokens) (documents are contiguous
    runs of equal ids). Each scale group along the tokens is split at document boundaries: the
    part of every document is quantized as if the other documents' rows were zero (they cannot
    raise its max), so no document's scale depends on another document. Scalings that share no
    scale across tokens are applied unchanged. Cost: one quantization per document rank inside
    a group (the number of distinct documents of the busiest group on NumPy; under jax, where
    the ids may be traced, the group length, batched into one vmapped call).
    """
    check_static("scaling", scaling, OperandScaling, "fp4sim.attention.operands.PER_TOKEN_POW2")
    x = as_f32("x", x, namespace(x, segment_ids))
    if x.ndim < 2:
        raise ValueError(f"x has shape {tuple(x.shape)}; it must be (..., tokens, features)")
    if segment_ids is not None:
        segment_ids = namespace(x, segment_ids).asarray(adopt(segment_ids, "segment_ids"))
        if np.dtype(segment_ids.dtype).kind not in "iu":
            raise TypeError(f"segment_ids has dtype {segment_ids.dtype}; allowed: integers")
    n = x.shape[-2]
    group = token_group_length(scaling, n)
    if segment_ids is None or group == 1:
        return fake_quantize(x, scaling)
    xp = namespace(x, segment_ids)
    if segment_ids.shape[-1] != n:
        raise ValueError(
            f"segment_ids.shape={segment_ids.shape} must end in the token count {n} "
            f"of x.shape={x.shape}"
        )
    ranks = _segment_ranks(xp, segment_ids, group)[..., :, None]
    n_ranks = group if is_jax(segment_ids) else int(np.max(ranks)) + 1
    zero = xp.zeros((), x.dtype)
    if is_jax(segment_ids) or is_jax(x):
        import jax

        # all document ranks in one vmapped quantization (each rank its own tensor)
        sel = ranks[None] == xp.arange(n_ranks).reshape((n_ranks,) + (1,) * ranks.ndim)
        pieces = jax.vmap(lambda xi: fake_quantize(xi, scaling))(xp.where(sel, x[None], zero))
    else:
        pieces = xp.stack(
            [fake_quantize(xp.where(ranks == r, x, zero), scaling) for r in range(n_ranks)]
        )
    index = xp.broadcast_to(ranks, x.shape)[None]
    return xp.take_along_axis(pieces, index, axis=0)[0]


def fake_quantize_segmented_stats(
    x: Array, scaling: OperandScaling, segment_ids: Array | None
) -> tuple[Array, Any]:
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
    global_spans_rows = fmt.global_scale is GlobalScale.PER_TENSOR or (
        fmt.global_scale is GlobalScale.PER_ROW and scaling.axis == -2
    )
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


# --- the leak table ---------------------------------------------------------------------------
V_OPTIONS: tuple[OperandScaling, ...] = (
    FLOAT32,
    E4M3_CAST,
    PER_TOKEN_POW2,
    TOKEN_BLOCK_POW2,
    MXFP8_TOKENS_RCEIL,
    MXFP8_TOKENS_FLOOR,
    MXFP4_TOKENS_RCEIL,
    NVFP4_TOKENS,
    FP8_PER_TENSOR_AMAX,
    PER_TENSOR_POW2,
)
"""The V scalings of the leak table (FLAMIA), safest first."""

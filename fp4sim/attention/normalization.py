"""Represented-weight normalization: exact, consistent and mismatched softmax denominators.

Hardware-Aware FP4 FlashAttention-4 (arXiv:2609.04105). With exact weights ``w_j``, represented weights ``w̃_j`` (what the
tensor core multiplies) and values ``v_j``:

* exact:       ``O = Σ w_j v_j / Σ w_j``
* consistent:  ``O = Σ w̃_j v_j / Σ w̃_j`` (Direct-P; a convex combination: constant V exact)
* mismatched:  ``O = Σ w̃_j v_j / Σ w_j`` (HAO, SageAttention3, Attn-QAT, cuDNN's reference)

:func:`normalize` evaluates the three on given weights (NumPy, float64 or float32), the worked
two-key examples of the Direct-P discussion are tests of it.

The Direct-P payload convention represents a P weight as ``α_B·q_j/6`` (``α_B = 2^{k_B}``, E2M1
payload ``q_j``); with V in MXFP4 under the same convention, ``ṽ = β·v/6``, the tensor core
returns ``A = Σ_B α_B β Σ_j q_j v_j`` and the true represented product is ``A/36`` (``A/6``
when V has no /6). The consistent normalizer is built from the same payloads and scales:
``L = Σ_B α_B·(Σ_{j∈B} q_j)/6``. Its float32 evaluation order matters under flush-to-zero
see :class:`NormalizerOrder` and :func:`block_denominator`:

* ``PAYLOAD_SUM_FIRST`` (the safe order, used by the forward): ``fl(fl(Σq / 6) · α)``
* ``SCALE_FIRST``: ``fl(fl(α / 6) · Σq)`` — ``α/6`` is subnormal (flushed) for α = 2^-126
* ``PER_ELEMENT``: ``Σ_j fl(fl(α · q_j) / 6)`` — every ``α·q_j`` below 2^-126 is flushed

Golden: α = 2^-126, sixteen payloads 0.5 → PER_ELEMENT 0, PAYLOAD_SUM_FIRST
``(8/6)·2^-126 = 1.5673258e-38``.
"""

from __future__ import annotations

import enum
from typing import Any, NamedTuple

import numpy as np

from fp4sim._checks import as_f32, check_real
from fp4sim._xp import Array, namespace
from fp4sim.attention.recipe import Normalization
from fp4sim.formats import f32

__all__ = ["NormalizerOrder", "Normalized", "normalize", "block_denominator", "represented_output"]


class NormalizerOrder(enum.Enum):
    """float32 evaluation order of one block's consistent denominator ``α·(Σq)/div``."""

    PAYLOAD_SUM_FIRST = "payload_sum_first"
    SCALE_FIRST = "scale_first"
    PER_ELEMENT = "per_element"


class Normalized(NamedTuple):
    out: Any  # the normalized output
    numerator: Array
    denominator: Array


def normalize(
    weights: Array,
    represented: Array,
    values: Array,
    normalization: Normalization,
    *,
    axis: int = -1,
) -> Normalized:
    """Attention output of ``values`` under ``normalization`` along ``axis`` (the key axis).

    ``weights`` are the exact unnormalized weights, ``represented`` what the PV product
    consumes; ``values`` broadcast against them. Plain array arithmetic in the dtype given
    (use float64 for the exact worked examples)."""
    if not isinstance(normalization, Normalization):
        raise TypeError(
            f"normalization={normalization!r} must be a Normalization member; "
            f"allowed: {[m.name for m in Normalization]}"
        )
    xp = namespace(weights, represented, values)
    w, r, v = (xp.asarray(a) for a in (weights, represented, values))
    if w.shape != r.shape:
        raise ValueError(
            f"weights has shape {w.shape} but represented has shape {r.shape}; they must match"
        )
    num_w = w if normalization is Normalization.EXACT else r
    den_w = r if normalization is Normalization.CONSISTENT else w
    num = xp.sum(num_w * v, axis=axis)
    den = xp.sum(den_w, axis=axis)
    return Normalized(num / den, num, den)


def block_denominator(
    payload_sum: Array,
    exps: Array,
    div: float,
    order: NormalizerOrder = NormalizerOrder.PAYLOAD_SUM_FIRST,
    payloads: Array = None,
) -> Any:
    """float32 flushed ``2^exps · payload_sum / div`` of each block in the chosen ``order``.

    ``payload_sum``: (...,) float32 Σ of the block's payloads; ``exps``: int (...,) block
    exponents (α = 2^exps, −127 allowed); ``payloads`` (..., block) is needed for PER_ELEMENT.
    ``div`` 1 skips the division."""
    if not isinstance(order, NormalizerOrder):
        raise TypeError(
            f"order={order!r} must be a NormalizerOrder member; allowed: "
            f"{[m.name for m in NormalizerOrder]}"
        )
    div = check_real("div", div, positive=True)
    xp = namespace(payload_sum, exps)
    d = np.float32(div)
    if order is NormalizerOrder.PAYLOAD_SUM_FIRST:
        s = payload_sum if div == 1 else f32.div_ftz(payload_sum, d)
        return f32.ldexp_ftz(s, exps)
    if order is NormalizerOrder.SCALE_FIRST:
        alpha = f32.ldexp_ftz(xp.ones_like(xp.asarray(payload_sum, dtype=np.float32)), exps)
        a6 = alpha if div == 1 else f32.div_ftz(alpha, d)
        return f32.mul_ftz(a6, payload_sum)
    if payloads is None:
        raise ValueError("order=PER_ELEMENT needs payloads= (..., block)")
    per = f32.ldexp_ftz(payloads, xp.asarray(exps)[..., None])
    if div != 1:
        per = f32.div_ftz(per, d)
    acc = per[..., 0]
    for j in range(1, per.shape[-1]):
        acc = f32.add_ftz(acc, per[..., j])
    return acc


def represented_output(numerator: Array, denominator: Array, div: float) -> Array:
    """``fl(fl(numerator / div) / denominator)`` (``div`` = 36, 6 or 1), flushed; a zero
    denominator gives 0 (fully masked rows)."""
    xp = namespace(numerator, denominator)
    div = check_real("div", div, positive=True)
    numerator, denominator = (
        as_f32("numerator", numerator, xp),
        as_f32("denominator", denominator, xp),
    )
    a = numerator if div == 1 else f32.div_ftz(numerator, np.float32(div))
    safe = xp.where(denominator > 0, denominator, np.float32(1.0))
    return xp.where(denominator > 0, f32.div_ftz(a, safe), np.float32(0.0))

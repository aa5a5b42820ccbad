"""Forward/backward consistency of a training recipe (the conditions of FLAMIA and Attn-QAT, arXiv:2603.00040).

This module owns the checks that a low-precision backward differentiates the forward that was
actually run, and the named *deliberate mismatches* that break them, for experiments:

Checks (:func:`check_consistency` → :class:`ConsistencyReport`):

1. ``p_bitwise``: the P the backward rebuilt from the saved quantized Q/K and row statistics
   equals, bit for bit, the P the forward multiplied: its codes, block scales, block exponents
   and tile anchors equal the forward's own intermediates, and the normalized float32 P̃ equals
   the one built the same way from the forward recipe.
2. ``delta``: ``D = rowsum(dO ∘ O)`` (what the backward uses) equals ``Σ_j P_ij dP_ij`` with the
   P of dS (P̃, or the unquantized p of Attn-QAT's recipe, whose D uses the high-precision
   output), within the float32 rounding of the two sums:
   ``|D − Σ P̃ dP| ≤ γ · Σ_j |P̃_ij| Σ_k |dO_ik V̂_jk|`` with ``γ = 2·(M + d_v)·2^-24`` — the
   first-order bound of the two float32 dot products (M keys, d_v columns) plus the forward's
   accumulation of O, which the same γ covers (every O entry is a float32 sum of at most M
   terms |P̃_ij V̂_jk| and a division).
3. ``ds_row_sum``: every row of dS sums to zero within
   ``γ · Σ_j |P̃_ij| (|dP_ij| + |D_i|)`` (the softmax-gradient invariant; it holds exactly in
   real arithmetic iff ``Σ_j P̃_ij = 1`` and 2. holds).

Mismatches (:class:`Mismatch`, applied by :func:`with_mismatch`):

* ``BACKWARD_TILING`` — the backward rebuilds P with a different key tile (the running max, and
  with it every block's anchor, moves at other places).
* ``FORWARD_APPROX_EXP`` — only the forward uses FA4's polynomial exp2 (on every element); the
  backward rebuilds with the correctly rounded exp2.
* ``D_OUT_REPRESENTATION`` — D uses the float32 dO while dP uses the quantized copy.
* ``P_BITS`` — the forward makes 4-bit P (MXFP4), the backward rebuilds 8-bit P (MXFP8).

Each is detected by at least one check; the matched recipes pass all three.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import numpy as np

from fp4sim.attention.recipe import DeltaSource, TrainingRecipe

__all__ = ["Mismatch", "with_mismatch", "ConsistencyReport", "check_consistency"]


class Mismatch(enum.Enum):
    """A named deliberate forward/backward inconsistency (module docstring)."""

    BACKWARD_TILING = "backward_tiling"
    FORWARD_APPROX_EXP = "forward_approx_exp"
    D_OUT_REPRESENTATION = "d_out_representation"
    P_BITS = "p_bits"


def with_mismatch(recipe: TrainingRecipe, mismatch: Mismatch) -> TrainingRecipe:
    """``recipe`` with ``mismatch`` injected (the name gets a ``+mismatch`` suffix)."""
    from fp4sim.attention.recipe import ExactP, Exp2Kind, Exp2Model, PFormat

    if not isinstance(recipe, TrainingRecipe):
        raise TypeError(f"recipe={recipe!r} must be a TrainingRecipe")
    if not isinstance(mismatch, Mismatch):
        raise TypeError(
            f"mismatch={mismatch!r} must be a Mismatch; allowed: {[m.name for m in Mismatch]}"
        )
    fwd = recipe.forward
    name = f"{recipe.name}+{mismatch.value}"
    if mismatch is Mismatch.BACKWARD_TILING:
        tile = (
            fwd.block_kv // 2
            if fwd.block_kv >= 2 * max(fwd.fragment, fwd.pv_group)
            else fwd.block_kv * 2
        )
        return recipe.replace(name=name, rebuild=fwd.replace(block_kv=tile))
    if mismatch is Mismatch.FORWARD_APPROX_EXP:
        poly = Exp2Model(
            kind=Exp2Kind.FA4_POLY, emulate_freq=2, emulate_res=2, native_last_fragments=0
        )
        return recipe.replace(
            name=name, forward=fwd.replace(exp2=poly), rebuild=fwd.replace(exp2=Exp2Model())
        )
    if mismatch is Mismatch.D_OUT_REPRESENTATION:
        if recipe.d_out.fmt is None or recipe.delta is not DeltaSource.QUANTIZED_D_OUT:
            raise ValueError(
                f"Mismatch.D_OUT_REPRESENTATION needs a quantized dO shared by D "
                f"and dP; recipe {recipe.name!r} has d_out={recipe.d_out.name}, "
                f"delta={recipe.delta.name}"
            )
        return recipe.replace(name=name, delta=DeltaSource.FLOAT_D_OUT)
    # P_BITS
    if fwd.p_format is not PFormat.MXFP4:
        raise ValueError(
            f"Mismatch.P_BITS needs a 4-bit (MXFP4) forward P; recipe "
            f"{recipe.name!r} has p_format={fwd.p_format.name}"
        )
    return recipe.replace(
        name=name, rebuild=fwd.replace(converter=ExactP(), p_format=PFormat.MXFP8)
    )


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ConsistencyReport:
    """Result of :func:`check_consistency`: each check's pass flag and its worst violation.

    ``p_max_abs_diff``: largest |P̃_bwd − P̃_fwd|; ``delta_excess`` / ``ds_sum_excess``: largest
    ratio of the observed deviation to its float32 bound (≤ 1 passes).
    """

    recipe: str
    p_bitwise: bool
    p_max_abs_diff: float
    delta_ok: bool
    delta_excess: float
    ds_row_sum_ok: bool
    ds_sum_excess: float

    @property
    def ok(self) -> bool:
        return self.p_bitwise and self.delta_ok and self.ds_row_sum_ok

    @property
    def failed(self) -> tuple[str, ...]:
        """Names of the checks that failed."""
        return tuple(
            n
            for n, ok in (
                ("p_bitwise", self.p_bitwise),
                ("delta", self.delta_ok),
                ("ds_row_sum", self.ds_row_sum_ok),
            )
            if not ok
        )


def _excess(dev: np.ndarray, bound: np.ndarray) -> float:
    dev = np.abs(dev)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(dev == 0, 0.0, dev / np.where(bound > 0, bound, 0.0))
    return float(np.max(r)) if r.size else 0.0


def check_consistency(
    recipe: TrainingRecipe,
    q: Any,
    k: Any,
    v: Any,
    d_out: Any,
    *,
    softmax_scale: float | None = None,
    causal: bool = True,
    segment_ids: Any = None,
) -> ConsistencyReport:
    """Run ``recipe``'s forward and backward on float32 NumPy inputs and check the consistency conditions."""
    from fp4sim.attention.autodiff import forward_p, training_backward, training_forward

    if not isinstance(recipe, TrainingRecipe):
        raise TypeError(f"recipe={recipe!r} must be a TrainingRecipe")
    out, saved = training_forward(
        q, k, v, recipe, softmax_scale=softmax_scale, causal=causal, segment_ids=segment_ids
    )
    trace = training_backward(saved, d_out, recipe)
    p_fwd = np.asarray(forward_p(saved, recipe).p)
    p_bwd = np.asarray(trace.p)
    reb = trace.rebuilt
    same_ints = all(
        (a is None and b is None)
        or (
            a is not None
            and b is not None
            and np.shape(a) == np.shape(b)
            and np.array_equal(np.asarray(a), np.asarray(b))
        )
        for a, b in (
            (reb.codes, saved.fwd_codes),
            (reb.scales, saved.fwd_scales),
            (reb.k, saved.fwd_k),
            (reb.anchors, saved.fwd_anchors),
        )
    )
    p_bitwise = same_ints and bool(np.array_equal(p_fwd.view(np.uint32), p_bwd.view(np.uint32)))
    p_diff = float(np.max(np.abs(p_fwd.astype(np.float64) - p_bwd))) if p_fwd.size else 0.0

    f64 = np.float64
    pb = np.asarray(trace.p_ds, dtype=f64)  # the P of dS (P̃, or Attn-QAT's unquantized p)
    dp = np.asarray(trace.dp, dtype=f64)
    dlt = np.asarray(trace.delta, dtype=f64)
    do_q = np.asarray(trace.d_out_q, dtype=f64)
    v_hat = np.asarray(saved.v_hat, dtype=f64)
    m, dv = v_hat.shape[-2], v_hat.shape[-1]
    gamma = 2.0 * (m + dv) * 2.0**-24
    mag = np.sum(np.abs(pb) * (np.abs(do_q) @ np.swapaxes(np.abs(v_hat), -1, -2)), axis=-1)
    d_from_p = np.sum(pb * dp, axis=-1)
    delta_excess = _excess(dlt - d_from_p, gamma * mag)
    ds = np.asarray(trace.ds, dtype=f64)
    ds_bound = gamma * np.sum(np.abs(pb) * (np.abs(dp) + np.abs(dlt)[..., None]), axis=-1)
    ds_excess = _excess(np.sum(ds, axis=-1), ds_bound)
    return ConsistencyReport(
        recipe=recipe.name,
        p_bitwise=p_bitwise,
        p_max_abs_diff=p_diff,
        delta_ok=delta_excess <= 1.0,
        delta_excess=delta_excess,
        ds_row_sum_ok=ds_excess <= 1.0,
        ds_sum_excess=ds_excess,
    )

"""Attention backward: the exact float64 reference and the emulated low-precision backward.

This module owns the gradient of softmax attention ``O = softmax(c_e·Q Kᵀ + mask) V``
(``c_e`` = softmax scale, natural-log units) with respect to Q, K and V, in two forms:

* :func:`attention_grad_reference`: NumPy float64, no quantization, the oracle. It also serves
  the float64 forward (O, natural-log LSE) of the same mask so the two always agree.
* :func:`emulated_backward`: what a low-precision training kernel computes, written once against
  the array namespace (NumPy, or jax under ``jit``/``vmap``). It takes the forward's saved state
  (the represented probabilities ``P̃`` rebuilt bit-identically from the saved quantized Q/K,
  the quantized V the forward multiplied, the forward output O) and the upstream gradient dO, and
  forms, with the formats of a :class:`BackwardRecipe`::

      dO_q = quantize(dO)                      E5M2 by default (one copy for dV and dP)
      dV   = P_bᵀ · dO_q                       P_b = P̃ in the backward's P format (FP8 E4M3)
      dP   = dO_q · V̂ᵀ                         V̂ = the forward's quantized V
      D    = rowsum(dO_D ∘ O)                  dO_D = dO_q (matched) or float dO (a mismatch)
      dS   = P̃ ∘ (dP − D)                      softmax gradient, from the *same* P̃ as the forward
      dS_q = quantize(dS)                      32×32 square tiles (one copy serves dQ and dK),
                                               or per query row (the causal-exact option)
      dQ   = c_e · dS_q · K̂      dK = c_e · dS_qᵀ · Q̂

  Products are float32 matrix products of dequantized operands: every operand is exactly its
  low-precision value, the accumulation is float32 (the tensor core's is modelled in
  :mod:`fp4sim.formats.matmul`, not here).

The identity ``D_i = Σ_j P̃_ij dP_ij = rowsum(dO_i ∘ O_i)`` holds only when ``O = P̃ V̂`` with the
very ``P̃`` used in dS (consistent normalization, seed_algorithms.md §5.2); then every row of dS
sums to zero. :mod:`fp4sim.attention.consistency` checks this and the other invariants.

Masks: ``causal`` (query i sees keys j ≤ i + (M − N), i.e. aligned at the end, as in
``jax.nn.dot_product_attention``) and ``segment_ids`` (packed documents: query i sees key j only
when both carry the same id). A fully masked row has O = 0, LSE = −inf and zero gradients.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any, NamedTuple

import numpy as np

from fp4sim import _xp

__all__ = [
    "Gradients",
    "attention_mask",
    "attention_forward_reference",
    "attention_grad_reference",
    "softmax_grad",
    "DeltaSource",
    "BackwardTrace",
    "emulated_backward",
    "TrainingRecipe",
]


class Gradients(NamedTuple):
    """dQ, dK, dV of one attention call (same shapes as Q, K, V)."""

    dq: Any
    dk: Any
    dv: Any


def _check_qkv(q: Any, k: Any, v: Any) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if getattr(x, "ndim", 0) < 2:
            raise ValueError(f"{name} must have shape (..., tokens, head_dim); got shape "
                             f"{getattr(x, 'shape', None)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share head_dim; got q.shape={q.shape}, k.shape={k.shape}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same number of tokens; got k.shape={k.shape}, "
                         f"v.shape={v.shape}")


def attention_mask(n_q: int, n_kv: int, *, causal: bool = False, q_segment_ids: Any = None,
                   kv_segment_ids: Any = None) -> Any:
    """Boolean mask (..., n_q, n_kv): True where query i may attend to key j.

    ``causal`` aligns the diagonal at the end (query i sees keys ``j ≤ i + n_kv − n_q``).
    Segment ids are integer arrays (..., n_q) and (..., n_kv); ``kv_segment_ids`` defaults to
    ``q_segment_ids`` (self-attention over packed documents). The namespace follows the segment
    ids (NumPy when none are given).
    """
    if not isinstance(causal, bool):
        raise TypeError(f"causal={causal!r} must be a bool")
    if kv_segment_ids is not None and q_segment_ids is None:
        raise ValueError("kv_segment_ids given without q_segment_ids; pass both or only "
                         "q_segment_ids")
    xp = _xp.namespace(q_segment_ids, kv_segment_ids)
    rows = xp.arange(n_q)[:, None]
    cols = xp.arange(n_kv)[None, :]
    mask = xp.ones((n_q, n_kv), dtype=bool)
    if causal:
        mask = cols <= rows + (n_kv - n_q)
    if q_segment_ids is None:
        return mask
    kv_ids = q_segment_ids if kv_segment_ids is None else kv_segment_ids
    if q_segment_ids.shape[-1] != n_q or kv_ids.shape[-1] != n_kv:
        raise ValueError(f"segment ids must end in (n_q={n_q},) and (n_kv={n_kv},); got "
                         f"q_segment_ids.shape={q_segment_ids.shape}, "
                         f"kv_segment_ids.shape={kv_ids.shape}")
    return mask & (q_segment_ids[..., :, None] == kv_ids[..., None, :])


def _default_scale(head_dim: int, softmax_scale: float | None) -> float:
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim)
    if not (isinstance(softmax_scale, (int, float)) and math.isfinite(softmax_scale)
            and softmax_scale > 0):
        raise ValueError(f"softmax_scale={softmax_scale!r} must be a positive finite number")
    return float(softmax_scale)


def _reference_probs(q, k, *, softmax_scale, causal, q_segment_ids, kv_segment_ids):
    """float64 probabilities P (..., N, M), natural-log LSE (..., N) and the mask."""
    scale = _default_scale(q.shape[-1], softmax_scale)
    mask = attention_mask(q.shape[-2], k.shape[-2], causal=causal,
                          q_segment_ids=None if q_segment_ids is None
                          else np.asarray(q_segment_ids),
                          kv_segment_ids=None if kv_segment_ids is None
                          else np.asarray(kv_segment_ids))
    s = scale * np.einsum("...nd,...md->...nm", q, k)
    s = np.where(mask, s, -np.inf)
    m = np.max(s, axis=-1, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m_safe)  # exp(-inf) = 0 for masked entries
    l = np.sum(e, axis=-1, keepdims=True)
    p = e / np.where(l > 0, l, 1.0)
    with np.errstate(divide="ignore"):
        lse = np.where(l[..., 0] > 0, m_safe[..., 0] + np.log(l[..., 0]), -np.inf)
    return p, lse, scale


def attention_forward_reference(q: Any, k: Any, v: Any, *, softmax_scale: float | None = None,
                                causal: bool = False, q_segment_ids: Any = None,
                                kv_segment_ids: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """Exact float64 attention: ``(O, LSE)`` with LSE in natural-log units (−inf when masked)."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    _check_qkv(q, k, v)
    p, lse, _ = _reference_probs(q, k, softmax_scale=softmax_scale, causal=causal,
                                 q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids)
    return p @ v, lse


def softmax_grad(p: Any, dp: Any, delta: Any) -> Any:
    """``dS = P ∘ (dP − D)``: the gradient through the row softmax, D broadcast along keys.

    ``p`` and ``dp`` are (..., N, M), ``delta`` is (..., N). With ``D = Σ_j P_ij dP_ij`` each row
    of dS sums to zero; with any other D it sums to ``D·(1 − Σ_j P_ij) + (Σ P dP − D)``.
    """
    return p * (dp - delta[..., None])


def attention_grad_reference(q: Any, k: Any, v: Any, d_out: Any, *,
                             softmax_scale: float | None = None, causal: bool = False,
                             q_segment_ids: Any = None,
                             kv_segment_ids: Any = None) -> Gradients:
    """Exact float64 gradients of ``Σ O ∘ d_out`` with respect to q, k, v.

    Shapes (..., N, d), (..., M, d), (..., M, dv), (..., N, dv); any leading batch/head axes.
    A fully masked query row contributes nothing (its P row is zero).
    """
    q, k, v, d_out = (np.asarray(x, dtype=np.float64) for x in (q, k, v, d_out))
    _check_qkv(q, k, v)
    if d_out.shape != q.shape[:-1] + v.shape[-1:]:
        raise ValueError(f"d_out.shape={d_out.shape} must be {q.shape[:-1] + v.shape[-1:]} "
                         "(the output's shape)")
    p, _, scale = _reference_probs(q, k, softmax_scale=softmax_scale, causal=causal,
                                   q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids)
    out = p @ v
    dp = d_out @ np.swapaxes(v, -1, -2)
    delta = np.sum(d_out * out, axis=-1)
    ds = softmax_grad(p, dp, delta)
    dq = scale * (ds @ k)
    dk = scale * (np.swapaxes(ds, -1, -2) @ q)
    dv = np.swapaxes(p, -1, -2) @ d_out
    return Gradients(dq, dk, dv)


# --- the emulated backward --------------------------------------------------------------------
class DeltaSource(enum.Enum):
    """Which dO the row term ``D = rowsum(dO ∘ O)`` uses."""

    QUANTIZED_D_OUT = "quantized_d_out"  # the same quantized dO copy as dP (matched)
    FLOAT_D_OUT = "float_d_out"  # the float32 dO while dP uses the quantized copy (a mismatch)


def _matmul(a: Any, b: Any) -> Any:
    """float32 matrix product of dequantized operands (the backend's accumulation order)."""
    xp = _xp.namespace(a, b)
    return xp.matmul(a.astype(np.float32), b.astype(np.float32))


def _swap(x: Any) -> Any:
    return _xp.namespace(x).swapaxes(x, -1, -2)


class BackwardTrace(NamedTuple):
    """Every intermediate of :func:`emulated_backward` (for the consistency checks and probes).

    ``d_out_q`` is the quantized dO used by dV and dP, ``d_out_delta`` the dO used in D,
    ``p_dv`` the P operand of dV, ``ds`` the float32 softmax gradient and ``ds_q`` its quantized
    copy (the dQ/dK operand).
    """

    grads: Gradients
    d_out_q: Any
    d_out_delta: Any
    p_dv: Any
    dp: Any
    delta: Any
    ds: Any
    ds_q: Any


def emulated_backward(p: Any, q_hat: Any, k_hat: Any, v_hat: Any, out: Any, d_out: Any, *,
                      softmax_scale: float, d_out_scaling: Any, p_scaling: Any, ds_scaling: Any,
                      delta: DeltaSource = DeltaSource.QUANTIZED_D_OUT,
                      quantize: Any = None) -> BackwardTrace:
    """The backward of one attention call from the forward's saved state (module docstring).

    ``p`` is the represented, normalized P̃ (..., N, M) float32 as the forward multiplied it
    (rebuilt by :func:`fp4sim.attention.autodiff.rebuild_p`); ``q_hat``, ``k_hat``, ``v_hat`` the
    dequantized operands the forward used; ``out`` the forward's O; ``d_out`` the float32
    upstream gradient. ``d_out_scaling``, ``p_scaling`` (P for dV, rows = queries) and
    ``ds_scaling`` are :class:`fp4sim.attention.causal.OperandScaling`; ``quantize`` is the
    fake-quantizer ``(x, scaling) -> float32`` (by default
    :func:`fp4sim.attention.causal.fake_quantize`; the document-aware one for packed sequences).
    """
    from fp4sim.attention import causal

    if not isinstance(delta, DeltaSource):
        raise TypeError(f"delta={delta!r} must be a DeltaSource; allowed: "
                        f"{[m.name for m in DeltaSource]}")
    fq = causal.fake_quantize if quantize is None else quantize
    xp = _xp.namespace(p, q_hat, k_hat, v_hat, out, d_out)
    d_out = xp.asarray(d_out, dtype=np.float32)
    d_out_q = fq(d_out, d_out_scaling)
    d_out_delta = d_out_q if delta is DeltaSource.QUANTIZED_D_OUT else d_out
    p_dv = fq(p, p_scaling)
    dv = _matmul(_swap(p_dv), d_out_q)
    dp = _matmul(d_out_q, _swap(v_hat))
    dlt = xp.sum(d_out_delta * xp.asarray(out, dtype=np.float32), axis=-1)
    ds = softmax_grad(p, dp, dlt)
    ds_q = fq(ds, ds_scaling)
    c = np.float32(softmax_scale)
    dq = c * _matmul(ds_q, k_hat)
    dk = c * _matmul(_swap(ds_q), q_hat)
    return BackwardTrace(Gradients(dq, dk, dv), d_out_q, d_out_delta, p_dv, dp, dlt, ds, ds_q)


def _check_scaling(owner: str, name: str, value: Any) -> None:
    from fp4sim.attention.causal import OperandScaling

    if not isinstance(value, OperandScaling):
        raise TypeError(f"{owner}.{name}={value!r} must be an OperandScaling "
                        f"(see fp4sim.attention.causal)")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class TrainingRecipe:
    """One low-precision attention *training* step: the forward recipe plus every backward format.

    ``forward`` is the :class:`~fp4sim.attention.recipe.AttentionRecipe` whose Q/K format
    (``qk``, ``qk_global``: quantized along the head dimension by
    :func:`fp4sim.attention.forward.quantize_qk`), converter, P format, normalization, tiling
    and exp2 model make the forward; its ``v`` must be ``FLOAT32`` because the training path
    quantizes V itself with ``v`` (:class:`~fp4sim.attention.causal.OperandScaling`: it needs
    token-axis options that ``VFormat`` lacks — OCP floor, per-token, per-tensor — and
    document-aligned groups). Backward formats: ``d_out`` (the one quantized dO copy for dV and
    dP), ``p_backward`` (P as the dV operand, rows = queries), ``ds`` (the dQ/dK operand).
    ``delta`` chooses the dO in ``D = rowsum(dO ∘ O)``. ``rebuild`` is the recipe the backward
    rebuilds P with: ``None`` means the forward's own (bit-identical P, the matched case);
    anything else is a deliberate mismatch (:mod:`fp4sim.attention.consistency`); it must keep
    the forward's Q/K format. ``segment_aligned``: with segment ids, scale groups that span
    tokens are split at document boundaries (a document never shares a scale with another).
    Hashable: a static ``jax.jit`` argument.
    """

    name: str
    forward: Any
    v: Any
    d_out: Any
    p_backward: Any
    ds: Any
    delta: DeltaSource = DeltaSource.QUANTIZED_D_OUT
    rebuild: Any = None
    segment_aligned: bool = True

    def __post_init__(self) -> None:
        from fp4sim.attention.recipe import AttentionRecipe, VFormat

        own = "TrainingRecipe"
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"{own}.name={self.name!r} must be a non-empty str")
        for field in ("forward", "rebuild"):
            value = getattr(self, field)
            if value is None and field == "rebuild":
                continue
            if not isinstance(value, AttentionRecipe):
                raise TypeError(f"{own}.{field}={value!r} must be an AttentionRecipe")
            if value.v is not VFormat.FLOAT32:
                raise ValueError(f"{own}.{field} has v={value.v.name}; the training path "
                                 f"quantizes V itself (field v), so it must be FLOAT32")
            if value.hadamard:
                raise ValueError(f"{own}.{field}.hadamard=True is not supported by the training "
                                 f"path (dQ/dK would need the inverse rotation); allowed: False")
        if self.rebuild is not None and (self.rebuild.qk, self.rebuild.qk_global) != (
                self.forward.qk, self.forward.qk_global):
            raise ValueError(f"{own}.rebuild must keep the forward's Q/K format "
                             f"{self.forward.qk.name}/{self.forward.qk_global.name} (the backward "
                             f"reuses the saved quantized Q/K); got {self.rebuild.qk.name}/"
                             f"{self.rebuild.qk_global.name}")
        for field in ("v", "d_out", "p_backward", "ds"):
            _check_scaling(own, field, getattr(self, field))
        if not isinstance(self.delta, DeltaSource):
            raise TypeError(f"{own}.delta={self.delta!r} must be a DeltaSource; allowed: "
                            f"{[m.name for m in DeltaSource]}")
        if not isinstance(self.segment_aligned, bool):
            raise TypeError(f"{own}.segment_aligned={self.segment_aligned!r} must be a bool")

    @property
    def rebuild_recipe(self) -> Any:
        """The recipe the backward rebuilds P with (the forward's unless a mismatch is set)."""
        return self.forward if self.rebuild is None else self.rebuild

    @property
    def qk(self) -> Any:
        """The Q/K scaling of the forward as an :class:`~fp4sim.attention.causal.OperandScaling`
        (for the leak classification and the probe's scale check)."""
        from fp4sim.attention.causal import qk_scaling

        return qk_scaling(self.forward)

    def replace(self, **changes: Any) -> "TrainingRecipe":
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)

"""Exact attention reference: float64 softmax attention with causal and segment masks (NumPy).

The oracle every emulated route is measured against. Nothing is quantized; scores, softmax and
the output are float64 (inputs of any float dtype are widened exactly).

``O = softmax(softmax_scale · Q Kᵀ + mask) V`` and the natural-log ``LSE_i = log Σ_j
exp(softmax_scale · q_i·k_j)`` over visible keys. Masks: ``causal`` aligned at the end (query i
sees key j iff ``j ≤ i + Skv − Sq``, as in :mod:`fp4sim.attention.forward` and
:mod:`fp4sim.attention.backward`), segment ids (query i sees key j iff the ids are equal). A
fully masked row gives O = 0 and LSE = −inf, never NaN; NaN inputs give NaN in the rows they
reach.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fp4sim._checks import as_float_array, check_bool, check_int
from fp4sim._checks import softmax_scale as check_softmax_scale
from fp4sim._xp import Array

__all__ = ["ReferenceResult", "attention_mask", "attention_reference"]


class ReferenceResult(NamedTuple):
    out: np.ndarray  # (..., Sq, Dv) float64
    lse: np.ndarray  # (..., Sq) float64, natural log
    probs: np.ndarray  # (..., Sq, Skv) float64 normalized probabilities (0 where masked)


def attention_mask(
    n_q: int,
    n_kv: int,
    *,
    causal: bool = False,
    q_segment_ids: Array | None = None,
    kv_segment_ids: Array | None = None,
) -> np.ndarray:
    """bool (..., n_q, n_kv): True where query i may attend to key j (see module docstring)."""
    causal = check_bool("causal", causal)
    n_q = check_int("attention_mask", "n_q", n_q, 0)
    n_kv = check_int("attention_mask", "n_kv", n_kv, 0)
    rows = np.arange(n_q)[:, None]
    cols = np.arange(n_kv)[None, :]
    mask = np.ones((n_q, n_kv), dtype=bool)
    if causal:
        mask = cols <= rows + (n_kv - n_q)
    if q_segment_ids is None:
        if kv_segment_ids is not None:
            raise ValueError("kv_segment_ids given without q_segment_ids")
        return mask
    qs = np.asarray(q_segment_ids)
    ks = qs if kv_segment_ids is None else np.asarray(kv_segment_ids)
    if qs.dtype.kind not in "iu" or ks.dtype.kind not in "iu":
        raise TypeError(f"segment ids must be integer arrays; got {qs.dtype} and {ks.dtype}")
    if qs.shape[-1] != n_q or ks.shape[-1] != n_kv:
        raise ValueError(
            f"segment ids must end in ({n_q},) and ({n_kv},); got {qs.shape} and {ks.shape}"
        )
    return mask & (qs[..., :, None] == ks[..., None, :])


def check_qkv_shapes(q: Array, k: Array, v: Array) -> None:
    """Raise ``ValueError`` unless q (..., Sq, D), k (..., Skv, D), v (..., Skv, Dv) agree (shared
    by the reference and the emulated forward)."""
    if q.ndim < 2 or k.ndim != q.ndim or v.ndim != q.ndim:
        raise ValueError(
            f"q, k, v must have the same rank >= 2; got shapes {q.shape}, {k.shape}, {v.shape}"
        )
    if q.shape[:-2] != k.shape[:-2] or k.shape[:-2] != v.shape[:-2]:
        raise ValueError(f"leading dims differ: q {q.shape}, k {k.shape}, v {v.shape}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q head dim {q.shape[-1]} != k head dim {k.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k has {k.shape[-2]} keys but v has {v.shape[-2]}")


def attention_reference(
    q: Array,
    k: Array,
    v: Array,
    *,
    causal: bool = False,
    q_segment_ids: Array | None = None,
    kv_segment_ids: Array | None = None,
    softmax_scale: float | None = None,
) -> ReferenceResult:
    """Exact float64 attention of ``q (..., Sq, D)``, ``k (..., Skv, D)``, ``v (..., Skv, Dv)``.

    ``softmax_scale`` defaults to 1/√D. Returns O, the natural-log LSE and the probabilities."""
    q, k, v = (
        np.asarray(as_float_array(n, a)).astype(np.float64)
        for n, a in (("q", q), ("k", k), ("v", v))
    )
    check_qkv_shapes(q, k, v)
    d = q.shape[-1]
    softmax_scale = check_softmax_scale(softmax_scale, d)
    mask = attention_mask(
        q.shape[-2],
        k.shape[-2],
        causal=causal,
        q_segment_ids=q_segment_ids,
        kv_segment_ids=kv_segment_ids,
    )
    with np.errstate(invalid="ignore", over="ignore"):
        s = np.einsum("...qd,...kd->...qk", q, k) * float(softmax_scale)
        s = np.where(mask, s, -np.inf)
        m = np.max(s, axis=-1, keepdims=True)
        any_valid = np.isfinite(m) | np.isnan(m)
        m_safe = np.where(np.isfinite(m), m, 0.0)
        w = np.where(mask, np.exp(s - m_safe), 0.0)
        den = np.sum(w, axis=-1, keepdims=True)
        probs = np.where(any_valid & (den > 0), w / np.where(den > 0, den, 1.0), 0.0)
        probs = np.where(np.isnan(den), np.nan, probs)  # NaN scores: the row is NaN
        out = probs @ v
        lse = np.where(
            any_valid[..., 0] & (den[..., 0] > 0),
            m_safe[..., 0] + np.log(np.where(den[..., 0] > 0, den[..., 0], 1.0)),
            -np.inf,
        )
    lse = np.where(np.isnan(m[..., 0]), np.nan, lse)
    return ReferenceResult(out, lse, probs)

"""Comparison metrics: converter code-match rates and error summaries of outputs.

* :func:`code_match_rate` — the share of inputs on which two Direct-P-family converters
  (``ExactP``, ``AffineP``, ``MitchellP``) give the same E2M1 payload code, over *every*
  element of ``x`` (zeros included). ``x`` is the Direct-P
  coordinate ``x = t − k_B + log2 6``; :func:`uniform_grid` builds the deterministic grid of
  the published code-match rates (x uniform on [−6, log2 6)).
* :func:`error_summary` — cosine similarity, relative L2, max abs error and the fraction of
  exact zeros of an approximation against a reference (float64 arithmetic, NaN-aware: NaN in
  either input makes every metric NaN).

NumPy only (these are analysis functions, evaluated on concrete arrays).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from fp4sim._checks import as_float_array
from fp4sim.attention.converters import direct_p_payload
from fp4sim.attention.recipe import Exp2Model

__all__ = ["code_match_rate", "uniform_grid", "ErrorSummary", "error_summary"]


def uniform_grid(n: int = 8_000_000, lo: float = -6.0, hi: float = math.log2(6.0)) -> np.ndarray:
    """float32 midpoints ``lo + (i + 1/2)·(hi − lo)/n``, i = 0..n−1 (computed in float64)."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n={n!r} must be a positive int")
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ValueError(f"need finite lo < hi; got lo={lo!r}, hi={hi!r}")
    i = np.arange(n, dtype=np.float64)
    return (lo + (i + 0.5) * ((hi - lo) / n)).astype(np.float32)


def code_match_rate(
    converter_a: Any,
    converter_b: Any,
    x: Any,
    *,
    exp2: Exp2Model = Exp2Model(),
    chunk: int = 1 << 21,
) -> float:
    """Fraction of ``x`` (Direct-P coordinates) where both converters give the same E2M1 code."""
    x = np.asarray(x)
    if x.dtype.kind != "f":
        raise TypeError(f"x has dtype {x.dtype}; allowed: float arrays")
    x = x.astype(np.float32).reshape(-1)
    if x.size == 0:
        raise ValueError("x is empty")
    same = 0
    for s in range(0, x.size, chunk):
        xs = x[s : s + chunk]
        ca = direct_p_payload(converter_a, xs, exp2=exp2, fragment=xs.size, tile=xs.size)
        cb = direct_p_payload(converter_b, xs, exp2=exp2, fragment=xs.size, tile=xs.size)
        same += int(np.count_nonzero(ca == cb))
    return same / x.size


class ErrorSummary(NamedTuple):
    cosine: float
    rel_l2: float
    max_abs: float
    zero_fraction: float  # share of exact zeros in the approximation

    def __str__(self) -> str:
        return (
            f"cos={self.cosine:.6f} relL2={self.rel_l2:.4e} maxabs={self.max_abs:.4e} "
            f"zeros={self.zero_fraction:.4f}"
        )


def error_summary(approx: Any, reference: Any) -> ErrorSummary:
    """Error of ``approx`` against ``reference`` (same shape), in float64."""
    a = np.asarray(as_float_array("approx", approx), dtype=np.float64)
    r = np.asarray(as_float_array("reference", reference), dtype=np.float64)
    if a.shape != r.shape:
        raise ValueError(f"approx has shape {a.shape} but reference has shape {r.shape}")
    if a.size == 0:
        raise ValueError("empty arrays")
    if np.isnan(a).any() or np.isnan(r).any():
        nan = float("nan")
        return ErrorSummary(nan, nan, nan, float(np.mean(a == 0)))
    a1, r1 = a.reshape(-1), r.reshape(-1)
    na, nr = np.linalg.norm(a1), np.linalg.norm(r1)
    cos = float(a1 @ r1 / (na * nr)) if na > 0 and nr > 0 else (1.0 if na == nr else 0.0)
    rel = float(np.linalg.norm(a1 - r1) / nr) if nr > 0 else (0.0 if na == 0 else math.inf)
    return ErrorSummary(cos, rel, float(np.max(np.abs(a1 - r1))), float(np.mean(a1 == 0)))

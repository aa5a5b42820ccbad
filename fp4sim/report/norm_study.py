"""The Direct-P norm study: why fp4sim's Direct-P affine route matches the article's cosine but not
its relative L2 error, and under which inputs and recipe choices the two agree.

Hardware-Aware FP4 FlashAttention-4 (arXiv:2609.04105) reports, for its Direct-P affine forward,
a relative L2 error of 0.3366 at a cosine of about 0.944. On Gaussian Q, K, V fp4sim's preset
(``HW_FP4_DIRECT_P``) gives the same cosine but a relative L2 error near 0.43, because its output
is about 1.2 times longer than the exact one. The two error measures are tied by an identity: for
the norm ratio ``r = ‖O‖ / ‖O_ref‖``,

    rel_l2² = (1 − r)² + 2r·(1 − cosine),

so a norm bias inflates the L2 error without touching the cosine, and the article's pair implies
``r`` within about 2 % of 1 (:func:`implied_norm_ratios`).

:func:`experiment_direct_p_norm` measures cosine, relative L2 error, the norm ratio and the ratio
of the route's softmax normalizer to the exact one over the cases of :func:`study_cases`: one
factor at a time against the Gaussian baseline — the recipe's choices (normalizer from the
represented weights or the exact sum, converter, the V rule, the Q/K scale rule, the ``k_B`` rule)
and the inputs' statistics (:class:`InputCondition`: score spread, keys correlated along tokens,
V with a nonzero mean, an attention-sink key) — and the score spread crossed with three routes.
Every case runs on each seed of :attr:`~fp4sim.report.sizes.Sizes.seed_values`
(:attr:`~fp4sim.report.sizes.Sizes.study_seq_len` tokens, ``head_dim``), through the library's
public ``attention_forward`` against the float64 ``attention_reference`` (NumPy, one case after
another; ``reproduce --devices`` does not map this study).

>>> from fp4sim.report import norm_study
>>> [round(r, 3) for r in norm_study.implied_norm_ratios(0.944, 0.3366)]
[0.877, 1.011]
>>> norm_study.InputCondition(score_scale=4.0).describe()
'score scale ×4'
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
import sys
from typing import TYPE_CHECKING, Any

import numpy as np

from fp4sim.report.claims import EXPECTED
from fp4sim.report.experiments import gaussian_qkv, output_errors, over_seeds, progress_enabled
from fp4sim.report.sizes import Sizes

if TYPE_CHECKING:
    from fp4sim.attention import AttentionRecipe

__all__ = [
    "InputCondition",
    "StudyFactor",
    "StudyCase",
    "SWEEP_ROUTES",
    "WIDE_SCALE",
    "study_qkv",
    "study_scales",
    "study_cases",
    "WEIGHT_ROWS",
    "weight_norm_ratio",
    "implied_norm_ratios",
    "article_norm_ratio_band",
    "experiment_direct_p_norm",
]

WIDE_SCALE = 4.0
"""A score scale always in the sweep: peaked rows, where the study also runs the preset with
Q/K float32 (to see which quantizer dominates there)."""

SINK_QUERY_SHIFT = 2.0
"""The shift of every query's first coordinate that carries an attention sink (see
:class:`InputCondition`)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class InputCondition:
    """How the study's Q, K, V differ from standard-normal draws (:func:`study_qkv`).

    * ``score_scale``: Q is multiplied by it, so the scores q·k/√D have standard deviation
      ``score_scale`` (1: unit-variance Gaussian inputs, nearly uniform attention rows; larger:
      peaked rows, as trained models' attention often is).
    * ``key_correlation`` ρ in [0, 1): keys form an AR(1) sequence along tokens,
      ``k_j = ρ·k_{j−1} + √(1 − ρ²)·n_j`` (neighbouring tokens alike; each key stays N(0, 1)).
    * ``v_mean``: added to every element of V (a shared component of the values).
    * ``sink_logit``: an attention sink. Every query's first coordinate is shifted by
      :data:`SINK_QUERY_SHIFT` and key 0's first coordinate by ``sink_logit·√D / 2``, so key 0
      scores about ``sink_logit`` (natural-log units) above the others for every query.
    """

    score_scale: float = 1.0
    key_correlation: float = 0.0
    v_mean: float = 0.0
    sink_logit: float = 0.0

    def __post_init__(self) -> None:
        for name in ("score_scale", "key_correlation", "v_mean", "sink_logit"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise TypeError(f"InputCondition.{name}={v!r} must be a finite float")
        if self.score_scale <= 0:
            raise ValueError(f"InputCondition.score_scale={self.score_scale!r} must be > 0")
        if not 0 <= self.key_correlation < 1:
            raise ValueError(
                f"InputCondition.key_correlation={self.key_correlation!r} must be in [0, 1)"
            )
        if self.sink_logit < 0:
            raise ValueError(f"InputCondition.sink_logit={self.sink_logit!r} must be >= 0")

    def describe(self) -> str:
        """What differs from standard-normal inputs, in words ("Gaussian" if nothing)."""
        parts = []
        if self.score_scale != 1:
            parts.append(f"score scale ×{self.score_scale:g}")
        if self.key_correlation:
            parts.append(f"keys AR(1) ρ = {self.key_correlation:g}")
        if self.v_mean:
            parts.append(f"V mean {self.v_mean:g}")
        if self.sink_logit:
            parts.append(f"sink key +{self.sink_logit:g}")
        return ", ".join(parts) or "Gaussian"


def study_qkv(
    seq_len: int, head_dim: int, seed: int, inputs: InputCondition = InputCondition()
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One head (1, seq_len, head_dim) of float32 Q, K, V: :func:`gaussian_qkv` of ``seed``
    (the route-error inputs, bit for bit, under the default condition) changed as ``inputs``
    says (in float64, then rounded to float32)."""
    if not isinstance(inputs, InputCondition):
        raise TypeError(f"inputs={inputs!r} must be an InputCondition")
    q, k, v = gaussian_qkv(seq_len, head_dim, seed)
    if inputs == InputCondition():
        return q, k, v
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    rho = inputs.key_correlation
    if rho:
        n, c = k.copy(), math.sqrt(1.0 - rho * rho)
        for j in range(1, seq_len):
            k[:, j] = rho * k[:, j - 1] + c * n[:, j]
    if inputs.sink_logit:
        q[..., 0] += SINK_QUERY_SHIFT
        k[:, 0, 0] += inputs.sink_logit * math.sqrt(head_dim) / SINK_QUERY_SHIFT
    q = q * inputs.score_scale
    v = v + inputs.v_mean
    return tuple(a.astype(np.float32) for a in (q, k, v))


class StudyFactor(enum.Enum):
    """What one case of the study changes against the baseline (the preset on Gaussian inputs)."""

    BASELINE = "baseline"
    NORMALIZER = "normalizer"
    CONVERTER = "converter"
    V_RULE = "V rule"
    QK_SCALES = "Q/K scale rule"
    BLOCK_EXPONENT = "k_B rule"
    SCORE_SPREAD = "score spread"
    KEY_CORRELATION = "correlated keys"
    V_MEAN = "V mean"
    SINK = "attention sink"


@dataclasses.dataclass(frozen=True, kw_only=True)
class StudyCase:
    """One case: the route (a label and its recipe) on inputs of one :class:`InputCondition`."""

    factor: StudyFactor
    route: str
    recipe: AttentionRecipe
    inputs: InputCondition = InputCondition()

    @property
    def setting(self) -> str:
        """The case in words: the route, and the inputs where they are not Gaussian."""
        where = self.inputs.describe()
        return self.route if where == "Gaussian" else f"{self.route}; {where}"


def _routes() -> dict[str, AttentionRecipe]:
    from fp4sim.attention import (
        HW_FP4_DIRECT_P,
        BlockExponent,
        ExactP,
        MitchellP,
        Normalization,
        QKFormat,
        VFormat,
    )

    p = HW_FP4_DIRECT_P
    return {
        "Direct-P affine (preset)": p,
        "affine, exact-sum normalizer": p.replace(normalization=Normalization.MISMATCHED),
        "exact converter": p.replace(converter=ExactP()),
        "Mitchell-P converter": p.replace(converter=MitchellP()),
        "affine, V float32": p.replace(v=VFormat.FLOAT32),
        "affine, Q/K float32": p.replace(qk=QKFormat.FLOAT32),
        "affine, k_B = 0 (row anchor)": p.replace(block_exponent=BlockExponent.ROW_ANCHOR),
    }


SWEEP_ROUTES = (
    "Direct-P affine (preset)",
    "affine, exact-sum normalizer",
    "exact converter",
)
"""The routes crossed with every score scale (the study's figure)."""

_SINGLE = (  # (factor, route, inputs) of the one-factor cases at score scale 1
    (StudyFactor.CONVERTER, "Mitchell-P converter", InputCondition()),
    (StudyFactor.V_RULE, "affine, V float32", InputCondition()),
    (StudyFactor.QK_SCALES, "affine, Q/K float32", InputCondition()),
    (StudyFactor.QK_SCALES, "affine, Q/K float32", InputCondition(score_scale=WIDE_SCALE)),
    (StudyFactor.BLOCK_EXPONENT, "affine, k_B = 0 (row anchor)", InputCondition()),
    (StudyFactor.KEY_CORRELATION, SWEEP_ROUTES[0], InputCondition(key_correlation=0.9)),
    (StudyFactor.V_MEAN, SWEEP_ROUTES[0], InputCondition(v_mean=0.5)),
    (StudyFactor.SINK, SWEEP_ROUTES[0], InputCondition(sink_logit=8.0)),
)


def study_scales(sizes: Sizes) -> list[float]:
    """The sweep's score scales: ``sizes.study_scales`` with 1 and :data:`WIDE_SCALE`, sorted."""
    return sorted({1.0, WIDE_SCALE, *map(float, sizes.study_scales)})


def study_cases(sizes: Sizes) -> tuple[StudyCase, ...]:
    """Every case of the study: :data:`SWEEP_ROUTES` at every score scale of
    :func:`study_scales`, then the one-factor cases (at score scale 1, and the Q/K float32 case
    also at :data:`WIDE_SCALE`)."""
    routes = _routes()
    sweep_factor = {
        SWEEP_ROUTES[0]: StudyFactor.BASELINE,
        SWEEP_ROUTES[1]: StudyFactor.NORMALIZER,
        SWEEP_ROUTES[2]: StudyFactor.CONVERTER,
    }
    cases = []
    for s in study_scales(sizes):
        for route in SWEEP_ROUTES:
            factor = sweep_factor[route] if s == 1 else StudyFactor.SCORE_SPREAD
            cases.append(
                StudyCase(
                    factor=factor,
                    route=route,
                    recipe=routes[route],
                    inputs=InputCondition(score_scale=s),
                )
            )
    cases += [
        StudyCase(factor=f, route=route, recipe=routes[route], inputs=inputs)
        for f, route, inputs in _SINGLE
    ]
    return tuple(cases)


# --- what the article's pair implies -----------------------------------------------------------


def implied_norm_ratios(cosine: float, rel_l2: float) -> tuple[float, ...]:
    """The norm ratios r with ``rel_l2² = (1 − r)² + 2r(1 − cosine)``: the roots of
    ``r² − 2r·cosine + 1 − rel_l2² = 0`` (two, one or none), smallest first."""
    for name, v in (("cosine", cosine), ("rel_l2", rel_l2)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise TypeError(f"{name}={v!r} must be a finite float")
    if not -1 <= cosine <= 1 or rel_l2 < 0:
        raise ValueError(f"need -1 <= cosine <= 1 and rel_l2 >= 0; got {cosine!r}, {rel_l2!r}")
    disc = cosine * cosine - 1.0 + rel_l2 * rel_l2
    if disc < 0:
        return ()
    roots = sorted({cosine - math.sqrt(disc), cosine + math.sqrt(disc)})
    return tuple(r for r in roots if r >= 0)


def article_norm_ratio_band() -> dict[str, Any]:
    """The norm ratios the article's cosine and relative L2 (as printed, each within half its last
    digit) allow: ``{"upper": (lo, hi), "lower": (lo, hi)}`` over the corners of that box (each
    root is monotonic in both)."""
    a = EXPECTED["direct_p_article"]
    corners = [
        implied_norm_ratios(c, e)
        for c in (a["cosine"] - a["cosine_halfwidth"], a["cosine"] + a["cosine_halfwidth"])
        for e in (a["rel_l2"] - a["rel_l2_halfwidth"], a["rel_l2"] + a["rel_l2_halfwidth"])
    ]
    lower = [r[0] for r in corners if len(r) == 2]
    upper = [r[-1] for r in corners if r]
    return {
        "upper": (min(upper), max(upper)),
        "lower": (min(lower), max(lower)) if lower else None,
        "cosine": a["cosine"],
        "rel_l2": a["rel_l2"],
    }


# --- the experiment ---------------------------------------------------------------------------------


WEIGHT_ROWS = 64
"""Query rows whose normalized represented weights :func:`weight_norm_ratio` reads."""


def weight_norm_ratio(q: Any, k: Any, recipe: AttentionRecipe, probs: Any) -> float:
    """The norm ratio the represented weights alone predict for V of zero mean, independent of
    the scores: ``√(Σ_ij w̃_ij² / Σ_ij w_ij²)`` over the first :data:`WEIGHT_ROWS` query rows,
    with ``w̃_i`` the route's normalized weights of row i (its forward with V the identity
    matrix, which MXFP4 V represents exactly — one 1 per 32-token block and column, amplitude 1,
    payload 6 — so row i of the output is ``w̃_i``; rows are independent, so a subset of the
    queries gives the same rows) and ``w_i`` the exact ones (``probs``, float64)."""
    from fp4sim.attention import VFormat, attention_forward

    q = np.asarray(q)[..., :WEIGHT_ROWS, :]
    n = np.asarray(k).shape[-2]
    eye = np.eye(n, dtype=np.float32)[None]
    wt = np.asarray(attention_forward(q, k, eye, recipe.replace(v=VFormat.MXFP4_TOKENS)).out)
    w = np.asarray(probs, dtype=np.float64)[..., : q.shape[-2], :]
    return float(np.sqrt(np.sum(wt.astype(np.float64) ** 2) / np.sum(w**2)))


def _case_metrics(
    out: Any, lse: Any, ref: Any, q: Any, k: Any, recipe: AttentionRecipe
) -> dict[str, float]:
    m = output_errors(out, ref.out)
    # the route's softmax normalizer over the exact one, per row (LSE is its natural log)
    ratio = np.exp(np.asarray(lse, dtype=np.float64) - np.asarray(ref.lse, dtype=np.float64))
    m["normalizer_ratio"] = float(np.mean(ratio))
    m["weight_norm_ratio"] = weight_norm_ratio(q, k, recipe, ref.probs)
    return m


@functools.cache
def experiment_direct_p_norm(sizes: Sizes) -> dict[str, Any]:
    """Cosine, relative L2 error, norm ratio ‖O‖/‖O_ref‖, normalizer ratio (route's softmax
    denominator over the exact one, mean over rows) and the norm ratio the represented weights
    predict (:func:`weight_norm_ratio`) of every case of :func:`study_cases`, on
    each seed of ``sizes.seed_values`` (one head of ``sizes.study_seq_len`` tokens, head dim
    ``sizes.head_dim``), with :func:`~fp4sim.report.experiments.over_seeds` spreads; and the
    norm ratios the article's pair implies (:func:`article_norm_ratio_band`)."""
    from tqdm import tqdm

    from fp4sim.attention import attention_forward, attention_reference

    cases = study_cases(sizes)
    by_inputs: dict[InputCondition, list[int]] = {}
    for i, c in enumerate(cases):
        by_inputs.setdefault(c.inputs, []).append(i)
    per_case: list[list[dict[str, float]]] = [[] for _ in cases]
    n, d = sizes.study_seq_len, sizes.head_dim
    with tqdm(
        total=len(cases) * sizes.seeds,
        desc="Direct-P norm study",
        leave=False,
        disable=not progress_enabled(),
        file=sys.stderr,
    ) as bar:
        for seed in sizes.seed_values:
            for inputs, idx in by_inputs.items():
                q, k, v = study_qkv(n, d, seed + n, inputs)
                ref = attention_reference(*(a.astype(np.float64) for a in (q, k, v)))
                for i in idx:
                    f = attention_forward(q, k, v, cases[i].recipe)
                    per_case[i].append(_case_metrics(f.out, f.lse, ref, q, k, cases[i].recipe))
                    bar.update()
    rows = [
        {
            "factor": c.factor.value,
            "route": c.route,
            "setting": c.setting,
            "inputs": dataclasses.asdict(c.inputs),
            **over_seeds(m),
        }
        for c, m in zip(cases, per_case)
    ]
    band = article_norm_ratio_band()
    a = EXPECTED["direct_p_article"]
    closest = sorted(
        range(len(rows)),
        key=lambda i: math.hypot(rows[i]["cosine"] - a["cosine"], rows[i]["rel_l2"] - a["rel_l2"]),
    )
    return {
        "seq_len": n,
        "head_dim": d,
        "seeds": list(sizes.seed_values),
        "scales": study_scales(sizes),
        "rows": rows,
        "article": {"cosine": a["cosine"], "rel_l2": a["rel_l2"], "norm_ratio_band": band},
        "closest": closest[:3],
    }

"""The emulated training path end to end, and its ``jax.custom_vjp`` wiring for ``jax.grad``.

This module owns:

* :func:`training_forward` — quantize V with the :class:`TrainingRecipe`'s ``v`` scaling
  (document-aligned when segment ids are given and ``segment_aligned``), run the tiled forward
  :func:`fp4sim.attention.forward.attention_forward` (which quantizes Q and K in the forward
  recipe's ``qk`` format), and return O with the :class:`SavedForward` state a kernel keeps: the
  quantized Q/K (the forward's operands: payload values, block exponents, per-token factors),
  the quantized V (its exactly dequantized float32 values, a lossless stand-in for codes +
  scales), O, LSE, and the row statistics (final anchor ``m`` and normalizer ``L``;
  ``LSE = ln2·(m + log2(L/unit))``, kept as the pair so that P̃ is rebuilt without the rounding
  of a logarithm and an exponential). For Attn-QAT-style recipes also O_hp.
* :func:`rebuild_p` — the backward's P: scores of the saved quantized Q/K
  (:func:`fp4sim.attention.forward.scores`, independent of the tiling), the running-max anchors
  for the rebuild recipe's key tiles (recomputed by the forward's own step,
  :func:`fp4sim.attention.forward.running_max`), ``t = u − m`` per tile,
  and :func:`fp4sim.attention.converters.convert_tile`: bit-identical codes, block scales and
  block exponents to the forward's when the recipes match. The normalized represented P̃ is
  ``P̃_ij = fl(fl(w̃_ij · 2^(m_tile − m)) / L)`` with ``w̃`` the represented weight in the
  converter's units (``/pdiv`` for consistent normalization).
* :func:`training_backward` — P̃ rebuilt (and, when the recipe asks, the unquantized
  ``p = 2^(u − LSE₂)``), then :func:`fp4sim.attention.backward.emulated_backward`.
* :func:`emulated_attention` — O of the training forward as a jax function whose VJP is the
  emulated backward (``jax.custom_vjp``); gradients pass straight through the quantizers
  (the gradient with respect to a quantized operand is used for the float input). Works under
  ``jax.jit`` and ``jax.vmap``; the recipe, softmax scale and ``causal`` are static. For
  matched recipes (:func:`reuses_forward_p`) the residuals keep the forward's P codes and tile
  anchors and the backward normalizes them (:func:`p_from_forward`) instead of converting the
  scores again: the same bits as :func:`rebuild_p` (tested for every forward preset), which
  :func:`training_backward` and the consistency checks still run.
* Named recipes: :data:`TRAINING_PRESETS` (published routes and the float32 baseline) and
  :data:`LEAK_TABLE` (the configurations of FLAMIA (github.com/yandex-research/flamia-blackwell-attention)'s leak table, in order).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from fp4sim._checks import as_float_array, check_bool, check_static
from fp4sim._checks import softmax_scale as check_softmax_scale
from fp4sim._xp import Array, NoDerivativeError, bitcast, materialize, namespace, no_derivative
from fp4sim.attention import causal as sc
from fp4sim.attention import operands as ops
from fp4sim.attention.backward import (
    BackwardTrace,
    DeltaSource,
    DsProbabilities,
    Gradients,
    TrainingRecipe,
    emulated_backward,
)
from fp4sim.attention.converters import PTile, convert_tile
from fp4sim.attention.exp2 import exp2_rn
from fp4sim.attention.forward import (
    Operand,
    attention_forward,
    log2_scores,
    masked_tile,
    running_max,
    score_scale,
    scores,
)
from fp4sim.attention.recipe import (  # the named training recipes are re-exported here
    LEAK_TABLE,
    P_MXFP8_KEYS,
    TRAINING_PRESETS,
    AttentionRecipe,
    ExactP,
    Normalization,
    PFormat,
    training_preset,
)
from fp4sim.formats import f32
from fp4sim.formats.codec import bf16_values, decode
from fp4sim.formats.spec import UE8M0

__all__ = [
    "SavedForward",
    "RebuiltP",
    "training_forward",
    "rebuild_p",
    "forward_p",
    "p_from_forward",
    "reuses_forward_p",
    "training_backward",
    "emulated_attention",
    "P_MXFP8_KEYS",
    "TRAINING_PRESETS",
    "LEAK_TABLE",
    "training_preset",
]


@dataclasses.dataclass(frozen=True, slots=True)
class SavedForward:
    """What the training forward keeps for the backward (module docstring). A jax pytree whose
    static (hashed) parts are ``qk_block``, ``qk_exact``, ``softmax_scale`` and ``causal``.

    ``q_op``/``k_op`` hold the forward's quantized Q/K as
    :class:`fp4sim.attention.forward.Operand` arrays ``(values, exps, post, post_exp)`` (payload
    values, block exponents, per-token factors), from which the scores are recomputed exactly;
    ``q_hat``/``k_hat`` are the same operands dequantized (the dQ/dK operands)."""

    q_op: tuple
    k_op: tuple
    q_hat: Array  # (..., Sq, D) float32
    k_hat: Array  # (..., Skv, D)
    v_hat: Array  # (..., Skv, Dv): the quantized V as the forward multiplied it
    out: Array  # (..., Sq, Dv) float32 O
    out_hp: (
        Array | None
    )  # (..., Sq, Dv) O from the unquantized p (only for DeltaSource.HIGH_PRECISION_OUTPUT)
    lse: Array  # (..., Sq) natural-log LSE
    m: Array  # (..., Sq) final running max (log2 units, scaled scores)
    l: Array  # noqa: E741  (..., Sq) final normalizer, converter units
    fwd_codes: Array  # (..., Sq, Skv_pad) the forward's P codes (for the consistency check)
    fwd_scales: Array | None  # (..., Sq, Skv_pad / block) or None
    fwd_k: Array | None  # (..., Sq, Skv_pad / block) or None
    fwd_anchors: Array  # (..., Sq, Skv_pad) the anchor each key's tile used
    segment_ids: Array | None  # (..., S) or None
    qk_block: int
    qk_exact: bool
    softmax_scale: float
    causal: bool
    tile_anchors: Array | None = None  # (..., Sq, n_tiles) the forward's anchor per key tile


_SAVED_DATA = (
    "q_op",
    "k_op",
    "q_hat",
    "k_hat",
    "v_hat",
    "out",
    "out_hp",
    "lse",
    "m",
    "l",
    "fwd_codes",
    "fwd_scales",
    "fwd_k",
    "fwd_anchors",
    "segment_ids",
    "tile_anchors",
)
try:  # jax is a hard dependency; keep NumPy-only use working without it
    import jax as _jax

    _jax.tree_util.register_dataclass(
        SavedForward,
        data_fields=list(_SAVED_DATA),
        meta_fields=["qk_block", "qk_exact", "softmax_scale", "causal"],
    )
except ImportError:  # pragma: no cover
    pass


def _dequantized(xp: ModuleType, op: tuple, block: int) -> Array:
    """The real values of a saved Q/K operand: ``values · 2^exps · 2^post_exp · post``."""
    values, exps, post, post_exp = op
    x = values
    if exps is not None:
        x = f32.ldexp_ftz(x, xp.repeat(exps, block, axis=-1))
    if post_exp is not None:
        x = f32.ldexp_ftz(x, post_exp[..., None])
    if post is not None:
        x = f32.mul_ftz(x, post[..., None])
    return x


def _operand(op: tuple, block: int, exact: bool) -> Operand:
    return Operand(op[0], op[1], op[2], op[3], block, exact, 1.0, None)


def _slice_tokens(op: Operand, n: int) -> tuple:
    def cut(a, axis):
        if a is None:
            return None
        return a[..., :n, :] if axis == -2 else a[..., :n]

    return (cut(op.values, -2), cut(op.exps, -2), cut(op.post, -1), cut(op.post_exp, -1))


class RebuiltP(NamedTuple):
    """The backward's P: ``p`` normalized float32 (..., Sq, Skv), the integer parts, and (on
    request) the unquantized probabilities ``p_hp = 2^(u − LSE₂)``."""

    p: Array
    codes: Array  # (..., Sq, Skv_pad)
    scales: Array | None
    k: Array | None
    anchors: Array  # (..., Sq, Skv_pad) per key
    p_hp: Array | None = None  # (..., Sq, Skv) or None


def _softmax_scale(head_dim: int, softmax_scale: float | None) -> float:
    return check_softmax_scale(softmax_scale, head_dim)


def _quantizer(segment_ids: Array | None, aligned: bool):
    if segment_ids is None or not aligned:
        return ops.fake_quantize
    return _Segmented(segment_ids)


class _Segmented:
    """The document-aligned fake-quantizer ``(x, scaling) -> float32`` for packed sequences;
    ``with_stats`` also gives the statistics bounds for the ordered products
    (:func:`fp4sim.attention.causal.fake_quantize_segmented_stats`)."""

    def __init__(self, segment_ids: Array) -> None:
        self.segment_ids = segment_ids

    def __call__(self, x: Array, scaling: ops.OperandScaling) -> Array:
        return sc.fake_quantize_segmented(x, scaling, self.segment_ids)

    def with_stats(self, x: Array, scaling: ops.OperandScaling) -> tuple[Array, Any]:
        return sc.fake_quantize_segmented_stats(x, scaling, self.segment_ids)


def _per_key(xp: ModuleType, a: Array, width: int) -> Array:
    """(..., n) per-block values repeated ``width`` times along the last axis."""
    return xp.repeat(a, width, axis=-1)


def training_forward(
    q: Array,
    k: Array,
    v: Array,
    recipe: TrainingRecipe,
    *,
    softmax_scale: float | None = None,
    causal: bool = True,
    segment_ids: Array | None = None,
) -> tuple[Array, SavedForward]:
    """O (..., Sq, Dv) of ``recipe``'s forward and the :class:`SavedForward` state.

    Self-attention shapes: ``segment_ids`` (..., S) label packed documents (queries and keys
    share them). NumPy or jax inputs (float32)."""
    check_static("recipe", recipe, TrainingRecipe, "fp4sim.TRAINING_PRESETS['float32']")
    causal = check_bool("causal", causal)
    xp = namespace(q, k, v, segment_ids)
    q, k, v = (
        no_derivative(xp.asarray(as_float_array(n, x, xp), dtype=np.float32), "training_forward")
        for n, x in (("q", q), ("k", k), ("v", v))
    )
    scale = _softmax_scale(q.shape[-1], softmax_scale)
    fq = _quantizer(segment_ids, recipe.segment_aligned)
    if (
        segment_ids is not None
        and recipe.segment_aligned
        and sc.shares_scales_across_tokens(recipe.qk)
    ):
        raise ValueError(
            f"recipe {recipe.name!r}: Q/K format {recipe.forward.qk.name} shares "
            f"scales across tokens and the forward's Q/K quantizer cannot split "
            f"them at document boundaries; use a per-token Q/K format or "
            f"segment_aligned=False"
        )
    v_hat = fq(v, recipe.v)
    res = attention_forward(
        q,
        k,
        v_hat,
        recipe.forward,
        causal=causal,
        q_segment_ids=segment_ids,
        softmax_scale=scale,
        return_intermediates=True,
    )
    it = res.intermediates
    out_hp = None
    if recipe.delta is DeltaSource.HIGH_PRECISION_OUTPUT:
        hp = recipe.forward.replace(
            converter=ExactP(), p_format=PFormat.FLOAT32, normalization=Normalization.EXACT
        )
        out_hp = attention_forward(
            q, k, v_hat, hp, causal=causal, q_segment_ids=segment_ids, softmax_scale=scale
        ).out
    tile = recipe.forward.block_kv
    skv = k.shape[-2]
    q_op = _slice_tokens(it.q, q.shape[-2])
    k_op = _slice_tokens(it.k, skv)
    saved = SavedForward(
        q_op=q_op,
        k_op=k_op,
        q_hat=_dequantized(xp, q_op, it.q.block),
        k_hat=_dequantized(xp, k_op, it.k.block),
        v_hat=v_hat,
        out=res.out,
        out_hp=out_hp,
        lse=res.lse,
        m=it.anchors[..., -1],
        l=it.normalizer,
        fwd_codes=it.p_codes,
        fwd_scales=it.p_scales,
        fwd_k=it.p_k,
        fwd_anchors=_per_key(xp, it.anchors, tile),
        segment_ids=segment_ids,
        qk_block=it.q.block,
        qk_exact=bool(it.q.exact),
        softmax_scale=scale,
        causal=causal,
        tile_anchors=it.anchors,
    )
    return res.out, saved


def _mask(
    xp: ModuleType, sq: int, skv: int, skv_pad: int, is_causal: bool, segment_ids: Array | None
) -> Array:
    rows = xp.arange(sq, dtype=np.int32)[:, None]
    cols = xp.arange(skv_pad, dtype=np.int32)[None, :]
    ok = cols < skv
    if is_causal:
        ok = ok & (cols <= rows + (skv - sq))
    if segment_ids is not None:
        seg = xp.asarray(segment_ids).astype(np.int32)
        kseg = xp.pad(seg, [(0, 0)] * (seg.ndim - 1) + [(0, skv_pad - skv)], constant_values=-1)
        ok = ok & (seg[..., :, None] == kseg[..., None, :])
    return ok


def rebuild_p(
    saved: SavedForward, recipe: AttentionRecipe, *, high_precision: bool = False
) -> RebuiltP:
    """P̃ from the saved quantized Q/K and row statistics with ``recipe``'s converter and tiling
    (module docstring). Bit-identical to the forward's P when ``recipe`` is the forward's."""
    check_static("saved", saved, SavedForward, "fp4sim.training_forward(q, k, v, recipe)[1]")
    check_static("recipe", recipe, AttentionRecipe, "training_recipe.forward")
    high_precision = check_bool("high_precision", high_precision)
    xp = namespace(saved.q_hat, saved.k_hat, saved.m)
    sq, d = saved.q_hat.shape[-2:]
    skv = saved.k_hat.shape[-2]
    tile = recipe.block_kv
    n_tiles = -(-skv // tile)
    skv_pad = n_tiles * tile
    k_op = saved.k_op
    if skv_pad != skv:

        def pad(a, axis):
            if a is None:
                return None
            w = [(0, 0)] * a.ndim
            w[axis] = (0, skv_pad - skv)
            return xp.pad(a, w)

        k_op = (pad(k_op[0], -2), pad(k_op[1], -2), pad(k_op[2], -1), pad(k_op[3], -1))
    qop = _operand(saved.q_op, saved.qk_block, saved.qk_exact)
    kop = _operand(k_op, saved.qk_block, saved.qk_exact)
    c = score_scale(d, saved.softmax_scale)
    valid = _mask(xp, sq, skv, skv_pad, saved.causal, saved.segment_ids)
    u = log2_scores(scores(qop, kop), c, valid)
    u = materialize(u)
    # every tile at once: t (..., Sq, n_tiles, tile), one converter call (it works per tile)
    ut = xp.reshape(u, u.shape[:-1] + (n_tiles, tile))
    anchors = running_max(ut, recipe)[0]  # (..., Sq, n_tiles): the forward's rule
    finite = anchors > -np.inf
    t = xp.where(
        finite[..., None],
        ut - xp.where(finite, anchors, np.float32(0.0))[..., None],
        np.float32(-np.inf),
    )
    pt = convert_tile(recipe, materialize(t))
    p, anc = _normalized(xp, saved, recipe, pt, anchors, skv)

    def flat(a):  # (..., Sq, n_tiles, w) -> (..., Sq, n_tiles * w)
        return None if a is None else xp.reshape(a, a.shape[:-2] + (a.shape[-2] * a.shape[-1],))

    codes, scales, ks = flat(pt.codes), flat(pt.scales), flat(pt.k)
    p_hp = None
    if high_precision:
        lse2 = f32.mul_ftz(saved.lse, np.float32(math.log2(math.e)))
        ok = xp.isfinite(lse2)[..., None]
        p_hp = xp.where(
            ok,
            exp2_rn(xp.where(ok, u[..., :skv] - lse2[..., None], np.float32(-np.inf))),
            np.float32(0.0),
        )
    return RebuiltP(p, codes, scales, ks, anc, p_hp)


def _normalized(
    xp: ModuleType,
    saved: SavedForward,
    recipe: AttentionRecipe,
    pt: Array,
    anchors: Array,
    skv: int,
) -> tuple[Array, Array]:
    """``P̃_ij = fl(fl(w̃_ij · 2^(m_tile − m)) / L)`` (module docstring) from the converter's
    tiles ``pt`` ((..., Sq, n_tiles, tile) values, block exponents) and the anchor of each
    tile; also the anchors per key (..., Sq, Skv_pad)."""
    tile = recipe.block_kv
    mism = recipe.normalization is Normalization.MISMATCHED
    m_fin = saved.m
    fin = m_fin > -np.inf
    pos = saved.l > 0
    l_safe = xp.where(pos, saved.l, np.float32(1.0))[..., None, None]
    finite = anchors > -np.inf
    w = pt.values
    if pt.exps is not None or pt.factor_exp:
        e = xp.zeros(w.shape, np.int32) if pt.exps is None else _per_key(xp, pt.exps, pt.block)
        w = f32.ldexp_ftz(w, e + np.int32(pt.factor_exp))
    if not mism and pt.pdiv != 1:
        w = f32.div_ftz(w, np.float32(pt.pdiv))
    live = finite & fin[..., None]
    r = xp.where(
        live, exp2_rn(xp.where(live, anchors - m_fin[..., None], np.float32(0.0))), np.float32(0.0)
    )
    # a barrier: the per-tile exp2 computed once, not re-fused into every key (4x slower)
    r = materialize(r)

    def norm(w: Array, rows: slice, tiles: slice) -> Array:  # these rows and tiles
        return xp.where(
            pos[..., rows, None, None],
            f32.div_ftz(f32.mul_ftz(w, r[..., rows, tiles, None]), l_safe[..., rows, :, :]),
            np.float32(0.0),
        )

    sq, n_tiles = w.shape[-3], w.shape[-2]
    spans = _causal_spans(recipe, saved.causal, sq, skv, n_tiles)
    if spans is None:
        p = norm(w, slice(None), slice(None))
    else:  # causal: the tiles that every row of a span masks have w = +0 (_causal_spans)
        parts = []
        for r0, r1, ntu in spans:
            rows = slice(r0, r1)
            part = [] if ntu == 0 else [norm(w[..., rows, :ntu, :], rows, slice(0, ntu))]
            if ntu < n_tiles:  # the same steps on w = +0: one value per row and tile
                fill = norm(np.float32(0.0), rows, slice(ntu, None))
                part.append(xp.broadcast_to(fill, fill.shape[:-1] + (tile,)))
            parts.append(part[0] if len(part) == 1 else xp.concatenate(part, axis=-2))
        p = parts[0] if len(parts) == 1 else xp.concatenate(parts, axis=-3)
    p = xp.reshape(p, p.shape[:-2] + (p.shape[-2] * p.shape[-1],))
    p = materialize(p[..., :skv])
    anc = xp.reshape(
        xp.broadcast_to(anchors[..., None], anchors.shape + (tile,)),
        anchors.shape[:-1] + (anchors.shape[-1] * tile,),
    )
    return p, anc


_SPAN_ROWS = 128  # query rows per causal span of P̃'s normalization


@functools.cache
def _masked_tile_is_zero(recipe: AttentionRecipe) -> bool:
    """Whether ``recipe``'s converter gives MMA values +0 for a key tile masked for the whole
    row (``t = −inf``): :func:`fp4sim.attention.forward.masked_tile`, the forward's own check
    before it skips such tiles."""
    mism = recipe.normalization is Normalization.MISMATCHED
    return masked_tile(recipe, recipe.block_kv, mism) is not None


def _causal_spans(
    recipe: AttentionRecipe, is_causal: bool, sq: int, skv: int, n_tiles: int
) -> list[tuple[int, int, int]] | None:
    """Row spans ``(r0, r1, ntu)`` of a causal P̃ (end-aligned: query i sees keys
    j ≤ i + skv − sq): rows r0..r1−1 see only the first ``ntu`` key tiles, so every later tile
    is masked for each of them. There its MMA values are +0 (:func:`_masked_tile_is_zero`;
    the forward's saved codes of such a tile are the masked tile's, whether it skipped the tile
    or converted it, and a rebuild converts ``t = −inf`` too), and so is ``w`` after the
    power-of-two and ``pdiv`` steps; the normalization of those tiles is then computed once
    per row and tile on ``w = +0`` (the same float32 steps with the tile's own ``r`` and the
    row's L, so also a NaN ``r`` keeps its bits) and broadcast over the tile's keys: the same
    bits as computing every key. None when not causal or the converter's masked tile is not
    zero (then every tile is computed per key)."""
    if not is_causal or not _masked_tile_is_zero(recipe):
        return None
    tile = recipe.block_kv
    spans: list[tuple[int, int, int]] = []
    for r0 in range(0, sq, _SPAN_ROWS):
        r1 = min(sq, r0 + _SPAN_ROWS)
        last = r1 - 1 + skv - sq  # the last key row r1 - 1 sees
        ntu = 0 if last < 0 else min(n_tiles, last // tile + 1)
        if spans and spans[-1][2] == ntu:
            spans[-1] = (spans[-1][0], r1, ntu)
        else:
            spans.append((r0, r1, ntu))
    return spans


def _values_from_codes(
    xp: ModuleType, recipe: AttentionRecipe, codes: Array, scales: Array | None
) -> Array:
    """The float32 MMA values of P codes (the converters' ``values``): the decoded payload,
    times the decoded UE4M3 block scale for NVFP4 P (exact)."""
    fmt = recipe.p_format
    if fmt.element is not None:
        values = decode(codes, fmt.element)
        if fmt.scale is not None and fmt.scale is not UE8M0:  # NVFP4: UE4M3 folded in, exact
            values = values * _per_key(xp, decode(scales, fmt.scale), fmt.block)
        return values
    if fmt is PFormat.BF16:
        return bf16_values(codes)
    return bitcast(codes, np.float32)  # FLOAT32: the codes are the bit patterns


def reuses_forward_p(recipe: TrainingRecipe) -> bool:
    """Whether :func:`emulated_attention`'s backward takes P̃ from the forward's saved codes
    (:func:`p_from_forward`) instead of rebuilding it from the scores: the matched recipes
    (``rebuild`` None, dS from the represented P̃). The rebuild gives the same bits there (the
    tests and :mod:`fp4sim.attention.consistency` check it); mismatch experiments and the
    high-precision dS keep rebuilding."""
    return recipe.rebuild is None and recipe.ds_probabilities is DsProbabilities.REPRESENTED


def p_from_forward(saved: SavedForward, recipe: AttentionRecipe) -> RebuiltP:
    """P̃ from the forward's own P codes, block scales/exponents and tile anchors (saved by
    :func:`training_forward`): the conversion of the scores is not repeated, the normalization
    is :func:`rebuild_p`'s (the same float32 steps), so for the forward's recipe the result is
    bit-identical to :func:`rebuild_p` — a kernel that rebuilds P exactly computes these bits."""
    xp = namespace(saved.q_hat, saved.m)
    tile = recipe.block_kv
    skv = saved.k_hat.shape[-2]
    n_tiles = saved.fwd_codes.shape[-1] // tile
    fmt = recipe.p_format

    def tiles(a):  # (..., Sq, n_tiles * w) -> (..., Sq, n_tiles, w)
        if a is None:
            return None
        return xp.reshape(a, a.shape[:-1] + (n_tiles, a.shape[-1] // n_tiles))

    codes = tiles(saved.fwd_codes)
    values = _values_from_codes(xp, recipe, codes, tiles(saved.fwd_scales))
    exps = tiles(saved.fwd_k) if fmt.block_exponents else None
    # the constants the converter and the P format declare (what convert_tile puts in its PTile)
    pt = PTile(
        codes,
        None,
        values,
        exps,
        fmt.block,
        recipe.converter.factor_exp(fmt),
        fmt.divisor,
        None,
        None,
    )
    anchors = saved.tile_anchors
    if anchors is None:
        anchors = saved.fwd_anchors[..., ::tile]
    p, anc = _normalized(xp, saved, recipe, pt, anchors, skv)
    return RebuiltP(p, saved.fwd_codes, saved.fwd_scales, saved.fwd_k, anc, None)


def forward_p(saved: SavedForward, recipe: TrainingRecipe) -> RebuiltP:
    """P̃ as the *forward* made it: :func:`rebuild_p` with the forward recipe (for the checks;
    its integer parts are compared with the forward's own intermediates in the tests)."""
    return rebuild_p(saved, recipe.forward)


class TrainingTrace(NamedTuple):
    """:class:`~fp4sim.attention.backward.BackwardTrace` plus the rebuilt P."""

    grads: Gradients
    p: Array
    rebuilt: RebuiltP
    backward: BackwardTrace

    def __getattr__(self, name: str) -> Any:  # d_out_q, dp, delta, ds, ... from the trace
        return getattr(self.backward, name)


def training_backward(
    saved: SavedForward,
    d_out: Array,
    recipe: TrainingRecipe,
    *,
    forward_p_codes: bool = False,
    grads_only: bool = False,
) -> TrainingTrace:
    """dQ, dK, dV (and every intermediate) of ``recipe``'s backward from ``saved``.

    P̃ is rebuilt from the saved quantized Q/K (:func:`rebuild_p`); with ``forward_p_codes``
    and a matched recipe (:func:`reuses_forward_p`) it is taken from the forward's saved P codes
    instead (:func:`p_from_forward`: the same bits, without converting the scores again).
    ``grads_only``: only the gradients are used (dP may skip the blocks where P̃ is zero: the
    trace's dP/dS differ there, the gradients do not; ``emulated_backward``'s
    ``dp_only_where_p``)."""
    if not isinstance(recipe, TrainingRecipe):
        raise TypeError(f"recipe={recipe!r} must be a TrainingRecipe")
    xp = namespace(saved.q_hat, d_out)
    d_out = xp.asarray(d_out, dtype=np.float32)
    if d_out.shape != saved.out.shape:
        raise ValueError(
            f"d_out.shape={d_out.shape} must equal the output's shape {saved.out.shape}"
        )
    hp = recipe.ds_probabilities is DsProbabilities.HIGH_PRECISION
    if forward_p_codes and reuses_forward_p(recipe) and saved.fwd_codes is not None:
        rebuilt = p_from_forward(saved, recipe.forward)
    else:
        rebuilt = rebuild_p(saved, recipe.rebuild_recipe, high_precision=hp)
    trace = emulated_backward(
        rebuilt.p,
        saved.q_hat,
        saved.k_hat,
        saved.v_hat,
        saved.out,
        d_out,
        softmax_scale=saved.softmax_scale,
        d_out_scaling=recipe.d_out,
        p_scaling=recipe.p_backward,
        ds_scaling=recipe.ds,
        delta=recipe.delta,
        accumulation=recipe.accumulation,
        p_ds=rebuilt.p_hp if hp else None,
        dq_scaling=recipe.dq,
        out_delta=saved.out_hp if recipe.delta is DeltaSource.HIGH_PRECISION_OUTPUT else None,
        quantize=_quantizer(saved.segment_ids, recipe.segment_aligned),
        dp_only_where_p=grads_only,
    )
    return TrainingTrace(trace.grads, rebuilt.p, rebuilt, trace)


# --- jax.custom_vjp ---------------------------------------------------------------------------
@functools.cache
def _vjp_function(recipe: TrainingRecipe, softmax_scale: float, is_causal: bool, segmented: bool):
    import jax

    def primal(q, k, v, seg):
        out, _ = training_forward(
            q,
            k,
            v,
            recipe,
            softmax_scale=softmax_scale,
            causal=is_causal,
            segment_ids=seg if segmented else None,
        )
        return out

    def fwd(q, k, v, seg):
        out, saved = training_forward(
            q,
            k,
            v,
            recipe,
            softmax_scale=softmax_scale,
            causal=is_causal,
            segment_ids=seg if segmented else None,
        )
        # matched recipes keep the forward's P codes (the backward's P̃ without converting the
        # scores again, same bits); per-key anchors serve only the consistency checks
        if reuses_forward_p(recipe):
            return out, dataclasses.replace(saved, fwd_anchors=None)
        return out, dataclasses.replace(
            saved, fwd_codes=None, fwd_scales=None, fwd_k=None, fwd_anchors=None, tile_anchors=None
        )

    def bwd(saved, g):
        grads = training_backward(saved, g, recipe, forward_p_codes=True, grads_only=True).grads
        seg = saved.segment_ids
        seg_ct = None if seg is None else np.zeros(seg.shape, dtype=jax.dtypes.float0)
        return grads.dq, grads.dk, grads.dv, seg_ct

    f = jax.custom_vjp(primal)
    f.defvjp(fwd, bwd)
    return f


def emulated_attention(
    q: Array,
    k: Array,
    v: Array,
    recipe: TrainingRecipe,
    *,
    softmax_scale: float | None = None,
    causal: bool = True,
    segment_ids: Array | None = None,
) -> Array:
    """O of ``recipe``'s training forward; ``jax.grad`` through it runs the emulated backward.

    jax arrays (under ``jit``/``vmap``/``grad``); ``recipe``, ``softmax_scale`` and ``causal``
    must be static. ``segment_ids`` (..., S) integer, or None. NumPy inputs are converted.

    Reverse mode only (``jax.grad``, ``jax.vjp``, ``jax.jacrev``): the emulated backward is a
    vector-Jacobian product. Forward mode (``jax.jvp``, ``jax.jacfwd``, ``jax.hessian``) raises
    :class:`fp4sim.NoDerivativeError` saying so (JAX's own custom_vjp message where
    ``jax.jvp`` is applied to an already traced ``jax.jit`` function)."""
    import jax.numpy as jnp
    from jax.interpreters import ad

    check_static("recipe", recipe, TrainingRecipe, "fp4sim.TRAINING_PRESETS['float32']")
    check_bool("causal", causal)
    q, k, v = (
        jnp.asarray(as_float_array(n, x, jnp), dtype=jnp.float32)
        for n, x in (("q", q), ("k", k), ("v", v))
    )
    if any(isinstance(x, ad.JVPTracer) for x in (q, k, v)):
        raise NoDerivativeError(
            "emulated_attention has a reverse-mode derivative only (the emulated backward, a "
            "vector-Jacobian product): use jax.grad, jax.vjp or jax.jacrev; forward mode "
            "(jax.jvp, jax.jacfwd, jax.hessian) is not defined for it"
        )
    scale = _softmax_scale(q.shape[-1], softmax_scale)
    f = _vjp_function(recipe, scale, causal, segment_ids is not None)
    seg = None if segment_ids is None else jnp.asarray(segment_ids, dtype=jnp.int32)
    if seg is None:
        seg = jnp.zeros(q.shape[:-1], jnp.int32)  # unused (segmented=False)
    return f(q, k, v, seg)

"""Tiled online-softmax attention forward: what a low-precision kernel computes, bit for bit.

:func:`attention_forward` runs one :class:`~fp4sim.attention.recipe.AttentionRecipe` on
``q (..., Sq, D)``, ``k (..., Skv, D)``, ``v (..., Skv, Dv)`` (float32; bfloat16/float16 are
widened exactly, float64 is rounded to float32 first). It is written once against the array
namespace (NumPy, or jax under ``jax.jit`` with the recipe static); the two give the same bits
(every float32 operation goes through :mod:`fp4sim.formats.f32`). Everything that is
independent across key tiles (scores, conversion of P, the PV partial products, the tiles'
denominators) is computed for all tiles at once as batched array operations; only what is
sequential in a kernel is a loop over tiles: the running max and the rescale-and-add updates of
the accumulator and the normalizer. The result is, element by element, the same sequence of
float32 operations as a tile-by-tile kernel. Query rows are processed in blocks (under jax
``_ROW_CHUNK`` rows per ``lax.map`` step, on NumPy ``_NP_ROW_CHUNK`` rows per loop step): rows
are independent, so the bits do not change, while memory stays bounded and the working set fits
the caches. Under jax, ``lax.optimization_barrier`` marks the scores, the log2 scores, ``t``,
P and the PV partials so that XLA computes each once instead of re-fusing their long elementwise
chains into every consumer (this alone made the CPU forward about 2.5x faster); also the ordered
PV sub-block sums before the pv_group adds (fused, XLA CPU ran them ~7x slower), the per-row
normalizer before the final division (else recomputed per column) and each row block's outputs
(else the accumulator chain runs unvectorized inside the map's dynamic-update-slice). K's
block-transposed copy for the score products is made once, outside the row loop.

Causal masking: a row block computes only the key tiles its last row can see. A tile masked for
every row of the block has ``t = −inf``, so P = +0 (for every converter; :func:`masked_tile`
checks this once per recipe, else nothing is skipped), the running max stays (r = 1, or r = 0
while the accumulators are still 0) and its denominator is +0: processing it changes nothing but
the accumulator columns where a 0·Inf (or 0·NaN) partial gives NaN, which one add of the skipped
keys' column sums of fl(0·v) reproduces; its anchors and P codes/scales are filled in. Under jax
the row blocks are mapped in up to ``_BUCKETS`` groups, each with the tiles its last block needs.

Per key tile of ``block_kv`` keys (the notation of :mod:`fp4sim.attention.recipe`):

1. Scores ``z`` from the quantized operands (:func:`quantize_qk`): each scale block's partial
   dot product is formed first — by a matrix product when it is exact (FP4 payloads, optionally
   times their UE4M3 scale: at most 21 significant bits), else as a float32 sum in head-dim
   order — then multiplied by its power-of-two block scales, and the blocks are added in order
   (float32). Per-token factors (NVFP4 global, FP8 per-tensor, token-block exponents) follow.
2. ``u = fl(z·c)`` with ``c = fl32(softmax_scale·log2 e)``; masked keys −inf. Running max:
   ``m' = max(m, max_j u_j)`` when the tile max exceeds ``m + rescale_threshold`` (or ``m``
   is −inf), else ``m`` stays. ``t = fl(u − m')``; old accumulators are multiplied by
   ``r = exp2_rn(fl(m − m'))``.
3. P by :func:`fp4sim.attention.converters.convert_tile`.
4. PV: the power-of-two block scales ``2^k_P``, ``2^k_V`` (and ``factor_exp``) are applied to
   the operands (exact; values below 2^-126 flush); for each sub-block of keys sharing one P
   scale and one V scale the partial product is formed (exactly by a matrix product for
   FP4 x FP4, else a float32 sum in key order); the partials of one ``pv_group`` (K64 in Hardware-Aware
   FP4 FlashAttention-4) are added together, then to the float32 accumulator ``A``.
5. Denominator: ``CONSISTENT`` (and ``EXACT``) adds, per P block in key order,
   ``fl(fl(Σq / pdiv)·2^k)`` (the FTZ-safe order of :mod:`fp4sim.attention.normalization`); ``MISMATCHED`` adds the converter's
   float32 sum of unquantized weights. ``L ← fl(fl(L·r) + L_tile)``.

Finally ``O = fl(fl(A / (pdiv·v_div)) / L)`` (consistent; ``pdiv = 6`` for Direct-P P and
``v_div = 6`` for MXFP4 V, so 36 for the full Direct-P route) or ``fl(fl(A / v_div) / L)``
(mismatched, both in the converter's units), and the natural-log
``LSE = fl(fl(m + fl(log2 L − log2 unit))·ln 2)`` where ``unit`` is the converter's constant
factor between its units and probabilities (6 HAO-NVFP4, 448 HAO-MXFP8, 2688 Sage, else 1).

Policies: a fully masked row gives O = 0 and LSE = −inf (never NaN). A row with a NaN score
gives O = NaN and LSE = NaN (so does a +Inf score, as in exact softmax); other rows are
unaffected. Inputs go through the recipe's quantizers first, whose formats decide what NaN/Inf
become (E4M3/NVFP4 saturate ±Inf to ±max, so an Inf key is a large finite key; a NaN input
gives NaN scores). Masks:
``causal`` is aligned at the end (query i sees key j iff ``j ≤ i + Skv − Sq``), segment ids
(packed documents) let query i see key j iff their ids are equal. Keys are padded with masked
zero keys up to a multiple of ``block_kv``.

Accumulation (``accumulation=``:class:`~fp4sim.attention.recipe.ForwardAccumulation`): steps 1
and 4 above are ``SEQUENTIAL`` (the default, what the Hopper kernels' tile math follows).
``TCGEN05`` replaces them by Blackwell's block-scaled ``tcgen05.mma`` (:mod:`fp4sim.formats.mma`):
the scores are one instruction chain over the head dim per (query, key) with the Q/K block scales
inside the instructions (per-token factors after), and each tile's P·V is one chain over the
tile's keys from a zero accumulator (P's and V's block scales inside), added to ``A`` as above;
the rest of the forward is unchanged. It is what fp4sim's sm_100a attention bodies
(:mod:`fp4sim.kernels.attention_sm100`) issue; :func:`check_tcgen05_recipe` says which recipes
have such products.

For the backward (:mod:`fp4sim.attention.backward`), ``return_intermediates=True`` returns the
quantized operands, the anchor ``m'`` of every tile, P codes/scales/block exponents, and the
final numerator and normalizer; :func:`scores` and :func:`log2_scores` rebuild a tile's ``t``
exactly, so ``convert_tile(recipe, t)`` rebuilds P bit for bit.
"""

from __future__ import annotations

import functools
import math
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from fp4sim._checks import NARROW_FLOAT_DTYPES, as_f32, as_float_array, check_bool, check_static
from fp4sim._checks import softmax_scale as check_softmax_scale
from fp4sim._xp import Array, adopt, canonical_nan, materialize, namespace, no_derivative
from fp4sim.attention import direct_p_gpu, operands, ordered_gpu
from fp4sim.attention._ordered import operand_stats, ordered_product
from fp4sim.attention.converters import PTile, convert_tile
from fp4sim.attention.exp2 import exp2_rn, log2_f32
from fp4sim.attention.normalization import block_denominator, represented_output
from fp4sim.attention.recipe import (
    AffineP,
    AttentionRecipe,
    BlockExponent,
    ForwardAccumulation,
    MitchellP,
    Normalization,
    PFormat,
    QKFormat,
    VFormat,
)
from fp4sim.attention.reference import check_qkv_shapes
from fp4sim.formats import blocks, f32
from fp4sim.formats.codec import bf16_round, bf16_values, decode, widen_to_f32
from fp4sim.formats.spec import E2M1, E4M3

__all__ = [
    "Operand",
    "ForwardResult",
    "ForwardIntermediates",
    "quantize_qk",
    "quantize_v",
    "scores",
    "log2_scores",
    "running_max",
    "running_max_from_tile_maxima",
    "attention_forward",
    "hadamard",
    "score_scale",
    "converter_unit",
    "masked_tile",
    "check_tcgen05_recipe",
]

_LN2 = np.float32(math.log(2.0))
_ROW_CHUNK = 128  # query rows per chunk under jax (rows are independent)
_GPU_ROW_CHUNK = 1024  # the same where the computation is lowered for a GPU (fewer map steps)
_GPU_ROW_CHUNK_FUSED = 4096  # ... for the Direct-P kernels (fewer rows: too few programs)
_NP_ROW_CHUNK = 512  # query rows per block on NumPy (bounds the memory)
_BUCKETS = 4  # causal under jax: row-block groups, each computed on the key tiles it sees


class Operand(NamedTuple):
    """A Q, K or V operand as the tensor core sees it.

    ``values`` float32 (..., S, D): what is multiplied inside a scale block (payload, times a
    non-power-of-two block scale when that keeps partial sums exact). ``exps`` int32 block
    exponents — Q/K: (..., S, D/block); V: (..., S/block, Dv or 1) — or None. ``post`` float32
    (..., S) per-token factor or None; ``post_exp`` int32 (..., S) per-token power of two or
    None. ``block``: contraction elements per scale block. ``exact``: partial sums of one block
    are exact in float32. ``div``: convention divisor (6 for MXFP4 V). ``quantized``: the
    :class:`~fp4sim.formats.blocks.QuantizedArray` (or codes) it came from, for inspection."""

    values: Array
    exps: Array | None
    post: Array | None
    post_exp: Array | None
    block: int
    exact: bool
    div: float
    quantized: Any


class ForwardIntermediates(NamedTuple):
    q: Operand
    k: Operand
    v: Operand
    anchors: Array  # (..., Sq, n_tiles) float32: the running max m' used by each key tile
    p_codes: Array  # (..., Sq, Skv_padded)
    p_scales: Array | None  # (..., Sq, Skv_padded / block) or None
    p_k: Array | None  # (..., Sq, Skv_padded / block) int32 block exponents or None
    numerator: Array  # (..., Sq, Dv) float32 A, converter units
    normalizer: Array  # (..., Sq) float32 L
    score_scale: np.float32  # float32 c = softmax_scale·log2(e)


class ForwardResult(NamedTuple):
    out: Array  # (..., Sq, Dv) float32
    lse: Array  # (..., Sq) float32, natural log
    intermediates: ForwardIntermediates | None


# --- inputs ---------------------------------------------------------------------------------
def _as_f32(xp: ModuleType, x: Array, name: str) -> Array:
    x = xp.asarray(
        as_float_array(
            name,
            x,
            xp,
            allowed="float32, bfloat16, float16, float64 (rounded to float32), or a "
            "float8/float6/float4 of ml_dtypes (widened exactly)",
        )
    )
    if x.dtype == np.float32:
        return x
    if np.dtype(x.dtype).name in NARROW_FLOAT_DTYPES:
        return widen_to_f32(x)
    return x.astype(np.float32)


def score_scale(head_dim: int, softmax_scale: float | None) -> np.float32:
    """``c = fl32(softmax_scale·log2 e)`` (softmax_scale defaults to 1/√head_dim)."""
    return np.float32(check_softmax_scale(softmax_scale, head_dim) * math.log2(math.e))


def converter_unit(recipe: AttentionRecipe) -> float:
    """Constant ratio between the converter's MMA units and probabilities (declared by the
    converter: ``recipe.converter.unit(recipe.p_format)``)."""
    check_static("recipe", recipe, AttentionRecipe, "fp4sim.EXACT_F32")
    return recipe.converter.unit(recipe.p_format)


def hadamard(x: Array) -> Array:
    """Orthonormal Walsh-Hadamard transform along the last axis (a power of two), float32:
    butterflies in a fixed order, then the scale 1/√D (exact when log2 D is even)."""
    xp = namespace(x)
    x = as_f32("x", x, xp)
    if x.ndim == 0:
        raise ValueError("hadamard needs at least one axis (the head dim); got a scalar")
    d = x.shape[-1]
    n = d.bit_length() - 1
    if d < 1 or (1 << n) != d:
        raise ValueError(f"hadamard needs a power-of-two head dim; got {d}")
    lead = x.shape[:-1]
    h = 1
    while h < d:
        y = xp.reshape(x, (*lead, d // (2 * h), 2, h))
        a, b = y[..., 0, :], y[..., 1, :]
        x = xp.reshape(xp.stack([f32.add_ftz(a, b), f32.ftz(a - b)], axis=-2), (*lead, d))
        h *= 2
    if n % 2 == 0:
        return f32.ldexp_ftz(x, np.int32(-(n // 2)))
    return f32.mul_ftz(x, np.float32(2.0 ** (-n / 2)))


# --- operands -------------------------------------------------------------------------------
def _expand_last(xp: ModuleType, s: Array, block: int) -> Array:
    return xp.repeat(s, block, axis=-1)


def quantize_qk(x: Array, recipe: AttentionRecipe) -> Operand:
    """Q or K (..., S, D) in ``recipe.qk`` (scale groups along the head dim, per token)."""
    check_static("recipe", recipe, AttentionRecipe, "fp4sim.FLAMIA_NVFP4")
    x = as_f32("x", x, namespace(x))
    with np.errstate(divide="ignore", invalid="ignore"):  # all-zero (padding) blocks
        return _quantize_qk(x, recipe)


def _quantize_qk(x: Array, recipe: AttentionRecipe) -> Operand:
    xp = namespace(x)
    fmt = recipe.qk
    d = x.shape[-1]
    blk = recipe.qk_block
    if d % blk:
        raise ValueError(f"head dim {d} is not a multiple of the {fmt.name} scale block {blk}")
    x = f32.ftz(x)
    if fmt is QKFormat.FLOAT32:
        return Operand(x, None, None, None, d, False, 1.0, None)
    if fmt is QKFormat.BF16:
        c = bf16_round(x)
        return Operand(bf16_values(c), None, None, None, d, False, 1.0, c)
    if fmt is QKFormat.TOKEN_BLOCK_FP8 and x.shape[-2] % 32:
        raise ValueError(f"token-block Q/K need a multiple of 32 tokens; got {x.shape[-2]}")
    q = operands.quantize_operand(x, recipe.qk_scaling)  # the declared Q/K scaling
    if fmt is QKFormat.FP8_PER_TENSOR:
        g = xp.broadcast_to(xp.reshape(q.global_scale, (1,) * (x.ndim - 1)), x.shape[:-1])
        return Operand(decode(q.codes, E4M3), None, g, None, d, False, 1.0, q)
    if fmt is QKFormat.MXFP8:
        return Operand(
            decode(q.codes, E4M3), blocks.scale_exponents(q), None, None, 32, False, 1.0, q
        )
    if fmt is QKFormat.NVFP4:
        vals = decode(q.codes, E2M1) * _expand_last(xp, q.scale_values(), 16)  # exact
        post = None
        if q.global_scale is not None:
            g = q.global_scale
            if g.ndim == x.ndim:
                g = g[..., 0]
            post = xp.broadcast_to(
                xp.reshape(g, g.shape + (1,) * (x.ndim - 1 - g.ndim)), x.shape[:-1]
            )
        return Operand(vals, None, post, None, 16, True, 1.0, q)
    # TOKEN_BLOCK_FP8
    pe = xp.repeat(blocks.scale_exponents(q)[..., 0], 32, axis=-1)
    return Operand(decode(q.codes, E4M3), None, None, pe, d, False, 1.0, q)


def quantize_v(v: Array, recipe: AttentionRecipe) -> Operand:
    """V (..., Skv, Dv) in ``recipe.v`` (scale groups along tokens)."""
    check_static("recipe", recipe, AttentionRecipe, "fp4sim.FLAMIA_NVFP4")
    v = as_f32("v", v, namespace(v))
    with np.errstate(divide="ignore", invalid="ignore"):  # all-zero (padding) blocks
        return _quantize_v(v, recipe)


def _quantize_v(v: Array, recipe: AttentionRecipe) -> Operand:
    xp = namespace(v)
    fmt = recipe.v
    v = f32.ftz(v)
    vb = recipe.v_block
    if v.shape[-2] % vb:
        raise ValueError(
            f"V has {v.shape[-2]} tokens, not a multiple of the {fmt.name} token block {vb}"
        )
    if fmt is VFormat.FLOAT32:
        return Operand(v, None, None, None, 1, False, 1.0, None)
    if fmt is VFormat.BF16:
        c = bf16_round(v)
        return Operand(bf16_values(c), None, None, None, 1, False, 1.0, c)
    q = operands.quantize_operand(v, recipe.v_scaling)  # the declared V scaling
    if fmt is VFormat.MXFP4_TOKENS:
        # Direct-P's amplitude rule (blocks.MXFP4_AMPLITUDE): payloads q with the exponents of
        # β = 2^e, the divisor 6 applied at the end; a NaN block (scale code 0xFF, e = 128) is
        # NaN in every element (E2M1 has no NaN code), so its columns are NaN in every row
        e = blocks.scale_exponents(q)
        vals = xp.where(xp.repeat(e == 128, vb, axis=-2), np.float32(np.nan), decode(q.codes, E2M1))
        return Operand(vals, e, None, None, vb, True, q.format.divisor, q)
    if fmt is VFormat.FP8:
        return Operand(decode(q.codes, E4M3), None, None, None, 1, False, 1.0, q)
    if fmt is VFormat.NVFP4_TOKENS:
        vals = decode(q.codes, E2M1) * xp.repeat(q.scale_values(), 16, axis=-2)
        return Operand(vals, None, None, None, 16, True, 1.0, q)
    # MXFP8_TOKENS, TOKEN_BLOCK_FP8: E4M3 with a power-of-two exponent per block
    return Operand(decode(q.codes, E4M3), blocks.scale_exponents(q), None, None, 32, False, 1.0, q)


# --- products -------------------------------------------------------------------------------
def _matmul(xp: ModuleType, a: Array, b: Array) -> Array:
    if xp is np:
        return np.matmul(a, b)
    import jax

    return xp.matmul(a, b, precision=jax.lax.Precision.HIGHEST)


def _seq_dot(a: Array, b: Array) -> Array:
    """Σ_d fl(a[..., i, d]·b[..., j, d]) in d order, float32 flushed: (..., I, J)."""
    acc = f32.mul_ftz(a[..., :, None, 0], b[..., None, :, 0])
    for d in range(1, a.shape[-1]):
        acc = f32.add_ftz(acc, f32.mul_ftz(a[..., :, None, d], b[..., None, :, d]))
    return acc


def _key_blocks(k: Operand) -> Array | None:
    """K's values as (..., nb, blk, Sk) for the batched block product of :func:`scores`
    (exact operands only; else None). Computed once per forward, outside the row loop."""
    if not k.exact:
        return None
    xp = namespace(k.values)
    nb = k.values.shape[-1] // k.block
    kb = xp.reshape(k.values, k.values.shape[:-1] + (nb, k.block))  # (..., Sk, nb, blk)
    return xp.moveaxis(kb, -3, -1)


def scores(q: Operand, k: Operand) -> Array:
    """Raw float32 scores z (..., Sq, Sk) of quantized operands (module docstring, step 1)."""
    check_static("q", q, Operand, "fp4sim.quantize_qk(q, recipe)")
    check_static("k", k, Operand, "fp4sim.quantize_qk(k, recipe)")
    return _scores(q, k, _key_blocks(k))


def _exact_block_sum(qv: Any, kv: Any, kbt: Any, blk: int) -> Any:
    """Σ_b z_b in block order (plain float32 adds) of the exact block partials
    ``z_b = qv_b·kv_bᵀ`` (exact operands without block exponents, :func:`_scores`); ``kv``
    (the keys' values, for the GPU kernel) is not used here."""
    xp = namespace(qv, kbt)
    nb = qv.shape[-1] // blk
    qb = xp.moveaxis(xp.reshape(qv, qv.shape[:-1] + (nb, blk)), -2, -3)
    parts = materialize(_matmul(xp, qb, kbt))  # (..., nb, Sq, Sk), every entry exact
    acc = parts[..., 0, :, :]
    for b in range(1, nb):
        acc = acc + parts[..., b, :, :]  # multiples of 2^-20: never subnormal
    return acc


def _scores(q: Operand, k: Operand, kbt: Any) -> Any:
    xp = namespace(q.values, k.values)
    d = q.values.shape[-1]
    blk = q.block
    nb = d // blk
    if q.exact and q.exps is None and kbt is not None:
        # on a GPU one kernel (fp4sim.attention.ordered_gpu.exact_scores): the same bits
        acc = ordered_gpu.exact_scores_dispatch(_exact_block_sum, q.values, k.values, kbt, blk)
        return _score_factors(q, k, acc)
    if q.exact:
        # all block partials in one batched product; each entry is exact, so the backend's
        # summation order cannot matter; the barrier keeps the ordered block sum separate
        qb = xp.moveaxis(xp.reshape(q.values, q.values.shape[:-1] + (nb, blk)), -2, -3)
        # no subnormal is possible (multiples of 2^-20), so a plain barrier replaces ftz
        parts = materialize(_matmul(xp, qb, kbt))  # (..., nb, Sq, Sk)
        parts = [parts[..., b, :, :] for b in range(nb)]
    else:
        parts = [
            _seq_dot(q.values[..., b * blk : (b + 1) * blk], k.values[..., b * blk : (b + 1) * blk])
            for b in range(nb)
        ]
    acc = None
    for b, part in enumerate(parts):
        if q.exps is not None:
            part = f32.ldexp_ftz(part, q.exps[..., :, None, b] + k.exps[..., None, :, b])
        if acc is None:
            acc = part
        elif q.exact and q.exps is None:
            acc = acc + part  # multiples of 2^-20 (FP4 x UE4M3 squared): never subnormal
        else:
            acc = f32.add_ftz(acc, part)
    return _score_factors(q, k, acc)


def _score_factors(q: Operand, k: Operand, acc: Any) -> Any:
    """The per-token factors of step 1 applied to the block sum ``acc``."""
    if q.post_exp is not None:
        acc = f32.ldexp_ftz(acc, q.post_exp[..., :, None] + k.post_exp[..., None, :])
    if q.post is not None:
        acc = f32.mul_ftz(acc, f32.mul_ftz(q.post[..., :, None], k.post[..., None, :]))
    return acc


def log2_scores(z: Array, c: Array, valid: Array) -> Array:
    """``u = fl(z·c)`` with masked keys −inf."""
    xp = namespace(z)
    z, c = as_f32("z", z, xp), as_f32("c", c, xp)
    return xp.where(valid, f32.mul_ftz(z, c), np.float32(-np.inf))


def _pv_numerator(
    xp: ModuleType,
    p: PTile,
    v_vals: Array,
    v_exps: Array | None,
    v_block: int,
    v_exact: bool,
    pv_group: int,
    p_fp4: bool,
    r: Array,
    v_stats: Any = None,
) -> Array:
    """The PV numerator of every tile (module docstring, steps 4-5): the partial products
    summed per ``pv_group``, then folded tile by tile, ``A ← fl(A·r_i)`` plus each group sum.

    ``p`` holds (..., Sq, n_tiles, T) tiles, ``v_vals`` is (..., n_tiles, T, Dv) and
    ``v_exps`` (..., n_tiles, T/v_block, Dv or 1) or None, ``r`` (..., Sq, n_tiles or more)
    each tile's rescale factor. ``v_stats``: the
    :func:`~fp4sim.attention._ordered.operand_stats` of a V holding these values (all keys:
    the predicate is monotone in the stats, so those of a superset only make it stricter), or
    None to compute them here. Returns A (..., Sq, Dv) float32."""
    *lead, sq, nt, n = p.values.shape
    dv = v_vals.shape[-1]
    pb, vb = p.block, v_block
    if pb > 1 and vb > 1:
        sub = min(pb, vb)
    else:
        sub = max(pb, vb) if max(pb, vb) > 1 else 32
    sub = min(sub, pv_group, n)
    ns = n // sub
    exact = p_fp4 and v_exact and pb > 1 and vb > 1
    # block scales (powers of two) applied to the operands: exact unless a value falls below
    # 2^-126 (then flushed), so every sub-block's partial product is still exact
    pvals, vvals = p.values, v_vals
    if p.exps is not None or p.factor_exp:
        e = np.int32(p.factor_exp)
        if p.exps is not None:
            e = xp.repeat(p.exps + e, pb, axis=-1)
        pvals = f32.ldexp_ftz(pvals, e)
    if v_exps is not None:
        vvals = f32.ldexp_ftz(vvals, xp.repeat(v_exps, vb, axis=-2))
    pr = xp.moveaxis(xp.reshape(pvals, (*lead, sq, nt, ns, sub)), -4, -2)  # (.., nt, ns, Sq, sub)
    vr = xp.reshape(vvals, (*lead, nt, ns, sub, dv))
    # computed once: otherwise XLA re-fuses the scaling into every broadcast use of the loop
    pr, vr = materialize((pr, vr))
    per_group = max(1, pv_group // sub)
    rt = xp.swapaxes(r[..., :nt], -1, -2)  # (..., nt, Sq)
    if exact:  # every entry exact; on a GPU one kernel (ordered_gpu.exact_pv_fold), same bits
        return ordered_gpu.exact_pv_fold_dispatch(
            functools.partial(_exact_pv_fold, per_group=per_group), pr, vr, rt, per_group
        )
    # each sub-block's ordered float32 sum: the plain loop where it is proven to give the
    # flushed chain's bits (short significands, no tiny product, no overflow; e.g. E4M3 P
    # times an E4M3 V), else the chain: one predicate per call (per row block under jax)
    g = ordered_product(
        *_pv_group_sums(per_group),
        pr,
        vr,
        operand_stats(pr),
        operand_stats(vr) if v_stats is None else v_stats,
    )
    return _fold_tiles(materialize(g), rt)


def _exact_pv_fold(pr: Array, vr: Array, rt: Array, *, per_group: int) -> Array:
    """:func:`_fold_tiles` of the exact FP4 partials' group sums (every partial exact)."""
    xp = namespace(pr, vr)
    return _fold_tiles(materialize(_group_sums(f32.ftz(_matmul(xp, pr, vr)), per_group)), rt)


def _fold_tiles(g: Array, rt: Array) -> Array:
    """The online-softmax fold of the numerator: ``A = 0``, then for each tile i in order
    ``A ← fl(A·r_i)`` and tile i's group sums ``g[..., i, j]`` added in order (flushed).
    ``g`` (..., nt, ng, Sq, Dv), ``rt`` (..., nt, Sq); returns A (..., Sq, Dv)."""
    xp = namespace(g, rt)
    shape = np.broadcast_shapes(g.shape[:-4], rt.shape[:-2]) + g.shape[-2:]
    acc = xp.zeros(shape, dtype=np.float32)
    for i in range(g.shape[-4]):
        acc = f32.mul_ftz(acc, rt[..., i, :, None])
        for j in range(g.shape[-3]):
            acc = f32.add_ftz(acc, g[..., i, j, :, :])
    return acc


def _group_sums(parts: Any, per_group: int) -> Any:
    """(..., nt, ns, Sq, Dv) sub-block partials -> (..., nt, ns/per_group, Sq, Dv): each
    group's ``per_group`` consecutive partials added in order (flushed)."""
    xp = namespace(parts)
    *lead, nt, ns, sq, dv = parts.shape
    parts = xp.reshape(parts, (*lead, nt, ns // per_group, per_group, sq, dv))
    g = parts[..., 0, :, :]
    for j in range(1, per_group):
        g = f32.add_ftz(g, parts[..., j, :, :])
    return g


@functools.cache
def _pv_group_sums(per_group: int) -> tuple:
    """(plain, chain): the ordered PV sub-block sums (:func:`_pv_plain`, :func:`_pv_chain`)
    and their group adds, on a GPU as one kernel (:mod:`fp4sim.attention.ordered_gpu`).
    Stable objects per ``per_group`` (``ordered_product`` caches by identity)."""

    def sums(partial: Any, plain: bool) -> Any:
        def jnp_path(pr: Any, vr: Any) -> Any:
            # a barrier: fused with the group sums, XLA CPU runs the chain ~7x slower
            return _group_sums(materialize(partial(pr, vr)), per_group)

        def fn(pr: Any, vr: Any) -> Any:
            return ordered_gpu.grouped_dispatch(jnp_path, pr, vr, per_group, plain)

        return fn

    return sums(_pv_plain, True), sums(_pv_chain, False)


def _pv_chain(pr: Any, vr: Any) -> Any:
    """Σ_j fl(pr[..., :, j]·vr[..., j, :]) in j order, every step flushed (the definition):
    pr (..., I, sub), vr (..., sub, Dv)."""
    parts = f32.mul_ftz(pr[..., :, 0, None], vr[..., 0, None, :])
    for j in range(1, pr.shape[-1]):
        parts = f32.add_ftz(parts, f32.mul_ftz(pr[..., :, j, None], vr[..., j, None, :]))
    return parts


def _pv_plain(pr: Array, vr: Array) -> Array:
    """The same sum as :func:`_pv_chain` as a plain ``acc + a·b`` chain and one flush: the
    same bits wherever :func:`fp4sim.attention._ordered.plain_sum_is_exact` holds (proof
    there); one fused chain under jax (measured 2.4x faster than the flushed one on XLA CPU)."""
    parts = pr[..., :, 0, None] * vr[..., 0, None, :]
    for j in range(1, pr.shape[-1]):
        parts = parts + pr[..., :, j, None] * vr[..., j, None, :]
    return f32.ftz(parts)


# --- the TCGEN05 accumulation (Blackwell's block-scaled tcgen05.mma) -------------------------
def _pow2_values(xp: ModuleType, e: Array) -> Array:
    """float32 2^e for int e in [−127, 127] (2^-127 is the UE8M0 code 0, a float32 subnormal);
    e = 128 (the UE8M0 NaN code) gives NaN."""
    e = xp.asarray(e).astype(np.int32)
    one = xp.ones(e.shape, dtype=np.float32)
    return xp.where(e == 128, np.float32(np.nan), f32.ldexp_f32(one, xp.minimum(e, 127)))


def check_tcgen05_recipe(recipe: AttentionRecipe) -> None:
    """``ValueError`` unless ``recipe``'s products are block-scaled ``tcgen05.mma`` kinds:
    Q/K ``MXFP8`` (``kind::mxf8f6f4``, UE8M0 per 32) or ``NVFP4`` (``kind::mxf4nvf4``, UE4M3
    per 16); P ``MXFP8`` with an E4M3 V (``MXFP8_TOKENS`` or ``TOKEN_BLOCK_FP8``) or P ``MXFP4``
    with ``MXFP4_TOKENS`` V (``kind::mxf4``); ``block_kv`` a multiple of 64."""
    problems = []
    if recipe.qk not in (QKFormat.MXFP8, QKFormat.NVFP4):
        problems.append(f"qk={recipe.qk.name} (allowed: MXFP8, NVFP4)")
    pv = (recipe.p_format, recipe.v)
    if pv not in (
        (PFormat.MXFP8, VFormat.MXFP8_TOKENS),
        (PFormat.MXFP8, VFormat.TOKEN_BLOCK_FP8),
        (PFormat.MXFP4, VFormat.MXFP4_TOKENS),
    ):
        problems.append(
            f"(p_format, v)=({recipe.p_format.name}, {recipe.v.name}) (allowed: MXFP8 with "
            f"MXFP8_TOKENS or TOKEN_BLOCK_FP8, MXFP4 with MXFP4_TOKENS)"
        )
    if recipe.block_kv % 64:
        problems.append(f"block_kv={recipe.block_kv} (a multiple of 64)")
    if problems:
        raise ValueError(
            "accumulation=TCGEN05 needs block-scaled tcgen05.mma operands; this recipe has "
            + "; ".join(problems)
        )


def _tcgen05_scores(pb: _Problem, q: Operand, k: Operand, row_ids: Array) -> Array:
    """Scores z (..., rows, keys) of one ``tcgen05.mma`` chain over the head dim per (query,
    key) (:func:`fp4sim.formats.mma.mma_dot`: the block scales inside the instructions), then
    the per-token factors of step 1."""
    from fp4sim.formats.mma import MMA_MODELS, MmaKind, mma_dot
    from fp4sim.formats.spec import UE4M3, UE8M0

    xp = namespace(q.values, k.values)
    if pb.recipe.qk is QKFormat.MXFP8:
        qv, kv = q.values, k.values
        qs, ks = _pow2_values(xp, q.exps), _pow2_values(xp, k.exps)
        kind, elem, sfmt, blk = MmaKind.MXF8F6F4, E4M3, UE8M0, 32
    else:  # NVFP4: values = payload·scale (exact); the scales come from the quantized arrays
        full_q = xp.asarray(q.quantized.scale_values())
        rows = xp.minimum(row_ids, np.int32(full_q.shape[-2] - 1))
        qs = xp.take(full_q, rows, axis=-2)
        ks = xp.asarray(k.quantized.scale_values())[..., : k.values.shape[-2], :]

        def payload(v, s):
            se = xp.repeat(s, 16, axis=-1)
            return xp.where(se > 0, v / xp.where(se > 0, se, np.float32(1.0)), np.float32(0.0))

        qv, kv = payload(q.values, qs), payload(k.values, ks)
        kind, elem, sfmt, blk = MmaKind.MXF4NVF4, E2M1, UE4M3, 16
    z = mma_dot(
        qv[..., :, None, :],
        kv[..., None, :, :],
        model=MMA_MODELS[kind],
        a_format=elem,
        b_format=elem,
        a_scale=qs[..., :, None, :],
        b_scale=ks[..., None, :, :],
        scale_format=sfmt,
        block=blk,
    )
    return _score_factors(q, k, z)


def _tcgen05_partials(
    xp: ModuleType, p: PTile, v_vals: Array, v_exps: Array | None, v_block: int, fp4: bool
) -> Array:
    """Each tile's P·V as one ``tcgen05.mma`` chain over its keys from a zero accumulator:
    (..., n_tiles, 1, Sq, Dv). ``p`` (..., Sq, n_tiles, T); ``v_vals`` (..., n_tiles, T, Dv),
    ``v_exps`` (..., n_tiles, T/32, Dv or 1); ``fp4``: E2M1 P and V (``kind::mxf4``), else
    E4M3 (``kind::mxf8f6f4``)."""
    from fp4sim.formats.mma import MMA_MODELS, MmaKind, mma_dot
    from fp4sim.formats.spec import UE8M0

    kind, elem = (MmaKind.MXF4, E2M1) if fp4 else (MmaKind.MXF8F6F4, E4M3)
    *lead, sq, nt, n = p.values.shape
    dv = v_vals.shape[-1]
    pv = xp.moveaxis(p.values, -2, -3)  # (..., nt, Sq, T)
    ps = _pow2_values(
        xp, xp.moveaxis(p.exps + np.int32(p.factor_exp), -2, -3)
    )  # (.., nt, Sq, T/32)
    vt = xp.swapaxes(v_vals, -1, -2)  # (..., nt, Dv, T)
    ve = xp.broadcast_to(v_exps, (*v_exps.shape[:-1], dv))
    vs = xp.swapaxes(_pow2_values(xp, ve), -1, -2)  # (..., nt, Dv, T/32)
    if v_block != 32 or n % 64:
        raise ValueError(
            f"accumulation=TCGEN05 needs V blocks of 32 tokens and tiles of a multiple of 64 "
            f"keys; got {v_block} and {n}"
        )
    out = mma_dot(
        pv[..., :, None, :],
        vt[..., None, :, :],
        model=MMA_MODELS[kind],
        a_format=elem,
        b_format=elem,
        a_scale=ps[..., :, None, :],
        b_scale=vs[..., None, :, :],
        scale_format=UE8M0,
        block=32,
    )
    return out[..., :, None, :, :]


def _row(x: Array | None) -> np.ndarray | None:
    return None if x is None else np.asarray(x)[0]


def masked_tile(recipe: AttentionRecipe, tile: int, mism: bool) -> PTile | None:
    """P of a key tile masked for the whole row (``t = −inf``), computed once on NumPy, when
    skipping such a tile is exact: every MMA value +0 and a +0 denominator (true for every
    converter; checked here, else None and nothing is skipped). A skipped tile then leaves the
    running max, the normalizer and the accumulator unchanged (r = 1, or r = 0 while they are
    still 0), except that its fl(0·v) partials are NaN in a column where V holds Inf/NaN."""
    with np.errstate(all="ignore"):
        p = convert_tile(
            recipe, np.full((1, tile), -np.inf, dtype=np.float32), need_mismatched=mism
        )
        lt = p.mismatched if mism else _consistent_denominator(np, p, tile)
    if (
        np.asarray(p.values, dtype=np.float32).view(np.uint32).any()
        or np.asarray(lt, dtype=np.float32).view(np.uint32).any()
    ):
        return None
    return p


def _consistent_denominator(xp: ModuleType, p: PTile, n: int) -> Array:
    gb = p.block if p.block > 1 else (32 if n % 32 == 0 else n)
    vb = xp.reshape(p.values, (*p.values.shape[:-1], n // gb, gb))
    sums = f32.tree_sum_ftz(vb, axis=-1)  # (..., nb)
    if p.exps is not None or p.factor_exp:
        e = p.exps if p.exps is not None else xp.zeros(sums.shape, dtype=np.int32)
        per = block_denominator(sums, e + np.int32(p.factor_exp), p.pdiv)
    elif p.pdiv != 1:
        per = f32.div_ftz(sums, np.float32(p.pdiv))
    else:
        per = sums
    acc = per[..., 0]
    for b in range(1, per.shape[-1]):
        acc = f32.add_ftz(acc, per[..., b])
    return acc


# --- one block of query rows: the forward's steps (rows are independent) ---------------------
class _Problem(NamedTuple):
    """What every block of query rows of one :func:`attention_forward` call shares."""

    recipe: AttentionRecipe
    c: np.float32  # float32 score scale softmax_scale·log2(e)
    causal: bool
    sq: int  # query rows
    skv: int  # keys before padding to whole tiles
    dv: int
    lead: tuple[int, ...]  # batch/head axes
    k: Operand  # quantized K, padded to whole tiles
    kbt: Array | None  # K's block-transposed values for the exact score product (or None)
    kseg: Array | None  # key segment ids (padded with -1) or None
    v: Operand  # quantized V, padded
    v_stats: Any  # V's OperandStats for the ordered PV sums (or None: computed per call)
    masked: PTile | None  # P of a fully masked tile when skipping it is exact (causal), else None
    mismatched: bool  # normalization is MISMATCHED
    p_fp4: bool  # P is an FP4 format (MXFP4 or NVFP4)
    intermediates: bool  # return the intermediates too
    accumulation: ForwardAccumulation = ForwardAccumulation.SEQUENTIAL

    @property
    def tile(self) -> int:
        return self.recipe.block_kv

    @property
    def n_tiles(self) -> int:
        return self.k.values.shape[-2] // self.recipe.block_kv


def _row_block(
    pb: _Problem, qo: Operand, qs: Array | None, row_ids: Array, ntu: int, fused: bool = True
) -> tuple:
    """Everything for a set of query rows (module docstring, steps 1-5 and the final output),
    computed on the first ``ntu`` key tiles; the other tiles are masked for all these rows
    (:func:`masked_tile`). On a GPU the Direct-P family runs on the kernels of
    :mod:`fp4sim.attention.direct_p_gpu` (:func:`_direct_p_rows`, the same bits)."""
    if fused and _fused_direct_p(pb, qo, qs):
        return ordered_gpu.on_gpu(
            lambda _, interpret: _direct_p_rows(pb, qo, row_ids, ntu, interpret),
            lambda _: _row_block(pb, qo, qs, row_ids, ntu, fused=False),
            qo.values,
            family="direct_p",
        )
    xp = namespace(qo.values)
    ko, kb, ks = _first_tiles(pb, ntu)
    u, nanf = _row_log2_scores(pb, qo, ko, kb, qs, ks, row_ids, ntu)
    ut = xp.reshape(u, (*pb.lead, qo.values.shape[-2], ntu, pb.tile))
    anchors, prevs, m = running_max(ut, pb.recipe)
    finite = anchors > -np.inf
    safe = xp.where(finite, anchors, np.float32(0.0))
    r = xp.where(prevs > -np.inf, exp2_rn(prevs - safe), np.float32(0.0))
    p = _tile_probabilities(pb, ut, finite, safe)
    acc, den = _accumulate(pb, p, r, ntu)
    out, lse = _finish(pb, acc, den, m, nanf)
    if not pb.intermediates:
        return materialize((out, lse))
    return _with_intermediates(pb, out, lse, anchors, m, p, acc, den, ntu)


def _first_tiles(pb: _Problem, ntu: int) -> tuple[Operand, Any, Any]:
    """K (its operand, block-transposed values and segment ids) cut to the first ``ntu`` tiles."""
    if ntu == pb.n_tiles:
        return pb.k, pb.kbt, pb.kseg
    ku = ntu * pb.tile

    def cut(x: Array | None, axis: int) -> Array | None:  # the first ku keys along axis -1 or -2
        if x is None:
            return None
        return x[(Ellipsis, slice(0, ku)) + (slice(None),) * (-1 - axis)]

    k = pb.k
    ko = k._replace(
        values=cut(k.values, -2),
        exps=cut(k.exps, -2),
        post=cut(k.post, -1),
        post_exp=cut(k.post_exp, -1),
    )
    return ko, cut(pb.kbt, -1), cut(pb.kseg, -1)


def _row_log2_scores(
    pb: _Problem,
    qo: Operand,
    ko: Operand,
    kb: Array | None,
    qs: Array | None,
    ks: Array | None,
    row_ids: Array,
    ntu: int,
) -> tuple[Array, Array]:
    """Steps 1-2: ``u = fl(z·c)`` of these rows against the first ``ntu`` tiles, masked keys
    −inf; and which rows hold a NaN or +Inf score (their output is NaN)."""
    xp = namespace(qo.values)
    ku = ntu * pb.tile
    if pb.accumulation is ForwardAccumulation.TCGEN05:
        z = materialize(_tcgen05_scores(pb, qo, ko, row_ids))
    else:
        z = _scores(qo, ko, kb)  # (..., rows, ku): its last sum fused into u
    rows = row_ids[:, None]
    cols = xp.arange(ku, dtype=np.int32)[None, :]
    valid = (cols < np.int32(pb.skv)) & (rows < np.int32(pb.sq))
    if pb.causal:
        valid = valid & (cols <= rows + np.int32(pb.skv - pb.sq))
    if qs is not None:
        valid = valid & (qs[..., :, None] == ks[..., None, :])
    u = materialize(log2_scores(z, pb.c, valid))
    nanf = xp.any(xp.isnan(u) | (u == np.inf), axis=-1)  # NaN or +Inf score: NaN row
    return u, nanf


def running_max(ut: Array, recipe: AttentionRecipe) -> tuple[Array, Array, Array]:
    """Step 2's running max over the key tiles of ``ut`` (..., rows, tiles, tile) log2 scores,
    the one rule of the forward and the backward's rebuild of P: each tile's max of its finite
    scores (NaN and +Inf scores are left out: those rows are NaN rows), then
    :func:`running_max_from_tile_maxima`. Returns the anchor ``m'`` each tile uses, the anchor
    before it, and the final one ((..., rows, tiles), (..., rows, tiles), (..., rows))."""
    xp = namespace(ut)
    bad = xp.isnan(ut) | (ut == np.inf)
    return running_max_from_tile_maxima(
        xp.max(xp.where(bad, np.float32(-np.inf), ut), axis=-1), recipe
    )


def running_max_from_tile_maxima(mt: Any, recipe: AttentionRecipe) -> tuple[Any, Any, Any]:
    """:func:`running_max` from the tile maxima ``mt`` (..., rows, tiles) of the finite scores:
    from ``m = −inf``, tile by tile ``m' = max(m, mt)`` when ``mt`` exceeds
    ``m + rescale_threshold`` (always when the threshold is 0, or while ``m`` is −inf), else
    ``m`` stays."""
    xp = namespace(mt)
    threshold = recipe.rescale_threshold
    m = xp.full(mt.shape[:-1], -np.inf, dtype=np.float32)
    anchors, prevs = [], []
    for i in range(mt.shape[-1]):
        if threshold == 0:
            m_new = xp.maximum(m, mt[..., i])
        else:
            move = (m == -np.inf) | (mt[..., i] > f32.add_ftz(m, np.float32(threshold)))
            m_new = xp.where(move, xp.maximum(m, mt[..., i]), m)
        prevs.append(m)
        anchors.append(m_new)
        m = m_new
    return xp.stack(anchors, axis=-1), xp.stack(prevs, axis=-1), m


def _tile_probabilities(pb: _Problem, ut: Array, finite: Array, safe: Array) -> PTile:
    """Step 3: ``t = fl(u − m')`` of every tile and its P (:func:`convert_tile`)."""
    xp = namespace(ut)
    t = xp.where(finite[..., None], ut - safe[..., None], np.float32(-np.inf))
    p = convert_tile(pb.recipe, materialize(t), need_mismatched=pb.mismatched)
    return p._replace(
        **dict(
            zip(
                ("codes", "values", "exps", "mismatched"),
                materialize((p.codes, p.values, p.exps, p.mismatched)),
            )
        )
    )


def _accumulate(pb: _Problem, p: PTile, r: Array, ntu: int) -> tuple[Array, Array]:
    """Steps 4-5: the PV partials and tile denominators of every tile, then the sequential
    online-softmax updates ``A ← fl(A·r) + partials``, ``L ← fl(fl(L·r) + L_tile)``; the
    skipped tiles' fl(0·v) column sums last."""
    xp = namespace(p.values)
    vop, tile, lead, dv = pb.v, pb.tile, pb.lead, pb.dv
    nrows = p.values.shape[-3]
    ku = ntu * tile
    v_vals = xp.reshape(vop.values[..., :ku, :], (*lead, ntu, tile, dv))
    v_exps = None
    if vop.exps is not None:
        v_exps = xp.reshape(
            vop.exps[..., : ku // vop.block, :], (*lead, ntu, tile // vop.block, vop.exps.shape[-1])
        )
    if pb.accumulation is ForwardAccumulation.TCGEN05:
        g = materialize(_tcgen05_partials(xp, p, v_vals, v_exps, vop.block, pb.p_fp4))
        acc = _fold_tiles(g, xp.swapaxes(r[..., :ntu], -1, -2))
    else:
        acc = _pv_numerator(
            xp,
            p,
            v_vals,
            v_exps,
            vop.block,
            vop.exact,
            pb.recipe.pv_group,
            pb.p_fp4,
            r,
            pb.v_stats,
        )
    acc = xp.broadcast_to(acc, lead + (nrows, dv))
    lt = p.mismatched if pb.mismatched else _consistent_denominator(xp, p, tile)  # (..., Sq, nt)
    den = xp.zeros(lead + (nrows,), dtype=np.float32)
    for i in range(ntu):
        den = f32.add_ftz(f32.mul_ftz(den, r[..., i]), lt[..., i])
    return _skipped_tiles(pb, acc, ntu), den


def _skipped_tiles(pb: _Problem, acc: Any, ntu: int) -> Any:
    """The accumulator after the tiles beyond the first ``ntu`` (masked for every row)."""
    if ntu == pb.n_tiles:
        return acc
    # the skipped tiles: r = 1 (or 0 with acc = 0), P = +0 and a zero denominator, so
    # each would add fl(0·v) partials: +0, or NaN in a column where V (with its block
    # scales) holds Inf/NaN; one add of their ordered column sums does exactly that
    xp = namespace(acc)
    vop, ku = pb.v, ntu * pb.tile
    vs = vop.values[..., ku:, :]
    if vop.exps is not None:
        vs = f32.ldexp_ftz(vs, xp.repeat(vop.exps[..., ku // vop.block :, :], vop.block, axis=-2))
    zs = xp.sum(f32.mul_ftz(np.float32(0.0), vs), axis=-2)  # (..., Dv): +0 or NaN
    return f32.add_ftz(acc, zs[..., None, :])


def _fused_direct_p(pb: _Problem, qo: Operand, qs: Any) -> bool:
    """Whether these rows may run on the Direct-P kernels (:mod:`fp4sim.attention.direct_p_gpu`):
    NVFP4 Q/K, a Direct-P family converter into MXFP4 P, MXFP4 V along tokens, consistent
    normalization, no segment ids, no intermediates, and shapes the kernels tile."""
    rec, sub = pb.recipe, direct_p_gpu.SUB
    dv, d = pb.dv, qo.values.shape[-1]
    return (
        not pb.intermediates
        and pb.accumulation is ForwardAccumulation.SEQUENTIAL
        and qs is None
        and pb.kseg is None
        and rec.qk is QKFormat.NVFP4
        and qo.exact
        and qo.exps is None
        and qo.post_exp is None
        and qo.block == direct_p_gpu.QK_BLOCK
        and rec.p_format is PFormat.MXFP4
        and isinstance(rec.converter, (AffineP, MitchellP))
        and rec.v is VFormat.MXFP4_TOKENS
        and pb.v.exps is not None
        and pb.v.block == sub
        and rec.normalization is Normalization.CONSISTENT
        and pb.tile % rec.pv_group == 0
        and rec.pv_group % sub == 0
        and direct_p_gpu.rows_block(qo.values.shape[-2]) > 0
        and d % 16 == 0
        and dv >= 16
        and dv & (dv - 1) == 0
    )


def _direct_p_rows(pb: _Problem, qo: Operand, row_ids: Any, ntu: int, interpret: bool) -> tuple:
    """:func:`_row_block` for the Direct-P family on the GPU kernels: tile maxima (kernel), the
    running max and r (here, the same code), the accumulator with the block payload sums and
    exponents (kernel), the tile denominators and L, the skipped tiles, O and LSE (here)."""
    import jax.numpy as jnp

    rec, lead, tile = pb.recipe, pb.lead, pb.tile
    ko, _, _ = _first_tiles(pb, ntu)
    rows, d = qo.values.shape[-2:]
    ku, nb = ntu * tile, math.prod(lead)

    def flat(x: Any, tail: tuple) -> Any:
        return None if x is None else jnp.reshape(jnp.broadcast_to(x, lead + tail), (nb,) + tail)

    qv, kv = flat(qo.values, (rows, d)), flat(ko.values, (ku, d))
    qp, kp = flat(qo.post, (rows,)), flat(ko.post, (ku,))
    consts = dict(
        c=float(pb.c),
        skv=pb.skv,
        sq=pb.sq,
        causal=pb.causal,
        tile=tile,
        ntu=ntu,
        interpret=interpret,
    )
    mt, nan = direct_p_gpu.tile_maxima(qv, kv, qp, kp, row_ids, **consts)
    anchors, prevs, m = running_max_from_tile_maxima(jnp.swapaxes(mt, 1, 2), rec)  # (nb, rows, ntu)
    finite = anchors > -np.inf
    safe = jnp.where(finite, anchors, np.float32(0.0))
    r = jnp.where(prevs > -np.inf, exp2_rn(prevs - safe), np.float32(0.0))
    vop = pb.v
    vv = f32.ldexp_ftz(
        vop.values[..., :ku, :], jnp.repeat(vop.exps[..., : ku // vop.block, :], vop.block, axis=-2)
    )
    fexp = rec.converter.factor_exp(rec.p_format)
    acc, sums, kb = direct_p_gpu.accumulate(
        qv,
        kv,
        qp,
        kp,
        row_ids,
        flat(vv, (ku, pb.dv)),
        *(jnp.swapaxes(x, 1, 2) for x in (safe, finite, r)),
        converter=rec.converter,
        ceil_rule=rec.block_exponent is BlockExponent.BLOCK_MAX_CEIL,
        factor_exp=fexp,
        pv_group=rec.pv_group,
        **consts,
    )
    nsub = tile // direct_p_gpu.SUB
    sums, kb = (jnp.reshape(jnp.swapaxes(x, 1, 2), (nb, rows, ntu, nsub)) for x in (sums, kb))
    per = block_denominator(sums, kb + np.int32(fexp), rec.p_format.divisor)
    lt = per[..., 0]
    for b in range(1, nsub):
        lt = f32.add_ftz(lt, per[..., b])
    den = jnp.zeros((nb, rows), dtype=np.float32)
    for i in range(ntu):
        den = f32.add_ftz(f32.mul_ftz(den, r[..., i]), lt[..., i])
    acc = _skipped_tiles(pb, jnp.reshape(acc, lead + (rows, pb.dv)), ntu)
    out, lse = _finish(
        pb,
        acc,
        jnp.reshape(den, lead + (rows,)),
        jnp.reshape(m, lead + (rows,)),
        jnp.reshape(nan != 0, lead + (rows,)),
    )
    return materialize((out, lse))


def _finish(pb: _Problem, acc: Array, den: Array, m: Array, nanf: Array) -> tuple[Array, Array]:
    """``O = represented_output(A, L, div)`` and the natural-log LSE (module docstring)."""
    xp = namespace(acc)
    # per-row values computed once (else fused into, and recomputed for, every column)
    den, m = materialize((den, m))
    recipe = pb.recipe
    unit = converter_unit(recipe)
    if pb.mismatched:
        a_div, lse_unit = pb.v.div, unit
    else:
        pdiv = recipe.p_format.divisor
        a_div, lse_unit = pdiv * pb.v.div, unit / pdiv
    out = represented_output(acc, den[..., None], a_div)
    pos = den > 0
    l2 = log2_f32(den)
    if lse_unit != 1:
        l2 = f32.ftz(l2 - np.float32(math.log2(lse_unit)))
    lse = xp.where(pos, f32.mul_ftz(f32.add_ftz(m, l2), _LN2), np.float32(-np.inf))
    out = xp.where(nanf[..., None], np.float32(np.nan), out)
    lse = xp.where(nanf, np.float32(np.nan), lse)
    return out, lse


def _with_intermediates(
    pb: _Problem,
    out: Array,
    lse: Array,
    anchors: Array,
    m: Array,
    p: PTile,
    acc: Array,
    den: Array,
    ntu: int,
) -> tuple:
    """The row block's outputs with its intermediates, the skipped tiles filled in."""
    xp = namespace(out)
    n_tiles = pb.n_tiles

    def flat(
        x: Array | None, fill: Array
    ) -> Array | None:  # (..., Sq, ntu, w) -> (..., Sq, n_tiles*w)
        if x is None:
            return None
        x = xp.reshape(x, x.shape[:-2] + (-1,))
        if ntu == n_tiles:
            return x
        fill = xp.broadcast_to(
            xp.asarray(np.tile(fill, n_tiles - ntu)),
            x.shape[:-1] + (fill.shape[-1] * (n_tiles - ntu),),
        )
        return xp.concatenate([x, fill], axis=-1)

    if ntu < n_tiles:  # a skipped tile's anchor is the running max, unchanged
        anchors = xp.concatenate(
            [anchors, xp.broadcast_to(m[..., None], m.shape + (n_tiles - ntu,))], axis=-1
        )
    mk = (
        pb.masked if pb.masked is not None else PTile(None, None, None, None, 0, 0, 1.0, None, None)
    )
    return materialize(
        (
            out,
            lse,
            anchors,
            flat(p.codes, _row(mk.codes)),
            flat(p.scales, _row(mk.scales)),
            flat(p.k, _row(mk.k)),
            acc,
            den,
        )
    )


# --- the forward ----------------------------------------------------------------------------
def attention_forward(
    q: Array,
    k: Array,
    v: Array,
    recipe: AttentionRecipe,
    *,
    causal: bool = False,
    q_segment_ids: Array | None = None,
    kv_segment_ids: Array | None = None,
    softmax_scale: float | None = None,
    return_intermediates: bool = False,
    accumulation: ForwardAccumulation = ForwardAccumulation.SEQUENTIAL,
) -> ForwardResult:
    """Emulated forward of ``recipe`` (see the module docstring). Returns O, LSE (natural log)
    and, on request, the intermediates. PyTorch tensors (any float dtype, any device) and other
    ``__dlpack__`` arrays are read as NumPy (:func:`fp4sim._xp.adopt`); the results are NumPy.
    Not differentiable (it computes on bit patterns): ``jax.grad``/``jax.jvp`` raise
    :class:`fp4sim.NoDerivativeError`; differentiate :func:`fp4sim.emulated_attention` with a
    ``TrainingRecipe`` (the emulated backward). ``accumulation``
    (:class:`~fp4sim.attention.recipe.ForwardAccumulation`): ``SEQUENTIAL`` (the default, steps 1
    and 4 above) or ``TCGEN05``, Blackwell's block-scaled ``tcgen05.mma`` for both products
    (:func:`check_tcgen05_recipe` says which recipes), the bits fp4sim's sm_100a kernels
    (:mod:`fp4sim.kernels.attention_sm100`) should return for S and P."""
    q, k, v = adopt(q, "q"), adopt(k, "k"), adopt(v, "v")
    q_segment_ids, kv_segment_ids = (
        adopt(q_segment_ids, "q_segment_ids"),
        adopt(kv_segment_ids, "kv_segment_ids"),
    )
    check_static("recipe", recipe, AttentionRecipe, "fp4sim.PRESETS['flamia_nvfp4']")
    causal = check_bool("causal", causal)
    return_intermediates = check_bool("return_intermediates", return_intermediates)
    if not isinstance(accumulation, ForwardAccumulation):
        raise TypeError(
            f"accumulation={accumulation!r} must be a ForwardAccumulation; allowed: "
            f"{[m.name for m in ForwardAccumulation]}"
        )
    if accumulation is ForwardAccumulation.TCGEN05:
        check_tcgen05_recipe(recipe)
    xp = namespace(q, k, v, q_segment_ids, kv_segment_ids)
    # no derivative (bit-level arithmetic): jax.grad raises, naming emulated_attention
    q, k, v = (
        no_derivative(_as_f32(xp, x, n), "attention_forward")
        for x, n in ((q, "q"), (k, "k"), (v, "v"))
    )
    check_qkv_shapes(q, k, v)
    sq, d = q.shape[-2:]
    skv, dv = v.shape[-2:]
    if sq == 0 or skv == 0 or d == 0 or dv == 0:
        raise ValueError(f"empty attention: q {q.shape}, k {k.shape}, v {v.shape}")
    if d % recipe.qk_block:
        raise ValueError(
            f"head dim {d} is not a multiple of the {recipe.qk.name} scale block {recipe.qk_block}"
        )
    c = score_scale(d, softmax_scale)
    if kv_segment_ids is not None and q_segment_ids is None:
        raise ValueError("kv_segment_ids given without q_segment_ids")
    qseg = kseg = None
    if q_segment_ids is not None:
        qseg = xp.asarray(q_segment_ids)
        kseg = qseg if kv_segment_ids is None else xp.asarray(kv_segment_ids)
        if np.dtype(qseg.dtype).kind not in "iu" or np.dtype(kseg.dtype).kind not in "iu":
            raise TypeError(f"segment ids must be integer arrays; got {qseg.dtype}, {kseg.dtype}")
        if qseg.shape[-1] != sq or kseg.shape[-1] != skv:
            raise ValueError(
                f"segment ids must end in ({sq},) and ({skv},); got {qseg.shape} and {kseg.shape}"
            )
        qseg = xp.broadcast_to(qseg.astype(np.int32), q.shape[:-1])
        kseg = xp.broadcast_to(kseg.astype(np.int32), k.shape[:-1])

    # pad keys to whole tiles (masked zero keys)
    tile = recipe.block_kv
    n_tiles = -(-skv // tile)
    pad = n_tiles * tile - skv
    if pad:
        widths = [(0, 0)] * (k.ndim - 2) + [(0, pad), (0, 0)]
        k = xp.pad(k, widths)
        v = xp.pad(v, widths)
        if kseg is not None:
            kseg = xp.pad(kseg, [(0, 0)] * (kseg.ndim - 1) + [(0, pad)], constant_values=-1)

    if recipe.hadamard:
        q, k = hadamard(q), hadamard(k)
    qop = quantize_qk(q, recipe)
    kop = quantize_qk(k, recipe)
    vop = quantize_v(v, recipe)

    mism = recipe.normalization is Normalization.MISMATCHED
    p_fp4 = recipe.p_format in (PFormat.MXFP4, PFormat.NVFP4)
    lead = q.shape[:-2]

    kbt = materialize(_key_blocks(kop))  # loop-invariant: transposed once, not per row block
    # V's statistics for the ordered PV sums, once for all keys (unscaled V values only)
    v_stats = operand_stats(vop.values) if vop.exps is None else None
    # causal: the trailing key tiles that every row of a row block masks are skipped (below)
    masked = masked_tile(recipe, tile, mism) if causal else None

    pb = _Problem(
        recipe=recipe,
        c=c,
        causal=causal,
        sq=sq,
        skv=skv,
        dv=dv,
        lead=lead,
        k=kop,
        kbt=kbt,
        kseg=kseg,
        v=vop,
        v_stats=v_stats,
        masked=masked,
        mismatched=mism,
        p_fp4=p_fp4,
        intermediates=return_intermediates,
        accumulation=accumulation,
    )

    def tiles_needed(r1: int) -> int:
        """Key tiles the rows before ``r1`` can see (all of them unless causal)."""
        if masked is None:
            return n_tiles
        last = r1 - 1 + skv - sq  # the last key row r1 - 1 sees (end-aligned causal)
        return max(1, min(n_tiles, last // tile + 1)) if last >= 0 else 1

    def rows_fn(qo: Operand, qs: Array | None, row_ids: Array, ntu: int) -> tuple:
        return _row_block(pb, qo, qs, row_ids, ntu)

    chunk = _ROW_CHUNK
    if xp is np:
        # NumPy: blocks of _NP_ROW_CHUNK rows bound the memory (rows are independent)
        outs = []
        with np.errstate(over="ignore", invalid="ignore"):  # Inf/NaN follow the row policy
            for r0 in range(0, sq, _NP_ROW_CHUNK):
                sl = slice(r0, min(sq, r0 + _NP_ROW_CHUNK))
                qo = qop._replace(
                    values=qop.values[..., sl, :],
                    exps=None if qop.exps is None else qop.exps[..., sl, :],
                    post=None if qop.post is None else qop.post[..., sl],
                    post_exp=None if qop.post_exp is None else qop.post_exp[..., sl],
                )
                outs.append(
                    rows_fn(
                        qo,
                        None if qseg is None else qseg[..., sl],
                        np.arange(sl.start, sl.stop, dtype=np.int32),
                        tiles_needed(sl.stop),
                    )
                )
        nl = len(lead)
        res = tuple(
            None if outs[0][j] is None else np.concatenate([o[j] for o in outs], axis=nl)
            for j in range(len(outs[0]))
        )
    else:

        def jax_rows(chunk: int) -> tuple:
            if sq <= chunk:
                return rows_fn(qop, qseg, xp.arange(sq, dtype=np.int32), tiles_needed(sq))
            # jax: map over chunks of query rows (same arithmetic per row; bounded memory, cache)
            from jax import lax

            n_chunks = -(-sq // chunk)
            padr = n_chunks * chunk - sq
            nl = len(lead)

            def split(x: Array | None, axis: int) -> Array | None:  # rows -> (n_chunks, ...)
                if x is None:
                    return None
                axis = axis % x.ndim
                if padr:
                    x = xp.pad(x, [(0, 0)] * axis + [(0, padr)] + [(0, 0)] * (x.ndim - axis - 1))
                x = xp.reshape(x, x.shape[:axis] + (n_chunks, chunk) + x.shape[axis + 1 :])
                return xp.moveaxis(x, axis, 0)

            parts = (
                split(qop.values, -2),
                split(qop.exps, -2),
                split(qop.post, -1),
                split(qop.post_exp, -1),
                split(qseg, -1),
                xp.reshape(xp.arange(n_chunks * chunk, dtype=np.int32), (n_chunks, chunk)),
            )

            def one(xs, ntu):
                qv, qe, qp, qpe, qs, ids = xs
                return rows_fn(
                    qop._replace(values=qv, exps=qe, post=qp, post_exp=qpe), qs, ids, ntu
                )

            # row blocks in up to _BUCKETS consecutive groups, each mapped with the key tiles its
            # last block needs (causal: later rows see more tiles; otherwise one group)
            bounds = sorted({n_chunks * b // _BUCKETS for b in range(1, _BUCKETS)} | {n_chunks})
            if masked is None:
                bounds = [n_chunks]
            groups, c0 = [], 0
            for c1 in bounds:
                if c1 > c0:
                    ntu = tiles_needed(min(sq, c1 * chunk))
                    if groups and groups[-1][2] == ntu:
                        groups[-1] = (groups[-1][0], c1, ntu)
                    else:
                        groups.append((c0, c1, ntu))
                    c0 = c1
            outs = []
            for c0, c1, ntu in groups:
                sub = tuple(None if x is None else x[c0:c1] for x in parts)
                if c1 - c0 == 1:
                    y = one(tuple(None if x is None else x[0] for x in sub), ntu)
                    outs.append(tuple(None if a is None else a[None] for a in y))
                else:
                    outs.append(lax.map(lambda xs, ntu=ntu: one(xs, ntu), sub))
            mapped = (
                outs[0]
                if len(outs) == 1
                else tuple(
                    None if outs[0][j] is None else xp.concatenate([o[j] for o in outs], axis=0)
                    for j in range(len(outs[0]))
                )
            )

            def merge(y: Array) -> Array:  # (n_chunks, ..., chunk, ...) -> (..., Sq, ...)
                y = xp.moveaxis(y, 0, nl)
                y = xp.reshape(y, y.shape[:nl] + (n_chunks * chunk,) + y.shape[nl + 2 :])
                return y[(slice(None),) * nl + (slice(0, sq),)]

            return tuple(None if y is None else merge(y) for y in mapped)

        gpu_chunk = _GPU_ROW_CHUNK_FUSED if _fused_direct_p(pb, qop, qseg) else _GPU_ROW_CHUNK
        if gpu_chunk == chunk or sq <= chunk:
            res = jax_rows(chunk)
        else:  # on a GPU: fewer, larger row chunks (rows are independent: the same bits)
            res = ordered_gpu.on_gpu(
                lambda _, interpret: jax_rows(gpu_chunk),
                lambda _: jax_rows(chunk),
                qop.values,
                family="rows",
            )
    # one NaN on every backend (NumPy and XLA give float arithmetic's NaN different signs)
    out, lse = canonical_nan(res[0]), canonical_nan(res[1])
    if not return_intermediates:
        return ForwardResult(out, lse, None)
    _, _, anchors, codes, scales, ks, acc, den = res
    inter = ForwardIntermediates(
        qop, kop, vop, anchors, codes, scales, ks, canonical_nan(acc), canonical_nan(den), c
    )
    return ForwardResult(out, lse, inter)

"""Attention backward: the exact float64 reference and the emulated low-precision backward.

This module owns the gradient of softmax attention ``O = softmax(c_e·Q Kᵀ + mask) V``
(``c_e`` = softmax scale, natural-log units) with respect to Q, K and V, in two forms:

* :func:`attention_grad_reference`: NumPy float64, no quantization, the oracle (built on the
  float64 forward :func:`fp4sim.attention.reference.attention_reference`).
* :func:`emulated_backward`: what a low-precision training kernel computes, written once against
  the array namespace (NumPy, or jax under ``jit``/``vmap``). It takes the forward's saved state
  (the represented probabilities ``P̃`` rebuilt bit-identically from the saved quantized Q/K,
  the quantized V the forward multiplied, the forward output O) and the upstream gradient dO, and
  forms, with the formats of a :class:`TrainingRecipe`::

      dO_q = quantize(dO)                      E5M2 by default (one copy for dV and dP)
      dV   = P_bᵀ · dO_q                       P_b = P̃ in the backward's P format (FP8 E4M3)
      dP   = dO_q · V̂ᵀ                         V̂ = the forward's quantized V
      D    = rowsum(dO_D ∘ O)                  dO_D = dO_q (matched) or float dO (a mismatch)
      dS   = P̃ ∘ (dP − D)                      softmax gradient, from the *same* P̃ as the forward
                                               (or, Attn-QAT, the unquantized p with D from O_hp)
      dS_q = quantize(dS)                      32×32 square tiles (one copy serves dQ and dK),
                                               or per query row (the causal-exact option)
      dQ   = c_e · dS_q · K̂      dK = c_e · dS_qᵀ · Q̂

  The same dequantized copy of each operand serves every product it enters (V̂ in PV and dP,
  dO_q in dV and dP, dS_q in dQ and dK, Q̂/K̂ in the scores and in dK/dQ), which is exact for
  token-block and 32×32 scalings ("valid in both orientations"); for Q/K blocked along the head
  dimension a kernel would need a second copy scaled along tokens for dQ/dK — not modelled.
  Products are float32 matrix products of dequantized operands: every operand is exactly its
  low-precision value, the accumulation is float32 term by term in contraction order
  (:class:`BackwardAccumulation` ``SEQUENTIAL``: the same bits on NumPy and under jit; the
  tensor core's own accumulation is modelled in :mod:`fp4sim.formats.matmul`, not here) or,
  for speed,
  the backend's matmul (``BACKEND``). ``SEQUENTIAL`` runs as an unflushed ``acc + a·b`` loop
  whenever :func:`plain_sum_is_exact` proves it gives the same bits (the recipes' 8-bit
  operands: exact products, none below 2^-103), per cache-sized output block, skipping the
  all-zero terms of causal row blocks; otherwise as the flushed chain. The statistics of the
  quantized P, dO and dS operands are bounds taken from their quantizers' block exponents
  (:func:`fp4sim.attention.operands.fake_quantize_stats`), not a pass over the elements; any
  sound bounds give the same bits (:func:`fp4sim.attention._ordered.quantized_stats`). ``D`` is a fixed
  pairwise-tree sum, ``dS`` is formed elementwise; every float32 step flushes results below
  2^-126 (``.ftz`` arithmetic) and reads float32-subnormal operands as +0 (DAZ: XLA CPU
  does so by itself; the emulator flushes the operands explicitly with integer operations, so
  NumPy and ``jax.jit`` give the same bits also where P̃, dO or O are float32-subnormal).

The identity ``D_i = Σ_j P̃_ij dP_ij = rowsum(dO_i ∘ O_i)`` holds only when ``O = P̃ V̂`` with the
very ``P̃`` used in dS; the rows of dS then sum to ``D_i·(1 − Σ_j P̃_ij)``, which is zero only
under consistent normalization (0 vs 0.068027 in the two-key example).
:mod:`fp4sim.attention.consistency` checks these and the other invariants.

Masks are those of :mod:`fp4sim.attention.reference`: ``causal`` aligned at the end (query i
sees keys j ≤ i + (M − N)) and segment ids (packed documents: query i sees key j only when both
carry the same id). A fully masked row has O = 0, LSE = −inf and zero gradients.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import numpy as np

from fp4sim import _xp
from fp4sim._checks import as_float_array, check_same_shape
from fp4sim._xp import Array
from fp4sim.attention import operands, ordered_gpu
from fp4sim.attention._ordered import operand_stats, plain_or_chain, plain_sum_is_exact
from fp4sim.attention.recipe import (  # defined with every recipe; re-exported here
    BackwardAccumulation,
    DeltaSource,
    DsProbabilities,
    TrainingRecipe,
)
from fp4sim.formats import f32

__all__ = [
    "Gradients",
    "attention_grad_reference",
    "softmax_grad",
    "DeltaSource",
    "DsProbabilities",
    "BackwardAccumulation",
    "BackwardTrace",
    "emulated_backward",
    "TrainingRecipe",
]


class Gradients(NamedTuple):
    """dQ, dK, dV of one attention call (same shapes as Q, K, V)."""

    dq: Array
    dk: Array
    dv: Array


def softmax_grad(p: Array, dp: Array, delta: Array) -> Array:
    """``dS = P ∘ (dP − D)``: the gradient through the row softmax, D broadcast along keys.

    ``p`` and ``dp`` are (..., N, M), ``delta`` is (..., N). With ``D = Σ_j P_ij dP_ij`` each row
    of dS sums to zero; with any other D it sums to ``D·(1 − Σ_j P_ij) + (Σ P dP − D)``.
    """
    xp = _xp.namespace(p, dp, delta)
    p, dp, delta = (as_float_array(n, a, xp) for n, a in (("p", p), ("dp", dp), ("delta", delta)))
    check_same_shape(p=p, dp=dp)
    if tuple(delta.shape) != tuple(p.shape[:-1]):
        raise ValueError(
            f"delta has shape {tuple(delta.shape)}; it must be p's shape without "
            f"the key axis, {tuple(p.shape[:-1])}"
        )
    return p * (dp - delta[..., None])


def attention_grad_reference(
    q: Array,
    k: Array,
    v: Array,
    d_out: Array,
    *,
    softmax_scale: float | None = None,
    causal: bool = False,
    q_segment_ids: Array | None = None,
    kv_segment_ids: Array | None = None,
) -> Gradients:
    """Exact float64 gradients of ``Σ O ∘ d_out`` with respect to q, k, v.

    Shapes (..., N, d), (..., M, d), (..., M, dv), (..., N, dv); any leading batch/head axes.
    The probabilities and O come from :func:`fp4sim.attention.reference.attention_reference`
    (same masks, same validation); a fully masked query row contributes nothing.
    """
    from fp4sim.attention.reference import attention_reference

    d_out = as_float_array("d_out", d_out)
    ref = attention_reference(
        q,
        k,
        v,
        causal=causal,
        q_segment_ids=q_segment_ids,
        kv_segment_ids=kv_segment_ids,
        softmax_scale=softmax_scale,
    )
    q, k, v, d_out = (np.asarray(x, dtype=np.float64) for x in (q, k, v, d_out))
    if d_out.shape != ref.out.shape:
        raise ValueError(f"d_out.shape={d_out.shape} must be {ref.out.shape} (the output's shape)")
    scale = 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else float(softmax_scale)
    p = ref.probs
    dp = d_out @ np.swapaxes(v, -1, -2)
    delta = np.sum(d_out * ref.out, axis=-1)
    ds = softmax_grad(p, dp, delta)
    dq = scale * (ds @ k)
    dk = scale * (np.swapaxes(ds, -1, -2) @ q)
    dv = np.swapaxes(p, -1, -2) @ d_out
    return Gradients(dq, dk, dv)


# --- the emulated backward --------------------------------------------------------------------
def _matmul(
    a: Array,
    b: Array,
    accumulation: BackwardAccumulation = BackwardAccumulation.SEQUENTIAL,
    *,
    a_stats: Any = None,
    b_stats: Any = None,
    needed: Any = None,
    transpose_a: bool = False,
) -> Array:
    """float32 ``a @ b`` of dequantized operands (a (..., I, K), b (..., K, J)); with
    ``transpose_a`` the product ``aᵀ @ b`` of a stored (..., K, I) (no transposed copy is made:
    on XLA CPU a transpose of a 2048² operand costs ~25 ms, more than its product loop).

    ``SEQUENTIAL``: operands below 2^-126 are read as +0 first (DAZ, what XLA CPU does; done
    with integer operations so NumPy and jax agree), then ``acc_0 = fl(a_0 b_0)``,
    ``acc_k = fl(acc_{k−1} + fl(a_k b_k))`` with every result below 2^-126 flushed (:mod:`fp4sim.formats.f32`, which also keeps XLA from fusing
    the multiply into the add). When :func:`plain_sum_is_exact` holds for the operands, the same
    bits come from the unflushed ``acc + a_k·b_k`` (a fused multiply-add allowed) and one final
    flush of the result (proof there), about 3x faster; otherwise the flushed chain runs. A
    Python loop on NumPy, ``lax.fori_loop`` under jax (chosen by one ``lax.cond`` for the whole
    batch, also under ``vmap``). ``a_stats``/``b_stats``: :func:`operand_stats` of the operands
    as stored (pass them for transposed views: a reduction over a transpose is slow on XLA CPU).
    ``needed`` (jax, SEQUENTIAL; shaped like the output): the plain loop may return +0 for an
    output block where every element of ``needed`` is ±0 or NaN, instead of the product — for
    a caller that multiplies the output by ``needed`` (0·x and NaN·x do not depend on x's
    value there).
    """
    xp = _xp.namespace(a, b)
    a = xp.asarray(a, dtype=np.float32)
    b = xp.asarray(b, dtype=np.float32)
    if accumulation is BackwardAccumulation.BACKEND:
        a = _swap(a) if transpose_a else a
        if xp is np:
            return np.matmul(a, b)
        import jax

        return xp.matmul(a, b, precision=jax.lax.Precision.HIGHEST)
    a_stats = operand_stats(a) if a_stats is None else a_stats
    b_stats = operand_stats(b) if b_stats is None else b_stats
    # float32-subnormal operands are read as zero (DAZ) on every backend, by integer operations:
    # XLA CPU does so on its own, NumPy would not (same bits on both; the stats of the
    # unflushed operands remain valid bounds: flushing only removes small magnitudes)
    a, b = f32.ftz(a), f32.ftz(b)
    if xp is np:
        a = _swap(a) if transpose_a else a  # a view
        if bool(plain_sum_is_exact(a_stats, b_stats, a.shape[-1])):
            acc = a[..., :, 0, None] * b[..., 0, None, :]
            for k in range(1, a.shape[-1]):
                acc = acc + a[..., :, k, None] * b[..., k, None, :]
            return f32.ftz(acc)
        acc = f32.mul_ftz(a[..., :, 0, None], b[..., 0, None, :])
        for k in range(1, a.shape[-1]):
            acc = f32.add_ftz(acc, f32.mul_ftz(a[..., :, k, None], b[..., k, None, :]))
        return acc
    seq = _sequential_jax(transpose_a)
    if needed is None:
        return seq(a, b, tuple(a_stats), tuple(b_stats))
    needed = xp.broadcast_to(
        xp.asarray(needed, dtype=np.float32),
        tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
        + (a.shape[-1 if transpose_a else -2], b.shape[-1]),
    )
    return seq(a, b, tuple(a_stats), tuple(b_stats), needed)


_BLOCK_ELEMENTS = 1 << 15  # the plain loop's accumulator block (128 KiB: stays in L2)
_BLOCK_COLS = 256  # at most this many output columns per block


def _loop(a: Array, b: Array, plain: bool, needed: Any = None, transposed: bool = False) -> Array:
    """The sequential sum under jax: the flushed chain, or (``plain``) ``acc + a_k·b_k`` then
    one flush, computed per block of the output (rows × columns, at most ``_BLOCK_ELEMENTS``
    accumulators with the leading axes) so that the accumulator stays in the cache; every
    output element still sums its terms in contraction order. The loop reads ``a`` along its
    columns: ``transposed`` — ``a`` is given as (..., K, I) and each block is a column slice
    of it; otherwise a row block of ``a`` (..., I, K) is transposed inside each block (measured
    2x faster on XLA CPU than slicing one transposed copy). With ``needed``, a plain output
    block where ``needed`` has no nonzero is left +0 (:func:`_matmul`)."""
    from jax import lax

    xp = _xp.namespace(a, b)
    if not plain:
        at = a if transposed else _swap(a)  # (..., K, I): row k is column k of a

        def term(k: Array) -> Array:
            ak = lax.dynamic_index_in_dim(at, k, axis=at.ndim - 2, keepdims=False)[..., :, None]
            bk = lax.dynamic_index_in_dim(b, k, axis=b.ndim - 2, keepdims=True)
            return f32.mul_ftz(ak, bk)

        return lax.fori_loop(1, at.shape[-2], lambda k, acc: f32.add_ftz(acc, term(k)), term(0))

    n_k, n_i = a.shape[-2:] if transposed else a.shape[:-3:-1]
    n_j = b.shape[-1]
    lead = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    a = xp.broadcast_to(a, lead + a.shape[-2:])
    b = xp.broadcast_to(b, lead + b.shape[-2:])
    n_lead = math.prod(lead)
    cols = max([c for c in range(1, min(n_j, _BLOCK_COLS) + 1) if n_j % c == 0])
    rows = max(
        [r for r in range(1, n_i + 1) if n_i % r == 0 and r * cols * n_lead <= _BLOCK_ELEMENTS]
        or [1]
    )
    if (rows, cols) == (n_i, n_j):
        return f32.ftz(_plain_block(a, b, transposed))
    ni, nj = n_i // rows, n_j // cols
    nl = len(lead)
    bb = xp.moveaxis(xp.reshape(b, lead + (n_k, nj, cols)), -2, 0)  # (nj, ..., K, cols)
    # per row block, the contraction range outside of which its columns of a are all zero (a
    # causal mask's zeros): those terms are ±0 (finite operands), skipping them changes only
    # the sign of zeros, which the final flush sets to +0
    if transposed:
        live = xp.any(
            xp.reshape(a, lead + (n_k, ni, rows)) != 0, axis=tuple(range(nl)) + (nl + 2,)
        )  # (K, ni)
        live = xp.swapaxes(live, 0, 1)
    else:
        ab = xp.moveaxis(xp.reshape(a, lead + (ni, rows, n_k)), -3, 0)  # (ni, ..., rows, K)
        live = xp.any(ab != 0, axis=tuple(range(1, nl + 1)) + (nl + 1,))  # (ni, K)
    idx = xp.arange(n_k, dtype=np.int32)
    lo = xp.min(xp.where(live, idx, np.int32(n_k)), axis=-1)
    hi = xp.max(xp.where(live, idx + 1, np.int32(0)), axis=-1)
    lo = xp.minimum(lo, hi)

    if needed is not None:  # (ni, nj): does the block hold a needed entry?
        nb = xp.reshape(needed != 0, lead + (ni, rows, nj, cols))  # NaN counts as needed
        busy = xp.reshape(xp.any(nb, axis=tuple(range(nl)) + (nl + 1, nl + 3)), (ni * nj,))

    def a_block(i: Array) -> Array:  # (..., K, rows): columns i·rows ... of a
        if transposed:
            return lax.dynamic_slice_in_dim(a, i * rows, rows, axis=a.ndim - 1)
        return _swap(lax.dynamic_index_in_dim(ab, i, keepdims=False))

    def one(t: Array) -> Array:
        b_blk = lax.dynamic_index_in_dim(bb, t % nj, keepdims=False)
        if needed is None:
            return _plain_range(a_block(t // nj), b_blk, lo[t // nj], hi[t // nj])
        return lax.cond(
            busy[t],
            lambda: _plain_range(a_block(t // nj), b_blk, lo[t // nj], hi[t // nj]),
            lambda: xp.zeros(lead + (rows, cols), dtype=np.float32),
        )

    out = lax.map(one, xp.arange(ni * nj, dtype=np.int32))  # (ni*nj, ..., rows, cols)
    out = xp.reshape(out, (ni, nj) + lead + (rows, cols))
    out = xp.moveaxis(out, (0, 1), (nl, nl + 1))  # (..., ni, nj, rows, cols)
    out = xp.swapaxes(out, -3, -2)  # (..., ni, rows, nj, cols)
    return f32.ftz(xp.reshape(out, lead + (n_i, n_j)))


def _plain_block(a: Array, b: Array, transposed: bool) -> Array:
    """``Σ_k a[..., :, k] ⊗ b[..., k, :]`` in order k = 0, 1, ... (plain float32; a (..., I, K),
    or (..., K, I) when ``transposed``; b (..., K, J)), eight terms per loop step. Column k of
    a non-transposed ``a`` is read in place (a strided slice fused into the step): measured
    about 2x faster on XLA CPU than transposing a 512² ``a`` first."""
    from jax import lax

    def term(k: Array) -> Array:
        if transposed:
            ak = lax.dynamic_index_in_dim(a, k, axis=a.ndim - 2, keepdims=False)[..., :, None]
        else:
            ak = lax.dynamic_index_in_dim(a, k, axis=a.ndim - 1, keepdims=True)
        bk = lax.dynamic_index_in_dim(b, k, axis=b.ndim - 2, keepdims=True)
        return ak * bk

    n_k = a.shape[-2] if transposed else a.shape[-1]
    return lax.fori_loop(1, n_k, lambda k, acc: acc + term(k), term(0), unroll=4)


def _plain_range(at: Array, b: Array, lo: Array, hi: Array) -> Array:
    """``Σ_{lo ≤ k < hi} at_k ⊗ b_k`` in order, from +0 (plain float32; dynamic bounds), four
    terms per loop step."""
    from jax import lax

    xp = _xp.namespace(at, b)

    def term(k: Array) -> Array:
        ak = lax.dynamic_index_in_dim(at, k, axis=at.ndim - 2, keepdims=False)[..., :, None]
        bk = lax.dynamic_index_in_dim(b, k, axis=b.ndim - 2, keepdims=True)
        return ak * bk

    def four(j: Array, acc: Array) -> Array:
        k = lo + 4 * j
        return acc + term(k) + term(k + 1) + term(k + 2) + term(k + 3)

    acc = xp.zeros(at.shape[:-2] + (at.shape[-1], b.shape[-1]), dtype=np.float32)
    n4 = (hi - lo) // 4
    acc = lax.fori_loop(0, n4, four, acc)
    return lax.fori_loop(lo + 4 * n4, hi, lambda k, acc: acc + term(k), acc)


@functools.cache
def _sequential_jax(transposed: bool = False):
    """``a @ b`` (``transposed``: ``aᵀ @ b``) SEQUENTIAL under jax: the plain loop where
    :func:`plain_sum_is_exact` holds, else the flushed chain, by one ``lax.cond`` whose
    predicate stays unbatched under ``vmap`` (:func:`fp4sim.attention._ordered.plain_or_chain`)."""

    def plain(a: Any, b: Any, *needed: Any) -> Any:  # on a GPU: the ordered_gpu kernel
        return ordered_gpu.backward_dispatch(
            _loop, a, b, True, needed[0] if needed else None, transposed
        )

    def chain(a: Any, b: Any, *needed: Any) -> Any:
        return ordered_gpu.backward_dispatch(_loop, a, b, False, None, transposed)

    return plain_or_chain(plain, chain)


def _swap(x: Array) -> Array:
    return _xp.namespace(x).swapaxes(x, -1, -2)


class BackwardTrace(NamedTuple):
    """Every intermediate of :func:`emulated_backward` (for the consistency checks and probes).

    ``d_out_q`` is the quantized dO used by dV and dP, ``d_out_delta`` the dO used in D,
    ``p_dv`` the P operand of dV, ``p_ds`` the P of dS, ``ds`` the float32 softmax gradient and
    ``ds_q`` its quantized copy (the dQ/dK operand).
    """

    grads: Gradients
    d_out_q: Array
    d_out_delta: Array
    p_dv: Array
    p_ds: Array
    dp: Array
    delta: Array
    ds: Array
    ds_q: Array


def _quantized(fq: Any, x: Array, scaling: Any, with_stats: bool) -> tuple[Array, Any]:
    """``fq(x, scaling)`` and (``with_stats``) bounds on its :class:`OperandStats`: from the
    quantizer's block exponents for the built-in quantizers
    (:func:`fp4sim.attention.operands.fake_quantize_stats`, or a quantizer's own ``with_stats``),
    else a pass over the result (:func:`operand_stats`). Any bounds serve: the predicate of
    :func:`plain_sum_is_exact` on them implies it on the true statistics
    (:func:`fp4sim.attention._ordered.quantized_stats`)."""
    if not with_stats:
        return fq(x, scaling), None
    both = (
        operands.fake_quantize_stats
        if fq is operands.fake_quantize
        else getattr(fq, "with_stats", None)
    )
    if both is None:
        y = fq(x, scaling)
        return y, operand_stats(y)
    return both(x, scaling)


def emulated_backward(
    p: Array,
    q_hat: Array,
    k_hat: Array,
    v_hat: Array,
    out: Array,
    d_out: Array,
    *,
    softmax_scale: float,
    d_out_scaling: operands.OperandScaling,
    p_scaling: operands.OperandScaling,
    ds_scaling: operands.OperandScaling,
    delta: DeltaSource = DeltaSource.QUANTIZED_D_OUT,
    accumulation: BackwardAccumulation = BackwardAccumulation.SEQUENTIAL,
    p_ds: Array | None = None,
    out_delta: Array | None = None,
    dq_scaling: operands.OperandScaling | None = None,
    quantize: Any = None,
    dp_only_where_p: bool = False,
) -> BackwardTrace:
    """The backward of one attention call from the forward's saved state (module docstring).

    ``p`` is the represented, normalized P̃ (..., N, M) float32 as the forward multiplied it
    (rebuilt by :func:`fp4sim.attention.autodiff.rebuild_p`); ``q_hat``, ``k_hat``, ``v_hat`` the
    dequantized operands the forward used; ``out`` the forward's O; ``d_out`` the float32
    upstream gradient. ``d_out_scaling``, ``p_scaling`` (P for dV, rows = queries) and
    ``ds_scaling`` are :class:`fp4sim.attention.operands.OperandScaling`; ``quantize`` is the
    fake-quantizer ``(x, scaling) -> float32`` (by default
    :func:`fp4sim.attention.operands.fake_quantize`; the document-aware one for packed sequences).
    ``p_ds`` is the P of dS (default ``p``), ``out_delta`` the O of D (default ``out``);
    ``dq_scaling`` quantizes the dQ output (default: float32). ``dp_only_where_p`` (jax,
    SEQUENTIAL): dP may be left +0 in output blocks where the P of dS is all zero (a causal
    mask's upper blocks); dS there is ±0 (or NaN with a non-finite D) either way, every product
    with it flushes to +0, so the gradients keep their bits while the trace's dP, dS, dS_q may
    differ there (:func:`fp4sim.attention.autodiff.emulated_attention` sets it).
    """
    if not isinstance(accumulation, BackwardAccumulation):
        raise TypeError(
            f"accumulation={accumulation!r} must be a BackwardAccumulation; allowed: "
            f"{[m.name for m in BackwardAccumulation]}"
        )
    if not isinstance(delta, DeltaSource):
        raise TypeError(
            f"delta={delta!r} must be a DeltaSource; allowed: {[m.name for m in DeltaSource]}"
        )
    fq = operands.fake_quantize if quantize is None else quantize
    xp = _xp.namespace(p, q_hat, k_hat, v_hat, out, d_out)
    d_out = xp.asarray(d_out, dtype=np.float32)
    seq = accumulation is BackwardAccumulation.SEQUENTIAL
    d_out_q, do_st = _quantized(fq, d_out, d_out_scaling, seq)
    d_out_q = _xp.materialize(d_out_q)
    d_out_delta = d_out if delta is DeltaSource.FLOAT_D_OUT else d_out_q
    p_dv, p_st = _quantized(fq, p, p_scaling, seq)
    p_dv = _xp.materialize(p_dv)
    p_ds = p if p_ds is None else p_ds
    st = {}
    if seq:  # each operand's statistics once, on its stored layout (not a transposed view)
        st = {name: operand_stats(x) for name, x in (("v", v_hat), ("q", q_hat), ("k", k_hat))}
        st.update(do=do_st, p=p_st)
    dv = _matmul(
        p_dv, d_out_q, accumulation, a_stats=st.get("p"), b_stats=st.get("do"), transpose_a=True
    )
    needed = p_ds if dp_only_where_p and seq and xp is not np else None
    dp = _xp.materialize(
        _matmul(
            d_out_q,
            _swap(v_hat),
            accumulation,
            a_stats=st.get("do"),
            b_stats=st.get("v"),
            needed=needed,
        )
    )
    o_d = xp.asarray(out if out_delta is None else out_delta, dtype=np.float32)
    # operands of native float32 operations are read with float32 subnormals as +0 (DAZ, what
    # XLA CPU does by itself), so NumPy and jax agree: f32.ftz on the inputs, too
    dlt = f32.tree_sum_ftz(f32.mul_ftz(f32.ftz(d_out_delta), f32.ftz(o_d)), axis=-1)
    ds = _xp.materialize(f32.mul_ftz(f32.ftz(p_ds), f32.ftz(dp - dlt[..., None])))
    ds_q, ds_st = _quantized(fq, ds, ds_scaling, seq)
    ds_q = _xp.materialize(ds_q)
    c = np.float32(softmax_scale)
    dq = f32.mul_ftz(c, _matmul(ds_q, k_hat, accumulation, a_stats=ds_st, b_stats=st.get("k")))
    if dq_scaling is not None:
        dq = fq(dq, dq_scaling)
    dk = f32.mul_ftz(
        c, _matmul(ds_q, q_hat, accumulation, a_stats=ds_st, b_stats=st.get("q"), transpose_a=True)
    )
    return BackwardTrace(Gradients(dq, dk, dv), d_out_q, d_out_delta, p_dv, p_ds, dp, dlt, ds, ds_q)

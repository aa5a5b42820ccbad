"""The backward's fast paths give the bits of the slow ones.

1. The SEQUENTIAL matrix product takes the plain ``acc + a·b`` loop when
   :func:`fp4sim.attention.backward.plain_sum_is_exact` holds. Oracle: the flushed chain
   ``acc = ftz(acc + ftz(a_k·b_k))`` written here with NumPy selects (not the emulator's bit
   masks), on operands with short significands, zeros of both signs, cancellations, and each
   predicate boundary (tiny products 2^-103 / 2^-104, overflow, NaN/Inf, long significands);
   NumPy, jit and vmap (where the predicate is reduced over the batch); also with
   ``transpose_a`` (a stored as (..., K, I), sliced by columns instead of transposed).
2. :func:`fp4sim.attention.autodiff.p_from_forward` (P̃ from the forward's saved P codes, used
   by ``jax.grad``) equals :func:`fp4sim.attention.autodiff.rebuild_p` bit for bit for every
   forward preset.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ordered_oracle import assert_same_bits, flushed_chain

from fp4sim.attention.autodiff import (
    TRAINING_PRESETS,
    p_from_forward,
    rebuild_p,
    reuses_forward_p,
    training_backward,
    training_forward,
)
from fp4sim.attention.backward import _matmul, operand_stats, plain_sum_is_exact
from fp4sim.attention.causal import shares_scales_across_tokens
from fp4sim.attention.recipe import PRESETS, VFormat

SHAPE_A, SHAPE_B = (2, 6, 40), (2, 40, 5)


def _short(rng, shape, bits, lo, hi, zeros=0.1):
    """Random values with ``bits`` significant bits and exponents in [lo, hi], some ±0."""
    sig = rng.integers(2 ** (bits - 1), 2**bits, size=shape).astype(np.float64) / 2 ** (bits - 1)
    x = sig * np.exp2(rng.integers(lo, hi + 1, size=shape)) * rng.choice([-1.0, 1.0], shape)
    x[rng.random(shape) < zeros] = 0.0
    x[rng.random(shape) < zeros / 2] = -0.0
    return x.astype(np.float32)


_jit = jax.jit(_matmul)
_vmap = jax.jit(jax.vmap(_matmul))
_matmul_t = functools.partial(_matmul, transpose_a=True)  # takes aᵀ (..., K, I)
_jit_t = jax.jit(_matmul_t)
_vmap_t = jax.jit(jax.vmap(_matmul_t))


def _t(a):
    return np.ascontiguousarray(np.swapaxes(a, -1, -2))


def _check(a, b):
    want = flushed_chain(a, b)
    assert_same_bits(_matmul(a, b), want)
    assert_same_bits(_jit(a, b), want)
    assert_same_bits(_vmap(a, b), want)
    assert_same_bits(_matmul_t(_t(a), b), want)
    assert_same_bits(_jit_t(_t(a), b), want)
    assert_same_bits(_vmap_t(_t(a), b), want)
    return bool(plain_sum_is_exact(operand_stats(a), operand_stats(b), a.shape[-1]))


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    bits_a=st.integers(1, 12),
    lo=st.integers(-60, 0),
    span=st.integers(0, 40),
)
def test_plain_loop_equals_flushed_chain(seed, bits_a, lo, span):
    rng = np.random.default_rng(seed)
    a = _short(rng, SHAPE_A, bits_a, lo, lo + span)
    b = _short(rng, SHAPE_B, 24 - bits_a - int(rng.integers(0, 3)), -20, 4)
    b[1, :, 2] = -0.0  # a column of negative zeros: -0 products everywhere
    a[0, 1] = 0.0
    a[0, 0, 1], b[0, 1, 0] = np.float32(2.0**lo), np.float32(2.0**-20)  # the smallest of each
    fast = _check(a, b)
    assert fast == (lo - 20 >= -103)  # the drawn exponents decide the tiny-product condition


def test_predicate_boundaries_and_both_paths():
    rng = np.random.default_rng(5)
    e4m3 = _short(rng, SHAPE_A, 4, -10, 2)
    e5m2 = _short(rng, SHAPE_B, 3, -10, 2)
    assert _check(e4m3, e5m2)  # the backward's formats: the plain loop
    # cancellation to zero and all-negative-zero products: +0 on both paths
    a = np.ones(SHAPE_A, np.float32)
    b = np.zeros(SHAPE_B, np.float32)
    b[..., 0, :], b[..., 1, :], b[..., 2:, 0] = 1.5, -1.5, -0.0
    assert _check(a, b)
    # smallest nonzero product exactly 2^-103 (fast) and 2^-104 (flushed chain)
    for e_b, fast in ((-43, True), (-44, False)):
        a2 = e4m3.copy()
        a2[0, 0, 0] = np.float32(2.0**-60)
        b2 = e5m2.copy()
        b2[1, 3, 0] = np.float32(2.0**e_b)
        assert _check(a2, b2) is fast
    # products that flush (below 2^-126) and partial sums that would be subnormal
    a3 = _short(rng, SHAPE_A, 4, -70, -60)
    b3 = _short(rng, SHAPE_B, 3, -66, -60)
    assert not _check(a3, b3)
    # long significands (float32 noise): products round, so the flushed chain runs
    assert not _check(
        rng.standard_normal(SHAPE_A).astype(np.float32),
        rng.standard_normal(SHAPE_B).astype(np.float32),
    )
    # overflow margin: k·max|a|·max|b| up to 2^126 is fast, beyond it the chain runs
    for top, fast in ((59, True), (62, False)):
        a4 = e4m3.copy()
        a4[..., 0] = np.float32(2.0**top)
        b4 = e5m2.copy()
        b4[..., 0, :] = np.float32(2.0**top)
        assert _check(a4, b4) is fast
    # NaN and Inf operands
    for bad in (np.nan, np.inf):
        a5 = e4m3.copy()
        a5[1, 2, 3] = bad
        assert not _check(a5, e5m2)


def test_vmap_reduces_the_predicate_over_the_batch():
    rng = np.random.default_rng(6)
    a = _short(rng, SHAPE_A, 4, -10, 2)
    b = _short(rng, SHAPE_B, 3, -10, 2)
    b[1] = rng.standard_normal(SHAPE_B[1:]).astype(np.float32)  # one batch member is not short
    assert_same_bits(_vmap(a, b), flushed_chain(a, b))
    # an unbatched operand under vmap
    got = jax.jit(jax.vmap(_matmul, in_axes=(0, None)))(a, b[0])
    assert_same_bits(got, flushed_chain(a, b[0]))


@pytest.mark.parametrize(
    "shape_a,shape_b",
    [((2, 256, 24), (2, 24, 160)), ((2, 64, 16), (2, 16, 512)), ((3, 130, 20), (20, 300))],
)
def test_plain_loop_in_output_blocks(shape_a, shape_b):
    """Large outputs are summed block by block (rows × columns, the accumulator in the cache):
    every element keeps its contraction order, with and without leading axes."""
    rng = np.random.default_rng(9)
    a = _short(rng, shape_a, 4, -12, 3)
    b = _short(rng, shape_b, 3, -12, 3)
    want = flushed_chain(a, b)
    assert_same_bits(jax.jit(_matmul)(a, b), want)
    assert_same_bits(_jit_t(_t(a), b), want)
    if len(shape_b) == 3:
        assert_same_bits(_vmap(a, b), want)
        assert_same_bits(_vmap_t(_t(a), b), want)
    else:
        assert_same_bits(jax.jit(jax.vmap(_matmul, in_axes=(0, None)))(a, b), want)
        assert_same_bits(jax.jit(jax.vmap(_matmul_t, in_axes=(0, None)))(_t(a), b), want)


@pytest.mark.parametrize("mask", ["tril", "triu", "zero_block", "nan_in_zero_block"])
def test_plain_loop_skips_zero_columns_of_a_row_block(mask):
    """Causal operands: each row block sums only the range of k where its columns of a are
    nonzero (the skipped ±0 terms change nothing after the final flush)."""
    rng = np.random.default_rng(10)
    a = _short(rng, (2, 256, 192), 4, -12, 3, zeros=0.0)
    b = _short(rng, (2, 192, 160), 3, -12, 3)
    if mask == "tril":
        a = np.tril(a, -20)  # rows 0..19 entirely zero
    elif mask == "triu":
        a = np.triu(a, 30)
    else:
        a[:, 64:192] = 0.0
        a[1, 100, 5] = -0.0
        if mask == "nan_in_zero_block":  # a NaN is not a zero: the flushed chain runs (XLA
            a[0, 100, 70] = np.nan  # CPU's max reduction would drop it)
    want = flushed_chain(a, b)
    assert_same_bits(jax.jit(_matmul)(a, b), want)
    assert_same_bits(_vmap(a, b), want)
    assert_same_bits(_jit_t(_t(a), b), want)
    assert_same_bits(_vmap_t(_t(a), b), want)


@pytest.fixture
def small_blocks(monkeypatch):
    """Output blocks of 256 accumulators, at most 16 columns (so 64-token cases have several);
    a fresh custom_vmap function before and after (jax caches the traces of each one)."""
    from fp4sim.attention import backward

    monkeypatch.setattr(backward, "_BLOCK_ELEMENTS", 256)
    monkeypatch.setattr(backward, "_BLOCK_COLS", 16)
    backward._sequential_jax.cache_clear()
    yield
    backward._sequential_jax.cache_clear()


def test_dp_only_where_p_keeps_the_gradients(small_blocks):
    """jax.grad's backward leaves dP +0 in output blocks where P̃ is all zero (small blocks
    here so that a 64-token causal case has such blocks): the gradients keep every bit, also
    with a NaN query row."""
    recipe = TRAINING_PRESETS["direct_p_fp8_training"]
    rng = np.random.default_rng(11)
    q, k, v, do = (rng.standard_normal((64, 32)).astype(np.float32) for _ in range(4))
    q[40, 3] = np.nan
    with np.errstate(all="ignore"):
        _, saved = training_forward(q, k, v, recipe, causal=True)
        want = training_backward(saved, do, recipe)

    def run(q, k, v, do):
        _, sv = training_forward(q, k, v, recipe, causal=True)
        return training_backward(sv, do, recipe, forward_p_codes=True, grads_only=True)

    got = jax.jit(run)(q, k, v, do)
    for field in ("dq", "dk", "dv"):
        assert_same_bits(getattr(got.grads, field), getattr(want.grads, field))
    dp = np.asarray(got.dp)
    assert np.all(dp[:16, 48:] == 0) and np.any(want.dp[:16, 48:] != 0)  # a block was skipped
    assert np.array_equal(
        dp[np.tril(np.ones((64, 64), bool))], want.dp[np.tril(np.ones((64, 64), bool))]
    )


def _recipes():
    base = TRAINING_PRESETS["direct_p_fp8_training"]
    out = [(name, r) for name, r in TRAINING_PRESETS.items()]
    for name, fwd in PRESETS.items():
        out.append(
            (name, base.replace(name=name, forward=fwd.replace(v=VFormat.FLOAT32, hadamard=False)))
        )
    return out


@pytest.mark.parametrize("name,recipe", _recipes(), ids=[n for n, _ in _recipes()])
def test_p_from_forward_codes_equals_the_rebuild(name, recipe):
    rng = np.random.default_rng(8)
    n, d = 40, 32
    q, k, v = (rng.standard_normal((n, d)).astype(np.float32) for _ in range(3))
    q[3, 2] = np.nan  # a NaN row
    k[7] *= 40.0
    seg = np.repeat(np.arange(2), [15, 25]).astype(np.int32)
    for causal, segs in ((True, None), (False, None), (True, seg)):
        if segs is not None and shares_scales_across_tokens(recipe.qk):
            continue  # Q/K scales shared across tokens cannot be document-aligned
        with np.errstate(all="ignore"):
            _, saved = training_forward(q, k, v, recipe, causal=causal, segment_ids=segs)
            want = rebuild_p(saved, recipe.forward)
            got = p_from_forward(saved, recipe.forward)
        for field in ("p", "codes", "scales", "k", "anchors"):
            w, g = getattr(want, field), getattr(got, field)
            if w is None:
                assert g is None
                continue
            assert np.array_equal(
                np.ascontiguousarray(g).view(np.uint8), np.ascontiguousarray(w).view(np.uint8)
            ), field


def test_reuse_only_for_matched_recipes():
    from fp4sim.attention.consistency import Mismatch, with_mismatch

    matched = TRAINING_PRESETS["direct_p_fp8_training"]
    assert reuses_forward_p(matched)
    assert not reuses_forward_p(TRAINING_PRESETS["attn_qat_nvfp4"])  # dS from unquantized p
    for mismatch in (Mismatch.BACKWARD_TILING, Mismatch.FORWARD_APPROX_EXP):  # rebuilds P
        assert not reuses_forward_p(with_mismatch(matched, mismatch))


@pytest.mark.parametrize("name,recipe", _recipes(), ids=[n for n, _ in _recipes()])
def test_causal_spans_of_the_normalization_are_exact(name, recipe, monkeypatch):
    """Causal P̃: the key tiles that every row of a span masks are normalized once per row and
    tile on w = +0 instead of per key (autodiff._causal_spans). Reference: every key computed
    (spans switched off), on NumPy (and once under jit); square, more keys than queries, more
    queries than keys (rows that see no key), a NaN row and huge scores."""
    from fp4sim.attention import autodiff

    monkeypatch.setattr(autodiff, "_SPAN_ROWS", 16)  # several spans on 70 queries
    rng = np.random.default_rng(12)
    skipped = False
    for sq, skv in ((70, 70), (40, 150), (150, 40)):
        q = rng.standard_normal((sq, 32)).astype(np.float32)
        k, v = (rng.standard_normal((skv, 32)).astype(np.float32) for _ in range(2))
        q[3, 2] = np.nan
        k[1] *= np.float32(1e30)  # huge scores (Inf in some formats)
        with np.errstate(all="ignore"):
            _, saved = training_forward(q, k, v, recipe, causal=True)
        fns = {
            "codes": lambda s: p_from_forward(s, recipe.forward).p,
            "rebuild": lambda s: rebuild_p(s, recipe.forward).p,
        }
        for kind, fn in fns.items():
            with np.errstate(all="ignore"):
                got_np = np.asarray(fn(saved))
            got = [got_np]
            if sq == skv and kind == "codes":  # jit once per recipe (compiles are slow)
                got.append(np.asarray(jax.jit(fn)(saved)))
            with monkeypatch.context() as m, np.errstate(all="ignore"):
                m.setattr(autodiff, "_causal_spans", lambda *a: None)
                want = np.asarray(fn(saved))
            n_tiles = -(-skv // recipe.forward.block_kv)
            spans = autodiff._causal_spans(recipe.forward, True, sq, skv, n_tiles)
            skipped |= spans is not None and any(ntu < n_tiles for _, _, ntu in spans)
            for g in got:
                assert np.array_equal(
                    np.ascontiguousarray(g).view(np.uint32),
                    np.ascontiguousarray(want).view(np.uint32),
                ), (kind, sq, skv)
    # every converter's masked tile is zero, so each recipe skips tiles in some case
    assert skipped

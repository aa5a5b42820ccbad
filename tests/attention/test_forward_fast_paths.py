"""The forward's ordered PV partials: the plain loop gives the flushed chain's bits.

``fp4sim.attention.forward._group_partials`` sums each sub-block of P·V products in key order,
float32 with every step flushed (the definition). Where
:func:`fp4sim.attention._ordered.plain_sum_is_exact` holds (E4M3 P times an E4M3 V, as in the
``direct_p_fp8_training`` route) it runs the plain ``acc + p·v`` chain instead
(:func:`fp4sim.attention._ordered.ordered_product`). Oracle: the flushed chain written here
with NumPy selects, on each predicate boundary (tiny products 2^-103 / 2^-104, long
significands, overflow, NaN), on NumPy, under jit and under vmap (one batch member failing the
predicate sends the whole batch down the chain); then whole forwards under jit/vmap against the
NumPy forward with the plain path switched off.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from ordered_oracle import assert_same_bits, flushed_chain

import fp4sim.attention.forward as fwd
from fp4sim.attention import operands
from fp4sim.attention._ordered import operand_stats, ordered_product, plain_sum_is_exact
from fp4sim.attention.autodiff import TRAINING_PRESETS

SHAPE_P, SHAPE_V = (2, 3, 8, 32), (2, 3, 32, 16)  # (..., rows, sub), (..., sub, Dv)


def _short(rng, shape, bits, lo, hi, zeros=0.1, signed=True):
    sig = rng.integers(2 ** (bits - 1), 2**bits, size=shape).astype(np.float64) / 2 ** (bits - 1)
    x = sig * np.exp2(rng.integers(lo, hi + 1, size=shape))
    if signed:
        x = x * rng.choice([-1.0, 1.0], shape)
    x[rng.random(shape) < zeros] = 0.0
    return x.astype(np.float32)


def _pv(p, v):
    return ordered_product(fwd._pv_plain, fwd._pv_chain, p, v, operand_stats(p), operand_stats(v))


_jit = jax.jit(_pv)
_vmap = jax.jit(jax.vmap(_pv))


def _check(p, v):
    want = flushed_chain(p, v)
    for got in (_pv(p, v), _jit(p, v), _vmap(p, v)):
        assert_same_bits(got, want)
    return bool(plain_sum_is_exact(operand_stats(p), operand_stats(v), p.shape[-1]))


def test_pv_partials_on_the_predicate_boundaries():
    rng = np.random.default_rng(21)
    p = _short(rng, SHAPE_P, 4, -12, 8, signed=False)  # E4M3-like P (non-negative)
    v = _short(rng, SHAPE_V, 4, -12, 3)  # E4M3-like V
    assert _check(p, v)  # the recipe's operands: the plain chain
    # smallest nonzero product exactly 2^-103 (plain) and 2^-104 (flushed chain)
    for e_v, fast in ((-43, True), (-44, False)):
        p2, v2 = p.copy(), v.copy()
        p2[0, 0, 0, 0] = np.float32(2.0**-60)
        v2[1, 2, 5, 3] = np.float32(2.0**e_v)
        assert _check(p2, v2) is fast
    # products and partial sums below 2^-126: flushed on the chain, so the chain runs
    assert not _check(
        _short(rng, SHAPE_P, 4, -70, -60, signed=False), _short(rng, SHAPE_V, 4, -66, -60)
    )
    # a float32 V (long significands): products round, FMA would change bits: the chain runs
    assert not _check(p, rng.standard_normal(SHAPE_V).astype(np.float32))
    # overflow margin 2^126 / 32 terms: 2^60·2^61 is fast, 2^62·2^63 is not
    for top, fast in ((60, True), (62, False)):
        p4, v4 = p.copy(), v.copy()
        p4[..., 0] = np.float32(2.0**top)
        v4[..., 0, :] = np.float32(2.0 ** (top + 1))
        assert _check(p4, v4) is fast
    # NaN and Inf (a NaN row's P, an Inf V)
    for bad in (np.nan, np.inf):
        p5 = p.copy()
        p5[1, 0, 3, 7] = bad
        assert not _check(p5, v)
    # cancellation to zero: +0 on both paths
    p6 = np.ones(SHAPE_P, np.float32)
    v6 = np.zeros(SHAPE_V, np.float32)
    v6[..., 0, :], v6[..., 1, :] = 1.5, -1.5
    assert _check(p6, v6)


def test_vmap_member_failing_the_predicate():
    rng = np.random.default_rng(22)
    p = _short(rng, SHAPE_P, 4, -12, 8, signed=False)
    v = _short(rng, SHAPE_V, 4, -12, 3)
    v[1] = rng.standard_normal(SHAPE_V[1:]).astype(np.float32)  # member 1: float32 V
    assert_same_bits(_vmap(p, v), flushed_chain(p, v))
    assert_same_bits(jax.jit(jax.vmap(_pv, in_axes=(0, None)))(p, v[1]), flushed_chain(p, v[1]))


def _fields(res):
    it = res.intermediates
    return (
        res.out,
        res.lse,
        it.anchors,
        it.p_codes,
        it.p_scales,
        it.p_k,
        it.numerator,
        it.normalizer,
    )


@pytest.mark.parametrize("case", ["e4m3_v", "tiny_v_in_one_head", "float32_v"])
def test_forward_with_the_plain_pv_equals_the_chain(case, monkeypatch):
    """The fp8 training forward (MXFP8 P, ordered float32 PV) under jit and vmap over heads
    against the NumPy forward whose PV partials always take the flushed chain."""
    recipe = TRAINING_PRESETS["direct_p_fp8_training"]
    rng = np.random.default_rng(23)
    h, n, d = 2, 256, 32
    q, k, v = (rng.standard_normal((h, n, d)).astype(np.float32) for _ in range(3))
    if case != "float32_v":
        v = np.asarray(operands.fake_quantize(v, recipe.v), np.float32)  # the route's E4M3 V
    if case == "tiny_v_in_one_head":  # head 1: a product below 2^-103 (the chain for all)
        v[1, 7, 3] = np.float32(2.0**-100)

    def run(q, k, v):
        return _fields(
            fwd.attention_forward(q, k, v, recipe.forward, causal=True, return_intermediates=True)
        )

    got_jit = jax.jit(run)(q, k, v)
    got_vmap = jax.jit(jax.vmap(run))(q, k, v)
    monkeypatch.setattr(fwd, "ordered_product", lambda plain, chain, a, b, *rest: chain(a, b))
    with np.errstate(all="ignore"):
        want = run(q, k, v)
    for got in (got_jit, got_vmap):
        for g, w in zip(got, want):
            if w is None:
                assert g is None
                continue
            g, w = np.asarray(g), np.asarray(w)
            if w.dtype.kind == "f":
                assert_same_bits(g, w)
            else:
                np.testing.assert_array_equal(g, w)

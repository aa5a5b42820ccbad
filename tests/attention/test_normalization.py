"""Represented-weight normalization: the two-key worked examples, dS sums, the FTZ order."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from fp4sim.attention.normalization import (
    NormalizerOrder,
    block_denominator,
    normalize,
    represented_output,
)
from fp4sim.attention.recipe import Normalization
from fp4sim.formats.codec import decode, encode
from fp4sim.formats.spec import E2M1

W = np.array([1.0, 0.4])


def _represented(w, alpha=1.0):
    payload = decode(encode((6 * w / alpha).astype(np.float32), E2M1), E2M1)
    return payload, alpha * payload.astype(np.float64) / 6


def test_two_key_payloads_and_represented_weights():
    payload, rep = _represented(W)
    np.testing.assert_array_equal(payload, [6, 2])
    np.testing.assert_allclose(rep, [1, 1 / 3], rtol=0, atol=1e-15)


@pytest.mark.parametrize(
    "v, exact, consistent, mismatched",
    [
        ([2, 2], 2.0, 2.0, 40 / 21),
        ([0, 6], 12 / 7, 1.5, 10 / 7),
    ],
)
def test_two_key_two_element_outputs(v, exact, consistent, mismatched):
    _, rep = _represented(W)
    v = np.array(v, dtype=np.float64)
    got = {n: normalize(W, rep, v, n).out for n in Normalization}
    assert got[Normalization.EXACT] == pytest.approx(exact, abs=1e-15)
    assert got[Normalization.CONSISTENT] == pytest.approx(consistent, abs=1e-15)
    assert got[Normalization.MISMATCHED] == pytest.approx(mismatched, abs=1e-15)


def test_ds_row_sums_consistent_zero_mismatched_not():
    # the two-key case: w=[1,0.4], V=[0,6], dO=1, d=1
    _, rep = _represented(W)
    v = np.array([0.0, 6.0])
    for norm, p_want, ds_want, total in [
        (Normalization.CONSISTENT, [0.75, 0.25], [-1.125, 1.125], 0.0),
        (Normalization.MISMATCHED, [1 / 1.4, (1 / 3) / 1.4], [-1.020408, 1.088435], 0.068027),
    ]:
        r = normalize(W, rep, v, norm)
        p = rep / r.denominator
        np.testing.assert_allclose(p, p_want, atol=1e-12)
        dp = v  # dO = 1
        ds = p * (dp - r.out)  # D = rowsum(dO * O) = O
        np.testing.assert_allclose(ds, ds_want, atol=1e-6)
        assert ds.sum() == pytest.approx(total, abs=1e-6)


def test_ftz_order_golden():
    # alpha = 2^-126, sixteen payloads of 0.5
    payloads = np.full((1, 16), 0.5, np.float32)
    s = payloads.sum(axis=-1)
    k = np.array([-126], np.int32)
    safe = block_denominator(s, k, 6.0, NormalizerOrder.PAYLOAD_SUM_FIRST)
    assert safe[0] == np.float32((8 / 6) * 2.0**-126)
    assert np.isclose(safe[0], 1.5673258e-38, rtol=1e-7)
    assert block_denominator(s, k, 6.0, NormalizerOrder.SCALE_FIRST)[0] == 0
    assert block_denominator(s, k, 6.0, NormalizerOrder.PER_ELEMENT, payloads)[0] == 0
    # jit gives the same bits, also where XLA would not have flushed by itself
    f = jax.jit(lambda s, k: block_denominator(s, k, 6.0, NormalizerOrder.SCALE_FIRST))
    assert np.asarray(f(s, k))[0] == 0
    g = jax.jit(lambda s, k: block_denominator(s, k, 6.0))
    assert np.asarray(g(s, k)).view(np.uint32)[0] == safe.view(np.uint32)[0]


def test_orders_agree_in_the_normal_range():
    rng = np.random.default_rng(0)
    payloads = decode(rng.integers(0, 8, (50, 32)).astype(np.uint8), E2M1)
    s = payloads.sum(-1)
    k = rng.integers(-20, 1, 50).astype(np.int32)
    exact = s.astype(np.float64) * 2.0**k / 6
    for order in NormalizerOrder:
        got = block_denominator(s, k, 6.0, order, payloads)
        np.testing.assert_allclose(got, exact, rtol=2 * 2.0**-23)


def test_represented_output_zero_denominator_and_bad_input():
    out = represented_output(
        np.array([[3.0, 6.0], [1.0, 1.0]], np.float32), np.array([[1.5], [0.0]], np.float32), 6.0
    )
    np.testing.assert_array_equal(
        out, [[np.float32(np.float32(3 / 6) / np.float32(1.5)), np.float32(1 / 1.5)], [0, 0]]
    )
    with pytest.raises(TypeError, match="Normalization"):
        normalize(W, W, W, "consistent")
    with pytest.raises(ValueError, match="shape"):
        normalize(W, W[:1], W, Normalization.EXACT)
    with pytest.raises(TypeError, match="NormalizerOrder"):
        block_denominator(np.ones(1, np.float32), np.zeros(1, np.int32), 6.0, "safe")
    with pytest.raises(ValueError, match="payloads"):
        block_denominator(
            np.ones(1, np.float32), np.zeros(1, np.int32), 6.0, NormalizerOrder.PER_ELEMENT
        )

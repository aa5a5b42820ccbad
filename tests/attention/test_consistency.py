"""Forward/backward consistency: the §5.2 golden case, matched recipes pass, mismatches detected."""

from __future__ import annotations

import numpy as np
import pytest

from fp4sim.attention.backward import softmax_grad
from fp4sim.attention.normalization import normalize
from fp4sim.attention.recipe import Normalization
from fp4sim.formats.codec import decode, encode
from fp4sim.formats.spec import E2M1


def _two_element(normalization):
    """seed_algorithms.md §5.2: w = [1, 0.4], α = 1, V = [0, 6], dO = 1, d = 1."""
    w = np.array([1.0, 0.4])
    payloads = decode(encode((6 * w).astype(np.float32), E2M1), E2M1).astype(np.float64)
    assert payloads.tolist() == [6.0, 2.0]
    w_rep = payloads / 6  # [1, 1/3]
    v = np.array([0.0, 6.0])
    res = normalize(w, w_rep, v, normalization)
    p = w_rep / res.denominator  # the P̃ the PV product effectively used
    d_out = 1.0
    dp = d_out * v
    delta = np.array([d_out * res.out])  # D = rowsum(dO ∘ O)
    ds = softmax_grad(p[None], dp[None], delta)[0]
    return p, res.out, delta[0], ds


def test_golden_two_element_consistent():
    p, out, delta, ds = _two_element(Normalization.CONSISTENT)
    np.testing.assert_allclose(p, [0.75, 0.25], rtol=1e-15)
    assert out == pytest.approx(1.5, rel=1e-15) and delta == pytest.approx(1.5, rel=1e-15)
    np.testing.assert_allclose(ds, [-1.125, 1.125], rtol=1e-15)
    assert abs(ds.sum()) < 1e-15


def test_golden_two_element_mismatched():
    p, out, delta, ds = _two_element(Normalization.MISMATCHED)
    np.testing.assert_allclose(p, [1 / 1.4, (1 / 3) / 1.4], rtol=1e-15)
    assert out == pytest.approx(10 / 7, rel=1e-15) and delta == pytest.approx(10 / 7, rel=1e-15)
    np.testing.assert_allclose(ds, [-1.020408, 1.088435], atol=5e-7)
    assert ds.sum() == pytest.approx(0.068027, abs=5e-7)
    # the invariant: Σ dS = D·(1 − Σ P̃) when D = Σ P̃ dP
    assert ds.sum() == pytest.approx(delta * (1 - p.sum()), rel=1e-13)

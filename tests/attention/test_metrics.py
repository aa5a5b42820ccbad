"""Metrics: code-match rate, grid, error summaries (incl. the cos(v, 2v) example)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fp4sim.attention import recipe as R
from fp4sim.attention.metrics import code_match_rate, error_summary, uniform_grid


def test_uniform_grid():
    g = uniform_grid(8)
    np.testing.assert_allclose(g, -6 + (np.arange(8) + 0.5) * (math.log2(6) + 6) / 8, rtol=1e-7)
    with pytest.raises(ValueError, match="n="):
        uniform_grid(0)
    with pytest.raises(ValueError, match="lo < hi"):
        uniform_grid(4, lo=1.0, hi=0.0)


def test_code_match_rate_identities_and_a_known_rate():
    x = uniform_grid(100_000)
    assert code_match_rate(R.AffineP(), R.AffineP(), x) == 1.0
    rate = code_match_rate(R.ExactP(), R.AffineP(), x, chunk=7_777)  # chunking is invisible
    assert rate == pytest.approx(0.6329, abs=2e-3)
    # on x = log2 of exact E2M1 values every Direct-P converter agrees with exact... except
    # where Mitchell's boundary band starts: a small explicit set
    xs = np.log2(np.array([0.5, 1, 2, 4, 6], np.float32))
    assert code_match_rate(R.ExactP(), R.MitchellP(shift=0.0), xs) == 1.0
    with pytest.raises(TypeError, match="dtype"):
        code_match_rate(R.ExactP(), R.AffineP(), np.arange(4))
    with pytest.raises(ValueError, match="empty"):
        code_match_rate(R.ExactP(), R.AffineP(), np.zeros(0, np.float32))


def test_error_summary():
    v = np.array([1.0, -2.0, 3.0, 0.0])
    s = error_summary(2 * v, v)  # cosine 1 misses the doubled magnitude
    assert s.cosine == pytest.approx(1.0) and s.rel_l2 == pytest.approx(1.0)
    assert s.max_abs == 3.0 and s.zero_fraction == 0.25
    same = error_summary(v, v)
    assert same.rel_l2 == 0 and same.max_abs == 0 and same.cosine == pytest.approx(1.0)
    n = error_summary(np.array([np.nan, 1.0]), np.array([1.0, 1.0]))
    assert math.isnan(n.cosine) and math.isnan(n.rel_l2)
    assert "relL2" in str(same)
    with pytest.raises(ValueError, match="shape"):
        error_summary(v, v[:2])

"""Exact float64 reference: against a brute-force per-row loop, masks, policies, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fp4sim.attention.reference import attention_mask, attention_reference


def _brute(q, k, v, visible, scale):
    """Row by row with math.fsum (written independently of the vectorized reference)."""
    sq, dv = q.shape[0], v.shape[1]
    out = np.zeros((sq, dv))
    lse = np.full(sq, -np.inf)
    for i in range(sq):
        js = [j for j in range(k.shape[0]) if visible(i, j)]
        if not js:
            continue
        s = [scale * math.fsum(float(a) * float(b) for a, b in zip(q[i], k[j])) for j in js]
        m = max(s)
        w = [math.exp(x - m) for x in s]
        tot = math.fsum(w)
        lse[i] = m + math.log(tot)
        for d in range(dv):
            out[i, d] = math.fsum(wj * float(v[j, d]) for wj, j in zip(w, js)) / tot
    return out, lse


@pytest.mark.parametrize("causal", [False, True])
def test_against_brute_force(causal):
    rng = np.random.default_rng(1)
    q = rng.standard_normal((5, 8)).astype(np.float32)
    k = rng.standard_normal((7, 8)).astype(np.float32)
    v = rng.standard_normal((7, 3)).astype(np.float32)
    r = attention_reference(q, k, v, causal=causal, softmax_scale=0.3)
    # causal is aligned at the end: query i sees keys j <= i + 7 - 5
    out, lse = _brute(q, k, v, (lambda i, j: j <= i + 2) if causal else (lambda i, j: True), 0.3)
    np.testing.assert_allclose(r.out, out, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(r.lse, lse, rtol=1e-13)
    np.testing.assert_allclose(r.probs.sum(-1), 1.0, rtol=1e-14)


def test_segments_and_fully_masked_rows():
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((6, 4)) for _ in range(3))
    qs = np.array([0, 0, 1, 1, 2, 2])
    ks = np.array([0, 0, 1, 1, 3, 3])  # segment 2 has no keys: rows 4, 5 fully masked
    r = attention_reference(q, k, v, q_segment_ids=qs, kv_segment_ids=ks)
    out, lse = _brute(q, k, v, lambda i, j: qs[i] == ks[j], 0.5)
    np.testing.assert_allclose(r.out, out, rtol=1e-13, atol=1e-14)
    assert np.all(r.out[4:] == 0) and np.all(r.lse[4:] == -np.inf)
    assert not np.isnan(r.out).any() and not np.isnan(r.probs).any()
    m = attention_mask(6, 6, causal=True, q_segment_ids=qs)
    assert m[3, 2] and not m[3, 1] and not m[2, 3]


def test_default_scale_batch_dims_and_nan_rows():
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 3, 5, 16)) for _ in range(3))
    r = attention_reference(q, k, v)
    r2 = attention_reference(q, k, v, softmax_scale=0.25)
    np.testing.assert_array_equal(r.out, r2.out)
    assert r.out.shape == (2, 3, 5, 16) and r.lse.shape == (2, 3, 5)
    q[0, 0, 2, 0] = np.nan
    rn = attention_reference(q, k, v)
    assert np.isnan(rn.out[0, 0, 2]).all() and np.isnan(rn.lse[0, 0, 2])
    np.testing.assert_array_equal(rn.out[0, 0, :2], r.out[0, 0, :2])


@pytest.mark.parametrize(
    "args, kw, exc, words",
    [
        (((3, 4), (5, 6), (5, 2)), {}, ValueError, "head dim"),
        (((3, 4), (5, 4), (6, 2)), {}, ValueError, "keys"),
        (((2, 3, 4), (5, 4), (5, 2)), {}, ValueError, "rank"),
        (((3, 4), (5, 4), (5, 2)), dict(softmax_scale=-1.0), ValueError, "softmax_scale"),
        (((3, 4), (5, 4), (5, 2)), dict(causal=1), TypeError, "causal"),
        (((3, 4), (5, 4), (5, 2)), dict(q_segment_ids=np.zeros(2, int)), ValueError, "segment"),
        (((3, 4), (5, 4), (5, 2)), dict(kv_segment_ids=np.zeros(5, int)), ValueError, "kv_segment"),
    ],
)
def test_bad_input(args, kw, exc, words):
    q, k, v = (np.zeros(s) for s in args)
    with pytest.raises(exc, match=words):
        attention_reference(q, k, v, **kw)
    with pytest.raises(TypeError, match="dtype"):
        attention_reference(np.zeros((2, 2), int), np.zeros((2, 2)), np.zeros((2, 2)))

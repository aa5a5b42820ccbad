"""Packed variable-length documents: segment ids in the float64 reference and in the emulator.

Oracle: running each document on its own. Packing several documents into one sequence with
segment ids must give exactly the per-document results (forward and gradients).
"""

from __future__ import annotations

import numpy as np
import pytest

from fp4sim.attention.backward import (attention_forward_reference, attention_grad_reference,
                                       attention_mask)


def _docs(rng, lengths, d=8):
    n = sum(lengths)
    q, k, v, do = (rng.standard_normal((n, d)) for _ in range(4))
    ids = np.repeat(np.arange(len(lengths)), lengths)
    return q, k, v, do, ids


@pytest.mark.parametrize("causal", [False, True])
def test_reference_packed_equals_separate_documents(causal):
    rng = np.random.default_rng(1)
    lengths = [5, 11, 1, 15]
    q, k, v, do, ids = _docs(rng, lengths)
    out, lse = attention_forward_reference(q, k, v, causal=causal, q_segment_ids=ids)
    grads = attention_grad_reference(q, k, v, do, causal=causal, q_segment_ids=ids)
    start = 0
    for n in lengths:
        s = slice(start, start + n)
        o1, l1 = attention_forward_reference(q[s], k[s], v[s], causal=causal)
        g1 = attention_grad_reference(q[s], k[s], v[s], do[s], causal=causal)
        np.testing.assert_allclose(out[s], o1, rtol=1e-13, atol=1e-14)
        np.testing.assert_allclose(lse[s], l1, rtol=1e-13)
        for a, b in zip(grads, g1):
            np.testing.assert_allclose(a[s], b, rtol=1e-12, atol=1e-13)
        start += n


def test_mask_causal_alignment_and_segments():
    m = attention_mask(3, 5, causal=True)
    # query i sees keys j <= i + 2 (diagonal aligned at the end)
    assert m.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    ids = np.array([0, 0, 1, 1])
    m = attention_mask(4, 4, causal=True, q_segment_ids=ids)
    assert m.tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]]


def test_fully_masked_row_gives_zero_output_and_gradients():
    rng = np.random.default_rng(2)
    q, k, v, do = (rng.standard_normal((4, 8)) for _ in range(4))
    q_ids = np.array([0, 0, 7, 1])  # query 2 belongs to no key's document
    kv_ids = np.array([0, 0, 1, 1])
    out, lse = attention_forward_reference(q, k, v, q_segment_ids=q_ids, kv_segment_ids=kv_ids)
    g = attention_grad_reference(q, k, v, do, q_segment_ids=q_ids, kv_segment_ids=kv_ids)
    assert np.all(out[2] == 0) and lse[2] == -np.inf and np.all(g.dq[2] == 0)
    assert np.all(np.isfinite(out)) and all(np.all(np.isfinite(x)) for x in g)


def test_bad_segment_ids_named_in_error():
    with pytest.raises(ValueError, match="segment ids"):
        attention_mask(4, 4, q_segment_ids=np.zeros(3, int))
    with pytest.raises(ValueError, match="kv_segment_ids"):
        attention_mask(4, 4, kv_segment_ids=np.zeros(4, int))

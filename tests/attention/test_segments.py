"""Packed variable-length documents: segment ids in the float64 reference and in the emulator.

Oracle: running each document on its own. Packing several documents into one sequence with
segment ids must give exactly the per-document results (forward and gradients).
"""

from __future__ import annotations

import numpy as np
import pytest

from fp4sim.attention.backward import attention_grad_reference
from fp4sim.attention.reference import attention_reference


def attention_forward_reference(*args, **kwargs):
    return attention_reference(*args, **kwargs)[:2]


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


def test_fully_masked_row_gives_zero_output_and_gradients():
    rng = np.random.default_rng(2)
    q, k, v, do = (rng.standard_normal((4, 8)) for _ in range(4))
    q_ids = np.array([0, 0, 7, 1])  # query 2 belongs to no key's document
    kv_ids = np.array([0, 0, 1, 1])
    out, lse = attention_forward_reference(q, k, v, q_segment_ids=q_ids, kv_segment_ids=kv_ids)
    g = attention_grad_reference(q, k, v, do, q_segment_ids=q_ids, kv_segment_ids=kv_ids)
    assert np.all(out[2] == 0) and lse[2] == -np.inf and np.all(g.dq[2] == 0)
    assert np.all(np.isfinite(out)) and all(np.all(np.isfinite(x)) for x in g)


# --- the emulated training path on packed documents ----------------------------------------------
from fp4sim.attention import operands  # noqa: E402
from fp4sim.attention.autodiff import TRAINING_PRESETS, training_backward, training_forward  # noqa: E402

LENGTHS = [20, 44, 9, 55]  # boundaries inside 32-token groups and 32x32 dS tiles


def _packed(seed=0, d=32):
    rng = np.random.default_rng(seed)
    n = sum(LENGTHS)
    q, k, v, do = (rng.standard_normal((n, d)).astype(np.float32) for _ in range(4))
    return q, k, v, do, np.repeat(np.arange(len(LENGTHS)), LENGTHS).astype(np.int32)


def _run(recipe, q, k, v, do, ids):
    out, saved = training_forward(q, k, v, recipe, causal=True, segment_ids=ids)
    return (out,) + tuple(training_backward(saved, do, recipe).grads)


STRADDLING = {  # V / dS scalings whose groups span tokens
    "V MXFP8 tokens floor, dS 32x32 floor": dict(
        v=operands.MXFP8_TOKENS_FLOOR, ds=operands.DS_SQUARE_FLOOR
    ),
    "V per-tensor FP8, dS 32x32 RCEIL": dict(
        v=operands.FP8_PER_TENSOR_AMAX, ds=operands.DS_SQUARE_RCEIL
    ),
    "V NVFP4 tokens, dO per-tensor pow2": dict(
        v=operands.NVFP4_TOKENS, d_out=operands.PER_TENSOR_POW2
    ),
}


@pytest.mark.parametrize("name", list(STRADDLING))
def test_documents_never_share_a_scale_when_aligned(name):
    recipe = TRAINING_PRESETS["direct_p_fp8_training"].replace(name=name, **STRADDLING[name])
    q, k, v, do, ids = _packed()
    base = _run(recipe, q, k, v, do, ids)
    leaked = False
    for doc in range(len(LENGTHS)):
        sel = ids == doc
        q1, k1, v1 = q.copy(), k.copy(), v.copy()
        for x in (q1, k1, v1):
            x[sel] *= np.float32(7.0)  # this document's rows become every group's max
        other = ~sel
        after = _run(recipe, q1, k1, v1, do, ids)
        for a, b in zip(base, after):
            assert np.array_equal(a[other], b[other]), (name, doc)
        unaligned = _run(recipe.replace(segment_aligned=False), q, k, v, do, ids)
        unaligned1 = _run(recipe.replace(segment_aligned=False), q1, k1, v1, do, ids)
        leaked |= any(not np.array_equal(a[other], b[other]) for a, b in zip(unaligned, unaligned1))
    # the same scalings without alignment do let a document reach the others (not vacuous)
    assert leaked, name


def test_tile_aligned_documents_equal_separate_runs():
    recipe = TRAINING_PRESETS["direct_p_fp8_training"]  # key tiles of 64, token blocks of 32
    rng = np.random.default_rng(4)
    lengths = [64, 128]
    n = sum(lengths)
    q, k, v, do = (rng.standard_normal((n, 32)).astype(np.float32) for _ in range(4))
    ids = np.repeat([0, 1], lengths).astype(np.int32)
    packed = _run(recipe, q, k, v, do, ids)
    start = 0
    for length in lengths:
        s = slice(start, start + length)
        alone = _run(recipe, q[s], k[s], v[s], do[s], None)
        np.testing.assert_array_equal(packed[0][s], alone[0])  # O: bit for bit
        for a, b in zip(packed[1:], alone[1:]):
            # gradients: float32 products over more (masked, exactly zero) terms
            np.testing.assert_allclose(a[s], b, rtol=0, atol=n * 2.0**-24 * np.max(np.abs(b)))
        start += length


def test_token_spanning_qk_with_segments_rejected():
    from fp4sim.attention.recipe import QKFormat

    recipe = TRAINING_PRESETS["direct_p_fp8_training"]
    recipe = recipe.replace(forward=recipe.forward.replace(qk=QKFormat.TOKEN_BLOCK_FP8))
    q, k, v, do, ids = _packed()
    with pytest.raises(ValueError, match="document"):
        training_forward(q, k, v, recipe, segment_ids=ids)
    training_forward(q, k, v, recipe.replace(segment_aligned=False), segment_ids=ids)


def test_partial_blocks_are_zero_padded_and_stay_consistent():
    from fp4sim.attention.consistency import check_consistency

    rng = np.random.default_rng(6)
    n = 72  # not a multiple of the 32-token groups nor of the 64-key tiles
    q, k, v, do = (rng.standard_normal((n, 32)).astype(np.float32) for _ in range(4))
    ids = np.repeat([0, 1, 2], [30, 20, 22]).astype(np.int32)
    for name in ("direct_p_fp8_training", "attn_qat_nvfp4"):
        rep = check_consistency(TRAINING_PRESETS[name], q, k, v, do, segment_ids=ids)
        assert rep.ok, rep
    # zero padding = quantizing whole blocks with zeros appended, then cropping
    x = rng.standard_normal((40, 8)).astype(np.float32)
    for scaling in (operands.MXFP8_TOKENS_FLOOR, operands.TOKEN_BLOCK_POW2):
        whole = np.pad(x, ((0, 24), (0, 0)))  # 40 tokens -> two 32-token groups
        np.testing.assert_array_equal(
            operands.fake_quantize(x, scaling), operands.fake_quantize(whole, scaling)[:40]
        )
    whole = np.pad(x, ((0, 24), (0, 24)))  # 40 x 8 -> 2 x 1 tiles of 32 x 32
    np.testing.assert_array_equal(
        operands.fake_quantize(x, operands.DS_SQUARE_RCEIL),
        operands.fake_quantize(whole, operands.DS_SQUARE_RCEIL)[:40, :8],
    )

"""The Direct-P forward's GPU kernels (fp4sim.attention.direct_p_gpu), checked on the CPU.

With ``FP4SIM_GPU_KERNELS=interpret`` the jitted forward of the Direct-P family (NVFP4 Q/K,
AffineP or MitchellP into MXFP4 P, MXFP4 V, consistent normalization) runs its rows on the two
kernels in Pallas interpret mode; O and LSE must equal the NumPy emulator's bits, with masked
and padded keys (−inf scores), causal masks, several GPU row chunks, an Inf key (saturated) and
a NaN query row, with the key tiles split over programs and not. The kernels are also lowered for cuda (Triton MLIR) at the benchmark's shape,
with ``FP4SIM_GPU_KERNELS=all`` (on the GPU they are opt-in). The GPU run is
tests/test_gpu_bit_identity.py.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from cuda_lowering import cuda_text

from fp4sim.attention import PRESETS, attention_forward, direct_p_gpu, forward
from fp4sim.attention import ordered_gpu as og


def _same(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return np.array_equal(np.isnan(a), np.isnan(b)) and np.array_equal(
        a[~np.isnan(a)].view(np.uint32), b[~np.isnan(b)].view(np.uint32)
    )


@pytest.mark.parametrize(
    ("preset", "causal", "sq", "skv", "gpu_chunk"),
    [
        ("hw_fp4_direct_p", False, 256, 256, None),
        ("hw_fp4_direct_p", True, 192, 320, 64),  # padded keys (320 = 2.5 tiles), 3 row chunks
        ("hw_fp4_direct_p_mitchell", True, 128, 128, None),
    ],
)
@pytest.mark.parametrize("split", [True, False])
def test_direct_p_forward_through_the_kernels_equals_numpy(
    monkeypatch, preset, causal, sq, skv, gpu_chunk, split
):
    """``split``: the key tiles spread over several programs per row block (the group sums
    folded by a second kernel), or (too many programs asked for: none) one program per row
    block walking every tile."""
    monkeypatch.setenv(og.ENV, "interpret")
    if not split:
        monkeypatch.setattr(direct_p_gpu, "_TARGET_PROGRAMS", 1)
    if gpu_chunk is not None:
        monkeypatch.setattr(forward, "_GPU_ROW_CHUNK_FUSED", gpu_chunk)
    calls = []
    kernel = direct_p_gpu.accumulate
    monkeypatch.setattr(
        direct_p_gpu,
        "accumulate",
        lambda *a, **kw: calls.append(a[0].shape[:2] + (kw["ntu"],)) or kernel(*a, **kw),
    )
    rec = PRESETS[preset]
    rng = np.random.default_rng(8)
    q = rng.standard_normal((2, sq, 64)).astype(np.float32)
    k, v = (rng.standard_normal((2, skv, 64)).astype(np.float32) for _ in range(2))
    k[0, 5, 3] = np.inf  # saturates to the largest NVFP4 value
    q[1, 7, :] = np.nan  # a NaN row: O and LSE NaN
    got = jax.jit(lambda q, k, v: attention_forward(q, k, v, rec, causal=causal)[:2])(q, k, v)
    want = attention_forward(q, k, v, rec, causal=causal)
    assert calls
    splits = [direct_p_gpu.key_chunk(*c) < c[2] for c in calls]
    assert any(splits) == (split and max(c[2] for c in calls) > 1)
    assert _same(got[0], want.out) and _same(got[1], want.lse)
    assert np.isnan(np.asarray(got[0])[1, 7]).all()


def test_fused_only_for_the_direct_p_family(monkeypatch):
    """Other recipes and the intermediates keep the XLA path (the kernels are never traced)."""
    monkeypatch.setenv(og.ENV, "interpret")
    calls = []
    monkeypatch.setattr(direct_p_gpu, "tile_maxima", lambda *a, **kw: calls.append(1))
    x = np.ones((1, 64, 64), np.float32)
    jax.jit(lambda q: attention_forward(q, q, q, PRESETS["hw_fp4_fp8_pv"])[:2]).trace(x)
    jax.jit(
        lambda q: attention_forward(q, q, q, PRESETS["hw_fp4_direct_p"], return_intermediates=True)
    ).trace(x)
    assert not calls


def test_direct_p_kernels_lower_for_cuda(monkeypatch):
    monkeypatch.setenv(og.ENV, "all")  # the Direct-P kernels are opt-in
    rec = PRESETS["hw_fp4_direct_p"]
    text = cuda_text(
        lambda q, k, v: attention_forward(q, k, v, rec)[:2],
        (1, 4096, 128),
        (1, 4096, 128),
        (1, 4096, 128),
    )
    assert text.count("xla.gpu.triton") >= 2

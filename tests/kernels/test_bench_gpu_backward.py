"""The ``backward`` section of ``python -m fp4sim bench gpu`` run end to end on the CPU: fp4sim's
backward kernels in Pallas interpret mode at a tiny shape (the cuDNN and JAX peers need the
GPU), so the section's own code — residuals, the timed call, the float64 reference and the
error bookkeeping — is exercised before it reaches the H200."""

from __future__ import annotations

import json

import numpy as np

from fp4sim.attention.backward import attention_grad_reference
from fp4sim.benchmarks import gpu_backward as gb


def test_section_runs_in_interpret_mode(tmp_path):
    res = gb.measure(
        shapes=((1, 128, 1, 64, True),),
        reps=1,
        iters=1,
        interpret=True,
        quick=True,
        out_dir=str(tmp_path),
    )
    assert res["ok"], res
    m = res["shapes"][0]["methods"]
    for name in ("fp4sim_fp8_bwd",):
        r = m[name]
        assert "error" not in r, r
        assert not r["nan"]
        for g in ("dq", "dk", "dv"):
            assert 0.0 < r[f"rel_l2_{g}"] < 0.12, (name, g, r)
    assert json.loads((tmp_path / "backward.json").read_text())["shapes"][0]["S"] == 128


def test_method_filter():
    res = gb.measure(
        shapes=((1, 128, 1, 64, False),),
        reps=1,
        iters=1,
        interpret=True,
        methods=["ablate_dkv_only"],
    )
    assert list(res["shapes"][0]["methods"]) == ["ablate_dkv_only"], res
    assert res["shapes"][0]["methods"]["ablate_dkv_only"]["rel_l2_dk"] < 0.12


def test_reference_head_grads_match_the_backward_reference():
    rng = np.random.default_rng(0)
    q, k, v, do = (rng.standard_normal((96, 16)) for _ in range(4))
    for causal in (False, True):
        got = gb.reference_head_grads(q, k, v, do, scale=0.3, causal=causal, chunk=40)
        want = attention_grad_reference(q, k, v, do, softmax_scale=0.3, causal=causal)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)

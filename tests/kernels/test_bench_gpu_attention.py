"""The ``attention`` section's bookkeeping of ``python -m fp4sim bench gpu`` on the CPU: the
sampled heads exist for every head count, issue 17's ratios and targets, the closing lines."""

from __future__ import annotations

from fp4sim.benchmarks import gpu_attention as ga


def test_sample_heads_exist_for_every_head_count():
    assert ga._sample_heads(1) == (0,)
    assert ga._sample_heads(2) == (0, 1)
    assert ga._sample_heads(16) == (0, 15)


def _methods(fp8, cud8, bf16, affine, mitchell, err8, errc):
    return {
        "fp4sim_fp8": {"tflops": fp8, "rel_l2": err8},
        "cudnn_fp8": {"tflops": cud8, "rel_l2": errc},
        "cudnn_bf16": {"tflops": bf16, "rel_l2": 1e-3},
        "fp4sim_directp_affine": {"tflops": affine, "rel_l2": 0.1},
        "fp4sim_directp_mitchell": {"tflops": mitchell, "rel_l2": 0.1},
    }


def test_targets_and_summary_lines():
    m = _methods(800.0, 800.0, 600.0, 500.0, 390.0, 0.02, 0.03)
    tg = ga._targets(m, 2, 4096, 16, 128, False)
    assert tg["fp8_vs_cudnn_fp8"] == 1.0 and abs(tg["fp8_vs_cudnn_bf16"] - 800 / 600) < 1e-12
    assert tg["met"] == {
        "fp8_vs_cudnn_fp8": True,
        "fp8_vs_cudnn_bf16": True,
        "affine_vs_fp8": True,
        "mitchell_vs_fp8": False,
        "error_vs_cudnn_fp8": True,
    }
    tg64 = ga._targets(m, 1, 8192, 16, 64, True)  # no cuDNN-fp8 parity target at D64
    assert "fp8_vs_cudnn_fp8" not in tg64["met"]
    m.pop("cudnn_fp8")
    assert ga._targets(m, 2, 4096, 16, 128, False)["met"]["fp8_vs_cudnn_fp8"] is None
    results = {
        "shapes": [{"B": 2, "S": 4096, "H": 16, "D": 128, "causal": False, "target": tg}],
        "skipped_shapes": [[1, 8192, 16, 64, True]],
    }
    lines = ga._summary(results)
    assert len(lines) == 3
    for key in (
        "FP8 / cuDNN fp8",
        "FP8 / cuDNN bf16",
        "Direct-P / FP8",
        "error ratio",
        "missed: mitchell_vs_fp8",
    ):
        assert key in lines[1], key
    assert "skipped" in lines[2]

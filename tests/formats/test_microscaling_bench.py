"""The microscaling benchmark runs end to end at a tiny size (a smoke test, not a timing), and its
ml_dtypes baseline quantizer agrees with fp4sim where their semantics coincide."""

from __future__ import annotations

import argparse
import json

import numpy as np

from fp4sim.benchmarks import microscaling as bench
from fp4sim.formats import MXFP4, MXFP8, quantize


def test_bench_microscaling_runs(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    out = tmp_path / "bench.json"
    args = parser.parse_args(
        [
            "--rows",
            "32",
            "--cols",
            "64",
            "--repeats",
            "1",
            "--torchao-python",
            str(tmp_path / "no-python"),
            "--json",
            str(out),
        ]
    )
    assert bench.run(args) == 0
    info = json.loads(out.read_text())
    impls = {(r["case"], r["impl"]) for r in info["results"]}
    assert impls == {
        (c, i)
        for c in ("MXFP8", "MXFP4", "NVFP4")
        for i in ("fp4sim NumPy", "fp4sim jax.jit", "ml_dtypes quantizer")
    }
    assert "not found" in info["torchao"]["note"]
    text = capsys.readouterr().out
    assert "torchao: skipped" in text and text.strip().splitlines()[-1].startswith("NVFP4")


def test_baseline_quantizer_is_the_same_computation():
    # the baseline must do the same work: equal codes/scales on ordinary data (RCEIL, RNE, packed)
    x = (np.random.default_rng(0).standard_normal((8, 64)) * 3).astype(np.float32)
    import ml_dtypes

    codes, scales = bench._mld_mx(x, ml_dtypes.float8_e4m3fn, 8, False)
    q = quantize(x, MXFP8)
    assert np.array_equal(scales, q.scales) and np.array_equal(codes, q.codes)
    codes, scales = bench._mld_mx(x, ml_dtypes.float4_e2m1fn, 2, True)
    q = quantize(x, MXFP4, pack=True)
    assert np.array_equal(scales, q.scales) and np.array_equal(codes, q.codes)

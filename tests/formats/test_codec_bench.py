"""The formats benchmark runs end to end at a tiny size (a smoke test, not a timing)."""

from __future__ import annotations

import argparse
import json

from fp4sim.benchmarks import formats as bench


def test_bench_formats_runs_and_reports_ratios(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    out = tmp_path / "bench.json"
    args = parser.parse_args(
        ["--size", "4096", "--repeats", "1", "--formats", "E2M1", "--json", str(out)]
    )
    assert bench.run(args) == 0
    info = json.loads(out.read_text())
    rows = {(r["op"], r["impl"]): r for r in info["rows"]}
    assert set(rows) == {
        (op, impl)
        for op in ("encode", "decode")
        for impl in ("ml_dtypes cast", "fp4sim NumPy", "fp4sim jax.jit", "XLA convert (jit)")
    }
    assert all(r["seconds"] > 0 and r["time_vs_ml_dtypes"] > 0 for r in rows.values())
    assert rows[("encode", "ml_dtypes cast")]["time_vs_ml_dtypes"] == 1.0
    table = capsys.readouterr().out.strip().splitlines()
    assert table[-1].startswith("E2M1") and "ratio" in table[1]

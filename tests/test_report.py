"""The main job: a ``--quick`` reproduce run writes the report, its JSON and its figures, and its
numbers equal what the public emulators give when the tests call them directly (one source of
truth: the report only calls the library)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import fp4sim
from fp4sim import report


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    path = report.reproduce(out, sizes=report.QUICK, progress=False)
    return out, path.read_text(), json.loads((out / "results.json").read_text())


def test_writes_every_section_table_and_figure(quick_run):
    from fp4sim.figures import FIGURES

    out, text, results = quick_run
    assert set(results["sections"]) == set(report.SECTIONS)
    for name, fn in report.SECTIONS.items():
        section = fn(report.QUICK)  # cached experiments: cheap the second time
        assert f"## {section.title}" in text
        for table in section.tables:
            assert f"**{table.title}**" in text
            assert table.seed, f"table {table.title!r} does not say what the seed reported"
        for fig in section.figures:
            png = out / "figures" / FIGURES[fig].filename
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
            assert f"figures/{FIGURES[fig].filename}" in text
    assert "| NaN |" not in text and "| NaN" not in text, "a NaN leaked into a table of the report"


def test_sizes_are_validated():
    with pytest.raises(ValueError, match="grid_points"):
        report.Sizes(name="x", grid_points=0, attn_rows=1, attn_keys=1, head_dim=1, seq_lens=(1,),
                     block_sizes=(1,), scale_blocks=1, leak_tokens=1)
    with pytest.raises(TypeError, match="sizes"):
        report.reproduce("/nonexistent", sizes="quick")
    with pytest.raises(ValueError, match="sections"):
        report.reproduce("/nonexistent", sections=["nope"])


def test_default_out_dir_is_fresh(tmp_path, monkeypatch):
    import datetime as dt

    monkeypatch.chdir(tmp_path)
    now = dt.datetime(2026, 11, 29, 10, 0, 0)
    first = report.default_out_dir(now)
    assert first.name == "fp4sim-report-20261129-100000"
    first.mkdir()
    assert report.default_out_dir(now).name == "fp4sim-report-20261129-100000-1"


# --- the report's numbers are the library's numbers ------------------------------------------------

def test_formats_numbers(quick_run):
    nums = quick_run[2]["sections"]["formats"]["numbers"]
    codes = fp4sim.all_codes(fp4sim.E2M1)
    want = fp4sim.decode(codes, fp4sim.E2M1)
    got = np.array([float(v) for v in nums["e2m1_values"]], dtype=np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert nums["rne_all_agree"] is True

"""``python -m fp4sim bench mmasim``: a clear skip without the side environment; with it (an
optional test, ``FP4SIM_MMASIM_PYTHON`` and ``FP4SIM_MMASIM_SRC`` set) a small problem runs on
both sides and the results are equal bit for bit."""

from __future__ import annotations

import json
import os

import pytest

from fp4sim import __main__ as cli


def _run(argv, capsys):
    try:
        code = cli.main(argv)
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_skips_clearly_without_side_environment(capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("FP4SIM_MMASIM_PYTHON", raising=False)
    code, out, _ = _run(["bench", "mmasim"], capsys)
    assert code == 0 and "skipped: no side interpreter" in out and "--python" in out
    code, out, _ = _run(["bench", "mmasim", "--python", str(tmp_path / "nope")], capsys)
    assert code == 0 and "skipped" in out
    py = os.path.realpath(os.sys.executable)  # an interpreter, but no MMA-Sim checkout
    code, out, _ = _run(["bench", "mmasim", "--python", py, "--mmasim", str(tmp_path)], capsys)
    assert code == 0 and "no MMA-Sim checkout" in out


def test_bad_size(capsys):
    code, _, err = _run(["bench", "mmasim", "--size", "100"], capsys)
    assert code == 2 and "multiple of 128" in err


@pytest.mark.optional
def test_small_problem_bit_equal(capsys, tmp_path):
    py, src = os.environ.get("FP4SIM_MMASIM_PYTHON"), os.environ.get("FP4SIM_MMASIM_SRC")
    if not (py and src):
        pytest.skip(
            "needs MMA-Sim's side environment: set FP4SIM_MMASIM_PYTHON (a Python with "
            "torch) and FP4SIM_MMASIM_SRC (a checkout of microsoft/MMA-Sim)"
        )
    out = tmp_path / "b.json"
    code, text, _ = _run(
        [
            "bench",
            "mmasim",
            "--size",
            "128",
            "--kinds",
            "nvfp4",
            "--repeats",
            "1",
            "--json",
            str(out),
        ],
        capsys,
    )
    assert code == 0, text
    (row,) = json.loads(out.read_text())["rows"]
    assert row["bit_equal"] == row["outputs"] == 128 * 128

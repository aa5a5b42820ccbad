"""``python -m fp4sim validate`` and its registry (fp4sim.kernels.checks), on the CPU: the
no-GPU behaviour, which checks each architecture runs, the verdicts, and one real check in GPU
interpret mode."""

from __future__ import annotations

import json

import pytest

from fp4sim import __main__ as cli
from fp4sim.kernels import checks, harness


def _run(argv, capsys):
    try:
        code = cli.main(argv)
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.skipif(harness.gpu_available(), reason="checks what happens where there is no GPU")
def test_no_gpu_says_so_and_exits_0(capsys, tmp_path):
    out = tmp_path / "v.json"
    code, text, _ = _run(["validate", "--out", str(out)], capsys)
    assert code == 0 and "no GPU" in text
    for c in checks.CHECKS:
        assert c.name in text
    info = json.loads(out.read_text())
    assert info["verdict"] == "no GPU" and info["gpu"] is None and info["results"] == []


def test_list_and_bad_only(capsys):
    code, text, _ = _run(["validate", "--list"], capsys)
    assert code == 0 and all(c.name in text for c in checks.CHECKS)
    code, text, _ = _run(["validate", "--only", "nope"], capsys)
    assert code == 2 and "unknown" in text


def test_registry_per_architecture():
    hopper = {c.name for c in checks.supported((9, 0))}
    blackwell = {c.name for c in checks.supported((10, 0))}
    assert {
        "wgmma_probe.fp8",
        "attention_fp8.exact_debug",
        "attention_directp.float_inputs",
    } <= hopper
    assert not any(n.startswith("blackwell_matmul") for n in hopper)
    assert {
        "blackwell_matmul.mxfp8_e4m3",
        "blackwell_matmul.mxfp4",
        "blackwell_matmul.nvfp4",
    } <= blackwell
    assert "wgmma_probe.fp8" not in blackwell  # wgmma is sm_90a only
    # the Blackwell attention bodies (only compiled): one check per shipped configuration,
    # run on sm_100 only, never on Hopper
    from fp4sim.kernels.attention_sm100 import shipped_cases

    sm100 = {c.name for c in checks.CHECKS if c.name.startswith("attention_sm100.")}
    assert len(sm100) == len(shipped_cases()) and sm100 <= blackwell
    assert not sm100 & hopper
    quant = {c.name for c in checks.CHECKS if c.name.startswith("quantize.")}
    assert quant and quant <= hopper and quant <= blackwell
    assert checks.supported((8, 0)) == []


def test_verdicts(monkeypatch):
    def boom():
        raise RuntimeError("kernel failed to build")

    fake = tuple(
        checks.KernelCheck(name=n, kernel="k", contract="c", min_arch=(9, 0), majors=None, run=r)
        for n, r in (
            ("ok", lambda: (True, "fine", 3)),
            ("bad", lambda: (False, "x", 3)),
            ("err", boom),
        )
    )
    monkeypatch.setattr(checks, "CHECKS", fake)
    res = {r.name: r for r in checks.run_checks((9, 0))}
    assert res["ok"].verdict is checks.Verdict.PASS and res["ok"].compared == 3
    assert res["bad"].verdict is checks.Verdict.FAIL
    assert res["err"].verdict is checks.Verdict.ERROR and "kernel failed" in res["err"].detail
    assert [r.name for r in checks.run_checks((9, 0), ["bad"])] == ["bad"]
    assert json.dumps(res["err"].to_json())


def test_quantize_check_runs_in_interpret_mode():
    ok, detail, n = harness.interpret(checks.quantize_check("MXFP8_E4M3", "float32", False, n=64))
    assert ok, detail
    assert n == 64 * 64 + 64 * 2


def test_gpu_path_table_json_and_budget(monkeypatch, capsys, tmp_path):
    """The GPU path with a pretend Hopper and stand-in checks: table, JSON, exit status, the
    time budget, the checks of other architectures listed as such."""
    fake = (
        checks.KernelCheck(
            name="a",
            kernel="ka",
            contract="bitwise",
            min_arch=(9, 0),
            majors=None,
            run=lambda: (True, "0 differ", 5),
        ),
        checks.KernelCheck(
            name="b",
            kernel="kb",
            contract="bound",
            min_arch=(9, 0),
            majors=(9,),
            run=lambda: (False, "too far", 5),
        ),
        checks.KernelCheck(
            name="c",
            kernel="kc",
            contract="bitwise",
            min_arch=(10, 0),
            majors=(10,),
            run=lambda: (True, "", 1),
            compiled_only=True,
        ),
    )
    monkeypatch.setattr(checks, "CHECKS", fake)
    monkeypatch.setattr(harness, "device_arch", lambda: (9, 0))
    out = tmp_path / "v.json"
    code, text, _ = _run(["validate", "--out", str(out)], capsys)
    assert code == 1 and "1 passed, 1 failed, 0 errors" in text
    assert "(not for sm_90; only compiled, never run)" in text  # never claimed run
    info = json.loads(out.read_text())
    assert info["not_for_this_arch_compiled_only"] == ["c"]
    assert info["arch"] == "sm_90" and info["verdict"] == "fail"
    assert [r["verdict"] for r in info["results"]] == ["PASS", "FAIL"]
    assert info["not_for_this_arch"] == ["c"]
    code, text, _ = _run(["validate", "--only", "a", "--out", str(out)], capsys)
    assert code == 0 and json.loads(out.read_text())["verdict"] == "pass"
    code, text, _ = _run(["validate", "--time-budget-s", "0", "--out", str(out)], capsys)
    info = json.loads(out.read_text())
    assert info["results"] == [] and info["not_run_time_budget"] == ["a", "b"]
    assert "not run: time budget" in text


@pytest.mark.slow
def test_directp_check_runs_in_interpret_mode():
    """validate's Direct-P check, at a small size, in GPU interpret mode (about 30 s)."""
    ok, detail, n = harness.interpret(
        checks.attention_directp_check(128, 1, 64), detect_races=False
    )
    assert ok, detail
    assert n == 128 * 64

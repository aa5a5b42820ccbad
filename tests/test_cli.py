"""``python -m fp4sim``: every subcommand's --help is clear, and bad arguments give clear errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fp4sim import __main__ as cli

_HELP_PATHS = [
    [],
    ["reproduce"],
    ["golden"],
    ["golden", "write"],
    ["golden", "check"],
    ["golden", "list"],
    ["figures"],
    ["bench"],
    ["train"],
]


def _run(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    out = capsys.readouterr()
    return e.value.code, out.out, out.err


@pytest.mark.parametrize("argv", _HELP_PATHS, ids=lambda a: " ".join(a) or "top")
def test_help(argv, capsys):
    code, out, _ = _run([*argv, "--help"], capsys)
    assert code == 0
    assert out.startswith("usage: python -m fp4sim")
    assert len(out.splitlines()) >= 3


def test_top_help_lists_every_command(capsys):
    _, out, _ = _run(["--help"], capsys)
    for name in ("reproduce", "golden", "figures", "bench"):
        assert name in out


def test_bench_help_lists_every_suite(capsys):
    from fp4sim.benchmarks.cli import SUITES

    _, out, _ = _run(["bench", "--help"], capsys)
    for suite in SUITES:
        assert suite in out
        code, sub, _ = _run(["bench", suite, "--help"], capsys)
        assert code == 0 and sub.startswith("usage:")


def test_python_m_entry_point():
    out = subprocess.run(
        [sys.executable, "-m", "fp4sim", "--help"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and "reproduce" in out.stdout


@pytest.mark.parametrize(
    "argv, needle",
    [
        ([], "required: COMMAND"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["reproduce", "--quick", "--full"], "not allowed with argument"),
        (["reproduce", "--section", "nonsense"], "invalid choice: 'nonsense'"),
        (["golden"], "required: ACTION"),
        (["golden", "update"], "invalid choice: 'update'"),
        (["figures", "--out"], "expected one argument"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_bad_arguments_exit_2_with_a_message(argv, needle, capsys):
    code, _, err = _run(argv, capsys)
    assert code == 2
    assert needle in err, err


def test_unknown_golden_case_is_named(capsys):
    assert cli.main(["golden", "check", "--case", "formats.nope.nothing"]) == 2
    assert "formats.nope.nothing" in capsys.readouterr().err


def test_golden_check_of_an_empty_folder_says_what_to_do(tmp_path, capsys):
    assert cli.main(["golden", "check", "--dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "no manifest" in err and "golden write" in err


def test_unknown_figure_is_named(capsys, tmp_path):
    assert cli.main(["figures", "--out", str(tmp_path), "--only", "no_such_figure"]) == 2
    assert "no_such_figure" in capsys.readouterr().err


def test_golden_list_and_figures_list(capsys):
    from fp4sim.figures import FIGURES
    from fp4sim.golden import CASES

    assert cli.main(["golden", "list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in CASES)
    assert cli.main(["figures", "--list"]) == 0
    out = capsys.readouterr().out
    assert all(f.filename in out for f in FIGURES.values())


def test_figures_command_writes_a_png(tmp_path, capsys):
    assert (
        cli.main(
            ["figures", "--quick", "--no-progress", "--out", str(tmp_path), "--only", "e2m1_grid"]
        )
        == 0
    )
    png = tmp_path / "e2m1_grid.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert str(png) in capsys.readouterr().out


def test_commands_write_into_the_working_directory_never_the_package(tmp_path, monkeypatch, capsys):
    import fp4sim

    package = __import__("pathlib").Path(fp4sim.__file__).resolve().parent
    before = sorted(p.name for p in package.rglob("*") if "__pycache__" not in p.parts)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["golden", "write", "--no-progress", "--case", "formats.e2m1.all_codes"]) == 0
    assert (tmp_path / "golden" / "manifest.json").exists()
    assert (tmp_path / "golden" / "formats.e2m1.all_codes.npz").exists()
    assert cli.main(["figures", "--quick", "--no-progress", "--only", "e2m1_grid"]) == 0
    assert (tmp_path / "figures" / "e2m1_grid.png").exists()
    assert cli.main(["golden", "check", "--no-progress", "--case", "formats.e2m1.all_codes"]) == 0
    assert sorted(p.name for p in package.rglob("*") if "__pycache__" not in p.parts) == before


@pytest.mark.parametrize("flag", ["--help", "--version"])
def test_top_level_help_and_version_import_neither_numpy_nor_jax(flag):
    code = (
        "import runpy, sys\n"
        f"sys.argv = ['fp4sim', {flag!r}]\n"
        "try:\n    runpy.run_module('fp4sim', run_name='__main__')\n"
        "except SystemExit as e:\n    assert e.code == 0, e.code\n"
        "heavy = sorted(m for m in ('numpy', 'jax', 'jaxlib', 'ml_dtypes', 'matplotlib') if m in sys.modules)\n"
        "print('HEAVY', heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout, out.stdout


def test_version():
    import fp4sim

    out = subprocess.run(
        [sys.executable, "-m", "fp4sim", "--version"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and out.stdout.strip() == f"fp4sim {fp4sim.__version__}"


def _all_parsers():
    import argparse

    stack = [("python -m fp4sim", cli.build_parser("*"))]
    while stack:
        name, parser = stack.pop()
        yield name, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                stack += [(f"{name} {sub}", p) for sub, p in action.choices.items()]


def test_every_option_has_help():
    import argparse

    missing = [
        f"{name} {'/'.join(a.option_strings) or a.dest}"
        for name, parser in _all_parsers()
        for a in parser._actions
        if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
        and (not a.help or a.help == argparse.SUPPRESS)
    ]
    assert not missing, f"options without help: {missing}"

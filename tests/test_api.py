"""The public surface: a flat ``fp4sim`` namespace whose ``__all__`` is consistent, and an import
that loads no matplotlib and initialises no jax backend (so ``import fp4sim`` is cheap and safe on
a machine whose GPU is busy)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import subprocess
import sys

import pytest

import fp4sim


def _modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(fp4sim.__path__, prefix="fp4sim."))


def test_all_is_consistent():
    names = fp4sim.__all__
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})
    missing = [n for n in names if not hasattr(fp4sim, n)]
    assert not missing, f"fp4sim.__all__ names that do not exist: {missing}"
    assert "__version__" in names


@pytest.mark.parametrize("package", ["fp4sim.formats", "fp4sim.attention", "fp4sim.kernels"])
def test_subpackage_all_is_consistent_and_reexported(package):
    mod = importlib.import_module(package)
    names = list(getattr(mod, "__all__", []))
    assert len(names) == len(set(names)), f"{package}.__all__ has duplicates"
    assert not [n for n in names if not hasattr(mod, n)], f"{package}.__all__ names missing"
    if package != "fp4sim.kernels":  # kernels are imported explicitly, never re-exported
        assert not [n for n in names if n not in fp4sim.__all__], (
            f"{package} names not in fp4sim.__all__"
        )


def test_public_names_are_documented():
    import inspect

    def needs_doc(obj) -> bool:  # functions and classes (type aliases and constants excluded)
        return inspect.isfunction(obj) or inspect.isclass(obj)

    undocumented = [
        n
        for n in fp4sim.__all__
        if not n.startswith("__")
        and needs_doc(getattr(fp4sim, n))
        and not (getattr(fp4sim, n).__doc__ or "").strip()
    ]
    assert not undocumented, f"public functions and classes without a docstring: {undocumented}"


def test_every_module_starts_with_a_docstring():
    # Importing every module (kernels included) must work on a CPU-only machine.
    bare = [
        name for name in _modules() if not (importlib.import_module(name).__doc__ or "").strip()
    ]
    assert not bare, f"modules without a docstring saying what they own: {bare}"


def test_import_loads_no_matplotlib_and_no_jax_backend():
    code = (
        "import sys, fp4sim, fp4sim.golden, fp4sim.report, fp4sim.figures, fp4sim.benchmarks.cli, "
        "fp4sim.__main__\n"
        "from jax._src import xla_bridge\n"
        "assert 'matplotlib' not in sys.modules, 'matplotlib was imported'\n"
        "assert not xla_bridge.backends_are_initialized(), 'a jax backend was initialised'\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


@pytest.mark.parametrize(
    "module",
    [
        "fp4sim",
        "fp4sim.golden",
        "fp4sim.golden.store",
        "fp4sim.report",
        "fp4sim.report.experiments",
        "fp4sim.report.norm_study",
        "fp4sim.report.figures",
    ],
)
def test_docstring_examples_run(module):
    mod = importlib.import_module(module)
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


README = (__import__("pathlib").Path(__file__).resolve().parent.parent / "README.md").read_text()


def _spec_blocks() -> dict[str, dict[str, str]]:
    import re

    blocks = {}
    for block in re.findall(r"```text\n(.*?)```", README, flags=re.S):
        lines = block.splitlines()
        name = lines[0].split()[0]
        fields = {}
        for line in lines[1:]:
            m = re.match(r"\s+(max|min normal|min subnormal|layout)\s+(.*)", line)
            if m:
                fields[m.group(1)] = m.group(2)
        blocks[name] = fields
    return blocks


def test_readme_has_one_spec_block_per_format_and_its_numbers_are_the_library_s():
    blocks = _spec_blocks()
    assert sorted(blocks) == sorted(f.name for f in fp4sim.ALL_FORMATS)
    for fmt in fp4sim.ALL_FORMATS:
        info = fp4sim.finfo(fmt)
        b = blocks[fmt.name]
        for key, want in (
            ("max", info.max),
            ("min normal", info.min_normal),
            ("min subnormal", info.min_subnormal),
        ):
            assert float(b[key].split()[0]) == want, (fmt.name, key, b[key], want)
        assert f"bias {fmt.bias}" in b["layout"], (fmt.name, b["layout"])


def test_readme_keeps_the_two_commands_and_its_quick_start_runs(capsys):
    import re

    assert "make demo   #" in README and "make test   #" in README
    code = re.search(r"## Quick start\n\n```python\n(.*?)```", README, flags=re.S).group(1)
    exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "[0 2 4 4 6 7 9] [ 0.   1.   2.   2.   4.   6.  -0.5]"

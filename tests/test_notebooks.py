"""Every notebook in notebooks/ is a valid jupytext percent-format file, and every one but the GPU
notebook executes top to bottom *as a notebook* at small sizes (``FP4SIM_SMALL=1``): converted
with jupytext, run by nbclient in an IPython kernel of this interpreter (``sys.executable``, so
the kernel imports the same fp4sim as the test; no installed kernelspec is used), with inline
figures (``image/png``) and rendered tables (``text/markdown`` or ``text/html``) among its outputs,
no error output, and no file left behind: not in the kernel's working directory, not in its
temporary directory, not in the repository."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.py"))
CPU_NOTEBOOKS = [p for p in NOTEBOOKS if "gpu" not in p.stem]
GPU_NOTEBOOKS = [p for p in NOTEBOOKS if "gpu" in p.stem]
TABLE_TYPES = ("text/markdown", "text/html")


def test_the_notebook_set_is_complete():
    topics = ["formats", "code_match", "normalization", "leak", "golden", "gpu"]
    stems = [p.stem for p in NOTEBOOKS]
    assert [t for t in topics if not any(t in s for s in stems)] == [], stems


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_is_a_percent_format_notebook(path):
    import jupytext  # a dev dependency (make test installs it)

    nb = jupytext.read(path)
    kinds = [c.cell_type for c in nb.cells]
    assert kinds.count("markdown") >= 2 and kinds.count("code") >= 2
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")
    compile(path.read_text(), str(path), "exec")
    # Notebooks use the public API only.
    private = re.findall(r"\bfp4sim(?:\.\w+)*\._(?!_)\w+", path.read_text())
    assert not private, f"{path.name} reaches into private names: {private}"


def _repo_files() -> set[str] | None:
    """Every untracked file of the checkout, ignored ones included (None outside a git checkout)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--ignored", "--untracked-files=all"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    # bytecode caches are Python's, not a notebook's (the kernel writes none: it runs with
    # PYTHONDONTWRITEBYTECODE)
    return {line for line in out.stdout.splitlines() if "__pycache__/" not in line}


def _this_interpreter_kernel():
    """An nbclient kernel manager that starts ``sys.executable -m ipykernel_launcher``."""
    from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    class ThisInterpreter(KernelSpecManager):
        def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
            return KernelSpec(
                argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                display_name=f"Python ({sys.executable})",
                language="python",
                name=kernel_name,
            )

    # "python3": the name under which jupyter_client treats the kernel as an IPython kernel
    # (nbclient then keeps the kernel's input history in memory instead of a file)
    return AsyncKernelManager(kernel_name="python3", kernel_spec_manager=ThisInterpreter())


def execute_notebook(path: Path, tmp_path: Path, *, timeout: int) -> list[dict]:
    """Run ``path`` as a notebook in a fresh kernel of this interpreter; returns the code cells'
    outputs and asserts that nothing was left in the kernel's cwd, TMPDIR or the repository."""
    nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed (dev extra)")
    pytest.importorskip("ipykernel", reason="ipykernel is not installed (dev extra)")
    jupytext = pytest.importorskip("jupytext", reason="jupytext is not installed (dev extra)")
    import nbformat  # nbclient's dependency

    import fp4sim  # the test's fp4sim: the kernel must import the same

    cwd, scratch, home = (tmp_path / d for d in ("cwd", "tmp", "jupyter"))
    for d in (cwd, scratch, home):
        d.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}  # the kernel's: inline
    env.update(
        FP4SIM_SMALL="1",
        TMPDIR=str(scratch),
        PYTHONDONTWRITEBYTECODE="1",  # no __pycache__ written into the checkout by the kernel
        # the kernel's own state (IPython profile, matplotlib cache) outside the folders checked
        IPYTHONDIR=str(home / "ipython"),
        MPLCONFIGDIR=str(home / "matplotlib"),
        JUPYTER_RUNTIME_DIR=str(home / "runtime"),
    )
    if path in CPU_NOTEBOOKS:
        env["JAX_PLATFORMS"] = "cpu"
    nb = jupytext.read(path)
    # a first cell (not the notebook's) tells which interpreter and fp4sim the kernel runs
    probe = "import sys, fp4sim\nprint(sys.executable, fp4sim.__file__, sep='\\n')"
    nb.cells.insert(0, nbformat.v4.new_code_cell(probe))
    client = nbclient.NotebookClient(
        nb,
        km=_this_interpreter_kernel(),
        timeout=timeout,
        resources={"metadata": {"path": str(cwd)}},
    )
    before = _repo_files()
    try:
        client.execute(env=env, cwd=str(cwd))
    except nbclient.exceptions.CellExecutionError as exc:
        pytest.fail(f"{path.name} raised in a cell:\n{str(exc)[-4000:]}")
    seen = "".join(o.get("text", "") for o in nb.cells.pop(0).outputs).split("\n")[:2]
    assert seen == [sys.executable, fp4sim.__file__], (
        f"the kernel ran {seen}, the test {[sys.executable, fp4sim.__file__]}"
    )
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    left = sorted(str(p.relative_to(tmp_path)) for d in (cwd, scratch) for p in d.rglob("*"))
    assert not left, f"{path.name} left {left} behind"
    after = _repo_files()
    if before is not None and after is not None:
        assert after <= before, f"{path.name} wrote into the repository: {sorted(after - before)}"
    return outputs


def _check_outputs(path: Path, outputs: list[dict]) -> None:
    errors = [o for o in outputs if o.get("output_type") == "error"]
    assert not errors, f"{path.name}: error outputs {[e.get('ename') for e in errors]}"
    rich = [
        o.get("data", {})
        for o in outputs
        if o.get("output_type") in ("display_data", "execute_result")
    ]
    images = [d for d in rich if "image/png" in d]
    tables = [d for d in rich if any(t in d for t in TABLE_TYPES)]
    assert images, f"{path.name} shows no figure (no image/png output)"
    # every figure the notebook makes is shown inline, once
    made = len(re.findall(r"\bfigures\.draw\(|\bplt\.subplots\(", path.read_text()))
    assert len(images) == made, f"{path.name} makes {made} figures and shows {len(images)}"
    assert tables, f"{path.name} shows no table (no {' or '.join(TABLE_TYPES)} output)"
    for d in tables:
        text = next(d[t] for t in TABLE_TYPES if t in d)
        assert "|---" in text or "<table" in text, (
            f"{path.name}: a table output is no table: {text[:200]}"
        )


@pytest.mark.parametrize("path", CPU_NOTEBOOKS, ids=lambda p: p.stem)
def test_executes_as_a_notebook(path, tmp_path):
    _check_outputs(path, execute_notebook(path, tmp_path, timeout=300))


@pytest.mark.gpu
@pytest.mark.parametrize("path", GPU_NOTEBOOKS, ids=lambda p: p.stem)
def test_gpu_notebook_executes(path, tmp_path):
    _check_outputs(path, execute_notebook(path, tmp_path, timeout=600))

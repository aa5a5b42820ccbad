"""Every notebook in notebooks/ is a valid jupytext percent-format file, and every one but the GPU
notebook executes top to bottom at small sizes (``FP4SIM_SMALL=1``) as a plain script."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.py"))
CPU_NOTEBOOKS = [p for p in NOTEBOOKS if "gpu" not in p.stem]
GPU_NOTEBOOKS = [p for p in NOTEBOOKS if "gpu" in p.stem]


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


@pytest.mark.parametrize("path", CPU_NOTEBOOKS, ids=lambda p: p.stem)
def test_executes_at_small_size(path, tmp_path):
    scratch = tmp_path / "tmp"  # the notebook's temporary folder: nothing of fp4sim's may remain
    scratch.mkdir()
    env = dict(
        os.environ, FP4SIM_SMALL="1", MPLBACKEND="Agg", JAX_PLATFORMS="cpu", TMPDIR=str(scratch)
    )
    out = subprocess.run(
        [sys.executable, str(path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, f"{path.name} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    assert out.stdout.strip(), f"{path.name} printed nothing"
    left = sorted(p.name for p in scratch.iterdir() if p.name.startswith("fp4sim"))
    assert not left, f"{path.name} left {left} in its temporary folder"


@pytest.mark.gpu
@pytest.mark.parametrize("path", GPU_NOTEBOOKS, ids=lambda p: p.stem)
def test_gpu_notebook_executes(path, tmp_path):
    env = dict(os.environ, FP4SIM_SMALL="1", MPLBACKEND="Agg")
    out = subprocess.run(
        [sys.executable, str(path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, f"{path.name} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"

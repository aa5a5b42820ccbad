"""The documentation site builds without a warning, and the README points to it.

``mkdocs build --strict`` (mkdocs + mkdocstrings, the ``docs`` extra) turns every warning —
a broken link, a missing page, a docstring mkdocstrings cannot render — into an error.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None,
    reason="mkdocs/mkdocstrings are not installed (pip install 'fp4sim[docs]')",
)
def test_docs_build_strict(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "-q",
            "-f",
            str(ROOT / "mkdocs.yml"),
            "-d",
            str(tmp_path / "site"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for page in (
        "index.html",
        "formats/index.html",
        "disagreements/index.html",
        "algorithms/index.html",
        "kernels/index.html",
        "architecture/index.html",
        "api/attention/index.html",
    ):
        assert (tmp_path / "site" / page).is_file(), page
    api = (tmp_path / "site" / "api" / "attention" / "index.html").read_text()
    assert (
        "attention_forward" in api and "emulated_attention" in api
    )  # rendered from the docstrings


def test_readme_links_the_docs():
    readme = (ROOT / "README.md").read_text()
    assert "(docs/index.md)" in readme and "mkdocs build --strict" in readme
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in sorted(
        p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")
    ):
        assert page in nav, f"docs/{page} is not in mkdocs.yml's nav"

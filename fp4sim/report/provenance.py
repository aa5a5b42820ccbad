"""Where and with what a report was made: :func:`provenance` and its Markdown table.

The record names the code (the git revision and whether the checkout had uncommitted changes;
where fp4sim does not run from a git checkout, e.g. from an installed wheel, the revision given
by the environment variable ``FP4SIM_GIT_REVISION``, else "unknown"), the versions of Python and
of the libraries the numbers depend on, the platform, jax's backend and devices, and the XLA and
jax flags of the environment, so that two reports can be told apart.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["provenance", "provenance_markdown", "git_revision"]

_PACKAGES = ("fp4sim", "numpy", "jax", "jaxlib", "ml_dtypes", "matplotlib", "tqdm")


def _git(root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_revision() -> dict[str, Any]:
    """``{"revision", "dirty", "source"}``: from the checkout fp4sim runs from (``source`` "git"),
    else from ``FP4SIM_GIT_REVISION`` (``source`` "environment"), else "unknown"."""
    root = Path(__file__).resolve().parents[2]
    if (root / ".git").exists():
        rev = _git(root, "rev-parse", "HEAD")
        if rev:
            status = _git(root, "status", "--porcelain", "--untracked-files=no")
            return {"revision": rev, "dirty": bool(status), "source": "git"}
    env = os.environ.get("FP4SIM_GIT_REVISION", "").strip()
    if env:
        return {"revision": env, "dirty": None, "source": "environment"}
    return {"revision": "unknown", "dirty": None, "source": "none"}


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def provenance(argv: list[str] | None = None) -> dict[str, Any]:
    """The provenance record (module docstring); ``argv`` the command line, if any."""
    import jax

    from fp4sim import __version__

    versions = {name: _version(name) for name in _PACKAGES}
    versions["fp4sim"] = __version__  # the code that ran, also from a checkout without metadata
    versions["python"] = sys.version.split()[0]
    return {
        "git": git_revision(),
        "versions": versions,
        "platform": {
            "system": platform.platform(),
            "machine": platform.machine(),
            "processor": platform.processor() or None,
            "cpu_count": os.cpu_count(),
            "python_implementation": platform.python_implementation(),
        },
        "jax": {"backend": jax.default_backend(), "devices": [str(d) for d in jax.devices()]},
        "flags": {
            k: v
            for k, v in sorted(os.environ.items())
            if k == "XLA_FLAGS" or k.startswith("JAX_") or k.startswith("FP4SIM_")
        },
        "argv": list(sys.argv if argv is None else argv),
    }


def provenance_markdown(p: dict[str, Any]) -> str:
    """The record as a two-column Markdown table."""
    g = p["git"]
    rev = (
        g["revision"]
        + (" (uncommitted changes)" if g["dirty"] else "")
        + (f" (from {g['source']})" if g["source"] != "git" else "")
    )
    rows = [("git revision", rev)]
    rows += [(name, v or "not installed") for name, v in p["versions"].items()]
    rows += [
        ("platform", p["platform"]["system"]),
        ("CPUs", p["platform"]["cpu_count"]),
        ("jax backend", f"{p['jax']['backend']}: {', '.join(p['jax']['devices'])}"),
    ]
    flags = p["flags"]
    rows += [(k, f"`{v}`") for k, v in flags.items()] or [("XLA / jax flags", "none set")]
    rows += [("command", "`" + " ".join(p["argv"]) + "`")]
    lines = ["| what | value |", "|---|---|"] + [f"| {a} | {b} |" for a, b in rows]
    return "\n".join(lines)

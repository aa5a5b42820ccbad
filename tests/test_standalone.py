"""The repository stands alone: no file refers to a document outside it or uses internal jargon.

Every text file of the repository (README, docs, the package's sources and data notes, the
report's text, notebooks, scripts, tests) is scanned for
names of documents that are not in the repository and for the project's former internal labels;
public sources are cited by arXiv id, repository URL or specification instead.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# (pattern, why it is forbidden)
FORBIDDEN: tuple[tuple[str, str], ...] = (
    (r"seed_algorithms", "a document outside the repository"),
    (r"DESIGN\.md", "a document outside the repository"),
    (r"pallas_mgpu\.md", "a document outside the repository"),
    (r"formats_anchors", "a document outside the repository"),
    (r"aesthetics_anchors", "a document outside the repository"),
    (r"\.\./shared|/work/shared", "a folder outside the repository"),
    (r"reference/[a-z_]+\.md", "a document outside the repository"),
    (r"seed[ _-]articles?", "internal jargon: cite the paper"),
    (r"\bfounders?\b", "internal jargon"),
    (
        r"\[(B|R|I)\]|\[B,|\[C(:[a-z]+)?[],]",
        "internal provenance tags: say 'claimed' (with a link) or 'expected'",
    ),
    (r"\bseed \d{3}\b|\bseed\d{3}", "internal jargon: cite the paper"),
    (r"\*Seed:\*", "internal jargon"),
    (
        r"\bseeds?'s? (claim|report|article|table|number|size|rate|grid|class|rule|bound|example|say)",
        "internal jargon ('seed' means a random seed only)",
    ),
    (
        r"\bthe seeds? (claim|report|say|state|use|do )",
        "internal jargon ('seed' means a random seed only)",
    ),
    (r"§ ?\d", "a section of a document outside the repository (name the source instead)"),
)

_TEXT_SUFFIXES = {
    ".py",
    ".md",
    ".toml",
    ".txt",
    ".json",
    ".yml",
    ".yaml",
    ".cfg",
    ".sh",
    ".ipynb",
    "",
}


def _files() -> list[Path]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split("\n")
        paths = [ROOT / p for p in out if p]
    except (OSError, subprocess.CalledProcessError):
        paths = [p for p in ROOT.rglob("*") if ".git" not in p.parts and ".venv" not in p.parts]
    keep = []
    for p in paths:
        if not p.is_file() or p.suffix not in _TEXT_SUFFIXES:
            continue
        if p.resolve() == Path(__file__).resolve():
            continue
        keep.append(p)
    return keep


def _hits() -> list[str]:
    pats = [(re.compile(p), why) for p, why in FORBIDDEN]
    hits = []
    for path in _files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for n, line in enumerate(text.splitlines(), 1):
            for pat, why in pats:
                m = pat.search(line)
                if m:
                    hits.append(f"{path.relative_to(ROOT)}:{n}: {m.group(0)!r} ({why})")
    return hits


def test_no_reference_to_documents_outside_the_repository_and_no_jargon():
    hits = _hits()
    assert not hits, "\n".join(hits[:50])


@pytest.mark.parametrize(
    "bad",
    [
        "see seed_" + "algorithms.md",  # split: the file itself must not match
        "the seed article says",
        "63 % [B]",
        "cosine [C:doc]",
        "the found" + "ers' scripts",
        "(§6.3)",
        "the seeds' tables",
        "seed 000's example",
    ],
)
def test_the_scan_catches_each_pattern(bad):
    assert any(re.search(p, bad) for p, _ in FORBIDDEN), bad


@pytest.mark.parametrize(
    "fine",
    [
        "3 seeds trained side by side",
        "seed=0",
        "paired by seed",
        "the seeds differ",
        "rng = np.random.default_rng(seed)",
    ],
)
def test_random_seeds_are_not_jargon(fine):
    assert not any(re.search(p, fine) for p, _ in FORBIDDEN), fine


# every method or library the README names is linked (inline or by reference) at least once
README_METHODS = (
    "Direct-P",
    "Mitchell-P",
    "FLAMIA",
    "SageAttention3",
    "HAO",
    "torchao",
    "TransformerEngine",
    "cuDNN",
    "MMA-Sim",
    "FlashAttention-3",
    "FlashAttention-4",
    "Attn-QAT",
    "microxcaling",
    "ml_dtypes",
    "OCP",
)


def test_every_method_in_the_readme_links_its_source():
    text = (ROOT / "README.md").read_text()
    links = re.findall(r"\[([^\]]+)\](?:\(https?://[^)]+\)|\[[a-z0-9]+\])", text)
    missing = [m for m in README_METHODS if m in text and not any(m in label for label in links)]
    assert not missing, f"README names without a link: {missing}"

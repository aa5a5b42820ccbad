"""The golden store: a registry of named cases, written as ``.npz`` + ``manifest.json`` and checked bitwise.

:func:`write` materialises the registered cases into a folder; :func:`check` regenerates every
case in memory and compares it bit for bit with the stored files. The generators (the case
modules :mod:`fp4sim.golden.cases_formats` and :mod:`fp4sim.golden.cases_attention`, calling the
public emulators) are the source of truth; the files are a cache for consumers that are not
Python, such as a kernel's own CI. The set shipped with fp4sim is package data,
:data:`DATA_DIR` (``fp4sim/golden/data``), so ``python -m fp4sim golden check`` works from an
installed wheel; its on-disk format is documented for other languages in ``data/FORMAT.md``.

A case is a function returning ``dict[str, np.ndarray]`` with *plain* dtypes only (``uint8``,
``uint16``, ``uint32``, ``int32``, ``int64``, ``float32``, ``float64``, ``bool``), never an
ml_dtypes dtype: codes are stored as ``uint8`` and values as IEEE floats, so any language can read
them. Cases are named ``<package>.<topic>.<variant>`` (``formats.e2m1.all_codes``).

Files are byte-reproducible: each case is a ZIP archive (stored, not compressed) whose members are
``<key>.npy`` in sorted order with a fixed timestamp, so the same arrays give the same sha256 on any
machine. ``check`` fails, naming the case, when a file is missing, corrupted (its sha256 differs
from the manifest), holds an array whose bits differ from the regenerated one (an emulator bit
changed), when the registry and the manifest disagree on which cases exist, or when fewer cases
than the manifest's ``min_cases`` floor are present (a golden set that silently shrank).

>>> from fp4sim import golden
>>> "formats.e2m1.all_codes" in golden.CASES
True
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "GoldenCase",
    "GoldenMismatch",
    "CASES",
    "register",
    "generate",
    "write",
    "check",
    "array_sha256",
    "DATA_DIR",
    "DEFAULT_DIR",
    "display_dir",
    "FORMAT_VERSION",
    "PLAIN_DTYPES",
]

FORMAT_VERSION = 1
DATA_DIR = Path(__file__).resolve().parent / "data"
"""The golden set shipped with fp4sim (package data): what ``golden check`` reads by default."""
DEFAULT_DIR = DATA_DIR  # the name this folder had before it became package data
PLAIN_DTYPES = frozenset(
    np.dtype(d)
    for d in ("uint8", "uint16", "uint32", "int32", "int64", "float32", "float64", "bool")
)
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # fixed member timestamp: the same arrays give the same bytes
_MANIFEST = "manifest.json"
_REGENERATE = "python -m fp4sim golden write --out {dir}"


class GoldenMismatch(AssertionError):
    """A golden check failed; ``problems`` lists one line per failing case (each names the case)."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("golden check failed:\n  " + "\n  ".join(self.problems))


@dataclasses.dataclass(frozen=True, kw_only=True)
class GoldenCase:
    """One named golden case: ``make()`` returns its arrays; ``params`` describe how they were made."""

    name: str
    make: Callable[[], dict[str, np.ndarray]]
    description: str
    params: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        parts = self.name.split(".")
        if len(parts) < 3 or not all(p and all(c.isalnum() or c in "_-" for c in p) for p in parts):
            raise ValueError(
                f"name={self.name!r} must look like 'package.topic.variant' "
                "(letters, digits, '_' or '-' between dots)"
            )

    def generate(self) -> dict[str, np.ndarray]:
        arrays = self.make()
        if not isinstance(arrays, dict) or not arrays:
            raise TypeError(
                f"golden case {self.name}: make() returned {type(arrays).__name__}; "
                "expected a non-empty dict[str, np.ndarray]"
            )
        out = {}
        for key in sorted(arrays):
            a = np.asarray(arrays[key])
            if not key.isidentifier():
                raise ValueError(
                    f"golden case {self.name}: array name {key!r} is not an identifier"
                )
            if a.dtype not in PLAIN_DTYPES:
                raise TypeError(
                    f"golden case {self.name}: array {key!r} has dtype {a.dtype}; "
                    f"allowed: {sorted(str(d) for d in PLAIN_DTYPES)}"
                )
            out[key] = np.ascontiguousarray(a)
        return out


CASES: dict[str, GoldenCase] = {}


def register(name: str, *, description: str, **params: Any) -> Callable[[Callable], Callable]:
    """Decorator: register ``fn() -> dict[str, np.ndarray]`` as the golden case ``name``."""

    def deco(fn: Callable[[], dict[str, np.ndarray]]) -> Callable[[], dict[str, np.ndarray]]:
        if name in CASES:
            raise ValueError(f"golden case {name!r} is registered twice")
        CASES[name] = GoldenCase(
            name=name, make=fn, description=description, params=tuple(sorted(params.items()))
        )
        return fn

    return deco


def generate(name: str) -> dict[str, np.ndarray]:
    """The arrays of the registered case ``name``, computed now."""
    if name not in CASES:
        raise ValueError(f"name={name!r} is not a golden case; known: {sorted(CASES)}")
    return CASES[name].generate()


# --- hashing and the byte-reproducible npz --------------------------------------------------------


def array_sha256(a: np.ndarray) -> str:
    """sha256 of an array's dtype, shape and raw little-endian C-order bytes."""
    a = np.ascontiguousarray(a)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    h = hashlib.sha256()
    h.update(f"{a.dtype.str}|{a.shape}|".encode())
    h.update(a.tobytes())
    return h.hexdigest()


def _npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for key in sorted(arrays):
            member = io.BytesIO()
            np.lib.format.write_array(member, np.ascontiguousarray(arrays[key]), allow_pickle=False)
            info = zipfile.ZipInfo(f"{key}.npy", date_time=_ZIP_DATE)
            info.external_attr = 0o644 << 16
            zf.writestr(info, member.getvalue())
    return buf.getvalue()


def _file_name(name: str) -> str:
    return f"{name}.npz"


def _git_revision() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=10,
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _version() -> str:
    from fp4sim import __version__

    return __version__


def _select(names: Iterable[str] | None) -> list[GoldenCase]:
    if names is None:
        return [CASES[n] for n in sorted(CASES)]
    names = list(names)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise ValueError(f"names={unknown} are not golden cases; known: {sorted(CASES)}")
    return [CASES[n] for n in sorted(set(names))]


def write(
    out_dir: str | Path, names: Iterable[str] | None = None, *, progress: bool = False
) -> dict[str, Any]:
    """Write the selected cases (all by default) as ``<name>.npz`` plus ``manifest.json``.

    With ``names`` given, the other entries of an existing manifest are kept. Returns the manifest.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cases = _select(names)
    manifest_path = out / _MANIFEST
    entries: dict[str, Any] = {}
    if names is not None and manifest_path.exists():
        entries = dict(json.loads(manifest_path.read_text())["cases"])
    for case in _progress(cases, progress, "golden write"):
        arrays = case.generate()
        blob = _npz_bytes(arrays)
        (out / _file_name(case.name)).write_bytes(blob)
        entries[case.name] = {
            "file": _file_name(case.name),
            "description": case.description,
            "params": {k: _jsonable(v) for k, v in case.params},
            "sha256": hashlib.sha256(blob).hexdigest(),
            "arrays": {
                k: {"dtype": a.dtype.str, "shape": list(a.shape), "sha256": array_sha256(a)}
                for k, a in arrays.items()
            },
        }
    manifest = {
        "format_version": FORMAT_VERSION,
        "fp4sim_version": _version(),
        "git_revision": _git_revision(),
        "regenerate": _REGENERATE.format(dir=display_dir(out)),
        "check": f"python -m fp4sim golden check --dir {display_dir(out)}",
        "min_cases": len(entries),
        "cases": dict(sorted(entries.items())),
    }
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=False) + "\n")
    return manifest


def check(
    directory: str | Path = DATA_DIR, names: Iterable[str] | None = None, *, progress: bool = False
) -> int:
    """Regenerate the cases and compare them bitwise with ``directory``; returns the number checked.

    Raises :class:`GoldenMismatch` listing every failing case by name.
    """
    d = Path(directory)
    manifest_path = d / _MANIFEST
    if not manifest_path.exists():
        raise GoldenMismatch([f"{manifest_path}: no manifest; run `{_REGENERATE.format(dir=d)}`"])
    manifest = json.loads(manifest_path.read_text())
    if manifest.get("format_version") != FORMAT_VERSION:
        raise GoldenMismatch(
            [
                f"{manifest_path}: format_version={manifest.get('format_version')!r}, "
                f"this fp4sim reads {FORMAT_VERSION}"
            ]
        )
    stored = manifest["cases"]
    problems: list[str] = []
    full = names is None
    cases = _select(names)
    if full:
        missing = sorted(set(CASES) - set(stored))
        extra = sorted(set(stored) - set(CASES))
        problems += [
            f"{n}: registered but absent from the manifest (run golden write)" for n in missing
        ]
        problems += [f"{n}: in the manifest but no longer registered" for n in extra]
        if len(stored) < int(manifest.get("min_cases", 0)):
            problems.append(
                f"manifest lists {len(stored)} cases, fewer than min_cases={manifest['min_cases']}"
            )
    checked = 0
    for case in _progress(cases, progress, "golden check"):
        entry = stored.get(case.name)
        if entry is None:
            if not full:
                problems.append(f"{case.name}: absent from the manifest")
            continue
        problems += _check_case(d, case, entry)
        checked += 1
    if full and checked == 0:
        problems.append("no golden case was checked")
    if problems:
        raise GoldenMismatch(problems)
    return checked


def _check_case(d: Path, case: GoldenCase, entry: Mapping[str, Any]) -> list[str]:
    path = d / entry["file"]
    if not path.exists():
        return [f"{case.name}: file {path} is missing"]
    blob = path.read_bytes()
    digest = hashlib.sha256(blob).hexdigest()
    if digest != entry["sha256"]:
        return [
            f"{case.name}: file {path.name} is corrupted or edited (sha256 {digest[:12]}..., "
            f"manifest says {entry['sha256'][:12]}...)"
        ]
    try:
        with np.load(io.BytesIO(blob), allow_pickle=False) as z:
            stored = {k: z[k] for k in z.files}
    except (ValueError, OSError, zipfile.BadZipFile) as e:
        return [f"{case.name}: file {path.name} cannot be read: {e}"]
    fresh = case.generate()
    problems = []
    if set(stored) != set(fresh):
        problems.append(f"{case.name}: arrays {sorted(stored)} stored, {sorted(fresh)} generated")
    for key in sorted(set(stored) & set(fresh)):
        diff = _bitwise_diff(stored[key], fresh[key])
        if diff:
            problems.append(f"{case.name}: array {key!r} {diff}")
    return problems


def _bitwise_diff(stored: np.ndarray, fresh: np.ndarray) -> str:
    if stored.dtype != fresh.dtype or stored.shape != fresh.shape:
        return (
            f"is {stored.dtype}{list(stored.shape)} on disk, {fresh.dtype}{list(fresh.shape)} now"
        )
    if stored.tobytes() == fresh.tobytes():
        return ""
    width = stored.dtype.itemsize
    as_int = np.dtype(f"u{width}") if stored.dtype != np.bool_ else np.dtype("u1")
    a = stored.view(as_int).ravel()
    b = fresh.view(as_int).ravel()
    bad = np.flatnonzero(a != b)
    i = int(bad[0])
    idx = np.unravel_index(i, stored.shape) if stored.shape else ()
    return (
        f"differs bitwise in {bad.size} of {a.size} elements; first at index "
        f"{tuple(int(j) for j in idx)}: stored {stored.ravel()[i]!r} (0x{int(a[i]):0{2 * width}x}), "
        f"regenerated {fresh.ravel()[i]!r} (0x{int(b[i]):0{2 * width}x})"
    )


def _jsonable(v: Any) -> Any:
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return str(v)


def display_dir(p: Path) -> str:
    """``p`` relative to the working directory when it lies below it (for messages), else as is."""
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def _progress(items: list, enabled: bool, desc: str):
    if not enabled:
        return items
    from tqdm import tqdm

    return tqdm(items, desc=desc, unit="case", file=sys.stderr)

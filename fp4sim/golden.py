"""Golden vectors: a registry of named cases, written as ``.npz`` + ``manifest.json`` and checked bitwise.

``python -m fp4sim golden write [--out DIR]`` materialises every registered case; ``python -m
fp4sim golden check [--dir DIR]`` regenerates every case in memory and compares it bit for bit with
the stored files. The generator (this module, calling the public emulators) is the source of
truth; the files are a cache for consumers that are not Python, such as a kernel's own CI. The
on-disk format is documented for them in ``tests/golden/FORMAT.md``.

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

import argparse
import dataclasses
import hashlib
import io
import json
import math
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
    "DEFAULT_DIR",
    "FORMAT_VERSION",
    "PLAIN_DTYPES",
]

FORMAT_VERSION = 1
DEFAULT_DIR = Path(__file__).resolve().parent.parent / "tests" / "golden"
PLAIN_DTYPES = frozenset(np.dtype(d) for d in
                         ("uint8", "uint16", "uint32", "int32", "int64", "float32", "float64", "bool"))
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
            raise ValueError(f"name={self.name!r} must look like 'package.topic.variant' "
                             "(letters, digits, '_' or '-' between dots)")

    def generate(self) -> dict[str, np.ndarray]:
        arrays = self.make()
        if not isinstance(arrays, dict) or not arrays:
            raise TypeError(f"golden case {self.name}: make() returned {type(arrays).__name__}; "
                            "expected a non-empty dict[str, np.ndarray]")
        out = {}
        for key in sorted(arrays):
            a = np.asarray(arrays[key])
            if not key.isidentifier():
                raise ValueError(f"golden case {self.name}: array name {key!r} is not an identifier")
            if a.dtype not in PLAIN_DTYPES:
                raise TypeError(f"golden case {self.name}: array {key!r} has dtype {a.dtype}; "
                                f"allowed: {sorted(str(d) for d in PLAIN_DTYPES)}")
            out[key] = np.ascontiguousarray(a)
        return out


CASES: dict[str, GoldenCase] = {}


def register(name: str, *, description: str, **params: Any) -> Callable[[Callable], Callable]:
    """Decorator: register ``fn() -> dict[str, np.ndarray]`` as the golden case ``name``."""

    def deco(fn: Callable[[], dict[str, np.ndarray]]) -> Callable[[], dict[str, np.ndarray]]:
        if name in CASES:
            raise ValueError(f"golden case {name!r} is registered twice")
        CASES[name] = GoldenCase(name=name, make=fn, description=description,
                                 params=tuple(sorted(params.items())))
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
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent,
                             capture_output=True, text=True, timeout=10)
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


def write(out_dir: str | Path = DEFAULT_DIR, names: Iterable[str] | None = None, *,
          progress: bool = False) -> dict[str, Any]:
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
            "arrays": {k: {"dtype": a.dtype.str, "shape": list(a.shape), "sha256": array_sha256(a)}
                       for k, a in arrays.items()},
        }
    manifest = {
        "format_version": FORMAT_VERSION,
        "fp4sim_version": _version(),
        "git_revision": _git_revision(),
        "regenerate": _REGENERATE.format(dir=_display_dir(out)),
        "check": f"python -m fp4sim golden check --dir {_display_dir(out)}",
        "min_cases": len(entries),
        "cases": dict(sorted(entries.items())),
    }
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=False) + "\n")
    return manifest


def check(directory: str | Path = DEFAULT_DIR, names: Iterable[str] | None = None, *,
          progress: bool = False) -> int:
    """Regenerate the cases and compare them bitwise with ``directory``; returns the number checked.

    Raises :class:`GoldenMismatch` listing every failing case by name.
    """
    d = Path(directory)
    manifest_path = d / _MANIFEST
    if not manifest_path.exists():
        raise GoldenMismatch([f"{manifest_path}: no manifest; run `{_REGENERATE.format(dir=d)}`"])
    manifest = json.loads(manifest_path.read_text())
    if manifest.get("format_version") != FORMAT_VERSION:
        raise GoldenMismatch([f"{manifest_path}: format_version={manifest.get('format_version')!r}, "
                              f"this fp4sim reads {FORMAT_VERSION}"])
    stored = manifest["cases"]
    problems: list[str] = []
    full = names is None
    cases = _select(names)
    if full:
        missing = sorted(set(CASES) - set(stored))
        extra = sorted(set(stored) - set(CASES))
        problems += [f"{n}: registered but absent from the manifest (run golden write)" for n in missing]
        problems += [f"{n}: in the manifest but no longer registered" for n in extra]
        if len(stored) < int(manifest.get("min_cases", 0)):
            problems.append(f"manifest lists {len(stored)} cases, fewer than min_cases="
                            f"{manifest['min_cases']}")
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
        return [f"{case.name}: file {path.name} is corrupted or edited (sha256 {digest[:12]}..., "
                f"manifest says {entry['sha256'][:12]}...)"]
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
        return f"is {stored.dtype}{list(stored.shape)} on disk, {fresh.dtype}{list(fresh.shape)} now"
    if stored.tobytes() == fresh.tobytes():
        return ""
    width = stored.dtype.itemsize
    as_int = np.dtype(f"u{width}") if stored.dtype != np.bool_ else np.dtype("u1")
    a = stored.view(as_int).ravel()
    b = fresh.view(as_int).ravel()
    bad = np.flatnonzero(a != b)
    i = int(bad[0])
    idx = np.unravel_index(i, stored.shape) if stored.shape else ()
    return (f"differs bitwise in {bad.size} of {a.size} elements; first at index "
            f"{tuple(int(j) for j in idx)}: stored {stored.ravel()[i]!r} (0x{int(a[i]):0{2 * width}x}), "
            f"regenerated {fresh.ravel()[i]!r} (0x{int(b[i]):0{2 * width}x})")


def _jsonable(v: Any) -> Any:
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return str(v)


def _display_dir(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def _progress(items: list, enabled: bool, desc: str):
    if not enabled:
        return items
    from tqdm import tqdm

    return tqdm(items, desc=desc, unit="case", file=sys.stderr)


# --- CLI ----------------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    w = sub.add_parser("write", help="generate the cases and write .npz files plus manifest.json",
                       description="Generate every golden case (or those named) and write "
                                   "<name>.npz plus manifest.json into --out.")
    w.add_argument("--out", type=Path, default=DEFAULT_DIR, metavar="DIR",
                   help=f"output folder (default: {_display_dir(DEFAULT_DIR)})")
    c = sub.add_parser("check", help="regenerate the cases and compare them bitwise with the stored files",
                       description="Regenerate every golden case (or those named) and compare bit for "
                                   "bit with the files in --dir; exit 1 naming each failing case.")
    c.add_argument("--dir", "--out", dest="out", type=Path, default=DEFAULT_DIR, metavar="DIR",
                   help=f"folder holding manifest.json (default: {_display_dir(DEFAULT_DIR)})")
    ls = sub.add_parser("list", help="list the registered cases", description="List the registered cases.")
    for p in (w, c):
        p.add_argument("--case", dest="names", action="append", metavar="NAME",
                       help="only this case (repeatable); default: all")
        p.add_argument("--no-progress", dest="progress", action="store_false",
                       help="no progress bar")
    ls.set_defaults(out=None, names=None, progress=False)


def run(args: argparse.Namespace) -> int:
    if args.action == "list":
        for name in sorted(CASES):
            print(f"{name:48s} {CASES[name].description}")
        return 0
    try:
        if args.action == "write":
            manifest = write(args.out, args.names, progress=args.progress)
            n = len(set(args.names)) if args.names else len(manifest["cases"])
            print(f"wrote {n} golden case(s) to {args.out}; the manifest lists {len(manifest['cases'])}")
            return 0
        n = check(args.out, args.names, progress=args.progress)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except GoldenMismatch as e:
        print(str(e), file=sys.stderr)
        return 1
    print(f"golden check: {n} cases bit-identical in {args.out}")
    return 0


# ==================================================================================================
# The registered cases. Each calls the public emulators on NumPy inputs; none re-implements them.
# ==================================================================================================

def _case_slug(fmt: Any) -> str:
    return str(fmt).lower()


def _tie_inputs(fmt: Any) -> np.ndarray:
    """Every midpoint between adjacent finite values of ``fmt`` and the next float32 on each side.

    Midpoints of two values of a <= 8-bit format are exact in float32 (one more mantissa bit).
    Signed formats get the mirrored negative inputs too.
    """
    from fp4sim.formats import value_table

    v = np.asarray(value_table(fmt), dtype=np.float64)
    # +0 only: np.unique keeps an unspecified one of +0 and -0 (NumPy 2.5 keeps -0), and the
    # stored vectors start from +0 (-0 comes back through the mirrored negative inputs)
    v = np.unique(v[np.isfinite(v) & (v >= 0) & ~np.signbit(v)])
    mids = ((v[:-1] + v[1:]) / 2).astype(np.float32)
    up = np.nextafter(mids, np.float32(np.inf))
    down = np.nextafter(mids, np.float32(0))
    x = np.concatenate([v.astype(np.float32), mids, up, down])
    if fmt.signed:
        x = np.concatenate([x, -x])
    return x


def _register_format_cases() -> None:
    from fp4sim.formats import spec

    roundings = [r for r in spec.Rounding if r is not spec.Rounding.STOCHASTIC]
    for fmt in spec.ALL_FORMATS:
        slug = _case_slug(fmt)

        def all_codes(fmt=fmt) -> dict[str, np.ndarray]:
            from fp4sim.formats import all_codes as _all_codes, decode

            codes = np.asarray(_all_codes(fmt), dtype=np.uint8)
            return {"codes": codes, "values": np.asarray(decode(codes, fmt), dtype=np.float32)}

        register(f"formats.{slug}.all_codes",
                 description=f"every valid {fmt} code and its float32 value (decode)",
                 format=fmt.name)(all_codes)

        def ties(fmt=fmt) -> dict[str, np.ndarray]:
            from fp4sim.formats import Policy, encode

            x = _tie_inputs(fmt)
            out = {"inputs": x}
            for r in roundings:
                out[f"codes_{r.value}"] = np.asarray(encode(x, fmt, Policy(rounding=r)), dtype=np.uint8)
            return out

        register(f"formats.{slug}.ties",
                 description=f"{fmt}: every value, tie midpoint and its float32 neighbours, encoded "
                             "under each deterministic rounding (saturating)",
                 format=fmt.name, roundings=[r.value for r in roundings])(ties)

        def specials(fmt=fmt) -> dict[str, np.ndarray]:
            from fp4sim.formats import NanPolicy, Overflow, Policy, encode

            big = np.float32(min(4 * fmt.max, float.fromhex("0x1.8p127")))  # beyond max, finite in float32
            tiny = np.float32(fmt.min_subnormal) / np.float32(4)
            pos = np.array([0.0, tiny, np.float32(2.0 ** -130), fmt.max, big, np.float32(3e38), np.inf],
                           dtype=np.float32)
            x = np.concatenate([pos, -pos]) if fmt.signed else pos
            out = {"inputs": x}
            overflows = [Overflow.SATURATE] + ([Overflow.NAN] if fmt.has_nan else []) + \
                        ([Overflow.INF] if fmt.has_inf else [])
            for o in overflows:
                out[f"codes_overflow_{o.value}"] = np.asarray(encode(x, fmt, Policy(overflow=o)), np.uint8)
            nan_in = np.array([np.nan], dtype=np.float32)
            nan_policies = ([NanPolicy.PROPAGATE] if fmt.has_nan else []) + [NanPolicy.ZERO, NanPolicy.MAX]
            for n in nan_policies:
                out[f"nan_code_{n.value}"] = np.asarray(encode(nan_in, fmt, Policy(nan=n)), np.uint8)
            return out

        register(f"formats.{slug}.specials",
                 description=f"{fmt}: zeros, tiny, float32-subnormal, max, beyond max and infinite "
                             "inputs under each overflow policy; NaN under each NaN policy",
                 format=fmt.name)(specials)

    @register("formats.e2m1.stochastic",
              description="E2M1 stochastic rounding of 64 inputs with fixed uint32 random bits",
              format="E2M1", seed=20261129)
    def e2m1_stochastic() -> dict[str, np.ndarray]:
        from fp4sim.formats import E2M1, Policy, Rounding, encode

        rng = np.random.default_rng(20261129)
        x = rng.uniform(-7, 7, size=64).astype(np.float32)
        bits = rng.integers(0, 2 ** 32, size=64, dtype=np.uint32)
        codes = encode(x, E2M1, Policy(rounding=Rounding.STOCHASTIC), random_bits=bits)
        return {"inputs": x, "random_bits": bits, "codes": np.asarray(codes, dtype=np.uint8)}


_register_format_cases()


def _block_inputs(seed: int) -> np.ndarray:
    """8 rows × 64 float32 (two 32-blocks per row) with the cases where scale rules disagree.

    Rows: Gaussian; Gaussian × 1e3; amax 500 (E4M3 floor clips); amax 7 (E2M1 floor clips); all zero;
    float32 subnormals (1e-40) with one 2^-130; amax exactly a power of two; amax 1.75·2^k and
    1.5·2^k, the floor rule's clipping edges.
    """
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((8, 64)).astype(np.float32)
    x[1] *= np.float32(1e3)
    x[2, :32] = x[2, :32] / np.abs(x[2, :32]).max() * np.float32(500.0)
    x[3, :32] = x[3, :32] / np.abs(x[3, :32]).max() * np.float32(7.0)
    x[4, :32] = 0.0
    x[4, 32:] = -0.0
    x[5, :32] = np.float32(1e-40) * np.sign(x[5, :32])
    x[5, 32] = np.float32(2.0 ** -130)
    x[6, :32] = x[6, :32] / np.abs(x[6, :32]).max() * np.float32(4.0)
    x[7, :32] = x[7, :32] / np.abs(x[7, :32]).max() * np.float32(1.75 * 64)
    x[7, 32:] = x[7, 32:] / np.abs(x[7, 32:]).max() * np.float32(1.5 * 64)
    return x


def _quantized_arrays(q: Any) -> dict[str, np.ndarray]:
    from fp4sim.formats.blocks import dequantize

    out = {"codes": np.asarray(q.codes, dtype=np.uint8),
           "dequantized": np.asarray(dequantize(q), dtype=np.float32)}
    if q.scales is not None:
        out["scales"] = np.asarray(q.scales, dtype=np.uint8)
    if q.global_scale is not None:
        out["global_scale"] = np.asarray(q.global_scale, dtype=np.float32)
    return out


_BLOCK_SEED = 31


def _register_block_cases() -> None:
    from fp4sim.formats import blocks

    pow2_rules = (blocks.ScaleRule.FLOOR, blocks.ScaleRule.RCEIL, blocks.ScaleRule.CEIL,
                  blocks.ScaleRule.EVEN)
    plan = [(blocks.MXFP8_E4M3, pow2_rules), (blocks.MXFP4, pow2_rules),
            (blocks.MXFP8_E5M2, (blocks.ScaleRule.RCEIL,)), (blocks.MXFP6_E2M3, (blocks.ScaleRule.RCEIL,)),
            (blocks.MXFP6_E3M2, (blocks.ScaleRule.RCEIL,))]
    for fmt_name, rules in [(f.name, r) for f, r in plan]:
        for rule in rules:
            def make(fmt_name=fmt_name, rule=rule) -> dict[str, np.ndarray]:
                from fp4sim.formats import blocks

                x = _block_inputs(_BLOCK_SEED)
                q = blocks.quantize(x, getattr(blocks, fmt_name), rule=rule)
                return {"x": x, **_quantized_arrays(q)}

            register(f"formats.{fmt_name.lower()}.{rule.name.lower()}",
                     description=f"{fmt_name} quantize along the last axis (blocks of 32) with the "
                                 f"{rule.name} UE8M0 scale rule: codes, scale codes, dequantized values",
                     block_format=fmt_name, rule=rule.name, seed=_BLOCK_SEED, shape=[8, 64])(make)

    for fmt_name in ("NVFP4", "NVFP4_SINGLE"):
        def make_nv(fmt_name=fmt_name) -> dict[str, np.ndarray]:
            from fp4sim.formats import blocks

            x = _block_inputs(_BLOCK_SEED)
            x[6, :16] = 0.0
            x[6, 0] = np.float32(2.9)  # §1.3: the E4M3 block scale rounds down and the max saturates
            return {"x": x, **_quantized_arrays(blocks.quantize(x, getattr(blocks, fmt_name)))}

        register(f"formats.{fmt_name.lower()}.default",
                 description=f"{fmt_name} quantize along the last axis (blocks of 16, UE4M3 scales"
                             f"{', FP32 per-tensor factor' if fmt_name == 'NVFP4' else ''}); row 6 holds "
                             "the amax-2.9 block of seed_algorithms §1.3",
                 block_format=fmt_name, seed=_BLOCK_SEED, shape=[8, 64])(make_nv)

    @register("formats.mxfp4.packed", description="MXFP4 (RCEIL) codes packed two per byte, the "
                                                 "even-indexed element in the low nibble",
              block_format="MXFP4", seed=_BLOCK_SEED, shape=[8, 64])
    def mxfp4_packed() -> dict[str, np.ndarray]:
        from fp4sim.formats import blocks

        x = _block_inputs(_BLOCK_SEED)
        q = blocks.quantize(x, blocks.MXFP4, pack=True)
        return {"x": x, "packed": np.asarray(q.codes, dtype=np.uint8),
                "scales": np.asarray(q.scales, dtype=np.uint8)}

    preset_names = ("OCP_MXFP4", "OCP_MXFP8_E4M3", "TORCHAO_MXFP4_FLOOR", "TORCHAO_MXFP8_E4M3_RCEIL",
                    "TORCHAO_NVFP4", "TORCHAO_NVFP4_SINGLE", "TE_MXFP8", "TE_NVFP4", "JAX_MXFP8",
                    "JAX_NVFP4")
    for name in preset_names:
        def preset_case(name=name) -> dict[str, np.ndarray]:
            from fp4sim.formats import blocks, presets

            fmt = presets.preset(name)
            constant = fmt.global_scale is blocks.GlobalScale.CONSTANT
            kw = {"global_scale": np.float32(1.0)} if constant else {}
            x = _block_inputs(_BLOCK_SEED)
            out = {"x": x, **_quantized_arrays(blocks.quantize(x, fmt, **kw))}
            special = _nonfinite_inputs()
            qs = blocks.quantize(special, fmt, **kw)
            out["special_x"] = special
            out["special_codes"] = np.asarray(qs.codes, dtype=np.uint8)
            if qs.scales is not None:
                out["special_scales"] = np.asarray(qs.scales, dtype=np.uint8)
            return out

        register(f"formats.presets.{name.lower()}",
                 description=f"the {name} preset (a library's quantizer reproduced bit for bit) on the "
                             "8x64 disagreement inputs, and on blocks holding NaN, +Inf, -Inf, -0",
                 preset=name, seed=_BLOCK_SEED, shape=[8, 64])(preset_case)


def _nonfinite_inputs() -> np.ndarray:
    """4 rows × 64: a NaN in block 0, +Inf, −Inf, and a block of −0 next to a finite block."""
    x = _block_inputs(_BLOCK_SEED)[:4].copy()
    x[0, 5] = np.nan
    x[1, 40] = np.inf
    x[2, 7] = -np.inf
    x[3, :32] = -0.0
    return x


_register_block_cases()


def _exp2_inputs() -> np.ndarray:
    """x on [-130, 2): a dense grid, every 1/64 step, the flush boundary and the specials."""
    grid = np.linspace(-130.0, 2.0, 2048, endpoint=False).astype(np.float32)
    steps = (np.arange(-64 * 3, 64, dtype=np.float32) / np.float32(64))
    edges = np.array([-126.0, np.nextafter(np.float32(-126.0), np.float32(0)), -126.5, -127.0, -127.5,
                      -0.0, 0.0, 1e-8, -1e-8, 1.0, -np.inf, np.nan], dtype=np.float32)
    return np.concatenate([grid, steps, edges])


def _register_attention_cases() -> None:
    points = int(_exp2_inputs().size)

    @register("attention.exp2.rn", description="fp4sim's correctly rounded float32 exp2 with "
                                              "flush-to-zero below 2^-126 (exp2_rn)", points=points)
    def exp2_rn_case() -> dict[str, np.ndarray]:
        from fp4sim.attention import exp2_rn

        x = _exp2_inputs()
        return {"x": x, "y": np.asarray(exp2_rn(x), dtype=np.float32)}

    @register("attention.exp2.fa4", description="FA4's degree-3 polynomial ex2 emulation "
                                               "(exp2_fa4), bit-exact incl. the FMAs", points=points)
    def exp2_fa4_case() -> dict[str, np.ndarray]:
        from fp4sim.attention import exp2_fa4

        x = _exp2_inputs()
        return {"x": x, "y": np.asarray(exp2_fa4(x), dtype=np.float32)}

    @register("attention.direct_p.payload_grid",
              description="E2M1 payload codes of the Direct-P converters (exact, affine 1.5/1.2, Mitchell "
                          "shifts 0 / 0.0576 / log2(1.25)-1/4) on 4096 x uniform on [-6, log2 6)",
              points=4096)
    def direct_p_grid() -> dict[str, np.ndarray]:
        from fp4sim.attention import MITCHELL_BOUNDARY_SHIFT, AffineP, ExactP, MitchellP, direct_p_payload

        x = np.linspace(-6.0, math.log2(6.0), 4096, endpoint=False).astype(np.float32)
        convs = {"exact": ExactP(), "affine": AffineP(), "mitchell_s0": MitchellP(shift=0.0),
                 "mitchell_zero_mean": MitchellP(shift=0.0576),
                 "mitchell_boundary": MitchellP(shift=MITCHELL_BOUNDARY_SHIFT)}
        return {"x": x, **{f"codes_{n}": np.asarray(direct_p_payload(c, x), dtype=np.uint8)
                           for n, c in convs.items()}}

    for preset in _attention_preset_names():
        def tile_case(preset=preset) -> dict[str, np.ndarray]:
            from fp4sim.attention import convert_tile

            t = _tile_scores()
            p = convert_tile(_attention_recipes()[preset], t, need_mismatched=True)
            out = {"t": t, "codes": np.asarray(p.codes), "values": np.asarray(p.values, dtype=np.float32)}
            for key in ("scales", "exps", "mismatched", "k"):
                val = getattr(p, key)
                if val is not None:
                    val = np.asarray(val)
                    out[key] = val.astype(np.int32) if val.dtype.kind == "i" else val
            return out

        register(f"attention.{preset}.p_tile",
                 description=f"P of one 8x128 key tile of log2-domain scores under the {preset} recipe "
                             "(convert_tile): codes, block scales/exponents, MMA values, mismatched sums",
                 preset=preset, seed=_TILE_SEED, shape=[8, 128])(tile_case)

        def forward_case(preset=preset) -> dict[str, np.ndarray]:
            from fp4sim.attention import attention_forward

            q, k, v = _qkv(_FWD_SEED)
            res = attention_forward(q, k, v, _attention_recipes()[preset], return_intermediates=True)
            it = res.intermediates
            out = {"q": q, "k": k, "v": v, "o": np.asarray(res.out, dtype=np.float32),
                   "lse": np.asarray(res.lse, dtype=np.float32),
                   "anchors": np.asarray(it.anchors, dtype=np.float32), "p_codes": np.asarray(it.p_codes),
                   "numerator": np.asarray(it.numerator, dtype=np.float32),
                   "normalizer": np.asarray(it.normalizer, dtype=np.float32)}
            if it.p_scales is not None:
                out["p_scales"] = np.asarray(it.p_scales)
            if it.p_k is not None:
                out["p_k"] = np.asarray(it.p_k).astype(np.int32)
            return out

        register(f"attention.{preset}.forward",
                 description=f"tiled forward of the {preset} recipe on Gaussian q (1,32,32), k/v "
                             "(1,256,32) (two key tiles), "
                             "non-causal, default softmax scale: O, LSE, tile anchors, P codes/scales, "
                             "numerator and normalizer (bitwise; a kernel's O may differ by its "
                             "accumulation order)",
                 preset=preset, seed=_FWD_SEED, q_shape=[1, 32, 32], kv_shape=[1, 256, 32])(forward_case)

    for preset in _training_preset_names():
        def training_case(preset=preset) -> dict[str, np.ndarray]:
            from fp4sim.attention import TRAINING_PRESETS, training_backward, training_forward

            rng = np.random.default_rng(_TRAIN_SEED)
            q, k, v, d_out = (rng.standard_normal((1, 64, 32)).astype(np.float32) for _ in range(4))
            recipe = TRAINING_PRESETS[preset]
            out, saved = training_forward(q, k, v, recipe, causal=True)
            trace = training_backward(saved, d_out, recipe)
            arrays = {"q": q, "k": k, "v": v, "d_out": d_out, "o": out, "lse": saved.lse,
                      "dq": trace.grads.dq, "dk": trace.grads.dk, "dv": trace.grads.dv,
                      "delta": trace.delta, "ds": trace.ds, "ds_q": trace.ds_q, "p": trace.rebuilt.p}
            result = {key: np.asarray(a, dtype=np.float32) for key, a in arrays.items()}
            result["p_codes"] = np.asarray(trace.rebuilt.codes)  # the rebuilt P codes (= the forward's)
            if trace.rebuilt.scales is not None:
                result["p_scales"] = np.asarray(trace.rebuilt.scales)
            return result

        register(f"attention.training.{preset}",
                 description=f"causal training step of the {preset} training recipe on Gaussian q, k, v, dO "
                             "(1, 64, 32): O, LSE, rebuilt P (normalized, codes, scales), D = rowsum(dO∘O), dS "
                             "and its quantized copy, dQ, dK, dV",
                 preset=preset, seed=_TRAIN_SEED, shape=[1, 64, 32], causal=True)(training_case)


_TILE_SEED = 7
_TRAIN_SEED = 13


def _training_preset_names() -> list[str]:
    from fp4sim.attention import TRAINING_PRESETS

    return sorted(TRAINING_PRESETS)
_FWD_SEED = 11


def _attention_recipes() -> dict[str, Any]:
    """The named attention recipes (the published routes) of :mod:`fp4sim.attention`."""
    from fp4sim.attention import PRESETS

    return PRESETS


def _attention_preset_names() -> list[str]:
    return sorted(_attention_recipes())


def _tile_scores() -> np.ndarray:
    """8 rows × 128 keys of log2-domain scores t = u − max u (row 7 partly masked with −inf)."""
    rng = np.random.default_rng(_TILE_SEED)
    u = (rng.standard_normal((8, 128)) * np.linspace(0.5, 6.0, 8)[:, None]).astype(np.float32)
    t = (u - u.max(axis=-1, keepdims=True)).astype(np.float32)
    t[7, 40:] = -np.inf
    return t


def _qkv(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, 32, 32)).astype(np.float32)
    k = rng.standard_normal((1, 256, 32)).astype(np.float32)
    v = rng.standard_normal((1, 256, 32)).astype(np.float32)
    return q, k, v


_register_attention_cases()


def _register_storage_cases() -> None:
    from fp4sim.formats import spec

    for fmt in (spec.E2M1, spec.E2M3, spec.E3M2):
        def pack_case(fmt=fmt) -> dict[str, np.ndarray]:
            from fp4sim.formats import NibbleOrder, all_codes, pack

            codes = np.resize(all_codes(fmt), (4, 64)).astype(np.uint8)
            codes[1] = codes[1][::-1]
            out = {"codes": codes}
            orders = list(NibbleOrder) if fmt is spec.E2M1 else [NibbleOrder.INTERLEAVED]
            for order in orders:
                out[f"packed_{order.name.lower()}"] = np.asarray(pack(codes, fmt, order=order), np.uint8)
            return out

        register(f"formats.{_case_slug(fmt)}.packing",
                 description=f"{fmt} codes (4 x 64, every code) packed along the last axis: "
                             + ("each NibbleOrder (INTERLEAVED = even element in the low nibble)"
                                if fmt is spec.E2M1 else "4 codes in 3 bytes, little-endian bit stream"),
                 format=fmt.name, shape=[4, 64])(pack_case)

    @register("formats.layouts.scales", description="a 200 x 7 uint8 scale matrix in each ScaleLayout "
                                                    "(128x4 swizzle, Mosaic TMEM view, 8x4 swizzle), "
                                                    "zero-padded", shape=[200, 7])
    def layouts_case() -> dict[str, np.ndarray]:
        from fp4sim.formats import ScaleLayout, to_layout

        scales = (np.arange(200 * 7, dtype=np.int64) * 37 % 251 + 1).astype(np.uint8).reshape(200, 7)
        out = {"scales": scales}
        for layout in ScaleLayout:
            if layout is not ScaleLayout.PLAIN:
                out[layout.name.lower()] = np.asarray(to_layout(scales, layout), dtype=np.uint8)
        return out


_register_storage_cases()


def _register_matmul_cases() -> None:
    for fmt_name in ("MXFP8_E4M3", "MXFP4", "NVFP4_SINGLE"):
        def matmul_case(fmt_name=fmt_name) -> dict[str, np.ndarray]:
            from fp4sim.formats import blocks, matmul

            rng = np.random.default_rng(_MATMUL_SEED)
            a = rng.standard_normal((16, 128)).astype(np.float32)
            b = rng.standard_normal((8, 128)).astype(np.float32)
            fmt = getattr(blocks, fmt_name)
            qa, qb = blocks.quantize(a, fmt), blocks.quantize(b, fmt)
            out = {"a": a, "b": b,
                   "a_codes": np.asarray(qa.codes, np.uint8), "a_scales": np.asarray(qa.scales, np.uint8),
                   "b_codes": np.asarray(qb.codes, np.uint8), "b_scales": np.asarray(qb.scales, np.uint8)}
            for acc in matmul.Accumulation:
                if acc is matmul.Accumulation.HOPPER_FP8 and fmt.elem.nbits != 8:
                    continue  # the wgmma FP8 accumulator model applies to 8-bit operands only
                out[f"out_{acc.name.lower()}"] = np.asarray(matmul.scaled_matmul(qa, qb, accumulation=acc),
                                                            dtype=np.float32)
            return out

        register(f"formats.matmul.{fmt_name.lower()}",
                 description=f"scaled_matmul of {fmt_name}-quantized a (16x128) and b (8x128), both blocked "
                             "along K, under each accumulation model (EXACT, FLOAT32, HOPPER_FP8 for 8-bit)",
                 block_format=fmt_name, seed=_MATMUL_SEED, a_shape=[16, 128], b_shape=[8, 128])(matmul_case)


_MATMUL_SEED = 17
_register_matmul_cases()

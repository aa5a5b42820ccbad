"""``python -m fp4sim golden {write, check, list}``: the command line of :mod:`fp4sim.golden`.

``check`` reads the set shipped with the package (:data:`fp4sim.golden.store.DATA_DIR`) unless
``--dir`` names another; ``write`` writes into ``--out`` (default ``./golden`` in the working
directory), never into the installed package: regenerate the shipped set from a source checkout
with ``python -m fp4sim golden write --out fp4sim/golden/data``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fp4sim.golden.store import CASES, DATA_DIR, GoldenMismatch, check, display_dir, write

__all__ = ["add_arguments", "run", "DEFAULT_WRITE_DIR"]

DEFAULT_WRITE_DIR = Path("golden")
"""Where ``golden write`` puts the files without ``--out``: ``./golden`` in the working directory."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    w = sub.add_parser(
        "write",
        help="generate the cases and write .npz files plus manifest.json",
        description="Generate every golden case (or those named) and write "
        "<name>.npz plus manifest.json into --out.",
    )
    w.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_WRITE_DIR,
        metavar="DIR",
        help="output folder (default: ./golden in the working directory; the set "
        "shipped with fp4sim is regenerated with --out fp4sim/golden/data)",
    )
    c = sub.add_parser(
        "check",
        help="regenerate the cases and compare them bitwise with the stored files",
        description="Regenerate every golden case (or those named) and compare bit for "
        "bit with the files in --dir; exit 1 naming each failing case.",
    )
    c.add_argument(
        "--dir",
        "--out",
        dest="out",
        type=Path,
        default=DATA_DIR,
        metavar="DIR",
        help="folder holding manifest.json (default: the set shipped with fp4sim, "
        f"{display_dir(DATA_DIR)})",
    )
    ls = sub.add_parser(
        "list", help="list the registered cases", description="List the registered cases."
    )
    for p in (w, c):
        p.add_argument(
            "--case",
            dest="names",
            action="append",
            metavar="NAME",
            help="only this case (repeatable); default: all",
        )
        p.add_argument(
            "--no-progress", dest="progress", action="store_false", help="no progress bar"
        )
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
            print(
                f"wrote {n} golden case(s) to {args.out}; the manifest lists {len(manifest['cases'])}"
            )
            return 0
        n = check(args.out, args.names, progress=args.progress)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except GoldenMismatch as e:
        print(str(e), file=sys.stderr)
        return 1
    print(f"golden check: {n} cases bit-identical in {display_dir(args.out)}")
    return 0

"""``python -m fp4sim bench SUITE``: dispatch to the benchmark suites in :mod:`fp4sim.benchmarks`.

Every suite measures side by side in one run and reports ratios; absolute times are printed for
the record but only GPU ones are claims. Each suite module exposes ``add_arguments(parser)`` and
``run(args) -> int``; :data:`SUITES` lists them with their one-line help.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util

__all__ = ["SUITES", "add_arguments", "run"]

SUITES: dict[str, str] = {
    "formats": "element encode/decode on this CPU: NumPy and jitted JAX vs an ml_dtypes cast",
    "microscaling": "MXFP8/MXFP4/NVFP4 quantize on this CPU vs the fastest other CPU quantizer",
    "attention": "jitted forward emulator vs a float32 jnp attention of the same shape",
    "training": "emulated forward+backward vs float32 jnp attention under jax.grad",
    "gpu": "H200: build, check bitwise against the emulator and time every Pallas kernel",
    "mmasim": "jitted tcgen05 model vs MMA-Sim (side environment) on one 256^3 problem, this CPU",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="suite", metavar="SUITE", required=True)
    for name, help_text in SUITES.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        # Import each suite when building the parser so its own options show in --help; a suite
        # whose module is absent from this build is reported when chosen, never at start-up.
        module_name = f"fp4sim.benchmarks.{name}"
        if importlib.util.find_spec(module_name) is None:
            p.set_defaults(_suite=None, _missing=module_name)
            continue
        module = importlib.import_module(module_name)
        module.add_arguments(p)
        p.set_defaults(_suite=module)


def run(args: argparse.Namespace) -> int:
    if args._suite is None:
        raise SystemExit(f"bench {args.suite}: module {args._missing} is not part of this build")
    return int(args._suite.run(args) or 0)

"""``python -m fp4sim bench SUITE``: dispatch to the benchmark suites in :mod:`fp4sim.benchmarks`.

Every suite measures side by side in one run and reports ratios (DESIGN.md §5); absolute times
are printed for the record but only GPU ones are claims. Each suite module exposes
``add_arguments(parser)`` and ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib

SUITES: dict[str, str] = {
    "formats": "element encode/decode on this CPU: NumPy and jitted JAX vs an ml_dtypes cast",
    "microscaling": "MXFP8/MXFP4/NVFP4 quantize on this CPU vs the fastest other CPU quantizer",
    "attention": "jitted forward emulator vs a float32 jnp attention of the same shape",
    "training": "emulated forward+backward vs float32 jnp attention under jax.grad",
    "gpu": "H200: build, check bitwise against the emulator and time every Pallas kernel",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="suite", metavar="SUITE", required=True)
    for name, help_text in SUITES.items():
        module = importlib.import_module(f"fp4sim.benchmarks.{name}")
        p = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(p)
        p.set_defaults(_suite=module)


def run(args: argparse.Namespace) -> int:
    return int(args._suite.run(args) or 0)

"""Command line: ``python -m fp4sim {reproduce, golden, figures, bench, train, validate}``,
``--version``.

Argument parsing only. Each subcommand's work lives in the module named in ``_COMMANDS``; that
module exposes ``add_arguments(parser)`` and ``run(args) -> int`` and is imported only when its
subcommand is named, so the top-level ``--help`` and ``--version`` import neither NumPy nor jax
(``tests/test_cli.py`` checks it) and no subcommand loads a GPU backend or matplotlib before it
runs.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

# subcommand -> (module, one-line help)
_COMMANDS: dict[str, tuple[str, str]] = {
    "reproduce": (
        "fp4sim.report.cli",
        "recompute the published tables on the emulator; write a Markdown report and figures",
    ),
    "golden": (
        "fp4sim.golden.cli",
        "write or check the golden vectors (check: the set shipped with fp4sim)",
    ),
    "figures": ("fp4sim.report.figures", "regenerate every figure (into ./figures or --out)"),
    "bench": (
        "fp4sim.benchmarks.cli",
        "benchmarks: formats, microscaling, attention, training (CPU) and gpu (H200)",
    ),
    "train": (
        "fp4sim.train.cli",
        "training study: a small transformer trained with emulated low-precision attention",
    ),
    "validate": (
        "fp4sim.validate",
        "run every kernel this GPU supports against the emulator; verdict table + JSON",
    ),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only ``command``'s module is imported (every one when ``command`` is ``"*"``).

    With ``command=None`` (top-level ``--help``, ``--version``, no command) nothing beyond the
    standard library is imported.
    """
    from fp4sim import __version__

    parser = argparse.ArgumentParser(
        prog="python -m fp4sim",
        description="fp4sim: bit-exact FP4/FP8 microscaled attention emulation and GPU kernels.",
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"fp4sim {__version__}",
        help="print fp4sim's version and exit",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in _COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if command not in (name, "*"):
            p.set_defaults(_module=None, _missing=None)
            continue
        if importlib.util.find_spec(module_name) is None:
            p.set_defaults(_module=None, _missing=module_name)
            continue
        module = importlib.import_module(module_name)
        module.add_arguments(p)
        p.set_defaults(_module=module)
    return parser


def _command(argv: list[str]) -> str | None:
    """The subcommand named in ``argv`` (its first word that is not an option), if any."""
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(_command(argv))
    args = parser.parse_args(argv)
    if args._module is None:
        parser.error(f"{args.command}: module {args._missing} is not part of this build")
    return int(args._module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

"""``python -m fp4sim reproduce``: the command line of :func:`fp4sim.report.document.reproduce`."""

from __future__ import annotations

import argparse
from pathlib import Path

from fp4sim.report.document import reproduce
from fp4sim.report.sections import SECTIONS
from fp4sim.report.sizes import SIZES

__all__ = ["add_arguments", "run"]


# --- CLI -------------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    size = parser.add_mutually_exclusive_group()
    size.add_argument(
        "--quick",
        dest="size",
        action="store_const",
        const="quick",
        help="small sizes (under a minute; what CI runs)",
    )
    size.add_argument(
        "--full",
        dest="size",
        action="store_const",
        const="full",
        help="longer sequences (to 4096), more blocks and leak tokens (slow); the "
        "default sizes (make demo, a few minutes) already use the published "
        "8,000,000-point code-match grid",
    )
    parser.set_defaults(size="default")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="output folder (default: a fresh fp4sim-report-YYYYmmdd-HHMMSS/ here)",
    )
    parser.add_argument(
        "--section",
        dest="sections",
        action="append",
        metavar="NAME",
        choices=list(SECTIONS),
        help=f"only this section (repeatable): {', '.join(SECTIONS)}",
    )
    parser.add_argument(
        "--no-figures", dest="figures", action="store_false", help="skip the figures"
    )
    parser.add_argument(
        "--no-progress", dest="progress", action="store_false", help="no progress bar"
    )
    parser.add_argument(
        "--devices",
        default="none",
        metavar="all|none|N",
        help="map the sweeps over this many local jax devices, one worker each "
        "(fp4sim.parallel; same numbers, bit for bit); default none: one by "
        "one with NumPy",
    )


def run(args: argparse.Namespace) -> int:
    from fp4sim.parallel import parse_devices, resolve_devices

    try:
        devices = resolve_devices(parse_devices(args.devices))
    except ValueError as e:
        raise SystemExit(f"fp4sim reproduce: {e}") from None
    report = reproduce(
        args.out,
        sizes=SIZES[args.size],
        sections=args.sections,
        figures=args.figures,
        progress=args.progress,
        devices=devices,
    )
    print(f"wrote {report}")
    return 0

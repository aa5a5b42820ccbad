"""``python -m fp4sim validate``: run every kernel this GPU supports against the emulator.

Detects the GPU (:func:`fp4sim.kernels.harness.device_arch`), runs the checks of
:mod:`fp4sim.kernels.checks` that its architecture supports (Hopper sm_90: the quantize
kernels, the FP8 ``wgmma`` probe, the FP8 and Direct-P attention kernels; Blackwell sm_100: the
quantize kernels, the block-scaled ``tcgen05`` matmul and the sm_100a attention bodies), each by
its contract (bitwise where the contract is bitwise, within the stated bound elsewhere), prints
a verdict table and writes the results as JSON (``--out``). Checks for another architecture are
listed as not run; those whose kernel has only been compiled, never run by fp4sim (the Blackwell
ones), say so. Exit status: 0 when every check passed (or there is no GPU:
it says so), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path
from typing import Any

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", metavar="F.json", help="also write the results as JSON here")
    parser.add_argument(
        "--only",
        action="append",
        metavar="CHECK",
        help="run only this check (repeatable; see --list)",
    )
    parser.add_argument(
        "--list",
        action="store_true",
        help="list every check and the architectures that run it, then exit",
    )
    parser.add_argument(
        "--time-budget-s",
        type=float,
        default=None,
        metavar="S",
        help="start no check after S seconds (those left are listed as not run)",
    )


def _write(path: str | None, info: dict[str, Any], quiet: bool = False) -> None:
    if path:
        Path(path).write_text(json.dumps(info, indent=1) + "\n")
        if not quiet:
            print(f"wrote {path}")


def _arch_text(c: Any) -> str:
    majors = "" if c.majors is None else f" (major {'/'.join(map(str, c.majors))})"
    return f"sm_{c.min_arch[0]}{c.min_arch[1]}+{majors}"


def run(args: argparse.Namespace) -> int:
    from fp4sim.kernels import checks
    from fp4sim.kernels.harness import device_arch

    if args.list:
        for c in checks.CHECKS:
            never = "  [only compiled, never run]" if c.compiled_only else ""
            print(f"{c.name:42} {_arch_text(c):22} {c.contract}{never}")
        return 0
    known = {c.name for c in checks.CHECKS}
    unknown = sorted(set(args.only or ()) - known)
    if unknown:
        print(f"error: --only {unknown} unknown; allowed: {sorted(known)}")
        return 2
    import jax

    arch = device_arch()
    info: dict[str, Any] = {
        "jax": jax.__version__,
        "host": platform.node(),
        "gpu": None,
        "arch": None,
        "results": [],
    }
    if arch is None:
        info["verdict"] = "no GPU"
        print(
            f"fp4sim validate: no GPU: jax {jax.__version__} sees no NVIDIA GPU here "
            f"(backend {jax.default_backend()}); nothing to validate. On a GPU these run:"
        )
        for c in checks.CHECKS:
            print(
                f"  {c.name:42} {_arch_text(c)}"
                + ("  (only compiled, never run)" if c.compiled_only else "")
            )
        _write(args.out, info)
        return 0
    dev = next((d for d in jax.devices() if d.platform == "gpu"), None)
    info.update(gpu=str(getattr(dev, "device_kind", dev)), arch=f"sm_{arch[0]}{arch[1]}")
    todo = checks.supported(arch)
    print(
        f"fp4sim validate: {info['gpu']} ({info['arch']}), jax {jax.__version__}: "
        f"{len(todo)} checks for this architecture",
        flush=True,
    )

    skipped = [c.name for c in checks.CHECKS if not c.runs_on(arch)]
    info["not_for_this_arch"] = skipped
    never_run = {c.name for c in checks.CHECKS if not c.runs_on(arch) and c.compiled_only}
    info["not_for_this_arch_compiled_only"] = sorted(never_run)
    done: list[Any] = []

    def show(r: Any) -> None:
        print(f"  {r.verdict.name:5} {r.name:42} {r.seconds:6.1f} s  {r.detail}", flush=True)
        done.append(r)
        info["results"] = [x.to_json() for x in done]
        _write(args.out, info, quiet=True)  # a run cut short still leaves what it found

    results = checks.run_checks(arch, args.only, progress=show, time_budget_s=args.time_budget_s)
    info["results"] = [r.to_json() for r in results]
    ran = {r.name for r in results}
    info["not_run_time_budget"] = [
        c.name for c in todo if c.name not in ran and (not args.only or c.name in args.only)
    ]
    counts = {v.name: sum(r.verdict is v for r in results) for v in checks.Verdict}
    info["verdict"] = "pass" if results and counts["PASS"] == len(results) else "fail"
    if info["verdict"] == "pass" and info["not_run_time_budget"]:
        info["verdict"] = "pass (incomplete: time budget)"
    print()
    print(f"{'check':42} {'kernel':44} {'contract':52} verdict")
    for r in results:
        print(f"{r.name:42} {r.kernel:44} {r.contract:52} {r.verdict.name}")
    for name in info["not_run_time_budget"]:
        print(f"{name:42} {'(not run: time budget)':44} {'':52} -")
    for name in skipped:
        why = f"(not for {info['arch']}" + (
            "; only compiled, never run)" if name in never_run else ")"
        )
        print(f"{name:42} {why:44} {'':52} -")
    print(
        f"\n{counts['PASS']} passed, {counts['FAIL']} failed, {counts['ERROR']} errors "
        f"on {info['gpu']} ({info['arch']})"
    )
    _write(args.out, info)
    return 0 if info["verdict"].startswith("pass") else 1

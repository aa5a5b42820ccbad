"""``python -m fp4sim bench gpu``: build, check bitwise against the emulator, and time GPU kernels.

One invocation measures the device ceilings first (:mod:`fp4sim.kernels.ceilings`: copy
bandwidth, bf16/fp8 matmul rates) and then runs the *sections*, each a module that registers
itself here by name:

==============  =================================  ==========================================
section         module                             what it runs
==============  =================================  ==========================================
``quant``       ``fp4sim.benchmarks.gpu_quant``     quantization kernels vs emulator and JAX
``attention``   ``fp4sim.benchmarks.gpu_attention`` attention kernels vs cuDNN / attention_mgpu
``backward``    ``fp4sim.benchmarks.gpu_backward``  attention backward vs cuDNN / attention_mgpu
==============  =================================  ==========================================

A section module exposes ``add_arguments(parser)`` (its own options, prefixed with the section
name, e.g. ``--quant-size``) and ``run_section(args, context) -> dict``. ``context`` is a
:class:`GpuContext` (the measured ceilings, the shared timers -- wall clock and CUPTI device
time, see :mod:`fp4sim.kernels.ceilings` -- and the time left). The returned dict
is written to the JSON output under the section's name (its optional ``"summary"`` lines are
printed after the table, last); its ``"rows"`` entry (a list of
:class:`Row`-shaped dicts: ``name``, ``ms``, ``rate``, ``ratio``, ``ratio_to``, ``check``) feeds the
short table printed last. A section module that is missing is skipped with a message; one that
raises is reported as failed and the others still run (the exit status is then 1).

``--only SECTION`` (repeatable) selects sections; ``--only ceilings`` measures just the ceilings.
``--out DIR`` receives ``gpu_bench.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

SECTIONS: dict[str, str] = {
    "quant": "fp4sim.benchmarks.gpu_quant",
    "attention": "fp4sim.benchmarks.gpu_attention",
    "backward": "fp4sim.benchmarks.gpu_backward",
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class GpuContext:
    """What every section gets: the ceilings measured in this run and the shared timer."""

    ceilings: dict[str, Any]
    time_call: Callable[..., float]  # wall clock, back-to-back calls
    device_time: Callable[..., float]  # CUPTI: the GPU time of the kernels one call launches
    deadline: float  # time.monotonic() after which sections should stop adding work

    @property
    def copy_bytes_per_s(self) -> float:
        """The copy ceiling timed by the wall clock (compare with ``time_call`` figures)."""
        return float(self.ceilings["copy"]["bytes_per_s"])

    @property
    def copy_device_bytes_per_s(self) -> float:
        """The copy ceiling timed on the device (compare with ``device_time`` figures)."""
        return float(self.ceilings["copy"]["device_bytes_per_s"])

    def seconds_left(self) -> float:
        return self.deadline - time.monotonic()


def row(
    name: str,
    *,
    ms: float | None = None,
    rate: str = "",
    ratio: float | None = None,
    ratio_to: str = "",
    check: str = "",
) -> dict[str, Any]:
    """One line of the summary table (a plain dict, so sections need not import anything)."""
    return {
        "name": name,
        "ms": ms,
        "rate": rate,
        "ratio": ratio,
        "ratio_to": ratio_to,
        "check": check,
    }


def _section_module(name: str):
    try:
        return importlib.import_module(SECTIONS[name])
    except ModuleNotFoundError as e:
        if e.name == SECTIONS[name]:
            return None
        raise


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--only",
        action="append",
        choices=sorted(SECTIONS) + ["ceilings"],
        help="run only this section (repeatable); 'ceilings' = just the ceilings",
    )
    parser.add_argument("--out", default=None, help="directory for gpu_bench.json")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=420.0,
        help="stop starting new measurements after this many seconds",
    )
    for name in SECTIONS:
        try:
            mod = _section_module(name)
        except Exception:  # a broken section must not break the CLI
            mod = None
        if mod is not None and hasattr(mod, "add_arguments"):
            mod.add_arguments(parser)


def _print_table(rows: list[dict[str, Any]]) -> None:
    head = f"{'kernel':44s} {'ms':>9s} {'rate':>14s} {'ratio':>7s} {'to':10s} check"
    print(head)
    print("-" * len(head))
    for r in rows:
        ms = f"{r['ms']:.4f}" if isinstance(r.get("ms"), (int, float)) else "-"
        ratio = f"{r['ratio']:.3f}" if isinstance(r.get("ratio"), (int, float)) else "-"
        print(
            f"{r['name'][:44]:44s} {ms:>9s} {r.get('rate', ''):>14s} {ratio:>7s} "
            f"{r.get('ratio_to', '')[:10]:10s} {r.get('check', '')}"
        )


def run(args: argparse.Namespace) -> int:
    from fp4sim.kernels import ceilings
    from fp4sim.kernels.harness import gpu_available

    if not gpu_available():
        print("bench gpu: jax sees no GPU here; nothing to time (run it on the H200).")
        return 1
    start = time.monotonic()
    only = args.only or sorted(SECTIONS)
    results: dict[str, Any] = {"argv": sys.argv, "started_unix": time.time()}
    status = 0
    ceil = ceilings.measure_all()
    results["ceilings"] = ceil
    rows = [
        row(
            "ceiling: copy (x^1, uint32, 1 GiB)",
            ms=1e3 * ceil["copy"]["device_seconds"],
            rate=f"{ceil['copy']['device_bytes_per_s'] / 1e12:.2f} TB/s",
            check=f"wall clock {ceil['copy']['bytes_per_s'] / 1e12:.2f} TB/s",
        ),
        row(
            "ceiling: matmul bf16 8192^3",
            ms=1e3 * ceil["matmul_bf16"]["seconds"],
            rate=f"{ceil['matmul_bf16']['flop_per_s'] / 1e12:.0f} TFLOP/s",
        ),
        row(
            "ceiling: matmul fp8 e4m3 8192^3",
            ms=1e3 * ceil["matmul_fp8"]["seconds"],
            rate=f"{ceil['matmul_fp8']['flop_per_s'] / 1e12:.0f} TFLOP/s",
        ),
    ]
    ctx = GpuContext(
        ceilings=ceil,
        time_call=ceilings.time_call,
        device_time=ceilings.device_time,
        deadline=start + float(args.budget_s),
    )
    for name in only:
        if name == "ceilings":
            continue
        mod = _section_module(name)
        if mod is None:
            msg = f"section {name!r}: module {SECTIONS[name]} does not exist yet; skipped"
            print(msg)
            results[name] = {"skipped": msg}
            continue
        print(f"--- section {name}", flush=True)
        try:
            res = mod.run_section(args, ctx)
        except Exception as e:  # report, keep going with the other sections
            traceback.print_exc()
            res = {"failed": f"{type(e).__name__}: {e}"}
            rows.append(row(f"{name}: FAILED", check=f"{type(e).__name__}"))
            status = 1
        results[name] = res
        rows.extend(res.get("rows", []))
    results["seconds"] = time.monotonic() - start
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, "gpu_bench.json")
        with open(path, "w") as f:
            json.dump(results, f, indent=1, default=str)
        print(f"wrote {path}")
    _print_table(rows)
    for name in only:  # a section's own closing lines (e.g. attention's per-shape ratios) last
        res = results.get(name)
        if isinstance(res, dict):
            for line in res.get("summary", []):
                print(line)
    return status

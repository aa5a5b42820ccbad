"""``python -m fp4sim train``: the training study from the command line.

Argument parsing only (no jax work, no optax or matplotlib import at parse time); the work is
:func:`fp4sim.train.study.run_study` and :func:`fp4sim.train.report.regenerate`.

* ``--study``: the default comparison (:data:`fp4sim.train.recipes.DEFAULT_STUDY`); with
  ``--recipe NAME`` (repeatable) just those recipes (``jnp_float32``, the reference, is always
  trained too). ``--recipe`` without ``--study`` is the same.
* ``--replot RECORD``: figure and table again from a ``train_study.json``.
* ``--list``: the recipes and what each tests.

Sizes come from ``--size`` (:data:`fp4sim.train.config.SIZES`); any field can be overridden.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

__all__ = ["add_arguments", "run"]

_DETERMINISTIC_FLAG = "--xla_gpu_deterministic_ops=true"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--study", action="store_true",
                      help="run the comparison: the default recipes (see --list), or those "
                           "given by --recipe")
    parser.add_argument("--recipe", action="append", metavar="NAME",
                        help="a recipe of the study (repeatable; jnp_float32 always runs)")
    what.add_argument("--replot", metavar="RECORD",
                      help="regenerate figure and table from a train_study.json")
    what.add_argument("--list", action="store_true", help="list the recipes and exit")
    parser.add_argument("--size", default=None,
                        help="named size: smoke, cpu, h200 (default: h200 with --device gpu, "
                             "else cpu)")
    parser.add_argument("--device", choices=("cpu", "gpu"), default=None,
                        help="jax platform (default: the size's)")
    parser.add_argument("--steps", type=int, default=None, help="most steps per recipe")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="seeds, e.g. 0 1 2")
    parser.add_argument("--time-budget-s", type=float, default=None,
                        help="wall-clock limit of the whole run from the process's start, "
                             "compilation included (0: none; default: the size's)")
    parser.add_argument("--accumulation", choices=("backend", "sequential"), default="backend",
                        help="the emulated backward's float32 products: backend (XLA dot) or "
                             "sequential (bit-exact ordered sums); default backend")
    parser.add_argument("--layers", type=int, default=None, help="transformer layers (default: the size's)")
    parser.add_argument("--width", type=int, default=None, help="model width (default: the size's)")
    parser.add_argument("--heads", type=int, default=None,
                        help="attention heads; width / heads is the head dimension (default: the size's)")
    parser.add_argument("--context", type=int, default=None,
                        help="tokens per sequence (default: the size's)")
    parser.add_argument("--batch", type=int, default=None, help="sequences per seed and step")
    parser.add_argument("--chunk", type=int, default=None,
                        help="steps per dispatch (one lax.scan, one host synchronization)")
    parser.add_argument("--lr", type=float, default=None, help="peak learning rate")
    parser.add_argument("--loss-scale", type=float, default=None,
                        help="power-of-two loss scale (default 4096; 1 = none: the emulated "
                             "backward's unscaled E5M2 dO then underflows)")
    parser.add_argument("--out", default="train-out", help="output folder (default train-out)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--workers", type=int, default=None,
                        help="compilation threads (default and at most: the CPU count)")
    parser.add_argument("--compile-share", type=float, default=None,
                        help="share of the time budget the compilations may take before the "
                             "unfinished ones are skipped (default 0.7; 0: wait for all)")
    parser.add_argument("--no-trace-processes", action="store_true",
                        help="trace the emulated recipes in this process, one at a time "
                             "(default: in parallel worker processes, compiled here)")
    parser.add_argument("--no-cache", action="store_true",
                        help="no persistent compilation cache (default: OUT/jax_cache)")
    parser.add_argument("--determinism-recipe", default=None, metavar="NAME",
                        help="the recipe whose first chunk is rerun bit for bit (default: the "
                             "first emulated one)")
    parser.add_argument("--no-deterministic", action="store_true",
                        help=f"on a GPU, do not add {_DETERMINISTIC_FLAG} to XLA_FLAGS")


def _config(args: argparse.Namespace):
    import dataclasses

    from fp4sim.attention.backward import BackwardAccumulation
    from fp4sim.train.config import Device, size

    name = args.size or ("h200" if args.device == "gpu" else "cpu")
    cfg = size(name)
    model = {k: getattr(args, k) for k in ("layers", "width", "heads", "context")
             if getattr(args, k) is not None}
    if model:
        cfg = cfg.replace(model=dataclasses.replace(cfg.model, **model))
    if args.lr is not None:
        cfg = cfg.replace(optim=dataclasses.replace(cfg.optim, lr=args.lr))
    if args.loss_scale is not None:
        cfg = cfg.replace(optim=dataclasses.replace(cfg.optim, loss_scale=args.loss_scale))
    changes: dict = {"accumulation": BackwardAccumulation[args.accumulation.upper()]}
    if args.device is not None:
        changes["device"] = Device(args.device)
    for k in ("batch", "chunk", "steps"):
        if getattr(args, k) is not None:
            changes[k] = getattr(args, k)
    if args.seeds is not None:
        changes["seeds"] = tuple(args.seeds)
    if args.time_budget_s is not None:
        changes["time_budget_s"] = None if args.time_budget_s == 0 else args.time_budget_s
    chunk = changes.get("chunk", cfg.chunk)
    steps = changes.get("steps", cfg.steps)
    if steps % chunk:  # round the step limit up to whole chunks
        changes["steps"] = steps + chunk - steps % chunk
    return cfg.replace(**changes)


def _process_age() -> float:
    """Seconds since this process started (Linux ``/proc``; 0 where unavailable), so that the
    time budget also covers the interpreter's start and the imports."""
    try:
        with open("/proc/self/stat") as f:
            start = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        with open("/proc/uptime") as f:
            up = float(f.read().split()[0])
        return max(0.0, up - start / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


def run(args: argparse.Namespace) -> int:
    t0 = time.monotonic() - _process_age()  # the budget counts from the process's start
    from fp4sim.train import recipes as R

    if args.list:
        for n, r in R.STUDY_RECIPES.items():
            mark = "*" if n in R.DEFAULT_STUDY else " "
            print(f"{mark} {n:45s} {r.label}\n  {'':45s} tests: {r.tests}")
        print("\n* = in --study")
        return 0
    if args.replot:
        from fp4sim.train.report import regenerate

        try:
            fig, table = regenerate(args.replot, args.out if args.out != "train-out" else None)
        except (OSError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(table.read_text())
        print(f"wrote {table}" + (f" and {fig}" if fig else " (no matplotlib: no figure)"))
        return 0
    if not (args.study or args.recipe):
        print("error: one of --study, --recipe NAME, --replot RECORD or --list is required",
              file=sys.stderr)
        return 2
    try:
        cfg = _config(args)
        names = list(args.recipe) if args.recipe else list(R.DEFAULT_STUDY)
        for n in names + ([args.determinism_recipe] if args.determinism_recipe else []):
            R.study_recipe(n)
    except (ValueError, TypeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if cfg.device.value == "gpu" and not args.no_deterministic:
        flags = os.environ.get("XLA_FLAGS", "")
        if "xla_gpu_deterministic_ops" not in flags:  # read when the GPU backend starts
            os.environ["XLA_FLAGS"] = (flags + " " + _DETERMINISTIC_FLAG).strip()
    from fp4sim.train.report import TABLE_NAME
    from fp4sim.train.study import RECORD_NAME, run_study

    try:
        record = run_study(cfg, names, args.out, progress=not args.no_progress, t0=t0,
                           cache=not args.no_cache, workers=args.workers,
                           determinism_recipe=args.determinism_recipe,
                           compile_share=args.compile_share,
                           trace_processes=not args.no_trace_processes)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from pathlib import Path

    print(Path(args.out, TABLE_NAME).read_text())
    print(_summary(record))
    print(f"wrote {Path(args.out) / RECORD_NAME} ({record['status']}, {record['wall_s']:.0f} s)"
          + ("" if Path(args.out, "train_loss.png").exists() else
             "; no figure (matplotlib missing): python -m fp4sim train --replot RECORD"))
    if record["timing"].get("compile", {}).get("unfinished"):
        # compile threads still inside XLA: leave without the interpreter's shutdown, which
        # would wait for them; everything is written
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def _summary(record: dict) -> str:
    """Compile times and steps/s per recipe, as printed at the end of a run."""
    t = record["timing"]
    comp = t.get("compile", {})
    lines = [f"compile: {comp.get('wall_s', float('nan')):.1f} s wall with "
             f"{comp.get('workers')} threads (persistent cache entries "
             f"{comp.get('cache_entries_before')} -> {comp.get('cache_entries_after')})"]
    for n, s in comp.get("per_recipe", {}).items():
        how = "traced (worker)" if "export_s" in s and "export_error" not in s else "trace+lower"
        lines.append(f"  {n:45s} {how} {s.get('trace_lower_s', float('nan')):6.1f} s  "
                     f"XLA {s.get('xla_compile_s', float('nan')):6.1f} s  done at "
                     f"{s.get('done_at_s', float('nan')):6.1f} s")
    lines.append("training (all seeds per step):")
    for n, v in t.get("step_s", {}).items():
        ratio = t.get("ratio_to_jnp_float32", {}).get(n)
        lines.append(f"  {n:45s} {1.0 / v:8.2f} steps/s  {1e3 * v:8.2f} ms/step"
                     + (f"  {ratio:.2f}x jnp_float32" if ratio is not None else ""))
    b = record.get("budget", {})
    lines.append(f"steps per recipe: {b.get('steps')} (planned {b.get('planned_steps')}; "
                 f"budget {b.get('time_budget_s')} s, wall {record.get('wall_s')} s)")
    return "\n".join(lines)

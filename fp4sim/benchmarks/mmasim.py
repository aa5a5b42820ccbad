"""``python -m fp4sim bench mmasim``: the jitted tcgen05 model against MMA-Sim on one problem.

For each chosen kind, one M x N x K problem (default 256 x 256 x 256) is quantized by fp4sim
(MXFP8 E4M3 for ``mxf8f6f4``, MXFP4 for ``mxf4``, NVFP4 without its FP32 factor for ``nvfp4``),
then multiplied in this one run by

* fp4sim: ``scaled_matmul(a, b, accumulation=Accumulation.TCGEN05)`` under ``jax.jit`` (compiled
  first; the median of ``--repeats`` runs counts), and
* MMA-Sim (github.com/microsoft/MMA-Sim), the bit-accurate PyTorch reference model, running
  the same chain of ``tcgen05.mma`` instructions (M tiles of 128, N = the whole N, K steps of
  32 or 64) through ``fp4sim/benchmarks/mmasim_runner.py`` under the interpreter given by
  ``--python`` (a side environment with torch; MMA-Sim is not a dependency of fp4sim) and the
  checkout given by ``--mmasim`` (defaults: ``$FP4SIM_MMASIM_PYTHON``, ``$FP4SIM_MMASIM_SRC``).

It prints both times, the ratio (MMA-Sim time / fp4sim time) and whether the two results are
equal bit for bit. Without the side environment it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

_KINDS = ("mxf8f6f4", "mxf4", "nvfp4")
_RUNNER = Path(__file__).resolve().parent / "mmasim_runner.py"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--python",
        default=os.environ.get("FP4SIM_MMASIM_PYTHON"),
        help="interpreter of a side environment with torch and numpy "
        "(default $FP4SIM_MMASIM_PYTHON)",
    )
    parser.add_argument(
        "--mmasim",
        default=os.environ.get("FP4SIM_MMASIM_SRC"),
        help="a checkout of github.com/microsoft/MMA-Sim (default $FP4SIM_MMASIM_SRC)",
    )
    parser.add_argument(
        "--size", type=int, default=256, help="M = N = K (a multiple of 128; default 256)"
    )
    parser.add_argument(
        "--kinds",
        nargs="+",
        default=["mxf8f6f4", "nvfp4"],
        choices=_KINDS,
        help="kinds to time (default: mxf8f6f4 nvfp4)",
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of fp4sim")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON here")


def _skip(why: str) -> int:
    print(
        f"fp4sim bench mmasim: skipped: {why}. Give a side environment with torch "
        f"(--python /path/to/venv/bin/python) and an MMA-Sim checkout (--mmasim DIR); "
        f"e.g. python3.11 -m venv V && V/bin/pip install torch==2.13.0 numpy; "
        f"git clone https://github.com/microsoft/MMA-Sim"
    )
    return 0


def _problem(kind: str, size: int):
    from fp4sim.formats.blocks import MXFP4, MXFP8, NVFP4_SINGLE, quantize

    fmt = {"mxf8f6f4": MXFP8, "mxf4": MXFP4, "nvfp4": NVFP4_SINGLE}[kind]
    rng = np.random.default_rng(20261202)
    x = (rng.standard_normal((size, size)) * 2).astype(np.float32)
    y = rng.standard_normal((size, size)).astype(np.float32)
    a, b = quantize(x, fmt), quantize(y, fmt)
    runner_kind = {"mxf8f6f4": "mxf8f6f4", "mxf4": "mxf4", "nvfp4": "mxf4nvf4_ue4m3"}[kind]
    elem = {"mxf8f6f4": "e4m3", "mxf4": "e2m1", "nvfp4": "e2m1"}[kind]
    return fmt, a, b, {"kind": runner_kind, "formats": [elem, elem]}


def run(args: argparse.Namespace) -> int:
    import jax
    import jax.numpy as jnp

    from fp4sim.benchmarks import options_positive, time_interleaved
    from fp4sim.formats.matmul import Accumulation, scaled_matmul

    if not options_positive(args, ("size", "repeats")):
        return 2
    if args.size % 128:
        print("error: --size must be a multiple of 128", file=sys.stderr)
        return 2
    if not args.python or not Path(args.python).exists():
        return _skip(f"no side interpreter ({args.python or '--python not given'})")
    if not args.mmasim or not (Path(args.mmasim) / "mmasim").is_dir():
        return _skip(f"no MMA-Sim checkout ({args.mmasim or '--mmasim not given'})")
    probe = subprocess.run(
        [args.python, "-c", "import torch, numpy"], capture_output=True, text=True
    )
    if probe.returncode:
        return _skip(
            f"{args.python} cannot import torch and numpy: {probe.stderr.strip().splitlines()[-1:]}"
        )
    rows = []
    n = args.size
    for kind in args.kinds:
        fmt, a, b, spec = _problem(kind, n)
        aj, bj = (jax.device_put(jax.tree_util.tree_map(jnp.asarray, q)) for q in (a, b))
        fn = jax.jit(lambda p, q: scaled_matmul(p, q, accumulation=Accumulation.TCGEN05))
        t0 = time.perf_counter()
        ours = np.asarray(fn(aj, bj).block_until_ready())
        compile_s = time.perf_counter() - t0
        t_ours = time_interleaved(
            {"fp4sim": lambda fn=fn, aj=aj, bj=bj: fn(aj, bj).block_until_ready()}, args.repeats
        )["fp4sim"]
        with tempfile.TemporaryDirectory() as tmp:
            inp, out = Path(tmp) / "in.npz", Path(tmp) / "out.npz"
            arrays = {
                "a": np.asarray(a.unpacked_codes()),
                "b": np.asarray(b.unpacked_codes()),
                "spec": np.array(json.dumps(spec)),
            }
            if a.scales is not None:
                arrays.update(sa=np.asarray(a.scales), sb=np.asarray(b.scales))
            np.savez(inp, **arrays)
            proc = subprocess.run(
                [
                    args.python,
                    str(_RUNNER),
                    "--mmasim",
                    args.mmasim,
                    "--inp",
                    str(inp),
                    "--out",
                    str(out),
                ],
                capture_output=True,
                text=True,
            )
            if proc.returncode:
                print(proc.stderr, file=sys.stderr)
                return _skip(f"MMA-Sim failed under {args.python} (exit {proc.returncode})")
            res = np.load(out)
            d, t_sim, torch_version = res["d"], float(res["seconds"]), str(res["torch"])
        equal = int(np.sum(d == ours.view(np.uint32)))
        rows.append(
            {
                "kind": kind,
                "format": fmt.name,
                "shape": [n, n, n],
                "fp4sim_jit_s": t_ours,
                "fp4sim_compile_s": compile_s,
                "mmasim_s": t_sim,
                "ratio": t_sim / t_ours,
                "bit_equal": equal,
                "outputs": int(d.size),
                "torch": torch_version,
            }
        )
        print(f"{kind}: fp4sim {t_ours * 1e3:.1f} ms, MMA-Sim {t_sim:.1f} s", flush=True)
    info = {
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "repeats": args.repeats,
        "python": args.python,
        "rows": rows,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(info, indent=1))
    print(
        f"fp4sim bench mmasim: M = N = K = {n}, this CPU, jax {jax.__version__} "
        f"({jax.default_backend()}); ratio = MMA-Sim time / fp4sim jit time"
    )
    print(
        f"{'kind':9} {'format':12} {'fp4sim ms':>10} {'MMA-Sim s':>10} {'ratio':>9} "
        f"{'bit-equal':>13}"
    )
    for r in rows:
        print(
            f"{r['kind']:9} {r['format']:12} {r['fp4sim_jit_s'] * 1e3:10.2f} "
            f"{r['mmasim_s']:10.1f} {r['ratio']:9.0f} {r['bit_equal']:>6}/{r['outputs']}"
        )
    return 0 if all(r["bit_equal"] == r["outputs"] for r in rows) else 1

"""``python -m fp4sim bench microscaling``: MXFP8, MXFP4 (packed) and NVFP4 quantize on this CPU.

Times, in one run and on the same float32 (rows, cols) array, :func:`fp4sim.formats.quantize`
on NumPy and under ``jax.jit`` against two other CPU quantizers of the same thing:

* a plain ml_dtypes quantizer (NumPy: block amax, power-of-two / E4M3 scale, ``astype`` casts,
  nibble packing), always available;
* torchao's own CPU path (``to_mx`` RCEIL for MXFP8/MXFP4, ``nvfp4_quantize`` with a per-tensor
  scale), run as a subprocess in a side venv whose interpreter ``--torchao-python`` (or the
  environment variable ``FP4SIM_TORCHAO_PYTHON``) names; skipped with a note when neither is
  given or the interpreter is absent). torch picks its own thread
  count there (``--torch-threads`` to pin it; 0 = torch's default).

Every timing is the minimum over ``--repeats`` rounds; within a round every implementation
(torchao through a persistent subprocess) runs once, so all see the same machine load. Ratios
are "other time / fp4sim jit time" (above 1: fp4sim faster). The same-size arrays are generated
from the same seed in both processes. CPU times on a shared machine are comparisons, not claims
about any GPU.

The table's "fp4sim jax.jit" uses XLA's default options. On a CPU backend the same function is
also compiled with ``compiler_options={"xla_cpu_prefer_vector_width": 512}`` (XLA CPU otherwise
emits 256-bit vector code for the ALU-bound integer encoder), checked to give the same bits, timed
in the same rounds, and reported on separate lines after the table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

_CASES = ("MXFP8", "MXFP4", "NVFP4")

_TORCHAO_SCRIPT = r"""
import json, sys, time, numpy as np, torch
rows, cols, threads = map(int, sys.argv[1:4])
if threads: torch.set_num_threads(threads)
from torchao.prototype.mx_formats.mx_tensor import to_mx
from torchao.prototype.mx_formats.config import ScaleCalculationMode
from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize, per_tensor_amax_to_scale
import torchao
x = np.random.default_rng(0).standard_normal((rows, cols)) * 2
x = torch.from_numpy(x.astype(np.float32))
fns = {
  "MXFP8": lambda: to_mx(x, torch.float8_e4m3fn, 32, ScaleCalculationMode.RCEIL),
  "MXFP4": lambda: to_mx(x, torch.float4_e2m1fn_x2, 32, ScaleCalculationMode.RCEIL),
  "NVFP4": lambda: nvfp4_quantize(x, 16, per_tensor_amax_to_scale(x.abs().amax())),
}
for f in fns.values(): f()
print(json.dumps({"threads": torch.get_num_threads(), "torch": torch.__version__,
                  "torchao": torchao.__version__}), flush=True)
for line in sys.stdin:
    t0 = time.perf_counter(); fns[line.strip()](); print(time.perf_counter() - t0, flush=True)
"""


class _Torchao:
    """torchao's quantizers in a persistent side-venv subprocess, timed one call at a time (so
    its runs interleave with fp4sim's and share the same machine load)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.proc = None
        self.info: dict[str, Any] | None = None
        self.note = ""
        if not args.torchao_python:
            self.note = (
                "skipped: no torchao interpreter (pass --torchao-python PATH or set "
                "FP4SIM_TORCHAO_PYTHON)"
            )
            return
        if not os.path.exists(args.torchao_python):
            self.note = f"skipped: {args.torchao_python} not found"
            return
        try:
            self.proc = subprocess.Popen(
                [
                    args.torchao_python,
                    "-c",
                    _TORCHAO_SCRIPT,
                    str(args.rows),
                    str(args.cols),
                    str(args.torch_threads),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                # idle OpenMP workers must sleep, not spin: spinning steals the cores that the
                # interleaved fp4sim runs use (and slows torch's own next call as well)
                env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"},
            )
            self.info = json.loads(self.proc.stdout.readline())
        except (OSError, ValueError) as exc:
            self.note = f"skipped: torchao subprocess failed ({exc})"
            self.close()

    def time(self, case: str) -> float:
        self.proc.stdin.write(case + "\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)
            self.proc = None


# XLA CPU compiles elementwise loops for 256-bit vectors by default; this per-compilation option
# lets the same program use 512-bit registers on AVX-512 machines (the integer code is ALU-bound).
_WIDE_VECTORS = {"xla_cpu_prefer_vector_width": 512}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rows", type=int, default=1024, help="rows of the float32 input (default 1024)"
    )
    parser.add_argument(
        "--cols",
        type=int,
        default=4096,
        help="columns of the float32 input, a multiple of 32 (default 4096)",
    )
    parser.add_argument("--repeats", type=int, default=7, help="timed rounds; the minimum counts")
    parser.add_argument(
        "--torchao-python",
        default=os.environ.get("FP4SIM_TORCHAO_PYTHON") or None,
        metavar="PATH",
        help="python of a venv with torch + torchao (default: $FP4SIM_TORCHAO_PYTHON; "
        "torchao is skipped without one)",
    )
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=0,
        help="torch.set_num_threads in the torchao subprocess (0: torch default)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON here")


def _once(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# --- a plain ml_dtypes quantizer (the always-available baseline) ------------------------------
def _mld_mx(x: np.ndarray, dtype: Any, emax: int, pack: bool) -> tuple[np.ndarray, np.ndarray]:
    r, c = x.shape
    b = x.reshape(r, c // 32, 32)
    amax = np.abs(b).max(-1, keepdims=True)
    m = np.float32(ml_dtypes.finfo(dtype).max)
    _, e = np.frexp(amax * (np.float32(1) / m))  # d = f * 2^e, f in [0.5, 1): ceil(log2 d)
    e = np.clip(e - (np.frexp(amax * (np.float32(1) / m))[0] == 0.5), -127, 127)
    y = np.clip(b * np.exp2(-e).astype(np.float32), -m, m).astype(dtype).reshape(r, c)
    scales = (e[..., 0] + 127).astype(np.uint8)
    codes = y.view(np.uint8)
    if pack:
        codes = (codes[:, 0::2] & 0xF) | ((codes[:, 1::2] & 0xF) << 4)
    return codes, scales


def _mld_nvfp4(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r, c = x.shape
    g = np.abs(x).max() / np.float32(2688)
    b = x.reshape(r, c // 16, 16)
    amax = np.abs(b).max(-1, keepdims=True)
    s = np.clip(amax / np.float32(6) / g, 0, 448).astype(ml_dtypes.float8_e4m3fn)
    sf = s.astype(np.float32) * g
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.where(sf > 0, b / sf, 0)
    codes = np.clip(y, -6, 6).astype(ml_dtypes.float4_e2m1fn).reshape(r, c).view(np.uint8)
    return (codes[:, 0::2] & 0xF) | ((codes[:, 1::2] & 0xF) << 4), s.view(np.uint8)


def run(args: argparse.Namespace) -> int:
    import jax
    import jax.numpy as jnp

    from fp4sim.formats import MXFP4, MXFP8, NVFP4, quantize

    fmts = {"MXFP8": (MXFP8, False), "MXFP4": (MXFP4, True), "NVFP4": (NVFP4, True)}
    x = (np.random.default_rng(0).standard_normal((args.rows, args.cols)) * 2).astype(np.float32)
    xj = jax.device_put(jnp.asarray(x))
    n = x.size
    impls: dict[str, dict[str, Callable[[], Any]]] = {}
    wide: dict[str, Callable[[], Any]] = {}  # the same jit with 512-bit vectors (CPU only)
    for name, (fmt, pack) in fmts.items():
        jitted = jax.jit(lambda v, f=fmt, p=pack: quantize(v, f, pack=p))
        if name == "NVFP4":
            mld = lambda: _mld_nvfp4(x)  # noqa: E731
        else:
            dt = ml_dtypes.float8_e4m3fn if name == "MXFP8" else ml_dtypes.float4_e2m1fn
            mld = lambda dt=dt, p=pack, e=fmt.elem.emax: _mld_mx(x, dt, e, p)  # noqa: E731
        impls[name] = {
            "fp4sim NumPy": lambda f=fmt, p=pack: quantize(x, f, pack=p),
            "fp4sim jax.jit": lambda j=jitted: jax.block_until_ready(j(xj)),
            "ml_dtypes quantizer": mld,
        }
        for fn in impls[name].values():
            fn()  # warm-up and compilation
        if jax.default_backend() == "cpu":
            jw = jax.jit(
                lambda v, f=fmt, p=pack: quantize(v, f, pack=p), compiler_options=_WIDE_VECTORS
            )
            same = [
                np.array_equal(
                    np.atleast_1d(np.asarray(u)).view(np.uint8),
                    np.atleast_1d(np.asarray(v)).view(np.uint8),
                )
                for u, v in zip(jax.tree.leaves(jitted(xj)), jax.tree.leaves(jw(xj)))
            ]
            if not all(same):  # codes, scales and the FP32 factor, bit for bit
                raise AssertionError(f"{name}: 512-bit vector code changed the bits")
            wide[name] = lambda j=jw: jax.block_until_ready(j(xj))
    tao = _Torchao(args)
    tao_name = (
        None
        if tao.info is None
        else f"torchao {tao.info['torchao']} CPU ({tao.info['threads']} threads)"
    )
    times = {name: {impl: float("inf") for impl in fns} for name, fns in impls.items()}
    wide_t: dict[str, float] = {}
    try:
        for _ in range(args.repeats):  # round robin: every implementation sees the same load
            for name, fns in impls.items():
                for impl, fn in fns.items():
                    times[name][impl] = min(times[name][impl], _once(fn))
                if name in wide:
                    wide_t[name] = min(wide_t.get(name, float("inf")), _once(wide[name]))
                if tao_name:
                    times[name][tao_name] = min(
                        times[name].get(tao_name, float("inf")), tao.time(name)
                    )
    finally:
        tao.close()
    rows = []
    for name, impls in times.items():
        jit_t = impls["fp4sim jax.jit"]
        for impl, t in impls.items():
            rows.append(
                {
                    "case": name,
                    "impl": impl,
                    "seconds": t,
                    "Melem_per_s": n / t / 1e6,
                    "other_over_fp4sim_jit": t / jit_t,
                }
            )
    info = {
        "rows_x_cols": [args.rows, args.cols],
        "repeats": args.repeats,
        "jax": jax.__version__,
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "torchao": tao.info or {"note": tao.note},
        "results": rows,
        "jit_512_bit_vectors": {
            "compiler_options": _WIDE_VECTORS,
            "seconds": wide_t,
            "torchao_over_it": {c: times[c][tao_name] / t for c, t in wide_t.items()}
            if tao_name
            else {},
        },
    }
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(info, fh, indent=1)
    print(
        f"fp4sim bench microscaling: quantize a {args.rows}x{args.cols} float32 array, min of "
        f"{args.repeats} runs, jax {jax.__version__} CPU, {os.cpu_count()} cores"
    )
    if tao.info is None:
        print(f"torchao: {tao.note}")
    print(f"{'case':6} {'implementation':36} {'ms':>9} {'Melem/s':>9} {'time/jit':>9}")
    for r in rows:
        print(
            f"{r['case']:6} {r['impl']:36} {r['seconds'] * 1e3:9.2f} {r['Melem_per_s']:9.1f} "
            f"{r['other_over_fp4sim_jit']:9.2f}"
        )
    if wide_t:
        print(
            f"fp4sim jax.jit again with compiler_options={_WIDE_VECTORS} (512-bit vector code "
            f"where the CPU has it; same bits, checked), timed in the same rounds:"
        )
        for name, t in wide_t.items():
            tao_part = f", torchao/it {times[name][tao_name] / t:.2f}x" if tao_name else ""
            print(
                f"{name:6} {t * 1e3:.2f} ms, {times[name]['fp4sim jax.jit'] / t:.2f}x the "
                f"default options{tao_part}"
            )
    return 0

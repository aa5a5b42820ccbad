"""``python -m fp4sim bench formats``: element encode/decode throughput on this CPU.

Measures, in one run and on the same float32 array, :func:`fp4sim.formats.encode` and
:func:`~fp4sim.formats.decode` on NumPy and under ``jax.jit`` against the ml_dtypes cast of the
same array (``x.astype(float8_e4m3fn)``; decode: ``codes.view(dtype).astype(float32)``) and
against XLA's own convert under ``jax.jit``. The encode policy is the default (nearest-even,
saturate); ml_dtypes and XLA casts differ from it only at overflow and NaN, which costs them
nothing. Every timing is the minimum over ``--repeats`` runs; ratios are "this time / ml_dtypes
time", the direction of the other benchmarks (fp4sim time / other time: below 1 means faster than
the ml_dtypes cast). CPU times are noisy on a shared
machine and are a comparison, not a claim about any GPU.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from fp4sim.formats import E2M1, E4M3, E5M2, UE8M0, FloatFormat, decode, encode

_FORMATS = {"E2M1": E2M1, "E4M3": E4M3, "E5M2": E5M2, "UE8M0": UE8M0}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--size", type=int, default=1 << 22, help="elements per array (default 2^22)"
    )
    parser.add_argument(
        "--repeats", type=int, default=7, help="timed runs per case; the minimum counts"
    )
    parser.add_argument(
        "--formats",
        nargs="+",
        default=list(_FORMATS),
        choices=list(_FORMATS),
        help="formats to time (default: all of %(choices)s)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON here")


def _min_time(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm-up (and compilation for jitted functions)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _cases(fmt: FloatFormat, x: np.ndarray) -> dict[str, dict[str, Callable[[], Any]]]:
    import jax
    import jax.numpy as jnp

    xj = jax.device_put(jnp.asarray(x))
    codes = encode(x, fmt)
    cj = jax.device_put(jnp.asarray(codes))
    enc_jit = jax.jit(lambda v: encode(v, fmt))
    dec_jit = jax.jit(lambda c: decode(c, fmt))
    xla_cast = jax.jit(lambda v: v.astype(fmt.dtype))
    xla_uncast = jax.jit(lambda c: jax.lax.bitcast_convert_type(c, fmt.dtype).astype(jnp.float32))
    return {
        "encode": {
            "ml_dtypes cast": lambda: x.astype(fmt.dtype),
            "fp4sim NumPy": lambda: encode(x, fmt),
            "fp4sim jax.jit": lambda: enc_jit(xj).block_until_ready(),
            "XLA convert (jit)": lambda: xla_cast(xj).block_until_ready(),
        },
        "decode": {
            "ml_dtypes cast": lambda: codes.view(fmt.dtype).astype(np.float32),
            "fp4sim NumPy": lambda: decode(codes, fmt),
            "fp4sim jax.jit": lambda: dec_jit(cj).block_until_ready(),
            "XLA convert (jit)": lambda: xla_uncast(cj).block_until_ready(),
        },
    }


def run(args: argparse.Namespace) -> int:
    import jax

    rng = np.random.default_rng(0)
    x = (rng.standard_normal(args.size) * 2.0).astype(np.float32)
    rows = []
    for name in args.formats:
        fmt = _FORMATS[name]
        scale = fmt.max / 8 if fmt is not UE8M0 else 1.0
        xf = np.abs(x * np.float32(scale)) if not fmt.signed else x * np.float32(scale)
        for op, impls in _cases(fmt, xf).items():
            base = None
            for impl, fn in impls.items():
                t = _min_time(fn, args.repeats)
                base = t if base is None else base
                rows.append(
                    {
                        "format": name,
                        "op": op,
                        "impl": impl,
                        "seconds": t,
                        "Melem_per_s": args.size / t / 1e6,
                        "time_vs_ml_dtypes": t / base,
                    }
                )
    info = {
        "size": args.size,
        "repeats": args.repeats,
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "rows": rows,
    }
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(info, fh, indent=1)
    print(
        f"fp4sim bench formats: {args.size} float32 elements, min of {args.repeats} runs, "
        f"jax {jax.__version__} on {jax.default_backend()}; ratio = time / ml_dtypes time"
    )
    print(f"{'format':7} {'op':7} {'implementation':20} {'ms':>9} {'Melem/s':>9} {'ratio':>7}")
    for r in rows:
        print(
            f"{r['format']:7} {r['op']:7} {r['impl']:20} {r['seconds'] * 1e3:9.2f} "
            f"{r['Melem_per_s']:9.1f} {r['time_vs_ml_dtypes']:7.2f}"
        )
    return 0

"""Tile / warp / unroll sweep of the ordered-sum kernel at the backward's S2048 D128 shapes (GPU).

    python scripts/emu_kernel_sweep.py --budget 45 --out DIR

For the four products of the FP8 training route's backward at H8 S2048 D128 causal (dV = P̃ᵀ dO,
dP = dO Vᵀ with the causal ``needed`` blocks, dQ = dS K, dK = dSᵀ Q; every one the plain chain,
with lower-triangular operands as a causal mask makes them), times
:func:`fp4sim.attention.ordered_gpu.backward_product` under several Triton configurations
(output tile, ``num_warps``, ``unroll``, ``num_stages``), the default first, and checks that
every configuration gives the default's bits (dP: where ``needed`` is nonzero; the order of each output's terms does not
depend on them). Stops starting new configurations after ``--budget`` seconds. Prints a table
and writes ``DIR/kernel_sweep.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=45.0)
    ap.add_argument("--out", required=True)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument(
        "--configs",
        default=None,
        help="comma-separated BMxBNxWARPSxUNROLLxSTAGES configurations to time after the "
        "default (e.g. 64x64x1x4x2), instead of the built-in list",
    )
    args = ap.parse_args()

    import jax
    import jax.numpy as jnp
    import numpy as np

    from fp4sim.attention import ordered_gpu as og
    from fp4sim.benchmarks import median_device_time

    t_start = time.perf_counter()
    interpret = jax.devices()[0].platform == "cpu"  # a smoke test off the GPU (tiny shapes)
    h, n, d = args.heads, args.seq, args.head_dim
    rng = np.random.default_rng(0)

    def fp8ish(shape):  # short significands (E4M3-like): exact products, as the route's operands
        m = rng.integers(-15, 16, shape).astype(np.float32)
        return m * np.exp2(rng.integers(-8, 0, shape)).astype(np.float32)

    tri = np.tril(np.ones((n, n), np.float32))
    p = jnp.asarray(fp8ish((h, n, n)) * tri)  # (queries, keys), causal
    ds = jnp.asarray(fp8ish((h, n, n)) * tri)
    do, q, k = (jnp.asarray(fp8ish((h, n, d))) for _ in range(3))
    vt = jnp.asarray(fp8ish((h, d, n)))
    products = {  # name: (a, b, needed, transposed)
        "dv=PT.dO": (p, do, None, True),
        "dq=dS.K": (ds, k, None, False),
        "dk=dST.Q": (ds, q, None, True),
        "dp=dO.VT": (do, vt, p, False),
    }
    # (bm, bn, num_warps, unroll, num_stages); None = the default of backward_product
    configs = [
        None,
        (64, 64, 4, 8, 1),
        (64, 64, 4, 4, 2),
        (64, 64, 8, 4, 1),
        (128, 64, 4, 4, 1),
        (64, 128, 4, 4, 1),
        (128, 128, 8, 4, 1),
        (128, 128, 4, 4, 1),
        (32, 128, 4, 4, 1),
        (64, 64, 2, 4, 1),
        (32, 64, 2, 4, 1),
        (128, 64, 8, 8, 1),
        (64, 64, 4, 4, 1),
        (64, 64, 1, 4, 1),
        (64, 64, 2, 8, 1),
        (64, 64, 2, 2, 1),
        (32, 64, 1, 4, 1),
        (64, 32, 1, 4, 1),
        (32, 32, 1, 4, 1),
        (128, 64, 2, 4, 1),
    ]
    if args.configs:
        try:
            configs = [None] + [
                tuple(int(x) for x in c.split("x")) for c in args.configs.split(",") if c
            ]
        except ValueError:
            ap.error(f"--configs={args.configs!r}: each entry must be BMxBNxWARPSxUNROLLxSTAGES")
        if any(len(c) != 5 for c in configs[1:]):
            ap.error(f"--configs={args.configs!r}: each entry must have five numbers")
    results: dict = {}
    for cfg in configs:
        for name, (a, b, needed, transposed) in products.items():
            if time.perf_counter() - t_start > args.budget:
                break
            n_j = b.shape[-1]
            if cfg is not None and cfg[1] > n_j:
                continue
            kw = {}
            if cfg is not None:
                bm, bn, nw, un, ns = cfg
                kw = dict(tile=(bm, bn), num_warps=nw, unroll=un, num_stages=ns)
            fn = jax.jit(
                lambda a, b, nd, transposed=transposed, kw=kw: og.backward_product(
                    a, b, True, nd, transposed, interpret=interpret, **kw
                )
            )
            label = "default" if cfg is None else "x".join(map(str, cfg))
            try:
                t0 = time.perf_counter()
                out = jax.block_until_ready(fn(a, b, needed))
                comp = time.perf_counter() - t0
                ms = median_device_time(lambda f=fn, x=(a, b, needed): f(*x), 5, 10) * 1e3
            except Exception as e:  # noqa: BLE001 - a config Triton refuses is reported
                print(f"{name:10s} {label:16s} FAILED {type(e).__name__}: {str(e)[:200]}")
                continue
            bits = np.asarray(out).view(np.uint32)
            if needed is not None:  # outside the needed entries a skipped block may hold +0
                bits = np.where(np.asarray(needed) != 0, bits, np.uint32(0))
            ref = results.get((name, "default"), {}).get("bits")
            same = True if ref is None else bool(np.array_equal(bits, ref))
            results[(name, label)] = {"ms": ms, "compile_s": comp, "same_bits": same, "bits": bits}
            print(
                f"{name:10s} {label:16s} {ms:8.3f} ms  (compile {comp:4.1f} s)  "
                f"bits equal to default: {same}",
                flush=True,
            )
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "kernel_sweep.json"), "w") as f:
        json.dump(
            {
                f"{k[0]} {k[1]}": {kk: vv for kk, vv in v.items() if kk != "bits"}
                for k, v in results.items()
            },
            f,
            indent=1,
        )
    print(f"sweep: {time.perf_counter() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

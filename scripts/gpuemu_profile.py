"""Per-kernel GPU time of a jitted emulator call, from a jax.profiler trace (no nsys needed).

    python scripts/gpuemu_profile.py --what forward --seq 4096 --head-dim 128 --out DIR
    python scripts/gpuemu_profile.py --what training --seq 2048 --head-dim 128 --heads 8 --out DIR
    python scripts/gpuemu_profile.py --what row-chunks --chunks 128,512,4096 --out DIR

Compiles and warms up the function (``forward``: the Direct-P forward emulator
``attention_forward`` of ``--recipe``; ``training``: jit(grad) of ``emulated_attention`` with
``--training-recipe``), traces ``--calls`` calls and prints the per-kernel table of
:func:`fp4sim.benchmarks.profile.profile_calls` (also ``DIR/profile.txt``: the kernels with the
most total time, their share and count, and the emulator source line of each), and writes the
optimized HLO of the function (``DIR/optimized_hlo.txt``).
``row-chunks`` (an experiment) times the forward with other query-row chunk sizes of the jitted
forward on the GPU (its private ``_GPU_ROW_CHUNK``, set here for the experiment only), median
of 5 calls each, and compares the bits with the first size's.
"""

from __future__ import annotations

import argparse
import json
import os
import time


def build(args):
    import jax
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(0)
    shape = (args.heads, args.seq, args.head_dim)
    q, k, v, do = (jnp.asarray(rng.standard_normal(shape).astype(np.float32)) for _ in range(4))
    if args.what == "forward":
        from fp4sim.attention.forward import attention_forward
        from fp4sim.attention.recipe import preset_by_name

        rec = preset_by_name(args.recipe)
        fn = jax.jit(lambda q, k, v: attention_forward(q, k, v, rec, causal=args.causal)[:2])
    else:
        from fp4sim.attention.autodiff import emulated_attention, training_preset

        rec = training_preset(args.training_recipe)
        fn = jax.jit(
            jax.grad(
                lambda q, k, v: jnp.sum(
                    jax.vmap(lambda a, b, c: emulated_attention(a, b, c, rec, causal=True))(q, k, v)
                    * do
                ),
                argnums=(0, 1, 2),
            )
        )
    return fn, (q, k, v)


def row_chunks(args) -> int:
    import statistics

    import jax

    from fp4sim.attention import forward

    args.what = "forward"
    import numpy as np

    res, ref = {}, None
    default = forward._GPU_ROW_CHUNK
    try:
        for chunk in (int(c) for c in args.chunks.split(",")):
            forward._GPU_ROW_CHUNK = chunk
            fn, xs = build(args)
            t0 = time.perf_counter()
            first = jax.block_until_ready(fn(*xs))
            comp = time.perf_counter() - t0
            ts = []
            for _ in range(5):
                t0 = time.perf_counter()
                jax.block_until_ready(fn(*xs))
                ts.append(time.perf_counter() - t0)
            res[chunk] = {"median_ms": statistics.median(ts) * 1e3, "first_call_s": comp}
            print(
                f"row chunk {chunk:5d}: {res[chunk]['median_ms']:8.3f} ms (first call "
                f"{comp:.1f} s)",
                flush=True,
            )
            got = [np.asarray(a) for a in jax.device_get(first)]
            if ref is None:
                ref = got
            else:
                same = all(
                    np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(got, ref)
                )
                print(f"  bits equal to the first chunk size's: {same}", flush=True)
    finally:
        forward._GPU_ROW_CHUNK = default
    with open(os.path.join(args.out, "row_chunks.json"), "w") as f:
        json.dump(res, f, indent=1)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--what", choices=("forward", "training", "row-chunks"), default="forward")
    ap.add_argument("--chunks", default="128,512,4096")
    ap.add_argument("--recipe", default="hw_fp4_direct_p")
    ap.add_argument("--training-recipe", default="direct_p_fp8_training")
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--heads", type=int, default=1)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import jax

    os.makedirs(args.out, exist_ok=True)
    if args.what == "row-chunks":
        return row_chunks(args)
    from fp4sim.benchmarks.profile import profile_calls

    fn, xs = build(args)
    t0 = time.perf_counter()
    compiled = fn.lower(*xs).compile()
    jax.block_until_ready(compiled(*xs))
    print(f"compile + first call {time.perf_counter() - t0:.1f} s")
    with open(os.path.join(args.out, "optimized_hlo.txt"), "w") as f:
        f.write(compiled.as_text())
    profile_calls(lambda: compiled(*xs), compiled, args.out, calls=args.calls, top=args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

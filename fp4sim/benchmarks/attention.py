"""``python -m fp4sim bench attention``: the jitted forward emulator vs plain attention, same run.

CPU (default): ``jax.jit`` of :func:`fp4sim.attention.forward.attention_forward` for one recipe
against a plain float32 ``jnp`` softmax attention of the same shape (one head, non-causal by
default), both compiled and warmed up, median wall time of ``--repeats`` calls made in turn
(emulator, baseline, emulator, ...: load drifts on a shared machine hit both), and the ratio
(target for the Direct-P route: at most 2x). ``--device gpu`` runs the same jitted emulator on
the GPU and compares it with cuDNN's bf16 attention
(``jax.nn.dot_product_attention(implementation="cudnn")``) and the float32 ``jnp`` attention
there (each side's median per synchronized call, and on the GPU also per call of 10 issued
back to back, which leaves out the host's launch-and-wait latency); ``--check-cpu`` also runs the emulator on the CPU backend and compares O and LSE bit
for bit. ``--errors`` adds, for every preset in ``fp4sim.attention.recipe.PRESETS``, the output
error against the float64 reference on the same Gaussian inputs (cosine, relative L2). Results
are printed as a table (last) and optionally written as JSON (``--json``), updated after every
measurement so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from fp4sim.benchmarks import median_device_time, options_positive, time_interleaved

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seq", type=int, default=4096, help="tokens (default 4096)")
    parser.add_argument("--head-dim", type=int, default=128, help="head dimension (default 128)")
    parser.add_argument("--heads", type=int, default=1, help="heads (default 1)")
    parser.add_argument(
        "--recipe",
        default="hw_fp4_direct_p",
        help="preset timed against the baseline (fp4sim.attention.recipe.PRESETS)",
    )
    parser.add_argument("--causal", action="store_true", help="causal masking (default off)")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per side (default 3)")
    parser.add_argument(
        "--device",
        choices=("cpu", "gpu"),
        default="cpu",
        help="where jax runs both sides (default cpu)",
    )
    parser.add_argument(
        "--errors",
        action="store_true",
        help="also measure every preset's error against the float64 reference",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed of the inputs (default 0)")
    parser.add_argument(
        "--check-cpu",
        action="store_true",
        help="with --device gpu: also run the jitted emulator on the CPU backend "
        "(same process, same inputs; compiled while the GPU side compiles) "
        "and compare O and LSE bit for bit",
    )
    parser.add_argument("--json", default=None, help="write the results to this JSON file")
    parser.add_argument(
        "--profile",
        default=None,
        metavar="DIR",
        help="after the timings, trace 3 calls of the emulator and print its per-kernel time "
        "table (fp4sim.benchmarks.profile), also written to DIR/profile.txt",
    )


def run(args: argparse.Namespace) -> int:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from fp4sim.attention.forward import attention_forward
    from fp4sim.attention.metrics import error_summary
    from fp4sim.attention.recipe import PRESETS, preset_by_name
    from fp4sim.attention.reference import attention_reference

    if not options_positive(args, ("seq", "head_dim", "heads", "repeats")):
        return 2
    try:
        recipe = preset_by_name(args.recipe)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    platform = "gpu" if args.device == "gpu" else "cpu"
    try:
        dev = jax.devices(platform)[0]
    except RuntimeError:
        print(f"error: no {platform} device visible to jax", file=sys.stderr)
        return 2

    h, s, d = args.heads, args.seq, args.head_dim
    rng = np.random.default_rng(args.seed)
    qn, kn, vn = (rng.standard_normal((h, s, d)).astype(np.float32) for _ in range(3))
    q, k, v = (jax.device_put(a, dev) for a in (qn, kn, vn))
    scale = 1.0 / np.sqrt(d)
    result: dict = {
        "device": str(dev),
        "shape": {"heads": h, "seq": s, "head_dim": d},
        "causal": args.causal,
        "recipe": args.recipe,
        "times_s": {},
        "errors": {},
    }

    def save() -> None:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2)

    def emulator(rec):
        return jax.jit(lambda q, k, v: attention_forward(q, k, v, rec, causal=args.causal)[:2])

    @jax.jit
    def plain(q, k, v):
        sc = jnp.einsum("hqd,hkd->hqk", q, k) * jnp.float32(scale)
        if args.causal:
            sc = jnp.where(jnp.tril(jnp.ones((s, s), bool)), sc, -jnp.inf)
        return jnp.einsum("hqk,hkd->hqd", jax.nn.softmax(sc, axis=-1), v)

    emu_jit = emulator(recipe)
    cpu_job = None
    if args.check_cpu and platform == "gpu":
        import concurrent.futures

        cpu_args = tuple(jax.device_put(a, jax.devices("cpu")[0]) for a in (qn, kn, vn))
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        cpu_job = pool.submit(lambda: emulator(recipe).lower(*cpu_args).compile())
    t0 = time.perf_counter()
    emu = emu_jit.lower(q, k, v).compile()
    gpu_out = jax.block_until_ready(emu(q, k, v))
    result["compile_s"] = time.perf_counter() - t0
    jax.block_until_ready(plain(q, k, v))
    sides = {
        "emulator": lambda: jax.block_until_ready(emu(q, k, v)),
        "float32_jnp": lambda: jax.block_until_ready(plain(q, k, v)),
    }
    if platform == "gpu":
        qb, kb, vb = (jnp.swapaxes(a, 0, 1)[None].astype(jnp.bfloat16) for a in (q, k, v))
        cudnn = jax.jit(
            lambda q, k, v: jax.nn.dot_product_attention(
                q, k, v, is_causal=args.causal, implementation="cudnn"
            )
        )
        try:
            jax.block_until_ready(cudnn(qb, kb, vb))
            sides["cudnn_bf16"] = lambda: jax.block_until_ready(cudnn(qb, kb, vb))
        except Exception as e:  # noqa: BLE001 - report, do not hide
            result["cudnn_error"] = f"{type(e).__name__}: {e}"
    result["times_s"] = time_interleaved(sides, args.repeats)
    if platform == "gpu":
        # also back to back (10 calls per synchronization): the GPU's time per call without the
        # host's launch-and-wait latency of one synchronized call
        raw = {"emulator": lambda: emu(q, k, v), "float32_jnp": lambda: plain(q, k, v)}
        if "cudnn_bf16" in sides:
            raw["cudnn_bf16"] = lambda: cudnn(qb, kb, vb)
        result["back_to_back_s"] = {
            name: median_device_time(fn, args.repeats, 10) for name, fn in raw.items()
        }
    save()

    if args.errors:
        ref = attention_reference(qn, kn, vn, causal=args.causal).out
        for name, rec in PRESETS.items():
            out = np.asarray(emulator(rec)(q, k, v)[0])
            e = error_summary(out, ref)
            result["errors"][name] = {"cosine": e.cosine, "rel_l2": e.rel_l2, "max_abs": e.max_abs}
            save()

    t = result["times_s"]
    print(
        f"attention forward, {h} head(s) x S{s} x D{d}, causal={args.causal}, "
        f"on {result['device']}; emulator compile {result['compile_s']:.1f} s"
    )
    if result["errors"]:
        print(f"{'preset':28s} {'cosine':>10s} {'rel L2':>10s}")
        for name, e in result["errors"].items():
            print(f"{name:28s} {e['cosine']:10.6f} {e['rel_l2']:10.4e}")
    print(f"{'side':28s} {'median ms':>10s} {'emulator / side':>16s}")
    for side, sec in t.items():
        print(f"{side:28s} {sec * 1e3:10.3f} {t['emulator'] / sec:16.2f}", flush=True)
    if "back_to_back_s" in result:
        b = result["back_to_back_s"]
        print(f"back to back (10 calls per synchronization, median of {args.repeats}):")
        for side, sec in b.items():
            print(f"{side:28s} {sec * 1e3:10.3f} {b['emulator'] / sec:16.2f}", flush=True)
    save()
    if args.profile:
        from fp4sim.benchmarks.profile import profile_calls

        profile_calls(lambda: emu(q, k, v), emu, args.profile, calls=3, top=30)
    if cpu_job is not None:
        cpu_out = jax.block_until_ready(cpu_job.result()(*cpu_args))
        pool.shutdown()
        bad = {
            name: int(
                np.count_nonzero(np.asarray(a).view(np.uint32) != np.asarray(b).view(np.uint32))
            )
            for name, a, b in zip(("out", "lse"), gpu_out, cpu_out)
        }
        result["cpu_check_mismatches"] = bad
        print(
            f"emulator O and LSE on the GPU vs the CPU backend: "
            f"{'bit-identical' if not any(bad.values()) else 'DIFFER'} {bad}"
        )
        save()
    return 0

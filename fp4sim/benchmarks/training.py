"""``python -m fp4sim bench training``: emulated attention forward+backward vs float32 jnp, on CPU.

Both sides run in one process on the same inputs: ``jax.jit(jax.grad(loss))`` through
:func:`fp4sim.attention.autodiff.emulated_attention` (the chosen training recipe: quantized
Q/K/V, the recipe's P converter and tiled forward, the emulated low-precision backward) and
through a plain float32 ``jnp`` causal attention of the same shape. It reports the median wall
time of each (after compilation and a warm-up call), their ratio (target: at most 3x), and the
gradient error of both against the float64 reference. CPU times are for the record only; the
ratio is the claim.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seq", type=int, default=1024, help="tokens (default 1024)")
    parser.add_argument("--head-dim", type=int, default=64, help="head dimension (default 64)")
    parser.add_argument("--heads", type=int, default=1, help="heads, vmapped (default 1)")
    parser.add_argument("--recipe", default="direct_p_fp8_training",
                        help="training preset name (fp4sim.attention.autodiff.TRAINING_PRESETS)")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per side (default 5)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")


def _time(fn, repeats: int) -> float:
    fn()  # warm-up (compiled already)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run(args: argparse.Namespace) -> int:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from fp4sim.attention.autodiff import emulated_attention, training_preset
    from fp4sim.attention.backward import attention_grad_reference

    for name in ("seq", "head_dim", "heads", "repeats"):
        if getattr(args, name) < 1:
            print(f"error: --{name.replace('_', '-')} must be >= 1", file=sys.stderr)
            return 2
    try:
        recipe = training_preset(args.recipe)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    h, n, d = args.heads, args.seq, args.head_dim
    rng = np.random.default_rng(args.seed)
    q, k, v, do = (rng.standard_normal((h, n, d)).astype(np.float32) for _ in range(4))
    scale = 1.0 / float(np.sqrt(d))

    def emu_loss(q, k, v):
        out = jax.vmap(lambda a, b, c: emulated_attention(a, b, c, recipe, softmax_scale=scale,
                                                          causal=True))(q, k, v)
        return jnp.sum(out * do)

    mask = jnp.tril(jnp.ones((n, n), bool))

    def ref_loss(q, k, v):
        s = jnp.where(mask, scale * jnp.einsum("hnd,hmd->hnm", q, k), -jnp.inf)
        return jnp.sum((jax.nn.softmax(s, axis=-1) @ v) * do)

    emu = jax.jit(jax.grad(emu_loss, argnums=(0, 1, 2)))
    ref = jax.jit(jax.grad(ref_loss, argnums=(0, 1, 2)))
    args_j = tuple(jnp.asarray(x) for x in (q, k, v))
    t0 = time.perf_counter()
    g_emu = jax.block_until_ready(emu(*args_j))
    compile_emu = time.perf_counter() - t0
    g_ref = jax.block_until_ready(ref(*args_j))
    t_emu = _time(lambda: jax.block_until_ready(emu(*args_j)), args.repeats)
    t_ref = _time(lambda: jax.block_until_ready(ref(*args_j)), args.repeats)

    exact = attention_grad_reference(q, k, v, do, softmax_scale=scale, causal=True)

    def rel_l2(a, b):
        a = np.asarray(a, np.float64)
        return float(np.linalg.norm(a - b) / np.linalg.norm(b))

    result = {
        "suite": "training", "device": "cpu", "recipe": recipe.name,
        "shape": {"heads": h, "seq": n, "head_dim": d, "causal": True},
        "emulated_fwd_bwd_s": t_emu, "jnp_f32_fwd_bwd_s": t_ref, "ratio": t_emu / t_ref,
        "emulated_first_call_s": compile_emu,
        "rel_l2_vs_float64": {
            "emulated": {n_: rel_l2(a, b) for n_, a, b in zip(("dq", "dk", "dv"), g_emu, exact)},
            "jnp_f32": {n_: rel_l2(a, b) for n_, a, b in zip(("dq", "dk", "dv"), g_ref, exact)},
        },
    }
    print(f"bench training (CPU, {jax.devices()[0].platform}): heads={h} seq={n} head_dim={d} "
          f"causal, recipe {recipe.name}")
    print(f"  emulated fwd+bwd  {t_emu * 1e3:9.2f} ms   (first call incl. compile "
          f"{compile_emu:.1f} s)")
    print(f"  jnp f32 fwd+bwd   {t_ref * 1e3:9.2f} ms")
    print(f"  ratio             {t_emu / t_ref:9.2f} x   (target <= 3x)")
    for side in ("emulated", "jnp_f32"):
        errs = result["rel_l2_vs_float64"][side]
        print(f"  rel-L2 vs float64 {side:9s} dq {errs['dq']:.3e}  dk {errs['dk']:.3e}  "
              f"dv {errs['dv']:.3e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0

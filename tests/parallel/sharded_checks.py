"""Run as a script under ``XLA_FLAGS=--xla_force_host_platform_device_count=8``: the sharded
emulators against one device, bit for bit. Prints one JSON object (read by test_parallel.py).

Each check compares uint32 bit patterns of float32 results: sharded (fp4sim.parallel) against
the same jitted function on one device, and against the NumPy path (the definition)."""

from __future__ import annotations

import json
import sys

import numpy as np


def bits(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float32).view(np.uint32)


def same(a, b) -> bool:
    return bool(np.array_equal(bits(a), bits(b)))


def main() -> None:
    import jax

    import fp4sim
    from fp4sim.attention.recipe import PRESETS, TRAINING_PRESETS
    from fp4sim.parallel import (
        attention_mesh,
        map_cases,
        shard_attention_inputs,
        sharded_attention_forward,
        sharded_emulated_attention,
    )

    out: dict = {"devices": len(jax.devices())}
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((2, 4, 128, 64)).astype(np.float32) for _ in range(3))
    q[0, 1, 3] = 0.0  # a zero row and a zero key block: the edge cases of the scale rules
    k[1, 2, :32] = 0.0
    meshes = {
        "2x2x2": attention_mesh(batch=2, heads=2, query=2),
        "1x1x8": attention_mesh(batch=1, heads=1, query=8),
    }

    fwd = {}
    for name in ("hw_fp4_direct_p", "flamia_nvfp4", "cudnn_fp8_fixed"):
        rec = PRESETS[name]
        # causal on the 3-axis mesh, non-causal split along the queries alone
        for causal, mname in ((True, "2x2x2"), (False, "1x1x8")):
            mesh = meshes[mname]
            ref = fp4sim.attention_forward(q, k, v, rec, causal=causal)  # NumPy
            one = jax.jit(
                lambda a, b, c, rec=rec, causal=causal: fp4sim.attention_forward(
                    a, b, c, rec, causal=causal
                )[:2]
            )(q, k, v)
            r = sharded_attention_forward(
                *shard_attention_inputs(mesh, q, k, v), rec, mesh=mesh, causal=causal
            )
            fwd[f"{name}/causal={causal}/{mname}"] = {
                "out_vs_one": same(r.out, one[0]),
                "lse_vs_one": same(r.lse, one[1]),
                "out_vs_numpy": same(r.out, ref.out),
                "lse_vs_numpy": same(r.lse, ref.lse),
                "out_sharded": len(r.out.sharding.device_set) == 8,
            }
    out["forward"] = fwd

    grads = {}
    mesh = attention_mesh(batch=2, heads=4, query=1)
    do = rng.standard_normal(q.shape).astype(np.float32)
    for name in ("direct_p_fp8_training", "flamia_mxfp8_training"):
        rec = TRAINING_PRESETS[name]

        def loss(a, b, c, f):
            return (f(a, b, c) * do).sum()

        plain = jax.jit(
            jax.value_and_grad(
                lambda a, b, c, rec=rec: loss(
                    a, b, c, lambda x, y, z: fp4sim.emulated_attention(x, y, z, rec, causal=True)
                ),
                argnums=(0, 1, 2),
            )
        )
        shard = jax.jit(
            jax.value_and_grad(
                lambda a, b, c, rec=rec: loss(
                    a,
                    b,
                    c,
                    lambda x, y, z: sharded_emulated_attention(
                        x, y, z, rec, mesh=mesh, causal=True
                    ),
                ),
                argnums=(0, 1, 2),
            )
        )
        o1 = jax.jit(lambda a, b, c, rec=rec: fp4sim.emulated_attention(a, b, c, rec))(q, k, v)
        o2 = jax.jit(lambda a, b, c, rec=rec: sharded_emulated_attention(a, b, c, rec, mesh=mesh))(
            *shard_attention_inputs(mesh, q, k, v)
        )
        (_, g1), (_, g2) = plain(q, k, v), shard(*shard_attention_inputs(mesh, q, k, v))
        grads[name] = {
            "out": same(o1, o2),
            **{f"d{n}": same(a, b) for n, a, b in zip("qkv", g1, g2)},
            "dq_sharded": len(g2[0].sharding.device_set) == 8,
        }
    out["training"] = grads

    # a sweep: every case on some device, merged in case order, equal to the sequential run
    rec = PRESETS["hw_fp4_direct_p"]
    fwd_one = jax.jit(lambda a, b, c: fp4sim.attention_forward(a, b, c, rec)[0])

    def case(seed: int):
        r = np.random.default_rng(seed)
        a, b, c = (r.standard_normal((1, 64, 64)).astype(np.float32) for _ in range(3))
        res = fwd_one(a, b, c)
        return int(next(iter(res.devices())).id), np.asarray(res)

    seq = map_cases(case, range(16))
    par = map_cases(case, range(16), devices=jax.local_devices())
    out["sweep"] = {
        "equal": all(same(a[1], b[1]) for a, b in zip(seq, par)),
        "devices_used": len({d for d, _ in par}),
        "sequential_devices": len({d for d, _ in seq}),
    }

    # the report's route-error sweep (two presets, two jobs): 8 devices against NumPy
    from fp4sim.report import experiments
    from fp4sim.report.sizes import QUICK

    jobs = [  # (seed, sequence length, key tile, sizes, presets), as route_errors builds them
        (0, 128, 64, QUICK, ("hw_fp4_direct_p", "flamia_nvfp4")),
        (1, 128, 128, QUICK, ("hw_fp4_direct_p", "flamia_nvfp4")),
    ]
    experiments.use_devices([])
    numpy_rows = map_cases(experiments._route_error_case, jobs)
    experiments.use_devices(jax.local_devices())
    device_rows = map_cases(experiments._route_error_case, jobs, devices=jax.local_devices())
    experiments.use_devices([])
    out["report_sweep"] = {"equal": numpy_rows == device_rows, "rows": len(device_rows)}

    # data-parallel training steps of the study's transformer (emulated FP8 attention): 8
    # devices with the shard sum in shard order against one device accumulating 8 micro-batches
    import optax
    from jax.sharding import Mesh

    from fp4sim.parallel import accumulated_value_and_grad, data_parallel_value_and_grad
    from fp4sim.train import model as tmodel
    from fp4sim.train.config import ModelConfig
    from fp4sim.train.recipes import attention_fn, study_recipe

    cfg = ModelConfig(layers=1, width=64, heads=2, context=64)
    params = jax.tree_util.tree_map(lambda a: a[None], tmodel.init_params(jax.random.key(0), cfg))
    toks = jax.random.randint(jax.random.key(1), (1, 8, cfg.context + 1), 0, cfg.vocab)
    xb, yb = toks[..., :-1], toks[..., 1:]
    dmesh = Mesh(np.array(jax.devices()), ("data",))
    tx = optax.adam(1e-3)
    leaves = jax.tree_util.tree_leaves

    @jax.jit
    def update(p, o, g):
        u, o = tx.update(g, o, p)
        return optax.apply_updates(p, u), o

    out["data_parallel"] = {}
    for rname in ("jnp_float32", "direct_p_fp8_training"):
        attn = attention_fn(study_recipe(rname))

        def loss_sum(p, x, y, attn=attn):
            return tmodel.position_losses(p, x, y, attn, cfg).sum()

        dp = data_parallel_value_and_grad(loss_sum, mesh=dmesh, n_batch_args=2, batch_axis=1)
        acc = accumulated_value_and_grad(loss_sum, micro_batches=8, n_batch_args=2, batch_axis=1)

        def train(vg, steps=3):
            # the optimizer update is one compiled program shared by both runs: compiled into
            # each step, XLA may fuse (and contract) its float arithmetic differently
            grads_of = jax.jit(vg)
            p, o, hist, grads = params, tx.init(params), [], []
            for _ in range(steps):
                v, g = grads_of(p, xb, yb)
                p, o = update(p, o, g)
                hist.append(float(v))
                grads.append(g)
            return p, grads, hist

        p_dp, g_dp, h_dp = train(dp)
        p_acc, g_acc, h_acc = train(acc)
        g1 = [(np.asarray(a), np.asarray(b)) for a, b in zip(leaves(g_dp[0]), leaves(g_acc[0]))]
        out["data_parallel"][rname] = {
            "losses_equal": h_dp == h_acc,
            "grads_equal": all(
                same(a, b) for ga, gb in zip(g_dp, g_acc) for a, b in zip(leaves(ga), leaves(gb))
            ),
            "params_equal": all(same(a, b) for a, b in zip(leaves(p_dp), leaves(p_acc))),
            "loss_finite": bool(np.all(np.isfinite(h_dp))),
            # first step's gradients (same parameters): largest difference relative to the
            # leaf's largest magnitude
            "first_grad_max_rel": max(
                float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30)) for a, b in g1
            ),
        }

    errors = {}
    for label, fn in (
        (
            "heads_not_divisible",
            lambda: shard_attention_inputs(meshes["2x2x2"], q[:, :3], k[:, :3], v[:, :3]),
        ),
        (
            "query_not_divisible",
            lambda: shard_attention_inputs(meshes["1x1x8"], q[:, :, :100], k, v),
        ),
        ("product_mismatch", lambda: attention_mesh(batch=3, heads=2)),
    ):
        try:
            fn()
            errors[label] = "no error"
        except ValueError as e:
            errors[label] = f"ValueError: {e}"
    out["errors"] = errors
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()

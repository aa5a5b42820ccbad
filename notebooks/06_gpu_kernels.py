# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # The GPU kernels (Hopper, Pallas Mosaic GPU)
#
# fp4sim's kernels live in `fp4sim.kernels` and are imported explicitly (importing `fp4sim` never
# initialises a GPU backend). This notebook needs an NVIDIA Hopper GPU (sm_90a) with jax's CUDA
# backend; it is *not* executed in CI (the CPU tests run the same kernels in GPU interpret mode
# and cross-lower them for sm_90a instead).
#
# It shows how to call the kernels under `jax.jit`, and checks them against the emulators:
#
# 1. the FP8 attention forward (token-block E4M3 Q/K/V, E4M3 P, float32 accumulation), timed
#    beside cuDNN's bf16 attention;
# 2. at a small shape, its output against the kernel's own float64 reference of its numerics and
#    against exact attention.
#
# Tables are `fp4sim.report.Table` values (Jupyter renders them). `FP4SIM_SMALL=1` shrinks the
# shapes.

# %%
import math
import os
import time

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

import fp4sim
from fp4sim import kernels
from fp4sim.report import Table

SMALL = os.environ.get("FP4SIM_SMALL") == "1"
if not kernels.gpu_available():
    raise RuntimeError("this notebook needs an NVIDIA GPU visible to jax (CUDA backend)")
print("device:", jax.devices()[0].device_kind, "arch:", kernels.device_arch())

# %% [markdown]
# ## FP8 attention forward under jax.jit
#
# Shapes follow the kernel's convention: `q` (B, T, H, D), `k`/`v` (B, S, H, D). The config is a
# frozen, hashable value: a static argument of `jax.jit`.

# %%
B, T, H, D = (1, 256, 2, 128) if SMALL else (1, 4096, 8, 128)
key = jax.random.key(0)
kq, kk, kv = jax.random.split(key, 3)
q = jax.random.normal(kq, (B, T, H, D), jnp.bfloat16)
k = jax.random.normal(kk, (B, T, H, D), jnp.bfloat16)
v = jax.random.normal(kv, (B, T, H, D), jnp.bfloat16)

config = kernels.FP8AttentionConfig(
    conversion=kernels.PConversion.EXACT, out_type=kernels.OutType.FLOAT32
)
attn = jax.jit(lambda q, k, v: kernels.attention_fp8(q, k, v, config=config))
out, lse2 = attn(q, k, v)
out.block_until_ready()


def timeit(fn, *args, n=10):
    fn(*args)[0].block_until_ready()
    t0 = time.perf_counter()
    for _ in range(n):
        r = fn(*args)
    r[0].block_until_ready()
    return (time.perf_counter() - t0) / n


flops = 4 * B * H * T * T * D
t_fp8 = timeit(attn, q, k, v)
cudnn = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, implementation="cudnn"))
t_cudnn = timeit(lambda *a: (cudnn(*a),), q, k, v)
timings = {"fp4sim FP8 kernel": t_fp8, "cuDNN bf16": t_cudnn}
Table(
    title=f"Attention forward, B={B} T={T} H={H} D={D} (mean of 10 calls)",
    columns=("implementation", "time (ms)", "TFLOP/s", "time / cuDNN's"),
    rows=tuple(
        (name, f"{t * 1e3:.3f}", f"{flops / t / 1e12:.0f}", f"{t / t_cudnn:.2f}")
        for name, t in timings.items()
    ),
)

# %%
fig, ax = plt.subplots(figsize=(5.0, 2.4), layout="constrained")
ax.barh(list(timings), [flops / t / 1e12 for t in timings.values()])
ax.set_title(jax.devices()[0].device_kind)
ax.set_xlabel("TFLOP/s (4·B·H·T²·D per call)")
ax.grid(axis="x", alpha=0.3)

# %% [markdown]
# ## Checks at a small shape
#
# P codes, the running max and the tile exponents are bit-defined; the sums run in the tensor
# core's accumulation order, so O is compared with the kernel's float64 reference of its own
# numerics with a bound, and with exact attention beside cuDNN bf16.

# %%
ts = 256
qs, ks, vs = (x[:, :ts, :2] for x in (q, k, v))
o = np.asarray(attn(qs, ks, vs)[0], dtype=np.float64)
ops = kernels.quantize_operands(qs, ks, vs)
ref = kernels.reference_forward(
    jax.tree.map(np.asarray, ops), softmax_scale=1 / math.sqrt(D), config=config
)
err = np.abs(o - ref["o"]).max() / np.abs(ref["o"]).max()
print(f"max |O_kernel - O_reference| / max |O_reference| = {err:.2e}")

exact = fp4sim.attention_reference(
    *(np.swapaxes(np.asarray(x, np.float64), 1, 2) for x in (qs, ks, vs))
)
exact_o = np.swapaxes(np.asarray(exact.out), 1, 2)
o_cudnn = np.asarray(cudnn(qs, ks, vs), dtype=np.float64)
rows = []
for name, o_ in (("fp4sim FP8 kernel", o), ("cuDNN bf16", o_cudnn)):
    e = fp4sim.error_summary(o_, exact_o)
    rows.append((name, f"{e.cosine:.5f}", f"{e.rel_l2:.4f}"))
Table(
    title=f"Against exact attention (T = {ts})",
    columns=("output", "cosine", "relative L2"),
    rows=tuple(rows),
)

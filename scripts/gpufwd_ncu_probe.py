"""Device probe for Nsight Compute: one call each of fp4sim's FP8 attention forward (and the
configurations named on the command line) and cuDNN fp8 / bf16 at B2 S4096 H16 D128, inside a
cudaProfilerStart/Stop window, for ``ncu --profile-from-start off``.

    ncu --profile-from-start off --clock-control none --section SpeedOfLight \\
        --section WarpStateStats python scripts/gpufwd_ncu_probe.py [--causal]
"""

import argparse
import ctypes
import math
import os
import sys

sys.path.insert(0, os.getcwd())

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from fp4sim.benchmarks import gpu_attention as ga  # noqa: E402
from fp4sim.kernels import attention_mgpu as am  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--causal", action="store_true")
parser.add_argument("--no-peers", action="store_true")
args = parser.parse_args()
b, s, h, d = 2, 4096, 16, 128
scale = 1 / math.sqrt(d)
keys = jax.random.split(jax.random.key(0), 3)
q, k, v = (jax.random.normal(kk, (b, s, h, d), jnp.float32) for kk in keys)
ops = jax.jit(am.quantize_operands)(q, k, v)
cfg = am.FP8AttentionConfig(causal=args.causal)
runs = [("fp4sim_fp8", lambda: am.attention_fp8_quantized(ops, softmax_scale=scale, config=cfg)[0])]
if not args.no_peers:
    args8, call8, _ = ga._cudnn_fp8(q, k, v, scale, args.causal)
    call8 = jax.jit(call8)
    qb, kb, vb = (x.astype(jnp.bfloat16) for x in (q, k, v))
    cud = jax.jit(
        lambda a, b_, c_: jax.nn.dot_product_attention(
            a, b_, c_, scale=scale, is_causal=args.causal, implementation="cudnn"
        )
    )
    runs += [("cudnn_fp8", lambda: call8(*args8)), ("cudnn_bf16", lambda: cud(qb, kb, vb))]
for _, f in runs:  # compile and warm up outside the profiled window
    jax.block_until_ready(f())
    jax.block_until_ready(f())
lib = None
for name in ("libcudart.so", "libcudart.so.13", "libcudart.so.12"):
    try:
        lib = ctypes.CDLL(name)
        start, stop = lib.cudaProfilerStart, lib.cudaProfilerStop
        break
    except OSError:
        pass
if lib is None:
    lib = ctypes.CDLL("libcuda.so.1")
    start, stop = lib.cuProfilerStart, lib.cuProfilerStop
start()
for _, f in runs:
    jax.block_until_ready(f())
stop()
print("profiled:", [n for n, _ in runs])

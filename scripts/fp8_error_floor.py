"""Error floor of E4M3 attention operands: why "a third of cuDNN fp8's error" is out of reach.

Issue 8 asks for an FP8 forward with Q, K, V and P in E4M3 (token-block power-of-two scales for
Q/K/V, a per-32-key power-of-two scale for P) *and* at most a third of cuDNN fp8's relative L2
error (cuDNN fp8 measured 5.75e-2 on the H200, so the target is 1.92e-2). This script measures,
in float64 with ml_dtypes casts (nothing from fp4sim), the error that each operand's E4M3
rounding alone causes, everything else exact: if one operand alone exceeds the target, no kernel
with that operand format can meet it, whatever its accumulation.

    python scripts/fp8_error_floor.py [--seq 4096] [--head-dim 128] [--seeds 3]
"""

from __future__ import annotations

import argparse

import ml_dtypes
import numpy as np

E4M3 = ml_dtypes.float8_e4m3fn
CUDNN_FP8_REL_L2 = 5.75e-2  # H200, B2 S4096 H16 D128 non-causal (fp4sim bench gpu, 2026-11-29)


def token_block(x: np.ndarray, tokens: int = 32) -> np.ndarray:
    """E4M3 round trip with one power-of-two scale per ``tokens`` rows x the whole head dim,
    chosen so the block's amax lands in (224, 448]."""
    xb = x.reshape(-1, tokens, x.shape[1])
    e = np.ceil(np.log2(np.abs(xb).max(axis=(1, 2), keepdims=True) / 448.0))
    return ((xb / 2.0**e).astype(E4M3).astype(np.float64) * 2.0**e).reshape(x.shape)


def attention(q, k, v, p_e4m3: bool = False) -> np.ndarray:
    """Softmax attention in float64; optionally P rounded to E4M3 with a power-of-two scale per
    32 keys (block max in (224, 448]), normalized by the sum of the rounded weights."""
    s = q @ k.T / np.sqrt(q.shape[1])
    p = np.exp(s - s.max(axis=1, keepdims=True))
    if p_e4m3:
        pb = p.reshape(p.shape[0], -1, 32)
        e = np.ceil(np.log2(pb.max(axis=2, keepdims=True) / 448.0))
        p = ((pb / 2.0**e).astype(E4M3).astype(np.float64) * 2.0**e).reshape(p.shape)
    return (p @ v) / p.sum(axis=1, keepdims=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    cases = {
        "Q and K in E4M3": lambda q, k, v: attention(token_block(q), token_block(k), v),
        "V in E4M3": lambda q, k, v: attention(q, k, token_block(v)),
        "P in E4M3": lambda q, k, v: attention(q, k, v, p_e4m3=True),
        "all four in E4M3": lambda q, k, v: attention(
            token_block(q), token_block(k), token_block(v), p_e4m3=True
        ),
    }
    errs: dict[str, list[float]] = {name: [] for name in cases}
    for seed in range(args.seeds):
        rng = np.random.default_rng(seed)
        q, k, v = (rng.standard_normal((args.seq, args.head_dim)) for _ in range(3))
        ref = attention(q, k, v)
        for name, f in cases.items():
            out = f(q, k, v)
            errs[name].append(float(np.linalg.norm(out - ref) / np.linalg.norm(ref)))
    target = CUDNN_FP8_REL_L2 / 3
    print(
        f"S{args.seq} D{args.head_dim}, Gaussian q/k/v, {args.seeds} seeds; relative L2 of O "
        f"against float64 (min..max over seeds); target {target:.3e}"
    )
    for name, e in errs.items():
        verdict = "above the target" if min(e) > target else "within the target"
        print(f"  {name:18s} {min(e):.3e} .. {max(e):.3e}   {verdict}")


if __name__ == "__main__":
    main()

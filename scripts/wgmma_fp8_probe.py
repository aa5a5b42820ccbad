"""Measure Hopper's FP8 wgmma accumulation on the GPU and store operands + outputs.

Run on the H200 (from the repository root):

    PYTHONPATH=$PWD python scripts/wgmma_fp8_probe.py --out fp4sim/golden/data/wgmma_fp8_h200.npz

For every dataset and K it stores the E4M3 operand bytes ``a_<name>_<K>`` (64, K) and
``b_<name>_<K>`` (64, K), the FP8 wgmma result ``fp8_<name>_<K>`` (64, 64) float32 and the f16
wgmma result of the same values ``f16_<name>_<K>``. Datasets: ``normal`` (N(0, 2) rounded to
E4M3, every product exact), ``wide`` (N(0, 1)·2^U[-8, 8]: exponents spread, which exposes the
alignment width), ``onebig`` (one ±448 term per row among small ones: exposes truncation).
``fp4sim.formats.matmul.WgmmaFp8Model`` is fitted to these (tests/formats/test_matmul.py).
"""

from __future__ import annotations

import argparse
import json
import time

import ml_dtypes
import numpy as np

KS = (32, 64, 128, 256, 512)


def datasets(rng: np.random.Generator, k: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    e4 = ml_dtypes.float8_e4m3fn
    out = {}
    out["normal"] = (
        (rng.standard_normal((64, k)) * 2).astype(e4),
        (rng.standard_normal((64, k)) * 2).astype(e4),
    )
    spread = lambda: rng.standard_normal((64, k)) * np.exp2(rng.uniform(-8, 8, (64, k)))  # noqa
    out["wide"] = (np.clip(spread(), -448, 448).astype(e4), np.clip(spread(), -448, 448).astype(e4))
    a = (rng.standard_normal((64, k)) * 0.05).astype(np.float64)
    a[np.arange(64), rng.integers(0, k, 64)] = rng.choice([-448.0, 448.0], 64)
    out["onebig"] = (a.astype(e4), rng.standard_normal((64, k)).astype(e4))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=20261129)
    args = p.parse_args()
    import jax
    import jax.numpy as jnp

    from fp4sim.kernels.wgmma_probe import f16_wgmma, fp8_wgmma

    rng = np.random.default_rng(args.seed)
    store: dict[str, np.ndarray] = {}
    summary = {}
    t0 = time.time()
    for k in KS:
        for name, (a, b) in datasets(rng, k).items():
            ref = a.astype(np.float64) @ b.astype(np.float64).T
            o8 = np.asarray(jax.block_until_ready(fp8_wgmma(jnp.asarray(a), jnp.asarray(b))))
            o16 = np.asarray(
                jax.block_until_ready(
                    f16_wgmma(jnp.asarray(a.astype(np.float16)), jnp.asarray(b.astype(np.float16)))
                )
            )
            store[f"a_{name}_{k}"] = a.view(np.uint8)
            store[f"b_{name}_{k}"] = b.view(np.uint8)
            store[f"fp8_{name}_{k}"] = o8
            store[f"f16_{name}_{k}"] = o16
            r32 = ref.astype(np.float32)
            scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)).T
            summary[f"{name}_{k}"] = {
                "fp8_correctly_rounded": float(np.mean(o8 == r32)),
                "f16_correctly_rounded": float(np.mean(o16 == r32)),
                "fp8_max_err_rel_to_abs_sum": float(
                    np.max(np.abs(o8 - ref) / np.maximum(scale, 1e-30))
                ),
            }
            print(name, k, summary[f"{name}_{k}"], flush=True)
    store["meta"] = np.frombuffer(
        json.dumps(
            {
                "device": str(jax.devices()[0]),
                "jax": jax.__version__,
                "seed": args.seed,
                "seconds": time.time() - t0,
                "summary": summary,
            }
        ).encode(),
        dtype=np.uint8,
    )
    np.savez_compressed(args.out, **store)
    print("wrote", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

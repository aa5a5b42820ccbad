"""Run MMA-Sim (github.com/microsoft/MMA-Sim) on stored operands: a script for its side environment.

This file owns the one way fp4sim drives MMA-Sim: a chain of tensor-core instructions along K,
``D = mma(A_i, B_i, D)``, on uint8 operand and scale codes. It imports nothing from fp4sim and
needs only numpy, torch and an MMA-Sim checkout, so it runs under another interpreter (MMA-Sim
is not a dependency of fp4sim): ``python -m fp4sim bench mmasim`` calls it as

    <side python> fp4sim/benchmarks/mmasim_runner.py --mmasim <checkout> --inp IN.npz --out OUT.npz

and ``scripts/make_mmasim_vectors.py`` loads it by path. ``IN.npz``: ``a`` (M, K) and ``b``
(N, K) uint8 codes (one per byte), optionally ``sa`` (M, K/block), ``sb`` (N, K/block), ``c``
float32 (M, N), and ``spec`` (a JSON string: ``kind`` of :data:`KINDS`, ``formats``).
``OUT.npz``: ``d`` uint32 (M, N) result bits and ``seconds`` (wall time of the simulation).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

# kind: (MMA-Sim class, architecture, qualifier template, M tile, K per instruction,
#        default element formats, scale format, scale block)
KINDS = {
    "wgmma_e4m3": (
        "wgmma",
        "Hopper",
        "m64n{n}k32.f32.{a}.{b}",
        64,
        32,
        ("e4m3", "e4m3"),
        None,
        None,
    ),
    "wgmma_e5m2": (
        "wgmma",
        "Hopper",
        "m64n{n}k32.f32.{a}.{b}",
        64,
        32,
        ("e5m2", "e5m2"),
        None,
        None,
    ),
    "f8f6f4": (
        "tcgen05mma",
        "Blackwell",
        "m128n{n}k32.f32.{a}.{b}",
        128,
        32,
        ("e4m3", "e5m2"),
        None,
        None,
    ),
    "mxf8f6f4": (
        "tcgen05mma_block_scale",
        "Blackwell",
        "m128n{n}k32.block32.f32.{a}.{b}.ue8m0",
        128,
        32,
        ("e4m3", "e5m2"),
        "ue8m0",
        32,
    ),
    "mxf4": (
        "tcgen05mma_block_scale",
        "Blackwell",
        "m128n{n}k64.block32.f32.e2m1.e2m1.ue8m0",
        128,
        64,
        ("e2m1", "e2m1"),
        "ue8m0",
        32,
    ),
    "mxf4nvf4_ue8m0": (
        "tcgen05mma_block_scale",
        "Blackwell",
        "m128n{n}k64.block16.f32.e2m1.e2m1.ue8m0",
        128,
        64,
        ("e2m1", "e2m1"),
        "ue8m0",
        16,
    ),
    "mxf4nvf4_ue4m3": (
        "tcgen05mma_block_scale",
        "Blackwell",
        "m128n{n}k64.block16.f32.e2m1.e2m1.ue4m3",
        128,
        64,
        ("e2m1", "e2m1"),
        "ue4m3",
        16,
    ),
}


def load_mmasim(src: str):
    """MMA-Sim's simulator module ``mmasim.simulator.nv_ptx`` from the checkout ``src``."""
    sys.path.insert(0, str(Path(src).resolve()))
    from mmasim.simulator import nv_ptx

    return nv_ptx


def run_chain(torch, mmasim, kind, fmts, a, b, sa, sb, c):
    """MMA-Sim's D (uint32 bits, (M, N)) for a (M, K), b (N, K) codes, scale codes sa (M, K/blk)
    and sb (N, K/blk) or None, initial accumulator c (M, N); M a multiple of the kind's tile,
    N a multiple of 8 up to 256."""
    cls_name, arch, qual, tile, kk, _, scale, block = KINDS[kind]
    dts = {
        "e4m3": torch.float8_e4m3fn,
        "e5m2": torch.float8_e5m2,
        "ue8m0": torch.float8_e8m0fnu,
        "ue4m3": torch.float8_e4m3fn,
    }
    op = getattr(mmasim, cls_name)(arch, qual.format(n=c.shape[1], a=fmts[0], b=fmts[1]))
    out = np.zeros(c.shape, np.uint32)
    K = a.shape[1]
    for r in range(0, a.shape[0], tile):
        rows = slice(r, r + tile)
        d = torch.from_numpy(np.ascontiguousarray(c[rows]))
        for start in range(0, K, kk):
            ai, bi = a[rows, start : start + kk], b[:, start : start + kk]
            if fmts[0] == "e2m1":  # packed, element 2i in the low nibble
                A = torch.from_numpy((ai[:, 0::2] | (ai[:, 1::2] << 4)).astype(np.uint8))
                B = torch.from_numpy(
                    np.ascontiguousarray((bi[:, 0::2] | (bi[:, 1::2] << 4)).astype(np.uint8).T)
                )
            else:
                A = torch.from_numpy(np.ascontiguousarray(ai)).view(dts[fmts[0]])
                B = torch.from_numpy(np.ascontiguousarray(bi.T)).view(dts[fmts[1]])
            if scale is None:
                d = op(A, B, d)
            else:
                s0, s1 = start // block, (start + kk) // block
                SA = torch.from_numpy(np.ascontiguousarray(sa[rows, s0:s1])).view(dts[scale])
                SB = torch.from_numpy(np.ascontiguousarray(sb[:, s0:s1].T)).view(dts[scale])
                d = op(A, B, d, SA, SB)
        out[rows] = d.numpy().view(np.uint32)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--mmasim", required=True, help="a checkout of github.com/microsoft/MMA-Sim")
    p.add_argument("--inp", required=True, help="operands (.npz)")
    p.add_argument("--out", required=True, help="result (.npz)")
    args = p.parse_args(argv)
    import torch

    mmasim = load_mmasim(args.mmasim)
    data = np.load(args.inp)
    spec = json.loads(str(data["spec"]))
    sa = data["sa"] if "sa" in data.files else None
    sb = data["sb"] if "sb" in data.files else None
    c = (
        data["c"]
        if "c" in data.files
        else np.zeros((data["a"].shape[0], data["b"].shape[0]), np.float32)
    )
    t0 = time.perf_counter()
    d = run_chain(
        torch, mmasim, spec["kind"], tuple(spec["formats"]), data["a"], data["b"], sa, sb, c
    )
    seconds = time.perf_counter() - t0
    np.savez(args.out, d=d, seconds=np.float64(seconds), torch=np.array(torch.__version__))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

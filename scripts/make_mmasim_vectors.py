"""Write MMA-Sim's outputs for tensor-core MMA instructions as test vectors for fp4sim.formats.mma.

MMA-Sim (github.com/microsoft/MMA-Sim, arXiv:2511.10909) is a bit-accurate reference model of
NVIDIA tensor cores written with PyTorch. This script runs it on the CPU in a side environment
(it is not a dependency of fp4sim and none of its code is copied here) and stores, per
instruction kind, the operand codes, the block-scale codes, the initial accumulator and MMA-Sim's
float32 result bits:

    python3.11 -m venv /work/mmasim-venv && /work/mmasim-venv/bin/pip install torch==2.13.0 numpy
    git clone https://github.com/microsoft/MMA-Sim /work/mmasim-src
    /work/mmasim-venv/bin/python scripts/make_mmasim_vectors.py --mmasim /work/mmasim-src \
        --out fp4sim/golden/data/mmasim

Each kind gets 6 calls (``normal``, ``chain``, ``cancel``, ``wide``, ``subnormal``,
``special``), each an M x N result of a chain of instructions along K (D = mma(A_i, B_i, D)),
so 12,288 dot products per kind (M = 128 x N = 16 for tcgen05, M = 64 x N = 32 for Hopper). Arrays of call ``<kind>.<label>``: ``a`` uint8 codes (M, K) one per byte, ``b``
uint8 (N, K), ``sa`` uint8 (M, K / block), ``sb`` uint8 (N, K / block) (absent without block
scales), ``c`` float32 (M, N) the initial accumulator, ``d`` uint32 (M, N) MMA-Sim's result bits.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib.util
import json
import platform
import subprocess
import time
from pathlib import Path

import numpy as np

SEED = 20261202
N = 16
N_WGMMA = 32  # M = 64: twice as many columns for the same count

_RUNNER = Path(__file__).resolve().parents[1] / "fp4sim" / "benchmarks" / "mmasim_runner.py"
_spec = importlib.util.spec_from_file_location("mmasim_runner", _RUNNER)
runner = importlib.util.module_from_spec(_spec)  # numpy only: no fp4sim import in the side env
_spec.loader.exec_module(runner)
KINDS = runner.KINDS
# the f8f6f4 kinds use mixed element types: rows of A E4M3 x columns of B E5M2 in half the
# calls, the other way round in the rest (MMA-Sim's e2m1 path of these kinds is not usable)
CALLS = ("normal", "chain", "cancel", "wide", "subnormal", "special")
CHAIN = {"normal": 1, "chain": 4, "cancel": 2, "wide": 2, "subnormal": 1, "special": 1}

_FINITE = {
    "e4m3": [c for c in range(256) if c & 0x7F != 0x7F],
    "e5m2": [c for c in range(256) if c & 0x7C != 0x7C],
    "e2m1": list(range(16)),
}
_SUBNORMAL = {
    "e4m3": [c | s for c in range(0, 8) for s in (0, 0x80)],
    "e5m2": [c | s for c in range(0, 4) for s in (0, 0x80)],
    "e2m1": [0, 1, 8, 9],
}
_SIGN = {"e4m3": 0x80, "e5m2": 0x80, "e2m1": 0x8}


def _torch_codes(torch, x, fmt):
    """float -> element codes via torch's own casts (RNE, E2M1 by table)."""
    if fmt == "e2m1":
        grid = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])
        mag = np.abs(x)
        idx = np.argmin(np.abs(mag[..., None] - grid), axis=-1)
        return (idx | np.where(x < 0, 8, 0)).astype(np.uint8)
    dt = torch.float8_e4m3fn if fmt == "e4m3" else torch.float8_e5m2
    t = torch.from_numpy(np.clip(x, -448, 448).astype(np.float32)).to(dt)
    return t.view(torch.uint8).numpy().copy()


def _data(torch, rng, label, fmts, m, n, k, nblk, scale):
    """Codes a (m, k), b (n, k), scale codes (m, nblk), (n, nblk), c (m, n) for one call."""
    fa, fb = fmts

    def normal(rows, fmt):
        std = 2.0 if fmt == "e2m1" else 3.0
        return _torch_codes(torch, rng.standard_normal((rows, k)) * std, fmt)

    def uniform(rows, fmt, pool):
        return rng.choice(np.array(pool, np.uint8), size=(rows, k))

    def scales(rows, lo, hi):
        if scale == "ue8m0":
            return rng.integers(lo, hi + 1, (rows, nblk)).astype(np.uint8)
        # UE4M3: the exponent field of the same exponents (clipped to 0..15), any mantissa
        field = np.clip(rng.integers(lo, hi + 1, (rows, nblk)) - 120, 0, 15)
        code = (field << 3) | rng.integers(0, 8, (rows, nblk))
        return np.where(code == 0x7F, 0x7E, code).astype(np.uint8)

    c = np.zeros((m, n), np.float32)
    if label == "normal":
        a, b = normal(m, fa), normal(n, fb)
        sa, sb = scales(m, 124, 130), scales(n, 124, 130)
    elif label == "chain":
        a, b = normal(m, fa), normal(n, fb)
        sa, sb = scales(m, 119, 135), scales(n, 119, 135)
        c = (rng.standard_normal((m, n)) * 4).astype(np.float32)
    elif label == "cancel":
        a, b = normal(m, fa), normal(n, fb)
        half = k // 2
        a[:, half:] = a[:, :half] ^ np.uint8(_SIGN[fa])  # the second instruction's A = -first
        b[:, half:] = b[:, :half]
        sa, sb = scales(m, 126, 128), scales(n, 126, 128)
        sa[:, nblk // 2 :] = sa[:, : nblk // 2]
        sb[:, nblk // 2 :] = sb[:, : nblk // 2]
        # a few small terms survive the cancellation (they sit far below the largest term)
        rows = rng.integers(0, m, m // 2)
        cols = rng.integers(0, k, m // 2)
        a[rows, cols] = rng.choice(np.array(_SUBNORMAL[fa], np.uint8), m // 2)
    elif label == "wide":
        a, b = uniform(m, fa, _FINITE[fa]), uniform(n, fb, _FINITE[fb])
        sa, sb = scales(m, 100, 150), scales(n, 100, 150)
    elif label == "subnormal":
        a, b = uniform(m, fa, _FINITE[fa]), uniform(n, fb, _FINITE[fb])
        half = m // 2
        a[:half] = uniform(half, fa, _SUBNORMAL[fa])
        # results near and below float32's smallest normal 2^-126
        if scale is None:
            sa, sb = None, None
        else:
            sa, sb = scales(m, 50, 75), scales(n, 50, 75)
            if scale == "ue4m3":  # the smallest UE4M3 scales (subnormal ones included)
                sa = rng.integers(0, 16, (m, nblk)).astype(np.uint8)
                sb = rng.integers(0, 16, (n, nblk)).astype(np.uint8)
    else:  # special
        a, b = uniform(m, fa, _FINITE[fa]), uniform(n, fb, _FINITE[fb])
        sa, sb = scales(m, 120, 134), scales(n, 120, 134)
        c = (rng.standard_normal((m, n)) * 8).astype(np.float32)
        q = m // 8
        # rows 0..q: overflow (the largest scales / the largest elements)
        a[:q] = uniform(
            q,
            fa,
            [x for x in _FINITE[fa] if (x & ~_SIGN[fa]) >= (max(_FINITE[fa]) & ~_SIGN[fa]) - 3],
        )
        if scale == "ue8m0":
            sa[:q] = rng.integers(240, 255, (q, nblk))
            sb[:, :] = np.where(rng.random((n, nblk)) < 0.5, sb, 250).astype(np.uint8)
        elif scale == "ue4m3":
            sa[:q] = 0x7E  # 448
            sb[:, :] = np.where(rng.random((n, nblk)) < 0.5, sb, 0x7E).astype(np.uint8)
        # rows q..2q: a NaN scale in one block (or NaN / Inf elements without scales)
        if scale is not None:
            sa[q : 2 * q, 0] = 0xFF if scale == "ue8m0" else 0x7F
        else:
            bad = {"e4m3": [0x7F, 0xFF], "e5m2": [0x7C, 0xFC, 0x7E]}[fa]
            # one special element per row: +-Inf (a row of Inf, or NaN with an Inf of the other
            # sign among the columns' products) or NaN
            a[np.arange(q, 2 * q), rng.integers(0, k, q)] = rng.choice(np.array(bad, np.uint8), q)
            # the largest finite accumulators: round-toward-zero keeps them finite
            c[:q] = np.where(rng.random((q, n)) < 0.5, 3.4028235e38, -3.4028235e38)
        # rows 2q..3q: all elements zero (with large scales), a non-zero accumulator
        a[2 * q : 3 * q] = 0
        if scale == "ue8m0":
            sa[2 * q : 3 * q] = 200
        # rows 3q..4q: the smallest scales (E8M0 2^-127) / zero UE4M3 scales
        if scale == "ue8m0":
            sa[3 * q : 4 * q] = 0
        elif scale == "ue4m3":
            sa[3 * q : 4 * q] = np.where(rng.random((q, nblk)) < 0.5, 0, 0x80).astype(np.uint8)
        # rows 4q..5q: exact zeros of the dot product with a zero accumulator
        c[4 * q : 5 * q] = 0
        a[4 * q : 5 * q] = 0
        # rows 5q..6q: negative zero accumulators
        c[5 * q : 6 * q] = -0.0
        # rows 6q..7q: float32-subnormal accumulators
        c[6 * q : 7 * q] = (
            rng.integers(1, 1 << 23, (q, n)).astype(np.uint32)
            | np.where(rng.random((q, n)) < 0.5, 0, 1 << 31).astype(np.uint32)
        ).view(np.float32)
        a[6 * q : 7 * q] = 0  # zero elements and the smallest scales keep the accumulator
        if scale is not None:
            sa[6 * q : 7 * q] = 0
    if scale is None:
        sa = sb = None
    return a, b, sa, sb, c


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--mmasim", required=True, help="a checkout of github.com/microsoft/MMA-Sim")
    p.add_argument("--out", required=True, help="output folder")
    args = p.parse_args(argv)
    import torch

    src = Path(args.mmasim).resolve()
    mmasim = runner.load_mmasim(str(src))

    commit = subprocess.run(
        ["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    arrays, summary = {}, {}
    t_all = time.time()
    for kind, (_, _, _, m, kk, fmts, scale, block) in KINDS.items():
        t0 = time.time()
        count = 0
        for i, label in enumerate(CALLS):
            f = fmts if (i % 2 == 0 or fmts[0] == fmts[1]) else fmts[::-1]
            K = kk * CHAIN[label]
            nblk = K // block if block else 0
            n = N_WGMMA if kind.startswith("wgmma") else N
            a, b, sa, sb, c = _data(torch, rng, label, f, m, n, K, nblk, scale)
            d = runner.run_chain(torch, mmasim, kind, f, a, b, sa, sb, c)
            key = f"{kind}.{label}"
            arrays[f"{key}.a"], arrays[f"{key}.b"] = a, b
            if sa is not None:
                arrays[f"{key}.sa"], arrays[f"{key}.sb"] = sa, sb
            arrays[f"{key}.c"], arrays[f"{key}.d"] = c, d
            arrays[f"{key}.formats"] = np.array(list(f) + [scale or "", str(block or 0)])
            count += d.size
        summary[kind] = {"dot_products": count, "seconds": round(time.time() - t0, 1)}
        print(f"{kind}: {count} dot products, {time.time() - t0:.1f} s", flush=True)
    path = out / "mmasim_vectors.npz"
    np.savez_compressed(path, **arrays)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    meta = {
        "mmasim_commit": commit,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "seed": SEED,
        "n": N,
        "kinds": summary,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "seconds": round(time.time() - t_all, 1),
    }
    (out / "mmasim_vectors.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    total = sum(v["dot_products"] for v in summary.values())
    rows = "\n".join(
        f"| `{k}` | {KINDS[k][2].format(n=N_WGMMA if k.startswith('wgmma') else N, a='A', b='B')}"
        f" | {v['dot_products']} |"
        for k, v in summary.items()
    )
    (out / "PROVENANCE.md").write_text(f"""# Provenance of the MMA-Sim vectors

Written by `scripts/make_mmasim_vectors.py` (do not edit by hand; rerun the script).

- MMA-Sim: github.com/microsoft/MMA-Sim at commit `{commit}` (arXiv:2511.10909), run on the CPU
- {meta["date"]}; torch {meta["torch"]}, numpy {meta["numpy"]}, Python {meta["python"]}; seed {SEED}
- command: `/work/mmasim-venv/bin/python scripts/make_mmasim_vectors.py --mmasim <checkout> --out fp4sim/golden/data/mmasim`
- `mmasim_vectors.npz` sha256 `{sha}`: {total} dot products; per call `<kind>.<label>.{{a,b,sa,sb,c,d,formats}}`
  (see the script's docstring); `mmasim_vectors.json`: the same facts as JSON.

| kind | MMA-Sim instruction | dot products |
|---|---|---|
{rows}
""")
    print(f"wrote {path} ({total} dot products, sha256 {sha[:16]}..., MMA-Sim {commit[:7]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

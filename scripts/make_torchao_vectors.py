"""Write torchao reference vectors to fp4sim/golden/data/presets/torchao_*.npz (+ PROVENANCE.md).

This script owns the third-party reference vectors that fp4sim's presets and layouts are
checked against. It runs **outside** fp4sim's environment, in a side venv with torch and torchao
(the torch wheel provided here is for Python 3.11), and imports nothing from fp4sim::

    /root/.pyenv/versions/3.11.7/bin/python -m venv /tmp/torchao_venv
    /tmp/torchao_venv/bin/pip install \
        /opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl \
        torchao numpy ml_dtypes
    /tmp/torchao_venv/bin/python scripts/make_torchao_vectors.py [--out fp4sim/golden/data/presets]

Every array is stored with a plain dtype (uint8 codes/scales, float32 values, '<U' labels), so
the files load with ``np.load`` without pickle. Inputs are crafted to hit the disagreement cases
of the torchao measurements: E8M0 scale rules (amax 3.5/5/6.1/7 for E2M1, 449-511.9/957 for
E4M3), exact ties, tiny/zero/subnormal blocks, f32-max blocks, NaN and ±Inf blocks, plus random
normal and heavy-tailed rows. What each file holds is listed in PROVENANCE.md, which this
script rewrites together with the files.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import io
import math
import platform
import sys
import zipfile
from pathlib import Path

import ml_dtypes
import numpy as np

try:
    import torch
    import torchao
    from torchao.prototype.mx_formats import kernels as ao_kernels
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.constants import DTYPE_FP6_E2M3, DTYPE_FP6_E3M2
    from torchao.prototype.mx_formats.mx_tensor import to_dtype, to_mx
    from torchao.prototype.mx_formats.nvfp4_tensor import (
        NVFP4Tensor,
        nvfp4_quantize,
        per_tensor_amax_to_scale,
    )
    from torchao.prototype.mx_formats.utils import from_blocked, to_blocked
except ImportError as e:  # pragma: no cover - only runs in the side venv
    sys.exit(
        f"make_torchao_vectors.py needs torch + torchao (run it in the side venv, see the "
        f"module docstring): {e}"
    )

SEED = 20261129
MX_BLOCK = 32
NV_BLOCK = 16

# (file tag, torchao elem dtype, ml_dtypes twin for the tie tables, element max)
MX_ELEMS = [
    ("e2m1", torch.float4_e2m1fn_x2, ml_dtypes.float4_e2m1fn, 6.0),
    ("e4m3", torch.float8_e4m3fn, ml_dtypes.float8_e4m3fn, 448.0),
    ("e5m2", torch.float8_e5m2, ml_dtypes.float8_e5m2, 57344.0),
    ("e2m3", DTYPE_FP6_E2M3, ml_dtypes.float6_e2m3fn, 7.5),
    ("e3m2", DTYPE_FP6_E3M2, ml_dtypes.float6_e3m2fn, 28.0),
]
MODES = [
    ScaleCalculationMode.FLOOR,
    ScaleCalculationMode.RCEIL,
    ScaleCalculationMode.CEIL,
    ScaleCalculationMode.EVEN,
]


def positive_values(np_dtype) -> np.ndarray:
    """Sorted finite non-negative values of a small ml_dtypes format."""
    bits = 8 if np.dtype(np_dtype).itemsize == 1 else 16
    codes = np.arange(1 << bits, dtype=np.uint8 if bits == 8 else np.uint16)
    vals = codes.view(np_dtype).astype(np.float64)
    vals = vals[np.isfinite(vals) & (vals >= 0)]
    return np.unique(vals)


def row_with_amax(rng, amax: float, n: int, *, negative: bool = False) -> np.ndarray:
    r = rng.uniform(-amax, amax, size=n).astype(np.float32)
    r[int(rng.integers(n))] = -amax if negative else amax
    return r


def mx_rows(elem_max: float, np_dtype, rng) -> tuple[np.ndarray, list[str]]:
    """Crafted (n, 32) float32 rows for an MX element format, one case per row."""
    rows, labels = [], []

    def add(label, r):
        r = np.asarray(r, dtype=np.float32)
        assert r.shape == (MX_BLOCK,), (label, r.shape)
        rows.append(r)
        labels.append(label)

    # E8M0 scale-rule disagreements: amax relative to the element max (and the values of the scale-rule table)
    e_m = math.floor(math.log2(elem_max))
    for rel in (
        0.5,
        0.5833333,
        0.75,
        0.8333333,
        1.0,
        1.0166667,
        1.0020,
        1.1160714,
        1.140625,
        1.1666667,
        1.25,
        1.5,
        1.75,
        1.875,
        1.9375,
        1.99,
    ):
        amax = np.float32(rel * elem_max)
        add(f"amax={float(amax):.9g}", row_with_amax(rng, float(amax), MX_BLOCK))
    for amax in (3.5, 5.0, 6.1, 7.0, 449.0, 500.0, 511.9, 957.0):
        add(f"amax_table={amax}", row_with_amax(rng, amax, MX_BLOCK, negative=True))
    # exact power-of-two amax at the element max's binade and just below it
    add("amax=2^e_M", row_with_amax(rng, 2.0**e_m, MX_BLOCK))
    add(
        "amax=nextbelow(2^(e_M+1))",
        row_with_amax(
            rng, float(np.nextafter(np.float32(2.0 ** (e_m + 1)), np.float32(0))), MX_BLOCK
        ),
    )
    # element ties at scale 1: the row's max is the element max, the rest are midpoints
    vals = positive_values(np_dtype)
    mids = ((vals[1:] + vals[:-1]) / 2).astype(np.float32)
    for start in range(0, len(mids), 15):
        chunk = mids[start : start + 15]
        r = np.zeros(MX_BLOCK, np.float32)
        r[0] = elem_max
        r[1 : 1 + len(chunk)] = chunk
        r[16 : 16 + len(chunk)] = -chunk
        add(f"ties_scale1[{start}:{start + len(chunk)}]", r)
        if start >= 60:  # E4M3/E5M2: a sample of the tie table is enough
            break
    # ties one binade up (scale 2): everything doubled
    r = np.zeros(MX_BLOCK, np.float32)
    r[0] = 2 * elem_max
    r[1 : 1 + min(15, len(mids))] = 2 * mids[:15]
    add("ties_scale2", r)
    # zeros, signed zeros, tiny and subnormal blocks, huge blocks
    add("all_zero", np.zeros(MX_BLOCK))
    add("all_negzero", np.full(MX_BLOCK, -0.0))
    r = np.zeros(MX_BLOCK, np.float32)
    r[3] = np.float32(2.0**-149)
    add("one_min_subnormal", r)
    add("f32_subnormals", rng.uniform(-1e-39, 1e-39, MX_BLOCK))
    add("amax=2^-126", row_with_amax(rng, 2.0**-126, MX_BLOCK))
    add("amax=2^-120", row_with_amax(rng, 2.0**-120, MX_BLOCK))
    add("amax=1e-30_mixed_1e-40", np.where(np.arange(MX_BLOCK) % 2 == 0, 1e-30, 1e-40))
    add("amax=3e38", row_with_amax(rng, 3e38, MX_BLOCK))
    add("amax=f32max", row_with_amax(rng, float(np.finfo(np.float32).max), MX_BLOCK))
    # random rows
    for i in range(4):
        add(f"normal[{i}]", rng.standard_normal(MX_BLOCK))
    for i in range(4):
        add(f"lognormal_s2[{i}]", rng.lognormal(0.0, 2.0, MX_BLOCK) * rng.choice([-1, 1], MX_BLOCK))
    return np.stack(rows), labels


def special_rows(rng) -> tuple[np.ndarray, list[str]]:
    rows, labels = [], []
    for label, val in (("nan", np.nan), ("pos_inf", np.inf), ("neg_inf", -np.inf)):
        r = rng.standard_normal(MX_BLOCK).astype(np.float32)
        r[5] = val
        rows.append(r)
        labels.append(label)
    return np.stack(rows), labels


def mx_codes(data_lp, elem_dtype) -> tuple[np.ndarray, np.ndarray | None]:
    """(one code per byte, torchao's packed bytes or None)."""
    if elem_dtype == torch.float4_e2m1fn_x2:
        packed = data_lp.view(torch.uint8).contiguous()
        return ao_kernels.unpack_uint4(packed).numpy(), packed.numpy()
    if elem_dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return data_lp.view(torch.uint8).numpy(), None
    return data_lp.to(torch.uint8).numpy(), None  # FP6: already one code per byte


def run_mx(x: np.ndarray, elem_dtype, mode) -> dict[str, np.ndarray]:
    xt = torch.from_numpy(x.copy())
    scale, data_lp = to_mx(xt, elem_dtype, MX_BLOCK, scaling_mode=mode)
    codes, packed = mx_codes(data_lp, elem_dtype)
    deq = to_dtype(data_lp, scale, elem_dtype, MX_BLOCK, torch.float32)
    out = {
        "scales": scale.view(torch.uint8).numpy().reshape(x.shape[0], -1),
        "codes": codes.reshape(x.shape),
        "dequant": deq.numpy().astype(np.float32),
    }
    if packed is not None:
        out["packed"] = packed.reshape(x.shape[0], -1)
    return out


def nv_rows(rng) -> tuple[np.ndarray, list[str]]:
    """Crafted (n, 16) finite float32 rows for NVFP4."""
    rows, labels = [], []

    def add(label, r):
        r = np.asarray(r, dtype=np.float32)
        assert r.shape == (NV_BLOCK,), (label, r.shape)
        rows.append(r)
        labels.append(label)

    e2m1 = positive_values(ml_dtypes.float4_e2m1fn)
    mids = ((e2m1[1:] + e2m1[:-1]) / 2).astype(np.float32)
    e4m3 = positive_values(ml_dtypes.float8_e4m3fn)
    # block scales that are E4M3 ties (amax = 6 * midpoint of two E4M3 values)
    e4m3_mids = (e4m3[1:] + e4m3[:-1]) / 2
    for s in (0.65625, 0.015625 * 1.0625, 1.0625, 17.0, 240.0, 416.0):
        add(f"e4m3_tie_scale={s}", row_with_amax(rng, 6.0 * s, NV_BLOCK))
    for s in e4m3_mids[[40, 70, 100]]:
        add(f"e4m3_tie_scale={float(s)}", row_with_amax(rng, 6.0 * float(s), NV_BLOCK))
    # exact E2M1 ties x = t * s for exact E4M3 scales s (block amax 6 s)
    for s in (1.0, 0.625, 0.6875, 3.25, 0.01953125):
        r = np.zeros(NV_BLOCK, np.float32)
        r[0] = 6.0 * s
        r[1:8] = mids * np.float32(s)
        r[8:15] = -mids * np.float32(s)
        add(f"e2m1_ties_scale={s}", r)
    # amax at and around the top of the E4M3 scale range
    for amax in (2688.0, 2700.0, 3000.0, 448.0 * 6.5):
        add(f"amax={amax}", row_with_amax(rng, amax, NV_BLOCK))
    # tiny blocks below torchao's 2^-6 clamp, subnormal E4M3 scales, zeros
    for amax in (6.0 * 2.0**-6, 0.05, 0.01, 6.0 * 2.0**-9, 1e-6, 1e-30):
        add(f"amax={amax:g}", row_with_amax(rng, amax, NV_BLOCK))
    add("all_zero", np.zeros(NV_BLOCK))
    add("all_negzero", np.full(NV_BLOCK, -0.0))
    add("f32_subnormals", rng.uniform(-1e-39, 1e-39, NV_BLOCK))
    for i in range(4):
        add(f"normal[{i}]", rng.standard_normal(NV_BLOCK))
    for i in range(4):
        add(f"lognormal_s2[{i}]", rng.lognormal(0.0, 2.0, NV_BLOCK) * rng.choice([-1, 1], NV_BLOCK))
    return np.stack(rows), labels


def run_nvfp4(x: np.ndarray, per_tensor_scale) -> dict[str, np.ndarray]:
    xt = torch.from_numpy(x.copy())
    pts = None if per_tensor_scale is None else torch.tensor(per_tensor_scale, dtype=torch.float32)
    scales, packed = nvfp4_quantize(xt, NV_BLOCK, pts)
    t = NVFP4Tensor(packed, scales, NV_BLOCK, torch.float32, pts)
    packed_np = packed.view(torch.uint8).contiguous()
    out = {
        "scales": scales.view(torch.uint8).numpy().reshape(x.shape[0], -1),
        "packed": packed_np.numpy().reshape(x.shape[0], -1),
        "codes": ao_kernels.unpack_uint4(packed_np).numpy().reshape(x.shape),
        "dequant": t.dequantize(torch.float32).numpy().astype(np.float32),
    }
    if pts is not None:
        out["per_tensor_scale"] = np.float32(pts.item()).reshape(())
    return out


def element_inputs() -> np.ndarray:
    """Crafted float32 inputs for the element casts: every midpoint of every format, specials."""
    xs = [
        np.array(
            [
                0.0,
                -0.0,
                np.nan,
                np.inf,
                -np.inf,
                2.0**-149,
                1e-39,
                1e30,
                -1e30,
                5.9,
                6.0,
                6.1,
                7.0,
                7.5,
                7.75,
                28.0,
                30.0,
                448.0,
                464.0,
                465.0,
                480.0,
                57344.0,
                61440.0,
                61441.0,
            ],
            dtype=np.float64,
        )
    ]
    for dt in (
        ml_dtypes.float4_e2m1fn,
        ml_dtypes.float6_e2m3fn,
        ml_dtypes.float6_e3m2fn,
        ml_dtypes.float8_e4m3fn,
        ml_dtypes.float8_e5m2,
    ):
        v = positive_values(dt)
        xs += [v, (v[1:] + v[:-1]) / 2]
    x = np.concatenate(xs)
    x = np.concatenate([x, -x])
    return x.astype(np.float32)


def elements() -> dict[str, np.ndarray]:
    x = element_inputs()
    xt = torch.from_numpy(x.copy())
    fin = torch.nan_to_num(xt, nan=0.0)  # torch float8 casts of NaN are NaN codes; keep both
    return {
        "x": x,
        "e2m1": ao_kernels.f32_to_f4_unpacked(xt).numpy(),
        "e2m3": ao_kernels.f32_to_f6_e2m3_unpacked(xt).numpy(),
        "e3m2": ao_kernels.f32_to_f6_e3m2_unpacked(xt).numpy(),
        "e4m3_torch_cast": xt.to(torch.float8_e4m3fn).view(torch.uint8).numpy(),
        "e5m2_torch_cast": xt.to(torch.float8_e5m2).view(torch.uint8).numpy(),
        "e4m3_torch_cast_nonan": fin.to(torch.float8_e4m3fn).view(torch.uint8).numpy(),
    }


def swizzle(rng) -> dict[str, np.ndarray]:
    out = {}
    for rows, cols in ((128, 4), (130, 6), (1, 1), (257, 9), (64, 2), (256, 8)):
        s = rng.integers(1, 255, size=(rows, cols), dtype=np.uint8)
        b = to_blocked(torch.from_numpy(s)).numpy()
        back = from_blocked(torch.from_numpy(b), rows, cols).numpy()
        assert (back == s).all(), "torchao from_blocked does not invert to_blocked"
        out[f"scales_{rows}x{cols}"] = s
        out[f"blocked_{rows}x{cols}"] = b.astype(np.uint8)
    # to_mx with is_swizzled_scales=True on a batched input: torchao swizzles the flattened
    # (batch*rows, cols) matrix and then views it per batch, which only works when rows % 128 == 0
    x = rng.standard_normal((2, 128, 128)).astype(np.float32)
    xt = torch.from_numpy(x)
    plain, _ = to_mx(xt, torch.float8_e4m3fn, MX_BLOCK, scaling_mode=ScaleCalculationMode.RCEIL)
    swz, _ = to_mx(
        xt,
        torch.float8_e4m3fn,
        MX_BLOCK,
        scaling_mode=ScaleCalculationMode.RCEIL,
        is_swizzled_scales=True,
    )
    out["mx_batched_x"] = x
    out["mx_batched_scales_plain"] = plain.view(torch.uint8).numpy()
    out["mx_batched_scales_swizzled"] = swz.view(torch.uint8).numpy()
    errors = []
    for shape in ((2, 130, 128), (2, 64, 128)):
        try:
            to_mx(torch.zeros(shape), torch.float8_e4m3fn, MX_BLOCK, is_swizzled_scales=True)
            errors.append(f"{shape}: ok")
        except Exception as e:
            errors.append(f"{shape}: {type(e).__name__}: {e}")
    out["mx_batched_unaligned_result"] = np.array(errors)
    x2 = rng.standard_normal((130, 64)).astype(np.float32)
    nv = NVFP4Tensor.to_nvfp4(torch.from_numpy(x2), is_swizzled_scales=True)
    nv_plain = NVFP4Tensor.to_nvfp4(torch.from_numpy(x2))
    out["nvfp4_x"] = x2
    out["nvfp4_scales_plain"] = nv_plain.scale.view(torch.uint8).numpy()
    out["nvfp4_scales_swizzled"] = nv.scale.view(torch.uint8).numpy()
    return out


def save(path: Path, arrays: dict[str, np.ndarray]) -> str:
    """An ``np.load``-able .npz written byte-reproducibly (stored members, fixed timestamps)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for k, v in arrays.items():
            v = np.asarray(v)
            assert v.dtype.kind in "uifbU", (k, v.dtype)
            member = io.BytesIO()
            np.lib.format.write_array(member, np.ascontiguousarray(v), allow_pickle=False)
            zf.writestr(
                zipfile.ZipInfo(f"{k}.npy", date_time=(1980, 1, 1, 0, 0, 0)), member.getvalue()
            )
    data = buf.getvalue()
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def describe(arrays: dict[str, np.ndarray]) -> str:
    return ", ".join(f"`{k}` {v.dtype.str}{list(v.shape)}" for k, v in arrays.items())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parent.parent / "fp4sim" / "golden" / "data" / "presets",
    )
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    files: list[tuple[str, str, dict[str, np.ndarray], str]] = []

    for tag, elem_dtype, np_dtype, elem_max in MX_ELEMS:
        x, labels = mx_rows(elem_max, np_dtype, rng)
        arrays = {"x": x, "labels": np.array(labels), "block_size": np.int32(MX_BLOCK)}
        for mode in MODES:
            for k, v in run_mx(x, elem_dtype, mode).items():
                arrays[f"{k}_{mode.value}"] = v
        # NaN / ±Inf blocks, in their own arrays (torchao's behaviour there is version-dependent)
        xs, slabels = special_rows(rng)
        arrays["special_x"], arrays["special_labels"] = xs, np.array(slabels)
        for mode in MODES:
            try:
                res = run_mx(xs, elem_dtype, mode)
            except Exception as e:  # record, do not hide: the note goes to PROVENANCE.md
                print(f"mx {tag} {mode.value} specials failed: {e!r}", file=sys.stderr)
                continue
            for k, v in res.items():
                arrays[f"special_{k}_{mode.value}"] = v
        name = f"torchao_mx_{tag}.npz"
        files.append(
            (
                name,
                save(args.out / name, arrays),
                arrays,
                f"torchao `to_mx` ({tag.upper()} elements, block 32), scale modes "
                f"{', '.join(m.value for m in MODES)}; dequant = `to_dtype(..., float32)`",
            )
        )

    x, labels = nv_rows(rng)
    for tag, pts in (
        ("nvfp4", None),
        ("nvfp4_pts", float(per_tensor_amax_to_scale(torch.tensor(np.abs(x).max())).item())),
    ):
        arrays = {"x": x, "labels": np.array(labels), "block_size": np.int32(NV_BLOCK)}
        arrays.update(run_nvfp4(x, pts))
        name = f"torchao_{tag}.npz"
        how = (
            "single-level (no per-tensor scale)"
            if pts is None
            else "two-level, per_tensor_scale = per_tensor_amax_to_scale(amax(|x|)) = amax/2688"
        )
        files.append(
            (
                name,
                save(args.out / name, arrays),
                arrays,
                f"torchao `nvfp4_quantize` {how}; dequant = `NVFP4Tensor.dequantize`",
            )
        )

    arrays = elements()
    files.append(
        (
            "torchao_elements.npz",
            save(args.out / "torchao_elements.npz", arrays),
            arrays,
            "element casts: torchao `f32_to_f4_unpacked`, `f32_to_f6_e2m3_unpacked`, "
            "`f32_to_f6_e3m2_unpacked`; torch `.to(float8_e4m3fn / float8_e5m2)`",
        )
    )
    arrays = swizzle(rng)
    files.append(
        (
            "torchao_to_blocked.npz",
            save(args.out / "torchao_to_blocked.npz", arrays),
            arrays,
            "torchao `utils.to_blocked` on random uint8 scale matrices "
            "(`scales_RxC` → flat `blocked_RxC`), and `to_mx` / `NVFP4Tensor.to_nvfp4` "
            "with "
            "`is_swizzled_scales=True` on batched/unaligned inputs",
        )
    )

    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Provenance of the torchao reference vectors",
        "",
        "Written by `scripts/make_torchao_vectors.py` (do not edit by hand; rerun the script).",
        "",
        f"- date: {now}",
        f"- torch {torch.__version__}, torchao {torchao.__version__}, numpy {np.__version__}, "
        f"ml_dtypes {ml_dtypes.__version__}, Python {platform.python_version()} "
        f"({platform.machine()}, CPU; torchao's emulated PyTorch paths, no Triton/CUDA kernels)",
        f"- command: `/tmp/torchao_venv/bin/python scripts/make_torchao_vectors.py` "
        f"(side venv: see the script's docstring); seed {SEED}",
        "- conventions: codes are one per byte (uint8, code in the low bits); `packed` is "
        "torchao's FP4 storage (element 2k in the low nibble); scales are the raw uint8 bits "
        "(E8M0 for MX, E4M3 for NVFP4); every row of `x` is one case, named in `labels`; MX keys "
        "end in the scale mode (`_floor`, `_rceil`, `_ceil`, `_even`).",
        "",
        "| file | sha256 | what | arrays |",
        "|---|---|---|---|",
    ]
    for name, digest, arrays, what in files:
        lines.append(f"| `{name}` | `{digest}` | {what} | {describe(arrays)} |")
    (args.out / "PROVENANCE.md").write_text("\n".join(lines) + "\n")
    for name, digest, _, _ in files:
        print(f"{name} {digest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

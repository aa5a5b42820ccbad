"""Tensor-core MMA models (fp4sim.formats.mma) against MMA-Sim's own outputs, bit for bit.

The vectors in ``fp4sim/golden/data/mmasim/`` were written by ``scripts/make_mmasim_vectors.py``
running github.com/microsoft/MMA-Sim (commit in ``mmasim_vectors.json``) on the CPU: 12,288 dot
products for each of Hopper's FP8 ``wgmma`` (E4M3, E5M2) and Blackwell's ``tcgen05`` kinds
f8f6f4, mxf8f6f4, mxf4 and mxf4nvf4 (UE8M0 and UE4M3 scales per 16).
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4sim.formats import codec
from fp4sim.formats.blocks import (
    FP8_E4M3_PER_TENSOR,
    MXFP4,
    MXFP6_E2M3,
    MXFP8,
    MXFP8_E5M2,
    NVFP4,
    NVFP4_SINGLE,
    dequantize,
    quantize,
)
from fp4sim.formats.matmul import (
    HOPPER_FP8_MODEL,
    Accumulation,
    scaled_matmul,
    tcgen05_kind,
    wgmma_fp8_dot,
)
from fp4sim.formats.mma import MMA_MODELS, NAN_BITS, MmaKind, MmaModel, mma_dot
from fp4sim.formats.spec import E2M1, E4M3, E5M2, UE4M3, UE8M0
from fp4sim.golden import DATA_DIR

VECTORS = DATA_DIR / "mmasim" / "mmasim_vectors.npz"
KIND = {
    "wgmma_e4m3": MmaKind.WGMMA_FP8,
    "wgmma_e5m2": MmaKind.WGMMA_FP8,
    "f8f6f4": MmaKind.F8F6F4,
    "mxf8f6f4": MmaKind.MXF8F6F4,
    "mxf4": MmaKind.MXF4,
    "mxf4nvf4_ue8m0": MmaKind.MXF4NVF4,
    "mxf4nvf4_ue4m3": MmaKind.MXF4NVF4,
}
ELEM = {"e4m3": E4M3, "e5m2": E5M2, "e2m1": E2M1}
SCALE = {"ue8m0": UE8M0, "ue4m3": UE4M3}


def _calls():
    d = np.load(VECTORS)
    keys = sorted({k.rsplit(".", 1)[0] for k in d.files})
    for key in keys:
        yield (
            key,
            {
                f: d[f"{key}.{f}"]
                for f in ("a", "b", "sa", "sb", "c", "d", "formats")
                if f"{key}.{f}" in d.files
            },
        )


def _inputs(v):
    fa, fb, sf, blk = (str(x) for x in v["formats"])
    kw = dict(a_format=ELEM[fa], b_format=ELEM[fb], c=v["c"])
    a = codec.decode(v["a"], ELEM[fa])[:, None, :]
    b = codec.decode(v["b"], ELEM[fb])[None, :, :]
    if sf:  # UE4M3 codes decoded as E4M3: the model ignores the sign bit, as the hardware does
        dec = E4M3 if sf == "ue4m3" else UE8M0
        kw.update(
            a_scale=codec.decode(v["sa"], dec)[:, None, :],
            b_scale=codec.decode(v["sb"], dec)[None, :, :],
            scale_format=SCALE[sf],
            block=int(blk),
        )
    return a, b, kw


CALLS = dict(_calls())


def test_vectors_provenance_and_counts():
    meta = json.loads((DATA_DIR / "mmasim" / "mmasim_vectors.json").read_text())
    assert meta["mmasim_commit"].startswith("c785138")
    counts = {}
    for key, v in CALLS.items():
        counts[key.split(".")[0]] = counts.get(key.split(".")[0], 0) + v["d"].size
    assert set(counts) == set(KIND)
    assert all(n >= 10_000 for n in counts.values()), counts
    assert sum(counts.values()) == 86_016


@pytest.mark.parametrize("key", sorted(CALLS))
def test_models_equal_mmasim_bit_for_bit(key):
    v = CALLS[key]
    a, b, kw = _inputs(v)
    got = mma_dot(a, b, model=MMA_MODELS[KIND[key.split(".")[0]]], **kw)
    assert np.array_equal(got.view(np.uint32), v["d"]), (
        f"{key}: {int(np.sum(got.view(np.uint32) != v['d']))} of {v['d'].size} differ"
    )


def test_vectors_cover_the_hard_cases():
    """Each tcgen05 kind's vectors hold NaN, Inf, float32-subnormal, zero and cancelling
    outputs, and outputs where float32 K-order accumulation and exact rounding both differ."""
    seen = {}
    for key, v in CALLS.items():
        kind = key.split(".")[0]
        d = v["d"].view(np.float32)
        s = seen.setdefault(kind, dict(nan=0, inf=0, subnormal=0, zero=0, not_exact=0))
        s["nan"] += int(np.sum(v["d"] == NAN_BITS))
        s["inf"] += int(np.sum(np.isinf(d)))
        s["subnormal"] += int(np.sum((d != 0) & (np.abs(d) < 2.0**-126)))
        s["zero"] += int(np.sum(d == 0))
        a, b, kw = _inputs(v)
        if "a_scale" not in kw:
            with np.errstate(invalid="ignore", over="ignore"):
                exact = ((a.astype(np.float64) * b).sum(-1) + v["c"]).astype(np.float32)
            s["not_exact"] += int(np.sum(np.isfinite(exact) & (exact != d)))
    for kind, s in seen.items():
        assert s["nan"] > 0 and s["zero"] > 0, (kind, s)
        assert s["subnormal"] > 0, (kind, s)  # through the scales or a subnormal accumulator
        if kind in ("wgmma_e4m3", "wgmma_e5m2", "f8f6f4"):
            # E4M3 has no Inf and unscaled FP8 cannot overflow; E5M2's Inf elements give Inf
            assert s["not_exact"] > 0 and (s["inf"] > 0) == (kind != "wgmma_e4m3"), (kind, s)
        elif kind != "mxf4nvf4_ue4m3":  # E2M1 x UE4M3 (at most 448) cannot overflow float32
            assert s["inf"] > 0, (kind, s)  # through the E8M0 scales


def test_hopper_fitted_model_equals_mmasim():
    """HOPPER_FP8_MODEL, the model fitted to H200 measurements, is MMA-Sim's Hopper FP8 wgmma on
    every stored E4M3 case with finite inputs and a non-zero product (a second, independent
    oracle). Where every product is zero the two differ on purpose: MMA-Sim gives a zero operand
    the exponent -126, which then truncates a float32-subnormal accumulator; the fitted model
    leaves zero products out of the alignment (no H200 measurement tells these apart)."""
    n = 0
    for key, v in CALLS.items():
        if not key.startswith("wgmma_e4m3"):
            continue
        a, b, kw = _inputs(v)
        got = wgmma_fp8_dot(a, b, HOPPER_FP8_MODEL, c=v["c"])
        finite = np.isfinite(a).all(-1) & np.isfinite(b).all(-1) & np.isfinite(v["c"])
        finite &= (a * b != 0).any(-1)
        finite &= np.isfinite(v["d"].view(np.float32))
        assert np.array_equal(got.view(np.uint32)[finite], v["d"][finite]), key
        n += int(finite.sum())
    assert n >= 11_000


@pytest.mark.parametrize(
    "key", ["mxf8f6f4.special", "mxf4nvf4_ue4m3.chain", "mxf4.special", "wgmma_e5m2.special"]
)
def test_jit_equals_numpy(key):
    v = CALLS[key]
    a, b, kw = _inputs(v)
    model = MMA_MODELS[KIND[key.split(".")[0]]]
    jkw = {k: (jnp.asarray(x) if isinstance(x, np.ndarray) else x) for k, x in kw.items()}
    arrays = {k: x for k, x in jkw.items() if not isinstance(x, (type(E4M3), int))}
    static = {k: x for k, x in jkw.items() if k not in arrays}
    fn = jax.jit(lambda a, b, arrays: mma_dot(a, b, model=model, **static, **arrays))
    got = np.asarray(fn(jnp.asarray(a), jnp.asarray(b), arrays))
    assert np.array_equal(got.view(np.uint32), v["d"])


@pytest.mark.parametrize(
    "fmt,kind",
    [
        (MXFP8, MmaKind.MXF8F6F4),
        (MXFP8_E5M2, MmaKind.MXF8F6F4),
        (MXFP6_E2M3, MmaKind.MXF8F6F4),
        (MXFP4, MmaKind.MXF4),
        (NVFP4, MmaKind.MXF4NVF4),
        (NVFP4_SINGLE, MmaKind.MXF4NVF4),
        (FP8_E4M3_PER_TENSOR, MmaKind.F8F6F4),
    ],
)
def test_scaled_matmul_tcgen05(fmt, kind):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((16, 128)) * 3).astype(np.float32)
    y = rng.standard_normal((8, 128)).astype(np.float32)
    a, b = quantize(x, fmt), quantize(y, fmt)
    assert tcgen05_kind(a.format, b.format)[0] is kind
    got = scaled_matmul(a, b, accumulation=Accumulation.TCGEN05)
    # the same chain of instructions on the decoded values, then the FP32 global factors
    _, sfmt, block = tcgen05_kind(a.format, b.format)
    kw = {}
    if sfmt is not None:
        sa = np.repeat(a.scale_values(), 1, axis=-1)
        kw = dict(
            a_scale=sa[:, None, :], b_scale=b.scale_values()[None], scale_format=sfmt, block=block
        )
    ref = mma_dot(
        a.values()[:, None, :],
        b.values()[None],
        model=MMA_MODELS[kind],
        a_format=fmt.elem,
        b_format=fmt.elem,
        **kw,
    )
    for q in (a, b):
        if q.global_scale is not None:
            ref = (ref * q.global_scale).astype(np.float32)
    assert np.array_equal(got.view(np.uint32), ref.view(np.uint32))
    exact = dequantize(a).astype(np.float64) @ dequantize(b).astype(np.float64).T
    assert np.max(np.abs(got - exact)) <= 2.0**-20 * np.max(np.abs(x) @ np.abs(y).T)
    aj, bj = (jax.tree_util.tree_map(jnp.asarray, q) for q in (a, b))
    fn = jax.jit(lambda p, q: scaled_matmul(p, q, accumulation=Accumulation.TCGEN05))
    assert np.array_equal(np.asarray(fn(aj, bj)).view(np.uint32), got.view(np.uint32))


def test_tcgen05_truncates_where_float32_rounds():
    """One large term and many small ones: the 25-bit aligned sum drops what float32 keeps."""
    a = np.zeros((1, 32), np.float32)
    a[0, 0] = 448.0
    a[0, 1:] = 2.0**-6
    b = np.ones((1, 32), np.float32)
    got = mma_dot(a, b, model=MMA_MODELS[MmaKind.F8F6F4])
    # 448 = 1.75·2^8: terms below 2^(8-25) are dropped; 2^-6 survives, 31 of them add exactly
    assert got[0] == np.float32(448.0 + 31 * 2.0**-6)
    hop = mma_dot(a, b, model=MMA_MODELS[MmaKind.WGMMA_FP8])
    assert hop[0] == np.float32(448.0)  # 13 bits below 2^8: 2^-6 is truncated away


def test_errors():
    model = MMA_MODELS[MmaKind.MXF4]
    a = np.ones((2, 64), np.float32)
    s = np.ones((2, 2), np.float32)
    with pytest.raises(TypeError, match="model="):
        mma_dot(a, a, model="mxf4")
    with pytest.raises(ValueError, match="a_format="):
        mma_dot(
            a,
            a,
            model=model,
            a_format=E4M3,
            b_format=E2M1,
            a_scale=s,
            b_scale=s,
            scale_format=UE8M0,
            block=32,
        )
    with pytest.raises(ValueError, match="needs block scales"):
        mma_dot(a, a, model=model, a_format=E2M1, b_format=E2M1)
    with pytest.raises(ValueError, match="not allowed"):
        mma_dot(
            a,
            a,
            model=model,
            a_format=E2M1,
            b_format=E2M1,
            a_scale=s,
            b_scale=s,
            scale_format=UE4M3,
            block=32,
        )
    with pytest.raises(ValueError, match="multiple of"):
        mma_dot(a[:, :48], a[:, :48], model=MMA_MODELS[MmaKind.F8F6F4])
    with pytest.raises(ValueError, match="group"):
        MmaModel(kind=MmaKind.MXF4, k=64, frac_bits=35, group=24)
    with pytest.raises(ValueError, match="different block scales"):
        tcgen05_kind(MXFP8, NVFP4)
    with pytest.raises(ValueError, match="no tcgen05.mma kind"):
        tcgen05_kind(NVFP4.replace(elem=E4M3), NVFP4.replace(elem=E4M3))
    q = quantize(np.ones((4, 48), np.float32), MXFP8.replace(block_size=16))
    with pytest.raises(ValueError, match="no tcgen05.mma kind"):
        scaled_matmul(q, q, accumulation=Accumulation.TCGEN05)


@pytest.mark.parametrize("fmt", [MXFP8, NVFP4])
def test_scaled_matmul_tcgen05_kn_and_batch(fmt):
    """B stored (K, N) (scales blocked along K = axis -2) gives the bits of B stored (N, K);
    a leading batch axis gives each matrix's own product."""
    from fp4sim.formats.matmul import BLayout

    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 16, 64)).astype(np.float32)
    y = rng.standard_normal((2, 8, 64)).astype(np.float32)
    fmt1 = fmt.replace(global_scale=NVFP4_SINGLE.global_scale) if fmt is NVFP4 else fmt
    a, b = quantize(x, fmt1), quantize(y, fmt1)
    bkn = quantize(np.swapaxes(y, -1, -2), fmt1, axis=-2)
    got = scaled_matmul(a, b, accumulation=Accumulation.TCGEN05)
    kn = scaled_matmul(a, bkn, accumulation=Accumulation.TCGEN05, b_layout=BLayout.KN)
    assert np.array_equal(got.view(np.uint32), kn.view(np.uint32))
    for i in range(2):
        one = scaled_matmul(
            quantize(x[i], fmt1), quantize(y[i], fmt1), accumulation=Accumulation.TCGEN05
        )
        assert np.array_equal(got[i].view(np.uint32), one.view(np.uint32))

"""Block-scaled matmul emulation: exact model vs float64, float32-in-K-order model vs an
independent scalar loop, the wgmma accumulator model's alignment/truncation, NumPy == jit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4sim.formats.blocks import (
    MXFP4,
    MXFP8,
    NVFP4,
    NVFP4_SINGLE,
    Geometry,
    GlobalScale,
    dequantize,
    quantize,
)
from fp4sim.formats.matmul import (
    Accumulation,
    BLayout,
    WgmmaFp8Model,
    scaled_matmul,
    wgmma_fp8_dot,
)


def grid_data(shape, seed, step):
    """Values on a coarse grid: products and every partial sum are exact in float32."""
    rng = np.random.default_rng(seed)
    return (rng.integers(-6, 7, shape) * step).astype(np.float32)


@pytest.mark.parametrize("fmt", [MXFP8, MXFP4, NVFP4_SINGLE])
def test_exact_equals_float64_on_exactly_summable_data(fmt):
    a = quantize(grid_data((8, 64), 0, 0.5), fmt)
    b = quantize(grid_data((16, 64), 1, 0.25), fmt)
    ref = dequantize(a).astype(np.float64) @ dequantize(b).astype(np.float64).T
    for acc in (Accumulation.EXACT, Accumulation.FLOAT32):
        assert np.array_equal(scaled_matmul(a, b, accumulation=acc), ref.astype(np.float32))
    # the wgmma model keeps 13 bits below the group max: these small sums are exact too
    if fmt is not NVFP4_SINGLE:
        got = scaled_matmul(a, b, accumulation=Accumulation.HOPPER_FP8)
        assert np.array_equal(got, ref.astype(np.float32))


def test_float32_model_is_k_order_float32_accumulation():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 64)).astype(np.float32) * np.float32(3)
    y = rng.standard_normal((5, 64)).astype(np.float32)
    a, b = quantize(x, MXFP8), quantize(y, MXFP8)
    av, bv = a.values().astype(np.float64), b.values().astype(np.float64)
    ea = a.scales.astype(np.int64) - 127
    eb = b.scales.astype(np.int64) - 127
    ref = np.zeros((4, 5), np.float32)
    for m in range(4):
        for n in range(5):
            acc = np.float32(0)
            for k in range(64):
                term = av[m, k] * bv[n, k] * 2.0 ** (ea[m, k // 32] + eb[n, k // 32])
                acc = np.float32(acc + np.float32(term))
            ref[m, n] = acc
    got = scaled_matmul(a, b, accumulation=Accumulation.FLOAT32)
    assert np.array_equal(got, ref)
    ex = scaled_matmul(a, b, accumulation=Accumulation.EXACT)
    bound = 64 * 2.0**-24 * (np.abs(dequantize(a)) @ np.abs(dequantize(b)).T)
    assert np.all(np.abs(got.astype(np.float64) - ex) <= bound)


def test_numpy_and_jit_bit_identical():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((4, 32)) * 4).astype(np.float32)
    y = rng.standard_normal((8, 32)).astype(np.float32)
    pt = NVFP4.replace(global_scale=GlobalScale.PER_ROW)
    for fmt, acc in (
        (MXFP8, Accumulation.FLOAT32),
        (pt, Accumulation.FLOAT32),
        (MXFP8, Accumulation.HOPPER_FP8),
    ):

        def f(p, q, fmt=fmt, acc=acc):
            return scaled_matmul(quantize(p, fmt), quantize(q, fmt), accumulation=acc)

        want = f(x, y)
        got = np.asarray(jax.jit(f)(jnp.asarray(x), jnp.asarray(y)))
        assert np.array_equal(want.view(np.uint32), got.view(np.uint32)), (fmt, acc)


def test_wgmma_model_truncates_below_the_group_max():
    m = WgmmaFp8Model(group=4, frac_bits=13, acc_in_group=True)
    a = np.array([1.0, 2.0**-14, 2.0**-14, 2.0**-14], np.float32)
    assert wgmma_fp8_dot(a, np.ones(4, np.float32), m) == 1.0  # each tiny term truncated away
    a = np.array([1.0, 2.0**-13, 2.0**-13, 2.0**-13], np.float32)
    assert wgmma_fp8_dot(a, np.ones(4, np.float32), m) == np.float32(1 + 3 * 2.0**-13)
    # truncation is toward zero for negative terms too
    a = np.array([1.0, -1.5 * 2.0**-13, 0, 0], np.float32)
    assert wgmma_fp8_dot(a, np.ones(4, np.float32), m) == np.float32(1 - 2.0**-13)
    wide = WgmmaFp8Model(group=1, frac_bits=24, acc_in_group=True)
    rng = np.random.default_rng(4)
    u = rng.integers(-8, 8, 32).astype(np.float32)
    assert wgmma_fp8_dot(u, u, wide) == np.float32(np.dot(u.astype(np.float64), u))


@pytest.mark.parametrize("case", ["pv_tokens", "pv_token_block", "dq_square", "dk_square_t"])
def test_attention_shaped_products(case):
    """P·V with V blocked along tokens (KN layout), token blocks, and 32x32 dS tiles feeding
    dQ = dS·K and dK = dSᵀ·Q: every scale applied per element of K, exact on grid data."""
    p = quantize(grid_data((32, 64), 5, 0.125), MXFP8)
    if case == "pv_tokens":
        a, b = p, quantize(grid_data((64, 16), 6, 0.5), MXFP8, axis=-2)
    elif case == "pv_token_block":
        a, b = (
            p,
            quantize(grid_data((64, 16), 6, 0.5), MXFP8, axis=-2, geometry=Geometry.TOKEN_BLOCK),
        )
    else:
        ds = grid_data((64, 64), 7, 0.25)
        if case == "dk_square_t":
            ds = ds.T.copy()
        a = quantize(ds, MXFP8, geometry=Geometry.SQUARE)
        b = quantize(grid_data((64, 32), 8, 0.5), MXFP8)  # K blocked along head_dim (= N here)
    ref = dequantize(a).astype(np.float64) @ dequantize(b).astype(np.float64)
    for acc in (Accumulation.EXACT, Accumulation.FLOAT32, Accumulation.HOPPER_FP8):
        if acc is Accumulation.HOPPER_FP8 and case.startswith("d"):
            # K's scales change with every token (= every k): no per-wgmma-step scale exists
            with pytest.raises(ValueError, match="32-element wgmma"):
                scaled_matmul(a, b, accumulation=acc, b_layout=BLayout.KN)
            continue
        got = scaled_matmul(a, b, accumulation=acc, b_layout=BLayout.KN)
        assert np.array_equal(got, ref.astype(np.float32)), acc


def test_bad_input():
    a = quantize(np.ones((4, 64), np.float32), MXFP8)
    b = quantize(np.ones((4, 32), np.float32), MXFP8)
    with pytest.raises(ValueError, match="K=64"):
        scaled_matmul(a, b)
    with pytest.raises(TypeError, match="accumulation="):
        scaled_matmul(a, a, accumulation="fp32")
    with pytest.raises(TypeError, match="b="):
        scaled_matmul(a, np.ones((4, 64)))
    n = quantize(np.ones((4, 64), np.float32), NVFP4_SINGLE)
    with pytest.raises(ValueError, match="32-element wgmma"):
        scaled_matmul(n, n, accumulation=Accumulation.HOPPER_FP8)
    with pytest.raises(TypeError, match="b_layout="):
        scaled_matmul(a, a, b_layout="kn")
    with pytest.raises(ValueError, match="frac_bits"):
        WgmmaFp8Model(frac_bits=40)
    aj = jax.tree_util.tree_map(jnp.asarray, a)
    with pytest.raises(TypeError, match="float64"):
        scaled_matmul(aj, aj, accumulation=Accumulation.EXACT)


def test_hopper_model_against_h200_measurements():
    import json

    import ml_dtypes

    from fp4sim.formats.matmul import HOPPER_FP8_MODEL
    from fp4sim.golden import DATA_DIR

    path = DATA_DIR / "wgmma_fp8_h200.npz"
    d = np.load(path)
    assert json.loads(bytes(d["meta"]).decode())["jax"] == "0.11.2"
    e4 = ml_dtypes.float8_e4m3fn
    hits = total = 0
    for name in ("normal", "wide", "onebig"):
        for k in (32, 128, 512):
            a = d[f"a_{name}_{k}"].view(e4).astype(np.float32)
            b = d[f"b_{name}_{k}"].view(e4).astype(np.float32)
            hw = d[f"fp8_{name}_{k}"]
            model = wgmma_fp8_dot(a[:, None, :], b[None, :, :], HOPPER_FP8_MODEL)
            f32 = scaled_matmul_f32_reference(a, b)
            scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)).T
            exact = a.astype(np.float64) @ b.astype(np.float64).T
            assert np.array_equal(model.view(np.uint32), hw.view(np.uint32)), (name, k)
            assert np.mean(f32 == hw) < 0.4  # plain float32 accumulation is not what it does
            assert np.max(np.abs(exact - hw) / scale) > 0  # and the hardware is not exact
            hits += int(np.sum(model == hw))
            total += model.size
    assert hits == total


def scaled_matmul_f32_reference(a, b):
    """float32 accumulation in K order of exact products (an independent scalar-free loop)."""
    acc = np.zeros((a.shape[0], b.shape[0]), np.float32)
    for k in range(a.shape[1]):
        acc = acc + np.outer(a[:, k], b[:, k]).astype(np.float32)
    return acc

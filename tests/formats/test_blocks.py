"""Block quantization (fp4sim.formats.blocks): worked examples, an independent float64 oracle,
error bounds, geometries, NumPy == jitted JAX bits, pytree behaviour and bad input."""

from __future__ import annotations

import math
import zlib

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fp4sim.formats import blocks as B
from fp4sim.formats.blocks import (
    FP8_E4M3_PER_TENSOR,
    MXFP4,
    MXFP6_E2M3,
    MXFP6_E3M2,
    MXFP8,
    MXFP8_E5M2,
    NVFP4,
    NVFP4_SINGLE,
    Arithmetic,
    Geometry,
    GlobalScale,
    QuantizedArray,
    ScaleRule,
    dequantize,
    quantize,
)
from fp4sim.formats.spec import E2M1, E4M3

MX = [MXFP4, MXFP6_E2M3, MXFP6_E3M2, MXFP8, MXFP8_E5M2]


def bits(a):
    return np.asarray(a, dtype=np.float32).view(np.uint32)


def same_bits(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return np.array_equal(bits(a), bits(b)) or bool(
        np.all((bits(a) == bits(b)) | (np.isnan(a) & np.isnan(b)))
    )


def one_block(vals, fmt, rule=None):
    x = np.zeros(fmt.block_size, np.float32)
    x[: len(vals)] = vals
    q = quantize(x, fmt, rule=rule)
    return int(q.scales[0]), dequantize(q)[: len(vals)]


# --- worked examples (OCP MX v1.0 floor rule, cuDNN round-up rule; torchao's scale bytes) ---------
def test_amax_500_e4m3_floor_clamps_rceil_bumps():
    code, y = one_block([500.0], MXFP8, ScaleRule.FLOOR)
    assert code == 127 and y[0] == 448.0  # OCP floor: 2^0, 500 clamps to 448
    code, y = one_block([500.0], MXFP8, ScaleRule.RCEIL)
    assert code == 128 and y[0] == 512.0  # 500/2 = 250 -> E4M3 256 on the 2^1 grid
    code, y = one_block([1.0], MXFP8, ScaleRule.FLOOR)
    assert code == 127 - 8 and y[0] == 1.0  # 1.0 -> scale 2^-8, element 256
    assert one_block([1.0], MXFP8, ScaleRule.RCEIL)[0] == 127 - 8


def test_amax_7_e2m1_floor_clamps_rceil_gives_8():
    code, y = one_block([7.0], MXFP4, ScaleRule.FLOOR)
    assert code == 127 and y[0] == 6.0
    code, y = one_block([7.0], MXFP4, ScaleRule.RCEIL)
    assert code == 128 and y[0] == 8.0  # 7/2 = 3.5 ties to 4 (even code)


@pytest.mark.parametrize(
    "fmt,amax,expect",
    [
        # torchao's measured scale bytes: FLOOR, CEIL, EVEN, RCEIL
        (MXFP4, 3.5, (126, 127, 127, 127)),
        (MXFP4, 5.0, (127, 128, 127, 127)),
        (MXFP4, 6.1, (127, 128, 127, 128)),
        (MXFP4, 7.0, (127, 128, 128, 128)),
        (MXFP8, 449.0, (127, 128, 127, 128)),
        (MXFP8, 500.0, (127, 128, 128, 128)),
        (MXFP8, 957.0, (128, 129, 128, 129)),
    ],
)
def test_scale_rule_table(fmt, amax, expect):
    rules = (ScaleRule.FLOOR, ScaleRule.CEIL, ScaleRule.EVEN, ScaleRule.RCEIL)
    assert tuple(one_block([amax], fmt, r)[0] for r in rules) == expect


def test_nvfp4_amax_2_9_clips_without_global_and_is_exact_with_it():
    code, y = one_block([2.9], NVFP4_SINGLE)
    assert code == 0x2F  # E4M3 0.46875: 2.9/6 = 0.4833 rounds down
    assert y[0] == np.float32(2.8125)  # 2.9/0.46875 = 6.19 saturates to 6
    # flashinfer-style encode factor 448*6/2.9 makes the block scale exactly 448: exact max
    const = NVFP4.replace(global_scale=GlobalScale.CONSTANT)
    x = np.zeros(16, np.float32)
    x[0] = 2.9
    q = quantize(x, const, global_encode_scale=np.float32(448 * 6) / np.float32(2.9))
    assert int(q.scales[0]) == 0x7E and dequantize(q)[0] == np.float32(2.9)
    q = quantize(x, NVFP4)  # per-tensor amax: the same thing
    assert int(q.scales[0]) == 0x7E and dequantize(q)[0] == np.float32(2.9)


def test_pow2_block_quantize_demo_semantics():
    # the PyTorch low-precision FA4 write-up's demo: scale = 2^ceil(log2(max_abs/448)), E4M3 of clamp(x/scale), restore q*scale.
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((4, 128)) * 3.0).astype(np.float32)
    blocks = x.reshape(4, 4, 32).astype(np.float64)
    scale = 2.0 ** np.ceil(np.log2(np.abs(blocks).max(-1, keepdims=True) / 448.0))
    ref = (
        np.clip(blocks / scale, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
        * scale
    ).reshape(4, 128)
    q = quantize(x, MXFP8)
    assert q.scales.shape == (4, 4)
    assert np.array_equal(dequantize(q), ref.astype(np.float32))
    rel = np.abs(x - dequantize(q)).mean() / np.abs(x).mean()
    assert rel < 2.0**-4  # E4M3: at most half an ulp (2^-4 relative) per element


def test_special_blocks():
    x = np.zeros((4, 32), np.float32)
    x[1, 3] = np.nan
    x[2, 5] = np.inf
    x[3, :] = 1e-40  # float32 subnormals
    q = quantize(x, MXFP8)
    assert q.scales.ravel().tolist()[:3] == [0, 0xFF, 0xFE]
    y = dequantize(q)
    assert np.all(y[0] == 0) and np.all(np.isnan(y[1]))
    assert y[2, 5] == np.inf and np.all(y[2, :5] == 0)  # 448 * 2^127 overflows float32
    # bottom binade: descale 1e-40/448 <= 2^-127 -> 0x00 (2^-127); elements 1e-40 * 2^127
    assert int(q.scales[3, 0]) == 0
    expect = np.float32(np.float64(np.float32(1e-40)) * 2.0**127)
    assert q.values()[3, 0] == np.float32(expect.astype(ml_dtypes.float8_e4m3fn))


# --- independent oracle: float64 + ml_dtypes casts ----------------------------------------
def oracle_pow2(x, fmt, rule):
    """Scale exponents and element values of MX quantization written with float64 math."""
    blocks = x.reshape(-1, fmt.block_size).astype(np.float64)
    amax = np.abs(blocks).max(-1)
    M, e_M = fmt.elem.max, fmt.elem.emax
    with np.errstate(divide="ignore"):
        if rule is ScaleRule.FLOOR:
            e = np.floor(np.log2(amax)) - e_M
        elif rule is ScaleRule.CEIL:
            e = np.ceil(np.log2(amax)) - e_M
        else:  # RCEIL: 2^ceil(log2(fl32(amax * fl32(1/M))))
            d = (amax.astype(np.float32) * (np.float32(1) / np.float32(M))).astype(np.float64)
            e = np.ceil(np.log2(d))
            e = np.where(d <= 2.0**-127, -127, e)
    e = np.clip(np.where(amax == 0, -127, e), -127, 127)
    scaled = blocks * 2.0 ** -e[:, None]
    vals = np.clip(scaled, -M, M).astype(fmt.elem.dtype).astype(np.float64)
    return (e + 127).astype(np.uint8), (vals * 2.0 ** e[:, None]).reshape(x.shape)


finite_f32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(MX),
    st.sampled_from([ScaleRule.FLOOR, ScaleRule.CEIL, ScaleRule.RCEIL]),
    st.lists(finite_f32, min_size=64, max_size=64),
    st.integers(-30, 30),
)
def test_mx_matches_float64_oracle(fmt, rule, vals, shift):
    with np.errstate(over="ignore"):
        x = (np.asarray(vals, np.float64) * 2.0**shift).astype(np.float32)
    x = np.where(np.isfinite(x), x, 0).astype(np.float32).reshape(2, 32)
    q = quantize(x, fmt, rule=rule)
    codes, ref = oracle_pow2(x, fmt, rule)
    assert np.array_equal(q.scales.ravel(), codes)
    with np.errstate(over="ignore"):  # 448 * 2^127 and the like overflow to Inf in both
        assert np.array_equal(dequantize(q), ref.astype(np.float32))


# --- error bound -------------------------------------------------------------------------
def assert_within_bound(x, q):
    """|x - deq| <= half an element ulp at |x|/scale (RCEIL/CEIL never clip), in block units."""
    fmt = q.format
    y = dequantize(q).astype(np.float64)
    s = B.expand_scales(q.scale_values(), q).astype(np.float64)
    t = np.abs(x.astype(np.float64)) / s
    e = np.floor(np.log2(np.maximum(t, fmt.elem.min_normal)))
    half_ulp = 2.0 ** (e - fmt.elem.mbits - 1)
    assert np.all(np.abs(x - y) <= half_ulp * s)


@settings(max_examples=30, deadline=None)
@given(
    st.sampled_from(MX),
    st.sampled_from([ScaleRule.CEIL, ScaleRule.RCEIL]),
    st.lists(finite_f32, min_size=96, max_size=96),
    st.sampled_from([-1, -2]),
    st.sampled_from([Geometry.BLOCK, Geometry.TOKEN_BLOCK, Geometry.SQUARE]),
)
def test_dequantize_error_within_format_bound(fmt, rule, vals, axis, geometry):
    x = (
        np.asarray(vals, np.float32).reshape(32, 3)
        if axis == -2
        else np.asarray(vals, np.float32).reshape(3, 32)
    )
    if geometry is not Geometry.BLOCK:
        x = np.resize(x.reshape(-1), (32, 64)).astype(np.float32)
        axis = -2
    x = np.clip(x, -(2.0**120), 2.0**120).astype(np.float32)  # no overflow of the largest scale
    assert_within_bound(x, quantize(x, fmt, rule=rule, axis=axis, geometry=geometry))


@settings(max_examples=30, deadline=None)
@given(
    st.lists(finite_f32, min_size=64, max_size=64),
    st.integers(-40, 40),
    st.sampled_from([NVFP4, NVFP4_SINGLE, NVFP4.replace(global_scale=GlobalScale.PER_ROW)]),
)
def test_nvfp4_error_bound(vals, shift, fmt):
    with np.errstate(over="ignore"):
        x = (np.asarray(vals, np.float64) * 2.0**shift).astype(np.float32)
    x = np.clip(np.where(np.isfinite(x), x, 0), -1e30, 1e30).astype(np.float32).reshape(4, 16)
    q = quantize(x, fmt)
    y = dequantize(q).astype(np.float64)
    g = (
        1.0
        if q.global_scale is None
        else np.broadcast_to(q.global_scale, (4, 1)).astype(np.float64)
    )
    s = q.scale_values().astype(np.float64) * g  # effective scale per block
    amax = np.abs(x.astype(np.float64)).max(-1, keepdims=True)
    # E2M1 spacing is at most 2 (half: 1) and the max may clip by amax - 6s; relative 2^-22 slack
    # for the float32 rounding of x*(1/(s g)) and of the dequantized product.
    bound = s * 1.0 + np.maximum(0.0, amax - 6.0 * s) + amax * 2.0**-20
    # TE's order caps the element factor fl(1/(s·g)) at float32 max: blocks whose effective scale
    # is below 1/FLT_MAX (amax in the float32 subnormals) come out shrunk by s·g·FLT_MAX < 1.
    capped = np.broadcast_to(s < 1.0 / np.float64(np.finfo(np.float32).max), x.shape)
    assert np.all((np.abs(x - y) <= bound) | capped)
    # ... never enlarged nor sign-flipped (each element is x·fl(1/(s·g))·s·g rounded to E2M1
    # and back, with 0 < fl(1/(s·g))·s·g <= 1 once capped, up to the element's own rounding)
    xc, yc = x.astype(np.float64)[capped], y[capped]
    slack = np.broadcast_to(bound, x.shape)[capped]
    assert np.all(np.abs(yc) <= np.abs(xc) * (1 + 2.0**-20) + slack)
    assert np.all(yc * xc >= 0)


# --- geometries ----------------------------------------------------------------------------
def test_geometry_shapes_and_shared_exponents():
    rng = np.random.default_rng(0)
    v = rng.standard_normal((2, 64, 96)).astype(np.float32)
    assert quantize(v, MXFP8).scales.shape == (2, 64, 3)
    assert quantize(v, MXFP8, axis=-2).scales.shape == (2, 2, 96)
    tb = quantize(v, MXFP8, axis=-2, geometry=Geometry.TOKEN_BLOCK)
    assert tb.scales.shape == (2, 2, 1)
    sq = quantize(v[:, :, :64], MXFP8, geometry=Geometry.SQUARE)
    assert sq.scales.shape == (2, 2, 2)
    assert quantize(v, MXFP8, geometry=Geometry.PER_TENSOR).scales.shape == (1, 1, 1)
    assert quantize(v, MXFP8, geometry=Geometry.PER_ROW).scales.shape == (2, 64, 1)
    # token block: one exponent for 32 tokens x whole head dim = MX block of the flattened tile
    tile = v[1, 32:64, :].reshape(-1)
    amax = np.abs(tile).max()
    assert int(tb.scales[1, 1, 0]) == int(one_block([amax], MXFP8)[0])
    assert np.array_equal(B.scale_exponents(tb), tb.scales.astype(np.int32) - 127)
    # dequantize of a token block equals the MX dequantize of the same tile as one block
    flat = quantize(v[1, 32:64, :].reshape(1, -1), MXFP8.replace(block_size=32 * 96))
    assert np.array_equal(dequantize(tb)[1, 32:64].reshape(1, -1), dequantize(flat))


def test_square_blocks_are_transpose_consistent():
    rng = np.random.default_rng(1)
    ds = (rng.standard_normal((64, 96)) * 10).astype(np.float32)
    a = quantize(ds, MXFP8, geometry=Geometry.SQUARE)
    b = quantize(ds.T.copy(), MXFP8, geometry=Geometry.SQUARE)
    assert np.array_equal(a.scales, b.scales.T)
    assert np.array_equal(dequantize(a), dequantize(b).T)  # one tile feeds dQ and dK alike


def test_per_row_global_factor_is_causal():
    # per-token FP32 factor: changing a later token leaves earlier tokens' bits unchanged
    rng = np.random.default_rng(2)
    k = rng.standard_normal((8, 64)).astype(np.float32)
    fmt = NVFP4.replace(global_scale=GlobalScale.PER_ROW)
    k2 = k.copy()
    k2[7] *= 100
    a, b = dequantize(quantize(k, fmt)), dequantize(quantize(k2, fmt))
    assert np.array_equal(a[:7], b[:7])
    pt_a, pt_b = dequantize(quantize(k, NVFP4)), dequantize(quantize(k2, NVFP4))
    assert not np.array_equal(pt_a[:7], pt_b[:7])  # the per-tensor amax leaks


def test_fp8_per_tensor_and_packing():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    q = quantize(x, FP8_E4M3_PER_TENSOR)
    assert q.scales is None and q.global_scale.shape == ()
    assert (q.codes % 128).max() == 0x7E  # the amax element maps to +-448
    assert np.isclose(np.abs(dequantize(q)).max(), np.abs(x).max(), rtol=2.0**-23, atol=0)
    for fmt in (MXFP4, MXFP6_E2M3, NVFP4):
        p = quantize(x, fmt, pack=True)
        assert p.packed and p.shape == x.shape
        assert np.array_equal(p.unpack().codes, quantize(x, fmt).codes)
        assert same_bits(dequantize(p), dequantize(quantize(x, fmt)))


# --- NumPy vs jitted JAX -------------------------------------------------------------------
SPECIAL = np.array(
    [
        0.0,
        -0.0,
        np.inf,
        -np.inf,
        np.nan,
        1e-40,
        -3e-39,
        2.0**-149,
        3e38,
        448.0,
        464.0,
        6.0,
        7.0,
        0.25,
        0.75,
    ],
    np.float32,
)

JIT_CASES = [
    (MXFP8, dict()),
    (MXFP4, dict(axis=-2)),
    (MXFP8_E5M2, dict(rule=ScaleRule.FLOOR)),
    (MXFP6_E3M2, dict(rule=ScaleRule.EVEN)),
    (MXFP8, dict(axis=-2, geometry=Geometry.TOKEN_BLOCK)),
    (MXFP8, dict(geometry=Geometry.SQUARE)),
    (NVFP4, dict()),
    (NVFP4_SINGLE, dict()),
    (NVFP4.replace(global_scale=GlobalScale.PER_ROW), {}),
    (NVFP4.replace(rule=ScaleRule.RCEIL), {}),
    # blocks whose scale amax/6 is a float32 subnormal, rounded up: the clamp must not flush it
    *[(NVFP4_SINGLE.replace(rule=ScaleRule.RCEIL, arithmetic=a), {}) for a in Arithmetic],
    (FP8_E4M3_PER_TENSOR, dict()),
]


@pytest.mark.parametrize("fmt,kw", JIT_CASES, ids=[f"{f.name}-{k}" for f, k in JIT_CASES])
def test_numpy_and_jit_bit_identical(fmt, kw):
    rng = np.random.default_rng(zlib.crc32(repr((fmt, fmt.rule, fmt.arithmetic, kw)).encode()))
    x = (rng.standard_normal((64, 64)) * np.exp2(rng.integers(-140, 100, (64, 1)))).astype(
        np.float32
    )
    x[::7, ::5] = SPECIAL[rng.integers(0, len(SPECIAL), x[::7, ::5].shape)]
    x[3] = 0.0
    x[5] = 1e-40 * rng.standard_normal(64).astype(np.float32)  # subnormal-only rows
    fn = jax.jit(lambda a: quantize(a, fmt, **kw))
    q, qj = quantize(x, fmt, **kw), fn(jnp.asarray(x))
    assert np.array_equal(q.codes, np.asarray(qj.codes))
    if q.scales is not None:
        assert np.array_equal(q.scales, np.asarray(qj.scales))
    if q.global_scale is not None:
        assert same_bits(q.global_scale, qj.global_scale)
    assert same_bits(dequantize(q), jax.jit(dequantize)(qj))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(width=32), min_size=64, max_size=64))
def test_exact_f32_helpers_match_float64(vals):
    a = np.asarray(vals, np.float32)
    b = a[::-1].copy()
    with np.errstate(all="ignore"):
        ref_mul = (a.astype(np.float64) * b).astype(np.float32)
        ref_div = (a.astype(np.float64) / b).astype(np.float32)
    # float64 products of float32 are exact, so one rounding: equal unless the result is a
    # float32 subnormal (where fp4sim may round twice; see the module doc)
    normal = np.abs(ref_mul) >= 2.0**-126
    assert same_bits(B.mul_f32(a, b)[normal], ref_mul[normal])
    ok = (np.abs(ref_div) >= 2.0**-126) | (ref_div == 0) & (a == 0)
    assert same_bits(B.div_f32(a, b)[ok], ref_div[ok])
    for k in (-300, -149, -127, -3, 0, 5, 127, 300):
        with np.errstate(all="ignore"):
            ref = np.ldexp(a.astype(np.float64), k).astype(np.float32)
        assert same_bits(B.ldexp_f32(a, k), ref)


def test_exact_f32_helpers_jit_equal_numpy():
    rng = np.random.default_rng(4)
    a = rng.standard_normal(4096).astype(np.float32) * np.exp2(rng.integers(-150, 120, 4096))
    a = a.astype(np.float32)
    b = rng.permutation(a)
    for f in (B.mul_f32, B.div_f32):
        assert same_bits(f(a, b), jax.jit(f)(jnp.asarray(a), jnp.asarray(b)))
    k = rng.integers(-160, 160, 4096).astype(np.int32)
    assert same_bits(B.ldexp_f32(a, k), jax.jit(B.ldexp_f32)(jnp.asarray(a), jnp.asarray(k)))


# --- pytree -------------------------------------------------------------------------------
def test_quantized_array_is_a_pytree_through_jit_vmap_scan():
    x = jnp.asarray(np.random.default_rng(5).standard_normal((3, 8, 64)).astype(np.float32))
    q = jax.jit(lambda a: quantize(a, NVFP4_SINGLE))(x)
    leaves, tree = jax.tree_util.tree_flatten(q)
    assert len(leaves) == 2 and jax.tree_util.tree_unflatten(tree, leaves).format is NVFP4_SINGLE
    qv = jax.jit(jax.vmap(lambda a: quantize(a, MXFP8)))(x)
    assert qv.scales.shape == (3, 8, 2) and qv.axis == -1
    assert np.array_equal(np.asarray(qv.codes), quantize(np.asarray(x), MXFP8).codes)

    def step(carry, a):
        q = quantize(a, MXFP4)
        return carry + dequantize(q).sum(), q

    total, qs = jax.lax.scan(step, jnp.float32(0), x)
    assert isinstance(qs, QuantizedArray) and qs.codes.shape == (3, 8, 64)


# --- bad input ------------------------------------------------------------------------------
def test_bad_input_names_the_argument():
    x = np.ones((4, 64), np.float32)
    with pytest.raises(ValueError, match="axis -1 of length 48"):
        quantize(np.ones((4, 48), np.float32), MXFP8.replace(block_size=32))
    with pytest.raises(TypeError, match="x has dtype int64"):
        quantize(np.ones((4, 64), np.int64), MXFP8)
    with pytest.raises(TypeError, match="pack='no' must be a bool"):
        quantize(x, MXFP8, pack="no")
    with pytest.raises(ValueError, match="axis=2"):
        quantize(x, MXFP8, axis=2)
    with pytest.raises(TypeError, match="fmt="):
        quantize(x, "mxfp8")
    with pytest.raises(TypeError, match="rule="):
        quantize(x, MXFP8, rule="floor")
    with pytest.raises(ValueError, match="NEAREST"):
        MXFP8.replace(rule=ScaleRule.NEAREST)
    with pytest.raises(ValueError, match="power-of-two"):
        NVFP4.replace(rule=ScaleRule.FLOOR)
    with pytest.raises(ValueError, match="exactly one"):
        quantize(x, NVFP4.replace(global_scale=GlobalScale.CONSTANT))
    with pytest.raises(ValueError, match="scales has shape"):
        QuantizedArray(np.zeros((4, 64), np.uint8), np.zeros((4, 3), np.uint8), None, MXFP8)
    with pytest.raises(TypeError, match="codes has dtype"):
        QuantizedArray(np.zeros((4, 64), np.int32), np.zeros((4, 2), np.uint8), None, MXFP8)
    with pytest.raises(ValueError, match="global_scale is None"):
        QuantizedArray(np.zeros((4, 64), np.uint8), np.zeros((4, 4), np.uint8), None, NVFP4)
    with pytest.raises(ValueError, match="TOKEN_BLOCK"):
        quantize(x, MXFP8, axis=-1, geometry=Geometry.TOKEN_BLOCK)
    with pytest.raises(ValueError, match="packed=True"):
        QuantizedArray(
            np.zeros((4, 64), np.uint8), np.zeros((4, 2), np.uint8), None, MXFP8, packed=True
        )


def test_format_constants():
    assert MXFP4.elem is E2M1 and MXFP8.elem is E4M3 and NVFP4.block_size == 16
    assert hash(MXFP8) == hash(MXFP8.replace()) and MXFP8 == MXFP8.replace()
    assert math.isclose(float(B.global_decode_scale(np.float32(2688.0))), 1.0)
    # TE: S_enc = 2688/amax capped at float32 max, and 1 where it is 0 (amax = Inf)
    assert float(B.global_encode_scale(np.float32(0.0))) == np.finfo(np.float32).max
    assert float(B.global_encode_scale(np.float32(np.inf))) == 1.0


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_random_shapes_axes_block_sizes(data):
    ndim = data.draw(st.integers(1, 3))
    bs = data.draw(st.sampled_from([2, 4, 8, 16, 32]))
    fmt = data.draw(st.sampled_from(MX)).replace(block_size=bs)
    axis = data.draw(st.integers(-ndim, ndim - 1))
    shape = [data.draw(st.integers(1, 3)) for _ in range(ndim)]
    shape[axis] *= bs
    x = np.asarray(
        data.draw(st.lists(finite_f32, min_size=int(np.prod(shape)), max_size=int(np.prod(shape)))),
        np.float32,
    ).reshape(shape)
    x = np.clip(x, -(2.0**120), 2.0**120).astype(np.float32)
    q = quantize(x, fmt, axis=axis)
    want = list(shape)
    want[axis] //= bs
    assert q.scales.shape == tuple(want)
    assert_within_bound(x, q)
    if fmt.elem.nbits in (4, 6) and shape[-1] % 4 == 0:
        assert np.array_equal(q.pack().unpack().codes, q.codes)


def test_nvfp4_scale_rounding_up():
    # E4M3 scale rounded up (cuDNN's "quantize_round_up"): 2.9/6 -> 0.5, no clipping of the max
    code, y = one_block([2.9], NVFP4_SINGLE, ScaleRule.RCEIL)
    assert code == 0x30 and y[0] == 3.0  # 2.9/0.5 = 5.8 -> E2M1 6 -> 6 * 0.5


# --- the AMPLITUDE rule (Direct-P's V: value β·q/6) -----------------------------------------
def _flush32(a):
    """float64 -> float32 (RNE), then |x| < 2^-126 -> +0 (the rule's flushed float32 steps)."""
    a = np.asarray(a, np.float64).astype(np.float32)
    return np.where(np.abs(a) < np.float32(2.0**-126), np.float32(0.0), a)


def _amplitude_oracle(x):
    """Codes, scale codes and values of MXFP4_AMPLITUDE along axis -2 from the definition, in
    float64 and ml_dtypes (x finite, float32-normal or zero)."""
    xb = x.astype(np.float64).reshape(x.shape[:-2] + (x.shape[-2] // 32, 32, x.shape[-1]))
    amax = np.abs(xb).max(axis=-2, keepdims=True)
    m, ex = np.frexp(amax)  # amax = m·2^ex, m in [0.5, 1)
    e = np.where(m == 0.5, ex - 1, ex)  # ceil(log2 amax)
    e = np.where(amax == 0, -127, np.clip(e, -127, 127))
    y = _flush32(_flush32(xb / 2.0**e).astype(np.float64) * 6.0)
    q = y.astype(ml_dtypes.float4_e2m1fn)
    codes = q.view(np.uint8).reshape(x.shape) & 0xF
    vals = (q.astype(np.float64) * 2.0**e / 6.0).astype(np.float32).reshape(x.shape)
    return codes, (e + 127).astype(np.uint8)[..., 0, :], vals


def test_amplitude_rule_matches_its_definition_numpy_and_jit():
    rng = np.random.default_rng(11)
    x = (
        rng.standard_normal((3, 128, 16)) * 2.0 ** rng.integers(-100, 100, size=(3, 1, 16))
    ).astype(np.float32)
    # exact E2M1 ties of 6·x/β (0.25, 0.75, ... 5 over 6 times a power of two) and zero blocks
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], np.float32) / np.float32(6.0)
    pick = rng.random(x.shape) < 0.3
    x = np.where(pick, rng.choice(ties, x.shape) * np.sign(x), x).astype(np.float32)
    x[0, :32, 0] = 0.0
    x = np.where(np.abs(x) < 2.0**-126, 0.0, x).astype(np.float32)
    codes, scales, vals = _amplitude_oracle(x)
    assert B.MXFP4_AMPLITUDE.divisor == 6.0 and MXFP4.divisor == 1.0

    def f(a):
        return quantize(a, B.MXFP4_AMPLITUDE, axis=-2)

    for arr in (x, jnp.asarray(x)):
        qa = f(arr) if isinstance(arr, np.ndarray) else jax.jit(f)(arr)
        np.testing.assert_array_equal(np.asarray(qa.codes), codes)
        np.testing.assert_array_equal(np.asarray(qa.scales), scales)
        np.testing.assert_array_equal(bits(np.asarray(dequantize(qa))), bits(vals))
    # the same grid is not OCP MX with the CEIL rule: that one scales by 2^(e - 2)
    assert not np.array_equal(
        np.asarray(quantize(x, MXFP4, axis=-2, rule=ScaleRule.CEIL).codes), codes
    )


def test_amplitude_rule_nonfinite_blocks_and_range():
    x = np.ones((64, 4), np.float32)
    x[3, 0] = np.nan
    x[40, 1] = np.inf
    x[:32, 2] = np.float32(3.0e38)  # ceil(log2 amax) = 128 clamps to 127: payloads saturate
    for arr, f in (
        (x, quantize),
        (jnp.asarray(x), jax.jit(quantize, static_argnums=1, static_argnames="axis")),
    ):
        qa = f(arr, B.MXFP4_AMPLITUDE, axis=-2)
        s = np.asarray(qa.scales)
        assert s[0, 0] == 0xFF and s[1, 1] == 0xFE and s[0, 2] == 254 and s[1, 0] == 127
        d = np.asarray(dequantize(qa))
        assert np.isnan(d[:32, 0]).all() and not np.isnan(d[32:, 0]).any()
        assert d[40, 1] == np.float32(2.0**127)  # 2^127·6/6: no overflow on the way
        np.testing.assert_array_equal(d[:32, 2], np.float32(2.0**127))


def test_amplitude_rule_bad_formats_and_mma():
    with pytest.raises(ValueError, match="AMPLITUDE"):
        NVFP4_SINGLE.replace(rule=ScaleRule.AMPLITUDE)
    with pytest.raises(ValueError, match="AMPLITUDE"):
        MXFP4.replace(scale=None, rule=ScaleRule.AMPLITUDE)
    with pytest.raises(ValueError, match="global_scale=NONE"):
        MXFP4.replace(rule=ScaleRule.AMPLITUDE, global_scale=GlobalScale.PER_TENSOR)
    from fp4sim.formats.matmul import scaled_matmul

    a = quantize(np.ones((4, 64), np.float32), B.MXFP4_AMPLITUDE)
    with pytest.raises(ValueError, match="divided by 6"):
        scaled_matmul(a, a)

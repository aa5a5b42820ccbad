"""Quantization kernels: bit-exact against the emulator (fp4sim.formats.blocks).

Three layers: (1) the kernel's element and scale arithmetic, run as plain jitted jnp on the CPU
over every bfloat16 bit pattern (and float32 subnormals, thresholds, specials) against the
emulator's own functions; (2) whole kernels in GPU interpret mode on tiny grids for every
supported format x input dtype, with NaN/Inf/zero/subnormal blocks, and hypothesis-drawn data;
(3) cross-lowering of every shipped configuration for sm_90a. ``@pytest.mark.gpu`` tests repeat
the comparison at 8192 x 8192 on the H200.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fp4sim.formats import blocks as B
from fp4sim.formats import codec, layouts
from fp4sim.formats.spec import E2M1, E4M3, E5M2, NanPolicy, Policy
from fp4sim.kernels import quantize_mgpu as Q
from fp4sim.kernels.harness import Arch, cross_lower, gpu_available, interpret

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [BF16, np.dtype(np.float16), np.dtype(np.float32)]
U = np.uint32


# --- reference data -------------------------------------------------------------------------
def all_bf16_as_f32() -> np.ndarray:
    """Every bfloat16 bit pattern widened to float32."""
    return (np.arange(1 << 16, dtype=np.uint32) << 16).view(np.float32)


def amax_values() -> np.ndarray:
    """Positive block maxima: all finite bfloat16 magnitudes, float32 subnormals, the
    neighbourhoods of every power-of-two scale threshold M·2^k, and the specials."""
    bf = all_bf16_as_f32()
    bf = bf[(bf >= 0) & np.isfinite(bf)]
    rng = np.random.default_rng(1)
    sub = (rng.integers(1, 1 << 23, 4000, dtype=np.uint32)).view(np.float32)
    near = []
    for m in (6.0, 448.0, 57344.0):
        for e in range(-160, 128):
            t = np.float32(m * 2.0**e) if -149 <= e + 3 and m * 2.0**e < 3e38 else np.float32(0)
            tb = np.array([t], np.float32).view(np.uint32)[0]
            near.extend(int(tb) + d for d in range(-3, 4))
    near = np.array([v for v in near if 0 <= v < 0x7F800000], np.uint32).view(np.float32)
    return np.concatenate([bf, sub, near, np.array([0, np.inf, np.nan], np.float32)])


def emu_quantize(*args, **kw):
    """The emulator on NumPy (its 0·Inf / x/0 special-case proxies may warn; values are defined)."""
    with np.errstate(all="ignore"):
        return B.quantize(*args, **kw)


def _j(f):
    return jax.jit(f)


def _bits(x):
    return np.asarray(x, np.float32).view(np.uint32)


# --- layer 1: the kernel arithmetic against the emulator, exhaustively ----------------------
@pytest.mark.parametrize("fmt", [B.MXFP8_E4M3, B.MXFP8_E5M2, B.MXFP4], ids=lambda f: f.name)
@pytest.mark.parametrize(
    "rule",
    [B.ScaleRule.RCEIL, B.ScaleRule.FLOOR, B.ScaleRule.CEIL, B.ScaleRule.EVEN],
    ids=lambda r: r.name,
)
def test_mx_scale_code_matches_emulator(fmt, rule):
    a = amax_values()
    f = fmt.replace(rule=rule, block_size=1)  # one element per block: the scale of amax = |x|
    want = emu_quantize(a, f).scales.astype(np.int32)
    mag = _bits(a) & U(0x7FFFFFFF)  # the kernel's block max is over magnitude bits
    got = np.asarray(_j(lambda v: Q._mx_scale_code(v, f))(jnp.asarray(mag)))
    np.testing.assert_array_equal(got, want)


def test_mx_scale_code_nonfinite_nan_variant():
    a = np.array([np.inf, np.nan, 1.0], np.float32)
    f = B.MXFP8_E4M3.replace(nonfinite=B.NonFinite.NAN, block_size=1)
    got = np.asarray(_j(lambda v: Q._mx_scale_code(v, f))(jnp.asarray(_bits(a))))
    np.testing.assert_array_equal(got, emu_quantize(a, f).scales)


KS = [-127, -126, -100, -24, -23, -22, -9, -1, 0, 1, 7, 100, 126, 127]


@pytest.mark.parametrize("elem", [E4M3, E5M2], ids=str)
def test_fp8_element_codes_every_bf16_pattern_and_scale(elem):
    x = all_bf16_as_f32()
    fmt = B.MXFP8_E4M3 if elem is E4M3 else B.MXFP8_E5M2
    f = _j(lambda b, k: Q._fp8_codes(b, k, fmt))
    for k in KS:
        want = codec.encode(B.ldexp_f32(x, np.int32(-k)), elem)
        got = np.asarray(f(jnp.asarray(_bits(x)), jnp.full(x.shape, k, jnp.int32)))
        np.testing.assert_array_equal(got, want, err_msg=f"k={k}")


def test_fp8_element_codes_float32_subnormals_and_ties():
    rng = np.random.default_rng(2)
    sub = rng.integers(0, 1 << 23, 20000, dtype=np.uint32) | (
        rng.integers(0, 2, 20000, dtype=np.uint32) << 31
    )
    ties = []  # midpoints between adjacent E4M3 values, and their float32 neighbours
    vals = np.sort(codec.decode(codec.finite_codes(E4M3), E4M3))
    mids = ((vals[1:].astype(np.float64) + vals[:-1]) / 2).astype(np.float32)
    for d in (-1, 0, 1):
        ties.append((_bits(mids).astype(np.int64) + d * (mids != 0)).astype(np.uint32))
    x = np.concatenate([sub.view(np.float32), np.concatenate(ties).view(np.float32)])
    f = _j(lambda b, k: Q._fp8_codes(b, k, B.MXFP8_E4M3))
    for k in (-127, -30, -23, 0, 3):
        want = codec.encode(B.ldexp_f32(x, np.int32(-k)), E4M3)
        got = np.asarray(f(jnp.asarray(_bits(x)), jnp.full(x.shape, k, jnp.int32)))
        np.testing.assert_array_equal(got, want, err_msg=f"k={k}")


def test_e2m1_threshold_codes_every_bf16_pattern_and_scale():
    x = all_bf16_as_f32()
    pol = Policy(nan=NanPolicy.ZERO)  # the emulator's E2M1 policy inside a block

    def f(b, k):
        return Q._mx4_codes(b, Q._e2m1_thresholds(k))

    fj = _j(f)
    for k in KS:
        want = codec.encode(B.ldexp_f32(x, np.int32(-k)), E2M1, pol)
        got = np.asarray(fj(jnp.asarray(_bits(x)), jnp.full(x.shape, k, jnp.int32)))
        np.testing.assert_array_equal(got, want, err_msg=f"k={k}")


def test_float_path_mxfp4_codes_every_bf16_pattern_numpy():
    """The FLOAT path's MXFP4 element codes (magic-add rounding, sign, NaN -> +0, Inf
    saturating), run on NumPy (IEEE, subnormals kept, as on the GPU) for every bfloat16 pattern
    (even/odd pairs packed into bytes, as from 16-bit input) and power-of-two factors."""
    x = all_bf16_as_f32()
    pol = Policy(nan=NanPolicy.ZERO)
    b = _bits(x)
    for k in (-127, -100, -3, 0, 1, 5, 100, 127):
        want = codec.encode(B.ldexp_f32(x, np.int32(-k)), E2M1, pol)
        s = np.float32(2.0**-k) if k < 127 else np.float32(2.0**-127)
        with np.errstate(all="ignore"):
            got = Q._fp4_codes_float((b[0::2], b[1::2]), s)
        np.testing.assert_array_equal(got & 0xF, want[0::2], err_msg=f"k={k}")
        np.testing.assert_array_equal(got >> 4, want[1::2], err_msg=f"k={k}")


def test_float_path_e2m1_magnitude_by_magic_add_every_bf16_pattern_numpy():
    """The NVFP4 FLOAT path's E2M1 rounding (fl(a + M) - M, then ·2^-126), run on NumPy (IEEE,
    subnormals kept, as on the GPU) for every non-NaN bfloat16 pattern times power-of-two and
    NVFP4-like encode factors, against the emulator's product and encoder."""
    x = all_bf16_as_f32()
    x = x[~np.isnan(x)]
    pol = Policy(nan=NanPolicy.ZERO)
    rng = np.random.default_rng(11)
    factors = [
        1.0,
        2.0**-3,
        3.0e-3,
        1.0 / 2688,
        7.1e5,
        2.0**100,
        2.0**-100,
        np.finfo(np.float32).max,
    ]
    factors += list(rng.uniform(0.5, 2.0, 6) * 2.0 ** rng.integers(-60, 60, 6))
    with np.errstate(all="ignore"):
        for s in factors:
            s = np.float32(s)
            want = codec.encode(B.mul_f32(x, s), E2M1, pol).astype(np.uint32) & U(7)
            got = Q.e2m1_magnitude_float(x * s)
            np.testing.assert_array_equal(got, want, err_msg=f"s={s}")


def test_float_path_e2m1_magnitude_float32_ties_and_neighbours_numpy():
    vals = codec.decode(np.arange(8, dtype=np.uint8), E2M1).astype(np.float32)
    mids = ((vals[1:].astype(np.float64) + vals[:-1]) / 2).astype(np.float32)
    pts = np.concatenate([vals, mids, np.float32([6.5, 7.0, 8.0, 1e30, np.inf, 2.0**-149, 0.0])])
    b = pts.view(np.uint32).astype(np.int64)
    near = np.concatenate([b + d for d in range(-4, 5)])
    near = near[(near >= 0) & (near < 0x7F800001)].astype(np.uint32).view(np.float32)
    want = codec.encode(near, E2M1, Policy(nan=NanPolicy.ZERO)).astype(np.uint32) & U(7)
    np.testing.assert_array_equal(Q.e2m1_magnitude_float(near), want)
    np.testing.assert_array_equal(Q.e2m1_magnitude_float(-near), want)


def test_float_path_fp8_within_range_on_cpu():
    """FLOAT-path FP8 codes for |x·s| <= max (XLA:CPU's cast does not saturate; the GPU's
    cvt.rn.satfinite does, which the @gpu tests check)."""
    x = all_bf16_as_f32()
    for fmt, elem in ((B.MXFP8_E4M3, E4M3), (B.MXFP8_E5M2, E5M2)):
        sel = np.isnan(x) | ((np.abs(x) <= elem.max) & ((np.abs(x) >= 2.0**-126) | (x == 0)))
        xs = x[sel]
        got = np.asarray(
            _j(lambda b, fmt=fmt: Q._fp8_codes_float(b, np.float32(1.0), fmt))(
                jnp.asarray(_bits(xs))
            )
        )
        np.testing.assert_array_equal(got, codec.encode(xs, elem))


NV_CONST = B.NVFP4.replace(global_scale=B.GlobalScale.CONSTANT)


@pytest.mark.parametrize("g", [1.0, 2.0**-7, 3.0e-3, 2.0**-117, 7.1e5, 1.0 / 2688])
def test_nvfp4_block_and_element_arithmetic(g):
    """Blocks of 16 drawn from every bfloat16 pattern, with a constant decode factor g."""
    x = all_bf16_as_f32().reshape(-1, 16)
    want = emu_quantize(x, NV_CONST, global_scale=np.float32(g))

    def f(bits):
        amax = jnp.max(bits & U(0x7FFFFFFF), axis=1)
        params, _ = Q.nv_params(amax.max(), NV_CONST, jnp.float32(g), None)
        p = Q.params_dict(list(params))
        s_code, enc_m, enc_e, nan, _ = Q._nv_block(amax, p)
        codes = Q._nv_codes(bits, enc_m[:, None], enc_e[:, None], nan[:, None])
        return s_code, codes

    s_code, codes = _j(f)(jnp.asarray(_bits(x)))
    np.testing.assert_array_equal(np.asarray(s_code), want.scales[:, 0])
    np.testing.assert_array_equal(np.asarray(codes), want.codes)

    # The FLOAT path as the GPU runs it (one multiply for amax·k, the magic-add E2M1 rounding,
    # the NaN-block mask), checked on XLA:CPU where its FTZ/DAZ cannot matter: blocks whose
    # elements are all normal, zero, Inf or NaN.
    def f_float(bits):
        amax = jnp.max(bits & U(0x7FFFFFFF), axis=1)
        params, _ = Q.nv_params(amax.max(), NV_CONST, jnp.float32(g), None)
        p = Q.params_dict(list(params))
        s_code, _, _, nan, enc = Q._nv_block(amax, p, ieee=True)
        return s_code, nan, enc

    a = np.abs(x)
    ok = np.all((a >= 2.0**-126) | (a == 0) | ~np.isfinite(a), axis=1)
    s_f, nan, enc = (np.asarray(v) for v in _j(f_float)(jnp.asarray(_bits(x))))
    b = _bits(x).reshape(-1, 8, 2)  # (even, odd) elements of each byte
    with np.errstate(all="ignore"):  # the element step on NumPy: IEEE, as on the GPU
        y = Q._fp4_codes_float(
            (b[..., 0], b[..., 1]),
            enc[:, None],
            block_keep=np.where(nan, np.uint32(0), np.uint32(1))[:, None],
        )
    unpacked = np.stack([y & 0xF, y >> 4], axis=-1).reshape(-1, 16)
    np.testing.assert_array_equal(np.asarray(s_f)[ok], want.scales[ok, 0])
    np.testing.assert_array_equal(unpacked[ok], want.codes[ok])
    assert ok.sum() > 3000


# --- layer 2: whole kernels in GPU interpret mode --------------------------------------------
def special_tensor(shape, dtype, *, finite=False, seed=0):
    """Rows of Gaussians at exponents from subnormal to huge, plus special blocks."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * np.exp2(rng.integers(-40, 40, (shape[0], 1)))).astype(
        np.float32
    )
    x[2, :] = 0.0
    x[3, :] = -0.0
    x[4, :] = (rng.standard_normal(shape[1]) * 2.0**-135).astype(np.float32)  # subnormal
    x[5, ::7] = np.float32(2.0**-149)
    x[6, :] = np.float32(448.0 * 2.0**-20) * np.sign(rng.standard_normal(shape[1]))
    if not finite:
        x[0, :5] = [np.nan, 1.0, -2.0, 3.0, 4.0]
        x[1, 3] = np.inf
        x[7, 9] = -np.inf
        x[7, 40] = np.nan
    with np.errstate(over="ignore"):
        return x.astype(dtype)


def _check(got: B.QuantizedArray, want: B.QuantizedArray) -> None:
    assert got.packed == want.packed and got.format == want.format
    np.testing.assert_array_equal(np.asarray(got.codes), np.asarray(want.codes))
    np.testing.assert_array_equal(np.asarray(got.scales), np.asarray(want.scales))
    if want.global_scale is None:
        assert got.global_scale is None
    else:
        np.testing.assert_array_equal(_bits(got.global_scale), _bits(want.global_scale))


_TILING = (
    "block_rows",
    "token_blocks",
    "element_path",
    "variant",
    "tiles_per_cta",
    "tma_row_bytes",
    "lanes",
    "transfer",
    "stages",
    "vector_words",
    "rows_per_thread",
)


def _run(x, fmt, **kw):
    """gpu_quantize in interpret mode; tiling keywords go into its QuantKernelConfig."""
    tiling = {k: kw.pop(k) for k in _TILING if k in kw}
    x = jnp.asarray(x)
    cfg = (
        Q.QuantKernelConfig.for_array(
            x, fmt, geometry=kw.get("geometry", B.Geometry.BLOCK), **tiling
        )
        if tiling
        else None
    )
    return interpret(lambda v: Q.gpu_quantize(v, fmt, config=cfg, **kw), x, detect_races=True)


MX_FORMATS = [B.MXFP8_E4M3, B.MXFP8_E5M2, B.MXFP4]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fmt", MX_FORMATS, ids=lambda f: f.name)
def test_mx_kernel_interpret_matches_emulator(fmt, dtype):
    x = special_tensor((64, 128), dtype)
    want = emu_quantize(x, fmt, pack=fmt.elem is E2M1)
    _check(_run(x, fmt), want)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_nvfp4_kernel_interpret_matches_emulator(dtype):
    x = special_tensor((64, 128), dtype, finite=True)
    _check(_run(x, B.NVFP4), emu_quantize(x, B.NVFP4, pack=True))
    xs = special_tensor((64, 128), dtype, seed=1)  # NaN/Inf blocks under a constant factor
    g = np.float32(2.0**-5)
    _check(
        _run(xs, NV_CONST, global_scale=g), emu_quantize(xs, NV_CONST, global_scale=g, pack=True)
    )
    _check(_run(xs, B.NVFP4_SINGLE), emu_quantize(xs, B.NVFP4_SINGLE, pack=True))
    # a NaN anywhere makes the per-tensor factor NaN: every scale NaN, every code +0
    _check(_run(xs, B.NVFP4), emu_quantize(xs, B.NVFP4, pack=True))


def test_kernel_several_ctas_unpacked_and_encode_factor():
    x = special_tensor((128, 64), BF16, seed=3)
    _check(_run(x, B.MXFP4, pack=False, block_rows=64), emu_quantize(x, B.MXFP4))
    s = np.float32(1000.0)
    xf = special_tensor((128, 64), BF16, finite=True, seed=4)
    _check(
        _run(xf, NV_CONST, global_encode_scale=s, block_rows=64),
        emu_quantize(xf, NV_CONST, global_encode_scale=s, pack=True),
    )


@pytest.mark.parametrize("tiles", [2, 3])
def test_double_buffered_ctas_race_free_and_exact(tiles):
    """CTAs looping over several tiles through the 2-slot TMA ring (race detector on)."""
    x = special_tensor((192, 64), BF16, seed=8)  # 384 MX blocks: 6 tiles of 64
    _check(_run(x, B.MXFP8_E4M3, block_rows=64, tiles_per_cta=tiles), emu_quantize(x, B.MXFP8_E4M3))
    _check(
        _run(x, B.NVFP4_SINGLE, block_rows=64, tiles_per_cta=tiles),
        emu_quantize(x, B.NVFP4_SINGLE, pack=True),
    )


@pytest.mark.parametrize(
    "transfer,lanes,stages,tiles",
    [
        (Q.Transfer.TMA, 1, 3, 6),
        (Q.Transfer.TMA, 4, 2, 3),
        (Q.Transfer.DIRECT, 1, 2, 3),
        (Q.Transfer.DIRECT, 2, 2, 2),
        (Q.Transfer.DIRECT, 4, 2, 1),
    ],
)
def test_transfers_lanes_and_ring_depths_race_free_and_exact(transfer, lanes, stages, tiles):
    """Every data path (TMA ring of 2-3 slots around a CTA loop, direct GMEM loads), each with
    1, 2 or 4 threads per scale block (race detector on)."""
    x = special_tensor((192, 64), BF16, seed=9)  # 3 tiles of 128 MX blocks, 6 of NVFP4 blocks
    kw = dict(block_rows=128, transfer=transfer, lanes=lanes, stages=stages, tiles_per_cta=tiles)
    _check(_run(x, B.MXFP8_E4M3, **kw), emu_quantize(x, B.MXFP8_E4M3))
    _check(_run(x, B.NVFP4_SINGLE, **kw), emu_quantize(x, B.NVFP4_SINGLE, pack=True))


@pytest.mark.parametrize("fmt", [B.MXFP8_E4M3, B.MXFP4], ids=lambda f: f.name)
@pytest.mark.parametrize("dtype", [BF16, np.dtype(np.float32)], ids=str)
def test_token_block_kernel_interpret_matches_emulator(fmt, dtype):
    x = special_tensor((128, 64), dtype, seed=5)
    x[32:64] *= np.float32(2.0**-100)
    want = emu_quantize(x, fmt, axis=-2, geometry=B.Geometry.TOKEN_BLOCK, pack=fmt.elem is E2M1)
    _check(_run(x, fmt, axis=-2, geometry=B.Geometry.TOKEN_BLOCK), want)


@settings(max_examples=6, deadline=None)
@given(
    fmt=st.sampled_from([B.MXFP8_E4M3, B.MXFP4, B.NVFP4_SINGLE, B.MXFP8_E5M2]),
    dtype=st.sampled_from(DTYPES),
    lead=st.sampled_from([(2, 32), (64,), (4, 4, 8)]),
    cols=st.sampled_from([32, 64, 256]),
    spread=st.integers(0, 140),
    seed=st.integers(0, 2**16),
)
def test_kernel_property_random_shapes_and_ranges(fmt, dtype, lead, cols, spread, seed):
    rng = np.random.default_rng(seed)
    shape = lead + (cols,)
    rows = int(np.prod(lead)) * cols // fmt.block_size
    if rows % 64:
        shape = (64,) + (cols,)
    e = rng.integers(-spread, spread + 1, shape[:-1] + (1,))
    with np.errstate(over="ignore"):
        x = (rng.standard_normal(shape) * np.exp2(e.astype(np.float64))).astype(np.float32)
    x.reshape(-1)[rng.integers(0, x.size, 3)] = [np.nan, np.inf, 0.0]
    with np.errstate(over="ignore"):
        x = x.astype(dtype)  # overflow to Inf is part of the test
    _check(_run(x, fmt), emu_quantize(x, fmt, pack=fmt.elem is E2M1))


def test_swizzled_scales_use_the_emulator_layout():
    x = special_tensor((128, 128), BF16, seed=6)
    q = _run(x, B.MXFP4)
    got = np.asarray(Q.swizzled_scales(q))
    want = layouts.to_layout(emu_quantize(x, B.MXFP4).scales, layouts.ScaleLayout.SWIZZLED_128X4)
    np.testing.assert_array_equal(got, want)


# --- layer 3: cross-lowering ----------------------------------------------------------------
@pytest.mark.parametrize(
    "cfg",
    Q.shipped_configs()
    + tuple(
        Q.QuantKernelConfig(
            fmt=f,
            element_path=Q.ElementPath.INTEGER,
            transfer=tr,
            lanes=ln,
            tiles_per_cta=t,
            stages=st,
            tma_row_bytes=rb,
        )
        for f in (B.MXFP8_E4M3, B.MXFP4, B.NVFP4)
        for tr, ln, t, st, rb in (
            (Q.Transfer.TMA, 1, 1, 2, 16),
            (Q.Transfer.TMA, 4, 8, 3, 512),
            (Q.Transfer.DIRECT, 2, 4, 2, 512),
        )
    ),
    ids=lambda c: (
        f"{c.fmt.name}-{c.in_dtype}-{c.geometry.name}-{c.element_path}-"
        f"{c.transfer.name}-L{c.lanes}-t{c.tiles_per_cta}-s{c.stages}-"
        f"{c.tma_row_bytes}"
    ),
)
def test_every_shipped_config_cross_lowers_for_sm90a(cfg):
    rows = 1024
    if cfg.geometry is B.Geometry.BLOCK:
        words = jax.ShapeDtypeStruct((rows, cfg.words_per_block), jnp.uint32)
    else:
        words = jax.ShapeDtypeStruct((rows, 32, cfg.words_per_block), jnp.uint32)
    text = cross_lower(
        Q.build_kernel(cfg, rows),
        words,
        jax.ShapeDtypeStruct((Q.NUM_PARAMS,), jnp.uint32),
        arch=Arch.SM90A,
    )
    assert "mosaic_gpu" in text


# --- configuration errors, before any kernel is built ---------------------------------------
def test_bad_configurations_raise_naming_the_argument():
    x = np.zeros((64, 64), np.float32)
    with pytest.raises(ValueError, match="MXFP6"):
        Q.gpu_quantize(x, B.MXFP6_E2M3)
    with pytest.raises(TypeError, match="dtype"):
        Q.gpu_quantize(x.astype(np.float64), B.MXFP8)
    with pytest.raises(TypeError, match="dtype"):
        Q.gpu_quantize(x.astype(np.int32), B.MXFP8)
    with pytest.raises(ValueError, match="policy"):
        Q.gpu_quantize(x, B.MXFP8.replace(policy=Policy(nan=NanPolicy.ZERO)))
    with pytest.raises(ValueError, match="arithmetic"):
        Q.gpu_quantize(x, B.MXFP8.replace(arithmetic=B.Arithmetic.TORCHAO))
    with pytest.raises(ValueError, match="axis"):
        Q.gpu_quantize(x, B.MXFP8, axis=0)
    with pytest.raises(ValueError, match="SQUARE"):
        Q.gpu_quantize(x, B.MXFP8, geometry=B.Geometry.SQUARE)
    with pytest.raises(ValueError, match="pack"):
        Q.gpu_quantize(x, B.MXFP8, pack=True)
    with pytest.raises(ValueError, match="multiple of"):
        Q.gpu_quantize(np.zeros((3, 32), np.float32), B.MXFP8)
    with pytest.raises(ValueError, match="block extent"):
        Q.gpu_quantize(np.zeros((64, 40), np.float32), B.MXFP8)
    with pytest.raises(ValueError, match="global_scale"):
        Q.gpu_quantize(x, NV_CONST)
    with pytest.raises(ValueError, match="PER_ROW"):
        Q.gpu_quantize(x, B.NVFP4.replace(global_scale=B.GlobalScale.PER_ROW))
    with pytest.raises(ValueError, match="block_rows"):
        Q.QuantKernelConfig(fmt=B.MXFP8, block_rows=100)
    with pytest.raises(TypeError, match="fmt"):
        Q.gpu_quantize(x, "MXFP8")
    with pytest.raises(ValueError, match="lanes"):
        Q.QuantKernelConfig(fmt=B.MXFP8, lanes=3)
    with pytest.raises(ValueError, match="stages"):
        Q.QuantKernelConfig(fmt=B.MXFP8, stages=0)
    with pytest.raises(TypeError, match="transfer"):
        Q.QuantKernelConfig(fmt=B.MXFP8, transfer="tma")
    with pytest.raises(ValueError, match="vector_words=16"):
        Q.QuantKernelConfig(fmt=B.NVFP4, vector_words=16)
    with pytest.raises(ValueError, match="rows_per_thread=3"):
        Q.QuantKernelConfig(fmt=B.NVFP4, rows_per_thread=3)
    with pytest.raises(ValueError, match="rows_per_thread=2 needs lanes=1"):
        Q.QuantKernelConfig(fmt=B.NVFP4, rows_per_thread=2, lanes=2)
    with pytest.raises(ValueError, match="vector_words"):
        Q.gpu_quantize(x, B.MXFP4, config=Q.QuantKernelConfig.for_array(x, B.MXFP4, vector_words=2))
    with pytest.raises(ValueError, match="config has .*'fmt': MXFP8_E4M3"):
        Q.gpu_quantize(x, B.MXFP4, config=Q.QuantKernelConfig.for_array(x, B.MXFP8))
    with pytest.raises(ValueError, match="config has .*in_dtype"):
        Q.gpu_quantize(x, B.MXFP8, config=Q.QuantKernelConfig(fmt=B.MXFP8, in_dtype=np.float16))
    with pytest.raises(TypeError, match="config="):
        Q.gpu_quantize(x, B.MXFP8, config={"block_rows": 64})


def test_default_tiling_is_the_measured_best_and_explicit_fields_win():
    # From bfloat16 (measured faster on the H200): MXFP8 one lane per 64-byte block row as two
    # 32-byte vectors in 256-row tiles; NVFP4 two blocks per thread as 32-byte vectors, four
    # tiles per CTA
    bf8 = Q.QuantKernelConfig(fmt=B.MXFP8_E4M3)
    assert (
        bf8.transfer,
        bf8.lanes,
        bf8.block_rows,
        bf8.tiles_per_cta,
        bf8.vector_words,
        bf8.rows_per_thread,
    ) == (Q.Transfer.DIRECT, 1, 256, 1, 8, 1)
    assert Q.QuantKernelConfig(fmt=B.MXFP8_E5M2) == Q.QuantKernelConfig(
        fmt=B.MXFP8_E5M2, lanes=1, vector_words=8, block_rows=256
    )
    # float16 / float32 input and explicit lanes keep the previous FP8 tiling
    f16 = Q.QuantKernelConfig(fmt=B.MXFP8_E4M3, in_dtype=np.float16)
    assert (f16.lanes, f16.block_rows, f16.vector_words) == (4, 128, 4)
    f32 = Q.QuantKernelConfig(fmt=B.MXFP8_E4M3, in_dtype=np.float32)
    assert (f32.lanes, f32.block_rows) == (4, 256)
    four = Q.QuantKernelConfig(fmt=B.MXFP8_E4M3, lanes=4)
    assert (four.block_rows, four.vector_words) == (128, 4)
    nv = Q.QuantKernelConfig(fmt=B.NVFP4)
    assert (nv.transfer, nv.lanes, nv.block_rows, nv.tiles_per_cta) == (
        Q.Transfer.DIRECT,
        1,
        256,
        4,
    )
    assert (nv.vector_words, nv.rows_per_thread) == (8, 2)
    # MXFP4, other input dtypes, shared blocks and the TMA ring keep one block in 16-byte vectors
    for cfg in (
        Q.QuantKernelConfig(fmt=B.MXFP4),
        Q.QuantKernelConfig(fmt=B.NVFP4, lanes=2),
        Q.QuantKernelConfig(fmt=B.NVFP4, in_dtype=np.float32),
        Q.QuantKernelConfig(fmt=B.NVFP4, in_dtype=np.float16),
        Q.QuantKernelConfig(fmt=B.NVFP4, transfer=Q.Transfer.TMA),
    ):
        assert (cfg.vector_words, cfg.rows_per_thread, cfg.tiles_per_cta) == (
            4,
            1,
            2 if cfg.transfer is Q.Transfer.TMA else 1,
        ), cfg
    assert Q.QuantKernelConfig(fmt=B.NVFP4, rows_per_thread=1).vector_words == 8
    assert Q.QuantKernelConfig(fmt=B.NVFP4, tiles_per_cta=1).tiles_per_cta == 1
    tma = Q.QuantKernelConfig(fmt=B.NVFP4, transfer=Q.Transfer.TMA, lanes=2)
    assert (tma.lanes, tma.tiles_per_cta) == (2, 2)
    assert hash(nv) == hash(Q.QuantKernelConfig(fmt=B.NVFP4, tiles_per_cta=4))


@pytest.mark.parametrize(
    "num_rows,want",
    [
        (64, (64, 1, 2, 1)),
        (128, (128, 1, 1, 1)),
        (256, (256, 1, 1, 2)),
        (1 << 20, (256, 4, 1, 2)),
        (768, (256, 3, 1, 2)),
    ],
)
def test_rows_per_thread_falls_back_on_small_tiles(num_rows, want):
    """(rows per tile, tiles per CTA, lanes, rows per thread): a tile smaller than 128 rows per
    thread-row falls back to one row per thread, then to blocks shared by two lanes."""
    assert Q._block_geometry(Q.QuantKernelConfig(fmt=B.NVFP4), num_rows) == want


@pytest.mark.parametrize(
    "fmt,dtype,tiling",
    [
        (B.NVFP4, BF16, dict(vector_words=8, rows_per_thread=4, block_rows=1024)),
        (NV_CONST, np.dtype(np.float32), dict(vector_words=8, rows_per_thread=2)),
        (B.MXFP4, BF16, dict(vector_words=8, rows_per_thread=2)),
    ],
    ids=lambda v: getattr(v, "name", str(v)),
)
def test_wide_vector_tilings_interpret_match_emulator(fmt, dtype, tiling):
    x = special_tensor((128, 256), dtype, finite=fmt is B.NVFP4, seed=9)
    kw = {"global_scale": np.float32(2.0**-3)} if fmt is NV_CONST else {}
    _check(_run(x, fmt, **kw, **tiling), emu_quantize(x, fmt, pack=True, **kw))


def _mosaic_ops(stablehlo_text):
    """The Mosaic GPU module inside a cross-lowered custom call, as MLIR text."""
    import re

    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir

    blob = re.search(r'module = "((?:[^"\\]|\\.)*)"', stablehlo_text).group(1)
    out, i = bytearray(), 0
    while i < len(blob):  # undo the printer's escapes (\\, \", \XX hex)
        if blob[i] == "\\":
            if blob[i + 1] in '\\"':
                out.append(ord(blob[i + 1]))
                i += 2
            else:
                out.append(int(blob[i + 1 : i + 3], 16))
                i += 3
        else:
            out += blob[i].encode()
            i += 1
    ctx = mlir.make_ir_context()
    ctx.allow_unregistered_dialects = True
    with ctx:
        return str(ir.Module.parse(bytes(out)))


@pytest.mark.parametrize(
    "tiling,loads,stores",
    [
        (dict(vector_words=4, rows_per_thread=1), "vector<4xi32>", "vector<4xi8>"),
        ({}, "vector<8xi32>", "vector<8xi8>"),  # the NVFP4 bf16 default
        (dict(vector_words=8, rows_per_thread=4, block_rows=1024), "vector<8xi32>", "vector<8xi8>"),
    ],
    ids=["16B", "default", "r4"],
)
def test_nvfp4_tilings_cross_lower_to_the_intended_vector_accesses(tiling, loads, stores):
    """Cross-lowered for sm_90a, every global load of the NVFP4 kernel moves ``loads`` and
    every packed-code store ``stores`` (one byte per scale)."""
    import re

    cfg = Q.QuantKernelConfig(fmt=NV_CONST, **tiling)
    rows = 4096
    text = _mosaic_ops(
        cross_lower(
            Q.build_kernel(cfg, rows),
            jax.ShapeDtypeStruct((rows, cfg.words_per_block), jnp.uint32),
            jax.ShapeDtypeStruct((Q.NUM_PARAMS,), jnp.uint32),
        )
    )
    vec_loads = set(re.findall(r"llvm\.load.*-> (vector<\w+>)", text))
    vec_stores = set(re.findall(r"llvm\.store\"\(\S+ \S+\) .*: \((vector<\w+>)", text))
    assert vec_loads == {loads}
    assert vec_stores == {stores, "vector<1xi8>"}


# --- on the H200 ------------------------------------------------------------------------------
def _gpu_case(fmt, x, element_path=None, tiling=None, **kw):
    from fp4sim.formats import blocks

    geometry = kw.get("geometry", B.Geometry.BLOCK)  # the config must describe the call
    cfg = Q.QuantKernelConfig.for_array(
        x, fmt, geometry=geometry, element_path=element_path, **(tiling or {})
    )
    q = jax.block_until_ready(
        jax.jit(functools.partial(Q.gpu_quantize, fmt=fmt, config=cfg, **kw))(x)
    )
    emu = jax.jit(functools.partial(blocks.quantize, fmt=fmt, pack=q.packed, **kw))
    _check(q, jax.block_until_ready(emu(x)))


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", [B.MXFP8_E4M3, B.MXFP4], ids=lambda f: f.name)
def test_gpu_8192_bf16_with_special_blocks(fmt):
    from fp4sim.benchmarks.gpu_quant import test_tensor

    assert gpu_available()
    _gpu_case(fmt, test_tensor(8192, BF16))


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", [B.MXFP8_E4M3, B.MXFP4, NV_CONST], ids=lambda f: f.name)
def test_gpu_8192_integer_path_and_ring(fmt):
    from fp4sim.benchmarks.gpu_quant import test_tensor

    kw = {"global_scale": jnp.float32(2.0**-7)} if fmt is NV_CONST else {}
    _gpu_case(fmt, test_tensor(8192, BF16), element_path=Q.ElementPath.INTEGER, **kw)
    _gpu_case(
        fmt,
        test_tensor(8192, BF16),
        **kw,
        tiling=dict(transfer=Q.Transfer.TMA, lanes=1, block_rows=256, tiles_per_cta=4, stages=3),
    )


@pytest.mark.gpu
def test_gpu_8192_nvfp4():
    from fp4sim.benchmarks.gpu_quant import test_tensor

    _gpu_case(B.NVFP4, test_tensor(8192, BF16, finite=True))
    _gpu_case(NV_CONST, test_tensor(8192, BF16), global_scale=jnp.float32(2.0**-7))
    for tiling in (
        dict(vector_words=4, rows_per_thread=1),  # the previous default
        dict(vector_words=8, rows_per_thread=4, block_rows=1024),
    ):
        _gpu_case(
            NV_CONST, test_tensor(8192, BF16), global_scale=jnp.float32(2.0**-7), tiling=tiling
        )


@pytest.mark.gpu
@pytest.mark.parametrize("g", [3.0e-3, 7.1e5, 1.0 / 2688, 2.0**-117, 1.0])
def test_gpu_nvfp4_encode_factor_exact_for_any_decode_factor(g):
    """The per-block 1/fl(s·g) comes from the exactly divided table R[j]·2^-e: arbitrary
    significands of g, every UE4M3 scale (blocks spanning 2^±40), NaN/Inf/zero blocks."""
    x = jnp.asarray(special_tensor((512, 256), BF16, seed=12))
    _gpu_case(NV_CONST, x, global_scale=jnp.float32(g))
    _gpu_case(NV_CONST, x, global_scale=jnp.float32(g), element_path=Q.ElementPath.INTEGER)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gpu_small_every_format(dtype):
    for fmt in MX_FORMATS + [B.NVFP4_SINGLE]:
        x = jnp.asarray(special_tensor((256, 256), dtype))
        _gpu_case(fmt, x)
    x = jnp.asarray(special_tensor((256, 128), dtype, seed=7))
    _gpu_case(B.MXFP8_E4M3, x, axis=-2, geometry=B.Geometry.TOKEN_BLOCK)

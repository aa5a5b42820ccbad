"""Each preset against the library it imitates: stored torchao vectors, the installed JAX
quantizer, and an independent transcription of the OCP/microxcaling algorithm."""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from fp4sim import golden
from fp4sim.formats import codec
from fp4sim.formats.blocks import GlobalScale, ScaleRule, dequantize, quantize
from fp4sim.formats.presets import (
    BLOCK_PRESETS,
    JAX_MXFP8,
    JAX_NVFP4,
    OCP_MXFP4,
    OCP_MXFP6_E2M3,
    OCP_MXFP6_E3M2,
    OCP_MXFP8_E4M3,
    OCP_MXFP8_E5M2,
    TE_NVFP4,
    TORCHAO_MX,
    TORCHAO_NVFP4,
    TORCHAO_NVFP4_SINGLE,
    preset,
)

GOLDEN = golden.DATA_DIR / "presets"
MODES = {
    "floor": ScaleRule.FLOOR,
    "rceil": ScaleRule.RCEIL,
    "ceil": ScaleRule.CEIL,
    "even": ScaleRule.EVEN,
}


def same_bits(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return bool(np.all((a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))))


@pytest.mark.parametrize("elem", ["e2m1", "e4m3", "e5m2", "e2m3", "e3m2"])
@pytest.mark.parametrize("mode", list(MODES))
def test_torchao_mx_vectors(elem, mode):
    d = np.load(GOLDEN / f"torchao_mx_{elem}.npz")
    fmt = TORCHAO_MX[(elem.upper(), MODES[mode])]
    for prefix in ("", "special_"):
        x = d[prefix + "x"]
        q = quantize(x, fmt)
        assert np.array_equal(q.scales, d[prefix + "scales_" + mode]), prefix
        # element codes are compared in blocks whose scale is not NaN (a NaN scale makes the
        # whole block NaN; torchao's own codes there are artefacts of x/NaN)
        live = q.scales[:, 0] != 0xFF
        assert np.array_equal(q.codes[live], d[prefix + "codes_" + mode][live]), prefix
        assert same_bits(dequantize(q), d[prefix + "dequant_" + mode]), prefix
        if elem == "e2m1":
            assert np.array_equal(q.pack().codes[live], d[prefix + "packed_" + mode][live])


@pytest.mark.parametrize(
    "name,fmt", [("torchao_nvfp4", TORCHAO_NVFP4_SINGLE), ("torchao_nvfp4_pts", TORCHAO_NVFP4)]
)
def test_torchao_nvfp4_vectors(name, fmt):
    d = np.load(GOLDEN / f"{name}.npz")
    q = quantize(d["x"], fmt)
    if "per_tensor_scale" in d:
        assert same_bits(q.global_scale, d["per_tensor_scale"])
    assert np.array_equal(q.scales, d["scales"])
    assert np.array_equal(q.codes, d["codes"])
    assert np.array_equal(q.pack().codes, d["packed"])
    assert same_bits(dequantize(q), d["dequant"])


def test_torchao_nvfp4_clamp_differs_from_te_on_tiny_blocks():
    # torchao clamps the block scale to 2^-6 (smallest normal E4M3); TE allows subnormal scales
    x = np.zeros((1, 16), np.float32)
    x[0, 0] = 0.01
    assert int(quantize(x, TORCHAO_NVFP4_SINGLE).scales[0, 0]) == 0x08  # 2^-6
    te = quantize(x, TE_NVFP4.replace(global_scale=GlobalScale.NONE))
    assert int(te.scales[0, 0]) == 0x01  # 0.01/6 = 0.00167 -> the E4M3 subnormal 2^-9


# --- JAX's scaled_matmul quantizer, installed here: compare directly ----------------------
def _jax_data():
    rng = np.random.default_rng(11)
    x = rng.standard_normal((64, 128)) * np.exp(rng.standard_normal((64, 1)) * 3)
    x = x.astype(np.float32)
    x[0, :4] = [448 * 3, 1e-3, -7, 2.0**-20]
    x[1, :32] = np.inf
    return x


def test_jax_mxfp8_quantizer():
    from jax._src.cudnn import scaled_matmul_stablehlo as sms
    from jax._src.nn.functions import get_scaled_dot_general_config

    x = _jax_data()
    xq, sq = sms.quantize(jnp.asarray(x), get_scaled_dot_general_config("mxfp8"))
    q = quantize(x, JAX_MXFP8)
    assert np.array_equal(q.scales, np.asarray(sq).view(np.uint8))
    assert np.array_equal(q.codes, np.asarray(xq).view(np.uint8))


@pytest.mark.parametrize("global_is_amax", [False, True])
def test_jax_nvfp4_quantizer(global_is_amax):
    from jax._src.cudnn import scaled_matmul_stablehlo as sms
    from jax._src.nn.functions import get_scaled_dot_general_config

    x = _jax_data()[2:]  # JAX's NVFP4 helper is for finite data
    g = np.float32(np.abs(x).max()) / np.float32(2688) if global_is_amax else np.float32(1)
    cfg = get_scaled_dot_general_config("nvfp4", global_scale=jnp.float32(g))
    xq, sq = sms.quantize(jnp.asarray(x), cfg)
    q = quantize(x, JAX_NVFP4, global_scale=g)
    assert np.array_equal(q.scales, np.asarray(sq).view(np.uint8))
    ours = codec.decode(q.codes, JAX_NVFP4.elem)
    assert same_bits(ours, np.asarray(xq.astype(jnp.float32)))


# --- OCP MX v1.0 / microxcaling, transcribed independently in float64 -----------------------
def microxcaling_reference(x, fmt):
    """shared_exp = floor(log2(amax)) - emax (zero blocks: FP32_MIN_NORMAL), clamp to
    [-127, 127]; elements x / 2^shared_exp rounded to nearest, ties away, saturating."""
    blocks = x.reshape(-1, 32).astype(np.float64)
    amax = np.abs(blocks).max(-1)
    amax = np.where(amax == 0, 2.0**-126, amax)
    e = np.clip(np.floor(np.log2(amax)) - fmt.elem.emax, -127, 127)
    t = blocks / 2.0 ** e[:, None]
    grid = np.unique(
        np.abs(codec.value_table(fmt.elem)[np.isfinite(codec.value_table(fmt.elem))]).astype(
            np.float64
        )
    )
    a = np.minimum(np.abs(t), grid[-1])
    idx = np.clip(np.searchsorted(grid, a), 1, len(grid) - 1)
    lo, hi = grid[idx - 1], grid[idx]
    pick = np.where(a - lo >= hi - a, hi, lo)  # ties away from zero
    vals = np.sign(t) * pick * 2.0 ** e[:, None]
    return (e + 127).astype(np.uint8), vals.reshape(x.shape)


@pytest.mark.parametrize(
    "fmt", [OCP_MXFP4, OCP_MXFP6_E2M3, OCP_MXFP6_E3M2, OCP_MXFP8_E4M3, OCP_MXFP8_E5M2]
)
def test_ocp_reference(fmt):
    rng = np.random.default_rng(12)
    x = (rng.standard_normal((48, 64)) * np.exp2(rng.integers(-20, 20, (48, 1)))).astype(np.float32)
    # every element-grid tie at a few scales, and the classic clamp case (microxcaling #4)
    grid = np.unique(np.abs(codec.value_table(fmt.elem)[np.isfinite(codec.value_table(fmt.elem))]))
    ties = ((grid[1:] + grid[:-1]) / 2).astype(np.float32)
    x[0, : len(ties)] = ties[:64]
    x[0, 63] = grid[-1]
    x[1] = 0.0
    x[2, 0] = 957.0 if fmt.elem.emax == 8 else 7.0
    scales, ref = microxcaling_reference(x, fmt)
    q = quantize(x, fmt)
    assert np.array_equal(q.scales.ravel(), scales)
    assert np.array_equal(dequantize(q), ref.astype(np.float32))
    if fmt is OCP_MXFP8_E4M3:
        assert dequantize(q)[2, 0] == 896.0  # "957 is quantized as 896"


def test_preset_registry():
    assert preset("torchao_nvfp4") is TORCHAO_NVFP4
    assert len(BLOCK_PRESETS) == len(set(BLOCK_PRESETS.values()))
    with pytest.raises(ValueError, match="preset="):
        preset("nope")


@pytest.mark.optional
def test_torchao_direct():
    torchao = pytest.importorskip(
        "torchao",
        reason="torchao is not installed in this venv "
        "(it needs torch; vectors from it are stored in fp4sim/golden/data/presets)",
    )
    import torch
    from torchao.prototype.mx_formats.mx_tensor import to_mx

    x = np.random.default_rng(13).standard_normal((8, 64)).astype(np.float32)
    s, _ = to_mx(torch.from_numpy(x), torch.float8_e4m3fn, 32)
    assert np.array_equal(
        s.view(torch.uint8).numpy().reshape(8, 2),
        quantize(x, TORCHAO_MX[("E4M3", ScaleRule.FLOOR)]).scales,
    )
    assert torchao is not None
    assert ml_dtypes is not None


# --- TransformerEngine NVFP4QuantizerRef, transcribed step by step in NumPy float32 ---------------
def te_nvfp4_reference(x):
    """TE's reference steps (1x16 tiles, per-tensor amax, no RHT), float32 NumPy + ml_dtypes."""
    f32 = np.float32
    amax = np.abs(x).max()
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        s_enc = np.minimum(f32(448 * 6) / amax, np.finfo(f32).max).astype(f32)
        s_enc = f32(1) if s_enc == 0 else s_enc
        s_dec = (f32(1) / s_enc).astype(f32)
        b = x.reshape(x.shape[0], -1, 16)
        vec_max = np.abs(b).max(-1, keepdims=True)
        dec = vec_max * (s_enc * (f32(1) / f32(6)))
        dec = np.clip(np.minimum(dec, np.finfo(f32).max), -448, 448).astype(f32)
        dec = dec.astype(ml_dtypes.float8_e4m3fn)
        enc = np.minimum(f32(1) / (dec.astype(f32) * s_dec), np.finfo(f32).max).astype(f32)
        y = np.clip(b * enc, -6, 6).reshape(x.shape).astype(f32)
    codes = np.zeros(y.shape, np.uint8)  # TE's threshold table (NaN falls through to 0)
    table = [
        (0.0, 0.25, 0, True, True),
        (0.25, 0.75, 1, False, False),
        (0.75, 1.25, 2, True, True),
        (1.25, 1.75, 3, False, False),
        (1.75, 2.5, 4, True, True),
        (2.5, 3.5, 5, False, False),
        (3.5, 5.0, 6, True, True),
    ]
    for lo, hi, c, lo_in, hi_in in table:
        pos = ((y >= lo) if lo_in else (y > lo)) & ((y <= hi) if hi_in else (y < hi))
        neg = ((y <= -lo) if lo_in else (y < -lo)) & ((y >= -hi) if hi_in else (y > -hi))
        codes[pos] = c
        codes[neg & (y != 0)] = c | 8
    codes[y > 5.0] = 7
    codes[y < -5.0] = 15
    codes[(y >= -0.25) & (y < 0)] = 8
    return dec.view(np.uint8).reshape(x.shape[0], -1), codes, s_dec


def test_te_nvfp4_matches_transcribed_reference():
    rng = np.random.default_rng(14)
    x = (rng.standard_normal((32, 64)) * np.exp(rng.standard_normal((32, 1)) * 2)).astype(
        np.float32
    )
    x[0, :16] = [2.9, 0, 0.1, -0.1, 1e-4, -1e-4, 5.0, 2.5] + [0.0] * 8
    x[1, :16] = 0.0
    x[2, 16:32] = -0.0
    x[3, :16] = 1e-30
    for data in (x, x * np.float32(1e-3), x * np.float32(300)):
        scales, codes, s_dec = te_nvfp4_reference(data)
        q = quantize(data, TE_NVFP4)
        assert len(np.unique(scales)) > 20  # a real spread of block scales, not a degenerate case
        assert np.array_equal(q.scales, scales)
        assert same_bits(q.global_scale, s_dec)
        neg_zero_in = (data == 0) & np.signbit(data)  # TE: +0, fp4sim: -0 (see presets doc)
        assert np.array_equal(q.codes[~neg_zero_in], codes[~neg_zero_in])
        assert np.all(q.codes[neg_zero_in] == 8) and np.all(codes[neg_zero_in] == 0)


@pytest.mark.parametrize(
    "fmt,kw",
    [
        (JAX_MXFP8, {}),
        (JAX_NVFP4, {"global_scale": np.float32(0.37)}),
        (TORCHAO_NVFP4, {}),
        (TORCHAO_NVFP4_SINGLE, {}),
        (TORCHAO_MX[("E2M1", ScaleRule.RCEIL)], {}),
        (TE_NVFP4, {}),
        (OCP_MXFP8_E4M3, {}),
    ],
    ids=lambda v: getattr(v, "name", "kw"),
)
def test_presets_numpy_and_jit_bit_identical(fmt, kw):
    import jax

    rng = np.random.default_rng(15)
    x = (rng.standard_normal((16, 64)) * np.exp2(rng.integers(-130, 60, (16, 1)))).astype(
        np.float32
    )
    x[1] = 0.0
    x[2, :5] = [np.inf, -np.inf, 1e-40, -0.0, 448.0]
    q = quantize(x, fmt, **kw)
    qj = jax.jit(lambda v: quantize(v, fmt, **kw))(jnp.asarray(x))
    assert np.array_equal(q.codes, np.asarray(qj.codes))
    assert np.array_equal(q.scales, np.asarray(qj.scales))
    assert same_bits(dequantize(q), jax.jit(dequantize)(qj))

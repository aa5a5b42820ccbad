"""Hopper-legal decoders: every code against ml_dtypes and the emulator's codec, in NumPy, jitted
JAX and inside a Pallas kernel (GPU interpret mode), plus cross-lowering for sm_90a/sm_100a."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu

from fp4sim.formats import codec
from fp4sim.formats.spec import E2M1, E4M3, E5M2, UE4M3, UE8M0
from fp4sim.kernels import decoders as D
from fp4sim.kernels.harness import Arch, cross_lower, gpu_available, interpret

C8 = np.arange(256, dtype=np.uint8)
C4 = np.arange(16, dtype=np.uint8)


def _same_float(got, want):
    """Equal values, equal signs of zero, NaN where NaN (payloads may differ)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan], want[~nan])
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


CASES = [  # (decoder, codes, reference from ml_dtypes, emulator format)
    (D.e2m1_to_f16, C4, C4.view(ml_dtypes.float4_e2m1fn).astype(np.float16), E2M1),
    (D.e4m3_to_f16, C8, C8.view(ml_dtypes.float8_e4m3fn).astype(np.float16), E4M3),
    (D.e5m2_to_f16, C8, C8.view(ml_dtypes.float8_e5m2).astype(np.float16), E5M2),
]


@pytest.mark.parametrize("dec,codes,ref,fmt", CASES, ids=["e2m1", "e4m3", "e5m2"])
def test_every_code_numpy_jax_and_codec(dec, codes, ref, fmt):
    _same_float(dec(codes), ref)
    _same_float(np.asarray(jax.jit(dec)(jnp.asarray(codes))), ref)
    _same_float(np.asarray(dec(codes)).astype(np.float32), np.asarray(codec.decode(codes, fmt)))
    # higher bits of wider integer inputs are ignored only where the format says so: the
    # decoders read the low bits of any integer dtype
    _same_float(dec(codes.astype(np.uint32)), ref)


def test_e4m3_nan_keeps_sign_and_every_finite_code_is_exact():
    out = np.asarray(D.e4m3_to_f16(C8))
    assert np.isnan(out[0x7F]) and np.isnan(out[0xFF])
    assert not np.signbit(out[0x7F]) and np.signbit(out[0xFF])
    assert out[0x01] == np.float16(2.0**-9) and out[0x7E] == 448 and out[0x80] == 0
    assert np.signbit(out[0x80])


def test_e8m0_to_f32_every_code():
    out = np.asarray(D.e8m0_to_f32(C8))
    np.testing.assert_array_equal(
        out[1:255], C8[1:255].view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    )
    assert out.view(np.uint32)[0] == 0x00400000  # 2^-127 as bits (ml_dtypes: NaN)
    assert np.isnan(out[255])
    jit_out = np.asarray(jax.jit(D.e8m0_to_f32)(jnp.asarray(C8)))
    np.testing.assert_array_equal(jit_out.view(np.uint32), out.view(np.uint32))  # FTZ-proof
    _same_float(out, np.asarray(codec.decode(C8, UE8M0)))
    np.testing.assert_array_equal(np.asarray(D.e8m0_exponent(C8)), C8.astype(np.int32) - 127)


def test_ue4m3_ignores_the_sign_bit():
    out = np.asarray(D.ue4m3_to_f32(C8))
    _same_float(out[:128], np.asarray(codec.decode(C8[:128], UE4M3)))
    np.testing.assert_array_equal(out[128:].view(np.uint32), out[:128].view(np.uint32))


def test_unpack_e2m1_even_element_in_low_nibble():
    lo, hi = D.unpack_e2m1(C8)
    np.testing.assert_array_equal(np.asarray(lo), C8 & 0xF)
    np.testing.assert_array_equal(np.asarray(hi), C8 >> 4)


def test_float_input_is_rejected():
    with pytest.raises(TypeError, match="codes"):
        D.e4m3_to_f16(np.zeros(4, np.float32))


def _decode_kernel():
    """All 256 codes through every decoder inside one kernel (uint8 in SMEM -> registers)."""

    def body(c_ref, o16_ref, o5_ref, o4_ref, o32_ref, u_ref):
        c = c_ref[...].astype(jnp.uint32)
        o16_ref[...] = D.e4m3_to_f16(c)
        o5_ref[...] = D.e5m2_to_f16(c)
        o4_ref[...] = D.e2m1_to_f16(c)
        o32_ref[...] = D.e8m0_to_f32(c)
        u_ref[...] = D.ue4m3_to_f32(c)

    f16 = jax.ShapeDtypeStruct((256,), jnp.float16)
    f32 = jax.ShapeDtypeStruct((256,), jnp.float32)
    return plgpu.kernel(body, out_type=(f16, f16, f16, f32, f32))


def test_decoders_inside_a_kernel_in_interpret_mode():
    outs = interpret(_decode_kernel(), jnp.asarray(C8), detect_races=False)
    want = (
        D.e4m3_to_f16(C8),
        D.e5m2_to_f16(C8),
        D.e2m1_to_f16(C8 & 0xF),
        D.e8m0_to_f32(C8),
        D.ue4m3_to_f32(C8),
    )
    for got, w in zip(outs, want):
        got, w = np.asarray(got), np.asarray(w)
        np.testing.assert_array_equal(got.view(f"u{got.itemsize}"), w.view(f"u{w.itemsize}"))


@pytest.mark.parametrize("arch", [Arch.SM90A, Arch.SM100A])
def test_decoders_cross_lower(arch):
    text = cross_lower(_decode_kernel(), jax.ShapeDtypeStruct((256,), jnp.uint8), arch=arch)
    assert "mosaic_gpu" in text


@pytest.mark.gpu
def test_decoders_on_the_gpu_match_numpy():
    assert gpu_available()
    outs = jax.block_until_ready(_decode_kernel()(jnp.asarray(C8)))
    want = (
        D.e4m3_to_f16(C8),
        D.e5m2_to_f16(C8),
        D.e2m1_to_f16(C8 & 0xF),
        D.e8m0_to_f32(C8),
        D.ue4m3_to_f32(C8),
    )
    for got, w in zip(outs, want):
        got, w = np.asarray(got), np.asarray(w)
        np.testing.assert_array_equal(got.view(f"u{got.itemsize}"), w.view(f"u{w.itemsize}"))

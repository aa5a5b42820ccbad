"""Issue 15, items 7, 8, 12: CONSTANT global scales are validated, stochastic block formats
quantize with explicit random bits, and the NumPy path works in bounded passes (same bits)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp4sim
from fp4sim.formats import blocks, codec

RNG = np.random.default_rng(12)
X = (RNG.standard_normal((8, 64)) * 5).astype(np.float32)
NV_CONST = fp4sim.NVFP4.replace(global_scale=fp4sim.GlobalScale.CONSTANT)


# --- item 7 -------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw", [dict(global_scale=0.0), dict(global_scale=-1.0),
                                dict(global_scale=float("nan")), dict(global_scale=np.inf),
                                dict(global_encode_scale=0.0), dict(global_encode_scale=-2.0),
                                dict(global_scale=1e-45),  # its reciprocal overflows
                                dict(global_scale=np.float32([1.0, 0.0, 1, 1, 1, 1, 1, 1])
                                     .reshape(8, 1))])
@pytest.mark.parametrize("jit", [False, True])
def test_bad_constant_factors_raise_on_both_backends(kw, jit):
    name = next(iter(kw))

    def f(x):
        return fp4sim.quantize(x, NV_CONST, **kw)

    with pytest.raises(ValueError, match=f"{name} holds .* must be finite and > 0"):
        jax.jit(f)(jnp.asarray(X)) if jit else f(X)


def test_constant_factor_shapes_and_types():
    with pytest.raises(ValueError, match=r"global_scale has shape \(3,\); it must broadcast to "
                                         r"the scales' shape \(8, 4\)"):
        fp4sim.quantize(X, NV_CONST, global_scale=np.ones(3))
    with pytest.raises(TypeError, match="global_scale='1' is a string"):
        fp4sim.quantize(X, NV_CONST, global_scale="1")
    g = np.float32(RNG.uniform(0.5, 2, (8, 1)))
    q = fp4sim.quantize(X, NV_CONST, global_scale=g)  # one factor per row: fine
    qj = jax.jit(lambda x, g: fp4sim.quantize(x, NV_CONST, global_scale=g))(jnp.asarray(X), g)
    np.testing.assert_array_equal(np.asarray(qj.codes), q.codes)
    np.testing.assert_array_equal(np.asarray(qj.scales), q.scales)


def test_a_traced_bad_factor_gives_nan_not_zero():
    f = jax.jit(lambda x, g: fp4sim.dequantize(fp4sim.quantize(x, NV_CONST, global_scale=g)))
    assert np.isnan(np.asarray(f(jnp.asarray(X), jnp.float32(0.0)))).all()
    good = np.asarray(f(jnp.asarray(X), jnp.float32(1.0)))
    np.testing.assert_array_equal(good, fp4sim.dequantize(fp4sim.quantize(X, NV_CONST,
                                                                            global_scale=1.0)))


# --- item 8 -------------------------------------------------------------------------------------
SR = fp4sim.Policy(rounding=fp4sim.Rounding.STOCHASTIC)


@pytest.mark.parametrize("fmt", [fp4sim.MXFP4, fp4sim.MXFP8, fp4sim.NVFP4, fp4sim.NVFP4_SINGLE,
                                 fp4sim.FP8_E4M3_PER_TENSOR])
def test_stochastic_block_formats_quantize_with_random_bits(fmt):
    sfmt = fmt.replace(policy=SR)
    bits = RNG.integers(0, 2**32, X.shape, dtype=np.uint32)
    q = fp4sim.quantize(X, sfmt, random_bits=bits)
    qj = jax.jit(lambda x, b: fp4sim.quantize(x, sfmt, random_bits=b))(jnp.asarray(X),
                                                                        jnp.asarray(bits))
    np.testing.assert_array_equal(np.asarray(qj.codes), q.codes)
    # bits all ones never round up (truncation), all zeros round up whenever inexact
    down = fp4sim.dequantize(fp4sim.quantize(X, sfmt, random_bits=np.full(X.shape, 2**32 - 1,
                                                                            np.uint32)))
    up = fp4sim.dequantize(fp4sim.quantize(X, sfmt, random_bits=np.zeros(X.shape, np.uint32)))
    mid = fp4sim.dequantize(q)
    assert (np.abs(down) <= np.abs(mid)).all() and (np.abs(mid) <= np.abs(up)).all()
    # unbiased on average (elements away from saturation)
    draws = np.mean([fp4sim.dequantize(fp4sim.quantize(
        X, sfmt, random_bits=RNG.integers(0, 2**32, X.shape, dtype=np.uint32)))
        for _ in range(64)], axis=0)
    nearest = fp4sim.dequantize(fp4sim.quantize(X, fmt))
    assert np.mean(np.abs(draws - X)) < np.mean(np.abs(nearest - X))


def test_random_bits_are_required_exactly_for_stochastic_formats():
    sfmt = fp4sim.MXFP4.replace(policy=SR)
    with pytest.raises(TypeError, match="random_bits is required.*STOCHASTIC"):
        fp4sim.quantize(X, sfmt)
    with pytest.raises(ValueError, match="random_bits is only used"):
        fp4sim.quantize(X, fp4sim.MXFP4, random_bits=np.zeros(X.shape, np.uint32))
    with pytest.raises(ValueError, match="random_bits has shape"):
        fp4sim.quantize(X, sfmt, random_bits=np.zeros((8, 32), np.uint32))
    with pytest.raises(TypeError, match="random_bits has dtype int64"):
        fp4sim.quantize(X, sfmt, random_bits=np.zeros(X.shape, np.int64))


# --- item 12 ------------------------------------------------------------------------------------
CASES = [(fp4sim.MXFP8, {}, dict()), (fp4sim.NVFP4, {}, dict()), (fp4sim.MXFP4, {}, dict(pack=True)),
         (fp4sim.NVFP4, {}, dict(axis=0)),
         (fp4sim.NVFP4.replace(global_scale=fp4sim.GlobalScale.PER_ROW), {}, dict()),
         (NV_CONST, {}, dict(global_scale=np.float32(RNG.uniform(0.5, 2, (64, 1))))),
         (fp4sim.MXFP8, {}, dict(geometry=fp4sim.Geometry.SQUARE)),
         (fp4sim.MXFP8, {}, dict(geometry=fp4sim.Geometry.TOKEN_BLOCK, axis=-2)),
         (fp4sim.FP8_E4M3_PER_TENSOR, {}, dict()),
         (fp4sim.MXFP4.replace(policy=SR), {}, dict(random=True))]


@pytest.mark.parametrize("fmt, _, kw", CASES)
def test_numpy_passes_in_bounded_chunks_give_the_same_bits(fmt, _, kw, monkeypatch):
    x = (RNG.standard_normal((64, 64)) * 3).astype(np.float32)
    x[3, :5] = [np.nan, np.inf, -np.inf, 0, 1e-40]
    x[32:40] = 0  # zero blocks
    kw = dict(kw)
    if kw.pop("random", False):
        kw["random_bits"] = RNG.integers(0, 2**32, x.shape, dtype=np.uint32)
    want = jax.jit(lambda a: fp4sim.quantize(a, fmt, **kw))(jnp.asarray(x))
    monkeypatch.setattr(blocks, "_NP_CHUNK", 512)  # 8 passes of 8 rows (or of 32: SQUARE)
    monkeypatch.setattr(codec, "_NP_CHUNK", 300)
    got = fp4sim.quantize(x, fmt, **kw)
    np.testing.assert_array_equal(got.codes, np.asarray(want.codes))
    if fmt.scale is not None:
        np.testing.assert_array_equal(got.scales, np.asarray(want.scales))
    back = fp4sim.dequantize(got)
    np.testing.assert_array_equal(back.view(np.uint32),
                                  np.asarray(jax.jit(fp4sim.dequantize)(want)).view(np.uint32))
    codes = got.unpack().codes
    np.testing.assert_array_equal(codec.decode(codes, fmt.elem),
                                  np.asarray(codec.decode(jnp.asarray(codes), fmt.elem)))
    np.testing.assert_array_equal(codec.encode(x, fp4sim.E4M3),
                                  np.asarray(codec.encode(jnp.asarray(x), fp4sim.E4M3)))


@pytest.mark.parametrize("shape", [(1, 4096), (2, 1, 2048), (4096,)])
@pytest.mark.parametrize("fmt, kw", [(fp4sim.MXFP8, {}), (fp4sim.NVFP4, {}),
                                     (fp4sim.MXFP4, dict(pack=True)),
                                     (fp4sim.NVFP4.replace(global_scale=fp4sim.GlobalScale.PER_ROW),
                                      {})])
def test_bounded_passes_along_a_later_axis(shape, fmt, kw, monkeypatch):
    """A short first axis: the passes run along the first axis that can be split."""
    x = (RNG.standard_normal(shape) * 3).astype(np.float32)
    x.reshape(-1)[:64] = 0  # a zero block
    x.reshape(-1)[100] = np.nan
    want = jax.jit(lambda a: fp4sim.quantize(a, fmt, **kw))(jnp.asarray(x))
    seen = []
    real = blocks._np_chunks
    monkeypatch.setattr(blocks, "_NP_CHUNK", 512)
    monkeypatch.setattr(blocks, "_np_chunks", lambda *a: seen.append(real(*a)) or seen[-1])
    got = fp4sim.quantize(x, fmt, **kw)
    assert seen[0] is not None and seen[0][0] == len(shape) - 1  # split along the last axis
    np.testing.assert_array_equal(got.codes, np.asarray(want.codes))
    np.testing.assert_array_equal(got.scales, np.asarray(want.scales))
    np.testing.assert_array_equal(fp4sim.dequantize(got).view(np.uint32),
                                  np.asarray(jax.jit(fp4sim.dequantize)(want)).view(np.uint32))

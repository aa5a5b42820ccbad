"""Issue 15, item 1: no silent zero gradients. Every public computation either has a documented
derivative (round_trip's straight-through estimator, emulated_attention's emulated backward) or
raises NoDerivativeError under JAX differentiation, also under jax.jit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp4sim
from fp4sim import NoDerivativeError

RNG = np.random.default_rng(15)
X = RNG.standard_normal((4, 32)).astype(np.float32) * 3
Q, K, V = (RNG.standard_normal((1, 32, 32)).astype(np.float32) for _ in range(3))


def _grad(f, x, jit):
    g = jax.grad(lambda a: jnp.sum(f(a)))
    return (jax.jit(g) if jit else g)(jnp.asarray(x))


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize(
    "name, f, what",
    [
        (
            "decode(encode)",
            lambda x: fp4sim.decode(fp4sim.encode(x, fp4sim.E4M3), fp4sim.E4M3),
            "encode",
        ),
        (
            "dequantize(quantize)",
            lambda x: fp4sim.dequantize(fp4sim.quantize(x, fp4sim.MXFP8)),
            "quantize",
        ),
        ("nvfp4", lambda x: fp4sim.dequantize(fp4sim.quantize(x, fp4sim.NVFP4)), "quantize"),
        ("bf16", lambda x: fp4sim.bf16_values(fp4sim.bf16_round(x)), "computation"),
        ("exp2_rn", lambda x: fp4sim.exp2_rn(x), "computation"),
        ("mul_f32", lambda x: fp4sim.mul_f32(x, x), "computation"),
        ("widen", lambda x: fp4sim.widen_to_f32(x.astype(jnp.bfloat16)), "computation"),
    ],
)
def test_bit_level_functions_raise_under_grad(name, f, what, jit):
    with pytest.raises(
        NoDerivativeError, match=f"{what}.*no derivative.*round_trip.*emulated_attention"
    ):
        _grad(f, X, jit)


@pytest.mark.parametrize(
    "preset", ["EXACT_F32", "FLAMIA_NVFP4", "HW_FP4_DIRECT_P", "CUDNN_FP8_FIXED"]
)
@pytest.mark.parametrize("jit", [False, True])
def test_attention_forward_raises_naming_emulated_attention(preset, jit):
    recipe = getattr(fp4sim, preset)
    for wrt in range(3):

        def f(x, wrt=wrt):
            args = [jnp.asarray(a) for a in (Q, K, V)]
            args[wrt] = x
            return fp4sim.attention_forward(*args, recipe).out

        with pytest.raises(
            NoDerivativeError, match="attention_forward has no derivative.*emulated_attention"
        ):
            _grad(f, (Q, K, V)[wrt], jit)
    with pytest.raises(NoDerivativeError, match="attention_forward"):
        jax.jvp(
            lambda q: fp4sim.attention_forward(q, K, V, recipe).lse,
            (jnp.asarray(Q),),
            (jnp.ones_like(Q),),
        )


def test_gradient_with_respect_to_another_argument_is_unaffected():
    """The guard fires only on what is differentiated: a function of a constant quantized
    operand keeps its ordinary derivative."""
    wq = fp4sim.round_trip(X, fp4sim.MXFP8)
    g = jax.grad(
        lambda s: jnp.sum(s * fp4sim.dequantize(fp4sim.quantize(jnp.asarray(X), fp4sim.MXFP8)))
    )
    assert float(g(2.0)) == pytest.approx(float(np.sum(wq.astype(np.float64))), rel=1e-6)


@pytest.mark.parametrize(
    "fmt", [*fp4sim.BLOCK_FORMATS, fp4sim.E2M1, fp4sim.E4M3, fp4sim.E5M2, fp4sim.E3M2]
)
def test_round_trip_is_the_two_calls_with_a_straight_through_derivative(fmt):
    x = X.copy()
    x[0, :3] = [np.nan, np.inf, 1e30]  # NaN, Inf, beyond max: the STE is still the identity
    if isinstance(fmt, fp4sim.BlockFormat):
        want = fp4sim.dequantize(fp4sim.quantize(x, fmt))
    else:
        want = fp4sim.decode(fp4sim.encode(x, fmt), fmt)
    for got in (
        fp4sim.round_trip(x, fmt),
        jax.jit(fp4sim.round_trip, static_argnums=1)(jnp.asarray(x), fmt),
    ):
        np.testing.assert_array_equal(np.asarray(got).view(np.uint32), want.view(np.uint32))
    w = RNG.standard_normal(x.shape).astype(np.float32)
    for jit in (False, True):
        g = _grad(lambda a: fp4sim.round_trip(a, fmt) * w, x, jit)
        np.testing.assert_array_equal(np.asarray(g), w)
    _, t = jax.jvp(lambda a: fp4sim.round_trip(a, fmt), (jnp.asarray(x),), (jnp.asarray(w),))
    np.testing.assert_array_equal(np.asarray(t), w)


def test_round_trip_stochastic_and_bad_arguments():
    sr = fp4sim.Policy(rounding=fp4sim.Rounding.STOCHASTIC)
    bits = RNG.integers(0, 2**32, X.shape, dtype=np.uint32)
    got = fp4sim.round_trip(jnp.asarray(X), fp4sim.E2M1, sr, random_bits=jnp.asarray(bits))
    want = fp4sim.decode(fp4sim.encode(X, fp4sim.E2M1, sr, random_bits=bits), fp4sim.E2M1)
    np.testing.assert_array_equal(np.asarray(got), want)
    g = jax.grad(lambda a: jnp.sum(fp4sim.round_trip(a, fp4sim.E2M1, sr, random_bits=bits)))(
        jnp.asarray(X)
    )
    np.testing.assert_array_equal(np.asarray(g), np.ones_like(X))
    with pytest.raises(TypeError, match="BlockFormat carries its policy"):
        fp4sim.round_trip(X, fp4sim.MXFP4, sr)
    with pytest.raises(TypeError, match="takes no"):
        fp4sim.round_trip(X, fp4sim.E2M1, axis=0)
    with pytest.raises(TypeError, match="must be a BlockFormat"):
        fp4sim.round_trip(X, "MXFP4")


def test_emulated_attention_reverse_mode_works_and_forward_mode_is_explained():
    recipe = fp4sim.TRAINING_PRESETS["float32"]
    q, k, v = (jnp.asarray(a) for a in (Q, K, V))
    g = jax.grad(lambda a: jnp.sum(fp4sim.emulated_attention(a, k, v, recipe)))(q)
    assert np.abs(np.asarray(g)).sum() > 0
    for call in (
        lambda: jax.jvp(lambda a: fp4sim.emulated_attention(a, k, v, recipe), (q,), (q,)),
        lambda: jax.jacfwd(lambda a: fp4sim.emulated_attention(a, k, v, recipe)[0, 0, 0])(q),
        lambda: jax.jit(
            lambda a: jax.jvp(lambda b: fp4sim.emulated_attention(b, k, v, recipe), (a,), (a,))
        )(q),
    ):
        with pytest.raises(NoDerivativeError, match="reverse-mode derivative only.*jax.grad"):
            call()


def test_training_forward_raises_under_grad():
    recipe = fp4sim.TRAINING_PRESETS["float32"]
    with pytest.raises(NoDerivativeError, match="training_forward.*emulated_attention"):
        _grad(lambda a: fp4sim.training_forward(a, K, V, recipe)[0], Q, False)

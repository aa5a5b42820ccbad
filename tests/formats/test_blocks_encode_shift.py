"""``codec.encode(values, fmt, policy, exp_shift=k)``: the one rounding step that quantize uses for
power-of-two block scales (the element code of the exact ``x·2^k``, straight from the bits of
``x``). Checked against the float64 oracle: the same encoder fed the exact value ``x·2^k`` as a
float64 (exact for |k| <= 700 and every float32 x), over every format, rounding mode, overflow and
NaN policy, flushing, shifts across and beyond every range, float32 subnormal inputs; NumPy and
jitted JAX identical; and through ``quantize`` on blocks whose scale lifts subnormals."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4sim.formats import codec
from fp4sim.formats.blocks import MXFP4, MXFP8, MXFP8_E5M2, dequantize, quantize
from fp4sim.formats.spec import (
    E2M1,
    E2M3,
    E3M2,
    E4M3,
    E5M2,
    UE4M3,
    UE8M0,
    NanPolicy,
    Overflow,
    Policy,
    Rounding,
)

FORMATS = [E2M1, E2M3, E3M2, E4M3, E5M2, UE4M3, UE8M0]


def _f32_patterns() -> np.ndarray:
    """Every float32 exponent field with edge mantissas (ties, all ones, the subnormal range),
    both signs, zeros, Inf and NaN."""
    man = np.array(
        [
            0,
            1,
            2,
            3,
            0x7FFFFF,
            0x400000,
            0x400001,
            0x3FFFFF,
            0x200000,
            0x100000,
            0x080000,
            0x0C0000,
            0x0A0000,
            0x060000,
            0x040001,
            0x1FFFFF,
            0x600000,
            0x700000,
            0x7E0000,
            0x555555,
        ],
        np.uint32,
    )
    b = ((np.arange(256, dtype=np.uint32)[:, None] << 23) | man[None, :]).ravel()
    return np.concatenate([b, b | np.uint32(0x80000000)]).view(np.float32)


X = _f32_patterns()
RNG = np.random.default_rng(11)
# per element: shifts over the whole useful range and beyond (clipping inside must change nothing)
K = RNG.integers(-700, 701, X.size).astype(np.int32)
K[: X.size // 2] = RNG.integers(-160, 160, X.size // 2)  # where the interesting cases are
RANDOM = RNG.integers(0, 2**32, X.size, dtype=np.uint64).astype(np.uint32)
with np.errstate(invalid="ignore"):  # signalling NaN patterns are quieted by the widening
    EXACT = X.astype(np.float64) * np.exp2(K.astype(np.float64))  # exact: |k| <= 700


def _policies(fmt):
    nans = [NanPolicy.ZERO, NanPolicy.MAX] + ([NanPolicy.PROPAGATE] if fmt.has_nan else [])
    for rounding, overflow, nan, flush in itertools.product(
        Rounding, Overflow, nans, (False, True)
    ):
        policy = Policy(
            rounding=rounding, overflow=overflow, nan=nan, flush_inputs=flush, flush_outputs=flush
        )
        try:
            codec.check_policy(fmt, policy)
        except ValueError:
            continue
        yield policy


@pytest.mark.parametrize("fmt", FORMATS, ids=[f.name for f in FORMATS])
def test_shift_encodes_the_exact_value(fmt):
    for policy in _policies(fmt):
        rb = RANDOM if policy.rounding is Rounding.STOCHASTIC else None
        got = codec.encode(X, fmt, policy, random_bits=rb, exp_shift=K)
        want = codec.encode(EXACT, fmt, policy, random_bits=rb)
        bad = np.nonzero(got != want)[0]
        assert bad.size == 0, (policy, X[bad[:3]], K[bad[:3]], got[bad[:3]], want[bad[:3]])


def test_shift_broadcasts_per_block_and_zero_shift_is_plain_encode():
    x = X[: 64 * 32].reshape(64, 32)
    k = RNG.integers(-140, 140, (64, 1)).astype(np.int32)
    want = codec.encode(x.astype(np.float64) * np.exp2(k.astype(np.float64)), E4M3)
    assert np.array_equal(codec.encode(x, E4M3, exp_shift=k), want)
    assert np.array_equal(codec.encode(X, E5M2, exp_shift=np.int32(0)), codec.encode(X, E5M2))
    # a NumPy scalar goes through the same steps (no scalar wrap-around warnings)
    assert codec.encode(np.float32(1e-40), E4M3, exp_shift=np.int32(127)) == codec.encode(
        np.float64(1e-40 * 2.0**127), E4M3
    )


@pytest.mark.parametrize(
    "fmt,policy",
    [
        (E4M3, Policy()),
        (E5M2, Policy(rounding=Rounding.UP, overflow=Overflow.INF)),
        (E2M1, Policy(nan=NanPolicy.ZERO, rounding=Rounding.DOWN)),
        (UE8M0, Policy(flush_inputs=True)),
        (E3M2, Policy(rounding=Rounding.STOCHASTIC, nan=NanPolicy.MAX)),
    ],
)
def test_shift_jit_equals_numpy(fmt, policy):
    rb = RANDOM if policy.rounding is Rounding.STOCHASTIC else None
    fn = jax.jit(lambda v, k, r: codec.encode(v, fmt, policy, random_bits=r, exp_shift=k))
    got = fn(jnp.asarray(X), jnp.asarray(K), None if rb is None else jnp.asarray(rb))
    assert np.array_equal(
        np.asarray(got), codec.encode(X, fmt, policy, random_bits=rb, exp_shift=K)
    )


def test_shift_bad_input_names_the_argument():
    with pytest.raises(TypeError, match="exp_shift"):
        codec.encode(X, E4M3, exp_shift=np.float32(1.0))
    with pytest.raises(ValueError, match="exp_shift"):
        codec.encode(X[:8], E4M3, exp_shift=np.zeros(3, np.int32))
    with pytest.raises(ValueError, match="exp_shift"):  # would enlarge values
        codec.encode(X[:8], E4M3, exp_shift=np.zeros((2, 8), np.int32))


@pytest.mark.parametrize("fmt", [MXFP8, MXFP8_E5M2, MXFP4], ids=lambda f: f.name)
def test_quantize_lifts_subnormal_blocks_exactly(fmt):
    """Blocks of float32 subnormals get the smallest scale 2^-127 (shift +127): their elements
    land in the element format's normal range and must be rounded from their exact value."""
    x = np.zeros((4, 32), np.float32)
    x[0] = (np.arange(1, 33) * 2.0**-149).astype(np.float32)  # the bottom of float32
    x[1] = np.float32(2.0**-127) * np.linspace(-1.5, 1.75, 32, dtype=np.float32)
    x[2] = (np.arange(32) * np.float32(3.0 * 2.0**-140)).astype(np.float32)
    x[3, :2] = [np.float32(2.0**-126), np.float32(-1e-39)]
    q = quantize(x, fmt)
    qj = jax.jit(lambda a: quantize(a, fmt))(jnp.asarray(x))
    assert np.array_equal(q.codes, np.asarray(qj.codes))
    assert np.array_equal(q.scales, np.asarray(qj.scales))
    e = q.scales.astype(np.int64) - 127
    assert e.min() == -127  # the case under test
    want = codec.encode(
        x.astype(np.float64) * np.exp2(-e.astype(np.float64)),
        fmt.elem,
        Policy(nan=NanPolicy.ZERO) if not fmt.elem.has_nan else Policy(),
    )
    assert np.array_equal(q.codes, want)
    assert np.all(np.isfinite(dequantize(q)))

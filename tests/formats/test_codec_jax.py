"""Element codecs under jax: jitted (and vmapped) results are bit-identical to NumPy's.

XLA on CPU flushes float32 subnormals in arithmetic (measured: XLA's CPU backend); the inputs here
include float32 subnormals and the UE8M0 code 0x00 (= 2^-127, a float32 subnormal), so any
float arithmetic in the codec's path would show up as a difference from NumPy.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.experimental import checkify

from fp4sim.formats import (
    ALL_FORMATS,
    E2M1,
    E4M3,
    E5M2,
    UE4M3,
    UE8M0,
    NanPolicy,
    Overflow,
    Policy,
    Rounding,
    SignedZero,
    all_codes,
    decode,
    encode,
    max_code,
    value_table,
)

FMT_IDS = [f.name for f in ALL_FORMATS]


def covering_policies(fmt):
    """Every value of every Policy field at least once (every rounding with every valid
    overflow), cycling the NaN, signed-zero and flush options along."""
    overflows = [
        o
        for o in Overflow
        if o is Overflow.SATURATE
        or (o is Overflow.NAN and fmt.has_nan)
        or (o is Overflow.INF and fmt.has_inf)
    ]
    nans, zeros = list(NanPolicy), list(SignedZero)
    out = []
    for k, r in enumerate(Rounding):
        for o in overflows:
            out.append(
                Policy(
                    rounding=r,
                    overflow=o,
                    nan=nans[k % 4],
                    signed_zero=zeros[k % 2],
                    flush_inputs=k % 3 == 1,
                    flush_outputs=k % 3 != 0,
                )
            )
    return out


def numpy_raises(fmt, policy):
    return policy.nan is NanPolicy.RAISE


def inputs(fmt, n=4000):
    rng = np.random.default_rng(11)
    grid = np.abs(value_table(fmt).astype(np.float64))
    grid = grid[np.isfinite(grid)]
    mids = np.concatenate([grid, (grid[:-1] + grid[1:]) / 2]).astype(np.float32)
    special = np.float32([0, np.inf, np.nan, 1e-45, 1e-40, 2.0**-127, 1.5 * 2.0**-127, 3e38])
    rand = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    scaled = (rng.standard_normal(n) * fmt.max / 4).astype(np.float32)
    x = np.concatenate([mids, np.nextafter(mids, np.float32(1e30)), special, rand, scaled])
    x = np.concatenate([x, -x])
    clean = x[~np.isnan(x) & (fmt.signed | ~np.signbit(x))]
    return x, clean


@pytest.mark.parametrize("fmt", ALL_FORMATS, ids=FMT_IDS)
def test_jit_equals_numpy_for_every_policy_option(fmt):
    x, clean = inputs(fmt)
    policies = covering_policies(fmt)
    rb_x = np.random.default_rng(5).integers(0, 2**32, x.shape, dtype=np.uint64).astype(np.uint32)
    rb_c = rb_x[: clean.size]

    def run(xa, xc, ra, rc):
        out = []
        for p in policies:
            v, r = (xc, rc) if numpy_raises(fmt, p) else (xa, ra)
            out.append(
                encode(v, fmt, p, random_bits=r if p.rounding is Rounding.STOCHASTIC else None)
            )
        return out

    # RAISE is a checkify check under jax (clean inputs here: it must not fire)
    err, got = checkify.checkify(jax.jit(run))(
        jnp.asarray(x), jnp.asarray(clean), jnp.asarray(rb_x), jnp.asarray(rb_c)
    )
    err.throw()
    want = run(x, clean, rb_x, rb_c)
    for p, g, w in zip(policies, got, want):
        assert g.dtype == jnp.uint8 and g.shape == w.shape
        np.testing.assert_array_equal(np.asarray(g), w, err_msg=f"{fmt} {p}")


@pytest.mark.parametrize("fmt", ALL_FORMATS, ids=FMT_IDS)
def test_jit_decode_equals_numpy_bits(fmt):
    codes = all_codes(fmt)
    got = np.asarray(jax.jit(lambda c: decode(c, fmt))(jnp.asarray(codes)))
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got.view(np.uint32), decode(codes, fmt).view(np.uint32))
    if fmt is UE8M0:
        assert got.view(np.uint32)[0] == 0x00400000  # 2^-127 survives as bits on XLA CPU


def test_subnormal_inputs_under_xla_ftz():
    # float32 subnormals: XLA CPU arithmetic would flush them; the integer path must not.
    x = np.float32([1e-45, 2.0**-127, 1.4 * 2.0**-127, 1.5 * 2.0**-127, 2.0**-126 - 2.0**-149])
    for fmt, policy, want in [
        (UE8M0, Policy(), [0, 0, 0, 0, 1]),
        (UE8M0, Policy(rounding=Rounding.UP), [0, 0, 1, 1, 1]),
        (UE8M0, Policy(rounding=Rounding.NEAREST_AWAY), [0, 0, 0, 1, 1]),
        (E4M3, Policy(rounding=Rounding.UP), [1, 1, 1, 1, 1]),
        (E4M3, Policy(rounding=Rounding.UP, flush_inputs=True), [0, 0, 0, 0, 0]),
    ]:
        jitted = jax.jit(lambda v, fmt=fmt, policy=policy: encode(v, fmt, policy))(jnp.asarray(x))
        np.testing.assert_array_equal(np.asarray(jitted), want, err_msg=f"{fmt} {policy}")
        np.testing.assert_array_equal(encode(x, fmt, policy), want)


def test_nan_without_a_nan_code_under_jit():
    x = jnp.float32([np.nan, -np.nan, 1.0])
    got = jax.jit(lambda v: encode(v, E2M1))(x)
    assert np.asarray(got).tolist() == [max_code(E2M1), max_code(E2M1), 2]
    assert encode(np.asarray(x), E2M1).tolist() == [max_code(E2M1), max_code(E2M1), 2]  # NumPy


def test_nan_policy_raise_is_one_error_on_both_backends():
    """NanPolicy.RAISE: NumPy raises at once; jax raises the same message through checkify
    (eagerly at once, jitted from err.throw()), and jit without checkify refuses to stage it."""
    x = np.float32([np.nan, 1.0])
    pol = Policy(nan=NanPolicy.RAISE)
    msg = "values contains NaN and policy.nan=NanPolicy.RAISE"
    with pytest.raises(ValueError, match=msg):
        encode(x, E4M3, pol)
    with pytest.raises(ValueError, match=msg):
        encode(jnp.asarray(x), E4M3, pol)
    err, _ = checkify.checkify(jax.jit(lambda v: encode(v, E4M3, pol)))(jnp.asarray(x))
    with pytest.raises(ValueError, match=msg):
        err.throw()
    err, got = checkify.checkify(jax.jit(lambda v: encode(v, E4M3, pol)))(jnp.asarray(x[1:]))
    err.throw()  # no NaN: no error, the PROPAGATE codes
    assert np.asarray(got).tolist() == encode(x[1:], E4M3).tolist()
    with pytest.raises(ValueError, match="checkify"):
        jax.jit(lambda v: encode(v, E4M3, pol))(jnp.asarray(x))


def test_codes_beyond_the_format_decode_to_nan_on_both_backends():
    codes = np.uint8([0x10, 0xFF, 0x0F, 0x80])
    for fmt in (E2M1, UE4M3):
        want = decode(codes, fmt)
        got = jax.jit(lambda c, fmt=fmt: decode(c, fmt))(jnp.asarray(codes))
        np.testing.assert_array_equal(np.asarray(got).view(np.uint32), want.view(np.uint32))
        beyond = codes >= fmt.num_codes
        assert (want.view(np.uint32)[beyond] == 0x7FC00000).all()


def test_vmap_and_half_inputs():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((8, 33)) * 3).astype(np.float32)
    f = jax.jit(jax.vmap(lambda row: encode(row, E2M1)))
    np.testing.assert_array_equal(np.asarray(f(jnp.asarray(x))), encode(x, E2M1))
    static = jax.jit(encode, static_argnames=("fmt", "policy"))  # formats and policies hash
    up = Policy(rounding=Rounding.UP)
    np.testing.assert_array_equal(
        np.asarray(static(jnp.asarray(x), fmt=E2M1, policy=up)), encode(x, E2M1, up)
    )
    for dtype in (jnp.float16, jnp.bfloat16):
        h = jnp.asarray(np.arange(2**16, dtype=np.uint16)).view(dtype)
        hn = np.asarray(h)
        for fmt in (E5M2, UE8M0):
            p = Policy(nan=NanPolicy.ZERO)
            got = jax.jit(lambda v, fmt=fmt, p=p: encode(v, fmt, p))(h)
            np.testing.assert_array_equal(
                np.asarray(got), encode(hn, fmt, p), err_msg=f"{dtype} {fmt}"
            )
            assert hn.dtype in (np.float16, ml_dtypes.bfloat16)


def test_stochastic_under_jit_uses_the_given_bits():
    rng = np.random.default_rng(9)
    x = rng.standard_normal(500).astype(np.float32)
    bits = rng.integers(0, 2**32, 500, dtype=np.uint64).astype(np.uint32)
    p = Policy(rounding=Rounding.STOCHASTIC)
    f = jax.jit(lambda v, b: encode(v, E2M1, p, random_bits=b))
    np.testing.assert_array_equal(
        np.asarray(f(jnp.asarray(x), jnp.asarray(bits))), encode(x, E2M1, p, random_bits=bits)
    )
    key_bits = jax.random.bits(jax.random.key(0), (500,), jnp.uint32)
    np.testing.assert_array_equal(
        np.asarray(f(jnp.asarray(x), key_bits)), np.asarray(f(jnp.asarray(x), key_bits))
    )


def test_float64_numpy_values_with_jax_bits_are_refused_without_x64():
    p = Policy(rounding=Rounding.STOCHASTIC)
    with pytest.raises(TypeError, match="values is a float64"):
        encode(np.float64([1.25]), E2M1, p, random_bits=jnp.uint32([7]))

"""The exact quotient behind ``formats.f32.div_f32``: every divisor significand.

``_quotient25`` replaces long division with a float32 reciprocal estimate and exact integer
corrections; its correctness claim ("whatever the estimate's rounding, the result is exact")
is checked here over the whole input space of divisors, against uint64 long division written
in the test, on NumPy and under jit.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4sim.formats import f32 as B

_MB = np.arange(1 << 23, 1 << 24, dtype=np.uint32)  # every normalized divisor significand


def _dividends(kind: str) -> np.ndarray:
    mb = _MB.astype(np.uint64)
    if kind == "low":  # quotient exactly 2^24
        return _MB.copy()
    if kind == "high":  # largest dividend: quotient just below 2^25
        return (2 * mb - 1).astype(np.uint32)
    if kind == "next":  # one above the divisor: a nonzero remainder at the low end
        return (mb + 1).astype(np.uint32)
    rng = np.random.default_rng(11)
    return (mb + (rng.random(mb.size) * mb).astype(np.uint64)).astype(np.uint32)


@pytest.mark.parametrize("kind", ["low", "high", "next", "random"])
@pytest.mark.parametrize("path", ["numpy", "jit"])
def test_quotient25_every_divisor(kind, path):
    num = _dividends(kind)
    wide = num.astype(np.uint64) << np.uint64(24)
    want_q = wide // _MB
    want_r = wide - want_q * _MB
    if path == "numpy":
        q, r = B._quotient25(np, num, _MB)
    else:
        q, r = jax.jit(lambda a, b: B._quotient25(jnp, a, b))(num, _MB)
    q, r = np.asarray(q), np.asarray(r)
    assert q.dtype == np.uint32 and r.dtype == np.uint32
    np.testing.assert_array_equal(q, want_q.astype(np.uint32))
    np.testing.assert_array_equal(r, want_r.astype(np.uint32))


def test_div_f32_random_bit_patterns_equal_ieee():
    """Random float32 bit patterns (every class: subnormal, normal, Inf, NaN), NumPy and jit,
    against NumPy's native IEEE division (NaN payloads are checked in test_exp2)."""
    rng = np.random.default_rng(12)
    a, b = (
        rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32).view(np.float32)
        for _ in range(2)
    )
    with np.errstate(all="ignore"):
        want = a / b
    ok = ~np.isnan(want)
    for got in (B.div_f32(a, b), jax.jit(B.div_f32)(a, b)):
        got = np.asarray(got)
        np.testing.assert_array_equal(np.isnan(got), ~ok)
        np.testing.assert_array_equal(got[ok].view(np.uint32), want[ok].view(np.uint32))

"""Issue 15, items 3-5: one NaN / Inf / out-of-range policy on NumPy and under jax.jit.

* NaN produced by float arithmetic is the canonical 0x7FC00000 on both backends (attention
  outputs, LSE and accumulators);
* E2M1 (no NaN code) under the default policy: +max on both; codes beyond a format: NaN on both;
* the emulated backward reads float32-subnormal operands as zero on both backends
  (tests/attention/test_quantized_stats.py compares both with one oracle).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp4sim

RNG = np.random.default_rng(3)
QKV = [RNG.standard_normal((1, 64, 64)).astype(np.float32) for _ in range(3)]
PRESETS = ["flamia_nvfp4", "cudnn_fp8_fixed", "exact_f32", "hw_fp4_direct_p"]


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("where", [0, 1, 2])
@pytest.mark.parametrize("special", [np.nan, np.inf])  # and -special
def test_attention_nan_bits_are_canonical_and_equal_on_both_backends(name, where, special):
    recipe = fp4sim.PRESETS[name]
    a = [x.copy() for x in QKV]
    a[where][0, 3, 5] = special
    a[where][0, 9, 60] = -special
    with np.errstate(all="ignore"):
        want = fp4sim.attention_forward(*a, recipe, return_intermediates=False)
    got = jax.jit(lambda *x: fp4sim.attention_forward(*x, recipe))(*map(jnp.asarray, a))
    for field in ("out", "lse"):
        w = np.asarray(getattr(want, field)).view(np.uint32)
        g = np.asarray(getattr(got, field)).view(np.uint32)
        np.testing.assert_array_equal(g, w, err_msg=field)
        nan = (w & 0x7FFFFFFF) > 0x7F800000
        assert (w[nan] == 0x7FC00000).all()


def test_canonical_nan_helper():
    from fp4sim._xp import canonical_nan

    bits = np.uint32([0xFFC00000, 0x7F800001, 0xFFFFFFFF, 0x7F800000, 0x80000000, 1])
    want = np.uint32([0x7FC00000] * 3 + [0x7F800000, 0x80000000, 1])
    np.testing.assert_array_equal(canonical_nan(bits.view(np.float32)).view(np.uint32), want)
    got = jax.jit(canonical_nan)(jnp.asarray(bits.view(np.float32)))
    np.testing.assert_array_equal(np.asarray(got).view(np.uint32), want)


@pytest.mark.parametrize("fmt", [fp4sim.E2M1, fp4sim.E2M3, fp4sim.E3M2])
def test_nan_into_a_format_without_nan_is_max_on_both_backends(fmt):
    x = np.float32([np.nan, -np.nan, 1.0, -np.inf])
    want = fp4sim.encode(x, fmt)
    got = jax.jit(fp4sim.encode, static_argnums=1)(jnp.asarray(x), fmt)
    np.testing.assert_array_equal(np.asarray(got), want)
    assert want[0] == want[1] == fp4sim.max_code(fmt)


def _bits_of(x):
    x = np.asarray(x)
    return x.view(np.uint32) if x.dtype == np.float32 else x


@pytest.mark.parametrize(
    "name", ["flamia_nvfp4", "hw_fp4_direct_p", "hao_log_mxfp8", "sage3_two_level"]
)
def test_intermediates_follow_one_nan_policy_on_both_backends(name):
    """A NaN in one key (one NaN score per row, inside a P block that also holds numbers): the
    block's max is NaN on both backends (XLA CPU's vectorized max dropped it, NumPy's kept it),
    so every intermediate (P codes, scales, block exponents, numerator, normalizer) has the
    same bits under jax.jit as on NumPy, not only O and LSE."""
    recipe = fp4sim.PRESETS[name]
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, 64, 64)).astype(np.float32)
    k, v = (rng.standard_normal((1, 128, 64)).astype(np.float32) for _ in range(2))
    k[0, 5, 3] = np.nan
    with np.errstate(all="ignore"):
        want = fp4sim.attention_forward(q, k, v, recipe, return_intermediates=True)
    got = jax.jit(
        lambda q, k, v: fp4sim.attention_forward(q, k, v, recipe, return_intermediates=True)
    )(q, k, v)
    for field in ("out", "lse"):
        np.testing.assert_array_equal(_bits_of(getattr(got, field)), _bits_of(getattr(want, field)))
    wi, gi = want.intermediates, got.intermediates
    for field in ("anchors", "p_codes", "p_scales", "p_k", "numerator", "normalizer"):
        w, g = getattr(wi, field), getattr(gi, field)
        assert (w is None) == (g is None), field
        if w is not None:
            np.testing.assert_array_equal(_bits_of(g), _bits_of(w), err_msg=field)
    assert np.isnan(np.asarray(want.out)).all()  # a NaN key: every row NaN
    if recipe.p_format is fp4sim.attention.recipe.PFormat.NVFP4 and wi.p_scales is not None:
        # the P block of key 5 (16 keys per UE4M3 scale): the scale format's NaN code, every row
        assert (np.asarray(wi.p_scales)[..., 0] == 0x7F).all()

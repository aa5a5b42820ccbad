"""The statistics bounds that gate the backward's fast ordered products, taken from the
quantizers (:func:`fp4sim.attention.operands.fake_quantize_stats`,
:func:`fp4sim.attention._ordered.quantized_stats`) instead of a pass over the elements.

1. The bounds hold: ``lo ≤ min_abs``, ``hi ≥ max_abs``, ``lsb ≤ min_lsb`` against statistics
   computed here from the dequantized values (float64 minimum/maximum, the lowest set bit of
   each float32 significand read from its bit pattern), for every quantizer kind the backward
   uses and for the cases at the ends of their ranges: all-zero blocks, blocks whose scale
   pushes values into or below the float32 subnormal range, scale code 254 (overflow to Inf),
   NaN and ±Inf inputs, subnormal inputs; on NumPy and under ``jax.jit`` (same values, same
   bounds). The values are :func:`fake_quantize`'s, bit for bit.
2. The bounds are tight enough that the fast path runs on attention-like operands (else the
   tests above would pass with useless bounds).
3. End to end: :func:`fp4sim.attention.backward.emulated_backward` gradients equal the flushed
   chain (``tests/ordered_oracle.py``) of its own quantized operands, for operands at the
   subnormal boundary (where an unsound bound would pick the plain loop and the results
   differ) and ordinary ones, on NumPy and jitted.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from ordered_oracle import assert_same_bits, flushed_chain, ftz

from fp4sim.attention import operands
from fp4sim.attention._ordered import plain_sum_is_exact
from fp4sim.attention.autodiff import P_MXFP8_KEYS, TRAINING_PRESETS
from fp4sim.attention.backward import emulated_backward

DERIVED = [
    P_MXFP8_KEYS,
    operands.DS_SQUARE_RCEIL,
    operands.DS_SQUARE_FLOOR,
    operands.TOKEN_BLOCK_POW2,
    operands.MXFP8_TOKENS_FLOOR,
    operands.MXFP8_TOKENS_RCEIL,
    operands.MXFP4_TOKENS_RCEIL,
    operands.PER_TOKEN_POW2,
    operands.MXFP8_HEAD_DIM,
    operands.E5M2_CAST,
    operands.E4M3_CAST,
]
# formats without derived bounds (a scan of the result, whose jitted form sees float32
# subnormals as zeros, as the products' loops do there): the NumPy bounds must hold as well
SCANNED = [operands.NVFP4_TOKENS, operands.FP8_PER_TENSOR_AMAX, operands.FLOAT32]
SCALINGS = DERIVED + SCANNED


def _true_stats(y):
    """(min nonzero |y|, max |y| with NaN/Inf as +Inf, lowest set bit of the nonzero values'
    24-bit significands: mantissa field with the hidden bit set), in float64."""
    y = np.asarray(y, np.float32)
    mag = np.abs(y.astype(np.float64))
    nz = mag > 0
    lo = float(np.min(mag[nz])) if nz.any() else np.inf
    hi = float(np.max(np.where(np.isfinite(mag), mag, np.inf))) if mag.size else 0.0
    sig = (y.view(np.uint32) & np.uint32(0x7FFFFF)) | np.uint32(0x800000)
    low = sig & (~sig + np.uint32(1))  # lowest set bit
    lsb = float(np.min(low[nz])) if nz.any() else 2.0**23
    return lo, hi, lsb


def _inputs():
    rng = np.random.default_rng(5)
    n = 64
    g = rng.standard_normal((n, n)).astype(np.float32)
    wide = (g * np.exp2(rng.integers(-30, 10, (n, n)))).astype(np.float32)
    causal = np.where(np.tril(np.ones((n, n), bool)), np.abs(wide), 0).astype(np.float32)
    tiny = (g * np.float32(2.0**-118)).astype(np.float32)  # scale codes near 0: subnormal y
    tinier = (g * np.float32(2.0**-135)).astype(np.float32)  # subnormal inputs
    huge = (g * np.float32(2.0**126)).astype(np.float32)  # scale code 254: 448·2^127 overflows
    mixed = wide.copy()
    mixed[:32, :32] *= np.float32(2.0**-100)
    mixed[32:, 32:] = 0.0
    mixed[40, 3] = -0.0
    nan = wide.copy()
    nan[5, 7] = np.nan
    inf = wide.copy()
    inf[9, 1] = -np.inf
    return {
        "wide": wide,
        "causal": causal,
        "tiny": tiny,
        "tinier": tinier,
        "huge": huge,
        "mixed": mixed,
        "nan": nan,
        "inf": inf,
        "zeros": np.zeros((n, n), np.float32),
    }


INPUTS = _inputs()


@pytest.mark.parametrize("scaling", SCALINGS, ids=[s.name for s in SCALINGS])
def test_bounds_hold(scaling):
    jitted = jax.jit(lambda x: operands.fake_quantize_stats(x, scaling))
    for name, x in INPUTS.items():
        with np.errstate(all="ignore"):
            y, st = operands.fake_quantize_stats(x, scaling)
            want_y = operands.fake_quantize(x, scaling)
        assert_same_bits(y, np.asarray(want_y, np.float32))
        yj, stj = jitted(x)
        assert_same_bits(yj, np.asarray(want_y, np.float32))
        if scaling in DERIVED:  # the same bounds (no float reduction over subnormals)
            for a, b in zip(st, stj):
                assert_same_bits(np.asarray(b), np.asarray(a, np.float32))
        lo, hi, lsb = (float(v) for v in st)
        t_lo, t_hi, t_lsb = _true_stats(y)
        assert lo <= t_lo, (name, lo, t_lo)
        assert hi >= t_hi, (name, hi, t_hi)
        assert lsb <= t_lsb, (name, lsb, t_lsb)


def test_bounds_admit_the_fast_path_on_attention_operands():
    """Softmax-like P (rows of a causal mask, zero blocks) with its MXFP8 quantizer and an E5M2
    dO: the bounds still prove the plain loop exact, as the scanned statistics do."""
    rng = np.random.default_rng(2)
    n = 128
    s = rng.standard_normal((n, n)).astype(np.float32) * 2
    s = np.where(np.tril(np.ones((n, n), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p = (p / p.sum(-1, keepdims=True)).astype(np.float32)
    _, p_st = operands.fake_quantize_stats(p, P_MXFP8_KEYS)
    _, do_st = operands.fake_quantize_stats(
        rng.standard_normal((n, 64)).astype(np.float32), operands.E5M2_CAST
    )
    ds = (p * rng.standard_normal((n, n))).astype(np.float32)
    _, ds_st = operands.fake_quantize_stats(ds, operands.DS_SQUARE_RCEIL)
    assert bool(plain_sum_is_exact(p_st, do_st, n))
    assert bool(plain_sum_is_exact(ds_st, do_st, n))
    assert float(p_st.min_abs) > 0 and float(ds_st.min_lsb) == 2.0**20


def _backward_case(kind):
    recipe = TRAINING_PRESETS["direct_p_fp8_training"]
    rng = np.random.default_rng(7)
    n, d = 64, 32
    q, k, v, out, do = (rng.standard_normal((n, d)).astype(np.float32) for _ in range(5))
    p = np.abs(rng.standard_normal((n, n))).astype(np.float32) / n
    p = np.where(np.tril(np.ones((n, n), bool)), p, 0).astype(np.float32)
    if kind == "subnormal_p":  # P̃'s MXFP8 copy lands in the float32 subnormal range
        p = (p * np.float32(2.0**-118)).astype(np.float32)
    elif kind == "tiny_products":  # products near the 2^-103 boundary of the predicate
        p = (p * np.float32(2.0**-60)).astype(np.float32)
        do = (do * np.float32(2.0**-44)).astype(np.float32)
    q_hat, k_hat, v_hat = (operands.fake_quantize(x, operands.PER_TOKEN_POW2) for x in (q, k, v))
    kw = dict(
        softmax_scale=float(1 / np.sqrt(d)),
        d_out_scaling=recipe.d_out,
        p_scaling=recipe.p_backward,
        ds_scaling=recipe.ds,
    )
    return (p, q_hat, k_hat, v_hat, out, do), kw


def _chain_grads(tr, q_hat, k_hat, c):
    """dV, dQ, dK as the flushed chain of the trace's own operands, float32-subnormal operands
    read as zero first (the backward's documented DAZ rule, on every backend)."""
    pre = ftz
    with np.errstate(all="ignore"):
        ds_q, p_dv = pre(tr.ds_q), pre(tr.p_dv)
        want = {
            "dv": flushed_chain(np.swapaxes(p_dv, -1, -2), pre(tr.d_out_q)),
            "dq": c * flushed_chain(ds_q, pre(k_hat)),
            "dk": c * flushed_chain(np.swapaxes(ds_q, -1, -2), pre(q_hat)),
        }
    return {key: ftz(w) for key, w in want.items()}


@pytest.mark.parametrize("kind", ["plain", "subnormal_p", "tiny_products"])
def test_backward_products_equal_the_flushed_chain(kind):
    args, kw = _backward_case(kind)
    c = np.float32(kw["softmax_scale"])
    with np.errstate(all="ignore"):
        tr = emulated_backward(*args, **kw)
    jt = jax.jit(lambda *a: emulated_backward(*a, **kw))(*args)
    want = _chain_grads(tr, args[1], args[2], c)
    for key in ("dv", "dq", "dk"):  # NumPy and jit: the same bits, the same oracle
        assert_same_bits(getattr(tr.grads, key), want[key])
        assert_same_bits(getattr(jt.grads, key), want[key])
    for name in ("p_dv", "ds_q", "d_out_q"):  # and the same operands
        assert_same_bits(getattr(jt, name), getattr(tr, name))
    if kind == "subnormal_p":  # the case an unsound bound gets wrong: plain != chain here
        p_dv = np.asarray(tr.p_dv)
        assert np.any((p_dv != 0) & (np.abs(p_dv) < 2.0**-126))  # float32 subnormal operands

"""Causal key-tile skipping in the forward emulator: bit-exact against computing every tile.

A row block skips the trailing key tiles that causal masking hides from all its rows
(``fp4sim.attention.forward.masked_tile``); the result must be the same bits as processing
those tiles (P = +0, r = 1, a zero denominator), including the NaN that a 0·Inf partial puts
into a V column holding Inf/NaN. The reference here is the NumPy forward with skipping disabled.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import fp4sim.attention.forward as fwd
from fp4sim.attention import recipe as R
from fp4sim.attention.autodiff import TRAINING_PRESETS


def _fields(res):
    it = res.intermediates
    return {
        "out": res.out,
        "lse": res.lse,
        "anchors": it.anchors,
        "p_codes": it.p_codes,
        "p_scales": it.p_scales,
        "p_k": it.p_k,
        "numerator": it.numerator,
        "normalizer": it.normalizer,
    }


def _assert_same(got, want):
    for name, w in want.items():
        g = got[name]
        if w is None:
            assert g is None, name
            continue
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype, name
        if w.dtype.kind == "f":
            np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=name)
            ok = ~np.isnan(w)
            np.testing.assert_array_equal(
                g[ok].view(np.uint32), w[ok].view(np.uint32), err_msg=name
            )
        else:
            np.testing.assert_array_equal(g, w, err_msg=name)


# (name, recipe, V specials: Inf/NaN survive the V format; MXFP4 V takes no NaN on NumPy)
RECIPES = [
    ("direct_p (fp4 x fp4 exact PV)", R.HW_FP4_DIRECT_P.replace(block_kv=64), False),
    (
        "fp8 training (float32 V, ordered PV)",
        TRAINING_PRESETS["direct_p_fp8_training"].forward,
        True,
    ),
    ("cudnn fixed (mismatched, threshold)", R.CUDNN_FP8_FIXED.replace(block_kv=64), True),
]


@pytest.mark.parametrize("name, rec, specials", RECIPES, ids=[r[0] for r in RECIPES])
def test_causal_skipping_is_exact(name, rec, specials, monkeypatch):
    rng = np.random.default_rng(3)
    sq, skv, d = 100, 260, 32  # end-aligned causal: row 0 sees keys <= 160 (tiles 0..2 of 5)
    q = rng.standard_normal((1, sq, d)).astype(np.float32) * np.float32(2.0)
    k = rng.standard_normal((1, skv, d)).astype(np.float32)
    v = rng.standard_normal((1, skv, d)).astype(np.float32)
    if specials:  # in tiles 3/4, skipped by the first row blocks (0·Inf = NaN there)
        v[0, 250, 3] = np.inf
        v[0, 230, 7] = np.nan
        v[0, 240, 9] = -np.inf
    with monkeypatch.context() as m:
        m.setattr(fwd, "masked_tile", lambda *a, **kw: None)  # process every tile
        want = _fields(fwd.attention_forward(q, k, v, rec, causal=True, return_intermediates=True))
    monkeypatch.setattr(fwd, "_NP_ROW_CHUNK", 24)  # NumPy: 5 row blocks, 3..5 tiles each
    monkeypatch.setattr(fwd, "_ROW_CHUNK", 16)  # jit: 7 row blocks in 4 groups
    assert fwd.masked_tile(rec, rec.block_kv, rec.normalization is R.Normalization.MISMATCHED)
    _assert_same(
        _fields(fwd.attention_forward(q, k, v, rec, causal=True, return_intermediates=True)), want
    )
    got = jax.jit(
        lambda q, k, v: _fields(
            fwd.attention_forward(q, k, v, rec, causal=True, return_intermediates=True)
        )
    )(q, k, v)
    _assert_same(got, want)
    if specials:
        assert np.isnan(np.asarray(got["out"])[0, 0, [3, 7, 9]]).all()  # skipped, still NaN
        assert not np.isnan(np.asarray(got["out"])[0, :, 4]).any()


@pytest.mark.parametrize("name", sorted(R.PRESETS))
def test_every_preset_can_skipmasked_tiles(name):
    """A fully masked tile gives +0 MMA values and a +0 denominator for every preset, so
    skipping is active (not silently disabled) everywhere."""
    rec = R.PRESETS[name]
    mism = rec.normalization is R.Normalization.MISMATCHED
    p = fwd.masked_tile(rec, rec.block_kv, mism)
    assert p is not None
    assert p.codes.shape == (1, rec.block_kv)

"""jax.grad through the emulated attention: custom_vjp wiring, jit, vmap, a tiny causal model.

Oracle: the NumPy training path (training_forward / training_backward), whose backward is tested
against the float64 reference in test_backward.py. Through ``jax.grad`` the gradients must be
those of the emulated backward (straight through the quantizers), not autodiff of the
quantizers (which would be zero almost everywhere).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4sim.attention.autodiff import (
    TRAINING_PRESETS,
    emulated_attention,
    training_backward,
    training_forward,
)

RECIPE = TRAINING_PRESETS["direct_p_fp8_training"]
N, DM, DH, HEADS = 64, 32, 32, 2


def _model_params(seed=0):
    rng = np.random.default_rng(seed)
    f = np.float32
    return {
        "wq": (rng.standard_normal((HEADS, DM, DH)) / np.sqrt(DM)).astype(f),
        "wk": (rng.standard_normal((HEADS, DM, DH)) / np.sqrt(DM)).astype(f),
        "wv": (rng.standard_normal((HEADS, DM, DH)) / np.sqrt(DM)).astype(f),
        "wo": (rng.standard_normal((HEADS, DH, DM)) / np.sqrt(DH * HEADS)).astype(f),
    }


def _loss(params, x, target):
    q = jnp.einsum("nm,hmd->hnd", x, params["wq"])
    k = jnp.einsum("nm,hmd->hnd", x, params["wk"])
    v = jnp.einsum("nm,hmd->hnd", x, params["wv"])
    o = jax.vmap(lambda a, b, c: emulated_attention(a, b, c, RECIPE, causal=True))(q, k, v)
    y = jnp.einsum("hnd,hdm->nm", o, params["wo"])
    return jnp.mean((y - target) ** 2)


def test_tiny_causal_model_grad_under_jit_uses_the_emulated_backward():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((N, DM)).astype(np.float32)
    target = rng.standard_normal((N, DM)).astype(np.float32)
    params = _model_params()
    loss, grads = jax.jit(jax.value_and_grad(_loss))(params, x, target)
    assert np.isfinite(float(loss))
    assert all(np.all(np.isfinite(np.asarray(g))) for g in grads.values())

    # the same chain rule by hand with the NumPy training path, head by head
    q, k, v = (np.einsum("nm,hmd->hnd", x, params[w]) for w in ("wq", "wk", "wv"))
    outs, saved = zip(
        *(training_forward(q[h], k[h], v[h], RECIPE, causal=True) for h in range(HEADS))
    )
    o = np.stack(outs)
    y = np.einsum("hnd,hdm->nm", o, params["wo"])
    dy = 2.0 * (y - target) / y.size
    do = np.einsum("nm,hdm->hnd", dy, params["wo"]).astype(np.float32)
    g = [training_backward(saved[h], do[h], RECIPE).grads for h in range(HEADS)]
    dwv = np.stack([x.T @ g[h].dv for h in range(HEADS)])
    dwq = np.stack([x.T @ g[h].dq for h in range(HEADS)])
    for got, want in ((grads["wv"], dwv), (grads["wq"], dwq)):
        got = np.asarray(got, np.float64)
        # float32 chain rule in two different summation orders: agreement to float32 rounding
        # of the N-term sums (relative to the gradient's scale), far below any format's error
        assert np.max(np.abs(got - want)) <= 8 * N * 2.0**-24 * np.max(np.abs(want))
    # a straight-through-free autodiff of the quantizers would give exactly zero for wq
    assert np.max(np.abs(np.asarray(grads["wq"]))) > 0


def test_vmap_and_segment_ids_under_jit():
    rng = np.random.default_rng(2)
    q, k, v, do = (rng.standard_normal((2, N, DH)).astype(np.float32) for _ in range(4))
    seg = np.repeat(np.arange(3), [20, 12, 32]).astype(np.int32)

    def loss(q, k, v):
        o = jax.vmap(
            lambda a, b, c: emulated_attention(a, b, c, RECIPE, causal=True, segment_ids=seg)
        )(q, k, v)
        return jnp.sum(o * do)

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    for h in range(2):
        _, saved = training_forward(q[h], k[h], v[h], RECIPE, causal=True, segment_ids=seg)
        ref = training_backward(saved, do[h], RECIPE).grads
        for a, b in zip(grads, ref):  # the same emulator under vmap+jit: bit for bit
            np.testing.assert_array_equal(np.asarray(a)[h], b)
        # no gradient crosses a document boundary: dK/dV rows of a document depend only on
        # queries of that document (checked through zero blocks of dS in the NumPy trace)
        ds = training_backward(saved, do[h], RECIPE).ds
        assert np.all(ds[seg[:, None] != seg[None, :]] == 0)


def test_emulated_attention_rejects_bad_arguments():
    x = jnp.zeros((32, 16), jnp.float32)
    with pytest.raises(TypeError, match="TrainingRecipe"):
        emulated_attention(x, x, x, RECIPE.forward)
    with pytest.raises(TypeError, match="causal"):
        emulated_attention(x, x, x, RECIPE, causal=1)
    with pytest.raises(ValueError, match="softmax_scale"):
        emulated_attention(x, x, x, RECIPE, softmax_scale=-1.0)


@pytest.mark.parametrize("name", ["float32", "direct_p_fp8_training"])
def test_rebuilt_anchors_are_the_forwards_also_with_an_inf_score(name):
    """The backward's rebuild of P takes each tile's anchor from the forward's own running-max
    step (``forward.running_max``): the same anchors as the forward kept, also in a row whose
    scores hold +Inf (left out of the tile max; the rebuild's former copy of the rule kept
    them for the float32 route)."""
    from fp4sim.attention.autodiff import rebuild_p

    rec = TRAINING_PRESETS[name]
    rng = np.random.default_rng(0)
    q = rng.standard_normal((64, 64)).astype(np.float32)
    k, v = (rng.standard_normal((128, 64)).astype(np.float32) for _ in range(2))
    q[3, 0] = np.inf
    with np.errstate(all="ignore"):
        _, saved = training_forward(q, k, v, rec, causal=False)
        rebuilt = rebuild_p(saved, rec.forward)
    np.testing.assert_array_equal(
        np.asarray(rebuilt.anchors).view(np.uint32), np.asarray(saved.fwd_anchors).view(np.uint32)
    )

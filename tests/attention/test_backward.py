"""The backward: float64 reference against independent oracles, the emulator against the reference.

Oracles for the reference: jax.grad of a float64 jnp attention (scoped x64) and central finite
differences. The emulated backward with float32 formats must match the reference to float32
accuracy; each published route's gradient error is bounded by its formats.
"""

from __future__ import annotations

import numpy as np
import pytest

from fp4sim.attention.backward import attention_forward_reference, attention_grad_reference


def _qkvd(seed, n=12, m=12, d=8, dv=6, batch=(2,)):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(batch + (n, d)), rng.standard_normal(batch + (m, d)),
            rng.standard_normal(batch + (m, dv)), rng.standard_normal(batch + (n, dv)))


@pytest.mark.parametrize("causal", [False, True])
def test_reference_matches_jax_grad_float64(causal):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    q, k, v, do = _qkvd(0, n=7, m=9)
    scale = 0.3
    g = attention_grad_reference(q, k, v, do, softmax_scale=scale, causal=causal)
    with jax.enable_x64(True):
        mask = jnp.asarray(np.tril(np.ones((7, 9), bool), 2) if causal else np.ones((7, 9), bool))

        def loss(q, k, v):
            s = jnp.where(mask, scale * jnp.einsum("bnd,bmd->bnm", q, k), -jnp.inf)
            return jnp.sum((jax.nn.softmax(s, axis=-1) @ v) * do)

        ref = jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(g, ref):
        np.testing.assert_allclose(a, np.asarray(b), rtol=1e-12, atol=1e-13)


def test_reference_matches_finite_differences():
    q, k, v, do = _qkvd(1, n=5, m=5, d=4, dv=3, batch=())
    g = attention_grad_reference(q, k, v, do, causal=True)

    def loss(q, k, v):
        return float(np.sum(attention_forward_reference(q, k, v, causal=True)[0] * do))

    h = 1e-6
    for which, grad in enumerate(g):
        args = [q, k, v]
        x = args[which]
        fd = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            xp, xm = x.copy(), x.copy()
            xp[idx] += h
            xm[idx] -= h
            args_p = list(args); args_p[which] = xp
            args_m = list(args); args_m[which] = xm
            fd[idx] = (loss(*args_p) - loss(*args_m)) / (2 * h)
        # central difference error ~ h^2 * f''' + rounding 1e-16/h
        np.testing.assert_allclose(grad, fd, atol=1e-8)


def test_reference_bad_shapes_named():
    q, k, v, do = _qkvd(2)
    with pytest.raises(ValueError, match="d_out.shape"):
        attention_grad_reference(q, k, v, do[..., :3])
    with pytest.raises(ValueError, match="head_dim"):
        attention_grad_reference(q[..., :4], k, v, do)
    with pytest.raises(ValueError, match="softmax_scale"):
        attention_grad_reference(q, k, v, do, softmax_scale=-1.0)

"""The study's model: a small pre-LayerNorm decoder-only transformer in plain jax.

This module owns :func:`init_params` (one seed's parameter dict, whose per-layer arrays are
stacked along a layer axis, so that the layers run as one ``lax.scan`` and compile once),
:func:`logits` and :func:`position_losses` (next-token cross-entropy per position) of several
seeds' models at once (parameters stacked along a leading seed axis). The attention is a
parameter, ``attn(q, k, v) -> o`` on (seeds, batch, heads, tokens, head_dim) float32 arrays
(:func:`fp4sim.train.recipes.attention_fn`): the jnp baselines or
:func:`fp4sim.attention.autodiff.emulated_attention`; everything else is float32 with
``Precision.HIGHEST`` matrix products, so that only the attention differs between recipes.

Determinism: the token embedding is a one-hot matrix product (its gradient a product too), not
a gather whose gradient would be a scatter-add (atomics on a GPU, whose order varies between
runs). Initialization: normal(0, 0.02) weights, the residual projections scaled by
1/√(2·layers), normal(0, 0.01) positions, LayerNorm gains 1 and biases 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from fp4sim.train.config import ModelConfig

__all__ = ["init_params", "logits", "position_losses", "DECAYED"]

DECAYED = ("embed", "pos", "wqkv", "wo", "w1", "w2")
"""Parameter names that get weight decay (the matrices; not LayerNorm gains or biases)."""

_LN_EPS = 1e-5


def init_params(key: Any, cfg: ModelConfig) -> dict[str, Any]:
    """Initial parameters (module docstring) from a jax PRNG key."""
    import jax
    import jax.numpy as jnp

    if not isinstance(cfg, ModelConfig):
        raise TypeError(f"cfg={cfg!r} must be a ModelConfig")
    d, f, n_l = cfg.width, cfg.mlp_ratio * cfg.width, cfg.layers
    ks = jax.random.split(key, 6)
    std, res = 0.02, 0.02 / math.sqrt(2 * n_l)

    def normal(k, shape, s):
        return s * jax.random.normal(k, shape, jnp.float32)

    ones, zeros = jnp.ones((n_l, d), jnp.float32), jnp.zeros((n_l, d), jnp.float32)
    return {
        "embed": normal(ks[0], (cfg.vocab, d), std),
        "pos": normal(ks[1], (cfg.context, d), 0.01),
        "ln1_g": ones,
        "ln1_b": zeros,
        "wqkv": normal(ks[2], (n_l, d, 3 * d), std),
        "wo": normal(ks[3], (n_l, d, d), res),
        "ln2_g": ones,
        "ln2_b": zeros,
        "w1": normal(ks[4], (n_l, d, f), std),
        "b1": jnp.zeros((n_l, f), jnp.float32),
        "w2": normal(ks[5], (n_l, f, d), res),
        "b2": zeros,
        "lnf_g": jnp.ones((d,), jnp.float32),
        "lnf_b": jnp.zeros((d,), jnp.float32),
    }


_LAYER_KEYS = ("ln1_g", "ln1_b", "wqkv", "wo", "ln2_g", "ln2_b", "w1", "b1", "w2", "b2")


def _layer_norm(x: Any, g: Any, b: Any) -> Any:
    import jax.numpy as jnp

    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mu), axis=-1, keepdims=True)
    return (x - mu) * (1.0 / jnp.sqrt(var + _LN_EPS)) * g + b


def logits(
    params: dict[str, Any], tokens: Any, attn: Callable[[Any, Any, Any], Any], cfg: ModelConfig
) -> Any:
    """Next-token logits (seeds, batch, tokens, vocab) float32 of int ``tokens`` (seeds,
    batch, tokens), every seed with its own parameters (``params`` leaves stacked along a
    leading seed axis, as :func:`fp4sim.train.loop.init_state` makes them). The seed axis is
    explicit rather than a ``vmap`` around the whole step: the emulated attention then traces
    as one call on (seeds, batch, heads, S, D) (measured ~5 % less tracing; simpler)."""
    import jax
    import jax.numpy as jnp

    hi = jax.lax.Precision.HIGHEST
    n_s, bsz, n = tokens.shape
    if n > cfg.context:
        raise ValueError(f"tokens has {n} positions; the model's context is {cfg.context}")
    h, dh = cfg.heads, cfg.head_dim

    def mm(x: Any, w: Any) -> Any:  # (seeds, B, T, i) x (seeds, i, o)
        return jnp.einsum("sbti,sio->sbto", x, w, precision=hi)

    onehot = jax.nn.one_hot(tokens, cfg.vocab, dtype=jnp.float32)
    x = mm(onehot, params["embed"]) + params["pos"][:, None, :n]

    def heads(t: Any) -> Any:  # (s, B, T, d) -> (s, B, H, T, dh)
        return jnp.transpose(jnp.reshape(t, (n_s, bsz, n, h, dh)), (0, 1, 3, 2, 4))

    def norm(x: Any, g: Any, b: Any) -> Any:
        return _layer_norm(x, g[:, None, None, :], b[:, None, None, :])

    def block(x: Any, p: dict[str, Any]) -> tuple[Any, None]:
        y = norm(x, p["ln1_g"], p["ln1_b"])
        q, k, v = jnp.split(mm(y, p["wqkv"]), 3, axis=-1)
        o = attn(heads(q), heads(k), heads(v))
        o = jnp.reshape(jnp.transpose(o, (0, 1, 3, 2, 4)), (n_s, bsz, n, h * dh))
        x = x + mm(o, p["wo"])
        y = norm(x, p["ln2_g"], p["ln2_b"])
        y = jax.nn.gelu(mm(y, p["w1"]) + p["b1"][:, None, None, :], approximate=True)
        return x + mm(y, p["w2"]) + p["b2"][:, None, None, :], None

    layers = {k: jnp.moveaxis(params[k], 1, 0) for k in _LAYER_KEYS}  # scan over layers
    x, _ = jax.lax.scan(block, x, layers)
    x = norm(x, params["lnf_g"], params["lnf_b"])
    return jnp.einsum("sbtd,svd->sbtv", x, params["embed"], precision=hi)


def position_losses(
    params: dict[str, Any],
    tokens: Any,
    targets: Any,
    attn: Callable[[Any, Any, Any], Any],
    cfg: ModelConfig,
) -> Any:
    """Cross-entropy (nats) of each position's next token, (seeds, batch, tokens) float32."""
    import jax
    import jax.numpy as jnp

    logp = jax.nn.log_softmax(logits(params, tokens, attn, cfg), axis=-1)
    # a one-hot product, not take_along_axis: its gradient would be a scatter
    return -jnp.sum(jax.nn.one_hot(targets, cfg.vocab, dtype=logp.dtype) * logp, axis=-1)

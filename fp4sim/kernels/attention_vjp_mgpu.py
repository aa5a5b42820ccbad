"""``jax.grad`` through the GPU FP8 attention: the forward kernel paired with the backward.

This module owns :func:`fp8_attention`, a ``jax.custom_vjp`` function whose primal is the
token-block FP8 forward kernel (:mod:`fp4sim.kernels.attention_mgpu`) and whose VJP is the
backward kernels of :mod:`fp4sim.kernels.attention_bwd_mgpu`, run on the forward's saved
residuals (the quantized Q/K/V codes and token-block exponents, O and the base-2 LSE: no
P is stored). Gradients pass straight through the quantizers (the gradient with respect to a
quantized operand is used for the float input), as in
:func:`fp4sim.attention.autodiff.emulated_attention`. It works under ``jax.jit``; the configs
and the softmax scale are static.

Lengths: the kernels need multiples of their tiles. Under a causal mask (aligned, T == S)
the inputs are padded with zero tokens at the end: no real query sees a padded key, and the
padded queries are switched off in the backward by an LSE of +inf (their p is 0, so they
change neither the 32×32 block scales nor any gradient). Non-causal attention would see the
padded keys, so there a length that is not a multiple of the tile is an error.

It also owns the map from a kernel configuration to its nearest emulator training recipe,
:func:`emulator_recipe` / :data:`NEAREST_EMULATOR_RECIPE`: FLAMIA's token-block MXFP8 route
(``flamia_mxfp8_training`` of :data:`fp4sim.attention.recipe.TRAINING_PRESETS`, which shares
every backward format with ``direct_p_fp8_training``: E5M2 dO, token-block E4M3 V, 32×32
power-of-two E4M3 dS) with the kernel's token-block FP8 Q/K, its normalization and key tile,
P for dV in 32×32 blocks (:data:`~fp4sim.kernels.attention_bwd_mgpu.P_SQUARE_RCEIL`: per-key
blocks vary along the dV contraction, which one FP8 ``wgmma`` cannot scale) and the
unquantized ``p = 2^(u − LSE₂)`` in dS (``DsProbabilities.HIGH_PRECISION``). What remains
different: the forward's P scale rule (V's exponent folded into a per-row P exponent, see
:mod:`fp4sim.kernels.attention_mgpu`) and, in the backward, that P for dV is quantized from
the rebuilt unquantized p rather than from the forward's represented P̃.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from fp4sim import _checks
from fp4sim.kernels.attention_bwd_mgpu import (
    P_SQUARE_RCEIL,
    SHIPPED_BACKWARD_CONFIGS,
    BackwardConfig,
    BackwardResiduals,
    attention_fp8_backward,
)
from fp4sim.kernels.attention_mgpu import (
    SHIPPED_CONFIGS,
    FP8AttentionConfig,
    attention_fp8_quantized,
    quantize_operands,
)

__all__ = ["fp8_attention", "emulator_recipe", "NEAREST_EMULATOR_RECIPE", "tile_multiple"]


def emulator_recipe(config: FP8AttentionConfig):
    """The emulator :class:`~fp4sim.attention.recipe.TrainingRecipe` nearest to the forward
    kernel ``config`` paired with the backward kernels (module docstring)."""
    from fp4sim.attention import recipe as r

    if not isinstance(config, FP8AttentionConfig):
        raise TypeError(f"config={config!r} must be an FP8AttentionConfig")
    base = r.TRAINING_PRESETS["flamia_mxfp8_training"]
    fwd = base.forward.replace(
        qk=r.QKFormat.TOKEN_BLOCK_FP8, normalization=config.normalization, block_kv=config.block_kv
    )
    return base.replace(
        name=f"fp8 kernel ({config.normalization.name.lower()}, block_kv={config.block_kv})",
        forward=fwd,
        p_backward=P_SQUARE_RCEIL,
        ds_probabilities=r.DsProbabilities.HIGH_PRECISION,
    )


NEAREST_EMULATOR_RECIPE = {cfg: emulator_recipe(cfg) for cfg in SHIPPED_CONFIGS}
"""Each shipped forward configuration -> its nearest emulator training recipe."""


def tile_multiple(forward: FP8AttentionConfig, backward: BackwardConfig) -> int:
    """The length every sequence must be a multiple of for this pair of configurations."""
    return math.lcm(
        2 * forward.block_q,
        forward.block_kv,
        backward.block_q,
        backward.block_kv,
        backward.dq_block_q,
        backward.dq_block_kv,
    )


def fp8_attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    forward: FP8AttentionConfig = SHIPPED_CONFIGS[0],
    backward: BackwardConfig = SHIPPED_BACKWARD_CONFIGS[0],
) -> Any:
    """O (B, T, Hq, D) of the FP8 forward kernel, differentiable by ``jax.grad``/``jax.vjp``.

    ``q`` (B, T, Hq, D), ``k``/``v`` (B, S, Hkv, D) floating jax arrays. ``causal`` overrides
    both configs' flags; O has ``forward.out_type``. The forward and backward configs must
    not carry debug steps. Shapes, dtypes and lengths are checked before anything runs.
    """
    import jax.numpy as jnp

    if not isinstance(forward, FP8AttentionConfig):
        raise TypeError(f"forward={forward!r} must be an FP8AttentionConfig")
    if not isinstance(backward, BackwardConfig):
        raise TypeError(f"backward={backward!r} must be a BackwardConfig")
    if not isinstance(causal, bool):
        raise TypeError(f"causal={causal!r} must be a bool")
    if forward.debug_step is not None or backward.debug_step is not None:
        raise ValueError(
            "fp8_attention runs without debug outputs; got debug_step="
            f"{forward.debug_step}/{backward.debug_step} (call the kernels directly)"
        )
    for name, x in (("q", q), ("k", k), ("v", v)):
        if len(x.shape) != 4:
            raise ValueError(f"{name} must be 4-D (B, N, H, D); got shape {tuple(x.shape)}")
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(f"{name} has dtype {x.dtype}; allowed: a floating dtype")
    if tuple(k.shape) != tuple(v.shape):
        raise ValueError(f"k shape {tuple(k.shape)} and v shape {tuple(v.shape)} must match")
    b, t, hq, d = q.shape
    s, hkv = k.shape[1], k.shape[2]
    if k.shape[0] != b or k.shape[3] != d or hq % hkv:
        raise ValueError(
            f"k shape {tuple(k.shape)} does not fit q shape {tuple(q.shape)} (same "
            f"batch and head_dim, q heads a multiple of kv heads)"
        )
    if d not in (64, 128):
        raise ValueError(f"head_dim={d} is not supported; allowed: 64, 128")
    mult = tile_multiple(forward, backward)
    if causal and s != t:
        raise ValueError(f"causal attention needs as many keys as queries; got T={t}, S={s}")
    if not causal and (t % mult or s % mult):
        raise ValueError(
            f"non-causal lengths T={t}, S={s} must be multiples of {mult} (padded "
            f"keys would be attended to); causal inputs are padded"
        )
    softmax_scale = _checks.softmax_scale(softmax_scale, d)
    fcfg = forward.replace(causal=causal)
    bcfg = backward.replace(causal=causal)
    return _vjp(float(softmax_scale), fcfg, bcfg, mult)(q, k, v)


def _pad(x: Any, n: int) -> Any:
    import jax.numpy as jnp

    extra = n - x.shape[1]
    return x if extra == 0 else jnp.pad(x, ((0, 0), (0, extra), (0, 0), (0, 0)))


@functools.cache
def _vjp(softmax_scale: float, fcfg: FP8AttentionConfig, bcfg: BackwardConfig, mult: int):
    import jax
    import jax.numpy as jnp

    def run_forward(q, k, v):
        t = q.shape[1]
        n = -(-t // mult) * mult
        ops = quantize_operands(_pad(q, n), _pad(k, n), _pad(v, n))
        o, lse = attention_fp8_quantized(ops, softmax_scale=softmax_scale, config=fcfg)
        return o, (ops, o, lse)

    def primal(q, k, v):
        o, _ = run_forward(q, k, v)
        return o[:, : q.shape[1]]

    def fwd(q, k, v):
        o, res = run_forward(q, k, v)
        dtypes = (jnp.zeros((), q.dtype), jnp.zeros((), k.dtype), jnp.zeros((), v.dtype))
        return o[:, : q.shape[1]], (res, dtypes)

    def bwd(saved, g):
        (ops, o, lse), (zq, zk, zv) = saved
        t = g.shape[1]
        n = o.shape[1]
        if n != t:  # padded queries: p = 2^(u − inf) = 0 in the backward
            lse = lse.at[:, :, t:].set(jnp.inf)
        g = _pad(jnp.asarray(g, jnp.float32), n)
        dq, dk, dv = attention_fp8_backward(
            BackwardResiduals(ops, o, lse), g, softmax_scale=softmax_scale, config=bcfg
        )
        if n != t:  # causal: T == S, both padded
            dq, dk, dv = dq[:, :t], dk[:, :t], dv[:, :t]
        return dq.astype(zq.dtype), dk.astype(zk.dtype), dv.astype(zv.dtype)

    f = jax.custom_vjp(primal)
    f.defvjp(fwd, bwd)
    return f

"""Training machinery: the optimizer, the jitted training step, evaluation and the leak check.

This module owns :class:`Trainer`, which for one :class:`~fp4sim.train.recipes.StudyRecipe`
and one :class:`~fp4sim.train.config.StudyConfig` compiles (ahead of time, so that a study can
compile every recipe in parallel threads before training any) **one** function, the step
``step(state, x, y, w, apply)`` of every seed at once (``vmap`` inside the jit). It serves
training (``apply`` True, position weights ``w`` all ones), evaluation and the leak check
(``apply`` False: the state comes back unchanged; the losses and gradients are returned), so
each recipe costs one compilation of the model's forward and backward. Around it:

* :func:`init_state` — the training state of every seed: parameters, AdamW state, step counter
  and data key, stacked along a leading seed axis. Seed ``s`` draws its initialization from
  ``fold_in(PRNGKey(s), 0)`` and its data from ``fold_in(PRNGKey(s), 1)``, so every recipe sees
  the same initial weights and the same batches for a given seed.
* :func:`batch_sampler` — each seed's batch of a given step, sampled on the device.
* :func:`evaluate` — held-out loss (with the recipe's own attention, or with another recipe's
  step on the same parameters: the study evaluates every model under plain float32 attention
  too, a second evaluation mode in which a model that learned through a leaky attention can
  look worse than under its own).
* :func:`leak_check` — the *causal-leak check*: the positions from ``cfg.target`` on of a batch
  are replaced by other tokens (every one differs) and the per-position losses of the earlier
  positions, and the gradient with respect to every parameter of their summed loss, are
  compared with the unperturbed batch's. Under exact causal attention both are unchanged
  (equal as values: ±0 compare equal); any difference is information from the future reaching
  the past. It also reports whether the later positions' losses changed (else the
  perturbation proved nothing).

The gradient check covers what flows into the past positions' loss: a quantity that leaks
through a scale shared by past and future tokens in the forward (V) or in the backward's
operands of those positions. A shared dS tile whose future rows carry gradient of their own
is exercised by the operator-level probe :func:`fp4sim.attention.leak.leak_probe` (recorded
beside it by the study), not here: the past positions' loss gives the future rows no gradient.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from fp4sim.train import data as _data
from fp4sim.train import model as _model
from fp4sim.train.config import OptimConfig, StudyConfig
from fp4sim.train.recipes import StudyRecipe, attention_fn

__all__ = ["make_optimizer", "Trainer", "init_state", "batch_sampler", "perturb_future",
           "perturbed_batch", "leak_check", "evaluate"]


def make_optimizer(optim: OptimConfig) -> Any:
    """optax: clip by global norm, then AdamW with linear warm-up to a constant rate, decay on
    :data:`fp4sim.train.model.DECAYED` only."""
    import jax.numpy as jnp
    import optax

    if not isinstance(optim, OptimConfig):
        raise TypeError(f"optim={optim!r} must be an OptimConfig")

    def schedule(step: Any) -> Any:
        return optim.lr * jnp.minimum(1.0, (step + 1.0) / optim.warmup_steps)

    def mask(params: dict[str, Any]) -> dict[str, bool]:
        return {k: k in _model.DECAYED for k in params}

    return optax.chain(
        optax.clip_by_global_norm(optim.clip_norm),
        optax.adamw(schedule, b1=optim.b1, b2=optim.b2, eps=optim.eps,
                    weight_decay=optim.weight_decay, mask=mask))


def perturb_future(tokens: Any, target: int, vocab: int, key: Any) -> Any:
    """``tokens`` (batch, S) with every position ≥ ``target`` replaced by a different token
    (``(t + r) mod vocab`` with r uniform in 1..vocab−1)."""
    import jax
    import jax.numpy as jnp

    r = jax.random.randint(key, tokens.shape, 1, vocab)
    future = jnp.arange(tokens.shape[-1]) >= target
    return jnp.where(future, (tokens + r) % vocab, tokens)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Trainer:
    """The jitted step of one recipe under one config (module docstring)."""

    recipe: StudyRecipe
    cfg: StudyConfig

    def __post_init__(self) -> None:
        if not isinstance(self.recipe, StudyRecipe):
            raise TypeError(f"recipe={self.recipe!r} must be a StudyRecipe")
        if not isinstance(self.cfg, StudyConfig):
            raise TypeError(f"cfg={self.cfg!r} must be a StudyConfig")
        object.__setattr__(self, "_attn", attention_fn(self.recipe))

    def _step(self, state: dict[str, Any], x: Any, y: Any, w: Any, apply: Any
              ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Every seed's step at once: the model carries the seed axis itself
        (:func:`fp4sim.train.model.logits`); the optimizer update (with its per-seed global
        norm) is vmapped over seeds. Each seed's parameters get the gradient of its own loss
        (the summed loss separates)."""
        import jax
        import jax.numpy as jnp
        import optax

        cfg = self.cfg
        tx = make_optimizer(cfg.optim)

        def loss_fn(p: Any) -> tuple[Any, tuple[Any, Any]]:
            losses = _model.position_losses(p, x, y, self._attn, cfg.model)  # (s, B, T)
            per_seed = jnp.sum(losses * w, axis=(1, 2)) / jnp.sum(w)
            return jnp.sum(per_seed), (per_seed, losses)

        (_, (loss, losses)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])

        def update(g: Any, o: Any, p: Any) -> tuple[Any, Any, Any]:
            u, o2 = tx.update(g, o, p)
            norm = jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in jax.tree_util.tree_leaves(g)))
            return optax.apply_updates(p, u), o2, norm

        params, opt, gnorm = jax.vmap(update)(grads, state["opt"], state["params"])
        keep = jax.tree_util.tree_map
        new = {"params": keep(lambda a, b: jnp.where(apply, a, b), params, state["params"]),
               "opt": keep(lambda a, b: jnp.where(apply, a, b), opt, state["opt"]),
               "step": state["step"] + apply.astype(jnp.int32), "key": state["key"]}
        return new, {"loss": loss, "grad_norm": gnorm, "losses": losses, "grads": grads}

    def lower(self, device: Any, state_like: Any, batch_like: Any) -> Any:
        """The traced and lowered step (:meth:`compile` without XLA's compilation)."""
        import jax
        import jax.numpy as jnp

        x = jax.ShapeDtypeStruct(batch_like.shape, jnp.int32)
        w = jax.ShapeDtypeStruct(batch_like.shape[1:], jnp.float32)
        a = jax.ShapeDtypeStruct((), jnp.bool_)
        with jax.default_device(device):
            return jax.jit(self._step).lower(state_like, x, x, w, a)

    def compile(self, device: Any, state_like: Any, batch_like: Any) -> Callable[..., Any]:
        """The compiled ``step(state, x, y, w, apply) -> (state, out)`` for ``device``, every
        seed at once: ``x``/``y`` (seeds, batch, S) int32 tokens and targets, ``w`` (batch, S)
        float32 position weights of the loss (ones when training), ``apply`` a bool scalar
        (False: the state comes back unchanged, for evaluation and the leak check); ``out``
        holds per seed the weighted mean loss, the global gradient norm (before clipping),
        the per-position losses and the gradients. Thread-safe: a study compiles every
        recipe from a thread pool."""
        return self.lower(device, state_like, batch_like).compile()


def init_state(cfg: StudyConfig, device: Any) -> Any:
    """The initial training state of every seed (stacked along a leading seed axis): seed
    ``s`` initializes from ``fold_in(PRNGKey(s), 0)``; its data key is ``fold_in(PRNGKey(s), 1)``.
    The same for every recipe."""
    import jax
    import jax.numpy as jnp

    tx = make_optimizer(cfg.optim)

    def one(seed: Any) -> dict[str, Any]:
        base = jax.random.PRNGKey(seed)
        params = _model.init_params(jax.random.fold_in(base, 0), cfg.model)
        return {"params": params, "opt": tx.init(params), "step": jnp.zeros((), jnp.int32),
                "key": jax.random.fold_in(base, 1)}

    with jax.default_device(device):
        return jax.jit(jax.vmap(one))(jnp.asarray(cfg.seeds, jnp.int32))


def batch_sampler(cfg: StudyConfig, device: Any) -> Callable[[Any, Any, Any], tuple[Any, Any]]:
    """Compiled ``(keys, step, tokens) -> (x, y)``: each seed's training batch of step ``step``
    from its data key (``fold_in(key, step)``), (seeds, batch, S) int32."""
    import jax

    def one(key: Any, step: Any, tokens: Any) -> tuple[Any, Any]:
        return _data.sample_windows(jax.random.fold_in(key, step), tokens, cfg.batch,
                                    cfg.model.context)

    with jax.default_device(device):
        return jax.jit(jax.vmap(one, in_axes=(0, None, None)))


def perturbed_batch(cfg: StudyConfig, x: Any) -> Any:
    """The leak check's perturbed copy of ``x`` (seeds, batch, S): every position from
    ``cfg.target`` on replaced by another token, the same replacement for every seed."""
    import jax
    import jax.numpy as jnp

    xp = perturb_future(x[0], cfg.target, cfg.model.vocab, jax.random.PRNGKey(2**31 - 1))
    return jnp.broadcast_to(xp, x.shape)


def leak_check(step: Callable[..., Any], state: Any, cfg: StudyConfig, x: Any, y: Any
               ) -> dict[str, Any]:
    """The causal-leak check (module docstring) with a compiled ``step`` (:meth:`Trainer.compile`)
    on the batch ``x``/``y`` (seeds, batch, S); per seed: ``loss_equal`` / ``grad_equal`` (the
    past positions' losses / the gradient of their loss unchanged, as values), ``loss_rel`` /
    ``grad_rel`` (largest change over the largest magnitude), ``future_changed``."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    n = x.shape[-1]
    t = cfg.target
    w = jnp.asarray((np.arange(n) < t)[None, :].repeat(x.shape[1], 0), jnp.float32)
    off = jnp.asarray(False)
    _, a = step(state, x, y, w, off)
    xp = perturbed_batch(cfg, x)
    _, b = step(state, xp, y, w, off)
    la, lb = np.asarray(a["losses"]), np.asarray(b["losses"])
    ga = [np.asarray(g) for g in jax.tree_util.tree_leaves(a["grads"])]
    gb = [np.asarray(g) for g in jax.tree_util.tree_leaves(b["grads"])]
    out = []
    for s in range(la.shape[0]):
        lp0, lp1 = la[s][:, :t], lb[s][:, :t]
        eq = lambda u, v: bool(np.all((u == v) | (np.isnan(u) & np.isnan(v))))  # noqa: E731
        g_diff = max(float(np.max(np.abs(g1[s] - g0[s]))) for g0, g1 in zip(ga, gb))
        g_ref = max(float(np.max(np.abs(g0[s]))) for g0 in ga)
        out.append({
            "loss_equal": eq(lp0, lp1),
            "loss_rel": float(np.max(np.abs(lp1 - lp0)) / np.max(np.abs(lp0))),
            "grad_equal": all(eq(g0[s], g1[s]) for g0, g1 in zip(ga, gb)),
            "grad_rel": g_diff / g_ref if g_ref > 0 else float("nan"),
            "future_changed": bool(np.any(la[s][:, t:] != lb[s][:, t:])),
        })
    return {k: [o[k] for o in out] for k in out[0]}


def evaluate(step: Callable[..., Any], state: Any, xv: Any, yv: Any) -> list[float]:
    """Mean held-out loss per seed with a compiled ``step`` (``apply`` False) over the windows
    ``xv``/``yv`` (n_batches, batch, S), the same windows for every seed."""
    import jax.numpy as jnp
    import numpy as np

    n_seeds = int(state["step"].shape[0])
    w = jnp.ones(xv.shape[1:], jnp.float32)
    total = np.zeros(n_seeds)
    for i in range(xv.shape[0]):
        xs = jnp.broadcast_to(xv[i], (n_seeds,) + xv.shape[1:])
        ys = jnp.broadcast_to(yv[i], (n_seeds,) + yv.shape[1:])
        _, out = step(state, xs, ys, w, jnp.asarray(False))
        total += np.asarray(out["loss"], dtype=np.float64)
    return (total / xv.shape[0]).tolist()

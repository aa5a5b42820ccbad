"""Training machinery: the optimizer, the jitted training step, evaluation and the leak check.

This module owns :class:`Trainer`, which for one :class:`~fp4sim.train.recipes.StudyRecipe`
and one :class:`~fp4sim.train.config.StudyConfig` compiles (ahead of time: ``jax.jit(...)
.lower(...).compile()``, so that a study compiles every recipe in a thread pool before it
trains any) **one** function, the *chunk*: a ``lax.scan`` of ``cfg.chunk`` iterations, each a
training step of every seed at once (each seed's batch sampled on the device from its data key
and step counter), so that a chunk of steps is one dispatch and one host synchronization. An
argument ``n`` runs only the first ``n`` iterations (a ``lax.cond`` skips the rest: the last,
shorter chunk of a budget), and ``probe`` turns the first iteration into a step on a given
batch with given loss weights that leaves the state unchanged and returns per-position losses
and gradients: evaluation and the leak check reuse the training executable (each extra jitted
function would be a second trace and XLA compilation of the emulator). :class:`Chunk` wraps
the compiled function (:meth:`Chunk.train`, :meth:`Chunk.probe`). Around it:

* :func:`init_state` — the training state of every seed: parameters, AdamW state, step counter
  and data key, stacked along a leading seed axis. Seed ``s`` draws its initialization from
  ``fold_in(PRNGKey(s), 0)`` and its data from ``fold_in(PRNGKey(s), 1)``, so every recipe sees
  the same initial weights and the same batches for a given seed.
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
import pickle
from collections.abc import Callable
from typing import Any

from fp4sim.train import data as _data
from fp4sim.train import model as _model
from fp4sim.train.config import OptimConfig, StudyConfig
from fp4sim.train.recipes import StudyRecipe, attention_fn

__all__ = ["make_optimizer", "Trainer", "Chunk", "init_state", "state_shapes",
           "chunk_arguments", "compile_exported", "perturb_future",
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
    """The compiled chunk of one recipe under one config (module docstring)."""

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

        scale = float(cfg.optim.loss_scale)  # a power of two: exact in float32

        def loss_fn(p: Any) -> tuple[Any, tuple[Any, Any]]:
            losses = _model.position_losses(p, x, y, self._attn, cfg.model)  # (s, B, T)
            per_seed = jnp.sum(losses * w, axis=(1, 2)) / jnp.sum(w)
            return jnp.sum(per_seed) * scale, (per_seed, losses)

        (_, (loss, losses)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
        grads = jax.tree_util.tree_map(lambda g: g * (1.0 / scale), grads)

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

    def _chunk(self, state: dict[str, Any], tokens: Any, n: Any, probe: Any, px: Any, py: Any,
               pw: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """``cfg.chunk`` iterations of a ``lax.scan``; iteration ``i < n`` runs a step (the
        others are skipped by a ``lax.cond``). Training (``probe`` False): each step samples
        its seeds' batches from their data keys and step counters, loss weights all ones,
        and updates the state. Probe (``probe`` True, ``n`` 1): one step on the given batch
        ``px``/``py`` with loss weights ``pw``, the state unchanged. Returns the state and per
        iteration the loss and gradient norm of every seed (NaN where skipped), plus the
        per-position losses and the gradients of the last step run."""
        import jax
        import jax.numpy as jnp

        cfg = self.cfg
        n_seeds = state["step"].shape[0]

        def sample(key: Any, step: Any) -> tuple[Any, Any]:
            return _data.sample_windows(jax.random.fold_in(key, step), tokens, cfg.batch,
                                        cfg.model.context)

        def run(operands: Any) -> Any:
            st, _ = operands
            xs, ys = jax.vmap(sample)(st["key"], st["step"])
            x, y = jnp.where(probe, px, xs), jnp.where(probe, py, ys)
            w = jnp.where(probe, pw, jnp.ones_like(pw))
            new, out = self._step(st, x, y, w, jnp.logical_not(probe))
            return new, {"losses": out["losses"], "grads": out["grads"]}, out["loss"], \
                out["grad_norm"]

        def skip(operands: Any) -> Any:
            st, last = operands
            nan = jnp.full((n_seeds,), jnp.nan, jnp.float32)
            return st, last, nan, nan

        def body(carry: Any, i: Any) -> Any:
            st, last, loss, gn = jax.lax.cond(i < n, run, skip, carry)
            return (st, last), (loss, gn)

        last0 = {"losses": jnp.zeros(px.shape, jnp.float32),
                 "grads": jax.tree_util.tree_map(jnp.zeros_like, state["params"])}
        (state, last), (loss, gn) = jax.lax.scan(body, (state, last0),
                                                 jnp.arange(cfg.chunk, dtype=jnp.int32))
        return state, {"loss": loss, "grad_norm": gn, **last}

    def lower(self, device: Any, state_like: Any, n_tokens: int) -> Any:
        """The traced and lowered chunk (:meth:`compile` without XLA's compilation) for a
        training token array of ``n_tokens`` entries."""
        import jax

        with jax.default_device(device):
            return jax.jit(self._chunk).lower(*chunk_arguments(self.cfg, state_like, n_tokens))

    def export(self, platform: str, n_tokens: int) -> bytes:
        """The chunk traced and lowered for ``platform`` (a jax lowering platform: ``cuda``,
        ``cpu``) by :mod:`jax.export` and pickled, on flat arguments and results (the
        optimizer state's pytree nodes need no serialization). Runs in any process, without
        the target device: the study traces its recipes in parallel worker processes (tracing
        holds the GIL) and compiles the results with :func:`compile_exported`."""
        import jax

        args = chunk_arguments(self.cfg, state_shapes(self.cfg), n_tokens)
        leaves, treedef = jax.tree_util.tree_flatten(args)

        def flat(*xs: Any) -> list[Any]:
            return jax.tree_util.tree_leaves(self._chunk(*jax.tree_util.tree_unflatten(treedef,
                                                                                       xs)))

        # the emulator's Pallas (Triton) GPU kernels are custom calls without jax's
        # serialization-stability guarantee: fine here, the same jax compiles them at once
        triton = jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")
        exported = jax.export.export(jax.jit(flat), platforms=[platform],
                                     disabled_checks=[triton])(*leaves)
        # pickled, not Exported.serialize() (that needs the flatbuffers package, absent on the
        # GPU machine); the VJP hook is a local function and is not needed (nothing here
        # differentiates the exported chunk)
        return pickle.dumps(dataclasses.replace(exported, _get_vjp=None))

    def compile(self, device: Any, state_like: Any, n_tokens: int) -> Chunk:
        """The compiled :class:`Chunk` for ``device`` (thread-safe: a study compiles every
        recipe from a thread pool)."""
        return Chunk(self.lower(device, state_like, n_tokens).compile(), self.cfg)


class Chunk:
    """A recipe's compiled chunk (:meth:`Trainer._chunk`) with its two uses: :meth:`train`
    (up to ``cfg.chunk`` steps in one dispatch) and :meth:`probe` (one step on a given batch,
    the state unchanged: evaluation and the leak check)."""

    def __init__(self, compiled: Any, cfg: StudyConfig) -> None:
        self.compiled = compiled
        self.cfg = cfg

    def _dummy(self) -> tuple[Any, Any]:
        import jax.numpy as jnp

        cfg = self.cfg
        shape = (len(cfg.seeds), cfg.batch, cfg.model.context)
        return jnp.zeros(shape, jnp.int32), jnp.ones(shape[1:], jnp.float32)

    def train(self, state: Any, tokens: Any, k: int) -> tuple[Any, Any, Any]:
        """``k`` (1..chunk) training steps, dispatched asynchronously: (new state, losses
        (k, seeds), gradient norms (k, seeds)) as device arrays."""
        import jax.numpy as jnp

        if not 1 <= k <= self.cfg.chunk:
            raise ValueError(f"k={k} must be in 1..chunk={self.cfg.chunk}")
        x, w = self._dummy()
        state, out = self.compiled(state, tokens, jnp.asarray(k, jnp.int32),
                                   jnp.asarray(False), x, x, w)
        return state, out["loss"][:k], out["grad_norm"][:k]

    def probe(self, state: Any, tokens: Any, x: Any, y: Any, w: Any) -> dict[str, Any]:
        """One step on ``x``/``y`` (seeds, batch, S) with loss weights ``w`` (batch, S), the
        state unchanged: per seed the weighted mean ``loss`` and ``grad_norm``, the
        per-position ``losses`` and the ``grads``."""
        import jax.numpy as jnp

        _, out = self.compiled(state, tokens, jnp.asarray(1, jnp.int32), jnp.asarray(True),
                               x, y, w)
        return {"loss": out["loss"][0], "grad_norm": out["grad_norm"][0],
                "losses": out["losses"], "grads": out["grads"]}


def chunk_arguments(cfg: StudyConfig, state_like: Any, n_tokens: int) -> tuple[Any, ...]:
    """Shapes of :meth:`Trainer._chunk`'s arguments (state, tokens, n, probe, px, py, pw)."""
    import jax
    import jax.numpy as jnp

    shape = (len(cfg.seeds), cfg.batch, cfg.model.context)
    x = jax.ShapeDtypeStruct(shape, jnp.int32)
    return (state_like, jax.ShapeDtypeStruct((n_tokens,), jnp.int32),
            jax.ShapeDtypeStruct((), jnp.int32), jax.ShapeDtypeStruct((), jnp.bool_), x, x,
            jax.ShapeDtypeStruct(shape[1:], jnp.float32))


def compile_exported(blob: bytes, cfg: StudyConfig, device: Any, state_like: Any,
                     n_tokens: int) -> Chunk:
    """A :class:`Chunk` from :meth:`Trainer.export`'s bytes: the serialized module called on
    the flattened arguments, its flat results put back into ``(state, out)``, compiled by XLA
    for ``device`` (the same module as :meth:`Trainer.compile` compiles)."""
    import jax

    exported = pickle.loads(blob)  # noqa: S301 - bytes this study's own worker wrote
    args = chunk_arguments(cfg, state_like, n_tokens)
    treedef = jax.tree_util.tree_structure(args)
    state_def = jax.tree_util.tree_structure(state_like)
    template = (jax.tree_util.tree_unflatten(state_def, [0] * state_def.num_leaves),
                {"loss": 0, "grad_norm": 0, "losses": 0,
                 "grads": jax.tree_util.tree_map(lambda _: 0, state_like["params"])})
    out_def = jax.tree_util.tree_structure(template)

    def call(*xs: Any) -> Any:
        if jax.tree_util.tree_structure(xs) != treedef:
            raise TypeError("the chunk's arguments do not have the exported structure")
        return jax.tree_util.tree_unflatten(out_def, exported.call(*jax.tree_util.tree_leaves(xs)))

    with jax.default_device(device):
        return Chunk(jax.jit(call).lower(*args).compile(), cfg)


def state_shapes(cfg: StudyConfig) -> Any:
    """Shapes of :func:`init_state`'s result (traced, nothing computed)."""
    import jax
    import jax.numpy as jnp

    return jax.eval_shape(_init_fn(cfg), jnp.asarray(cfg.seeds, jnp.int32))


def _init_fn(cfg: StudyConfig) -> Callable[[Any], Any]:
    import jax
    import jax.numpy as jnp

    tx = make_optimizer(cfg.optim)

    def one(seed: Any) -> dict[str, Any]:
        base = jax.random.PRNGKey(seed)
        params = _model.init_params(jax.random.fold_in(base, 0), cfg.model)
        return {"params": params, "opt": tx.init(params), "step": jnp.zeros((), jnp.int32),
                "key": jax.random.fold_in(base, 1)}

    return jax.vmap(one)


def init_state(cfg: StudyConfig, device: Any) -> Any:
    """The initial training state of every seed (stacked along a leading seed axis): seed
    ``s`` initializes from ``fold_in(PRNGKey(s), 0)``; its data key is ``fold_in(PRNGKey(s), 1)``.
    The same for every recipe."""
    import jax
    import jax.numpy as jnp

    with jax.default_device(device):
        return jax.jit(_init_fn(cfg))(jnp.asarray(cfg.seeds, jnp.int32))


def perturbed_batch(cfg: StudyConfig, x: Any) -> Any:
    """The leak check's perturbed copy of ``x`` (seeds, batch, S): every position from
    ``cfg.target`` on replaced by another token, the same replacement for every seed."""
    import jax
    import jax.numpy as jnp

    xp = perturb_future(x[0], cfg.target, cfg.model.vocab, jax.random.PRNGKey(2**31 - 1))
    return jnp.broadcast_to(xp, x.shape)


def leak_check(chunk: Chunk, state: Any, tokens: Any, cfg: StudyConfig, x: Any, y: Any
               ) -> dict[str, Any]:
    """The causal-leak check (module docstring) with a recipe's compiled ``chunk`` (its
    :meth:`Chunk.probe`) on the batch ``x``/``y`` (seeds, batch, S); per seed: ``loss_equal`` /
    ``grad_equal`` (the past positions' losses / the gradient of their loss unchanged, as
    values), ``loss_rel`` / ``grad_rel`` (largest change over the largest magnitude),
    ``future_changed``."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    n = x.shape[-1]
    t = cfg.target
    w = jnp.asarray((np.arange(n) < t)[None, :].repeat(x.shape[1], 0), jnp.float32)
    a = chunk.probe(state, tokens, x, y, w)
    xp = perturbed_batch(cfg, x)
    b = chunk.probe(state, tokens, xp, y, w)
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


def evaluate(chunk: Chunk, state: Any, tokens: Any, xv: Any, yv: Any) -> list[float]:
    """Mean held-out loss per seed with a recipe's compiled ``chunk`` (:meth:`Chunk.probe`)
    over the windows ``xv``/``yv`` (n_batches, batch, S), the same windows for every seed."""
    import jax.numpy as jnp
    import numpy as np

    n_seeds = int(state["step"].shape[0])
    w = jnp.ones(xv.shape[1:], jnp.float32)
    total = np.zeros(n_seeds)
    for i in range(xv.shape[0]):
        xs = jnp.broadcast_to(xv[i], (n_seeds,) + xv.shape[1:])
        ys = jnp.broadcast_to(yv[i], (n_seeds,) + yv.shape[1:])
        total += np.asarray(chunk.probe(state, tokens, xs, ys, w)["loss"], dtype=np.float64)
    return (total / xv.shape[0]).tolist()

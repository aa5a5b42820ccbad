"""The study runner: compile every recipe, train them in turn within a budget, time, check.

:func:`run_study` is what ``python -m fp4sim train`` runs. Phases:

1. **Compile** every recipe's step (:class:`fp4sim.train.loop.Trainer`) in background threads
   (XLA compiles outside the GIL; the tracing holds it, so one recipe traces at a time and
   the first ones reach XLA early), in priority order;
   ``jnp_float32`` is always compiled first (the timing reference and the second evaluation
   mode). The main thread meanwhile trains whatever has compiled.
2. **Train** round-robin: the compiled recipe with the fewest steps runs the next ``chunk``
   steps (ties: priority order), so every recipe reaches about the same number of steps and a
   late compilation catches up first. While compilations are pending, recipes go at most half
   way to the target and the jnp baselines at most a chunk ahead of the emulated recipes. Training stops when every recipe has ``cfg.steps``
   steps or when the next chunk would eat into the reserve that the checks of phase 4 need
   (estimated from the measured step times): under a time budget the run never overruns, and
   all recipes end within one chunk of each other (a recipe whose compilation finished too
   late for that has fewer steps; one that never finished is recorded as skipped).
3. **Time** side by side, once every compilation has finished (so that no compilation thread
   competes with the measurement): each recipe's first step is untimed (first-execution
   work), then ``TIMING_ROUNDS`` rounds in which every recipe in turn runs ``chunk`` timed
   steps. They are real training steps (kept). The median seconds per step and the ratio to
   ``jnp_float32``'s are the timing result.
4. **Per recipe**, after training: the causal-leak check on the final parameters (and on the
   initial ones), held-out loss under its own attention and under float32 attention, a
   determinism rerun (the first ``chunk`` steps again from the initial state: the losses must
   be bitwise identical), the operator-level leak probe
   (:func:`fp4sim.attention.leak.leak_probe`, NumPy) and the leak classes of its operands
   (:func:`fp4sim.attention.causal.leak_class`); the JSON record is rewritten after each
   recipe (and every 20 s during training), so a run cut off still leaves its data.
5. The figure and the table (:mod:`fp4sim.train.report`) from the record.

The record (``train_study.json``) holds the provenance (git revision, a digest of the fp4sim
sources, library versions, device, XLA flags, the exact configuration and every recipe's full
definition, the corpus fingerprint), every step's loss and gradient norm per seed, the timing
and the checks; :func:`fp4sim.train.report.regenerate` rebuilds figure and table from it alone.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import importlib.metadata
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fp4sim.train import data as _data
from fp4sim.train import loop as _loop
from fp4sim.train import report as _report
from fp4sim.train.config import StudyConfig
from fp4sim.train.recipes import StudyRecipe, study_recipe

__all__ = ["run_study", "provenance", "RECORD_NAME", "SCHEMA", "TIMING_ROUNDS"]

RECORD_NAME = "train_study.json"
SCHEMA = "fp4sim.train.study/1"
TIMING_ROUNDS = 2
_FIGURE_RESERVE_S = 8.0  # figure + table + last write
_GUESS_FACTOR = 4.0  # an emulated step / the jnp reference's, until one is measured (CPU: 1.2-2.3)


def _git(*args: str) -> str | None:
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _source_digest() -> str:
    """sha256 over every ``fp4sim/**/*.py`` (path and content, sorted): identifies the code
    even where the checkout has no git metadata."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        h.update(str(p.relative_to(root)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def provenance(device: Any, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Where and with what a record was made (module docstring)."""
    import jax

    rev = _git("rev-parse", "HEAD")
    dirty = _git("status", "--porcelain")
    try:
        platform_version = device.client.platform_version
    except Exception:  # noqa: BLE001 - informational only
        platform_version = None
    return {
        "git_revision": rev or os.environ.get("FP4SIM_GIT_REVISION") or "unknown (no git)",
        "git_dirty": None if dirty is None else bool(dirty),
        "source_sha256": _source_digest(),
        "versions": {"python": sys.version.split()[0],
                     **{n: _version(n) for n in ("fp4sim", "jax", "jaxlib", "numpy", "optax",
                                                 "ml_dtypes", "matplotlib", "tqdm")}},
        "device": {"platform": device.platform, "kind": getattr(device, "device_kind", None),
                   "count": len(jax.devices(device.platform)),
                   "platform_version": platform_version},
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "jax_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("JAX_")},
        "jax_config": {"jax_enable_x64": bool(jax.config.jax_enable_x64),
                       "jax_default_matmul_precision":
                           str(jax.config.jax_default_matmul_precision)},
        "host": {"node": platform.node(), "platform": platform.platform(),
                 "cpus": os.cpu_count()},
        "argv": list(sys.argv if argv is None else argv),
        "started_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }


def _recipe_info(r: StudyRecipe) -> dict[str, Any]:
    from fp4sim.attention import causal as sc

    info: dict[str, Any] = {"label": r.label, "kind": r.kind.name, "tests": r.tests,
                            "definition": repr(r.training) if r.training else r.kind.value}
    if r.training is not None:
        t = r.training
        info["leak_class"] = {op: sc.leak_class(s).name for op, s in (
            ("qk", t.qk), ("v", t.v), ("d_out", t.d_out), ("p_backward", t.p_backward),
            ("ds", t.ds))}
    else:
        info["leak_class"] = {"attention": "NONE"}
    return info


def _write(record: dict[str, Any], path: Path) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=1, allow_nan=True) + "\n")
    os.replace(tmp, path)


def _f32(x: Any) -> list:
    """float32 values as JSON floats that round-trip (9 significant digits)."""
    a = np.asarray(x, dtype=np.float32)
    return [[float(f"{v:.9g}") for v in row] for row in a.tolist()] if a.ndim == 2 else \
        [float(f"{v:.9g}") for v in a.tolist()]


class _Compiler:
    """Compiles the recipes' steps in daemon threads, in priority order (a compilation still
    running when the study stops does not keep the process alive). ``lock`` guards
    ``results``/``errors``/``seconds``."""

    def __init__(self, cfg: StudyConfig, device: Any, names: Sequence[str], state_like: Any,
                 batch_like: Any, workers: int) -> None:
        self.results: dict[str, Any] = {}
        self.errors: dict[str, str] = {}
        self.seconds: dict[str, float] = {}
        self.lock = threading.Lock()
        self._tracing = threading.Lock()
        self._changed = threading.Condition(self.lock)
        self._queue = list(names)
        self._left = len(names)
        args = (cfg, device, state_like, batch_like)
        for _ in range(max(1, min(workers, len(names)))):
            threading.Thread(target=self._work, args=args, daemon=True).start()

    @property
    def pending(self) -> int:
        """Compilations not finished (call with ``lock`` held or accept a stale count)."""
        return self._left

    def _work(self, cfg: StudyConfig, device: Any, state_like: Any, batch_like: Any) -> None:
        while True:
            with self.lock:
                if not self._queue:
                    return
                name = self._queue.pop(0)
            t0 = time.perf_counter()
            step, error = None, None
            try:
                recipe = study_recipe(name).with_accumulation(cfg.accumulation)
                with self._tracing:  # one trace at a time (the GIL serializes them anyway):
                    #                  the first recipes then reach XLA, and the GPU, sooner
                    lowered = _loop.Trainer(recipe=recipe, cfg=cfg).lower(device, state_like,
                                                                          batch_like)
                step = lowered.compile()  # outside the GIL, in parallel
            except Exception as e:  # noqa: BLE001 - recorded, the study goes on
                error = f"{type(e).__name__}: {e}"
            with self.lock:
                if error is None:
                    self.results[name] = step
                else:
                    self.errors[name] = error
                self.seconds[name] = time.perf_counter() - t0
                self._left -= 1
                self._changed.notify_all()

    def wait_any(self, timeout: float) -> None:
        """Until some compilation finishes (or ``timeout`` seconds)."""
        with self.lock:
            if self._left:
                self._changed.wait(timeout)


def _bar(progress: bool, **kw: Any) -> Any:
    from tqdm import tqdm

    # to a log file (no terminal): a line every 15 s instead of a stream of redraws
    slow = {} if sys.stderr.isatty() else {"mininterval": 15.0}
    return tqdm(disable=not progress, file=sys.stderr, dynamic_ncols=True, **slow, **kw)


@dataclasses.dataclass
class _Run:
    """One recipe's training in progress."""

    name: str
    step: Any
    state: Any
    loss: list = dataclasses.field(default_factory=list)  # device arrays (seeds,)
    grad_norm: list = dataclasses.field(default_factory=list)
    timed: list = dataclasses.field(default_factory=list)  # seconds per step of timing rounds
    step_s: float | None = None  # the current estimate of seconds per step (steady state)
    first_s: float | None = None  # the first step's time (includes first-execution work)
    started: bool = False

    @property
    def steps(self) -> int:
        return len(self.loss)


def _advance(run: _Run, n: int, sampler: Any, tokens: Any, w: Any) -> None:
    """``n`` training steps (asynchronous dispatch; the caller synchronizes)."""
    import jax.numpy as jnp

    on = jnp.asarray(True)
    keys = run.state["key"]
    for _ in range(n):
        x, y = sampler(keys, jnp.asarray(run.steps, jnp.int32), tokens)
        run.state, out = run.step(run.state, x, y, w, on)
        run.loss.append(out["loss"])
        run.grad_norm.append(out["grad_norm"])


def _first(run: _Run, sampler: Any, tokens: Any, w: Any) -> None:
    """The first step (first-execution work: its time is only an upper bound, ``first_s``;
    the estimate ``step_s`` comes from the next chunk)."""
    if run.started:
        return
    t = time.perf_counter()
    _advance(run, 1, sampler, tokens, w)
    _sync(run)
    run.started = True
    run.first_s = time.perf_counter() - t


def _sync(run: _Run) -> float:
    """Block until ``run``'s last step is done; its seeds' mean loss."""
    return float(np.mean(np.asarray(run.loss[-1]))) if run.loss else float("nan")


def run_study(cfg: StudyConfig, recipe_names: Sequence[str], out_dir: str | Path, *,
              progress: bool = True, argv: Sequence[str] | None = None,
              t0: float | None = None, figure: bool = True) -> dict[str, Any]:
    """Run the study (module docstring) and return its record (also written to
    ``out_dir/train_study.json``, with ``train_loss.png`` and ``train_table.md`` when
    ``figure``). ``t0``: the ``time.monotonic()`` the time budget counts from (default: now)."""
    import jax

    t0 = time.monotonic() if t0 is None else t0
    if not isinstance(cfg, StudyConfig):
        raise TypeError(f"cfg={cfg!r} must be a StudyConfig")
    try:
        device = jax.devices(cfg.device.value)[0]
    except RuntimeError as e:
        raise ValueError(f"device={cfg.device.value!r}: jax finds no such device here ({e})")
    with jax.default_device(device):  # every array of the run on that device
        return _run_study(cfg, recipe_names, out_dir, progress=progress, argv=argv, t0=t0,
                          figure=figure, device=device)


def _run_study(cfg: StudyConfig, recipe_names: Sequence[str], out_dir: str | Path, *,
               progress: bool, argv: Sequence[str] | None, t0: float, figure: bool,
               device: Any) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    names = list(dict.fromkeys(recipe_names))
    if not names:
        raise ValueError("recipe_names must name at least one recipe")
    recipes = {n: study_recipe(n) for n in names}  # validates the names
    budget = cfg.time_budget_s
    deadline = math.inf if budget is None else t0 + budget
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / RECORD_NAME

    raw = _data.corpus_bytes()
    train_np, val_np = _data.split_tokens(raw)
    xv, yv = _data.validation_windows(val_np, cfg.eval_batches * cfg.batch, cfg.model.context)
    shape3 = (cfg.eval_batches, cfg.batch, cfg.model.context)
    n_seeds = len(cfg.seeds)
    with jax.default_device(device):
        tokens = jnp.asarray(train_np)
        xv, yv = jnp.asarray(xv.reshape(shape3)), jnp.asarray(yv.reshape(shape3))
        x_leak = jnp.broadcast_to(xv[0], (n_seeds,) + xv.shape[1:])
        y_leak = jnp.broadcast_to(yv[0], (n_seeds,) + yv.shape[1:])
        w_train = jnp.ones(xv.shape[1:], jnp.float32)
        state0 = _loop.init_state(cfg, device)
        sampler = _loop.batch_sampler(cfg, device)
    state_like = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), state0)
    batch_like = jax.ShapeDtypeStruct((n_seeds,) + xv.shape[1:], jnp.int32)

    record: dict[str, Any] = {
        "schema": SCHEMA, "status": "compiling", "provenance": provenance(device, argv),
        "config": cfg.as_dict(), "corpus": _data.corpus_info(raw),
        "model": {"n_params": cfg.model.n_params,
                  "train_flops_per_step_per_seed": cfg.model.train_flops_per_token()
                  * cfg.batch * cfg.model.context},
        "accumulation": cfg.accumulation.name, "recipe_order": names,
        "leak_target": cfg.target,
        "recipes": {n: _recipe_info(r) for n, r in recipes.items()}, "timing": {},
    }
    _write(record, path)

    # 1. compile in background threads (jnp_float32 first: the timing reference and the float32
    #    evaluation); the main thread trains whatever has compiled meanwhile
    to_compile = list(dict.fromkeys(["jnp_float32", *names]))
    workers = max(1, min(len(to_compile), (os.cpu_count() or 2)))
    comp = _Compiler(cfg, device, to_compile, state_like, batch_like, workers)
    bar = _bar(progress, total=cfg.steps * len(names), desc="train", unit="step")
    runs: dict[str, _Run] = {}
    ref: _Run | None = None
    timing_done = False
    last_write = time.monotonic()

    def estimates() -> dict[str, float] | None:
        """Seconds per step of every recipe: the measured steady time where there is one;
        for a recipe not yet measured, the slowest measured emulated recipe's, or
        ``_GUESS_FACTOR`` x the reference's before any emulated one is measured (a jnp
        baseline: the reference's). None before anything is measured."""
        known = {n: r.step_s for n, r in runs.items() if r.step_s is not None}
        if ref is not None and ref.step_s is not None:
            known.setdefault("jnp_float32", ref.step_s)
        if not known:
            return None
        slow = [v for n, v in known.items() if n in recipes and recipes[n].training]
        base = known.get("jnp_float32", min(known.values()))
        guess = max(slow) if slow else _GUESS_FACTOR * base
        return {n: known.get(n, guess if recipes[n].training else base) for n in names} | {
            "jnp_float32": base}

    def reserve(planned: bool = False) -> float:
        """Time the checks of phase 4 and the figure need: for the compiled recipes (the
        others would be skipped), or with ``planned`` for every recipe (for the target)."""
        est = estimates()
        if est is None:
            return _FIGURE_RESERVE_S
        per = 4 + 2 * cfg.eval_batches + 2 * cfg.chunk  # checks, rerun, catch-up
        return sum(est[n] * per + est["jnp_float32"] * cfg.eval_batches + 1.0
                   for n in names if planned or n in runs) + _FIGURE_RESERVE_S

    def target() -> int:
        """The step count every recipe should reach: all of ``cfg.steps`` without a budget;
        else what the remaining time allows if from now on every recipe (compiled or not)
        trains to the same count at its estimated step time (``estimates``), less the
        checks' time. Recomputed before every chunk, so it corrects itself as times arrive."""
        if budget is None:
            return cfg.steps
        est = estimates()
        if est is None:
            return min(cfg.steps, cfg.chunk + 1)  # a first chunk, to measure
        done = {n: runs[n].steps if n in runs else 0 for n in names}
        left = deadline - time.monotonic() - reserve(planned=True)
        total = sum(est[n] for n in names)
        n_hat = (left + sum(est[n] * done[n] for n in names)) / total if total > 0 else 0.0
        return int(max(0, min(cfg.steps, n_hat)))

    def limit(r: _Run, goal: int, pending: int) -> int:
        """How far ``r`` may go now: the target; while compilations are pending only half of
        it (the target still rests on guesses for the recipes not yet measured), and a jnp
        baseline at most one chunk ahead of the furthest emulated recipe (so that the
        baselines do not race ahead while the emulated recipes compile: the checks run on
        each recipe's final state, which should be at the common step count)."""
        if not pending:
            return goal
        lim = max(cfg.chunk + 1, goal // 2)
        if recipes[r.name].training is None:
            emulated = [x.steps for x in runs.values() if recipes[x.name].training is not None]
            lim = min(lim, max(cfg.chunk + 1, max(emulated, default=0) + cfg.chunk))
        return min(goal, lim)

    def timed_chunk(r: _Run) -> None:
        """One timed chunk: kept as training when it stays within the target, else run on a
        scratch copy of the state (the measurement must not push a recipe ahead)."""
        keep = r.steps + cfg.chunk <= min(cfg.steps, target())
        rr = r if keep else _Run(name=r.name, step=r.step, state=r.state, started=True)
        if not keep:
            rr.loss = list(r.loss)  # the step numbers continue
        t = time.perf_counter()
        _advance(rr, cfg.chunk, sampler, tokens, w_train)
        _sync(rr)
        r.timed.append((time.perf_counter() - t) / cfg.chunk)
        r.step_s = statistics.median(r.timed)
        if keep:
            bar.update(cfg.chunk if r.name in names else 0)

    while True:
        with comp.lock:
            ready = dict(comp.results)
            pending = comp.pending
        if ref is None and "jnp_float32" in ready:
            ref = _Run(name="jnp_float32", step=ready["jnp_float32"], state=state0)
            if "jnp_float32" in names:
                runs["jnp_float32"] = ref
        for n in names:
            if n in ready and n not in runs:
                runs[n] = _Run(name=n, step=ready[n], state=state0)
        if ref is None and "jnp_float32" in comp.errors:
            raise RuntimeError(f"the jnp_float32 step did not compile: "
                               f"{comp.errors['jnp_float32']}")
        if not pending and not timing_done and ref is not None:
            # 3. time side by side, uncontended (the reference too, even when not trained)
            timed = dict(runs)
            timed.setdefault("jnp_float32", ref)
            for r in timed.values():
                _first(r, sampler, tokens, w_train)
            cost = sum(TIMING_ROUNDS * cfg.chunk * (r.step_s or r.first_s)
                       for r in timed.values())
            if time.monotonic() + cost < deadline - reserve():
                for _ in range(TIMING_ROUNDS):
                    for r in timed.values():
                        timed_chunk(r)
            timing_done = True
            continue
        # 2. the compiled recipe with the fewest steps next (ties: priority order)
        goal = target()
        if bar.total != goal * len(names):
            bar.total = goal * len(names)
            bar.refresh()
        todo = [r for r in runs.values() if r.steps < limit(r, goal, pending)]
        if not todo:
            if pending and time.monotonic() < deadline - reserve():
                comp.wait_any(0.5)
                continue
            break
        r = min(todo, key=lambda r: (r.steps, names.index(r.name)))
        if not r.started:
            _first(r, sampler, tokens, w_train)
            bar.update(1)
            continue
        k = min(cfg.chunk, limit(r, goal, pending) - r.steps)
        if time.monotonic() + k * (r.step_s or r.first_s) > deadline - reserve():
            break
        t = time.perf_counter()
        _advance(r, k, sampler, tokens, w_train)
        loss = _sync(r)
        if not r.timed:  # until the timing rounds, the latest chunk's time
            r.step_s = (time.perf_counter() - t) / k
        bar.update(k)
        bar.set_postfix_str(f"{r.name[:28]} {r.steps}/{goal} loss {loss:.3f}")
        if time.monotonic() - last_write > 20.0:  # a checkpoint of the curves so far
            for m, rr in runs.items():
                record["recipes"][m].update(_curves(rr, cfg))
            record["status"] = "training"
            _write(record, path)
            last_write = time.monotonic()
    # catch-up: every recipe to the same step count (the schedule leaves them within a chunk)
    top = max((r.steps for r in runs.values()), default=0)
    for r in sorted(runs.values(), key=lambda r: r.steps):
        k = top - r.steps
        if 0 < k and r.started and time.monotonic() + k * (r.step_s or r.first_s) < \
                deadline - reserve() + _FIGURE_RESERVE_S / 2:
            _advance(r, k, sampler, tokens, w_train)
            _sync(r)
            bar.update(k)
    bar.close()

    record["timing"]["compile_s"] = {n: round(s, 3) for n, s in comp.seconds.items()}
    timed = dict(runs)
    if ref is not None:
        timed.setdefault("jnp_float32", ref)
    step_s = {n: statistics.median(r.timed) for n, r in timed.items() if r.timed}
    ref_s = step_s.get("jnp_float32")
    record["timing"].update({
        "step_s": {n: round(v, 6) for n, v in step_s.items()},
        "ratio_to_jnp_float32": {n: round(v / ref_s, 3) for n, v in step_s.items()}
        if ref_s else {},
        "timed_steps_per_recipe": TIMING_ROUNDS * cfg.chunk if step_s else 0,
        "jnp_float32_model_tflops": round(record["model"]["train_flops_per_step_per_seed"]
                                          * n_seeds / ref_s / 1e12, 4) if ref_s else None,
        "note": "median seconds per training step (all seeds), each recipe timed in turn in "
                "the same process after every compilation finished; ratios are the claim, "
                "absolute times only on the GPU",
    })
    for n in names:
        if n not in runs:
            record["recipes"][n]["skipped"] = comp.errors.get(
                n, "its compilation had not finished when the time budget ran out")
    record["status"] = "checking"
    _write(record, path)

    # 4. per recipe: checks, then the record again
    f32_step = ref.step if ref is not None else None
    for n, r in runs.items():
        record["recipes"][n].update(_curves(r, cfg))
        record["recipes"][n].update(_finish(r, cfg, state0, sampler, tokens, w_train, xv, yv,
                                            x_leak, y_leak, f32_step, recipes[n]))
        _write(record, path)

    record["status"] = "complete"
    with comp.lock:
        record["compilations_unfinished"] = comp.pending
    record["wall_s"] = round(time.monotonic() - t0, 3)
    record["provenance"]["finished_utc"] = _dt.datetime.now(_dt.UTC).isoformat(
        timespec="seconds")
    _write(record, path)
    if figure:
        _report.regenerate(path, out_dir)
    return record


def _curves(r: _Run, cfg: StudyConfig) -> dict[str, Any]:
    loss = np.stack([np.asarray(a) for a in r.loss]) if r.loss else np.zeros((0, len(cfg.seeds)))
    gn = np.stack([np.asarray(a) for a in r.grad_norm]) if r.grad_norm else \
        np.zeros((0, len(cfg.seeds)))
    return {"steps": r.steps, "truncated": r.steps < cfg.steps,
            "loss": _f32(loss.T), "grad_norm": _f32(gn.T)}  # (seeds, steps)


def _finish(r: _Run, cfg: StudyConfig, state0: Any, sampler: Any, tokens: Any, w: Any,
            xv: Any, yv: Any, x_leak: Any, y_leak: Any, f32_step: Any,
            recipe: StudyRecipe) -> dict[str, Any]:
    """The per-recipe results and checks after training (module docstring, phase 4)."""
    loss = np.stack([np.asarray(a) for a in r.loss]) if r.loss else np.zeros((0, 0))
    res: dict[str, Any] = {}
    res["leak_init"] = _loop.leak_check(r.step, state0, cfg, x_leak, y_leak)
    res["leak_final"] = _loop.leak_check(r.step, r.state, cfg, x_leak, y_leak)
    res["val_loss_own"] = _loop.evaluate(r.step, r.state, xv, yv)
    if f32_step is not None:
        res["val_loss_float32"] = _loop.evaluate(f32_step, r.state, xv, yv)
    # determinism: the first chunk again from the initial state, bit for bit
    n = min(cfg.chunk, r.steps)
    again = _Run(name=r.name, step=r.step, state=state0)
    _advance(again, n, sampler, tokens, w)
    rerun = np.stack([np.asarray(a) for a in again.loss]) if n else np.zeros((0, 0))
    res["determinism"] = {"steps": n, "bitwise_equal": bool(
        np.array_equal(rerun.view(np.uint32), loss[:n].view(np.uint32)))}
    if recipe.training is not None:
        from fp4sim.attention.leak import leak_probe

        p = leak_probe(recipe.training)
        res["operator_probe"] = {"leak_o": p.leak_o, "leak_dq": p.leak_dq,
                                 "bitwise_o": p.bitwise_o, "bitwise_dq": p.bitwise_dq,
                                 "vacuous": p.vacuous, "n_tokens": 128, "gain": p.gain}
    return res

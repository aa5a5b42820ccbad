"""The study runner: compile every recipe first, then train them side by side within a budget.

:func:`run_study` is what ``python -m fp4sim train`` runs. Phases:

1. **Compile** every recipe's chunk (:class:`fp4sim.train.loop.Trainer`: ``jax.jit(...)
   .lower(...).compile()``) in a thread pool of at most ``os.cpu_count()`` workers, with jax's
   persistent compilation cache in ``out_dir/jax_cache`` (a second run with the same code,
   shapes and device reuses the executables and XLA's autotuning results). Tracing holds the
   GIL, so one recipe traces at a time (in priority order) while XLA compiles the ones traced
   before it in parallel. Nothing trains meanwhile, so nothing competes with the compilations
   for the CPU and no compilation competes with the training loop. ``jnp_float32`` is always
   part of the study: the timing reference and the float32 evaluation mode. Each recipe's
   trace+lower and XLA compile seconds are recorded and printed. Under a time budget the
   compilations have until :data:`COMPILE_SHARE` of it: a recipe still compiling then is
   recorded as skipped (with why) rather than letting it take the others' training time.
2. **Train** in rounds: every recipe in turn runs one chunk (``cfg.chunk`` steps in one
   dispatch, one host synchronization; :meth:`fp4sim.train.loop.Chunk.train`), so all recipes
   stay at the same step count. After each round the common target is re-planned from the
   measured seconds per step, never below what is done, so a time budget gives **fewer steps
   for all, the same for all** (at least one chunk each, even when the compilations took the
   whole budget: then the run overruns and says so). A recipe that fails at run time (e.g.
   out of memory) is recorded as skipped with the error; the others go on.
3. **Time**: each chunk is timed between two synchronizations; a recipe's seconds per step are
   the median over its chunks after the first (the first includes first-execution work), all
   recipes measured in turn in the same process: the ratios to ``jnp_float32`` are the speed
   result.
4. **Per recipe**, after training: the causal-leak check on the initial and the final
   parameters (:func:`fp4sim.train.loop.leak_check`), held-out loss under its own attention and
   under float32 attention, the operator-level leak probe
   (:func:`fp4sim.attention.leak.leak_probe`, NumPy) and the leak classes of its operands; for
   one recipe (``determinism_recipe``: by default the first emulated one) a **bitwise
   determinism** check: its first chunk again from the initial state, the loss curve compared
   bit for bit. The JSON record is rewritten after every round and every recipe's checks, so a
   run cut off still leaves its data.
5. The figure and the table (:mod:`fp4sim.train.report`) from the record.

The record (``train_study.json``) holds the provenance (git revision from the environment
variable ``FP4SIM_GIT_REVISION`` or from git when the package is its own checkout's top level,
else ``unknown``; a digest of the fp4sim sources; library versions; device; XLA flags), the
exact configuration and every recipe's full definition and accumulation, the corpus
fingerprint, every step's loss and gradient norm per seed, the compile times, the timing and
the checks; :func:`fp4sim.train.report.regenerate` rebuilds figure and table from it alone.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime as _dt
import hashlib
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fp4sim.train import data as _data
from fp4sim.train import loop as _loop
from fp4sim.train import report as _report
from fp4sim.train.config import StudyConfig
from fp4sim.train.recipes import AttentionKind, StudyRecipe, study_recipe

__all__ = ["run_study", "provenance", "git_revision", "RECORD_NAME", "SCHEMA", "CACHE_NAME",
           "REFERENCE"]

RECORD_NAME = "train_study.json"
SCHEMA = "fp4sim.train.study/2"
CACHE_NAME = "jax_cache"
REFERENCE = "jnp_float32"
"""The recipe every study trains: the timing reference and the float32 evaluation mode."""
COMPILE_SHARE = 0.7
"""Under a time budget, compilations must finish within this share of it (from the start):
a recipe still compiling then is skipped, so that the others keep time to train (the
``jnp_float32`` reference is always waited for)."""
_FIGURE_RESERVE_S = 8.0  # figure + table + last write
_WRITE_EVERY_S = 10.0


def _git(*args: str) -> str | None:
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_revision() -> dict[str, Any]:
    """The code's revision: ``FP4SIM_GIT_REVISION`` when set (a copy of the working tree
    without ``.git``, as on the GPU machine, gets it from whoever copied it); else git's HEAD
    only when the package's folder is the top level of its own checkout (a copy inside some
    other repository must not report that repository's revision); else ``unknown``."""
    env = os.environ.get("FP4SIM_GIT_REVISION", "").strip()
    if env:
        return {"git_revision": env, "git_revision_source": "FP4SIM_GIT_REVISION",
                "git_dirty": None}
    root = Path(__file__).resolve().parents[2]
    top = _git("rev-parse", "--show-toplevel")
    if top and Path(top).resolve() == root:
        rev = _git("rev-parse", "HEAD")
        if rev:
            dirty = _git("status", "--porcelain", "--untracked-files=no")
            return {"git_revision": rev, "git_revision_source": "git",
                    "git_dirty": None if dirty is None else bool(dirty)}
    return {"git_revision": "unknown", "git_revision_source": None, "git_dirty": None}


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

    try:
        platform_version = device.client.platform_version
    except Exception:  # noqa: BLE001 - informational only
        platform_version = None
    return {
        **git_revision(),
        "source_sha256": _source_digest(),
        "versions": {"python": sys.version.split()[0],
                     **{n: _version(n) for n in ("fp4sim", "jax", "jaxlib", "numpy", "optax",
                                                 "ml_dtypes", "matplotlib", "tqdm")}},
        "device": {"platform": device.platform, "kind": getattr(device, "device_kind", None),
                   "count": len(jax.devices(device.platform)),
                   "platform_version": platform_version},
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "fp4sim_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("FP4SIM_")},
        "gpu_kernels_module": importlib.util.find_spec("fp4sim.attention.ordered_gpu")
        is not None,
        "jax_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("JAX_")},
        "jax_config": {"jax_enable_x64": bool(jax.config.jax_enable_x64),
                       "jax_default_matmul_precision":
                           str(jax.config.jax_default_matmul_precision)},
        "host": {"node": platform.node(), "platform": platform.platform(),
                 "cpus": os.cpu_count()},
        "argv": list(sys.argv if argv is None else argv),
        "started_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }


def accumulation_of(r: StudyRecipe) -> str:
    """How a recipe's attention products accumulate (the record, table and figure say it)."""
    if r.kind is AttentionKind.JNP_FLOAT32:
        return "XLA dot (float32 operands, Precision.HIGHEST)"
    if r.kind is AttentionKind.JNP_BFLOAT16:
        return "XLA dot (bfloat16 operands, float32 accumulation)"
    assert r.training is not None
    return (f"backward {r.training.accumulation.name}; forward: the emulator's (exact products "
            f"by XLA dot, ordered float32 sums otherwise)")


def _recipe_info(r: StudyRecipe) -> dict[str, Any]:
    from fp4sim.attention import causal as sc

    info: dict[str, Any] = {"label": r.label, "kind": r.kind.name, "tests": r.tests,
                            "definition": repr(r.training) if r.training else r.kind.value,
                            "accumulation": accumulation_of(r)}
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


class _NoBar:
    """Stands in for tqdm where it is not installed (the progress lines still go to ``say``)."""

    total = 0

    def update(self, *_: Any) -> None: ...

    def set_postfix_str(self, *_: Any) -> None: ...

    def refresh(self) -> None: ...

    def close(self) -> None: ...


def _bar(progress: bool, **kw: Any) -> Any:
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    # to a log file (no terminal): a line every 15 s instead of a stream of redraws
    slow = {} if sys.stderr.isatty() else {"mininterval": 15.0}
    return tqdm(disable=not progress, file=sys.stderr, dynamic_ncols=True, **slow, **kw)


def _enable_cache(cache_dir: Path) -> None:
    """jax's persistent compilation cache in ``cache_dir`` (every executable, however quick to
    compile, and XLA's per-fusion autotuning results). jax reads the setting when it first
    compiles, so this is set before the study compiles anything."""
    import jax

    cache_dir.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(cache_dir))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def _cache_entries(cache_dir: Path | None) -> int | None:
    if cache_dir is None or not cache_dir.is_dir():
        return None
    return sum(1 for p in cache_dir.rglob("*") if p.is_file())


def _worker_init() -> None:
    """A tracing worker process lowers for the study's device but computes nothing there.
    Plain jax lowers for ``cuda`` without a device, so the worker keeps jax on its CPU (no
    GPU context per worker); the emulator's Pallas GPU kernels (the module
    ``fp4sim.attention.ordered_gpu``, where present) need the device to lower, so then the
    worker sees it, without preallocating its memory."""
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    if importlib.util.find_spec("fp4sim.attention.ordered_gpu") is None:
        os.environ["JAX_PLATFORMS"] = "cpu"


def _export_job(name: str, cfg: StudyConfig, platform: str, n_tokens: int
                ) -> tuple[str, bytes | None, float, str | None]:
    """In a worker process: recipe ``name``'s chunk traced, lowered for ``platform`` and
    pickled (:meth:`fp4sim.train.loop.Trainer.export`)."""
    t0 = time.perf_counter()
    try:
        recipe = study_recipe(name).with_accumulation(cfg.accumulation)
        blob = _loop.Trainer(recipe=recipe, cfg=cfg).export(platform, n_tokens)
        return name, blob, time.perf_counter() - t0, None
    except Exception as e:  # noqa: BLE001 - the study then traces it in-process
        return name, None, time.perf_counter() - t0, f"{type(e).__name__}: {e}"


def _compile_all(cfg: StudyConfig, device: Any, names: Sequence[str], state_like: Any,
                 n_tokens: int, workers: int, compile_deadline: float,
                 say: Callable[[str], None], processes: bool
                 ) -> tuple[dict[str, _loop.Chunk], dict[str, dict[str, float]],
                            dict[str, str]]:
    """Phase 1: every recipe's chunk traced and compiled by XLA in parallel threads, until
    ``compile_deadline`` (``time.monotonic()``; a recipe not compiled by then is skipped; the
    reference is always waited for). Tracing holds the GIL: with ``processes`` the emulated
    recipes are traced in parallel worker processes (:func:`_export_job`, lowered for the
    study's device, nothing computed there) and only compiled here; a recipe whose export fails, and
    every recipe without ``processes``, is traced here, one at a time in priority order.
    Returns (compiled chunks, seconds per recipe, errors)."""
    import multiprocessing

    tracing = threading.Lock()
    t_start = time.perf_counter()
    t_mono = time.monotonic()
    platform = {"gpu": "cuda"}.get(device.platform, device.platform)

    def job(name: str) -> tuple[str, Any, dict[str, float], str | None]:
        t0 = time.perf_counter()
        secs: dict[str, float] = {}
        try:
            recipe = study_recipe(name).with_accumulation(cfg.accumulation)
            with tracing:
                t1 = time.perf_counter()
                lowered = _loop.Trainer(recipe=recipe, cfg=cfg).lower(device, state_like,
                                                                      n_tokens)
                t2 = time.perf_counter()
            compiled = lowered.compile()  # XLA, outside the GIL: in parallel
            t3 = time.perf_counter()
            secs = {"queued_s": t1 - t0, "trace_lower_s": t2 - t1, "xla_compile_s": t3 - t2,
                    "done_at_s": t3 - t_start}
            return name, _loop.Chunk(compiled, cfg), secs, None
        except Exception as e:  # noqa: BLE001 - recorded, the study goes on without it
            secs["done_at_s"] = time.perf_counter() - t_start
            return name, None, secs, f"{type(e).__name__}: {e}"

    def from_export(name: str, blob: bytes, export_s: float) -> Any:
        t1 = time.perf_counter()
        secs: dict[str, float] = {"export_s": export_s, "exported_at_s": t1 - t_start}
        try:
            # unpickling and lowering the exported module: short, under the GIL
            chunk = _loop.compile_exported(blob, cfg, device, state_like, n_tokens)
            t3 = time.perf_counter()
            secs.update({"trace_lower_s": export_s, "xla_compile_s": t3 - t1,
                         "done_at_s": t3 - t_start})
            return name, chunk, secs, None
        except Exception as e:  # noqa: BLE001 - then traced here
            secs["export_error"] = 1.0
            say(f"exported {name} did not compile here ({type(e).__name__}: {str(e)[:200]}); "
                f"tracing it in-process")
            return job(name)

    chunks: dict[str, _loop.Chunk] = {}
    seconds: dict[str, dict[str, float]] = {}
    errors: dict[str, str] = {}
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers)
    exported = [n for n in names if processes and study_recipe(n).training is not None]
    procs = None
    if exported:
        procs = concurrent.futures.ProcessPoolExecutor(
            max_workers=max(1, min(len(exported), os.cpu_count() or 1)),
            mp_context=multiprocessing.get_context("spawn"), initializer=_worker_init)
    pending = {pool.submit(job, n) for n in names if n not in exported}
    exporting = {procs.submit(_export_job, n, cfg, platform, n_tokens) for n in exported} \
        if procs else set()
    pending |= exporting
    while pending:
        left = compile_deadline - time.monotonic()
        ref_done = REFERENCE in seconds  # the reference is always waited for
        if left <= 0 and ref_done:
            break
        done, pending = concurrent.futures.wait(
            pending, timeout=None if left == math.inf or not ref_done else max(left, 0.0),
            return_when=concurrent.futures.FIRST_COMPLETED)
        for fut in done:
            if fut in exporting:
                name, blob, export_s, error = fut.result()
                if blob is None:
                    say(f"export of {name} failed ({str(error)[:200]}); tracing it in-process")
                    pending.add(pool.submit(job, name))
                else:
                    pending.add(pool.submit(from_export, name, blob, export_s))
                continue
            name, chunk, secs, error = fut.result()
            seconds[name] = {k: round(v, 3) for k, v in secs.items()}
            if error is None:
                chunks[name] = chunk
                how = "traced in a worker process" if "export_s" in secs and \
                    "export_error" not in secs else "trace+lower"
                say(f"compiled {name}: {how} {secs['trace_lower_s']:.1f} s, XLA "
                    f"{secs['xla_compile_s']:.1f} s (done at {secs['done_at_s']:.1f} s)")
            else:
                errors[name] = error
                say(f"FAILED to compile {name}: {error[:300]}")
    # past the compile deadline: queued compilations are cancelled, running ones abandoned
    # (their threads finish in the background; the CLI exits without waiting for them)
    pool.shutdown(wait=False, cancel_futures=True)
    if procs is not None:
        procs.shutdown(wait=False, cancel_futures=True)
    for n in names:
        if n not in chunks and n not in errors:
            errors[n] = (f"its compilation had not finished at the compile deadline "
                         f"({compile_deadline - t_mono:.0f} s after the compilations began)")
            say(f"SKIPPED {n}: {errors[n]}")
    return chunks, seconds, errors


@dataclasses.dataclass
class _Run:
    """One recipe's training in progress."""

    name: str
    chunk: _loop.Chunk
    state: Any
    loss: list = dataclasses.field(default_factory=list)  # (k, seeds) arrays, one per chunk
    grad_norm: list = dataclasses.field(default_factory=list)
    times: list = dataclasses.field(default_factory=list)  # (k, seconds) per chunk

    @property
    def steps(self) -> int:
        return sum(k for k, _ in self.times)

    def step_s(self) -> tuple[float | None, bool]:
        """(seconds per step, whether only the first chunk measured it): the median over the
        chunks after the first (the first includes first-execution work)."""
        later = [t / k for k, t in self.times[1:]]
        if later:
            return statistics.median(later), False
        if self.times:
            k, t = self.times[0]
            return t / k, True
        return None, True

    def advance(self, tokens: Any, k: int) -> float:
        """``k`` steps in one dispatch, synchronized; returns the seeds' mean final loss."""
        t = time.perf_counter()
        self.state, loss, gn = self.chunk.train(self.state, tokens, k)
        loss, gn = np.asarray(loss), np.asarray(gn)  # the chunk's one synchronization
        self.times.append((k, time.perf_counter() - t))
        self.loss.append(loss)
        self.grad_norm.append(gn)
        return float(np.mean(loss[-1]))


def _curves(r: _Run, cfg: StudyConfig) -> dict[str, Any]:
    n = len(cfg.seeds)
    loss = np.concatenate(r.loss) if r.loss else np.zeros((0, n))
    gn = np.concatenate(r.grad_norm) if r.grad_norm else np.zeros((0, n))
    return {"steps": r.steps, "truncated": r.steps < cfg.steps,
            "loss": _f32(loss.T), "grad_norm": _f32(gn.T)}  # (seeds, steps)


def run_study(cfg: StudyConfig, recipe_names: Sequence[str], out_dir: str | Path, *,
              progress: bool = True, argv: Sequence[str] | None = None,
              t0: float | None = None, figure: bool = True, cache: bool = True,
              workers: int | None = None, determinism_recipe: str | None = None,
              compile_share: float | None = None, trace_processes: bool = True,
              say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the study (module docstring) and return its record (also written to
    ``out_dir/train_study.json``, with ``train_loss.png`` and ``train_table.md`` when
    ``figure``). ``t0``: the ``time.monotonic()`` the time budget counts from (default: now);
    ``cache``: jax's persistent compilation cache in ``out_dir/jax_cache``; ``workers``:
    compilation threads (default and at most ``os.cpu_count()``); ``determinism_recipe``: the
    recipe whose first chunk is rerun bit for bit (default: the first emulated one);
    ``compile_share``: the share of the budget the compilations may take (default
    :data:`COMPILE_SHARE`; 0 = wait for every compilation whatever the budget);
    ``trace_processes``: trace the emulated recipes in parallel worker processes (else one
    at a time in this one); ``say``: where progress lines go (default: stderr)."""
    import jax

    t0 = time.monotonic() if t0 is None else t0
    if not isinstance(cfg, StudyConfig):
        raise TypeError(f"cfg={cfg!r} must be a StudyConfig")
    if compile_share is None:
        compile_share = COMPILE_SHARE
    if isinstance(compile_share, bool) or not isinstance(compile_share, (int, float)) or not \
            0.0 <= compile_share <= 1.0:
        raise ValueError(f"compile_share={compile_share!r} must be a number in [0, 1]")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                or workers < 1):
        raise ValueError(f"workers={workers!r} must be a positive int or None")
    try:
        device = jax.devices(cfg.device.value)[0]
    except RuntimeError as e:
        raise ValueError(f"device={cfg.device.value!r}: jax finds no such device here ({e})"
                         ) from e
    if say is None:
        def say(line: str) -> None:
            print(f"[{time.monotonic() - t0:6.1f} s] {line}", file=sys.stderr, flush=True)
    with jax.default_device(device):  # every array of the run on that device
        return _run_study(cfg, recipe_names, Path(out_dir), progress=progress, argv=argv, t0=t0,
                          figure=figure, device=device, cache=cache, workers=workers,
                          determinism_recipe=determinism_recipe, compile_share=compile_share,
                          trace_processes=trace_processes, say=say)


def _run_study(cfg: StudyConfig, recipe_names: Sequence[str], out_dir: Path, *,
               progress: bool, argv: Sequence[str] | None, t0: float, figure: bool,
               device: Any, cache: bool, workers: int | None, determinism_recipe: str | None,
               compile_share: float, trace_processes: bool, say: Callable[[str], None]
               ) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    names = list(dict.fromkeys([REFERENCE, *recipe_names]))
    recipes = {n: study_recipe(n).with_accumulation(cfg.accumulation) for n in names}
    if determinism_recipe is None:
        determinism_recipe = next((n for n in names if recipes[n].training is not None),
                                  REFERENCE)
    elif determinism_recipe not in recipes:
        raise ValueError(f"determinism_recipe={determinism_recipe!r} is not one of the study's "
                         f"recipes {names}")
    budget = cfg.time_budget_s
    deadline = math.inf if budget is None else t0 + budget
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / RECORD_NAME
    cache_dir = out_dir / CACHE_NAME if cache else None
    if cache_dir is not None:
        _enable_cache(cache_dir)
    cache_before = _cache_entries(cache_dir)

    raw = _data.corpus_bytes()
    train_np, val_np = _data.split_tokens(raw)
    xv, yv = _data.validation_windows(val_np, cfg.eval_batches * cfg.batch, cfg.model.context)
    shape3 = (cfg.eval_batches, cfg.batch, cfg.model.context)
    n_seeds = len(cfg.seeds)
    tokens = jnp.asarray(train_np)
    xv, yv = jnp.asarray(xv.reshape(shape3)), jnp.asarray(yv.reshape(shape3))
    x_leak = jnp.broadcast_to(xv[0], (n_seeds,) + xv.shape[1:])
    y_leak = jnp.broadcast_to(yv[0], (n_seeds,) + yv.shape[1:])
    state0 = _loop.init_state(cfg, device)
    state_like = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), state0)

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

    # 1. compile everything first
    n_workers = max(1, min(len(names), os.cpu_count() or 1, workers or len(names)))
    say(f"compiling {len(names)} recipes with {n_workers} threads (cache: "
        f"{cache_dir if cache_dir else 'off'}, {cache_before} entries)")
    t_compile = time.perf_counter()
    compile_deadline = math.inf if budget is None or not compile_share else \
        t0 + compile_share * budget
    chunks, seconds, errors = _compile_all(cfg, device, names, state_like, len(train_np),
                                           n_workers, compile_deadline, say, trace_processes)
    compile_wall = time.perf_counter() - t_compile
    record["timing"]["compile"] = {
        "per_recipe": seconds, "wall_s": round(compile_wall, 3), "workers": n_workers,
        "cache_dir": str(cache_dir) if cache_dir else None, "cache_entries_before": cache_before,
        "cache_entries_after": _cache_entries(cache_dir),
        "trace_processes": trace_processes,
        "deadline_s": None if compile_deadline == math.inf else round(compile_share * budget, 3),
        "unfinished": sorted(n for n in names if n not in chunks and n not in seconds)}
    say(f"compilation done in {compile_wall:.1f} s ({len(chunks)} of {len(names)} recipes)")
    if REFERENCE not in chunks:
        raise RuntimeError(f"the {REFERENCE} step did not compile: {errors.get(REFERENCE)}")
    for n, e in errors.items():
        record["recipes"][n]["skipped"] = e if "deadline" in e else f"compilation failed: {e}"
    runs = {n: _Run(name=n, chunk=chunks[n], state=state0) for n in names if n in chunks}
    record["status"] = "training"
    _write(record, path)

    # 2. train in rounds; the common target shrinks to what the budget allows
    per_check = 4 + 2 * cfg.eval_batches  # probe steps of a recipe's checks (+ float32 eval)

    def reserve(est: dict[str, float]) -> float:
        checks = sum(per_check * est[n] + cfg.eval_batches * est[REFERENCE] + 1.0 for n in runs)
        return checks + cfg.chunk * est[determinism_recipe if determinism_recipe in est
                                        else REFERENCE] + _FIGURE_RESERVE_S

    goal = cfg.steps
    bar = _bar(progress, total=goal * len(runs), desc="train", unit="step")
    last_write = time.monotonic()
    rounds = 0
    while True:
        todo = [r for r in runs.values() if r.steps < goal]
        if not todo:
            break
        for r in todo:
            k = min(cfg.chunk, goal - r.steps)
            try:
                loss = r.advance(tokens, k)
            except Exception as e:  # noqa: BLE001 - e.g. out of memory: recorded, the rest goes on
                if r.name == REFERENCE:
                    raise
                record["recipes"][r.name]["skipped"] = f"failed in training at step " \
                    f"{r.steps}: {type(e).__name__}: {str(e)[:500]}"
                say(f"FAILED {r.name}: {record['recipes'][r.name]['skipped']}")
                del runs[r.name]
                continue
            bar.update(k)
            bar.set_postfix_str(f"{r.name[:28]} {r.steps}/{goal} loss {loss:.3f}")
        rounds += 1
        if rounds == 1:
            say("first chunk: " + ", ".join(f"{n} {r.times[0][1]:.2f} s" for n, r in
                                            runs.items()))
        if budget is not None:
            # re-planned every round from the latest estimates (the first round's include
            # first-execution work, so the target may grow again); all recipes advance in
            # lockstep, so any target ≥ what is done keeps them equal
            est = {n: r.step_s()[0] or 0.0 for n, r in runs.items()}
            done = min(r.steps for r in runs.values())
            left = deadline - time.monotonic() - reserve(est)
            per_step = sum(est.values())
            more = int(left / per_step) if per_step > 0 and left > 0 else 0
            new_goal = max(done, min(cfg.steps, done + (more // cfg.chunk) * cfg.chunk))
            if new_goal != goal:
                goal = new_goal
                bar.total = goal * len(runs)
                bar.refresh()
        if time.monotonic() - last_write > _WRITE_EVERY_S:  # a checkpoint of the curves
            for n, r in runs.items():
                record["recipes"][n].update(_curves(r, cfg))
            _write(record, path)
            last_write = time.monotonic()
    bar.close()
    common = min(r.steps for r in runs.values())
    say(f"trained {common} steps per recipe in {rounds} rounds (planned at most {cfg.steps})")

    # 3. timing (measured in turn during the rounds)
    step_s = {n: r.step_s() for n, r in runs.items()}
    ref_s = step_s[REFERENCE][0]
    record["timing"].update({
        "step_s": {n: round(v, 6) for n, (v, _) in step_s.items() if v is not None},
        "steps_per_s": {n: round(1.0 / v, 3) for n, (v, _) in step_s.items() if v},
        "ratio_to_jnp_float32": {n: round(v / ref_s, 3) for n, (v, _) in step_s.items()
                                 if v is not None} if ref_s else {},
        "from_first_chunk_only": sorted(n for n, (_, first) in step_s.items() if first),
        "timed_chunks_per_recipe": {n: max(0, len(r.times) - 1) for n, r in runs.items()},
        "jnp_float32_model_tflops": round(record["model"]["train_flops_per_step_per_seed"]
                                          * n_seeds / ref_s / 1e12, 4) if ref_s else None,
        "note": "median seconds per training step (all seeds at once) over each recipe's "
                "chunks after its first, every chunk timed between two synchronizations, the "
                "recipes in turn in the same process after every compilation finished",
    })
    for n, (v, _) in step_s.items():
        if v:
            ratio = f", {v / ref_s:.2f}x {REFERENCE}" if ref_s else ""
            say(f"{n}: {1.0 / v:.2f} steps/s ({1e3 * v:.1f} ms per step of {n_seeds} "
                f"seeds{ratio})")
    record["budget"] = {"time_budget_s": budget, "planned_steps": cfg.steps,
                        "steps": common, "limited_by_budget": common < cfg.steps,
                        "training_ended_at_s": round(time.monotonic() - t0, 3)}
    record["status"] = "checking"
    _write(record, path)

    # 4. per recipe: checks, then the record again
    f32_chunk = runs[REFERENCE].chunk
    for n, r in runs.items():
        record["recipes"][n].update(_curves(r, cfg))
        record["recipes"][n].update(_finish(r, cfg, state0, tokens, xv, yv, x_leak, y_leak,
                                            f32_chunk, recipes[n],
                                            rerun=n == determinism_recipe))
        _write(record, path)
    det = record["recipes"].get(determinism_recipe, {}).get("determinism")
    record["determinism"] = {"recipe": determinism_recipe, **(det or {})}
    if det:
        say(f"determinism ({determinism_recipe}, first {det['steps']} steps rerun): "
            f"{'bitwise identical' if det['bitwise_equal'] else 'DIFFERENT'}")

    record["status"] = "complete"
    record["wall_s"] = round(time.monotonic() - t0, 3)
    record["budget"]["over_budget"] = budget is not None and record["wall_s"] > budget
    record["provenance"]["finished_utc"] = _dt.datetime.now(_dt.UTC).isoformat(
        timespec="seconds")
    _write(record, path)
    if figure:
        _report.regenerate(path, out_dir)
    return record


def _finish(r: _Run, cfg: StudyConfig, state0: Any, tokens: Any, xv: Any, yv: Any,
            x_leak: Any, y_leak: Any, f32_chunk: _loop.Chunk, recipe: StudyRecipe, *,
            rerun: bool) -> dict[str, Any]:
    """The per-recipe results and checks after training (module docstring, phase 4)."""
    res: dict[str, Any] = {}
    res["leak_init"] = _loop.leak_check(r.chunk, state0, tokens, cfg, x_leak, y_leak)
    res["leak_final"] = _loop.leak_check(r.chunk, r.state, tokens, cfg, x_leak, y_leak)
    res["val_loss_own"] = _loop.evaluate(r.chunk, r.state, tokens, xv, yv)
    res["val_loss_float32"] = _loop.evaluate(f32_chunk, r.state, tokens, xv, yv)
    if rerun and r.loss:
        # determinism: the first chunk again from the initial state, bit for bit
        k = r.times[0][0]
        _, again, _ = r.chunk.train(state0, tokens, k)
        again = np.asarray(again)
        res["determinism"] = {"steps": k, "bitwise_equal": bool(
            np.array_equal(again.view(np.uint32), np.asarray(r.loss[0]).view(np.uint32)))}
    if recipe.training is not None:
        from fp4sim.attention.leak import leak_probe

        p = leak_probe(recipe.training)
        res["operator_probe"] = {"leak_o": p.leak_o, "leak_dq": p.leak_dq,
                                 "bitwise_o": p.bitwise_o, "bitwise_dq": p.bitwise_dq,
                                 "vacuous": p.vacuous, "n_tokens": 128, "gain": p.gain}
    return res

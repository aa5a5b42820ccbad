"""The training study's machinery on a tiny model (CPU, seconds): configs, data, the model's
causality, the leak check (which must catch a deliberately non-causal attention), bitwise
determinism, the CLI smoke run, its JSON record and the figure/table regenerated from it.

These check the machinery, not the findings (those need the study's sizes: README)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

optax = pytest.importorskip("optax", reason="optax (the train / dev extra) is not installed")

from fp4sim.train import config as C  # noqa: E402
from fp4sim.train import data as D  # noqa: E402
from fp4sim.train import recipes as R  # noqa: E402
from fp4sim.train import report as REP  # noqa: E402

TINY = C.StudyConfig(model=C.ModelConfig(layers=1, width=64, heads=2, context=64), batch=2,
                     seeds=(0, 1), steps=4, chunk=2, eval_batches=1,
                     optim=C.OptimConfig(warmup_steps=2))


# --- configs, recipes, data ---------------------------------------------------------------
@pytest.mark.parametrize("kw, needle", [
    ({"width": 96, "heads": 2}, "multiple of 32"),
    ({"width": 64, "heads": 3}, "multiple of heads"),
    ({"context": 40}, "context=40"),
    ({"layers": 0}, "layers=0"),
])
def test_model_config_rejects_bad_shapes(kw, needle):
    with pytest.raises(ValueError, match=needle):
        C.ModelConfig(**kw)


@pytest.mark.parametrize("kw, needle", [
    ({"steps": 5, "chunk": 2}, "multiple of chunk"),
    ({"seeds": (1, 1)}, "repeat"),
    ({"seeds": ()}, "non-empty"),
    ({"time_budget_s": -1.0}, "time_budget_s"),
    ({"leak_target": 0}, "leak_target"),
])
def test_study_config_rejects_bad_values(kw, needle):
    with pytest.raises(ValueError, match=needle):
        TINY.replace(**kw)


def test_recipes_registry():
    assert set(R.DEFAULT_STUDY) <= set(R.STUDY_RECIPES)
    assert set(R.SMOKE_STUDY) <= set(R.STUDY_RECIPES)
    with pytest.raises(ValueError, match="nope"):
        R.study_recipe("nope")
    for r in R.STUDY_RECIPES.values():
        assert (r.training is None) == (r.kind is not R.AttentionKind.EMULATED)
        if r.training is not None:
            assert r.training.name == r.name
    from fp4sim.attention.causal import LeakClass, leak_class

    assert leak_class(R.study_recipe("flamia_mxfp8_v_floor_unsafe").training.v) is \
        LeakClass.LARGE
    assert leak_class(R.study_recipe("flamia_mxfp8_training").training.v) is LeakClass.SUBNORMAL
    from fp4sim.attention.backward import BackwardAccumulation as BA

    seq = R.study_recipe("direct_p_fp8_training").with_accumulation(BA.SEQUENTIAL)
    assert seq.training.accumulation is BA.SEQUENTIAL


def test_corpus_and_windows():
    raw = D.corpus_bytes()
    assert len(raw) > 100_000  # CPython's bundled reference documentation
    train, val = D.split_tokens(raw)
    assert len(train) + len(val) == len(raw) and train.dtype == np.int32
    assert 0 <= train.min() and train.max() < 256
    assert abs(len(val) / len(raw) - D.VALIDATION_FRACTION) < 1e-3
    info = D.corpus_info(raw)
    assert info["n_bytes"] == len(raw) and len(info["sha256"]) == 64
    x, y = D.validation_windows(val, 3, 64)
    assert x.shape == y.shape == (3, 64) and np.array_equal(x[:, 1:], y[:, :-1])

    import jax

    xs, ys = D.sample_windows(jax.random.PRNGKey(0), jax.numpy.asarray(train), 4, 32)
    assert xs.shape == (4, 32) and np.array_equal(np.asarray(xs)[:, 1:], np.asarray(ys)[:, :-1])


# --- the model and the leak check ---------------------------------------------------------
@pytest.fixture(scope="module")
def cpu():
    import jax

    return jax.devices("cpu")[0]


def _tokens():
    import jax.numpy as jnp

    return jnp.asarray(D.split_tokens()[0])


def _compiled(recipe_name: str, cpu, attn=None, cfg=TINY):
    import jax

    from fp4sim.train import loop

    state0 = loop.init_state(cfg, cpu)
    t = loop.Trainer(recipe=R.study_recipe(recipe_name), cfg=cfg)
    if attn is not None:  # a replacement attention, for a deliberately broken model
        object.__setattr__(t, "_attn", attn)
    like = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), state0)
    return t.compile(cpu, like, len(D.split_tokens()[0])), state0


@pytest.fixture(scope="module")
def f32_chunk(cpu):
    return _compiled("jnp_float32", cpu)


def _leak_batch():
    import jax.numpy as jnp

    _, val = D.split_tokens()
    x, y = D.validation_windows(val, TINY.batch, TINY.model.context)
    n = len(TINY.seeds)
    return (jnp.broadcast_to(jnp.asarray(x), (n,) + x.shape),
            jnp.broadcast_to(jnp.asarray(y), (n,) + y.shape))


def test_leak_check_passes_causal_attention(f32_chunk):
    from fp4sim.train import loop

    chunk, state0 = f32_chunk
    x, y = _leak_batch()
    res = loop.leak_check(chunk, state0, _tokens(), TINY, x, y)
    assert res["future_changed"] == [True, True]  # the perturbation reached the future
    assert res["loss_equal"] == [True, True] and res["grad_equal"] == [True, True]
    assert res["loss_rel"] == [0.0, 0.0]


def test_leak_check_catches_a_non_causal_attention(cpu):
    """Broken on purpose: attention without its mask sees the future; the check must say so."""
    import jax
    import jax.numpy as jnp

    from fp4sim.train import loop

    def leaky(q, k, v):
        s = jnp.einsum("...nd,...md->...nm", q, k) / jnp.sqrt(q.shape[-1])
        return jnp.einsum("...nm,...md->...nd", jax.nn.softmax(s, axis=-1), v)

    chunk, state0 = _compiled("jnp_float32", cpu, attn=leaky)
    x, y = _leak_batch()
    res = loop.leak_check(chunk, state0, _tokens(), TINY, x, y)
    assert res["loss_equal"] == [False, False] and res["grad_equal"] == [False, False]
    assert min(res["loss_rel"]) > 1e-6


def test_perturb_future_changes_every_future_token_only():
    import jax
    import jax.numpy as jnp

    from fp4sim.train.loop import perturb_future

    x = jnp.asarray(np.random.default_rng(0).integers(0, 256, (3, 64)), jnp.int32)
    xp = np.asarray(perturb_future(x, 40, 256, jax.random.PRNGKey(1)))
    x = np.asarray(x)
    assert np.array_equal(xp[:, :40], x[:, :40]) and np.all(xp[:, 40:] != x[:, 40:])
    assert xp.min() >= 0 and xp.max() < 256


def test_same_seed_twice_gives_bitwise_identical_loss_curves(cpu, f32_chunk):
    """Two separately compiled chunks of the same recipe, from the same seeds: the same bits;
    and a chunk cut short (``k`` < chunk: the skipped iterations) continues exactly where a
    full chunk would (two 1-step calls = one 2-step call, bit for bit)."""
    tokens = _tokens()
    curves = []
    for chunk, state in (f32_chunk, _compiled("jnp_float32", cpu)):
        state, l1, _ = chunk.train(state, tokens, 2)
        state, l2, _ = chunk.train(state, tokens, 1)
        curves.append(np.concatenate([np.asarray(l1), np.asarray(l2)]))
        assert np.asarray(state["step"]).tolist() == [3, 3]
    assert curves[0].shape == (3, 2)
    assert not np.array_equal(curves[0][:, 0], curves[0][:, 1])  # the seeds differ
    assert np.array_equal(curves[0].view(np.uint32), curves[1].view(np.uint32))
    chunk, state = f32_chunk
    state, a, _ = chunk.train(state, tokens, 1)
    state, b, _ = chunk.train(state, tokens, 1)
    ab = np.concatenate([np.asarray(a), np.asarray(b)])
    assert np.array_equal(ab.view(np.uint32), curves[0][:2].view(np.uint32))
    with pytest.raises(ValueError, match="k=3"):
        chunk.train(state, tokens, 3)


def test_probe_leaves_the_state_unchanged(f32_chunk):
    import jax
    import jax.numpy as jnp

    chunk, state0 = f32_chunk
    x, y = _leak_batch()
    w = jnp.ones(x.shape[1:], jnp.float32)
    new, out = chunk.compiled(state0, _tokens(), jnp.asarray(1, jnp.int32), jnp.asarray(True),
                              x, y, w)
    same = jax.tree_util.tree_map(lambda a, b: bool(jnp.array_equal(a, b)), new, state0)
    assert all(jax.tree_util.tree_leaves(same))
    assert np.all(np.isfinite(np.asarray(out["loss"][0])))
    assert np.all(np.isnan(np.asarray(out["loss"][1:])))  # the skipped iteration
    p = chunk.probe(state0, _tokens(), x, y, w)
    assert p["losses"].shape == x.shape and np.all(np.asarray(p["losses"]) > 0)


# --- divergence rule ------------------------------------------------------------------------
def test_divergence_step():
    flat = np.full(100, 2.0)
    assert REP.divergence_step(flat, 1.0, 10) is None
    nan = flat.copy()
    nan[37] = np.nan
    assert REP.divergence_step(nan, 1.0, 10) == 37
    up = np.concatenate([np.linspace(5, 2, 50), np.full(50, 4.0)])
    d = REP.divergence_step(up, 1.0, 5)
    assert d is not None and 50 <= d <= 55


# --- the smoke run end to end ---------------------------------------------------------------
@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("train")
    cmd = [sys.executable, "-m", "fp4sim", "train", "--size", "smoke", "--no-progress",
           "--out", str(out)] + [a for n in R.SMOKE_STUDY for a in ("--recipe", n)]
    env = dict(os.environ, FP4SIM_GIT_REVISION="0123abc")
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env,
                         cwd=Path(__file__).resolve().parents[2])
    assert res.returncode == 0, res.stderr[-3000:]
    return out, json.loads((out / "train_study.json").read_text()), res.stdout


def test_smoke_run_record(smoke):
    out, rec, stdout = smoke
    assert rec["schema"] == "fp4sim.train.study/2" and rec["status"] == "complete"
    prov = rec["provenance"]
    for key in ("git_revision", "source_sha256", "versions", "device", "xla_flags", "argv"):
        assert key in prov
    assert prov["git_revision"] == "0123abc"  # FP4SIM_GIT_REVISION wins over git
    assert prov["git_revision_source"] == "FP4SIM_GIT_REVISION"
    assert prov["versions"]["jax"] and prov["versions"]["optax"]
    assert prov["device"]["platform"] == "cpu"
    assert rec["config"]["model"]["width"] == C.SIZES["smoke"].model.width
    assert rec["accumulation"] == "BACKEND"
    for n in R.SMOKE_STUDY:
        r = rec["recipes"][n]
        assert "skipped" not in r
        assert len(r["loss"]) == len(rec["config"]["seeds"])
        assert r["steps"] == rec["config"]["steps"] == len(r["loss"][0])
        assert all(r["leak_final"]["loss_equal"]) and all(r["leak_final"]["grad_equal"])
        assert all(r["leak_final"]["future_changed"])
        assert np.all(np.isfinite(r["val_loss_own"]))
    emu = rec["recipes"]["direct_p_fp8_training"]
    assert emu["determinism"]["bitwise_equal"] is True and "determinism" not in \
        rec["recipes"]["jnp_float32"]
    assert rec["determinism"]["recipe"] == "direct_p_fp8_training"
    assert emu["accumulation"].startswith("backward BACKEND")
    comp = rec["timing"]["compile"]
    assert set(comp["per_recipe"]) == set(R.SMOKE_STUDY) and comp["cache_entries_after"] > 0
    for secs in comp["per_recipe"].values():
        assert secs["trace_lower_s"] > 0 and secs["xla_compile_s"] > 0
    assert "export_s" in comp["per_recipe"]["direct_p_fp8_training"]  # traced in a worker
    assert comp["trace_processes"] is True
    assert "steps/s" in stdout and "XLA" in stdout
    assert "definition" in emu and "TrainingRecipe" in emu["definition"]
    assert emu["operator_probe"]["leak_o"] == 0.0  # token-block ceil V: bitwise causal O
    assert set(rec["timing"]["ratio_to_jnp_float32"]) >= set(R.SMOKE_STUDY)
    assert "train_study.json" in stdout
    assert (out / "train_loss.png").stat().st_size > 10_000


def test_figure_and_table_regenerate_from_the_record(smoke, tmp_path):
    out, rec, _ = smoke
    res = subprocess.run([sys.executable, "-m", "fp4sim", "train", "--replot",
                          str(out / "train_study.json"), "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).resolve().parents[2])
    assert res.returncode == 0, res.stderr[-2000:]
    assert (tmp_path / "train_table.md").read_text() == (out / "train_table.md").read_text()
    assert (tmp_path / "train_loss.png").stat().st_size > 10_000
    table = (out / "train_table.md").read_text()
    for n in R.SMOKE_STUDY:
        assert f"| {n} |" in table
    assert "BACKEND" in table


def test_cli_errors_name_the_problem(capsys):
    from fp4sim import __main__ as cli

    assert cli.main(["train", "--recipe", "nope", "--size", "smoke"]) == 2
    assert "nope" in capsys.readouterr().err
    assert cli.main(["train", "--study", "--size", "huge"]) == 2
    assert "huge" in capsys.readouterr().err
    assert cli.main(["train", "--replot", "/nonexistent/train_study.json"]) == 2
    assert cli.main(["train"]) == 2
    assert "--study" in capsys.readouterr().err
    assert cli.main(["train", "--study", "--size", "smoke", "--determinism-recipe", "x"]) == 2


def test_train_is_an_application_layer():
    """fp4sim.attention/formats/kernels never import fp4sim.train; train never imports kernels."""
    root = Path(__file__).resolve().parents[2] / "fp4sim"
    train = re.compile(r"fp4sim\.train\b")  # the package, not e.g. fp4sim.training_forward
    for sub in ("attention", "formats", "kernels", "_xp.py"):
        for p in ([root / sub] if sub.endswith(".py") else sorted((root / sub).rglob("*.py"))):
            assert not train.search(p.read_text()), p
    for p in sorted((root / "train").rglob("*.py")):
        assert "fp4sim.kernels" not in p.read_text(), p


def test_a_budget_too_small_still_trains_every_recipe_the_same_steps(tmp_path):
    """The compilations alone overrun a 1 ms budget: every recipe still gets one chunk (the
    same for all), and the record says the run was cut by the budget and overran it."""
    from fp4sim.train.study import run_study

    cfg = TINY.replace(time_budget_s=0.001, steps=6)
    lines: list[str] = []
    rec = run_study(cfg, ["jnp_bfloat16"], tmp_path, progress=False, figure=False, cache=False,
                    compile_share=0, say=lines.append)  # 0: wait for every compilation
    steps = {n: r["steps"] for n, r in rec["recipes"].items()}
    assert steps == {"jnp_float32": TINY.chunk, "jnp_bfloat16": TINY.chunk}
    assert rec["budget"]["limited_by_budget"] and rec["budget"]["over_budget"]
    assert rec["determinism"]["recipe"] == "jnp_float32"  # no emulated recipe: the reference
    assert rec["determinism"]["bitwise_equal"] is True
    assert any(line.startswith("compiled jnp_bfloat16") for line in lines)
    assert rec["timing"]["compile"]["cache_dir"] is None
    with pytest.raises(ValueError, match="compile_share"):
        run_study(cfg, [], tmp_path, compile_share=2.0)


def test_git_revision_comes_from_the_environment_first(monkeypatch):
    from fp4sim.train.study import git_revision

    monkeypatch.setenv("FP4SIM_GIT_REVISION", "feedbeef")
    assert git_revision()["git_revision"] == "feedbeef"
    monkeypatch.delenv("FP4SIM_GIT_REVISION")
    rev = git_revision()
    assert rev["git_revision"] == "unknown" or (rev["git_revision_source"] == "git"
                                                and len(rev["git_revision"]) == 40)


def test_loss_scale_is_exact_for_float32(cpu):
    """A power-of-two loss scale commutes with float32 rounding: the jnp float32 model's loss
    curve is the same bits with and without it; a scale that is not a power of two is refused."""
    tokens = _tokens()
    curves = []
    for scale in (1.0, 4096.0):
        cfg = TINY.replace(optim=C.OptimConfig(warmup_steps=2, loss_scale=scale))
        chunk, state = _compiled("jnp_float32", cpu, cfg=cfg)
        state, loss, _ = chunk.train(state, tokens, 2)
        state, loss2, _ = chunk.train(state, tokens, 2)
        curves.append(np.concatenate([np.asarray(loss), np.asarray(loss2)]))
    assert np.array_equal(curves[0].view(np.uint32), curves[1].view(np.uint32))
    with pytest.raises(ValueError, match="power of two"):
        C.OptimConfig(loss_scale=1000.0)


def _synthetic_record(gap: float) -> dict:
    rng = np.random.default_rng(0)
    base = [list(3.0 - np.linspace(0, 1, 60) + 0.01 * rng.standard_normal(60)) for _ in range(3)]
    worse = [list(np.asarray(b) + gap + 0.001 * rng.standard_normal(60)) for b in base]
    rec = {"timing": {}, "recipe_order": ["jnp_float32", "direct_p_fp8_training"],
           "config": {"model": {"layers": 1, "width": 64, "heads": 2, "context": 64},
                      "batch": 2, "seeds": [0, 1, 2], "steps": 60, "smooth": 5,
                      "divergence_margin": 1.0, "optim": {"loss_scale": 4096.0}},
           "recipes": {}}
    for n, curves in (("jnp_float32", base), ("direct_p_fp8_training", worse)):
        rec["recipes"][n] = {"loss": curves, "grad_norm": [[1.0] * 60] * 3, "steps": 60,
                             "val_loss_own": [c[-1] for c in curves],
                             "val_loss_float32": [c[-1] for c in curves]}
    return rec


def test_a_route_that_trains_but_ends_far_worse_does_not_reproduce_close():
    """The first H200 run's table said "reproduced (worse by +0.27)": a gap beyond 3 standard
    errors and CLOSE_NATS is 'not reproduced at this scale'; a gap of ~0 is reproduced."""
    far = REP.table_markdown(_synthetic_record(0.27))
    assert "not reproduced at this scale: it trains (no divergence) but ends worse" in far
    near = REP.table_markdown(_synthetic_record(0.0))
    assert "reproduced (no difference beyond 3 standard errors)" in near
    assert "loss scale 4096" in near


def test_an_exported_chunk_gives_the_same_bits_as_the_direct_compile(cpu, f32_chunk):
    """The study traces emulated recipes in worker processes (jax.export, pickled) and
    compiles them here: the same module, so the same loss curve bit for bit."""
    import jax

    from fp4sim.train import loop

    tokens = _tokens()
    chunk, state0 = f32_chunk
    like = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), state0)
    blob = loop.Trainer(recipe=R.study_recipe("jnp_float32"), cfg=TINY).export("cpu",
                                                                                len(tokens))
    exported = loop.compile_exported(blob, TINY, cpu, like, len(tokens))
    _, a, ga = chunk.train(state0, tokens, 2)
    _, b, gb = exported.train(state0, tokens, 2)
    assert np.array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))
    assert np.array_equal(np.asarray(ga).view(np.uint32), np.asarray(gb).view(np.uint32))

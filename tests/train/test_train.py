"""The training study's machinery on a tiny model (CPU, seconds): configs, data, the model's
causality, the leak check (which must catch a deliberately non-causal attention), bitwise
determinism, the CLI smoke run, its JSON record and the figure/table regenerated from it.

These check the machinery, not the findings (those need the study's sizes: README)."""

from __future__ import annotations

import json
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


def _compiled(recipe_name: str, cpu, attn=None):
    import jax
    import jax.numpy as jnp

    from fp4sim.train import loop

    state0 = loop.init_state(TINY, cpu)
    t = loop.Trainer(recipe=R.study_recipe(recipe_name), cfg=TINY)
    if attn is not None:  # a replacement attention, for a deliberately broken model
        object.__setattr__(t, "_attn", attn)
    like = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), state0)
    batch = jax.ShapeDtypeStruct((len(TINY.seeds), TINY.batch, TINY.model.context), jnp.int32)
    return t.compile(cpu, like, batch), state0


@pytest.fixture(scope="module")
def f32_step(cpu):
    return _compiled("jnp_float32", cpu)


def _leak_batch():
    import jax.numpy as jnp

    _, val = D.split_tokens()
    x, y = D.validation_windows(val, TINY.batch, TINY.model.context)
    n = len(TINY.seeds)
    return (jnp.broadcast_to(jnp.asarray(x), (n,) + x.shape),
            jnp.broadcast_to(jnp.asarray(y), (n,) + y.shape))


def test_leak_check_passes_causal_attention(f32_step):
    from fp4sim.train import loop

    step, state0 = f32_step
    x, y = _leak_batch()
    res = loop.leak_check(step, state0, TINY, x, y)
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

    step, state0 = _compiled("jnp_float32", cpu, attn=leaky)
    x, y = _leak_batch()
    res = loop.leak_check(step, state0, TINY, x, y)
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


def test_same_seed_twice_gives_bitwise_identical_loss_curves(cpu, f32_step):
    """Two separately compiled steps of the same recipe, from the same seeds: the same bits."""
    import jax.numpy as jnp

    from fp4sim.train import loop

    tokens = jnp.asarray(D.split_tokens()[0])
    sampler = loop.batch_sampler(TINY, cpu)
    w = jnp.ones((TINY.batch, TINY.model.context), jnp.float32)
    curves = []
    for step, state in (f32_step, _compiled("jnp_float32", cpu)):
        losses = []
        for i in range(3):
            x, y = sampler(state["key"], jnp.asarray(i, jnp.int32), tokens)
            state, out = step(state, x, y, w, jnp.asarray(True))
            losses.append(np.asarray(out["loss"]))
        curves.append(np.stack(losses))
    assert curves[0].shape == (3, 2)
    assert not np.array_equal(curves[0][:, 0], curves[0][:, 1])  # the seeds differ
    assert np.array_equal(curves[0].view(np.uint32), curves[1].view(np.uint32))


def test_apply_false_leaves_the_state_unchanged(f32_step):
    import jax
    import jax.numpy as jnp

    step, state0 = f32_step
    x, y = _leak_batch()
    w = jnp.ones(x.shape[1:], jnp.float32)
    new, out = step(state0, x, y, w, jnp.asarray(False))
    same = jax.tree_util.tree_map(lambda a, b: bool(jnp.array_equal(a, b)), new, state0)
    assert all(jax.tree_util.tree_leaves(same))
    assert np.all(np.isfinite(np.asarray(out["loss"])))


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
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                         cwd=Path(__file__).resolve().parents[2])
    assert res.returncode == 0, res.stderr[-3000:]
    return out, json.loads((out / "train_study.json").read_text()), res.stdout


def test_smoke_run_record(smoke):
    out, rec, stdout = smoke
    assert rec["schema"] == "fp4sim.train.study/1" and rec["status"] == "complete"
    prov = rec["provenance"]
    for key in ("git_revision", "source_sha256", "versions", "device", "xla_flags", "argv"):
        assert key in prov
    assert prov["versions"]["jax"] and prov["versions"]["optax"]
    assert prov["device"]["platform"] == "cpu"
    assert rec["config"]["model"]["width"] == C.SIZES["smoke"].model.width
    assert rec["accumulation"] == "BACKEND"
    for n in R.SMOKE_STUDY:
        r = rec["recipes"][n]
        assert "skipped" not in r
        assert len(r["loss"]) == len(rec["config"]["seeds"]) and r["steps"] >= 1
        assert r["determinism"]["bitwise_equal"] is True
        assert all(r["leak_final"]["loss_equal"]) and all(r["leak_final"]["grad_equal"])
        assert all(r["leak_final"]["future_changed"])
        assert np.all(np.isfinite(r["val_loss_own"]))
    emu = rec["recipes"]["direct_p_fp8_training"]
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
    with pytest.raises(SystemExit) as e:
        cli.main(["train"])
    assert e.value.code == 2


def test_train_is_an_application_layer():
    """fp4sim.attention/formats/kernels never import fp4sim.train; train never imports kernels."""
    root = Path(__file__).resolve().parents[2] / "fp4sim"
    for sub in ("attention", "formats", "kernels", "_xp.py"):
        for p in ([root / sub] if sub.endswith(".py") else sorted((root / sub).rglob("*.py"))):
            assert "fp4sim.train" not in p.read_text(), p
    for p in sorted((root / "train").rglob("*.py")):
        assert "fp4sim.kernels" not in p.read_text(), p

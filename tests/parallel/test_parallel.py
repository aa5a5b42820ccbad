"""fp4sim.parallel: sharded emulation and device-mapped sweeps, bit-identical to one device.

The sharded checks need several devices; the CPU gives them with
``XLA_FLAGS=--xla_force_host_platform_device_count=8``, which must be set before jax starts, so
they run in a subprocess (``sharded_checks.py``) and these tests read its JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fp4sim.parallel import (
    DeviceSpec,
    attention_mesh,
    map_cases,
    parse_devices,
    resolve_devices,
    sharded_attention_forward,
)

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def checks() -> dict:
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
               JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE.parents[1]), env.get("PYTHONPATH"))
                                        if p)
    r = subprocess.run([sys.executable, str(HERE / "sharded_checks.py")], env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout)


def test_eight_devices(checks):
    assert checks["devices"] == 8


def test_sharded_forward_is_bit_identical(checks):
    assert len(checks["forward"]) == 6  # 3 recipes x (causal 2x2x2, non-causal 1x1x8)
    bad = {case: r for case, r in checks["forward"].items() if not all(r.values())}
    assert not bad, bad


def test_sharded_training_gradients_are_bit_identical(checks):
    assert set(checks["training"]) == {"direct_p_fp8_training", "flamia_mxfp8_training"}
    bad = {case: r for case, r in checks["training"].items() if not all(r.values())}
    assert not bad, bad


def test_sweep_over_devices_equals_sequential(checks):
    s = checks["sweep"]
    assert s["equal"]
    assert s["devices_used"] > 1 and s["sequential_devices"] == 1


def test_report_sweep_over_devices_equals_numpy(checks):
    assert checks["report_sweep"] == {"equal": True, "rows": 2}


@pytest.mark.parametrize("recipe", ["jnp_float32", "direct_p_fp8_training"])
def test_data_parallel_steps_equal_one_device_accumulation(checks, recipe):
    """The study's transformer (float32 attention, and the emulated FP8 training route): three
    Adam steps on 8 devices with the ordered shard sum give the bits of one device accumulating
    8 micro-batches (losses, every step's gradients, the final parameters)."""
    assert checks["data_parallel"][recipe] == {
        "losses_equal": True, "grads_equal": True, "params_equal": True, "loss_finite": True,
        "first_grad_max_rel": 0.0}


def test_bad_placements_are_named(checks):
    e = checks["errors"]
    assert "along heads" in e["heads_not_divisible"]
    assert "query rows" in e["query_not_divisible"]
    assert "must equal the number of devices" in e["product_mismatch"]


# --- in-process (one device) -------------------------------------------------------------------

def test_map_cases_sequential_keeps_order_and_counts_progress():
    seen = []
    assert map_cases(lambda c: c * c, [3, 1, 2], progress=lambda: seen.append(1)) == [9, 1, 4]
    assert len(seen) == 3


def test_map_cases_reports_the_failing_case():
    import jax

    def f(c):
        if c == 2:
            raise ValueError("bad case")
        return c

    with pytest.raises(RuntimeError, match="case 2 failed"):
        map_cases(f, range(4), devices=jax.local_devices())


def test_parse_and_resolve_devices():
    import jax

    assert parse_devices("all") == DeviceSpec(None)
    assert parse_devices("none") == DeviceSpec(0) == parse_devices("0")
    assert parse_devices("1") == DeviceSpec(1)
    with pytest.raises(ValueError, match="allowed: all, none"):
        parse_devices("many")
    assert resolve_devices(DeviceSpec(0)) == [] and resolve_devices(None) == []
    assert resolve_devices(DeviceSpec(None)) == sorted(jax.local_devices(), key=lambda d: d.id)
    with pytest.raises(ValueError, match="devices asked for"):
        resolve_devices(DeviceSpec(len(jax.local_devices()) + 1))
    with pytest.raises(ValueError, match="count"):
        DeviceSpec(-1)


def test_mesh_and_forward_arguments_are_checked():
    import jax

    from fp4sim.attention.recipe import PRESETS

    with pytest.raises(ValueError, match="must equal the number of devices"):
        attention_mesh(batch=2, devices=jax.devices()[:1])
    with pytest.raises(TypeError, match="heads"):
        attention_mesh(heads=1.5)
    mesh = attention_mesh(devices=jax.devices()[:1])
    x = np.zeros((1, 1, 32, 64), np.float32)
    with pytest.raises(TypeError, match="AttentionRecipe"):
        sharded_attention_forward(x, x, x, "hw_fp4_direct_p", mesh=mesh)
    with pytest.raises(TypeError, match="jax.sharding.Mesh"):
        sharded_attention_forward(x, x, x, PRESETS["exact_f32"], mesh="mesh")
    with pytest.raises(ValueError, match="batch, heads, seq, head_dim"):
        sharded_attention_forward(x[0], x[0], x[0], PRESETS["exact_f32"], mesh=mesh)
    r = sharded_attention_forward(x + 1, x + 1, x + 1, PRESETS["exact_f32"], mesh=mesh)
    assert r.out.shape == (1, 1, 32, 64) and r.intermediates is None


def test_reproduce_devices_option_is_checked(tmp_path):
    from fp4sim.__main__ import main

    with pytest.raises(SystemExit, match="devices asked for"):
        main(["reproduce", "--quick", "--devices", "99", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="allowed: all, none"):
        main(["reproduce", "--quick", "--devices", "many", "--out", str(tmp_path)])

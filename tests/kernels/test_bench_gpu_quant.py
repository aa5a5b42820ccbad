"""The ``quant`` section of ``python -m fp4sim bench gpu`` run end to end on the CPU: every case
and diagnostic in GPU interpret mode at a small size, with stub timers (CUPTI needs a GPU), so
that a device call never finds a broken benchmark. The emulator comparison is real: every case
that compares must report zero mismatches."""

from __future__ import annotations

import argparse
import time

import pytest

from fp4sim.benchmarks import gpu_quant
from fp4sim.benchmarks.gpu import GpuContext
from fp4sim.kernels.harness import interpret


def _ctx() -> GpuContext:
    def timer(fn, *args, **_):
        return 1e-3

    return GpuContext(
        ceilings={"copy": {"bytes_per_s": 1e12, "device_bytes_per_s": 1e12}},
        time_call=timer,
        device_time=timer,
        deadline=time.monotonic() + 1e6,
    )


@pytest.mark.slow
def test_quant_section_runs_and_every_compared_case_is_bitwise_equal():
    args = argparse.Namespace(quant_size=128, quant_no_sweep=False)
    holder = {}

    def run(_):
        holder["res"] = gpu_quant.run_section(args, _ctx())
        return _

    import jax.numpy as jnp

    interpret(run, jnp.zeros(()), detect_races=False)
    res = holder["res"]
    names = [c["name"] for c in res["cases"]]
    assert not [c for c in res["cases"] if "skipped" in c], names
    compared = [c for c in res["cases"] if "mismatch" in c]
    assert len(compared) >= 20, names
    bad = {c["name"]: c["mismatch"] for c in compared if any(c["mismatch"].values())}
    assert not bad
    for c in res["cases"]:
        assert c["ratio_to_copy"] > 0 and c["ratio_to_copy_wall"] > 0, c["name"]
    assert len(res["rows"]) == len(res["cases"])

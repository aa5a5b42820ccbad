"""Shared pytest configuration: GPU marker handling and deterministic defaults."""

from __future__ import annotations

import os

import pytest

# XLA:CPU sizes its thread pools from the NPROC environment variable, else from the CPU count.
# Pallas' GPU interpreter runs every warpgroup as a separate XLA:CPU computation whose io_callbacks
# block at the simulated barriers while holding a pool thread, so with 2 pool threads (a 2-core
# host) a kernel with two or more warpgroups waits forever for a thread. Eight threads are enough
# for every kernel the tests interpret; this must be set before jax creates its CPU client.
os.environ.setdefault("NPROC", str(max(8, os.cpu_count() or 1)))  # harness.MIN_CPU_THREADS

# Hypothesis: deterministic in CI, bounded time on 2 cores.
try:
    from hypothesis import HealthCheck, settings

    settings.register_profile(
        "ci",
        derandomize=True,
        deadline=None,
        max_examples=60,
        suppress_health_check=[HealthCheck.too_slow],
    )
    settings.register_profile("dev", deadline=None, max_examples=60)
    settings.load_profile("ci" if os.environ.get("CI") else "dev")
except ImportError:  # pragma: no cover - hypothesis is a dev dependency
    pass


def _has_gpu() -> bool:
    try:
        import jax

        return any(d.platform == "gpu" for d in jax.devices())
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if any("gpu" in item.keywords for item in items) and not _has_gpu():
        skip = pytest.mark.skip(
            reason="needs an NVIDIA GPU (Hopper sm_90a); none is visible to jax here"
        )
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)

"""Shared pytest configuration: GPU marker handling and deterministic defaults."""

from __future__ import annotations

import os

import jax
import pytest

# Pallas' GPU interpret mode runs each warpgroup as a thread that executes its own XLA:CPU
# computation, and the warpgroups meet at barriers inside io_callbacks. With async dispatch, the
# computations wait for the CPU client's worker threads; on a 2-core machine the callbacks
# blocked at a barrier can hold all of them, and the other warpgroups never start (a deadlock,
# seen about once in five runs of the kernels' interpret tests). Inline dispatch runs every
# computation in its own thread. Set before jax creates its CPU client; it changes no result.
jax.config.update("jax_cpu_enable_async_dispatch", False)

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

"""The benchmark timers and ceilings (fp4sim.kernels.ceilings): argument checks everywhere, the
CUPTI device timer's behaviour without a GPU, and on the H200 that both timers agree with what
they claim to measure."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from fp4sim.kernels import ceilings
from fp4sim.kernels.harness import gpu_available


def _copy():
    return jax.jit(lambda v: v ^ jnp.uint32(1)), jnp.arange(1 << 12, dtype=jnp.uint32)


@pytest.mark.parametrize(
    "kw", [dict(iters=0), dict(repeats=0), dict(warmup=-1), dict(iters=True), dict(iters=2.0)]
)
def test_time_call_rejects_bad_counts(kw):
    f, x = _copy()
    with pytest.raises(ValueError, match=next(iter(kw))):
        ceilings.time_call(f, x, **kw)


@pytest.mark.parametrize("iterations", [0, -3, True, 1.5])
def test_device_timer_rejects_bad_iterations(iterations):
    f, x = _copy()
    with pytest.raises(ValueError, match="iterations"):
        ceilings.device_kernels(f, x, iterations=iterations)


def test_copy_bandwidth_rejects_tiny_sizes():
    with pytest.raises(ValueError, match="nbytes"):
        ceilings.copy_bandwidth(1024)


@pytest.mark.skipif(gpu_available(), reason="checks the error raised where there is no GPU")
def test_device_time_without_a_gpu_says_so():
    f, x = _copy()
    with pytest.raises(RuntimeError, match="CUPTI|no GPU kernel"):
        ceilings.device_time(f, x, iterations=2)


@pytest.mark.gpu
def test_device_time_counts_every_kernel_of_a_call_and_no_host_time():
    """A call of two dependent kernels (a 256 MiB max reduction, then ``x ^ max`` over the same
    input: XLA cannot fuse an elementwise pass into the reduction it needs whole): CUPTI reports
    at least two kernels per call, device_time is their sum, it exceeds the one-pass copy's
    (1.5x the bytes), and the copy's device time is at most its wall-clock time. (An earlier
    form of this test used ``flip(x ^ 1) + 3``, which XLA fuses into one kernel.)"""
    import statistics

    x = jnp.arange(1 << 26, dtype=jnp.uint32)
    one = jax.jit(lambda v: v ^ jnp.uint32(1))
    two = jax.jit(lambda v: v ^ jnp.max(v))
    calls = ceilings.device_kernels(two, x, iterations=4)
    assert len(calls) == 4 and all(len(c) >= 2 for c in calls), calls
    t1, t2 = ceilings.device_time(one, x), ceilings.device_time(two, x)
    per_call = statistics.median(sum(t for _, t in c) for c in calls)
    assert per_call == pytest.approx(t2, rel=0.15)
    assert 0 < t1 < t2
    assert t1 <= 1.05 * ceilings.time_call(one, x, iters=10, repeats=3)


@pytest.mark.gpu
def test_copy_bandwidth_reports_both_timers():
    c = ceilings.copy_bandwidth(1 << 28)
    for key in ("seconds", "bytes_per_s", "device_seconds", "device_bytes_per_s"):
        assert c[key] > 0
    assert c["device_seconds"] <= 1.05 * c["seconds"]
    assert c["device_bytes_per_s"] == pytest.approx(2 * c["bytes"] / c["device_seconds"])

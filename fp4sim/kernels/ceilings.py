"""Device ceilings measured in the same run as the kernels they judge: copy bandwidth, matmul rates.

A kernel's throughput only means something next to what the same device reaches, at the same
moment, on the simplest operation of the same kind. This module measures those references with
XLA (no Pallas):

* ``copy_bandwidth(nbytes)``: a jitted elementwise read-modify-write over a uint32 array
  (``x ^ 1``): bytes read plus bytes written per second. A memory-bound kernel's *useful* bytes
  per second divided by this is its fraction of the copy ceiling.
* ``matmul_rate(n, dtype)``: an ``n x n x n`` matrix product (bfloat16, or float8_e4m3fn with both
  operands K-major and a bfloat16 result, as cuBLASLt wants), in FLOP/s.

Two timers, and every ceiling is measured with both so that a kernel is always compared with a
ceiling timed the same way:

* ``time_call`` (wall clock): median over ``repeats`` of the mean time of ``iters`` back-to-back
  calls after ``warmup`` calls, each batch closed by ``block_until_ready``. It includes what the
  host adds per call (JAX dispatch, buffer bookkeeping, the gaps between launches): on the H200
  a ~40 us kernel called back to back from Python is timed at 55-75 us, a 0.5 ms one within 4 %.
* ``device_time`` (the GPU's own clock): the kernels one call launches, timed by CUPTI's kernel
  activity records (``jax.experimental.mosaic.gpu.profiler.measure``, what JAX's own Mosaic GPU
  benchmarks use), summed per call, median over ``iterations`` calls. It is what the kernels
  cost inside a larger program, where launches overlap the previous kernel; it excludes host
  dispatch and launch gaps, and includes every kernel of the call (XLA's small fusions around a
  Pallas kernel too).

``measure_all`` returns a JSON-able dict of everything;
``python -m fp4sim.kernels.ceilings`` prints it (``python -m fp4sim bench gpu --only ceilings``
shows the same as a table).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

__all__ = [
    "time_call",
    "device_time",
    "device_kernels",
    "copy_bandwidth",
    "matmul_rate",
    "measure_all",
]


def time_call(
    fn: Callable[..., Any], *args: Any, warmup: int = 2, iters: int = 20, repeats: int = 5
) -> float:
    """Median seconds per call of ``fn(*args)`` (see the module docstring)."""
    import jax

    for name, v in (("warmup", warmup), ("iters", iters), ("repeats", repeats)):
        if not isinstance(v, int) or isinstance(v, bool) or v < (0 if name == "warmup" else 1):
            raise ValueError(
                f"{name}={v!r} must be a {'non-negative' if name == 'warmup' else 'positive'} int"
            )
    out = None
    for _ in range(warmup):
        out = fn(*args)
    jax.block_until_ready(out)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            out = fn(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t0) / iters)
    return statistics.median(times)


def device_kernels(
    fn: Callable[..., Any], *args: Any, iterations: int = 20
) -> list[list[tuple[str, float]]]:
    """Per call of ``fn(*args)`` (after one warm-up call), the kernels it launched as
    ``(name, seconds)`` in launch order, from CUPTI's activity records; ``iterations`` calls."""
    from jax.experimental.mosaic.gpu import profiler

    if not isinstance(iterations, int) or isinstance(iterations, bool) or iterations < 1:
        raise ValueError(f"iterations={iterations!r} must be a positive int")
    try:
        _, per_call = profiler.measure(fn, aggregate=False, iterations=iterations)(*args)
    except RuntimeError as e:  # no Mosaic GPU extension / no CUPTI on this platform
        raise RuntimeError(f"device_time needs CUPTI on an NVIDIA GPU: {e}") from e
    if per_call is None:
        raise RuntimeError(f"{getattr(fn, '__name__', fn)!r} launched no GPU kernel")
    if iterations == 1:
        per_call = [per_call]
    return [[(name, ms * 1e-3) for name, ms in call] for call in per_call]


def device_time(fn: Callable[..., Any], *args: Any, iterations: int = 20) -> float:
    """Median over ``iterations`` calls of the summed GPU time (s) of the kernels one call of
    ``fn(*args)`` launches (see the module docstring)."""
    return statistics.median(
        sum(t for _, t in call) for call in device_kernels(fn, *args, iterations=iterations)
    )


def copy_bandwidth(nbytes: int = 1 << 30, **timing: int) -> dict[str, float]:
    """Bytes/s of a jitted ``x ^ 1`` over ``nbytes`` of uint32 (read + write counted), timed by
    the wall clock (``seconds``, ``bytes_per_s``) and on the device (``device_seconds``,
    ``device_bytes_per_s``)."""
    import jax
    import jax.numpy as jnp

    if not isinstance(nbytes, int) or nbytes < 4096:
        raise ValueError(f"nbytes={nbytes!r} must be an int >= 4096")
    x = jnp.zeros((nbytes // 4,), jnp.uint32)
    f = jax.jit(lambda v: v ^ jnp.uint32(1))
    t = time_call(f, x, **timing)
    td = device_time(f, x)
    return {
        "bytes": float(nbytes),
        "seconds": t,
        "bytes_per_s": 2.0 * nbytes / t,
        "device_seconds": td,
        "device_bytes_per_s": 2.0 * nbytes / td,
    }


def matmul_rate(n: int = 8192, dtype: str = "bfloat16", **timing: int) -> dict[str, float]:
    """FLOP/s of an ``n^3`` product; ``dtype`` is ``"bfloat16"`` or ``"float8_e4m3fn"``."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    if dtype not in ("bfloat16", "float8_e4m3fn"):
        raise ValueError(f"dtype={dtype!r}; allowed: 'bfloat16', 'float8_e4m3fn'")
    k1, k2 = jax.random.split(jax.random.key(0))
    a = jax.random.normal(k1, (n, n), jnp.float32).astype(getattr(jnp, dtype))
    b = jax.random.normal(k2, (n, n), jnp.float32).astype(getattr(jnp, dtype))
    dims = (((1,), (1,)), ((), ()))  # both operands K-major (A @ B^T)
    f = jax.jit(lambda x, y: lax.dot_general(x, y, dims, preferred_element_type=jnp.bfloat16))
    t = time_call(f, a, b, **timing)
    return {"n": float(n), "seconds": t, "flop_per_s": 2.0 * n**3 / t}


def measure_all(*, copy_bytes: int = 1 << 30, n: int = 8192) -> dict[str, Any]:
    """Copy bandwidth and bf16/fp8 matmul rates, as a JSON-able dict."""
    import jax

    return {
        "device": str(jax.devices()[0].device_kind),
        "copy": copy_bandwidth(copy_bytes),
        "matmul_bf16": matmul_rate(n, "bfloat16", iters=10),
        "matmul_fp8": matmul_rate(n, "float8_e4m3fn", iters=10),
    }


if __name__ == "__main__":  # python -m fp4sim.kernels.ceilings  (on the GPU machine)
    import json

    print(json.dumps(measure_all(), indent=1))

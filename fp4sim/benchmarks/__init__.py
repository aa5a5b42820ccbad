"""Benchmark suites behind ``python -m fp4sim bench``: one module per suite, ratios side by side."""

import statistics
import sys
import time
from collections.abc import Callable


def time_interleaved(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median wall time (s) of each side, the sides called in turn each round so that load
    drifts on a shared machine hit all of them alike. Each side is called once first (warm-up;
    compile beforehand)."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def median_device_time(fn: Callable[[], object], reps: int, iters: int) -> float:
    """Median over ``reps`` repetitions of the wall time (s) per call of ``iters`` back-to-back
    calls of ``fn`` (jax results; one synchronization per repetition). ``fn`` is called once
    first: compile and warm-up."""
    import jax

    jax.block_until_ready(fn())
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = None
        for _ in range(iters):
            out = fn()
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t0) / iters)
    return statistics.median(times)


def options_positive(args: object, names: tuple[str, ...]) -> bool:
    """True if every option ``names`` of ``args`` is >= 1; else print which one (as its
    ``--flag``) to stderr and return False (the suite then exits with status 2)."""
    for name in names:
        if getattr(args, name) < 1:
            print(f"error: --{name.replace('_', '-')} must be >= 1", file=sys.stderr)
            return False
    return True

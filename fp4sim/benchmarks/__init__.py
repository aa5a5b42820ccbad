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


def options_positive(args: object, names: tuple[str, ...]) -> bool:
    """True if every option ``names`` of ``args`` is >= 1; else print which one (as its
    ``--flag``) to stderr and return False (the suite then exits with status 2)."""
    for name in names:
        if getattr(args, name) < 1:
            print(f"error: --{name.replace('_', '-')} must be >= 1", file=sys.stderr)
            return False
    return True

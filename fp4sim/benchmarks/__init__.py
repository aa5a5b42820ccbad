"""Benchmark suites behind ``python -m fp4sim bench``: one module per suite, ratios side by side."""

import statistics
import time
from typing import Callable


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

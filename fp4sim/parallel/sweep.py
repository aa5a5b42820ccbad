"""Independent cases mapped over devices and processes, merged in case order.

A sweep (the report's route errors, the training study's recipe x seed runs, a benchmark's
shapes) is a list of cases and a function of one case. :func:`map_cases` runs them:

* with no devices, one after another in the calling thread (the default everywhere);
* with local devices, one worker thread per device, each case's arrays committed to its worker's
  device (``jax.default_device``), results returned in case order;
* in a multi-process ``jax.distributed`` job, process ``i`` of ``n`` takes cases ``i, i+n, ...``
  and every process receives the merged list (the results travel pickled, through
  ``multihost_utils.process_allgather``).

The results equal the sequential ones bit for bit when the case function is deterministic and
its result does not depend on which device ran it, which holds for fp4sim's emulators (their bits
are defined by the algorithm, not the device: the tests run every case on several devices).
"""

from __future__ import annotations

import pickle
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["DeviceSpec", "map_cases", "parse_devices", "resolve_devices"]


@dataclass(frozen=True)
class DeviceSpec:
    """Which local devices a sweep uses: ``count`` None means all of them, 0 none (sequential)."""

    count: int | None

    def __post_init__(self) -> None:
        if self.count is not None and (
            isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 0
        ):
            raise ValueError(f"DeviceSpec.count={self.count!r} must be None (all) or an int >= 0")


def parse_devices(text: str) -> DeviceSpec:
    """``--devices`` of the command line: ``all``, ``none`` or a count (``0`` is ``none``)."""
    t = str(text).strip().lower()
    if t == "all":
        return DeviceSpec(None)
    if t == "none":
        return DeviceSpec(0)
    if t.isdigit():
        return DeviceSpec(int(t))
    raise ValueError(f"--devices {text!r}; allowed: all, none, or a count such as 4")


def resolve_devices(spec: DeviceSpec | None) -> list[Any]:
    """The local devices of ``spec`` (the default backend's, in id order); [] for none."""
    if spec is None or spec.count == 0:
        return []
    import jax

    local = sorted(jax.local_devices(), key=lambda d: d.id)
    if spec.count is None:
        return local
    if spec.count > len(local):
        raise ValueError(
            f"{spec.count} devices asked for, but this process sees {len(local)} "
            f"({local[0].platform})"
        )
    return local[: spec.count]


def _run_threads(
    fn: Callable[[Any], Any],
    cases: list[tuple[int, Any]],
    devices: list[Any],
    progress: Callable[[], None] | None,
) -> dict[int, Any]:
    import jax

    todo: queue.Queue[tuple[int, Any]] = queue.Queue()
    for item in cases:
        todo.put(item)
    results: dict[int, Any] = {}
    errors: list[tuple[int, BaseException]] = []
    lock = threading.Lock()

    def worker(device: Any) -> None:
        while not errors:
            try:
                i, case = todo.get_nowait()
            except queue.Empty:
                return
            try:
                with jax.default_device(device):
                    r = fn(case)
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
                with lock:
                    errors.append((i, e))
                return
            with lock:
                results[i] = r
            if progress is not None:
                progress()

    threads = [threading.Thread(target=worker, args=(d,), daemon=True) for d in devices]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        i, e = min(errors, key=lambda x: x[0])
        raise RuntimeError(f"case {i} failed: {e!r}") from e
    return results


def _allgather_objects(mine: dict[int, Any]) -> dict[int, Any]:
    """Every process's ``{case index: result}`` merged (multi-process jobs)."""
    import numpy as np
    from jax.experimental import multihost_utils

    blob = np.frombuffer(pickle.dumps(mine), dtype=np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.array([blob.size], np.int64)))
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[: blob.size] = blob
    blobs = np.asarray(multihost_utils.process_allgather(padded))
    merged: dict[int, Any] = {}
    for row, n in zip(blobs.reshape(len(sizes.reshape(-1)), -1), sizes.reshape(-1)):
        merged.update(pickle.loads(row[: int(n)].tobytes()))
    return merged


def map_cases(
    fn: Callable[[Any], Any],
    cases: Sequence[Any],
    *,
    devices: Sequence[Any] = (),
    progress: Callable[[], None] | None = None,
) -> list[Any]:
    """``[fn(c) for c in cases]``, spread over ``devices`` (see the module docstring).

    ``progress`` is called once per finished case (in the worker's thread)."""
    if not callable(fn):
        raise TypeError(f"fn={fn!r} must be callable")
    cases = list(cases)
    devices = list(devices)
    if not devices:
        out = []
        for c in cases:
            out.append(fn(c))
            if progress is not None:
                progress()
        return out
    import jax

    n_proc, me = jax.process_count(), jax.process_index()
    mine = [(i, c) for i, c in enumerate(cases) if i % n_proc == me]
    results = _run_threads(fn, mine, devices, progress)
    if n_proc > 1:
        results = _allgather_objects(results)
    return [results[i] for i in range(len(cases))]

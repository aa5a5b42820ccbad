"""The kernel test harness: run a Mosaic GPU kernel on the CPU, cross-lower it, detect a GPU.

Every fp4sim kernel test goes through this module, so the three ways a kernel can be exercised
are spelled once:

* :func:`interpret` runs a callable (a ``plgpu.kernel`` or a function that calls kernels) in
  Pallas' GPU *interpret mode* on the CPU: warpgroups become CPU threads, SMEM/TMA/barriers are
  simulated and, with ``detect_races=True``, a vector-clock race detector watches every shared
  memory access. A race raises :class:`KernelRaceError`. The interpreter keeps global state, so
  runs are serialised by a lock and the state is reset before each run (and after a failure).
  Use tiny grids: the cost is roughly 0.3 s per grid point and pipeline step. XLA:CPU needs at
  least :data:`MIN_CPU_THREADS` pool threads for it (each simulated warpgroup's computation holds
  one while it waits at a barrier): on smaller hosts set ``NPROC=8`` in the environment before
  jax starts, or a kernel with several warpgroups deadlocks; :func:`interpret` warns.
* :func:`cross_lower` runs the whole Pallas -> Mosaic GPU lowering for a chosen :class:`Arch`
  on a host without a GPU and returns the StableHLO text. It catches what interpret mode lets
  through: wgmma operand major-ness, casts the hardware lacks (fp4/e8m0 on sm_90, fp8 -> bf16
  with the H200's ptxas), SMEM overflow, scale layouts. Blackwell (sm_100a) is targeted by
  swapping ``jax.experimental.mosaic.gpu.utils._infer_arch`` for the duration of the call.
* :func:`gpu_available` says whether jax sees an NVIDIA GPU (so ``@pytest.mark.gpu`` tests run)
  and :func:`device_arch` which compute capability it has.

Kernels that must differ between the interpreter and the hardware (the interpreter cannot take
a wgmma A operand from registers, ``pl.run_state``, or scaled ``tcgen05_mma``; see
jax's Pallas Mosaic GPU documentation) ask :func:`interpreting` at trace time. Because the interpret
setting is part of jax's jit cache key, a jitted function traced under :func:`interpret` is a
different executable from the hardware one.

:func:`smem_transforms` gives the ``(TilingTransform, SwizzleTransform)`` pair wgmma operands
need for a dtype and minor dimension.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import os
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "Arch",
    "KernelRaceError",
    "interpret",
    "interpreting",
    "interpret_params",
    "cross_lower",
    "gpu_available",
    "device_arch",
    "smem_transforms",
]


class Arch(enum.Enum):
    """A target GPU architecture for cross-lowering, as its compute capability."""

    SM90A = (9, 0)  # Hopper (H100, H200): wgmma, TMA, no fp4/e8m0 conversions
    SM100A = (10, 0)  # Blackwell (B200): tcgen05, TMEM, block-scaled MMA

    @property
    def capability(self) -> tuple[int, int]:
        return self.value


class KernelRaceError(AssertionError):
    """The interpret-mode race detector found a data race in a kernel."""


# The interpreter's shared-memory simulator and race detector are process-global.
_INTERPRET_LOCK = threading.RLock()


def _interp_module():
    from jax._src.pallas.mosaic_gpu.interpret import interpret_pallas_call

    return interpret_pallas_call


def interpret_params(*, detect_races: bool = True) -> Any:
    """The ``plgpu.InterpretGPUParams`` fp4sim uses: uninitialised memory reads as NaN, out-of-
    bounds reads raise, and (by default) the race detector is on."""
    if not isinstance(detect_races, bool):
        raise TypeError(f"detect_races must be a bool, got {detect_races!r}")
    from jax.experimental.pallas import mosaic_gpu as plgpu

    return plgpu.InterpretGPUParams(
        detect_races=detect_races, out_of_bounds_reads="raise", uninitialized_memory="nan"
    )


def interpreting() -> bool:
    """True while tracing under :func:`interpret` (or any GPU interpret-mode context)."""
    from jax._src import config
    from jax.experimental.pallas import mosaic_gpu as plgpu

    return isinstance(
        config.pallas_tpu_interpret_mode_context_manager.value, plgpu.InterpretGPUParams
    )


@contextlib.contextmanager
def _abstract_gpu(num_sms: int) -> Iterator[None]:
    """An abstract mesh whose device reports ``num_sms`` cores (what ``get_num_sms``-style
    persistent kernels read) while interpreting on the CPU."""
    import jax

    dev = jax.sharding.AbstractDevice(device_kind="NVIDIA H200", platform="gpu", num_cores=num_sms)
    with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((), (), abstract_device=dev)):
        yield


MIN_CPU_THREADS = 8
"""XLA:CPU pool threads under which Pallas' GPU interpreter can deadlock (warpgroups blocked at
a simulated barrier each hold a thread; the others never start)."""


def xla_cpu_threads() -> int:
    """The size XLA:CPU gives its thread pools: ``NPROC`` when set, else the CPU count."""
    try:
        return int(os.environ["NPROC"])
    except (KeyError, ValueError):
        return os.cpu_count() or 1


def warn_if_small_cpu_pool() -> None:
    n = xla_cpu_threads()
    if n < MIN_CPU_THREADS:
        warnings.warn(
            f"XLA:CPU has {n} pool threads (NPROC or the CPU count); Pallas' GPU interpreter "
            f"can deadlock with fewer than {MIN_CPU_THREADS} when a kernel has several "
            f"warpgroups: set NPROC={MIN_CPU_THREADS} in the environment before jax starts",
            RuntimeWarning,
            stacklevel=3,
        )


def interpret(
    fn: Callable[..., Any], *args: Any, detect_races: bool = True, num_sms: int = 1
) -> Any:
    """Run ``fn(*args)`` with every Pallas kernel it calls in GPU interpret mode on the CPU.

    Returns ``fn``'s result (blocked until ready). Raises :class:`KernelRaceError` when
    ``detect_races`` is on and the detector saw a race; any exception from the kernel propagates
    after the interpreter's global state has been reset. ``num_sms`` is the core count the
    abstract device reports to persistent kernels.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if not isinstance(num_sms, int) or isinstance(num_sms, bool) or num_sms < 1:
        raise ValueError(f"num_sms must be a positive int, got {num_sms!r}")
    import jax
    from jax.experimental.pallas import mosaic_gpu as plgpu

    warn_if_small_cpu_pool()
    params = interpret_params(detect_races=detect_races)
    mod = _interp_module()
    with _INTERPRET_LOCK:
        mod.reset_gpu_interpret_mode_state()
        try:
            with _abstract_gpu(num_sms), plgpu.force_gpu_interpret_mode(params):
                out = jax.block_until_ready(fn(*args))
            from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks

            races = gpu_callbacks._races  # None when no kernel ran
            if detect_races and races is not None and races.races_found:
                raise KernelRaceError(f"interpret mode found a data race in {_name(fn)}")
            return out
        finally:
            mod.reset_gpu_interpret_mode_state()


def _name(fn: Any) -> str:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def cross_lower(
    fn: Callable[..., Any],
    *avals: Any,
    arch: Arch = Arch.SM90A,
    on_module: Callable[[Any], None] | None = None,
) -> str:
    """Lower ``fn`` for CUDA on this (GPU-less) host targeting ``arch``; return StableHLO text.

    ``avals`` are ``jax.ShapeDtypeStruct`` (or arrays; only shape and dtype matter). Errors of
    the Mosaic GPU lowering (layouts, illegal casts, SMEM budget, MMA operand rules) propagate.
    On a host that has a GPU the patched architecture still wins, so sm_100a code can be checked
    on the H200 too. ``on_module``, if given, is called with each kernel's Mosaic GPU MLIR
    module (an ``ir.Module``, fully lowered by the Python passes, before serialisation), e.g. to
    read the PTX instructions it carries (:mod:`fp4sim.kernels.ptx_check`).
    """
    if not isinstance(arch, Arch):
        raise TypeError(f"arch must be an fp4sim.kernels.harness.Arch, got {arch!r}")
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if on_module is not None and not callable(on_module):
        raise TypeError(f"on_module must be callable or None, got {type(on_module).__name__}")
    import jax
    import jax.experimental.mosaic.gpu.core as mgpu_core
    import jax.experimental.mosaic.gpu.utils as mgpu_utils

    structs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals]
    with _INTERPRET_LOCK:  # the patch is process-global too
        old = mgpu_utils._infer_arch
        old_serde = mgpu_core._run_serde_pass
        mgpu_utils._infer_arch = lambda: arch.capability
        if on_module is not None:

            def serde(module, *, serialize, ir_version):
                if serialize:
                    on_module(module)
                return old_serde(module, serialize=serialize, ir_version=ir_version)

            mgpu_core._run_serde_pass = serde
        try:
            # A fresh wrapper so no lowering cached for another arch is reused.
            wrapper = lambda *xs: fn(*xs)  # noqa: E731
            return jax.jit(wrapper).trace(*structs).lower(lowering_platforms=("cuda",)).as_text()
        finally:
            mgpu_utils._infer_arch = old
            mgpu_core._run_serde_pass = old_serde


def gpu_available() -> bool:
    """True when jax has an NVIDIA GPU backend with at least one device."""
    try:
        import jax

        return any(d.platform == "gpu" for d in jax.devices())
    except Exception:  # no backend initialisable: treat as no GPU
        return False


def device_arch() -> tuple[int, int] | None:
    """Compute capability of the first GPU, e.g. ``(9, 0)`` on an H200; None without a GPU."""
    if not gpu_available():
        return None
    import jax

    dev = next(d for d in jax.devices() if d.platform == "gpu")
    cc = getattr(dev, "compute_capability", None)
    return tuple(int(p) for p in cc.split(".")) if cc else None


def smem_transforms(dtype: Any, minor: int) -> tuple[Any, Any]:
    """``(TilingTransform((8, elems)), SwizzleTransform(bytes))`` for an SMEM operand of
    ``dtype`` whose minor dimension has ``minor`` elements (largest legal swizzle)."""
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental.pallas import mosaic_gpu as plgpu

    if not isinstance(minor, int) or minor <= 0:
        raise ValueError(f"minor must be a positive int, got {minor!r}")
    bits = 4 if np.dtype(dtype) == np.dtype(jnp.float4_e2m1fn) else np.dtype(dtype).itemsize * 8
    swizzle = plgpu.find_swizzle(minor * bits)
    return plgpu.TilingTransform((8, swizzle * 8 // bits)), plgpu.SwizzleTransform(swizzle)

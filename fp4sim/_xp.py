"""The array-namespace shim every emulator is written against.

One implementation per algorithm: functions take NumPy or JAX arrays and ask :func:`namespace`
which module (``numpy`` or ``jax.numpy``) to use. The few operations whose spelling differs
between the two (bit reinterpretation, functional updates) live here so the algorithms read the
same for both. Nothing here does floating-point arithmetic, so XLA's flush-to-zero and fused
multiply-add choices cannot change a result: the emulators do their rounding on integers.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing

if TYPE_CHECKING:
    import jax

__all__ = ["Array", "namespace", "is_jax", "bitcast", "asarray_like", "to_numpy", "materialize"]

type Array = np.ndarray | jax.Array
"""A NumPy array or a jax array (also a tracer under ``jax.jit``): what every emulator takes and
returns. Scalars of either are accepted wherever an array is."""


def is_jax(x: object) -> bool:
    """True for jax arrays and tracers (without importing jax when it is not loaded)."""
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(x, jax.Array)


def namespace(*arrays: object) -> ModuleType:
    """``jax.numpy`` if any argument is a jax array or tracer, else ``numpy``."""
    if any(is_jax(a) for a in arrays):
        import jax.numpy as jnp

        return jnp
    return np


def bitcast(x: Array, dtype: np.typing.DTypeLike) -> Array:
    """Reinterpret the bits of ``x`` as ``dtype`` (same itemsize), for NumPy or jax arrays."""
    dtype = np.dtype(dtype)
    if is_jax(x):
        from jax import lax

        return lax.bitcast_convert_type(x, dtype)
    x = np.asarray(x)
    if x.dtype.itemsize != dtype.itemsize:
        raise TypeError(f"bitcast: itemsize of {x.dtype} differs from {dtype}")
    return x.view(dtype)


def asarray_like(value: Any, like: Array, dtype: np.typing.DTypeLike = None) -> Array:
    """``value`` as an array of the same namespace as ``like``."""
    return namespace(like).asarray(value, dtype=dtype)


def to_numpy(x: Array) -> np.ndarray:
    """A NumPy copy of a NumPy or (concrete) jax array."""
    return np.asarray(x)


def materialize(x: Array | tuple[Any, ...]) -> Any:
    """``x`` (an array or a tuple of arrays) computed once: under jax an optimization barrier, so
    that XLA does not re-fuse a long elementwise chain into every consumer (a pure performance
    hint, no effect on bits); NumPy values pass unchanged."""
    leaves = x if isinstance(x, tuple) else (x,)
    if not any(is_jax(a) for a in leaves):
        return x
    from jax import lax

    return lax.optimization_barrier(x)

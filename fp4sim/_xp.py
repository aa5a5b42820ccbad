"""The array-namespace shim every emulator is written against.

One implementation per algorithm: functions take NumPy or JAX arrays and ask :func:`namespace`
which module (``numpy`` or ``jax.numpy``) to use. The few operations whose spelling differs
between the two (bit reinterpretation, functional updates) live here so the algorithms read the
same for both. Nothing here does floating-point arithmetic, so XLA's flush-to-zero and fused
multiply-add choices cannot change a result: the emulators do their rounding on integers.

Derivatives. Reading a float's bits (:func:`bitcast`) has no derivative, and under ``jax.grad``
/ ``jax.jvp`` JAX would silently give zero for everything computed from them. So every
:func:`bitcast` of a float jax array passes it through :func:`no_derivative`, an identity whose
JVP raises :class:`NoDerivativeError` naming the differentiable entry points (the emulators'
straight-through round trip and ``emulated_attention``); :func:`straight_through` is the one
place that defines a derivative for such a computation (the identity, a straight-through
estimator).
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing

if TYPE_CHECKING:
    import jax

__all__ = ["Array", "namespace", "is_jax", "is_traced", "bitcast", "bitcast_in_kernel", "asarray_like", "to_numpy",
           "materialize", "canonical_nan", "NoDerivativeError", "no_derivative", "straight_through"]

type Array = np.ndarray | jax.Array
"""A NumPy array or a jax array (also a tracer under ``jax.jit``): what every emulator takes and
returns. Scalars of either are accepted wherever an array is."""


def is_jax(x: object) -> bool:
    """True for jax arrays and tracers (without importing jax when it is not loaded)."""
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(x, jax.Array)


def is_traced(x: object) -> bool:
    """True for jax tracers (values only known when the traced function runs)."""
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(x, jax.core.Tracer)


def namespace(*arrays: object) -> ModuleType:
    """``jax.numpy`` if any argument is a jax array or tracer, else ``numpy``."""
    if any(is_jax(a) for a in arrays):
        import jax.numpy as jnp

        return jnp
    return np


def bitcast(x: Array, dtype: np.typing.DTypeLike) -> Array:
    """Reinterpret the bits of ``x`` as ``dtype`` (same itemsize), for NumPy or jax arrays.
    A float jax ``x`` passes :func:`no_derivative` first (see the module docstring)."""
    if is_jax(x) and (np.dtype(x.dtype).kind == "f" or "bfloat16" in str(x.dtype)):
        x = no_derivative(x)
    return bitcast_in_kernel(x, dtype)


def bitcast_in_kernel(x: Array, dtype: np.typing.DTypeLike) -> Array:
    """:func:`bitcast` without the derivative guard, for the bodies of Pallas kernels (whose
    Mosaic GPU lowering has no rule for the guard's ``custom_jvp``; kernels are not
    differentiated)."""
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


CANONICAL_NAN = 0x7FC00000
"""The float32 NaN every fp4sim result computed by float arithmetic carries (positive, quiet,
zero payload): x86 and XLA pick different NaN signs and payloads for the same operation."""


def canonical_nan(x: Array) -> Array:
    """float32 ``x`` with every NaN replaced by :data:`CANONICAL_NAN` (integer operations on
    the bits, so no backend can change them; other values unchanged)."""
    xp = namespace(x)
    b = bitcast_in_kernel(xp.asarray(x, dtype=np.float32), np.uint32)
    nan = (b & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    return bitcast_in_kernel(xp.where(nan, np.uint32(CANONICAL_NAN), b), np.float32)


DIFFERENTIABLE_ENTRY_POINTS = (
    "fp4sim.round_trip(x, fmt, ...) (decode(encode(x)) or dequantize(quantize(x)) with a "
    "straight-through derivative) and fp4sim.emulated_attention(q, k, v, training_recipe) (the "
    "emulated backward)")


class NoDerivativeError(TypeError):
    """Raised when ``jax.grad``/``jax.jvp`` (or any JAX differentiation) reaches a computation
    on float bit patterns, whose derivative JAX would silently give as zero."""


def _no_derivative_jvp(what: str):
    def jvp(primals, tangents):
        raise NoDerivativeError(
            f"{what} has no derivative: fp4sim's emulators compute on float bit patterns, for "
            f"which JAX would silently return zero gradients. Differentiable entry points: "
            f"{DIFFERENTIABLE_ENTRY_POINTS}.")
    return jvp


_GUARDS: dict[str, Any] = {}


def no_derivative(x: Array, what: str = "this fp4sim computation") -> Array:
    """``x`` unchanged; differentiating through it (``jax.grad``, ``jax.jvp``, ``jax.vjp``, also
    under ``jax.jit``) raises :class:`NoDerivativeError` naming ``what``. NumPy values pass."""
    if not is_jax(x):
        return x
    guard = _GUARDS.get(what)
    if guard is None:
        import jax

        guard = jax.custom_jvp(lambda a: a)
        guard.defjvp(_no_derivative_jvp(what))
        _GUARDS[what] = guard
    return guard(x)


def straight_through(fn: Any, x: Array, *aux: Any) -> Array:
    """``fn(x, *aux)`` (an array shaped like ``x``) whose derivative with respect to ``x`` is the
    identity and with respect to ``aux`` zero: the straight-through estimator of fake
    quantization (torchao, TransformerEngine). NumPy inputs: just ``fn(x, *aux)``."""
    if not any(is_jax(a) for a in (x, *aux)):
        return fn(x, *aux)
    import jax

    f = jax.custom_jvp(fn)

    def jvp(primals, tangents):
        out = f(*primals)
        t = tangents[0]
        return out, jax.numpy.broadcast_to(t.astype(out.dtype), out.shape)

    f.defjvp(jvp)
    return f(x, *aux)

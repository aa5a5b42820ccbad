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

Foreign arrays (PyTorch tensors of any dtype on any device, and any other object with
``__dlpack__``) enter through :func:`adopt`, which makes a NumPy array of the same bits (a CPU
copy where the data is elsewhere; bfloat16 and the float8 dtypes by bit reinterpretation into
their ml_dtypes dtypes, since NumPy's DLPack import knows none of them), and results go back to
the caller's type with :func:`like_caller` where that is cheap (a PyTorch tensor on the input's
device).
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing

if TYPE_CHECKING:
    import jax

__all__ = [
    "Array",
    "namespace",
    "is_jax",
    "is_traced",
    "bitcast",
    "bitcast_in_kernel",
    "asarray_like",
    "to_numpy",
    "materialize",
    "canonical_nan",
    "NoDerivativeError",
    "no_derivative",
    "straight_through",
    "is_torch",
    "is_foreign",
    "adopt",
    "like_caller",
]

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
    "emulated backward)"
)


class NoDerivativeError(TypeError):
    """Raised when ``jax.grad``/``jax.jvp`` (or any JAX differentiation) reaches a computation
    on float bit patterns, whose derivative JAX would silently give as zero."""


def _no_derivative_jvp(what: str):
    def jvp(primals, tangents):
        raise NoDerivativeError(
            f"{what} has no derivative: fp4sim's emulators compute on float bit patterns, for "
            f"which JAX would silently return zero gradients. Differentiable entry points: "
            f"{DIFFERENTIABLE_ENTRY_POINTS}."
        )

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


def is_torch(x: object) -> bool:
    """True for PyTorch tensors (without importing torch when it is not loaded)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def is_foreign(x: object) -> bool:
    """True for arrays that are neither NumPy nor jax but can be read: PyTorch tensors and other
    objects with ``__dlpack__``."""
    if isinstance(x, np.ndarray | np.generic) or is_jax(x):
        return False
    return is_torch(x) or hasattr(x, "__dlpack__")


# torch dtypes NumPy cannot hold, by the ml_dtypes dtype of the same bits
_TORCH_BITS = {
    "bfloat16": ("int16", "bfloat16"),
    "float8_e4m3fn": ("uint8", "float8_e4m3fn"),
    "float8_e5m2": ("uint8", "float8_e5m2"),
    "float8_e4m3fnuz": ("uint8", "float8_e4m3fnuz"),
    "float8_e5m2fnuz": ("uint8", "float8_e5m2fnuz"),
    "float8_e8m0fnu": ("uint8", "float8_e8m0fnu"),
    "float4_e2m1fn_x2": ("uint8", None),
}


def _torch_to_numpy(t: Any, name: str) -> np.ndarray:
    torch = sys.modules["torch"]
    t = t.detach()  # tensors that require grad: the values, not the graph
    if t.device.type != "cpu":
        t = t.cpu()  # a copy to the host (CUDA, MPS, ...)
    t = t.resolve_conj().resolve_neg().contiguous()
    key = str(t.dtype).removeprefix("torch.")
    if key in _TORCH_BITS:
        int_name, mld_name = _TORCH_BITS[key]
        raw = t.view(getattr(torch, int_name)).numpy()
        if mld_name is None:  # packed FP4 pairs stay bytes (fp4sim.formats.packing reads them)
            return raw.view(np.uint8)
        import ml_dtypes

        return raw.view(getattr(ml_dtypes, mld_name))
    try:
        return t.numpy()
    except (TypeError, RuntimeError) as exc:
        raise TypeError(
            f"{name}: a torch tensor of dtype {t.dtype} cannot be read as a NumPy array ({exc})"
        ) from exc


def adopt(x: Any, name: str = "x") -> Any:
    """``x`` as an array the emulators take: NumPy and jax arrays (and scalars, lists) unchanged;
    a PyTorch tensor or another ``__dlpack__`` object as a NumPy array of the same bits (detached,
    copied to the host when on another device). ``name`` names the argument in errors."""
    if not is_foreign(x):
        return x
    if is_torch(x):
        return _torch_to_numpy(x, name)
    try:
        return np.from_dlpack(x)
    except (TypeError, RuntimeError, BufferError, ValueError) as exc:
        raise TypeError(
            f"{name}: {type(x).__name__} object cannot be read through DLPack as a "
            f"NumPy array ({exc}); pass a NumPy array, a jax array or a PyTorch "
            "tensor"
        ) from exc


def like_caller(result: Any, caller: Any) -> Any:
    """``result`` in the array type of ``caller`` where that is cheap: a NumPy result for a
    PyTorch ``caller`` becomes a tensor on ``caller``'s device (bfloat16/float8 results by their
    bits); anything else is returned unchanged (jax results stay jax, other DLPack callers get
    NumPy)."""
    if not is_torch(caller) or not isinstance(result, np.ndarray):
        return result
    torch = sys.modules["torch"]
    name = result.dtype.name
    bits = {"bfloat16": torch.int16}.get(name, torch.uint8 if name.startswith("float8") else None)
    if bits is not None:
        tdtype = getattr(torch, name, None)
        if tdtype is None:
            return result
        raw = torch.from_numpy(result.view(np.int16 if bits is torch.int16 else np.uint8).copy())
        out = raw.view(tdtype)
    else:
        out = torch.from_numpy(np.ascontiguousarray(result))
    return out.to(caller.device)

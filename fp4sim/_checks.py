"""Argument validation shared by every layer: one wording for each kind of bad input.

Each check raises ``TypeError`` (wrong type) or ``ValueError`` (wrong value) naming the argument,
the value given and what is allowed, and returns the value in the form the caller uses.

* :func:`check_int` validates the integer fields of frozen configs (Python or NumPy ints, not
  bools); :func:`check_real` real numbers (Python or NumPy ints and floats, not bools, not
  strings); :func:`check_bool` flags (``bool`` or ``numpy.bool_`` only: ``"no"`` is not False).
* :func:`softmax_scale` the softmax scale of every attention entry point (the emulators, the
  references, the kernels).
* :func:`check_static` configs (formats, policies, recipes) that must be static under
  ``jax.jit``: a traced value is told to be passed as a static argument.
* :func:`as_float_array` the float array inputs of the public functions: NumPy and jax arrays,
  Python lists and scalars, NumPy scalars, PyTorch tensors and other ``__dlpack__`` objects
  (through :func:`fp4sim._xp.adopt`: same bits, any device), objects exposing ``__array__``;
  big-endian arrays are byte-swapped to native order (exact); integer, bool,
  string and object arrays raise ``TypeError`` naming the argument.
"""

from __future__ import annotations

import math
import numbers
import sys
from typing import Any

import numpy as np

from fp4sim._xp import adopt, is_foreign

__all__ = [
    "check_int",
    "check_choice",
    "check_real",
    "check_bool",
    "check_static",
    "softmax_scale",
    "as_float_array",
    "as_f32",
    "check_same_shape",
    "FLOAT_DTYPES",
]

FLOAT_DTYPES = "float32, bfloat16, float16, float64"


def _is_jax(x: object) -> bool:
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(x, jax.Array)


def check_int(
    owner: str, name: str, value: object, lo: int, hi: int | None = None, *, multiple: int = 1
) -> int:
    """``value`` if it is an int (not a bool) in ``lo..hi`` (``hi`` None: no upper bound) and a
    multiple of ``multiple``; the messages name ``owner.name``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{owner}.{name}={value!r} must be an int")
    if multiple != 1 and (value < lo or value % multiple):
        raise ValueError(f"{owner}.{name}={value!r} must be >= {lo} and a multiple of {multiple}")
    if value < lo or (hi is not None and value > hi):
        raise ValueError(
            f"{owner}.{name}={value!r} out of range; allowed "
            f"{lo}..{hi if hi is not None else 'inf'}"
        )
    return int(value)


def check_choice(owner: str, name: str, value: object, allowed: tuple[int, ...]) -> int:
    """``value`` if it is an int (not a bool) among ``allowed``; the messages name
    ``owner.name`` and list what is allowed."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{owner}.{name}={value!r} must be an int")
    if int(value) not in allowed:
        raise ValueError(f"{owner}.{name}={value!r} is not supported; allowed: {allowed}")
    return int(value)


def check_real(
    name: str,
    value: object,
    *,
    lo: float | None = None,
    positive: bool = False,
    finite: bool = True,
) -> float:
    """``value`` as a Python float if it is a real number (Python or NumPy int or float, not a
    bool, not a string, not an array): ``TypeError`` otherwise; ``ValueError`` when it is not
    finite (``finite``), not > 0 (``positive``) or below ``lo``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        hint = " (a traced jax value: pass it as a static argument)" if _is_jax(value) else ""
        raise TypeError(f"{name}={value!r} must be a real number (int or float){hint}")
    v = float(value)
    if finite and not math.isfinite(v):
        raise ValueError(f"{name}={value!r} must be finite")
    if positive and not v > 0:
        raise ValueError(f"{name}={value!r} must be > 0")
    if lo is not None and not v >= lo:
        raise ValueError(f"{name}={value!r} must be >= {lo}")
    return v


def check_bool(name: str, value: object) -> bool:
    """``value`` if it is a bool (``numpy.bool_`` accepted); strings and ints raise
    ``TypeError`` (``"no"`` would otherwise count as True)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}={value!r} must be a bool (True or False)")
    return bool(value)


def check_static(name: str, value: object, kind: type | tuple[type, ...], example: str) -> None:
    """``TypeError`` unless ``value`` is a ``kind``; a jax array or tracer (a config passed as a
    traced argument of ``jax.jit``) is told to be passed as a static argument."""
    if isinstance(value, kind):
        return
    kinds = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
    if _is_jax(value):
        raise TypeError(
            f"{name} is a traced jax value ({type(value).__name__}), not a {kinds}: "
            f"under jax.jit pass {name} as a static argument "
            f"(jax.jit(f, static_argnames='{name}')) or close over it"
        )
    article = "an" if kinds[0] in "AEIOU" else "a"
    raise TypeError(f"{name}={value!r} must be {article} {kinds} (e.g. {example})")


def softmax_scale(value: object, head_dim: int) -> float:
    """The softmax scale as a Python float: ``1/√head_dim`` when ``value`` is None, else
    ``value`` itself, which must be a positive finite real number (a Python or NumPy int or
    float; not a bool: ``TypeError`` for the wrong type, ``ValueError`` for the wrong value)."""
    if value is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        hint = " (a traced jax value: pass it as a static argument)" if _is_jax(value) else ""
        raise TypeError(f"softmax_scale={value!r} must be a positive finite number{hint}")
    if not math.isfinite(float(value)) or value <= 0:
        raise ValueError(f"softmax_scale={value!r} must be a positive finite number")
    return float(value)


def _is_float_dtype(dt: np.dtype) -> bool:
    return dt.kind == "f" or dt.name == "bfloat16"


def as_float_array(
    name: str, x: Any, xp: Any = np, *, allowed: str = FLOAT_DTYPES, ints: bool = False
) -> Any:
    """``x`` as a float array of its namespace (jax arrays and tracers are returned as they are;
    everything else becomes a NumPy array in native byte order). ``TypeError`` naming ``name``
    for strings, integer (unless ``ints``), bool and object data; ``allowed`` is what the
    message lists."""
    if _is_jax(x):
        dt = np.dtype(x.dtype)
    else:
        if isinstance(x, (str, bytes)):
            raise TypeError(f"{name}={x!r} is a string; allowed: arrays of {allowed}")
        if is_foreign(x):  # PyTorch tensors (any dtype, any device), other __dlpack__ objects
            x = adopt(x, name)
        if not isinstance(x, np.ndarray):
            if hasattr(x, "__array__") or isinstance(x, (list, tuple, numbers.Number)):
                try:
                    x = np.asarray(x)
                except (TypeError, ValueError, RuntimeError) as e:  # torch: bf16, CUDA, grad
                    raise TypeError(
                        f"{name} ({type(x).__name__}) cannot be converted to a "
                        f"NumPy array: {e}; pass a NumPy or jax array (for a GPU "
                        f"tensor: jax.numpy.from_dlpack(x))"
                    ) from None
            else:
                raise TypeError(f"{name}={x!r} ({type(x).__name__}) must be an array of {allowed}")
        dt = x.dtype
        if not dt.isnative:
            x = x.astype(dt.newbyteorder("="))
            dt = x.dtype
    if not _is_float_dtype(dt) and not (ints and dt.kind in "iu"):
        what = {"U": "strings", "S": "bytes", "O": "Python objects", "b": "booleans"}.get(
            dt.kind, f"dtype {dt}"
        )
        extra = (
            " (integer arrays are codes: use decode)"
            if dt.kind in "iu" and name == "values"
            else ""
        )
        raise TypeError(f"{name} has {what}; allowed: {allowed}{extra}")
    if xp is not np and not _is_jax(x):
        x = xp.asarray(x)
    return x


def as_f32(name: str, x: Any, xp: Any = np, *, ints: bool = False) -> Any:
    """:func:`as_float_array`, then cast to float32 (float64 rounded to nearest even)."""
    x = as_float_array(name, x, xp, ints=ints)
    if np.dtype(x.dtype) == np.float32:
        return x
    return (xp.asarray(x) if _is_jax(x) else np.asarray(x)).astype(np.float32)


def check_same_shape(**arrays: Any) -> tuple[int, ...]:
    """The common shape of the named arrays; ``ValueError`` naming them all otherwise."""
    shapes = {n: tuple(np.shape(a)) for n, a in arrays.items()}
    if len(set(shapes.values())) > 1:
        raise ValueError(
            "shapes differ: "
            + ", ".join(f"{n} {s}" for n, s in shapes.items())
            + "; they must be equal"
        )
    return next(iter(shapes.values()))

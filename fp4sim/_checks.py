"""Argument validation shared by every layer: one wording for each kind of bad input.

Each check raises ``TypeError`` (wrong type) or ``ValueError`` (wrong value) naming the argument,
the value given and what is allowed, and returns the value in the form the caller uses.
:func:`check_int` validates the integer fields of frozen configs; :func:`softmax_scale` the
softmax scale of every attention entry point (the emulators, the references, the kernels).
"""

from __future__ import annotations

import math
import numbers

import numpy as np

__all__ = ["check_int", "softmax_scale"]


def check_int(owner: str, name: str, value: object, lo: int, hi: int | None = None, *,
              multiple: int = 1) -> int:
    """``value`` if it is an int (not a bool) in ``lo..hi`` (``hi`` None: no upper bound) and a
    multiple of ``multiple``; the messages name ``owner.name``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{owner}.{name}={value!r} must be an int")
    if multiple != 1 and (value < lo or value % multiple):
        raise ValueError(f"{owner}.{name}={value!r} must be >= {lo} and a multiple of {multiple}")
    if value < lo or (hi is not None and value > hi):
        raise ValueError(f"{owner}.{name}={value!r} out of range; allowed "
                         f"{lo}..{hi if hi is not None else 'inf'}")
    return int(value)


def softmax_scale(value: object, head_dim: int) -> float:
    """The softmax scale as a Python float: ``1/√head_dim`` when ``value`` is None, else
    ``value`` itself, which must be a positive finite real number (a Python or NumPy int or
    float; not a bool)."""
    if value is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) \
            or not math.isfinite(float(value)) or value <= 0:
        raise ValueError(f"softmax_scale={value!r} must be a positive finite number")
    return float(value)

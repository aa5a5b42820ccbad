"""Conversions between fp4sim's codes and other libraries' low-precision arrays.

This module owns the mapping between fp4sim's storage (one ``uint8`` code per element, FP4/FP6
in the low bits, plus a :class:`~fp4sim.formats.spec.FloatFormat` that says what the bits mean)
and the typed arrays of ml_dtypes and PyTorch:

* ml_dtypes (``float4_e2m1fn``, ``float6_e2m3fn``, ``float6_e3m2fn``, ``float8_e4m3fn``,
  ``float8_e5m2``, ``float8_e8m0fnu``) stores the same bits one element per byte, so
  :func:`to_ml_dtypes` and :func:`from_ml_dtypes` are views, no arithmetic.
* PyTorch's ``float8_e4m3fn``, ``float8_e5m2`` and ``float8_e8m0fnu`` are the same bytes too;
  ``float4_e2m1fn_x2`` packs two E2M1 codes per byte, element ``2k`` in the low nibble (the
  ``INTERLEAVED`` order of :mod:`fp4sim.formats.packing`), along the last axis.
  :func:`to_torch` / :func:`from_torch` convert through those bytes (torch is imported only
  when they are called).

UE4M3 (NVFP4's scale) is E4M3 with the sign bit 0, so it maps to ``float8_e4m3fn`` one way;
:func:`from_ml_dtypes` returns ``E4M3`` for that dtype. UE5M3 has no ml_dtypes or torch dtype.
Reading foreign arrays of real values (a bf16 tensor into :func:`~fp4sim.formats.codec.encode`)
is :func:`fp4sim._xp.adopt`'s job; this module converts *codes*.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from fp4sim._xp import is_jax, is_torch
from fp4sim.formats.packing import NibbleOrder, pack, unpack
from fp4sim.formats.spec import (
    E2M1,
    E4M3,
    E5M2,
    ML_DTYPE_FORMATS,
    UE4M3,
    UE8M0,
    FloatFormat,
)

__all__ = ["to_ml_dtypes", "from_ml_dtypes", "to_torch", "from_torch"]

_TORCH: dict[FloatFormat, str] = {
    E4M3: "float8_e4m3fn",
    UE4M3: "float8_e4m3fn",
    E5M2: "float8_e5m2",
    UE8M0: "float8_e8m0fnu",
    E2M1: "float4_e2m1fn_x2",
}


def _codes(codes: Any, fmt: FloatFormat) -> np.ndarray:
    if not isinstance(fmt, FloatFormat):
        raise TypeError(f"fmt={fmt!r} must be a FloatFormat (e.g. fp4sim.E2M1)")
    c = np.asarray(codes) if is_jax(codes) or not isinstance(codes, np.ndarray) else codes
    if c.dtype != np.uint8:
        raise TypeError(f"codes has dtype {c.dtype}; allowed: uint8 (fp4sim codes)")
    if c.size and int(c.max()) >= fmt.num_codes:
        raise ValueError(
            f"codes contains {int(c.max()):#x}, beyond the {fmt.nbits}-bit codes of "
            f"{fmt} (allowed: 0..{fmt.num_codes - 1:#x})"
        )
    return c


def to_ml_dtypes(codes: Any, fmt: FloatFormat) -> np.ndarray:
    """``codes`` (uint8, NumPy or jax) of ``fmt`` as an array of ``fmt``'s ml_dtypes dtype (a
    view of the same bytes: ``decode`` and ``astype(float32)`` then agree)."""
    c = _codes(codes, fmt)
    if fmt.dtype is None:
        raise ValueError(
            f"fmt={fmt} has no ml_dtypes dtype; allowed: "
            f"{sorted({f.name for f in (*ML_DTYPE_FORMATS.values(), UE4M3)})}"
        )
    return c.view(fmt.dtype)


def from_ml_dtypes(arr: np.ndarray) -> tuple[np.ndarray, FloatFormat]:
    """``(codes, fmt)`` of an ml_dtypes low-precision array: its bytes as uint8 codes and the
    fp4sim format that gives them the same meaning (``E4M3`` for ``float8_e4m3fn``)."""
    if not isinstance(arr, np.ndarray) or arr.dtype.name not in ML_DTYPE_FORMATS:
        raise TypeError(
            f"arr must be a NumPy array of an ml_dtypes dtype; got "
            f"{type(arr).__name__} of dtype {getattr(arr, 'dtype', None)}; allowed: "
            f"{sorted(ML_DTYPE_FORMATS)}"
        )
    fmt = ML_DTYPE_FORMATS[arr.dtype.name]
    return _codes(arr.view(np.uint8), fmt), fmt


def to_torch(codes: Any, fmt: FloatFormat, *, device: Any = None) -> Any:
    """``codes`` of ``fmt`` as a PyTorch tensor of the matching dtype (on ``device``; CPU by
    default): float8_e4m3fn (E4M3, UE4M3), float8_e5m2, float8_e8m0fnu (UE8M0), or
    float4_e2m1fn_x2 for E2M1, packed two per byte along the last axis (even length)."""
    c = _codes(codes, fmt)
    if fmt not in _TORCH:
        raise ValueError(
            f"fmt={fmt} has no PyTorch dtype; allowed: {sorted({f.name for f in _TORCH})}"
        )
    import torch

    name = _TORCH[fmt]
    if not hasattr(torch, name):
        raise ValueError(f"fmt={fmt}: this PyTorch ({torch.__version__}) has no torch.{name}")
    if fmt is E2M1:
        c = np.asarray(pack(c, E2M1, order=NibbleOrder.INTERLEAVED))
    t = torch.from_numpy(np.ascontiguousarray(c)).view(getattr(torch, name))
    return t if device is None else t.to(device)


def from_torch(t: Any) -> tuple[np.ndarray, FloatFormat]:
    """``(codes, fmt)`` of a PyTorch float8 / float4_e2m1fn_x2 tensor (any device; copied to the
    host): its bytes as uint8 codes (FP4 unpacked, one code per element) and the fp4sim format."""
    if not is_torch(t):
        raise TypeError(f"t must be a torch.Tensor; got {type(t).__name__}")
    torch = sys.modules["torch"]
    name = str(t.dtype).removeprefix("torch.")
    fmts = {v: k for k, v in _TORCH.items() if k is not UE4M3}
    if name not in fmts:
        raise TypeError(f"t has dtype {t.dtype}; allowed: {sorted(fmts)}")
    raw = t.detach().cpu().contiguous().view(torch.uint8).numpy()
    fmt = fmts[name]
    if fmt is E2M1:
        return np.asarray(unpack(raw, E2M1, order=NibbleOrder.INTERLEAVED)), E2M1
    return _codes(raw, fmt), fmt

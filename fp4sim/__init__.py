"""fp4sim: a bit-exact reference and simulation library for FP4/FP8 microscaled attention.

The flat public API re-exports :mod:`fp4sim.formats` and :mod:`fp4sim.attention`. Importing
fp4sim loads neither matplotlib nor a GPU backend; :mod:`fp4sim.kernels` is imported explicitly.
The re-exports load on first use (PEP 562): ``import fp4sim`` alone imports neither NumPy nor
jax, so ``python -m fp4sim --help`` and ``--version`` answer at once.

>>> import numpy as np, fp4sim
>>> fp4sim.E2M1.max
6.0
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:  # the names the façade re-exports, for type checkers and readers
    from fp4sim.attention import *  # noqa: F401,F403
    from fp4sim.formats import *  # noqa: F401,F403


def _load() -> list[str]:
    """Import :mod:`fp4sim.formats` and :mod:`fp4sim.attention` and bind their public names here."""
    formats = importlib.import_module("fp4sim.formats")
    attention = importlib.import_module("fp4sim.attention")
    # (bf16_round is exported by both: formats.codec owns it, attention re-exports it)
    names = [*formats.__all__, *[n for n in attention.__all__ if n not in formats.__all__]]
    ns = globals()
    for n in names:
        ns[n] = getattr(formats, n) if n in formats.__all__ else getattr(attention, n)
    ns["__all__"] = ["__version__", *names]
    return names


_LOADING = False


def __getattr__(name: str) -> Any:
    global _LOADING
    if (name.startswith("__") and name != "__all__") or _LOADING:
        raise AttributeError(f"module 'fp4sim' has no attribute {name!r}")
    _LOADING = True
    try:
        _load()
    finally:
        _LOADING = False
    ns = globals()
    if name in ns:
        return ns[name]
    raise AttributeError(f"module 'fp4sim' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_load()})

"""fp4sim: a bit-exact reference and simulation library for FP4/FP8 microscaled attention.

The flat public API re-exports :mod:`fp4sim.formats` and :mod:`fp4sim.attention`. Importing
fp4sim loads neither matplotlib nor a GPU backend; :mod:`fp4sim.kernels` is imported explicitly.

>>> import numpy as np, fp4sim
>>> fp4sim.E2M1.max
6.0
"""

from fp4sim import attention as _attention
from fp4sim import formats as _formats
from fp4sim.attention import *  # noqa: F401,F403
from fp4sim.formats import *  # noqa: F401,F403

__version__ = "0.1.0"

# (bf16_round is exported by both: formats.codec owns it, attention re-exports it)
__all__ = ["__version__", *_formats.__all__,
           *[n for n in _attention.__all__ if n not in _formats.__all__]]

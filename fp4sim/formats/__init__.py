"""Element formats, block scaling, packing and scale layouts, block-scaled matmul emulation.

Everything here is written once against the array namespace (:mod:`fp4sim._xp`): NumPy arrays in
give NumPy arrays out; jax arrays (also under ``jax.jit``/``vmap``) give jax arrays with the same
bits.
"""

from fp4sim.formats.spec import *  # noqa: F401,F403
from fp4sim.formats import spec as _spec
from fp4sim.formats.codec import *  # noqa: F401,F403
from fp4sim.formats import codec as _codec
from fp4sim.formats.packing import *  # noqa: F401,F403
from fp4sim.formats import packing as _packing
from fp4sim.formats.layouts import *  # noqa: F401,F403
from fp4sim.formats import layouts as _layouts
from fp4sim.formats.blocks import *  # noqa: F401,F403
from fp4sim.formats import blocks as _blocks
from fp4sim.formats.presets import *  # noqa: F401,F403
from fp4sim.formats import presets as _presets
from fp4sim.formats.interop import *  # noqa: F401,F403
from fp4sim.formats import interop as _interop

__all__ = list(_spec.__all__) + list(_codec.__all__)
__all__ += list(_packing.__all__) + list(_layouts.__all__)
__all__ += list(_blocks.__all__) + list(_presets.__all__) + list(_interop.__all__)
# fp4sim.formats.matmul is imported explicitly (its Accumulation would clash with the attention
# backward's in the flat fp4sim namespace).

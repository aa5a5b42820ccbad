"""fp4sim on several devices, through JAX's own distributed engine (``jax.sharding``).

Two kinds of parallel work, each in its own module:

* :mod:`fp4sim.parallel.mesh`: one attention problem spread over a device mesh. The emulators
  run under ``jax.jit`` with ``NamedSharding`` placements on the batch, head and query axes; XLA's
  SPMD partitioner splits the work and inserts the collectives (a max all-reduce for a
  per-tensor amax, gathers where a step needs other rows). Every step of the emulators is either
  row-wise or an exact reduction (max, or an ordered sum along an axis that is never split), so the
  sharded result has the same bits as one device; ``tests/parallel`` checks it with 8 forced host
  devices.
* :mod:`fp4sim.parallel.sweep`: many independent cases (the report's route errors, the training
  study's runs) mapped over the local devices, one worker per device, and over the processes of a
  ``jax.distributed`` job, merged in case order into one result.
* :mod:`fp4sim.parallel.data`: data-parallel training gradients whose shard sum runs in a fixed
  order, so that N devices give the bits of one device accumulating N micro-batches.
"""

from fp4sim.parallel.data import (
    accumulated_value_and_grad,
    data_parallel_value_and_grad,
    ordered_sum,
)
from fp4sim.parallel.mesh import (
    AXES,
    attention_mesh,
    attention_shardings,
    shard_attention_inputs,
    sharded_attention_forward,
    sharded_emulated_attention,
)
from fp4sim.parallel.sweep import DeviceSpec, map_cases, parse_devices, resolve_devices

__all__ = [
    "AXES",
    "DeviceSpec",
    "accumulated_value_and_grad",
    "data_parallel_value_and_grad",
    "ordered_sum",
    "attention_mesh",
    "attention_shardings",
    "map_cases",
    "parse_devices",
    "resolve_devices",
    "shard_attention_inputs",
    "sharded_attention_forward",
    "sharded_emulated_attention",
]

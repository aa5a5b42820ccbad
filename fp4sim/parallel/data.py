"""Data-parallel gradients over a device mesh, with the bits of one device's accumulation.

A training step's loss is a sum over the examples of a batch. Split over ``n`` devices, the
gradient is a sum of ``n`` per-shard gradients, and the order of that sum decides the bits. An
all-reduce leaves the order to the collective (ring, tree, NCCL's choice), so a sharded step and
a single-device step differ in the last bits, and even two sharded runs on different device
counts do. Here the order is fixed instead:

* :func:`data_parallel_value_and_grad`: each device computes the value and gradient of its own
  shard (``jax.shard_map`` over the mesh axis), the per-shard results are all-gathered and summed
  left to right in shard order, ``((g0 + g1) + g2) + ...``, on every device;
* :func:`accumulated_value_and_grad`: the single-device reference, gradient accumulation over
  the same ``n`` micro-batches, summed in the same order.

The two give the same bits whenever the per-shard program computes a shard's gradient with the
same bits as the accumulation loop computes that micro-batch's (same shapes, same operations;
the tests check it on the CPU with 8 forced host devices for the study's transformer, with
float32 attention and with the emulated FP8 training route, over three Adam steps). Keep the
optimizer update a program of its own (one ``jax.jit`` shared by both runs): compiled into each
step, XLA fuses its float arithmetic differently in the two programs and may contract a multiply
and an add into one FMA in one of them, which changes the parameters' last bits. They do *not* equal a single device computing the whole batch in one
pass (its matrix products reduce over the whole batch in their own order); that run is a
different, equally valid float32 rounding of the same sum. The gather costs ``n`` copies of the
gradient per device, which is cheap for models of the study's size.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["accumulated_value_and_grad", "data_parallel_value_and_grad", "ordered_sum"]


def ordered_sum(xs: Sequence[Any]) -> Any:
    """``((xs[0] + xs[1]) + xs[2]) + ...``: a left fold, in this order (pytrees of arrays)."""
    import jax

    if not xs:
        raise ValueError("ordered_sum of nothing")
    total = xs[0]
    for x in xs[1:]:
        total = jax.tree_util.tree_map(lambda a, b: a + b, total, x)
    return total


def _check(fn: Any, n_batch_args: int, batch_axis: int) -> None:
    if not callable(fn):
        raise TypeError(f"fn={fn!r} must be callable: fn(params, *batch) -> scalar loss sum")
    if isinstance(n_batch_args, bool) or not isinstance(n_batch_args, int) or n_batch_args < 1:
        raise ValueError(f"n_batch_args={n_batch_args!r} must be an int >= 1")
    if isinstance(batch_axis, bool) or not isinstance(batch_axis, int) or batch_axis < 0:
        raise ValueError(f"batch_axis={batch_axis!r} must be an int >= 0")


def data_parallel_value_and_grad(fn: Callable[..., Any], *, mesh: Any, axis: str = "data",
                                 n_batch_args: int = 1,
                                 batch_axis: int = 0) -> Callable[..., tuple[Any, Any]]:
    """``f(params, *batch) -> (value, grads)`` of ``fn(params, *batch)`` (a scalar: the loss
    *summed* over the batch's examples), the batch split over ``mesh``'s ``axis`` along
    ``batch_axis`` of each of the ``n_batch_args`` batch arrays; params replicated. The values
    and gradients are summed in shard order (module docstring). Use inside ``jax.jit``."""
    import jax
    from jax.sharding import PartitionSpec as P

    _check(fn, n_batch_args, batch_axis)
    if axis not in mesh.axis_names:
        raise ValueError(f"axis={axis!r} is not an axis of the mesh {tuple(mesh.axis_names)}")
    spec = P(*([None] * batch_axis), axis)

    def per_shard(params: Any, *batch: Any) -> tuple[Any, Any]:
        value, grads = jax.value_and_grad(fn)(params, *batch)
        gathered = jax.tree_util.tree_map(lambda t: jax.lax.all_gather(t, axis),
                                          (value, grads))
        n = mesh.shape[axis]
        return ordered_sum([jax.tree_util.tree_map(lambda t, i=i: t[i], gathered)
                            for i in range(n)])

    return jax.shard_map(per_shard, mesh=mesh, in_specs=(P(), *([spec] * n_batch_args)),
                         out_specs=P(), check_vma=False)


def accumulated_value_and_grad(fn: Callable[..., Any], *, micro_batches: int,
                               n_batch_args: int = 1,
                               batch_axis: int = 0) -> Callable[..., tuple[Any, Any]]:
    """``f(params, *batch) -> (value, grads)`` on one device: the batch cut into
    ``micro_batches`` equal consecutive parts along ``batch_axis``, each part's value and
    gradient of ``fn``, summed in part order: the bits of :func:`data_parallel_value_and_grad`
    on a mesh axis of ``micro_batches`` devices."""
    import jax

    _check(fn, n_batch_args, batch_axis)
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1:
        raise ValueError(f"micro_batches={micro_batches!r} must be an int >= 1")

    def f(params: Any, *batch: Any) -> tuple[Any, Any]:
        if len(batch) != n_batch_args:
            raise ValueError(f"{len(batch)} batch arrays given; n_batch_args={n_batch_args}")
        size = batch[0].shape[batch_axis]
        if size % micro_batches:
            raise ValueError(f"batch of {size} along axis {batch_axis} does not split into "
                             f"{micro_batches} equal micro-batches")
        m = size // micro_batches
        parts = []
        for i in range(micro_batches):
            micro = [jax.lax.slice_in_dim(b, i * m, (i + 1) * m, axis=batch_axis) for b in batch]
            parts.append(jax.value_and_grad(fn)(params, *micro))
        return ordered_sum(parts)

    return f

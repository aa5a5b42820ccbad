"""One attention problem spread over a device mesh (``jax.sharding``), with one device's bits.

The mesh has three named axes, :data:`AXES` = ``("batch", "heads", "query")``. Inputs are
``(B, H, S, D)`` arrays: Q and the outputs are split over all three axes, K and V over batch and
heads only (every query row needs every key). The emulators run unchanged under ``jax.jit`` with
these placements; XLA's SPMD partitioner decides the per-device programs and inserts the
collectives. The bits cannot change: the emulators' steps are row-wise, or exact reductions (max,
integer exponents), or ordered float32 sums along the key axis, which is never split. A
per-tensor amax (NVFP4's global scale) becomes an all-reduce of a max, which is exact.

Entry points: :func:`attention_mesh` builds the mesh, :func:`attention_shardings` names the
placements, :func:`shard_attention_inputs` places arrays, :func:`sharded_attention_forward`
runs the emulated forward, :func:`sharded_emulated_attention` the training route (differentiable:
``jax.grad`` runs the emulated backward, sharded the same way).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from fp4sim._checks import check_int
from fp4sim.attention import AttentionRecipe, ForwardResult, TrainingRecipe

if TYPE_CHECKING:
    from jax.sharding import Mesh, NamedSharding

__all__ = [
    "AXES",
    "AttentionShardings",
    "attention_mesh",
    "attention_shardings",
    "shard_attention_inputs",
    "sharded_attention_forward",
    "sharded_emulated_attention",
]

AXES = ("batch", "heads", "query")
"""The mesh axis names, in the order of the ``(B, H, S, D)`` dimensions they split."""


class AttentionShardings(NamedTuple):
    """The placements of one attention problem on an :func:`attention_mesh`."""

    q: NamedSharding  # (B, H, Sq, D): batch, heads, query
    kv: NamedSharding  # (B, H, Skv, D): batch, heads (keys whole on every device)
    out: NamedSharding  # (B, H, Sq, Dv), like q
    lse: NamedSharding  # (B, H, Sq)
    replicated: NamedSharding  # segment ids and other small side inputs


def attention_mesh(
    *,
    batch: int | None = None,
    heads: int = 1,
    query: int = 1,
    devices: Sequence[Any] | None = None,
) -> Mesh:
    """A mesh of ``batch x heads x query`` devices with the axis names :data:`AXES`.

    ``devices`` defaults to ``jax.devices()``; ``batch`` defaults to what the other two leave
    (``len(devices) // (heads * query)``). The product must equal the number of devices."""
    import jax
    from jax.sharding import Mesh

    devs = list(jax.devices() if devices is None else devices)
    if not devs:
        raise ValueError("devices=[] : a mesh needs at least one device")
    heads = check_int("attention_mesh", "heads", heads, 1)
    query = check_int("attention_mesh", "query", query, 1)
    if batch is None:
        if len(devs) % (heads * query):
            raise ValueError(
                f"heads={heads} x query={query} does not divide the {len(devs)} "
                f"devices; pass batch= explicitly or other factors"
            )
        batch = len(devs) // (heads * query)
    batch = check_int("attention_mesh", "batch", batch, 1)
    if batch * heads * query != len(devs):
        raise ValueError(
            f"batch={batch} x heads={heads} x query={query} = "
            f"{batch * heads * query} devices, but {len(devs)} were given; the "
            f"product must equal the number of devices"
        )
    return Mesh(np.array(devs, dtype=object).reshape(batch, heads, query), AXES)


def _check_mesh(mesh: Any) -> None:
    from jax.sharding import Mesh

    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh={mesh!r} must be a jax.sharding.Mesh (see attention_mesh)")
    if tuple(mesh.axis_names) != AXES:
        raise ValueError(
            f"mesh axis names {tuple(mesh.axis_names)}; allowed: {AXES} "
            f"(build it with fp4sim.parallel.attention_mesh)"
        )


def attention_shardings(mesh: Mesh) -> AttentionShardings:
    """The :class:`AttentionShardings` of ``mesh`` (an :func:`attention_mesh`)."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    _check_mesh(mesh)
    return AttentionShardings(
        q=NamedSharding(mesh, P("batch", "heads", "query", None)),
        kv=NamedSharding(mesh, P("batch", "heads", None, None)),
        out=NamedSharding(mesh, P("batch", "heads", "query", None)),
        lse=NamedSharding(mesh, P("batch", "heads", "query")),
        replicated=NamedSharding(mesh, P()),
    )


def _check_shapes(mesh: Mesh, q: Any, k: Any, v: Any) -> None:
    for name, a in (("q", q), ("k", k), ("v", v)):
        shape = getattr(a, "shape", None)
        if shape is None or len(shape) != 4:
            raise ValueError(
                f"{name} must be a (batch, heads, seq, head_dim) array; got shape {shape}"
            )
    parts = dict(zip(AXES, (mesh.shape[a] for a in AXES)))
    for name, a in (("q", q), ("k", k), ("v", v)):
        for axis, dim in (("batch", 0), ("heads", 1)):
            if a.shape[dim] % parts[axis]:
                raise ValueError(
                    f"{name} has {a.shape[dim]} along {axis} (dim {dim}), not a "
                    f"multiple of the mesh's {parts[axis]} {axis} devices"
                )
    if q.shape[2] % parts["query"]:
        raise ValueError(
            f"q has {q.shape[2]} query rows, not a multiple of the mesh's "
            f"{parts['query']} query devices"
        )


def shard_attention_inputs(mesh: Mesh, q: Any, k: Any, v: Any) -> tuple[Any, Any, Any]:
    """``q, k, v`` placed on ``mesh`` (float32 jax arrays)."""
    import jax

    _check_mesh(mesh)
    _check_shapes(mesh, q, k, v)
    s = attention_shardings(mesh)
    return (
        jax.device_put(np.asarray(q, np.float32) if isinstance(q, np.ndarray) else q, s.q),
        jax.device_put(np.asarray(k, np.float32) if isinstance(k, np.ndarray) else k, s.kv),
        jax.device_put(np.asarray(v, np.float32) if isinstance(v, np.ndarray) else v, s.kv),
    )


@functools.lru_cache(maxsize=64)
def _forward_fn(
    recipe: AttentionRecipe,
    mesh: Mesh,
    causal: bool,
    softmax_scale: Any,
    segments: tuple[bool, bool],
) -> Any:
    import jax

    from fp4sim.attention import attention_forward

    s = attention_shardings(mesh)

    def f(q, k, v, qseg, kseg):
        r = attention_forward(
            q,
            k,
            v,
            recipe,
            causal=causal,
            softmax_scale=softmax_scale,
            q_segment_ids=qseg if segments[0] else None,
            kv_segment_ids=kseg if segments[1] else None,
        )
        return r.out, r.lse

    return jax.jit(
        f, in_shardings=(s.q, s.kv, s.kv, s.replicated, s.replicated), out_shardings=(s.out, s.lse)
    )


def sharded_attention_forward(
    q: Any,
    k: Any,
    v: Any,
    recipe: AttentionRecipe,
    *,
    mesh: Mesh,
    causal: bool = False,
    softmax_scale: float | None = None,
    q_segment_ids: Any = None,
    kv_segment_ids: Any = None,
) -> ForwardResult:
    """:func:`fp4sim.attention_forward` of ``(B, H, S, D)`` inputs on ``mesh``: O and LSE sharded
    like Q, bit-identical to one device. ``intermediates`` is None (ask one device for them)."""
    import jax.numpy as jnp

    if not isinstance(recipe, AttentionRecipe):
        raise TypeError(
            f"recipe={recipe!r} must be an AttentionRecipe (see fp4sim.attention.recipe.PRESETS)"
        )
    if not isinstance(causal, bool):
        raise TypeError(f"causal={causal!r} must be a bool")
    _check_mesh(mesh)
    _check_shapes(mesh, q, k, v)
    segments = (q_segment_ids is not None, kv_segment_ids is not None)
    qseg = jnp.zeros((), jnp.int32) if q_segment_ids is None else q_segment_ids
    kseg = jnp.zeros((), jnp.int32) if kv_segment_ids is None else kv_segment_ids
    out, lse = _forward_fn(recipe, mesh, causal, softmax_scale, segments)(q, k, v, qseg, kseg)
    return ForwardResult(out, lse, None)


def sharded_emulated_attention(
    q: Any,
    k: Any,
    v: Any,
    recipe: TrainingRecipe,
    *,
    mesh: Mesh,
    causal: bool = True,
    softmax_scale: float | None = None,
    segment_ids: Any = None,
) -> Any:
    """:func:`fp4sim.emulated_attention` with Q, K, V and O constrained to ``mesh``'s placements.

    Call it inside or outside ``jax.jit``; ``jax.grad`` runs the emulated backward with the same
    placements (the cotangents follow the constraints). Bit-identical to one device."""
    import jax

    from fp4sim.attention import emulated_attention

    if not isinstance(recipe, TrainingRecipe):
        raise TypeError(
            f"recipe={recipe!r} must be a TrainingRecipe (see "
            f"fp4sim.attention.recipe.TRAINING_PRESETS)"
        )
    _check_mesh(mesh)
    _check_shapes(mesh, q, k, v)
    s = attention_shardings(mesh)
    q = jax.lax.with_sharding_constraint(q, s.q)
    k = jax.lax.with_sharding_constraint(k, s.kv)
    v = jax.lax.with_sharding_constraint(v, s.kv)
    out = emulated_attention(
        q, k, v, recipe, softmax_scale=softmax_scale, causal=causal, segment_ids=segment_ids
    )
    return jax.lax.with_sharding_constraint(out, s.out)

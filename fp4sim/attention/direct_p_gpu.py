"""GPU kernels for the Direct-P forward (NVFP4 Q/K, Direct-P MXFP4 P, MXFP4 V), bit for bit.

This module owns the two Pallas kernels (Triton backend) that replace, where the forward is
lowered for a GPU, the chain of full-size XLA passes of :mod:`fp4sim.attention.forward` for the
Direct-P family (converters ``AffineP`` and ``MitchellP`` into MXFP4 P, MXFP4 V along tokens,
consistent normalization): scores, log2 scores and masks, tile maxima, ``t``, the block
exponent ``k_B``, the E2M1 payload encode, the PV partial products and their group sums, and the
rescale-and-add of the accumulator. The sequential online-softmax state is split so that
nothing the kernels cannot do exactly is inside them (the correctly rounded exp2 uses a table):

1. :func:`tile_maxima`: per query row and key tile the maximum ``m_t`` of the finite log2
   scores and whether a row holds a NaN or +Inf score;
2. (XLA, :mod:`fp4sim.attention.forward`) the running max, its anchors and ``r = exp2_rn(...)``
   per row and tile, from those maxima (the forward's own step-2 code);
3. :func:`accumulate`: per row, tile by tile, ``A ← fl(A·r)`` then the tile's PV group sums
   added in order, and per 32-key block the payload tree sum and ``k_B`` (the forward turns them
   into the tile denominators and ``L``, then O and LSE, with its own code).

Each step is the forward's float32 operation sequence (the emulator's functions where they
lower to Triton: :func:`fp4sim.attention.converters.direct_p_payload`,
:func:`fp4sim.formats.codec.decode`, :mod:`fp4sim.formats.f32`); the score block partials and
the PV sub-block products run on the tensor cores from bfloat16 copies, exact because every
value has at most 6 significant bits (E2M1 payload × UE4M3 scale, or × a power of two) and the
sums within a block are multiples of one unit far below 2^24 of them, as the CPU's float32
matrix products are. Scores are recomputed in step 3 instead of stored (cheaper than a
(rows × keys) round trip through memory).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from fp4sim.attention.converters import block_max_exponent, direct_p_coordinate, direct_p_payload
from fp4sim.formats import f32
from fp4sim.formats.codec import decode
from fp4sim.formats.spec import E2M1

__all__ = ["SUB", "QK_BLOCK", "rows_block", "tile_maxima", "accumulate"]

SUB = 32  # keys per P/V scale block (MXFP4 P and V): one PV sub-block
QK_BLOCK = 16  # head-dim elements per NVFP4 Q/K scale block


def rows_block(rows: int) -> int:
    """Query rows per kernel program (32 or 16), 0 when ``rows`` is not a multiple of 16."""
    return 32 if rows % 32 == 0 else (16 if rows % 16 == 0 else 0)


def _log2_scores(
    q_blocks: list,
    k_ref: Any,
    kp_ref: Any,
    qpost: Any,
    rows: Any,
    key0: Any,
    *,
    c: float,
    skv: int,
    sq: int,
    causal: bool,
) -> Any:
    """``u = fl(z·c)`` of these rows against keys key0 … key0+SUB−1, masked keys −inf: z the
    exact block partials added in block order, times the per-token factors (forward step 1-2)."""
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl

    z = None
    for b, qb in enumerate(q_blocks):
        kb = k_ref[0, pl.ds(key0, SUB), pl.ds(b * QK_BLOCK, QK_BLOCK)].astype(jnp.bfloat16)
        part = lax.dot_general(qb, kb, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
        z = part if z is None else z + part  # exact partials: never subnormal (forward)
    if qpost is not None:
        kpost = kp_ref[0, pl.ds(key0, SUB)]
        z = f32.mul_ftz(z, f32.mul_ftz(qpost[:, None], kpost[None, :]))
    cols = key0 + lax.broadcasted_iota(jnp.int32, (1, SUB), 1)
    valid = (cols < np.int32(skv)) & (rows[:, None] < np.int32(sq))
    if causal:
        valid = valid & (cols <= rows[:, None] + np.int32(skv - sq))
    return jnp.where(valid, f32.mul_ftz(z, np.float32(c)), np.float32(-np.inf))


def _q_blocks(q_ref: Any, d: int) -> list:
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    return [
        q_ref[0, :, pl.ds(b * QK_BLOCK, QK_BLOCK)].astype(jnp.bfloat16)
        for b in range(d // QK_BLOCK)
    ]


def _maxima_kernel(
    q_ref: Any,
    k_ref: Any,
    qp_ref: Any,
    kp_ref: Any,
    ids_ref: Any,
    mt_ref: Any,
    nan_ref: Any,
    *,
    d: int,
    ntu: int,
    tile: int,
    post: bool,
    **score: Any,
) -> None:
    import jax.numpy as jnp
    from jax import lax

    qbs = _q_blocks(q_ref, d)
    rows = ids_ref[0, :]
    qpost = qp_ref[0, :] if post else None

    def body(i: Any, nan: Any) -> Any:
        mt = None
        for s in range(tile // SUB):
            u = _log2_scores(qbs, k_ref, kp_ref, qpost, rows, i * tile + s * SUB, **score)
            bad = jnp.isnan(u) | (u == np.float32(np.inf))
            nan = jnp.maximum(nan, jnp.max(bad.astype(jnp.int32), axis=-1))
            m = jnp.max(jnp.where(bad, np.float32(-np.inf), u), axis=-1)
            mt = m if mt is None else jnp.maximum(mt, m)
        mt_ref[0, i, :] = mt
        return nan

    nan_ref[0, :] = lax.fori_loop(0, ntu, body, jnp.zeros(rows.shape, jnp.int32))


def _tree_sum(x: Any) -> Any:
    """:func:`fp4sim.formats.f32.tree_sum_ftz` over the last axis (a power of two) by reshapes:
    adjacent pairs first, each pair one float32 add, flushed."""
    import jax.numpy as jnp

    while x.shape[-1] > 1:
        x = f32.ftz(jnp.sum(jnp.reshape(x, x.shape[:-1] + (x.shape[-1] // 2, 2)), axis=-1))
    return x[..., 0]


def _accumulate_kernel(
    q_ref: Any,
    k_ref: Any,
    qp_ref: Any,
    kp_ref: Any,
    ids_ref: Any,
    v_ref: Any,
    safe_ref: Any,
    fin_ref: Any,
    r_ref: Any,
    acc_ref: Any,
    sums_ref: Any,
    kb_ref: Any,
    *,
    d: int,
    ntu: int,
    tile: int,
    post: bool,
    converter: Any,
    ceil_rule: bool,
    factor_exp: int,
    per_group: int,
    dv: int,
    **score: Any,
) -> None:
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl

    qbs = _q_blocks(q_ref, d)
    rows = ids_ref[0, :]
    qpost = qp_ref[0, :] if post else None
    nsub = tile // SUB

    def body(i: Any, acc: Any) -> Any:
        safe = safe_ref[0, i, :]
        fin = fin_ref[0, i, :] != 0
        acc = f32.mul_ftz(acc, r_ref[0, i, :][:, None])
        g = None
        for s in range(nsub):
            key0 = i * tile + s * SUB
            u = _log2_scores(qbs, k_ref, kp_ref, qpost, rows, key0, **score)
            t = jnp.where(fin[:, None], u - safe[:, None], np.float32(-np.inf))
            if ceil_rule:
                kb = block_max_exponent(t[:, None, :])[:, 0]
            else:
                kb = jnp.zeros(rows.shape, jnp.int32)
            codes = direct_p_payload(converter, direct_p_coordinate(t, kb[:, None]))
            vals = decode(codes, E2M1)
            sums_ref[0, i * nsub + s, :] = _tree_sum(vals)
            kb_ref[0, i * nsub + s, :] = kb
            pv = f32.ldexp_ftz(vals, (kb + np.int32(factor_exp))[:, None])
            vv = v_ref[0, pl.ds(key0, SUB), :]
            part = f32.ftz(
                lax.dot_general(
                    pv.astype(jnp.bfloat16),
                    vv.astype(jnp.bfloat16),
                    (((1,), (0,)), ((), ())),
                    preferred_element_type=jnp.float32,
                )
            )
            g = part if s % per_group == 0 else f32.add_ftz(g, part)
            if s % per_group == per_group - 1:
                acc = f32.add_ftz(acc, g)
        return acc

    acc_ref[0] = lax.fori_loop(0, ntu, body, jnp.zeros((rows.shape[0], dv), jnp.float32))


def _specs(bm: int, d: int, ku: int, post: bool) -> list:
    """Q (a row block), K (every key), the per-token factors and the row ids."""
    from jax.experimental import pallas as pl

    del post  # the factors' placeholders have the same shapes
    q = pl.BlockSpec((1, bm, d), lambda n, i: (n, i, 0))
    k = pl.BlockSpec((1, ku, d), lambda n, i: (n, 0, 0))
    qp = pl.BlockSpec((1, bm), lambda n, i: (n, i))
    kp = pl.BlockSpec((1, ku), lambda n, i: (n, 0))
    ids = pl.BlockSpec((1, bm), lambda n, i: (n, i))
    return [q, k, qp, kp, ids]


def _params() -> Any:
    from jax.experimental.pallas import triton as pltriton

    return pltriton.CompilerParams(num_warps=4, num_stages=1)


def _common(qv: Any, kv: Any, qpost: Any, kpost: Any, row_ids: Any) -> tuple:
    import jax.numpy as jnp

    nb, rows, d = qv.shape
    ku = kv.shape[-2]
    post = qpost is not None
    if not post:  # placeholders (unused in the kernel)
        qpost = jnp.zeros((nb, rows), jnp.float32)
        kpost = jnp.zeros((nb, ku), jnp.float32)
    ids = jnp.broadcast_to(jnp.asarray(row_ids, jnp.int32), (nb, rows))
    return (qv, kv, qpost, kpost, ids), post


def tile_maxima(
    qv: Any,
    kv: Any,
    qpost: Any,
    kpost: Any,
    row_ids: Any,
    *,
    c: float,
    skv: int,
    sq: int,
    causal: bool,
    tile: int,
    ntu: int,
    interpret: bool = False,
) -> tuple[Any, Any]:
    """Step 1 (module docstring) for a batch of query rows: ``qv`` (B, R, D) and ``kv``
    (B, Ku, D) NVFP4 values (payload × UE4M3 scale), ``qpost``/``kpost`` (B, R)/(B, Ku) the
    per-token factors or None, ``row_ids`` (R,) the rows' indices. Returns the tile maxima
    (B, ntu, R) float32 and the NaN-row flags (B, R) int32."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    args, post = _common(qv, kv, qpost, kpost, row_ids)
    nb, rows, d = qv.shape
    bm = rows_block(rows)
    kern = functools.partial(
        _maxima_kernel,
        d=d,
        ntu=ntu,
        tile=tile,
        post=post,
        c=float(c),
        skv=skv,
        sq=sq,
        causal=causal,
    )
    return pl.pallas_call(
        kern,
        grid=(nb, rows // bm),
        in_specs=_specs(bm, d, kv.shape[-2], post),
        out_specs=[
            pl.BlockSpec((1, ntu, bm), lambda n, i: (n, 0, i)),
            pl.BlockSpec((1, bm), lambda n, i: (n, i)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct((nb, ntu, rows), jnp.float32),
            jax.ShapeDtypeStruct((nb, rows), jnp.int32),
        ],
        interpret=interpret,
        compiler_params=_params(),
        name="fp4sim_direct_p_maxima",
    )(*args)


def accumulate(
    qv: Any,
    kv: Any,
    qpost: Any,
    kpost: Any,
    row_ids: Any,
    vv: Any,
    safe: Any,
    finite: Any,
    r: Any,
    *,
    c: float,
    skv: int,
    sq: int,
    causal: bool,
    tile: int,
    ntu: int,
    converter: Any,
    ceil_rule: bool,
    factor_exp: int,
    pv_group: int,
    interpret: bool = False,
) -> tuple[Any, Any, Any]:
    """Step 3 (module docstring): ``vv`` (B, Ku, Dv) the V values with their block scales
    applied (flushed), ``safe``/``finite``/``r`` (B, ntu, R) each tile's anchor (0 where none),
    whether it is finite, and the rescale factor. Returns the numerator A (B, R, Dv) in the
    converter's units and, per 32-key block in key order, the E2M1 payload tree sums and
    ``k_B`` (B, ntu·tile/32, R)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    args, post = _common(qv, kv, qpost, kpost, row_ids)
    nb, rows, d = qv.shape
    ku, dv = vv.shape[-2:]
    bm = rows_block(rows)
    nblk = ntu * tile // SUB
    kern = functools.partial(
        _accumulate_kernel,
        d=d,
        ntu=ntu,
        tile=tile,
        post=post,
        converter=converter,
        ceil_rule=ceil_rule,
        factor_exp=factor_exp,
        per_group=pv_group // SUB,
        dv=dv,
        c=float(c),
        skv=skv,
        sq=sq,
        causal=causal,
    )
    state = pl.BlockSpec((1, ntu, bm), lambda n, i: (n, 0, i))
    return pl.pallas_call(
        kern,
        grid=(nb, rows // bm),
        in_specs=_specs(bm, d, ku, post)
        + [pl.BlockSpec((1, ku, dv), lambda n, i: (n, 0, 0)), state, state, state],
        out_specs=[
            pl.BlockSpec((1, bm, dv), lambda n, i: (n, i, 0)),
            pl.BlockSpec((1, nblk, bm), lambda n, i: (n, 0, i)),
            pl.BlockSpec((1, nblk, bm), lambda n, i: (n, 0, i)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct((nb, rows, dv), jnp.float32),
            jax.ShapeDtypeStruct((nb, nblk, rows), jnp.float32),
            jax.ShapeDtypeStruct((nb, nblk, rows), jnp.int32),
        ],
        interpret=interpret,
        compiler_params=_params(),
        name="fp4sim_direct_p_accumulate",
    )(*args, vv, safe, jnp.asarray(finite, jnp.int32), r)

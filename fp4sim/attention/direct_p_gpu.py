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

Parallelism (:func:`key_chunk`): one program per row block walking every key tile leaves most
of the GPU idle when there are few row blocks (S4096, one head: 128 programs of 32 rows on 132
SMs). Then the key tiles are split into chunks, one program per (row block, chunk): the maxima
are per tile anyway; the accumulator's programs write each tile's PV group sums (in memory,
bounded by ``_MAX_SPLIT_BYTES``) and a third kernel (the fold) walks the tiles in order,
``A ← fl(A·r)`` and the group sums added, the same float32 operations in the same order.

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
        # exact partials, never subnormal (forward): the flush is the identity on them and
        # keeps every add out of an MMA's accumulator (ordered_gpu._scores_kernel says why)
        part = f32.ftz(part)
        z = part if z is None else z + part
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
    chunk: int,
    tile: int,
    post: bool,
    **score: Any,
) -> None:
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl

    qbs = _q_blocks(q_ref, d)
    rows = ids_ref[0, :]
    qpost = qp_ref[0, :] if post else None
    first = pl.program_id(2) * chunk  # this program's first key tile

    def body(j: Any, nan: Any) -> Any:
        mt = None
        for s in range(tile // SUB):
            key0 = (first + j) * tile + s * SUB
            u = _log2_scores(qbs, k_ref, kp_ref, qpost, rows, key0, **score)
            bad = jnp.isnan(u) | (u == np.float32(np.inf))
            nan = jnp.maximum(nan, jnp.max(bad.astype(jnp.int32), axis=-1))
            m = jnp.max(jnp.where(bad, np.float32(-np.inf), u), axis=-1)
            mt = m if mt is None else jnp.maximum(mt, m)
        mt_ref[0, j, :] = mt
        return nan

    nan_ref[0, 0, :] = lax.fori_loop(0, chunk, body, jnp.zeros(rows.shape, jnp.int32))


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
    out_ref: Any,
    sums_ref: Any,
    kb_ref: Any,
    *,
    d: int,
    chunk: int,
    split: bool,
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
    ngt = nsub // per_group  # PV groups per key tile
    first = pl.program_id(2) * chunk  # this program's first key tile

    def body(j: Any, acc: Any) -> Any:
        i = first + j
        safe = safe_ref[0, j, :]
        fin = fin_ref[0, j, :] != 0
        if not split:
            acc = f32.mul_ftz(acc, r_ref[0, j, :][:, None])
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
            sums_ref[0, j * nsub + s, :] = _tree_sum(vals)
            kb_ref[0, j * nsub + s, :] = kb
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
                if split:  # the group sum, added in order by _fold_kernel
                    out_ref[0, j * ngt + s // per_group, :, :] = g
                else:
                    acc = f32.add_ftz(acc, g)
        return acc

    acc = lax.fori_loop(0, chunk, body, jnp.zeros((rows.shape[0], dv), jnp.float32))
    if not split:
        out_ref[0] = acc


def _fold_kernel(r_ref: Any, g_ref: Any, acc_ref: Any, *, ntu: int, ngt: int) -> None:
    """``A ← fl(A·r_i)`` then tile i's group sums added in order (flushed), i = 0 … ntu−1:
    the accumulator of :func:`_accumulate_kernel` from the group sums its split programs wrote."""
    import jax.numpy as jnp
    from jax import lax

    def body(i: Any, acc: Any) -> Any:
        acc = f32.mul_ftz(acc, r_ref[0, i, :][:, None])
        for gi in range(ngt):
            acc = f32.add_ftz(acc, g_ref[0, i * ngt + gi, :, :])
        return acc

    init = jnp.zeros(acc_ref.shape[1:], jnp.float32)
    acc_ref[0] = lax.fori_loop(0, ntu, body, init)


def _specs(bm: int, d: int, ku: int, post: bool) -> list:
    """Q (a row block), K (every key), the per-token factors and the row ids, on the grid
    (batch, row block, key chunk)."""
    from jax.experimental import pallas as pl

    del post  # the factors' placeholders have the same shapes
    q = pl.BlockSpec((1, bm, d), lambda n, i, c: (n, i, 0))
    k = pl.BlockSpec((1, ku, d), lambda n, i, c: (n, 0, 0))
    qp = pl.BlockSpec((1, bm), lambda n, i, c: (n, i))
    kp = pl.BlockSpec((1, ku), lambda n, i, c: (n, 0))
    ids = pl.BlockSpec((1, bm), lambda n, i, c: (n, i))
    return [q, k, qp, kp, ids]


_TARGET_PROGRAMS = 1024  # about 8 per H200 SM: the key tiles are split until there are this many
_MAX_SPLIT_BYTES = 1 << 28  # the split accumulator's group sums in memory at most (256 MiB)


def key_chunk(nb: int, rows: int, ntu: int, per_tile: int = 0) -> int:
    """Key tiles per program: the largest divisor of ``ntu`` that still gives
    :data:`_TARGET_PROGRAMS` programs over (batch, row block, key chunk), ``ntu`` (no split)
    when the row blocks alone give them or none does. ``per_tile`` (bytes of one key tile's
    split output, the accumulator's group sums; 0 for the maxima) bounds a split by
    :data:`_MAX_SPLIT_BYTES`."""
    bm = rows_block(rows)
    programs = nb * (rows // bm)
    if programs >= _TARGET_PROGRAMS or per_tile * ntu > _MAX_SPLIT_BYTES:
        return ntu
    best = ntu
    for c in range(ntu, 0, -1):
        if ntu % c == 0:
            best = c
            if programs * (ntu // c) >= _TARGET_PROGRAMS:
                break
    return best


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
    chunk = key_chunk(nb, rows, ntu)
    nc = ntu // chunk
    kern = functools.partial(
        _maxima_kernel,
        d=d,
        chunk=chunk,
        tile=tile,
        post=post,
        c=float(c),
        skv=skv,
        sq=sq,
        causal=causal,
    )
    mt, nan = pl.pallas_call(
        kern,
        grid=(nb, rows // bm, nc),
        in_specs=_specs(bm, d, kv.shape[-2], post),
        out_specs=[
            pl.BlockSpec((1, chunk, bm), lambda n, i, c: (n, c, i)),
            pl.BlockSpec((1, 1, bm), lambda n, i, c: (n, c, i)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct((nb, ntu, rows), jnp.float32),
            jax.ShapeDtypeStruct((nb, nc, rows), jnp.int32),
        ],
        interpret=interpret,
        compiler_params=_params(),
        name="fp4sim_direct_p_maxima",
    )(*args)
    return mt, jnp.max(nan, axis=1)


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
    from jax.experimental.pallas import triton as pltriton

    args, post = _common(qv, kv, qpost, kpost, row_ids)
    nb, rows, d = qv.shape
    ku, dv = vv.shape[-2:]
    bm = rows_block(rows)
    nblk = ntu * tile // SUB
    nsub = tile // SUB
    ngt = tile // pv_group
    chunk = key_chunk(nb, rows, ntu, per_tile=nb * rows * ngt * dv * 4)
    nc = ntu // chunk
    split = nc > 1
    kern = functools.partial(
        _accumulate_kernel,
        d=d,
        chunk=chunk,
        split=split,
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
    state = pl.BlockSpec((1, chunk, bm), lambda n, i, c: (n, c, i))
    blocks = pl.BlockSpec((1, chunk * nsub, bm), lambda n, i, c: (n, c, i))
    if split:  # each program's group sums, folded in tile order by _fold_kernel
        first = (
            pl.BlockSpec((1, chunk * ngt, bm, dv), lambda n, i, c: (n, c, i, 0)),
            jax.ShapeDtypeStruct((nb, ntu * ngt, rows, dv), jnp.float32),
        )
    else:
        first = (
            pl.BlockSpec((1, bm, dv), lambda n, i, c: (n, i, 0)),
            jax.ShapeDtypeStruct((nb, rows, dv), jnp.float32),
        )
    out, sums, kb = pl.pallas_call(
        kern,
        grid=(nb, rows // bm, nc),
        in_specs=_specs(bm, d, ku, post)
        + [pl.BlockSpec((1, ku, dv), lambda n, i, c: (n, 0, 0)), state, state, state],
        out_specs=[first[0], blocks, blocks],
        out_shape=[
            first[1],
            jax.ShapeDtypeStruct((nb, nblk, rows), jnp.float32),
            jax.ShapeDtypeStruct((nb, nblk, rows), jnp.int32),
        ],
        interpret=interpret,
        compiler_params=_params(),
        name="fp4sim_direct_p_accumulate",
    )(*args, vv, safe, jnp.asarray(finite, jnp.int32), r)
    if not split:
        return out, sums, kb
    fm, fd = _FOLD_BLOCK
    fm, fd = min(fm, bm), min(fd, dv)
    acc = pl.pallas_call(
        functools.partial(_fold_kernel, ntu=ntu, ngt=ngt),
        grid=(nb, rows // fm, dv // fd),
        in_specs=[
            pl.BlockSpec((1, ntu, fm), lambda n, i, j: (n, 0, i)),
            pl.BlockSpec((1, ntu * ngt, fm, fd), lambda n, i, j: (n, 0, i, j)),
        ],
        out_specs=pl.BlockSpec((1, fm, fd), lambda n, i, j: (n, i, j)),
        out_shape=jax.ShapeDtypeStruct((nb, rows, dv), jnp.float32),
        interpret=interpret,
        compiler_params=pltriton.CompilerParams(num_warps=2, num_stages=3),
        name="fp4sim_direct_p_fold",
    )(r, out)
    return acc, sums, kb


_FOLD_BLOCK = (32, 32)  # rows × columns of the accumulator per program of the fold

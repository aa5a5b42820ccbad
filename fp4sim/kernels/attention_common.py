"""The warp-specialised attention-forward pipeline shared by fp4sim's Hopper attention kernels.

This module owns the data movement and synchronisation of a FlashAttention-3-style forward
written for Pallas Mosaic GPU, independent of the number formats: a CTA owns ``2·block_q``
query rows of one head; warpgroups 0 and 1 compute ``block_q`` rows each, warpgroup 2 issues
TMA copies of the K tile, the Vᵀ tile and an optional per-key "column" tile (scales, exponents)
into a ``max_concurrent_steps``-deep ring guarded by loaded/consumed barriers; a schedule barrier
ping-pongs the compute warpgroups so one's softmax overlaps the other's tensor-core work; causal
CTAs run an unmasked loop, a masked loop and an epilogue that keeps the barrier protocol in step.
The structure follows jax's ``experimental/pallas/ops/gpu/attention_mgpu.py``; unlike it, every
operand the tensor core reads is in shared memory (the P tile is staged there, each PV product
goes into a fresh accumulator added in registers) and the memory warpgroup observes the last
consumed phases, so the same kernel runs on the H200 and in GPU interpret mode on the CPU.

A kernel plugs in its numerics with a :class:`TileMath`: the per-tile softmax/quantization step
(:class:`StepContext` → :class:`StepResult`) and the epilogue. Each matrix product is one local
function (``qk`` and ``pv`` below) so a Blackwell ``tcgen05`` body can replace it.

Blackwell (sm_100a) bodies: with ``mma=``:class:`BlockScaledMma` the two matmul sites become
block-scaled ``tcgen05.mma`` into TMEM accumulators (one ``128 x 128`` float32 TMEM region per
compute warpgroup, shared by S and the PV tile, which are never live at once): Q, K, P and Vᵀ
are element codes in shared memory (E4M3 or E2M1), their block scales travel in the 128x4
layout ``plgpu.async_copy_scales_to_tmem`` copies into TMEM
(:func:`fp4sim.formats.layouts.to_mosaic_tmem`): Q's once per warpgroup, K's and V's with
their tiles (same TMA barriers), and P's, which the step computes per row and 32-key block
(:attr:`StepResult.p_scales`), written by each thread into shared memory in that layout. Each
warpgroup owns 128 query rows (the MMA's M); the barrier protocol, the ring and the causal
loops are the Hopper ones. These bodies have only been compiled (cross-lowered for sm_100a,
their PTX instructions assembled by ``ptxas -arch=sm_100a``), never run.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "BlockScaledMma",
    "StepContext",
    "StepResult",
    "TileMath",
    "build_forward",
    "pow2_f32",
    "ceil_f32",
    "floor_f32",
    "check_qkv_shapes",
    "pipeline_recipe_problems",
]


class StepContext(NamedTuple):
    """What the per-tile step sees (all arrays in registers, WGMMA layouts)."""

    s: Any  # (block_q, block_kv) float32 scores Q·Kᵀ of the operands as stored
    cols: Callable[[], tuple]  # loads this tile's per-key column vectors (block_kv,), one per
    # column-input row, from SMEM (a call, so a step that reads only scalars loads nothing)
    col_ref: Any  # this slot's column tile in SMEM (n_columns, block_kv), for scalar reads
    visible: Any  # (block_q, block_kv) bool on masked (causal diagonal) tiles, else None
    rows: Any  # per-row input vector (block_q,) or None
    kv_step: Any  # the key-tile index
    key_iota: Any  # callable: (block_q, block_kv) int32 column index within the tile


class StepResult(NamedTuple):
    """What the per-tile step returns."""

    p: Any  # (block_q, block_kv) P operand, already in the P dtype
    l_tile: Any  # (block_q,) float32 normalizer contribution of the tile or None (then 1)
    m: Any  # (block_q,) new running max
    beta: Any  # (block_q,) factor applied to the accumulator and normalizer before adding
    pv_scale: Any  # (block_q,) factor applied to this tile's P·V product, or None (then 1)
    state: tuple  # new extra per-row state vectors
    debug: tuple  # per-row vectors dumped with P at the debug step (the normalizer follows)
    l_sums: Any = None  # with block sums: callable (block_q, 8) per-block sums of P -> l_tile
    p_scales: tuple = ()  # Blackwell: block_kv/32 (block_q,) int32 E8M0 codes of P's blocks


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class BlockScaledMma:
    """The Blackwell (``tcgen05``) matmul sites of :func:`build_forward`.

    ``qk_scale`` the dtype of Q's and K's block scales (``float8_e8m0fnu`` per 32 or
    ``float8_e4m3fn`` per 16 along D), ``qk_block`` their block; P and V always carry
    ``float8_e8m0fnu`` per 32 keys. ``v_dim`` the head dimension of V and O (Q and K may be
    zero-padded beyond it: block-scaled MXFP8 needs K a multiple of 128 in Mosaic GPU).
    """

    qk_scale: Any
    qk_block: int
    v_dim: int

    def __post_init__(self) -> None:
        if self.qk_block not in (16, 32):
            raise ValueError(f"BlockScaledMma.qk_block={self.qk_block!r}; allowed: 16, 32")
        if self.v_dim not in (64, 128):
            raise ValueError(f"BlockScaledMma.v_dim={self.v_dim!r}; allowed: 64, 128")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TileMath:
    """The numerics a kernel plugs into :func:`build_forward`.

    ``step(ctx, m, state) -> StepResult``; ``finish(acc, l, m, state, rows) -> (o, lse)``
    (float32 ``o`` (block_q, D) and ``lse`` (block_q,)); ``state_init`` the initial values of
    the extra per-row state; ``n_debug`` how many row vectors ``StepResult.debug`` holds (the
    kernel dumps them followed by the updated normalizer ``l``).
    """

    step: Callable[..., StepResult]
    finish: Callable[..., tuple[Any, Any]]
    state_init: tuple[float, ...] = ()
    n_debug: int = 2


# --- float32 helpers the kernels' tile math shares (Mosaic GPU lowers these) ----------------
def pow2_f32(e: Any) -> Any:
    """2^e as float32 for int32 e in [-126, 127], built from the exponent bits."""
    import jax.numpy as jnp
    from jax import lax

    return lax.bitcast_convert_type((e.astype(jnp.int32) + 127) << 23, jnp.float32)


def ceil_f32(x: Any) -> Any:
    """⌈x⌉ with round-to-nearest-even and a comparison (Mosaic GPU has no floor/ceil rule)."""
    import jax.numpy as jnp
    from jax import lax

    r = lax.round(x, lax.RoundingMethod.TO_NEAREST_EVEN)
    return r + jnp.where(r < x, 1.0, 0.0).astype(x.dtype)


def floor_f32(x: Any) -> Any:
    """⌊x⌋ with round-to-nearest-even and a comparison (as :func:`ceil_f32`)."""
    import jax.numpy as jnp
    from jax import lax

    r = lax.round(x, lax.RoundingMethod.TO_NEAREST_EVEN)
    return r - jnp.where(r > x, 1.0, 0.0).astype(x.dtype)


def pipeline_recipe_problems(recipe: Any) -> list[str]:
    """What keeps ``recipe`` (an :class:`~fp4sim.attention.recipe.AttentionRecipe`) from the
    online-softmax pipeline every attention kernel body shares: consistent normalization,
    rescale threshold 0 (every tile rescales), no Hadamard rotation. Empty when it fits."""
    from fp4sim.attention.recipe import Normalization

    problems = []
    if recipe.normalization is not Normalization.CONSISTENT:
        problems.append("normalization must be CONSISTENT")
    if recipe.rescale_threshold != 0.0 or recipe.hadamard:
        problems.append("rescale_threshold must be 0 and hadamard False")
    return problems


def check_qkv_shapes(qs: tuple, ks: tuple, vs: tuple) -> None:
    """The attention kernels' layout check: Q (B, T, Hq, D), K and V (B, S, Hkv, D) with
    Hq a multiple of Hkv (GQA), D 64 or 128, at least one token; ``ValueError`` naming the
    shapes otherwise."""
    if len(qs) != 4 or len(ks) != 4 or len(vs) != 4:
        raise ValueError(f"q, k, v must be 4-D (B, T, H, D); got shapes {qs}, {ks}, {vs}")
    if tuple(ks) != tuple(vs):
        raise ValueError(f"k shape {ks} and v shape {vs} must match")
    b, t, hq, d = qs
    if ks[0] != b or ks[3] != d:
        raise ValueError(f"k shape {ks} must share batch and head_dim with q shape {qs}")
    if hq % ks[2]:
        raise ValueError(f"q heads {hq} must be a multiple of kv heads {ks[2]} (GQA)")
    if d not in (64, 128):
        raise ValueError(f"head_dim={d} is not supported; allowed: 64, 128")
    for name, n in (("q tokens", t), ("kv tokens", ks[1])):
        if n < 1:
            raise ValueError(f"{name}={n} must be at least 1")


def _when(cond: Any, fn: Callable[[], None]) -> None:
    """``pl.when`` for traced conditions, plain Python for static ones."""
    from jax.experimental import pallas as pl

    if isinstance(cond, (bool, np.bool_)):
        if cond:
            fn()
    else:
        pl.when(cond)(fn)


def _store_p_scale_words(words: Any, ref: Any, layout: Any) -> None:
    """Write the per-row words ``words`` (block_q = 128,) int32 (four E8M0 codes of one row,
    block 0 in the low byte) into the SMEM scale tile ``ref`` (1, 1, 32, 16) in the layout
    ``async_copy_scales_to_tmem`` reads (:func:`fp4sim.formats.layouts.to_mosaic_tmem`: row r
    at word ``(r % 32)·4 + r // 32``). Pallas has no store with that permutation, so each thread
    stores its rows' words itself (``plgpu.inline_mgpu``); lanes replicating a row store the
    same word."""
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith, llvm, vector
    from jax.experimental.mosaic.gpu import utils as mgpu_utils
    from jax.experimental.pallas import mosaic_gpu as plgpu

    @plgpu.inline_mgpu(arg_types=(layout, plgpu.RefType()))
    def store(ctx, x, smem):
        del ctx
        i32 = ir.IntegerType.get_signless(32)
        ptr = mgpu_utils.memref_ptr(smem)
        for reg, idx in zip(x.registers.flat, x.layout.thread_idxs(x.shape), strict=True):
            row = arith.index_cast(i32, idx[0])
            word = arith.addi(
                arith.muli(arith.remui(row, mgpu_utils.c(32, i32)), mgpu_utils.c(4, i32)),
                arith.divui(row, mgpu_utils.c(32, i32)),
            )
            elem = mgpu_utils.getelementptr(ptr, [word], i32)
            val = vector.extract(reg, dynamic_position=[], static_position=[0])
            llvm.store(val, elem)

    store(words, ref)


def build_forward(
    *,
    q_shape: tuple,
    k_shape: tuple,
    in_dtype: Any,
    p_dtype: Any,
    out_dtype: Any,
    block_q: int,
    block_kv: int,
    max_concurrent_steps: int,
    causal: bool,
    n_columns: int,
    row_input: bool,
    math: TileMath,
    debug_step: int | None,
    skip_pv: bool = False,
    kv_len: int | None = None,
    block_sums: bool = False,
    mma: BlockScaledMma | None = None,
) -> Callable[..., Any]:
    """A function ``(q, k, vt, rows, cols) -> [o, lse, (dbg_p, dbg_rows)]`` running the kernel.

    Shapes: ``q`` (B, T, Hq, D), ``k`` (B, S, Hkv, D), ``vt`` (B, Hkv, D, S) in ``in_dtype``;
    ``rows`` (B, Hq, T) float32 or None; ``cols`` (B, Hkv, n_columns, S) float32 or None.
    Outputs ``o`` (B, T, Hq, D) ``out_dtype``, ``lse`` (B, Hq, T) float32 and, with a debug step,
    P of that key tile (B, Hq, T, block_kv) ``p_dtype`` and the debug rows (B, Hq, n + 1, T):
    ``StepResult.debug`` then the normalizer after the tile.

    ``T`` must be a multiple of ``2·block_q`` and ``S`` of ``block_kv`` (callers pad);
    ``kv_len`` (default ``S``) is the number of real keys: when it is smaller, the last key tile
    is a *masked tail tile* (keys ``>= kv_len`` invisible, on top of the causal mask), so the
    padding never reaches the softmax. Padded query rows produce rows the caller drops.

    ``block_sums``: the PV product also sums P over each 32-key block on the tensor core: the
    Vᵀ tile in shared memory gets 8 extra rows, loaded once per slot from ``ind`` (8, block_kv)
    (row b is 1 on the keys of block b), so the accumulator's columns ``D..D+7`` hold the block
    sums; the step's ``StepResult.l_sums`` turns them into the tile's normalizer.

    ``mma`` (Blackwell, see the module docstring): ``block_q = block_kv = 128``; the function
    is ``(q, k, vt, q_scales, k_scales, v_scales) -> [o, lse, ...]`` with ``vt`` (B, Hkv,
    v_dim, S), the scales in the Mosaic TMEM layout: ``q_scales`` (B, Hq, T/128, D/qk_block/4,
    32, 16), ``k_scales`` (B, Hkv, S/128, D/qk_block/4, 32, 16), ``v_scales`` (B, Hkv, 1,
    S/128, 32, 16) (V's rows zero-padded to 128), and O (B, T, Hq, v_dim).
    """
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    from fp4sim.kernels.harness import smem_transforms

    batch_size, t_len, hq, d = q_shape
    _, s_len, hkv, _ = k_shape
    bq, bkv = block_q, block_kv
    n_kv = s_len // bkv
    if t_len % (2 * bq) or s_len % bkv or n_kv < 1:
        raise ValueError(
            f"build_forward: T={t_len} must be a multiple of 2·block_q={2 * bq} and "
            f"S={s_len} a positive multiple of block_kv={bkv} (pad the inputs)"
        )
    kv_len = s_len if kv_len is None else kv_len
    if not (n_kv - 1) * bkv < kv_len <= s_len:
        raise ValueError(
            f"build_forward: kv_len={kv_len} must lie in the last key tile "
            f"({(n_kv - 1) * bkv}, {s_len}]"
        )
    tc = mma is not None  # Blackwell tcgen05 matmul sites
    if tc:
        if not isinstance(mma, BlockScaledMma):
            raise TypeError(f"build_forward: mma={mma!r} must be a BlockScaledMma or None")
        if bq != 128 or bkv != 128 or n_columns or row_input or block_sums or skip_pv:
            raise ValueError(
                "build_forward: the tcgen05 bodies need block_q = block_kv = 128 and no "
                "column/row inputs, block sums or ablation"
            )
        if d % (4 * mma.qk_block) or d < mma.v_dim:
            raise ValueError(f"build_forward: D={d} must be a multiple of {4 * mma.qk_block}")
    dv = mma.v_dim if tc else d  # head dimension of V and O
    tail = kv_len < s_len  # the last key tile is masked
    slots = min(max_concurrent_steps, n_kv)
    block_sums = block_sums and not skip_pv
    ext = 8 if block_sums else 0  # extra Vᵀ rows (the block indicators)
    heads_per_kv = hq // hkv
    f32 = jnp.float32
    debug = debug_step is not None
    n_dbg = math.n_debug + 1
    acc_layout = plgpu.Layout.TCGEN05 if tc else plgpu.Layout.WGMMA
    row_layout = acc_layout.reduce(1)
    col_layout = acc_layout.reduce(0)
    wgmma_layout = acc_layout
    o_in_q = np.dtype(out_dtype) == np.dtype(in_dtype)  # stage O in Q's buffer
    if tc:
        e8m0 = jnp.float8_e8m0fnu
        qk_sc = d // mma.qk_block // 4  # scale columns of Q and K, in 4-column tiles
        n_pb = bkv // 32  # P (and V) scale blocks of a key tile

    def kernel(
        q_ref,
        k_ref,
        vt_ref,
        rows_ref,
        cols_ref,
        ind_ref,
        sc_refs,
        o_ref,
        lse_ref,
        dbg_p_ref,
        dbg_r_ref,
        scoped,
    ):
        bi = lax.axis_index("batch")
        head = lax.axis_index("heads")
        wg = lax.axis_index("wg")
        smem, (k_bar, v_bar, c_bar, q_bar, r_bar, i_bar), (k_cons, v_cons), sched, tcs = scoped
        q_smem2, k_smem, vt_smem, c_smem, p_smem2, o_smem2, r_smem2, lse_smem2, dbg_smem2 = smem

        def schedule_barrier():
            plgpu.barrier_arrive(sched)
            plgpu.barrier_wait(sched)

        if causal:
            cta_end = (lax.axis_index("q_seq") + 1) * (2 * bq)
            cta_kv_steps = jnp.minimum(lax.div(cta_end + (bkv - 1), jnp.int32(bkv)), n_kv)
        else:
            cta_kv_steps = n_kv

        def compute(wg):
            plgpu.set_max_registers(232, action="increase")
            q_smem, p_smem = q_smem2.at[wg], p_smem2.at[wg]
            o_smem = q_smem if o_in_q else o_smem2.at[wg]  # Q is dead once the loop ends
            lse_smem = lse_smem2.at[wg]
            q_base = lax.axis_index("q_seq") * (2 * bq) + wg * bq
            if causal:
                kv_steps = jnp.minimum(lax.div(q_base + bq + (bkv - 1), jnp.int32(bkv)), n_kv)
            else:
                kv_steps = n_kv
            plgpu.copy_gmem_to_smem(q_ref.at[bi, pl.ds(q_base, bq), head], q_smem, q_bar.at[wg])
            if tc:
                (qs_smem2, ks_smem, vs_smem, ps_smem2), tmem, mma_bar, tmem_free = tcs
                acc_t, qs_t, ks_t, ps_t, vs_t = tmem[wg]  # this warpgroup's TMEM (static wg)
                qs_smem, ps_smem = qs_smem2.at[wg], ps_smem2.at[wg]
                plgpu.copy_gmem_to_smem(
                    sc_refs[0].at[bi, head, pl.ds(lax.div(q_base, jnp.int32(bq)), 1)],
                    qs_smem,
                    q_bar.at[wg],
                )
            rows = None
            if row_input:
                r_smem = r_smem2.at[wg]
                plgpu.copy_gmem_to_smem(
                    rows_ref.at[bi, head, pl.ds(q_base, bq)], r_smem, r_bar.at[wg]
                )
                plgpu.barrier_wait(r_bar.at[wg])
                rows = plgpu.load(r_smem, layout=row_layout)
            plgpu.barrier_wait(q_bar.at[wg])
            if tc:  # Q's scales stay in TMEM for the whole loop
                plgpu.async_copy_scales_to_tmem(qs_smem, qs_t)
                # the accumulator region is free: every MMA into it waits for this barrier,
                # every load from it arrives once all threads' loads have completed
                plgpu.barrier_arrive(tmem_free.at[wg])

            def row_full(value):
                return plgpu.layout_cast(jnp.full((bq,), value, f32), row_layout)

            m_i = row_full(-jnp.inf)
            l_i = row_full(0.0)
            state = tuple(row_full(v) for v in math.state_init)
            acc = plgpu.layout_cast(jnp.full((bq, dv), 0.0, f32), wgmma_layout)

            for i in range(slots if block_sums else 0):  # the indicator rows are in place
                plgpu.barrier_wait(i_bar.at[i])
            _when(kv_steps > 0, lambda: plgpu.barrier_wait(k_bar.at[0]))
            pl.when(wg == 1)(schedule_barrier)

            def key_iota():
                return plgpu.broadcasted_iota(jnp.int32, (bq, bkv), 1, layout=wgmma_layout)

            def kv_step_fn(kv_step, carry, masked: bool):
                acc, m_i, l_i, state = carry
                slot = lax.rem(kv_step, jnp.int32(slots))

                def qk(acc_ref):  # matmul site 1: S = Q·Kᵀ (K stored (keys, D): K-major)
                    plgpu.wgmma(acc_ref, q_smem, k_smem.at[slot].T)
                    schedule_barrier()
                    return acc_ref[...]

                def qk_tcgen05():  # Blackwell: block-scaled S = Q·Kᵀ into TMEM
                    s_t = acc_t.at[:, pl.ds(0, bkv)]
                    plgpu.async_copy_scales_to_tmem(ks_smem.at[slot], ks_t)
                    plgpu.barrier_wait(tmem_free.at[wg])  # the last P·V tile has been read
                    plgpu.tcgen05_mma(
                        s_t,
                        q_smem,
                        k_smem.at[slot].T,
                        mma_bar.at[wg],
                        a_scale=qs_t,
                        b_scale=ks_t,
                        accumulate=False,
                    )
                    plgpu.barrier_wait(mma_bar.at[wg])
                    schedule_barrier()
                    s = plgpu.async_load_tmem(s_t, layout=wgmma_layout)
                    plgpu.wait_load_tmem()
                    plgpu.barrier_arrive(tmem_free.at[wg])
                    return s

                if tc:
                    s_tile = qk_tcgen05()
                else:
                    s_tile = pl.run_scoped(qk, plgpu.ACC((bq, bkv), f32))
                plgpu.barrier_arrive(k_cons.at[slot])
                col_ref = None

                def cols(slot=slot):
                    return tuple(
                        plgpu.load(c_smem.at[slot, i], layout=col_layout) for i in range(n_columns)
                    )

                if n_columns:
                    plgpu.barrier_wait(c_bar.at[slot])
                    col_ref = c_smem.at[slot]
                visible = None
                if masked:
                    key = key_iota() + kv_step * bkv
                    if causal:
                        qi = plgpu.broadcasted_iota(jnp.int32, (bq, bkv), 0, layout=wgmma_layout)
                        visible = qi + q_base >= key
                    if tail:
                        in_seq = key < kv_len
                        visible = in_seq if visible is None else visible & in_seq
                res = math.step(
                    StepContext(s_tile, cols, col_ref, visible, rows, kv_step, key_iota), m_i, state
                )
                acc = acc * lax.broadcast_in_dim(res.beta, (bq, dv), [0])
                pv_scale = (
                    None
                    if res.pv_scale is None
                    else lax.broadcast_in_dim(res.pv_scale, (bq, dv), [0])
                )
                if res.l_sums is None:
                    l_i = l_i * res.beta + (1.0 if res.l_tile is None else res.l_tile)
                if not skip_pv:
                    p_smem[...] = res.p
                    if tc:  # P's E8M0 block codes, four per row word, in the TMEM-copy layout
                        if len(res.p_scales) != n_pb:
                            raise ValueError(
                                f"the step returned {len(res.p_scales)} P scale vectors; "
                                f"the tcgen05 body needs {n_pb}"
                            )
                        word = res.p_scales[0]
                        for b in range(1, n_pb):
                            word = word | lax.shift_left(res.p_scales[b], jnp.int32(8 * b))
                        _store_p_scale_words(word, ps_smem, row_layout)
                    plgpu.commit_smem()
                plgpu.barrier_arrive(sched)  # softmax done
                plgpu.barrier_wait(v_bar.at[slot])
                plgpu.barrier_wait(sched)  # tensor core free

                def pv(acc_ref):  # matmul site 2: P·V (Vᵀ stored (D [+ 8], keys): K-major)
                    if not skip_pv:
                        plgpu.wgmma(acc_ref, p_smem, vt_smem.at[slot].T)
                    nxt = kv_step + 1

                    @pl.when(nxt < kv_steps)
                    def _():
                        plgpu.barrier_wait(k_bar.at[lax.rem(nxt, jnp.int32(slots))])

                    return acc_ref[...]

                def pv_tcgen05():  # Blackwell: block-scaled P·V into TMEM (S's columns)
                    o_t = acc_t.at[:, pl.ds(0, dv)]
                    plgpu.async_copy_scales_to_tmem(ps_smem, ps_t)
                    plgpu.async_copy_scales_to_tmem(vs_smem.at[slot], vs_t)
                    plgpu.barrier_wait(tmem_free.at[wg])  # S has been read by every thread
                    plgpu.tcgen05_mma(
                        o_t,
                        p_smem,
                        vt_smem.at[slot].T,
                        mma_bar.at[wg],
                        a_scale=ps_t,
                        b_scale=vs_t,
                        accumulate=False,
                    )
                    plgpu.barrier_wait(mma_bar.at[wg])
                    nxt = kv_step + 1

                    @pl.when(nxt < kv_steps)
                    def _():
                        plgpu.barrier_wait(k_bar.at[lax.rem(nxt, jnp.int32(slots))])

                    out = plgpu.async_load_tmem(o_t, layout=wgmma_layout)
                    plgpu.wait_load_tmem()
                    plgpu.barrier_arrive(tmem_free.at[wg])
                    return out

                if tc:
                    pv_tile = pv_tcgen05()
                else:
                    pv_tile = pl.run_scoped(pv, plgpu.ACC((bq, d + ext), f32))
                if ext:
                    sums, pv_tile = pv_tile[:, d:], pv_tile[:, :d]
                    l_i = l_i * res.beta + res.l_sums(sums)
                acc = acc + (pv_tile if pv_scale is None else pv_tile * pv_scale)
                plgpu.barrier_arrive(v_cons.at[slot])
                if debug:  # after the PV product, so that a block-sum normalizer is complete
                    dbg_smem = dbg_smem2.at[wg]

                    @pl.when(kv_step == debug_step)
                    def _dump():
                        if skip_pv:
                            p_smem[...] = res.p
                        for i, vec in enumerate((*res.debug, l_i)):
                            dbg_smem.at[i][...] = vec
                        plgpu.commit_smem()
                        plgpu.copy_smem_to_gmem(p_smem, dbg_p_ref.at[bi, head, pl.ds(q_base, bq)])
                        plgpu.copy_smem_to_gmem(
                            dbg_smem, dbg_r_ref.at[bi, head, :, pl.ds(q_base, bq)]
                        )
                        plgpu.wait_smem_to_gmem(0, wait_read_only=True)

                return acc, res.m, l_i, res.state

            carry = (acc, m_i, l_i, state)
            if not causal:
                carry = lax.fori_loop(
                    0, n_kv - tail, functools.partial(kv_step_fn, masked=False), carry
                )
                if tail:  # the masked tail tile
                    carry = kv_step_fn(jnp.int32(n_kv - 1), carry, masked=True)
            else:
                # tiles wholly below the diagonal and wholly inside the sequence run unmasked
                full = jnp.minimum(lax.div(q_base, jnp.int32(bkv)), n_kv - tail)
                carry = lax.fori_loop(0, full, functools.partial(kv_step_fn, masked=False), carry)
                carry = lax.fori_loop(
                    full, kv_steps, functools.partial(kv_step_fn, masked=True), carry
                )

                def drain_step(kv_step, _):  # tiles this warpgroup skips: keep barriers in step
                    slot = lax.rem(kv_step, jnp.int32(slots))
                    plgpu.barrier_wait(k_bar.at[slot])
                    plgpu.barrier_arrive(k_cons.at[slot])
                    if n_columns:
                        plgpu.barrier_wait(c_bar.at[slot])
                    plgpu.barrier_wait(v_bar.at[slot])
                    plgpu.barrier_arrive(v_cons.at[slot])
                    schedule_barrier()
                    schedule_barrier()

                lax.fori_loop(kv_steps, cta_kv_steps, drain_step, None)
            acc, m_i, l_i, state = carry
            pl.when(wg == 0)(schedule_barrier)

            out, lse = math.finish(acc, l_i, m_i, state, rows)
            o_smem[...] = out.astype(out_dtype)
            lse_smem[...] = lse
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(o_smem, o_ref.at[bi, pl.ds(q_base, bq), head])
            plgpu.copy_smem_to_gmem(lse_smem, lse_ref.at[bi, head, pl.ds(q_base, bq)])
            plgpu.wait_smem_to_gmem(0)

        if tc:  # TMEM refs are chosen per warpgroup at trace time: one body per warpgroup
            for w in range(2):
                pl.when(wg == w)(functools.partial(compute, w))
        else:
            pl.when(wg < 2)(functools.partial(compute, wg))

        @pl.when(wg == 2)
        def _memory():
            plgpu.set_max_registers(40, action="decrease")
            kv_head = lax.div(head, jnp.int32(heads_per_kv))

            def issue_k(step, slot):
                plgpu.copy_gmem_to_smem(
                    k_ref.at[bi, pl.ds(step * bkv, bkv), kv_head], k_smem.at[slot], k_bar.at[slot]
                )
                if tc:
                    plgpu.copy_gmem_to_smem(
                        sc_refs[1].at[bi, kv_head, pl.ds(step, 1)],
                        tcs[0][1].at[slot],
                        k_bar.at[slot],
                    )

            def issue_v(step, slot):
                dst = vt_smem.at[slot, pl.ds(0, d)] if ext else vt_smem.at[slot]
                plgpu.copy_gmem_to_smem(
                    vt_ref.at[bi, kv_head, :, pl.ds(step * bkv, bkv)], dst, v_bar.at[slot]
                )
                if tc:
                    plgpu.copy_gmem_to_smem(
                        sc_refs[2].at[bi, kv_head, :, pl.ds(step, 1)],
                        tcs[0][2].at[slot],
                        v_bar.at[slot],
                    )
                if n_columns:
                    plgpu.copy_gmem_to_smem(
                        cols_ref.at[bi, kv_head, :, pl.ds(step * bkv, bkv)],
                        c_smem.at[slot],
                        c_bar.at[slot],
                    )

            def prologue(i):
                issue_k(i, i)
                issue_v(i, i)

            for i in range(slots if ext else 0):  # block indicators: once per slot
                plgpu.copy_gmem_to_smem(ind_ref, vt_smem.at[i, pl.ds(d, ext)], i_bar.at[i])
            for i in range(slots):
                _when(i < cta_kv_steps, functools.partial(prologue, i))

            @pl.loop(0, jnp.maximum(cta_kv_steps - slots, 0))
            def _ring(step):
                slot = lax.rem(step, jnp.int32(slots))
                plgpu.barrier_wait(k_cons.at[slot])
                issue_k(step + slots, slot)
                plgpu.barrier_wait(v_cons.at[slot])
                issue_v(step + slots, slot)

            @pl.loop(jnp.maximum(cta_kv_steps - slots, 0), cta_kv_steps)
            def _drain(step):  # observe the last consumed phases before the barriers go away
                slot = lax.rem(step, jnp.int32(slots))
                plgpu.barrier_wait(k_cons.at[slot])
                plgpu.barrier_wait(v_cons.at[slot])

    def entry(q_ref, k_ref, vt_ref, *refs):
        refs = list(refs)
        rows_ref = refs.pop(0) if row_input else None
        cols_ref = refs.pop(0) if n_columns else None
        ind_ref = refs.pop(0) if ext else None
        sc_refs = (refs.pop(0), refs.pop(0), refs.pop(0)) if tc else None
        o_ref, lse_ref = refs[0], refs[1]
        dbg_p_ref, dbg_r_ref = (refs[2], refs[3]) if debug else (None, None)
        scratch = [
            plgpu.SMEM((2, bq, d), in_dtype, transforms=smem_transforms(in_dtype, d)),
            plgpu.SMEM((slots, bkv, d), in_dtype, transforms=smem_transforms(in_dtype, d)),
            plgpu.SMEM((slots, dv + ext, bkv), in_dtype, transforms=smem_transforms(in_dtype, bkv)),
            plgpu.SMEM((slots, n_columns, bkv), f32) if n_columns else None,
            plgpu.SMEM((2, bq, bkv), p_dtype, transforms=smem_transforms(p_dtype, bkv)),
            None
            if o_in_q
            else plgpu.SMEM((2, bq, dv), out_dtype, transforms=smem_transforms(out_dtype, dv)),
            plgpu.SMEM((2, bq), f32) if row_input else None,
            plgpu.SMEM((2, bq), f32),
            plgpu.SMEM((2, n_dbg, bq), f32) if debug else None,
        ]
        arrivals = 2 if tc else 1  # with tcgen05 the scale tiles arrive on the same barriers
        tc_scratch = None
        if tc:
            sl = plgpu.TMEMLayout.SCALES_LAYOUT
            tc_scratch = (
                (
                    plgpu.SMEM((2, 1, qk_sc, 32, 16), mma.qk_scale),
                    plgpu.SMEM((slots, 1, qk_sc, 32, 16), mma.qk_scale),
                    plgpu.SMEM((slots, 1, 1, 32, 16), e8m0),
                    plgpu.SMEM((2, 1, 1, 32, 16), e8m0),
                ),
                tuple(
                    (
                        plgpu.TMEM((bq, max(bkv, dv)), f32),
                        plgpu.TMEM((bq, d // mma.qk_block), mma.qk_scale, layout=sl),
                        plgpu.TMEM((bkv, d // mma.qk_block), mma.qk_scale, layout=sl),
                        plgpu.TMEM((bq, n_pb), e8m0, layout=sl),
                        plgpu.TMEM((128, n_pb), e8m0, layout=sl),
                    )
                    for _ in range(2)
                ),
                plgpu.Barrier(num_barriers=2, orders_tensor_core=True),  # MMA done
                plgpu.Barrier(num_barriers=2, orders_tensor_core=True),  # TMEM read
            )
        pl.run_scoped(
            lambda *args: kernel(
                q_ref,
                k_ref,
                vt_ref,
                rows_ref,
                cols_ref,
                ind_ref,
                sc_refs,
                o_ref,
                lse_ref,
                dbg_p_ref,
                dbg_r_ref,
                args if tc else (*args, None),
            ),
            scratch,
            (
                plgpu.Barrier(num_arrivals=arrivals, num_barriers=slots),
                plgpu.Barrier(num_arrivals=arrivals, num_barriers=slots),
                plgpu.Barrier(num_barriers=slots),
                plgpu.Barrier(num_arrivals=arrivals, num_barriers=2),
                plgpu.Barrier(num_barriers=2),
                plgpu.Barrier(num_barriers=slots),
            ),
            (plgpu.Barrier(num_arrivals=2, num_barriers=slots),) * 2,
            plgpu.Barrier(num_arrivals=2),
            *((tc_scratch,) if tc else ()),
            collective_axes="wg",
        )

    out_types = [
        jax.ShapeDtypeStruct((batch_size, t_len, hq, dv), out_dtype),
        jax.ShapeDtypeStruct((batch_size, hq, t_len), f32),
    ]
    if debug:
        out_types += [
            jax.ShapeDtypeStruct((batch_size, hq, t_len, bkv), p_dtype),
            jax.ShapeDtypeStruct((batch_size, hq, n_dbg, t_len), f32),
        ]
    call = plgpu.kernel(
        entry,
        out_type=out_types,
        grid=(hq, t_len // (2 * bq), batch_size),
        grid_names=("heads", "q_seq", "batch"),
        num_threads=3,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(approx_math=True),
    )

    def run(q, k, vt, *extra):
        extra = list(extra)
        rows = extra.pop(0) if row_input else None
        cols = extra.pop(0) if n_columns else None
        args = [q, k, vt] + ([rows] if row_input else []) + ([cols] if n_columns else [])
        if ext:
            key_block = np.arange(bkv)[None, :] // 32
            ind = (key_block == np.arange(ext)[:, None]).astype(np.float32)
            args.append(jnp.asarray(ind).astype(in_dtype))
        if tc:
            if len(extra) != 3:
                raise ValueError(
                    "the tcgen05 kernel takes (q, k, vt, q_scales, k_scales, v_scales)"
                )
            args += extra
        return call(*args)

    return run

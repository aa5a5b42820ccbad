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
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

__all__ = ["StepContext", "StepResult", "TileMath", "build_forward", "pow2_f32", "ceil_f32",
           "floor_f32", "check_qkv_shapes"]


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


def build_forward(*, q_shape: tuple, k_shape: tuple, in_dtype: Any, p_dtype: Any,
                  out_dtype: Any, block_q: int, block_kv: int, max_concurrent_steps: int,
                  causal: bool, n_columns: int, row_input: bool, math: TileMath,
                  debug_step: int | None, skip_pv: bool = False,
                  kv_len: int | None = None, block_sums: bool = False) -> Callable[..., Any]:
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
        raise ValueError(f"build_forward: T={t_len} must be a multiple of 2·block_q={2 * bq} and "
                         f"S={s_len} a positive multiple of block_kv={bkv} (pad the inputs)")
    kv_len = s_len if kv_len is None else kv_len
    if not (n_kv - 1) * bkv < kv_len <= s_len:
        raise ValueError(f"build_forward: kv_len={kv_len} must lie in the last key tile "
                         f"({(n_kv - 1) * bkv}, {s_len}]")
    tail = kv_len < s_len  # the last key tile is masked
    slots = min(max_concurrent_steps, n_kv)
    block_sums = block_sums and not skip_pv
    ext = 8 if block_sums else 0  # extra Vᵀ rows (the block indicators)
    heads_per_kv = hq // hkv
    f32 = jnp.float32
    debug = debug_step is not None
    n_dbg = math.n_debug + 1
    row_layout = plgpu.Layout.WGMMA.reduce(1)
    col_layout = plgpu.Layout.WGMMA.reduce(0)
    wgmma_layout = plgpu.Layout.WGMMA
    o_in_q = np.dtype(out_dtype) == np.dtype(in_dtype)  # stage O in Q's buffer

    def kernel(q_ref, k_ref, vt_ref, rows_ref, cols_ref, ind_ref, o_ref, lse_ref, dbg_p_ref,
               dbg_r_ref, scoped):
        bi = lax.axis_index("batch")
        head = lax.axis_index("heads")
        wg = lax.axis_index("wg")
        smem, (k_bar, v_bar, c_bar, q_bar, r_bar, i_bar), (k_cons, v_cons), sched = scoped
        q_smem2, k_smem, vt_smem, c_smem, p_smem2, o_smem2, r_smem2, lse_smem2, dbg_smem2 = smem

        def schedule_barrier():
            plgpu.barrier_arrive(sched)
            plgpu.barrier_wait(sched)

        if causal:
            cta_end = (lax.axis_index("q_seq") + 1) * (2 * bq)
            cta_kv_steps = jnp.minimum(lax.div(cta_end + (bkv - 1), jnp.int32(bkv)), n_kv)
        else:
            cta_kv_steps = n_kv

        @pl.when(wg < 2)
        def _compute():
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
            rows = None
            if row_input:
                r_smem = r_smem2.at[wg]
                plgpu.copy_gmem_to_smem(rows_ref.at[bi, head, pl.ds(q_base, bq)], r_smem,
                                        r_bar.at[wg])
                plgpu.barrier_wait(r_bar.at[wg])
                rows = plgpu.load(r_smem, layout=row_layout)
            plgpu.barrier_wait(q_bar.at[wg])

            def row_full(value):
                return plgpu.layout_cast(jnp.full((bq,), value, f32), row_layout)

            m_i = row_full(-jnp.inf)
            l_i = row_full(0.0)
            state = tuple(row_full(v) for v in math.state_init)
            acc = plgpu.layout_cast(jnp.full((bq, d), 0.0, f32), wgmma_layout)

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

                s_tile = pl.run_scoped(qk, plgpu.ACC((bq, bkv), f32))
                plgpu.barrier_arrive(k_cons.at[slot])
                col_ref = None

                def cols(slot=slot):
                    return tuple(plgpu.load(c_smem.at[slot, i], layout=col_layout)
                                 for i in range(n_columns))

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
                res = math.step(StepContext(s_tile, cols, col_ref, visible, rows, kv_step,
                                            key_iota), m_i, state)
                acc = acc * lax.broadcast_in_dim(res.beta, (bq, d), [0])
                pv_scale = (None if res.pv_scale is None
                            else lax.broadcast_in_dim(res.pv_scale, (bq, d), [0]))
                if res.l_sums is None:
                    l_i = l_i * res.beta + (1.0 if res.l_tile is None else res.l_tile)
                if not skip_pv:
                    p_smem[...] = res.p
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
                        plgpu.copy_smem_to_gmem(dbg_smem,
                                                dbg_r_ref.at[bi, head, :, pl.ds(q_base, bq)])
                        plgpu.wait_smem_to_gmem(0, wait_read_only=True)

                return acc, res.m, l_i, res.state

            carry = (acc, m_i, l_i, state)
            if not causal:
                carry = lax.fori_loop(0, n_kv - tail, functools.partial(kv_step_fn, masked=False),
                                      carry)
                if tail:  # the masked tail tile
                    carry = kv_step_fn(jnp.int32(n_kv - 1), carry, masked=True)
            else:
                # tiles wholly below the diagonal and wholly inside the sequence run unmasked
                full = jnp.minimum(lax.div(q_base, jnp.int32(bkv)), n_kv - tail)
                carry = lax.fori_loop(0, full, functools.partial(kv_step_fn, masked=False), carry)
                carry = lax.fori_loop(full, kv_steps, functools.partial(kv_step_fn, masked=True),
                                      carry)

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

        @pl.when(wg == 2)
        def _memory():
            plgpu.set_max_registers(40, action="decrease")
            kv_head = lax.div(head, jnp.int32(heads_per_kv))

            def issue_k(step, slot):
                plgpu.copy_gmem_to_smem(k_ref.at[bi, pl.ds(step * bkv, bkv), kv_head],
                                        k_smem.at[slot], k_bar.at[slot])

            def issue_v(step, slot):
                dst = vt_smem.at[slot, pl.ds(0, d)] if ext else vt_smem.at[slot]
                plgpu.copy_gmem_to_smem(vt_ref.at[bi, kv_head, :, pl.ds(step * bkv, bkv)],
                                        dst, v_bar.at[slot])
                if n_columns:
                    plgpu.copy_gmem_to_smem(cols_ref.at[bi, kv_head, :, pl.ds(step * bkv, bkv)],
                                            c_smem.at[slot], c_bar.at[slot])

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
        o_ref, lse_ref = refs[0], refs[1]
        dbg_p_ref, dbg_r_ref = (refs[2], refs[3]) if debug else (None, None)
        scratch = [
            plgpu.SMEM((2, bq, d), in_dtype, transforms=smem_transforms(in_dtype, d)),
            plgpu.SMEM((slots, bkv, d), in_dtype, transforms=smem_transforms(in_dtype, d)),
            plgpu.SMEM((slots, d + ext, bkv), in_dtype,
                       transforms=smem_transforms(in_dtype, bkv)),
            plgpu.SMEM((slots, n_columns, bkv), f32) if n_columns else None,
            plgpu.SMEM((2, bq, bkv), p_dtype, transforms=smem_transforms(p_dtype, bkv)),
            None if o_in_q else plgpu.SMEM((2, bq, d), out_dtype,
                                           transforms=smem_transforms(out_dtype, d)),
            plgpu.SMEM((2, bq), f32) if row_input else None,
            plgpu.SMEM((2, bq), f32),
            plgpu.SMEM((2, n_dbg, bq), f32) if debug else None,
        ]
        pl.run_scoped(
            lambda *args: kernel(q_ref, k_ref, vt_ref, rows_ref, cols_ref, ind_ref, o_ref,
                                 lse_ref, dbg_p_ref, dbg_r_ref, args),
            scratch,
            (plgpu.Barrier(num_barriers=slots), plgpu.Barrier(num_barriers=slots),
             plgpu.Barrier(num_barriers=slots), plgpu.Barrier(num_barriers=2),
             plgpu.Barrier(num_barriers=2), plgpu.Barrier(num_barriers=slots)),
            (plgpu.Barrier(num_arrivals=2, num_barriers=slots),) * 2,
            plgpu.Barrier(num_arrivals=2),
            collective_axes="wg",
        )

    out_types = [jax.ShapeDtypeStruct((batch_size, t_len, hq, d), out_dtype),
                 jax.ShapeDtypeStruct((batch_size, hq, t_len), f32)]
    if debug:
        out_types += [jax.ShapeDtypeStruct((batch_size, hq, t_len, bkv), p_dtype),
                      jax.ShapeDtypeStruct((batch_size, hq, n_dbg, t_len), f32)]
    call = plgpu.kernel(
        entry,
        out_type=out_types,
        grid=(hq, t_len // (2 * bq), batch_size),
        grid_names=("heads", "q_seq", "batch"),
        num_threads=3,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(approx_math=True),
    )

    def run(q, k, vt, rows=None, cols=None):
        args = [q, k, vt] + ([rows] if row_input else []) + ([cols] if n_columns else [])
        if ext:
            key_block = np.arange(bkv)[None, :] // 32
            ind = (key_block == np.arange(ext)[:, None]).astype(np.float32)
            args.append(jnp.asarray(ind).astype(in_dtype))
        return call(*args)

    return run

"""GPU kernels for the emulator's ordered float32 sums of products, and where they replace jnp.

This module owns the GPU implementation of the two sequential accumulations of
:mod:`fp4sim.attention._ordered` (the definition stays the NumPy path there):

* the *flushed chain* ``acc_0 = fl(a_0·b_0)``, ``acc_k = fl(acc_{k−1} + fl(a_k·b_k))``,
  every result below 2^-126 flushed to +0;
* the *plain chain* ``acc + a_k·b_k`` (a fused multiply-add allowed) with one final flush, which
  gives the same bits wherever :func:`fp4sim.attention._ordered.plain_sum_is_exact` holds.

Under ``jax.jit`` on XLA these are ``fori_loop`` loops of whole-array steps: on a GPU each of the
thousands of steps is a kernel launch (the H200 ran the FP8 training route's backward at 218x
plain attention). Here one Pallas kernel (Triton backend, ``pl.pallas_call`` without Mosaic)
computes a block of outputs per program, and each lane walks its output element's reduction in
the recipe's order. The flush is applied as a bit mask (:func:`fp4sim.formats.f32.ftz`: bitcast
to int32, AND, bitcast back) between the multiply and the add, so no compiler can contract the
two into an FMA, which is also exactly the flush rule; the plain chain needs no barrier (its
products are exact, so a fused multiply-add gives the same bits). Operand layouts: ``a`` as
(..., I, K) or transposed (..., K, I), ``b`` (..., K, J); a ``groups`` axis adds, after each
group's ordered product, the products of consecutive groups with flushed float32 adds (the
forward's PV sub-blocks of one ``pv_group``).

The forward's exact PV step of FP4 P and FP4 V (every sub-block's partial product exact, the
partials of one ``pv_group`` added in order with flushed adds, then the online-softmax fold
``A ← fl(A·r_i)`` plus each group sum, tile by tile) is :func:`exact_pv_fold`: one kernel that
walks the tiles in order and keeps the group sums and the numerator in registers, instead of
writing every sub-block partial (the (tiles, sub-blocks, rows, Dv) intermediate of the batched
matrix product) or every group sum to memory and reading it back.

The forward's exact score step of FP4 Q/K (NVFP4: E2M1 payload × UE4M3 scale, each head-dim
block's partial dot product exact, the blocks added in order) is one more kernel
(:func:`exact_scores`): the block partials on the tensor cores from bfloat16 copies (exact:
at most 6 significant bits per value, exact products, exact block sums), added in block order
in float32 as the CPU does, without the (blocks, rows, keys) intermediate of the batched
matrix product.

Dispatch (:func:`on_gpu`): ``jax.lax.platform_dependent`` picks the kernel when the computation
is lowered for ``cuda`` and the existing jnp/NumPy path elsewhere, so a CPU-placed computation
in the same process keeps the CPU path. The environment variable ``FP4SIM_GPU_KERNELS`` (read
at trace time) selects: ``1`` (default) the kernels of :data:`DEFAULT_FAMILIES` on the GPU
only, ``all`` every family, ``0`` none, ``interpret`` every kernel everywhere, in Pallas
interpret mode off the GPU (for the bitwise tests on the CPU), or a comma-separated subset of
:data:`FAMILIES` (e.g. ``ordered,scores``: the other kernels off). Shapes the kernel does
not tile (output rows or columns not a multiple of 16) keep the jnp path.

Operands are the emulator's quantized, flushed-or-correctly-rounded float32 values. The GPU
multiplies subnormal operands exactly as NumPy does (no DAZ in the kernel); XLA CPU treats them
as zero, so where an operand is subnormal the NumPy definition, the GPU kernel and XLA CPU's jnp
loop need not agree — the emulator's plain chain never sees one (``plain_sum_is_exact``). NaN
results carry the GPU's canonical NaN payload.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from fp4sim._xp import is_jax
from fp4sim.formats import f32

__all__ = [
    "ENV",
    "FAMILIES",
    "DEFAULT_FAMILIES",
    "mode",
    "on_gpu",
    "ordered_product_kernel",
    "tile_shape",
    "default_num_warps",
    "backward_product",
    "grouped_product",
    "backward_supported",
    "grouped_supported",
    "backward_dispatch",
    "grouped_dispatch",
    "exact_scores",
    "exact_scores_dispatch",
    "exact_pv_fold",
    "exact_pv_fold_dispatch",
]

ENV = "FP4SIM_GPU_KERNELS"
FAMILIES = ("ordered", "scores", "pv", "direct_p", "rows")
"""What ``FP4SIM_GPU_KERNELS`` can name: the ordered sums (backward products, forward PV
groups), the exact NVFP4 scores, the exact FP4 PV partials of the forward, the Direct-P forward
kernels (:mod:`fp4sim.attention.direct_p_gpu`), the forward's larger GPU row chunks."""
DEFAULT_FAMILIES = ("ordered", "scores", "pv", "rows")
"""The families of ``FP4SIM_GPU_KERNELS=1`` (the default): those checked bit for bit on the
H200; ``direct_p`` is opt-in (``FP4SIM_GPU_KERNELS=all``): on the H200
(``tests/attention/test_direct_p_gpu.py`` on a GPU host, where its kernels run for real) its O
equals the NumPy emulator's, and since every block partial of the score kernels is flushed
before its add its LSE does too (2026-12-03; before, one to three rows of 512 differed by one or
two ulps in every case). It stays opt-in because it is slower: on the H200 at S4096 D128 a
forward takes 0.726 ms back to back against 0.464 ms with the default families (2026-12-03,
``bench attention --device gpu``, both in one call of ``scripts/emu_h200.sh``)."""
_MIN_BLOCK = 16
_MAX_BLOCK = 64
_MAX_ROWS = 32  # output rows per program: 32x64 blocks measured fastest on the H200 (below)
_TARGET_PROGRAMS = 264  # two per H200 SM: below this the blocks are halved


def mode() -> str:
    """``FP4SIM_GPU_KERNELS`` (module docstring): ``"0"``, ``"interpret"``, or the families on
    the GPU as a sorted comma-separated list (``1``, the default: :data:`DEFAULT_FAMILIES`;
    ``all``: every one of :data:`FAMILIES`; or a comma-separated subset)."""
    value = os.environ.get(ENV, "1").strip().lower()
    if value in ("0", "interpret"):
        return value
    if value == "1":
        return ",".join(sorted(DEFAULT_FAMILIES))
    if value == "all":
        return ",".join(sorted(FAMILIES))
    names = {n.strip() for n in value.split(",") if n.strip()}
    if not names or not names <= set(FAMILIES):
        raise ValueError(
            f"{ENV}={value!r}; allowed: '0', '1', 'all', 'interpret' or a "
            f"comma-separated subset of {list(FAMILIES)}"
        )
    return ",".join(sorted(names))


def on_gpu(gpu_fn: Callable, default_fn: Callable, *args: Any, family: str) -> Any:
    """``gpu_fn(*args, interpret=False)`` where the computation is lowered for ``cuda``, else
    ``default_fn(*args)`` (both must give the same shapes and dtypes), by
    ``jax.lax.platform_dependent``; NumPy arguments, ``FP4SIM_GPU_KERNELS=0`` and a family not
    named always take ``default_fn``, ``interpret`` runs ``gpu_fn(*args, interpret=True)`` off
    the GPU."""
    if family not in FAMILIES:
        raise ValueError(f"family={family!r}; allowed: {list(FAMILIES)}")
    m = mode()
    if (
        m == "0"
        or (m != "interpret" and family not in m.split(","))
        or not any(is_jax(a) for a in args)
    ):
        return default_fn(*args)
    from jax import lax

    other = functools.partial(gpu_fn, interpret=True) if m == "interpret" else default_fn
    return lax.platform_dependent(
        *args, cuda=functools.partial(gpu_fn, interpret=False), default=other
    )


def _block(n: int) -> int:
    """The largest power of two ≤ ``_MAX_BLOCK`` dividing ``n`` (0 below ``_MIN_BLOCK``)."""
    b = _MAX_BLOCK
    while b >= _MIN_BLOCK:
        if n % b == 0:
            return b
        b //= 2
    return 0


def tile_shape(batch: int, rows: int, cols: int) -> tuple[int, int] | None:
    """Output block (rows, cols) of one kernel program for a (batch, rows, cols) output, or None
    when the kernel does not tile it (rows or cols not a multiple of 16). At most 32 rows and
    64 columns, then halved (down to 16) until there are about two programs per H200 SM.
    Measured on the H200 (``scripts/emu_kernel_sweep.py``-style, a dense 2048-term product
    (8, 2048, 2048)ᵀ·(8, 2048, 128), one warp, four terms per step, operands loaded a step
    ahead): 32x64 0.48 ms, 64x32 0.52, 32x32 0.54, 64x64 0.60, 16x64 0.86."""
    bm, bn = min(_block(rows), _MAX_ROWS), _block(cols)
    if not bm or not bn:
        return None
    while batch * (rows // bm) * (cols // bn) < _TARGET_PROGRAMS and max(bm, bn) > _MIN_BLOCK:
        if bm >= bn:
            bm //= 2
        else:
            bn //= 2
    return bm, bn


def _kernel(
    *refs: Any,
    groups: int,
    k: int,
    bm: int,
    bn: int,
    plain: bool,
    transposed: bool,
    ranged: bool,
    unroll: int,
) -> None:
    import jax.numpy as jnp
    from jax import lax

    if ranged:
        lo_ref, hi_ref, a_ref, b_ref, o_ref = refs
        lo, hi = lo_ref[0, 0, 0], hi_ref[0, 0, 0]
        n_steps = (hi - lo) // unroll
    else:
        a_ref, b_ref, o_ref = refs
        lo, n_steps = 0, k // unroll
    total = None
    for g in range(groups):

        def load(kk: Any, g: int = g) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
            # the operands of steps kk .. kk + unroll − 1 (kk clamped into the arrays: the
            # look-ahead past the last step reads values that are never used)
            kk = jnp.minimum(kk, k - unroll)
            cols = tuple(
                a_ref[0, g, kk + u, :] if transposed else a_ref[0, g, :, kk + u]
                for u in range(unroll)
            )  # (bm,) each
            return cols, tuple(b_ref[0, g, kk + u, :] for u in range(unroll))

        def step(s: Any, carry: Any, load: Callable = load) -> Any:
            # the next step's operands are loaded before this step's products: the loads'
            # latency overlaps the arithmetic (measured on the H200, a dense 2048-term product
            # at 64x64 tiles: 0.60 vs 1.15 ms when each step loads its operands where it uses
            # them and waits for them; see tile_shape); the arithmetic and its order are unchanged
            acc, cols, rows = carry
            nxt = load(lo + (s + 1) * unroll)
            for u in range(unroll):
                t = cols[u][:, None] * rows[u][None, :]
                # plain: the products are exact, so a contraction into an FMA keeps the bits;
                # chain: the bit-mask flush between multiply and add forbids the contraction
                acc = acc + t if plain else f32.ftz(acc + f32.ftz(t))
            return (acc,) + nxt

        # −0 + x = x for every x the chain adds (its terms are flushed: never −0)
        init = jnp.full((bm, bn), 0.0 if plain else -0.0, dtype=jnp.float32)
        acc = lax.fori_loop(0, n_steps, step, (init,) + load(lo))[0]
        part = f32.ftz(acc) if plain else acc
        total = part if total is None else f32.ftz(total + part)
    o_ref[0] = total


def ordered_product_kernel(
    a: Any,
    b: Any,
    *,
    plain: bool,
    transposed: bool = False,
    lo: Any = None,
    hi: Any = None,
    tile: tuple[int, int] | None = None,
    interpret: bool = False,
    num_warps: int | None = None,
    unroll: int | None = None,
    num_stages: int = 1,
) -> Any:
    """The ordered sum of products as one Pallas (Triton) call: float32 (B, I, J) with
    ``out[n] = fl(…fl(P_0 + P_1)… + P_{G−1})`` over the ``groups`` axis, each
    ``P_g[i, j] = Σ_k a[n, g, i, k]·b[n, g, k, j]`` in k order (``transposed``: ``a`` given as
    (B, G, K, I)) by the flushed chain, or (``plain``) the plain chain and one flush.

    ``a`` (B, G, I, K) or (B, G, K, I), ``b`` (B, G, K, J). ``lo``/``hi`` (int32 (B, I/bm,
    J/bn), G = 1, ``plain`` only): each output block sums only the terms ``lo ≤ k < hi`` (the
    caller proves the others are ±0: skipping them changes only the sign of zeros, which the
    final flush sets to +0), rounded outward to whole unroll steps by the caller. ``tile``:
    (bm, bn), by default :func:`tile_shape`. ``num_warps`` (default :func:`default_num_warps`),
    ``unroll`` (terms per loop step, dividing K; default :func:`_unroll`: with ``lo``/``hi``
    the caller rounds them to the same steps) and ``num_stages`` tune the Triton program only:
    every output element sums the same terms in the same order."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as pltriton

    nb, groups = a.shape[:2]
    n_i, k = (a.shape[3], a.shape[2]) if transposed else a.shape[2:]
    n_j = b.shape[-1]
    bm, bn = tile or tile_shape(nb, n_i, n_j)
    ni, nj = n_i // bm, n_j // bn
    ranged = lo is not None
    unroll = _unroll(k) if unroll is None else unroll
    if k % unroll:
        raise ValueError(f"unroll={unroll} must divide the contraction length {k}")
    kern = functools.partial(
        _kernel,
        groups=groups,
        k=k,
        bm=bm,
        bn=bn,
        plain=plain,
        transposed=transposed,
        ranged=ranged,
        unroll=unroll,
    )

    def split(p: Any) -> tuple[Any, Any, Any]:
        return p // (ni * nj), (p // nj) % ni, p % nj

    if transposed:
        a_spec = pl.BlockSpec((1, groups, k, bm), lambda p: (split(p)[0], 0, 0, split(p)[1]))
    else:
        a_spec = pl.BlockSpec((1, groups, bm, k), lambda p: (split(p)[0], 0, split(p)[1], 0))
    b_spec = pl.BlockSpec((1, groups, k, bn), lambda p: (split(p)[0], 0, 0, split(p)[2]))
    r_spec = pl.BlockSpec((1, 1, 1), lambda p: split(p))
    o_spec = pl.BlockSpec((1, bm, bn), lambda p: split(p))
    args = (a, b) if not ranged else (jnp.asarray(lo, jnp.int32), jnp.asarray(hi, jnp.int32), a, b)
    specs = [a_spec, b_spec] if not ranged else [r_spec, r_spec, a_spec, b_spec]
    return pl.pallas_call(
        kern,
        out_shape=jax.ShapeDtypeStruct((nb, n_i, n_j), jnp.float32),
        grid=(nb * ni * nj,),
        in_specs=specs,
        out_specs=o_spec,
        interpret=interpret,
        compiler_params=pltriton.CompilerParams(
            num_warps=num_warps or default_num_warps(bm, bn), num_stages=num_stages
        ),
        name="fp4sim_ordered_product",
    )(*args)


def default_num_warps(bm: int, bn: int) -> int:
    """Warps of one program for a (bm, bn) output block: one per 4096 outputs (128 accumulators
    per lane), at least 1, so every default block (at most 64x64) runs on one warp. Measured on
    the H200 (``scripts/emu_kernel_sweep.py``: the FP8 training route's four backward products
    dV, dQ, dK, dP at H8 S2048 D128, 64x64 blocks, same bits in every configuration): 1 warp
    1.05 / 0.98 / 1.05 / 0.45 ms, 2 warps 1.18 / 1.16 / 1.19 / 0.48 ms, 4 warps 3.73 / 2.17 /
    3.74 / 0.84 ms. A lane holding more of the block reuses each loaded operand more often."""
    return max(1, bm * bn // 4096)


def _unroll(k: int) -> int:
    return 4 if k % 4 == 0 else (2 if k % 2 == 0 else 1)


def backward_product(
    a: Any,
    b: Any,
    plain: bool,
    needed: Any = None,
    transposed: bool = False,
    *,
    interpret: bool = False,
    tile: tuple[int, int] | None = None,
    **tuning: Any,
) -> Any:
    """The backward's SEQUENTIAL ``a @ b`` (``transposed``: ``aᵀ @ b`` of ``a`` stored
    (..., K, I)) on the kernel: what :mod:`fp4sim.attention.backward`'s jnp loop computes,
    bit for bit. Plain: each output block sums only the contraction range outside of which its
    rows of ``a`` are all zero (a causal mask's zeros: ±0 terms, the plain chain's operands being
    finite), and with ``needed`` (shaped like the output) a block where every element of
    ``needed`` is ±0 is left +0 (the caller multiplies the output by ``needed``)."""
    import jax.numpy as jnp

    lead = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    a = jnp.broadcast_to(a, lead + a.shape[-2:])
    b = jnp.broadcast_to(b, lead + b.shape[-2:])
    n_k, n_i = a.shape[-2:] if transposed else a.shape[:-3:-1]
    n_j = b.shape[-1]
    nb = int(np.prod(lead, dtype=np.int64))
    a3 = jnp.reshape(a, (nb, 1) + a.shape[-2:])
    b3 = jnp.reshape(b, (nb, 1) + b.shape[-2:])
    bm, bn = tile or tile_shape(nb, n_i, n_j)
    ni, nj = n_i // bm, n_j // bn
    lo = hi = None
    if plain:
        # (nb, K, ni): does row block i of a hold a nonzero in contraction column k?
        if transposed:
            live = jnp.any(jnp.reshape(a3[:, 0], (nb, n_k, ni, bm)) != 0, axis=-1)
        else:
            live = jnp.any(jnp.reshape(a3[:, 0], (nb, ni, bm, n_k)) != 0, axis=-2)
            live = jnp.swapaxes(live, 1, 2)
        idx = jnp.arange(n_k, dtype=jnp.int32)[None, :, None]
        u = tuning.get("unroll") or _unroll(n_k)
        lo1 = jnp.min(jnp.where(live, idx, np.int32(n_k)), axis=1)  # (nb, ni)
        hi1 = jnp.max(jnp.where(live, idx + 1, np.int32(0)), axis=1)
        lo1 = (jnp.minimum(lo1, hi1) // u) * u  # outward to whole unroll steps
        hi1 = jnp.minimum(-(-hi1 // u) * u, np.int32(n_k))
        hi1 = jnp.maximum(hi1, lo1)
        lo = jnp.broadcast_to(lo1[:, :, None], (nb, ni, nj))
        hi = jnp.broadcast_to(hi1[:, :, None], (nb, ni, nj))
        if needed is not None:  # NaN counts as needed (NaN != 0)
            nd = jnp.reshape(jnp.broadcast_to(needed, lead + (n_i, n_j)) != 0, (nb, ni, bm, nj, bn))
            busy = jnp.any(nd, axis=(2, 4))
            hi = jnp.where(busy, hi, lo)
    out = ordered_product_kernel(
        a3,
        b3,
        plain=plain,
        transposed=transposed,
        lo=lo,
        hi=hi,
        tile=(bm, bn),
        interpret=interpret,
        **tuning,
    )
    return jnp.reshape(out, lead + (n_i, n_j))


def backward_supported(a: Any, b: Any, transposed: bool) -> bool:
    """Whether :func:`backward_product` tiles this product (else the jnp loop runs)."""
    lead = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    n_i = a.shape[-1] if transposed else a.shape[-2]
    return tile_shape(int(np.prod(lead, dtype=np.int64)), n_i, b.shape[-1]) is not None


def grouped_product(
    pr: Any, vr: Any, per_group: int, plain: bool, *, interpret: bool = False
) -> Any:
    """The forward's PV group sums on the kernel: ``pr`` (..., nt, ns, I, sub), ``vr``
    (..., nt, ns, sub, Dv) -> (..., nt, ns/per_group, I, Dv), each sub-block's ordered sum
    (plain chain and flush, or the flushed chain), the ``per_group`` consecutive sub-blocks of a
    group added in order with flushed adds (:mod:`fp4sim.attention.forward`, step 4)."""
    import jax.numpy as jnp

    lead = tuple(np.broadcast_shapes(pr.shape[:-4], vr.shape[:-4]))
    nt, ns, n_i, sub = pr.shape[-4:]
    dv = vr.shape[-1]
    ng = ns // per_group
    pr = jnp.broadcast_to(pr, lead + pr.shape[-4:])
    vr = jnp.broadcast_to(vr, lead + vr.shape[-4:])
    nb = int(np.prod(lead, dtype=np.int64)) * nt * ng
    a = jnp.reshape(pr, (nb, per_group, n_i, sub))
    b = jnp.reshape(vr, (nb, per_group, sub, dv))
    out = ordered_product_kernel(a, b, plain=plain, interpret=interpret)
    return jnp.reshape(out, lead + (nt, ng, n_i, dv))


def grouped_supported(pr: Any, vr: Any, per_group: int) -> bool:
    """Whether :func:`grouped_product` tiles these operands (else the jnp path runs)."""
    lead = tuple(np.broadcast_shapes(pr.shape[:-4], vr.shape[:-4]))
    nt, ns, n_i = pr.shape[-4:-1]
    nb = int(np.prod(lead, dtype=np.int64)) * nt * max(1, ns // per_group)
    return ns % per_group == 0 and tile_shape(nb, n_i, vr.shape[-1]) is not None


def backward_dispatch(
    jnp_loop: Callable, a: Any, b: Any, plain: bool, needed: Any, transposed: bool
) -> Any:
    """``jnp_loop(a, b, plain, needed, transposed)`` (the backward's jnp loop), replaced by
    :func:`backward_product` where :func:`on_gpu` picks the kernel and the shapes tile."""
    if not backward_supported(a, b, transposed):
        return jnp_loop(a, b, plain, needed, transposed)

    def gpu(a: Any, b: Any, *nd: Any, interpret: bool) -> Any:
        return backward_product(a, b, plain, nd[0] if nd else None, transposed, interpret=interpret)

    def default(a: Any, b: Any, *nd: Any) -> Any:
        return jnp_loop(a, b, plain, nd[0] if nd else None, transposed)

    return on_gpu(gpu, default, a, b, *(() if needed is None else (needed,)), family="ordered")


def grouped_dispatch(jnp_sums: Callable, pr: Any, vr: Any, per_group: int, plain: bool) -> Any:
    """``jnp_sums(pr, vr)`` (the forward's PV sub-block sums and group adds), replaced by
    :func:`grouped_product` where :func:`on_gpu` picks the kernel and the shapes tile."""
    if not grouped_supported(pr, vr, per_group):
        return jnp_sums(pr, vr)

    def gpu(pr: Any, vr: Any, *, interpret: bool) -> Any:
        return grouped_product(pr, vr, per_group, plain, interpret=interpret)

    return on_gpu(gpu, jnp_sums, pr, vr, family="ordered")


# --- the exact block scores of FP4 Q/K ------------------------------------------------------
def _scores_kernel(q_ref: Any, k_ref: Any, o_ref: Any, *, nb: int, blk: int) -> None:
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl

    acc = None
    for b in range(nb):
        # the values are FP4 payloads times UE4M3 scales (at most 6 significant bits): exact
        # in bfloat16, their products exact in float32, and each block's sum (multiples of one
        # unit, at most 2^12 of them) exact in the tensor core's float32 accumulation
        qb = q_ref[0, :, pl.ds(b * blk, blk)].astype(jnp.bfloat16)
        kb = k_ref[0, :, pl.ds(b * blk, blk)].astype(jnp.bfloat16)
        part = lax.dot_general(qb, kb, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
        # in block order, like the CPU. Every partial is flushed (the identity on these
        # multiples of 2^-20) before it is added: Triton rewrites ``dot + x`` into an MMA
        # that starts from ``x``, which rounds inside the block instead of once after it.
        # That pattern matches ``acc + dot`` for the running sum and also ``dot_0 + x`` for
        # the first partial; flushing each partial leaves no add with a dot operand.
        part = f32.ftz(part)
        acc = part if acc is None else acc + part
    o_ref[0] = acc


def exact_scores(qv: Any, kv: Any, blk: int, *, interpret: bool = False) -> Any:
    """Raw scores ``Σ_b qv_b·kv_bᵀ`` (..., Sq, Sk) of FP4-valued Q/K (NVFP4 payload × UE4M3
    scale, no block exponents: each block's partial exact) with the blocks of ``blk`` head-dim
    elements added in order in float32: :mod:`fp4sim.attention.forward`'s exact score step as
    one Pallas kernel (tensor-core block partials, which are exact for these values)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as pltriton

    lead = tuple(np.broadcast_shapes(qv.shape[:-2], kv.shape[:-2]))
    sq, d = qv.shape[-2:]
    sk = kv.shape[-2]
    nbatch = int(np.prod(lead, dtype=np.int64))
    q3 = jnp.reshape(jnp.broadcast_to(qv, lead + qv.shape[-2:]), (nbatch, sq, d))
    k3 = jnp.reshape(jnp.broadcast_to(kv, lead + kv.shape[-2:]), (nbatch, sk, d))
    bm, bn = _block(sq), _block(sk)
    ni, nj = sq // bm, sk // bn

    def split(p: Any) -> tuple[Any, Any, Any]:
        return p // (ni * nj), (p // nj) % ni, p % nj

    out = pl.pallas_call(
        functools.partial(_scores_kernel, nb=d // blk, blk=blk),
        out_shape=jax.ShapeDtypeStruct((nbatch, sq, sk), jnp.float32),
        grid=(nbatch * ni * nj,),
        in_specs=[
            pl.BlockSpec((1, bm, d), lambda p: (split(p)[0], split(p)[1], 0)),
            pl.BlockSpec((1, bn, d), lambda p: (split(p)[0], split(p)[2], 0)),
        ],
        out_specs=pl.BlockSpec((1, bm, bn), lambda p: split(p)),
        interpret=interpret,
        compiler_params=pltriton.CompilerParams(num_warps=4, num_stages=2),
        name="fp4sim_exact_scores",
    )(q3, k3)
    return jnp.reshape(out, lead + (sq, sk))


def exact_scores_dispatch(jnp_sum: Callable, qv: Any, kv: Any, kbt: Any, blk: int) -> Any:
    """``jnp_sum(qv, kv, kbt, blk)`` (the forward's exact block sum), replaced by
    :func:`exact_scores` where :func:`on_gpu` picks the kernel and the shapes tile (rows and
    keys multiples of 16, blocks of 16 or more)."""
    if blk % 16 or not _block(qv.shape[-2]) or not _block(kv.shape[-2]):
        return jnp_sum(qv, kv, kbt, blk)

    def gpu(qv: Any, kv: Any, kbt: Any, *, interpret: bool) -> Any:
        return exact_scores(qv, kv, blk, interpret=interpret)

    return on_gpu(gpu, lambda qv, kv, kbt: jnp_sum(qv, kv, kbt, blk), qv, kv, kbt, family="scores")


# --- the exact FP4 PV partials of the forward and their online-softmax fold ----------------
def _exact_pv_fold_kernel(
    p_ref: Any, v_ref: Any, r_ref: Any, o_ref: Any, *, ntu: int, ng: int, per_group: int
) -> None:
    import jax.numpy as jnp
    from jax import lax

    def tile(i: Any, acc: Any) -> Any:
        acc = f32.mul_ftz(acc, r_ref[0, i, :][:, None])
        for grp in range(ng):
            g = None
            for j in range(per_group):
                s = grp * per_group + j
                # every entry of a sub-block's partial is exact (the forward proves it for FP4
                # P and V): any summation order, fused or not, gives it. The values have at
                # most 6 significant bits (E2M1 times a power of two or a UE4M3 scale, zero or
                # normal), so their bfloat16 copies are exact and the tensor cores multiply
                # them exactly. The flush comes first, so no add has a dot operand (Triton
                # would start the dot from the other operand)
                part = lax.dot_general(
                    p_ref[0, i, s].astype(jnp.bfloat16),
                    v_ref[0, i, s].astype(jnp.bfloat16),
                    (((1,), (0,)), ((), ())),
                    preferred_element_type=jnp.float32,
                )
                part = f32.ftz(part)
                g = part if g is None else f32.ftz(g + part)
            acc = f32.ftz(acc + g)
        return acc

    o_ref[0] = lax.fori_loop(0, ntu, tile, jnp.zeros(o_ref.shape[1:], jnp.float32))


def exact_pv_fold(
    pr: Any,
    vr: Any,
    rt: Any,
    per_group: int,
    *,
    interpret: bool = False,
    block: tuple[int, int] | None = None,
    num_warps: int = 4,
) -> Any:
    """The forward's PV numerator from its exact FP4 partials, as one Pallas kernel: ``pr``
    (..., nt, ns, Sq, sub), ``vr`` (..., nt, ns, sub, Dv), ``rt`` (..., nt, Sq) each tile's
    rescale factor r. For tile i in order: ``A ← fl(A·r_i)``, then each group's sum (its
    ``per_group`` sub-block products ``pr[.., i, s] @ vr[.., i, s]``, exact, flushed, added in
    order with flushed adds) added with a flushed add — the bits of
    :func:`fp4sim.attention.forward`'s step 4-5 loop over ``_group_sums(ftz(pr @ vr))``,
    without writing the group sums out. Returns A (..., Sq, Dv). ``block``: the (rows, Dv)
    output block of one program (default: at most 32x64), ``num_warps`` its warps."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as pltriton

    lead = tuple(np.broadcast_shapes(pr.shape[:-4], vr.shape[:-4], rt.shape[:-2]))
    nt, ns, n_i, sub = pr.shape[-4:]
    dv = vr.shape[-1]
    nb = int(np.prod(lead, dtype=np.int64))
    a = jnp.reshape(jnp.broadcast_to(pr, lead + pr.shape[-4:]), (nb, nt, ns, n_i, sub))
    b = jnp.reshape(jnp.broadcast_to(vr, lead + vr.shape[-4:]), (nb, nt, ns, sub, dv))
    r = jnp.reshape(jnp.broadcast_to(rt, lead + rt.shape[-2:]), (nb, nt, n_i))
    # at most 32x64 outputs per program, not halved for more programs: measured on the H200 at
    # S4096 D128 (32 tiles of 4 sub-blocks, bits equal for every block): 32x64 with 4 warps
    # 0.077 ms, 64x32 0.078, 32x32 0.134 (2 warps: 0.093), 16x64 0.094, 64x128 0.125
    bm, bn = (min(_block(n_i), _MAX_ROWS), _block(dv)) if block is None else block
    if n_i % bm or dv % bn:
        raise ValueError(f"block={block} must divide the output ({n_i}, {dv})")
    out = pl.pallas_call(
        functools.partial(_exact_pv_fold_kernel, ntu=nt, ng=ns // per_group, per_group=per_group),
        out_shape=jax.ShapeDtypeStruct((nb, n_i, dv), jnp.float32),
        grid=(nb, n_i // bm, dv // bn),
        in_specs=[
            pl.BlockSpec((1, nt, ns, bm, sub), lambda n, i, j: (n, 0, 0, i, 0)),
            pl.BlockSpec((1, nt, ns, sub, bn), lambda n, i, j: (n, 0, 0, 0, j)),
            pl.BlockSpec((1, nt, bm), lambda n, i, j: (n, 0, i)),
        ],
        out_specs=pl.BlockSpec((1, bm, bn), lambda n, i, j: (n, i, j)),
        interpret=interpret,
        compiler_params=pltriton.CompilerParams(num_warps=num_warps, num_stages=2),
        name="fp4sim_exact_pv_fold",
    )(a, b, r)
    return jnp.reshape(out, lead + (n_i, dv))


def exact_pv_fold_dispatch(jnp_fold: Callable, pr: Any, vr: Any, rt: Any, per_group: int) -> Any:
    """``jnp_fold(pr, vr, rt)`` (the forward's exact PV partials, group adds and tile fold),
    replaced by :func:`exact_pv_fold` where :func:`on_gpu` picks the kernel and the shapes
    tile (rows and Dv multiples of 16, sub-blocks of 16 or more, whole groups)."""
    nt, ns, n_i, sub = pr.shape[-4:]
    if sub % 16 or ns % per_group or not tile_shape(1, n_i, vr.shape[-1]):
        return jnp_fold(pr, vr, rt)

    def gpu(pr: Any, vr: Any, rt: Any, *, interpret: bool) -> Any:
        return exact_pv_fold(pr, vr, rt, per_group, interpret=interpret)

    return on_gpu(gpu, jnp_fold, pr, vr, rt, family="pv")

"""FP8 attention backward on Hopper (sm_90a) as two Pallas Mosaic GPU kernels.

This module owns the GPU backward that pairs with the token-block FP8 forward of
:mod:`fp4sim.kernels.attention_mgpu` (its saved residuals: the quantized Q/K/V codes and
token-block exponents, O and the base-2 LSE). Notation: ``c = fl32(softmax_scale·log2 e)``,
``S = Q_c·K_cᵀ`` the FP8 tensor-core product of the codes, ``2^e_Q``, ``2^e_K``, ``2^e_V`` the
token-block exponents (one per 32 tokens × D).

Numerics, per (query i, key j) — the same float32 operations in both kernels, so the two
copies of dS agree bit for bit wherever the tensor core returns the same S and dP for the
transposed products (it sums the same products over D in the same order):

1. ``u = fl(fl(S·2^e_K)·c_Q)`` with ``c_Q = c·2^e_Q`` (the forward's log2-domain scores),
   ``p = 2^(u − LSE₂)`` (``ex2.approx`` on the GPU): P is rebuilt from the saved quantized Q/K
   and the LSE, never stored. Because the forward's LSE comes from its represented normalizer,
   ``p`` is normalized consistently with the forward. Masked (causal) entries are 0.
2. ``dO_q = E5M2(dO)`` (a plain cast, :data:`fp4sim.attention.operands.E5M2_CAST`);
   ``dP = fl(dO_q·V_cᵀ)·2^e_V`` (E5M2 × E4M3 ``wgmma``); ``D = rowsum(dO_q ∘ O)`` float32.
3. ``dS = fl(p·fl(dP − D))``.
4. P for dV and dS for dQ/dK are quantized to E4M3 with one power-of-two scale per 32×32
   (query × key) block, rounded up (:data:`P_SQUARE_RCEIL`, :data:`fp4sim.attention.operands.
   DS_SQUARE_RCEIL`: ``2^e``, ``e = UE8M0_up(fl(amax·fl(1/448))) − 127``; codes
   ``RNE_E4M3(x·2^-e)``). Square blocks are "valid in both orientations": one copy serves the
   products over keys and over queries, and one ``wgmma`` of K = 32 sees one scale per output
   row, so each 32-token chunk of a contraction is one FP8 ``wgmma`` into a fresh accumulator,
   added to the running float32 sum times its power-of-two row scale (exact).
5. ``dV = Σ_chunks 2^e_P · (P_cᵀ·dO_q)``; ``dK = softmax_scale · Σ 2^(e_dS + e_Q)·(dS_cᵀ·Q_c)``;
   ``dQ = softmax_scale · Σ 2^(e_dS + e_K)·(dS_c·K_c)`` — float32 accumulation in the tensor
   core (Hopper's FP8 accumulation model: :mod:`fp4sim.formats.matmul`) and in registers.

Structure (FlashAttention-2/3's backward, arXiv:2307.08691, arXiv:2407.08608): the **dK/dV
kernel** runs one CTA per (batch, KV head, key tile of ``block_kv`` keys); its warpgroup keeps
K, V, dK and dV on chip and loops over every query tile of every query head of the GQA group
(so dK/dV are summed over the group in registers, no reduction pass), the next tile's Q, Qᵀ,
dO, dOᵀ and row data double-buffered by TMA. The **dQ kernel** runs one CTA per (batch, query
head, query tile) looping over key tiles. dQ is a separate pass rather than FA2/FA3's atomic
adds into a float32 dQ from the dK/dV kernel: float atomics add in a run-dependent order, so
dQ would differ between runs in its last bits; with a separate pass every gradient is a fixed
sequence of operations — **bitwise reproducible** — at the price of recomputing S and dP once
more (about 1.4x the FLOPs of the atomic variant).

FP8 ``wgmma`` reads both operands K-major, so each product gets its operands in the layout
it contracts over: K and V as stored (keys, D) for Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ, Q and dO as
(queries, D); for the chunked products Qᵀ, dOᵀ and Kᵀ arrive as (D, 32-token) chunks
(transposed once by XLA before the kernels); the quantized P/dS chunks are staged through
shared memory (the interpreter and Mosaic cannot feed an 8-bit A operand from registers).

Debug mode (:class:`BackwardConfig` ``debug_step``): the dK/dV kernel also returns, for step
``debug_step`` of every CTA (its query tile), the float32 p and dS tiles, their E4M3 codes and
the per-element block scales (:class:`BackwardDebug`) — what the tests compare bitwise with
the emulator's quantizer (:func:`fp4sim.attention.operands.fake_quantize`).

Assumptions: those of the forward (every query row sees a key; exponents above −127); a block
whose amax is below 448·2^-127 gets the scale code 0 (its codes are then 0, as the
emulator's). Public names: :data:`P_SQUARE_RCEIL`, :class:`BackwardConfig`,
:class:`BackwardDebug`, :class:`BackwardResiduals`, :func:`attention_fp8_backward`,
:func:`backward_inputs`, :func:`reference_backward`, :data:`SHIPPED_BACKWARD_CONFIGS`.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from typing import Any, NamedTuple

import numpy as np

from fp4sim import _checks
from fp4sim.attention import operands as sc
from fp4sim.formats.blocks import MXFP8_E4M3, Geometry

__all__ = [
    "P_SQUARE_RCEIL",
    "BackwardAblation",
    "BackwardConfig",
    "BackwardDebug",
    "BackwardResiduals",
    "backward_inputs",
    "attention_fp8_backward",
    "reference_backward",
    "SHIPPED_BACKWARD_CONFIGS",
    "INTERPRET_ONLY_BACKWARD_CONFIGS",
]

CHUNK = 32
"""Tokens per scale block of P and dS along each axis (and the K of one FP8 wgmma)."""

P_SQUARE_RCEIL = sc.OperandScaling(
    name="P 32x32 pow2 RCEIL", fmt=MXFP8_E4M3, geometry=Geometry.SQUARE
)
"""P as the dV operand: E4M3 with one UE8M0 (rounded up) per 32×32 (query × key) block."""

_LOG2E = float.fromhex("0x1.71547652b82fep+0")


class BackwardAblation(enum.Enum):
    """Leave one part out to see where the time goes (results are then wrong by design)."""

    NONE = "none"
    DKV_ONLY = "dkv_only"  # no dQ kernel (dQ = 0)
    DQ_ONLY = "dq_only"  # no dK/dV kernel (dK = dV = 0)
    PLAIN_CAST = "plain_cast"  # P and dS cast to E4M3 without their 32x32 block scales
    INPUTS_ONLY = "inputs_only"  # only the XLA side (dO_q, transposed chunks, rows): no kernel


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class BackwardConfig:
    """One compiled configuration of the backward kernels (hashable: a static jit argument).

    ``block_kv`` keys per dK/dV CTA (one warpgroup: 64), ``block_q`` queries per step of its
    loop (32..128, a multiple of 32); ``dq_block_q`` query rows per dQ CTA (64) and
    ``dq_block_kv`` keys per step of its loop. ``debug_step``: when an int, the dK/dV kernel
    also returns :class:`BackwardDebug` for that step of its loop. ``tc_accumulate``: the
    chunks of dQ/dK/dV are added by the tensor core into the running sums (rescaled to each
    chunk's power-of-two scale, exact) instead of fresh accumulators added in registers: fewer
    registers and one wgmma wait per chunk; hardware only (no interpret-mode rule), other
    accumulation bits and less accuracy: the FP8 wgmma truncates the running sum it is handed
    to 13 bits below the largest term once per chunk (``HOPPER_FP8_MODEL``), a bias of up to
    2^-13 per 32 tokens. ``dkv_warpgroups``: compute warpgroups per dK/dV CTA, each with its own
    key tile, sharing one TMA stream of Q, dO and their chunks (2 halves that traffic);
    ``dq_warpgroups`` likewise for the dQ kernel (query tiles sharing one TMA stream of K, Kᵀ,
    V). Two warpgroups run only in GPU interpret mode, where they give the one-warpgroup bits:
    on the hardware the warpgroups' cross-warp reductions share one Mosaic GPU scratch buffer
    and race (:func:`attention_fp8_backward` refuses them there; ``docs/kernels.md``; they
    were not faster on the H200 either: 5.74 against 5.69 ms at B2 S4096 H16 D128).
    ``ablation``: a :class:`BackwardAblation` (timing studies only).
    """

    block_kv: int = 64
    block_q: int = 64
    dq_block_q: int = 64
    dq_block_kv: int = 64
    causal: bool = False
    debug_step: int | None = None
    tc_accumulate: bool = False
    dkv_warpgroups: int = 1
    dq_warpgroups: int = 1
    ablation: BackwardAblation = BackwardAblation.NONE

    def __post_init__(self) -> None:
        if not isinstance(self.ablation, BackwardAblation):
            raise TypeError(
                f"BackwardConfig.ablation={self.ablation!r} must be a "
                f"BackwardAblation; allowed: {[m.name for m in BackwardAblation]}"
            )
        _checks.check_choice("BackwardConfig", "block_kv", self.block_kv, (64,))
        _checks.check_choice("BackwardConfig", "dkv_warpgroups", self.dkv_warpgroups, (1, 2))
        _checks.check_choice("BackwardConfig", "dq_warpgroups", self.dq_warpgroups, (1, 2))
        _checks.check_choice("BackwardConfig", "block_q", self.block_q, (32, 64, 96, 128))
        _checks.check_choice("BackwardConfig", "dq_block_q", self.dq_block_q, (64,))
        _checks.check_choice("BackwardConfig", "dq_block_kv", self.dq_block_kv, (32, 64, 96, 128))
        for name in ("causal", "tc_accumulate"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"BackwardConfig.{name}={getattr(self, name)!r} must be a bool")
        if self.debug_step is not None and self.dkv_warpgroups != 1:
            raise ValueError(
                f"BackwardConfig.debug_step={self.debug_step} needs dkv_warpgroups=1 "
                f"(the debug tiles of two warpgroups exceed the SMEM)"
            )
        if self.debug_step is not None:
            if (
                isinstance(self.debug_step, bool)
                or not isinstance(self.debug_step, int)
                or self.debug_step < 0
            ):
                raise ValueError(
                    f"BackwardConfig.debug_step={self.debug_step!r} must be None or an int >= 0"
                )

    def replace(self, **changes: Any) -> BackwardConfig:
        return dataclasses.replace(self, **changes)


SHIPPED_BACKWARD_CONFIGS: tuple[BackwardConfig, ...] = (
    BackwardConfig(),
    BackwardConfig(causal=True),
    BackwardConfig(block_q=128, dq_block_kv=128),
    BackwardConfig(causal=True, debug_step=0),
    BackwardConfig(tc_accumulate=True),
    BackwardConfig(causal=True, tc_accumulate=True),
)
"""The configurations the package ships (cross-lowered for sm_90a in the CPU tests)."""

INTERPRET_ONLY_BACKWARD_CONFIGS: tuple[BackwardConfig, ...] = (
    BackwardConfig(causal=True, dkv_warpgroups=2),
    BackwardConfig(causal=True, dkv_warpgroups=2, dq_warpgroups=2),
)
"""Two-warpgroup configurations: GPU interpret mode only (:class:`BackwardConfig`), where the
tests check that they give the one-warpgroup bits."""


class BackwardDebug(NamedTuple):
    """Step ``debug_step`` of every dK/dV CTA (tiles are (keys, queries) = Pᵀ orientation).

    ``p``, ``ds``: (B, Hkv, S/block_kv, block_kv, block_q) float32 p and dS before
    quantization; ``p_codes``, ``ds_codes``: the same shape, float8_e4m3fn; ``p_scale``,
    ``ds_scale``: the same shape, float32 block scale 2^e of each element. ``q_tile``:
    (B, Hkv, S/block_kv) int32 query-tile index (in units of block_q) and ``head``: the query
    head of that step.
    """

    p: Any
    ds: Any
    p_codes: Any
    ds_codes: Any
    p_scale: Any
    ds_scale: Any
    q_tile: Any
    head: Any


class BackwardResiduals(NamedTuple):
    """What the backward needs from the forward (a pytree): the kernel-ready operands
    (:class:`fp4sim.kernels.attention_mgpu.FP8Operands`), the forward output ``out``
    (B, T, Hq, D) and ``lse`` (B, Hq, T) float32 base-2 LSE."""

    ops: Any
    out: Any
    lse: Any


def _pow2(e: Any) -> Any:
    """2^e as float32 for int32 e in [-126, 127] (0 for e = -127), from the exponent bits."""
    import jax.numpy as jnp
    from jax import lax

    return lax.bitcast_convert_type(lax.shift_left(e + 127, 23), jnp.float32)


def _rceil_exponent(amax: Any) -> Any:
    """int32 e of the UE8M0 RCEIL scale of E4M3 blocks with max-abs ``amax`` (float32 >= 0):
    ``code = field(d) + (mantissa(d) != 0)`` for ``d = fl(amax·fl(1/448))`` (the bit rule of
    :func:`fp4sim.formats.blocks.quantize`), clamped to 254; ``e = code − 127``."""
    import jax.numpy as jnp
    from jax import lax

    d = amax * np.float32(np.float32(1.0) / np.float32(448.0))
    bits = lax.bitcast_convert_type(d, jnp.int32)
    field = lax.shift_right_logical(bits, 23) & 0xFF
    mant = bits & 0x7FFFFF
    # +1 iff a mantissa bit is set, except at 0xFE and for d <= 2^-127 (bool-free selects)
    up = jnp.where(
        mant == 0,
        0,
        jnp.where(field == 0xFE, 0, jnp.where(field == 0, jnp.where(mant <= 0x400000, 0, 1), 1)),
    )
    code = jnp.minimum(field + up, 0xFE)
    return code - 127


class SquareQuantized(NamedTuple):
    """A tile quantized with one power-of-two scale per 32×32 block (:func:`_square_quantize`).

    ``codes`` (R, C) float8_e4m3fn; ``row_scales[j]`` the (R,) row vector of block scales 2^e
    of the 32-column chunk j; ``scales`` the per-element (R, C) scales (only when asked for)."""

    codes: Any
    row_scales: tuple
    scales: Any


def _square_quantize(
    x: Any, rows: Any, cols: Any, *, with_scales: bool = False, plain: bool = False
) -> SquareQuantized:
    """E4M3 codes of ``x`` (R, C) float32 with one RCEIL power-of-two scale per 32×32 block
    (R, C multiples of 32); ``rows``/``cols`` are the int32 index arrays of x's layout.

    Per 32-column chunk a masked row reduction gives each row's max-abs; per 32-row block a
    masked column reduction of those gives a column vector holding the block amax of each
    column's chunk, on which the scale exponents are computed (C values, not R·C); the
    scales are broadcast back by one select per row block. Only full-tile selects and
    reductions along one axis: layouts Mosaic lowers, no scalars."""
    import jax.numpy as jnp
    from jax import lax

    n_r, n_c = x.shape
    if plain:  # BackwardAblation.PLAIN_CAST: scale 1 everywhere
        ones = jnp.where(rows >= 0, 1.0, 0.0)  # in x's layout
        return SquareQuantized(
            x.astype(jnp.float8_e4m3fn),
            (ones.max(axis=1),) * (n_c // CHUNK),
            ones if with_scales else None,
        )
    a = jnp.abs(x)
    grp = None  # each row's max-abs over its 32-column chunk, broadcast along the chunk
    for j in range(n_c // CHUNK):
        in_j = _in_chunk(cols, j)
        r = lax.broadcast_in_dim(jnp.where(in_j, a, 0.0).max(axis=1), (n_r, n_c), [0])
        grp = r if grp is None else jnp.where(in_j, r, grp)
    inv = scale = None
    for i in range(n_r // CHUNK):
        in_i = _in_chunk(rows, i)
        e = _rceil_exponent(jnp.where(in_i, grp, 0.0).max(axis=0))  # (C,): block exponents
        inv_i = lax.broadcast_in_dim(_pow2(-e), (n_r, n_c), [1])
        inv = inv_i if inv is None else jnp.where(in_i, inv_i, inv)
        if with_scales:
            s_i = lax.broadcast_in_dim(_pow2(e), (n_r, n_c), [1])
            scale = s_i if scale is None else jnp.where(in_i, s_i, scale)
    del grp, a
    codes = (x * inv).astype(jnp.float8_e4m3fn)
    # the row scales from the inverse scales (one tile fewer live): 2^e = 1/2^-e exactly,
    # and 0 where 2^-e is out of range (e = -127: an all-zero block, 2^127 kept as inf-safe 0)
    row_scales = tuple(
        _block_scale_from_inverse(jnp.where(_in_chunk(cols, j), inv, 0.0).max(axis=1))
        for j in range(n_c // CHUNK)
    )
    return SquareQuantized(codes, row_scales, scale)


def _block_scale_from_inverse(inv: Any) -> Any:
    """``2^e`` from ``2^-e`` (float32 powers of two from :func:`_pow2`): exact by exponent
    arithmetic; ``2^-e = 2^127`` (e = −127, the zero code) gives 0 as :func:`_pow2` does."""
    import jax.numpy as jnp
    from jax import lax

    bits = lax.bitcast_convert_type(inv, jnp.int32)
    out = lax.bitcast_convert_type((254 << 23) - bits, jnp.float32)
    return jnp.where(bits >= (254 << 23), 0.0, out)


def _recip_pow2(s: Any) -> Any:
    """1/s for float32 powers of two s in [2^-126, 2^126], exactly, from the bits."""
    import jax.numpy as jnp
    from jax import lax

    return lax.bitcast_convert_type(
        (254 << 23) - lax.bitcast_convert_type(s, jnp.int32), jnp.float32
    )


def _accumulate_chunks(issue: Any, accs: tuple, scales: tuple) -> tuple:
    """Run ``issue(j, refs)`` (wgmmas into the accumulator refs) for every chunk j with the
    running float32 sums ``accs`` kept *in the chunk's units*: before chunk j each sum is
    multiplied by ``s_{j-1}/s_j`` (row vectors of powers of two: exact, 1 for all-zero blocks
    whose scale is 0), the tensor core adds the chunk, and after the last chunk the sums are
    multiplied back by its scale. One wgmma wait per chunk for all sums (hardware only:
    ``pl.run_state`` with ``plgpu.ACC.init`` has no interpret-mode rule)."""
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    n = len(scales[0])
    safe = [[jnp.where(s[j] == 0.0, 1.0, s[j]) for j in range(n)] for s in scales]
    accs = list(accs)
    for j in range(n):
        for a in range(len(accs)):
            prev = 1.0 if j == 0 else safe[a][j - 1]
            ratio = prev * _recip_pow2(safe[a][j])
            accs[a] = accs[a] * lax.broadcast_in_dim(ratio, accs[a].shape, [0])
        accs = list(
            pl.run_state(functools.partial(issue, j))(tuple(plgpu.ACC.init(x) for x in accs))
        )
    return tuple(x * lax.broadcast_in_dim(sf[n - 1], x.shape, [0]) for x, sf in zip(accs, safe))


def _chunk_scalar(vec: Any, cols: Any, j: int) -> Any:
    """The (R,) row vector holding, in every row, the value of the column vector ``vec`` (C,)
    on its 32-column chunk ``j`` (constant there); ``cols`` the (R, C) column index array."""
    import jax.numpy as jnp
    from jax import lax

    b = lax.broadcast_in_dim(vec, cols.shape, [1])
    return jnp.where(_in_chunk(cols, j), b, 0.0).max(axis=1)


def _in_chunk(idx: Any, j: int) -> Any:
    """``idx // 32 == j`` for an int32 index array (one compare: Mosaic has no i1 vector
    conversions for combined masks)."""
    from jax import lax

    return lax.shift_right_logical(idx, 5) == j


_OUT_COLS = 64
"""Columns of a float32 gradient tile staged per TMA store (16 KiB for 64 rows: the staging
buffer is a quarter of the SMEM a whole 64 × 128 tile would take, so two CTAs fit an SM)."""


def _write_f32(acc: Any, o_smem: Any, dst: Any) -> None:
    """Store the float32 register tile ``acc`` (R, D) to the GMEM ref ``dst`` (R, D) through
    ``o_smem`` (R, 64), 64 columns at a time (the last TMA store is left in flight)."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    w = o_smem.shape[-1]
    for j in range(acc.shape[1] // w):
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # earlier stores have read it
        o_smem[...] = acc[:, j * w : (j + 1) * w]
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_smem, dst.at[:, pl.ds(j * w, w)])


# --- inputs -------------------------------------------------------------------------------------
def _chunks_t(x: Any) -> Any:
    """(B, N, H, D) -> (B, H, N/32, D, 32): 32-token chunks, transposed (D-major)."""
    import jax.numpy as jnp

    b, n, h, d = x.shape
    x = jnp.reshape(x, (b, n // CHUNK, CHUNK, h, d))
    return jnp.transpose(x, (0, 3, 1, 4, 2))


def backward_inputs(res: BackwardResiduals, d_out: Any, softmax_scale: float) -> dict[str, Any]:
    """The kernels' operands (XLA side): dO_q (E5M2 cast by the emulator's quantizer), its
    chunks, the Qᵀ/Kᵀ chunks, V as (B, S, Hkv, D), per-query rows ``[c·2^e_Q, LSE₂, D, 2^e_Q]``
    (B, Hq, 4, T) and per-key columns ``[2^e_K, 2^e_V]`` (B, Hkv, 2, S)."""
    import jax.numpy as jnp

    from fp4sim.kernels.attention_mgpu import TOKEN_BLOCK

    ops = res.ops
    c = float(np.float32(softmax_scale * _LOG2E))
    do_q = sc.fake_quantize(jnp.asarray(d_out, jnp.float32), sc.E5M2_CAST)
    delta = jnp.sum(do_q * res.out.astype(jnp.float32), axis=-1)  # (B, T, Hq)
    rep = lambda e: jnp.repeat(e.astype(jnp.int32), TOKEN_BLOCK, axis=-1)  # noqa: E731
    q2 = _pow2(rep(ops.q_exp))
    rows = jnp.stack(
        [q2 * np.float32(c), res.lse.astype(jnp.float32), jnp.transpose(delta, (0, 2, 1)), q2],
        axis=2,
    )
    cols = jnp.stack([_pow2(rep(ops.k_exp)), _pow2(rep(ops.v_exp))], axis=2)
    do8 = do_q.astype(jnp.float8_e5m2)
    return dict(
        q=ops.q_codes,
        qt=_chunks_t(ops.q_codes),
        k=ops.k_codes,
        kt=_chunks_t(ops.k_codes),
        v=jnp.transpose(ops.vt_codes, (0, 3, 1, 2)),
        do=do8,
        dot=_chunks_t(do8),
        rows=rows,
        cols=cols,
    )


def _check_residuals(res: BackwardResiduals, d_out: Any, cfg: BackwardConfig) -> None:
    import jax.numpy as jnp

    from fp4sim.kernels.attention_mgpu import TOKEN_BLOCK, FP8Operands

    if not isinstance(res, BackwardResiduals):
        raise TypeError(f"res must be BackwardResiduals, got {type(res).__name__}")
    ops = res.ops
    if not isinstance(ops, FP8Operands):
        raise TypeError(f"res.ops must be FP8Operands, got {type(ops).__name__}")
    if len(ops.q_codes.shape) != 4 or len(ops.k_codes.shape) != 4:
        raise ValueError(
            f"res.ops.q_codes/k_codes must be 4-D (B, N, H, D); got "
            f"{tuple(ops.q_codes.shape)}, {tuple(ops.k_codes.shape)}"
        )
    b, t, hq, d = ops.q_codes.shape
    _, s, hkv, dk = ops.k_codes.shape
    f8 = np.dtype(jnp.float8_e4m3fn)
    for name, x in (("q_codes", ops.q_codes), ("k_codes", ops.k_codes), ("vt_codes", ops.vt_codes)):
        if np.dtype(x.dtype) != f8:
            raise TypeError(f"res.ops.{name} has dtype {x.dtype}; allowed: float8_e4m3fn")
    if dk != d or ops.k_codes.shape[0] != b or hq % hkv:
        raise ValueError(
            f"res.ops.k_codes shape {tuple(ops.k_codes.shape)} does not fit q_codes "
            f"{tuple(ops.q_codes.shape)} (same batch and head_dim, Hq a multiple "
            f"of Hkv)"
        )
    if d not in (64, 128):
        raise ValueError(f"head_dim={d} is not supported; allowed: 64, 128")
    if tuple(ops.vt_codes.shape) != (b, hkv, d, s):
        raise ValueError(
            f"res.ops.vt_codes shape {tuple(ops.vt_codes.shape)} must be {(b, hkv, d, s)}"
        )
    for name, x, shp in (
        ("q_exp", ops.q_exp, (b, hq, t // TOKEN_BLOCK)),
        ("k_exp", ops.k_exp, (b, hkv, s // TOKEN_BLOCK)),
        ("v_exp", ops.v_exp, (b, hkv, s // TOKEN_BLOCK)),
    ):
        if tuple(x.shape) != shp:
            raise ValueError(f"res.ops.{name} shape {tuple(x.shape)} must be {shp}")
    if tuple(res.out.shape) != (b, t, hq, d):
        raise ValueError(f"res.out shape {tuple(res.out.shape)} must be {(b, t, hq, d)}")
    if tuple(res.lse.shape) != (b, hq, t) or np.dtype(res.lse.dtype) != np.float32:
        raise ValueError(
            f"res.lse must be float32 of shape {(b, hq, t)} (the forward's base-2 "
            f"LSE); got {res.lse.dtype} {tuple(res.lse.shape)}"
        )
    if tuple(d_out.shape) != (b, t, hq, d):
        raise ValueError(f"d_out shape {tuple(d_out.shape)} must be {(b, t, hq, d)} (O's shape)")
    if not jnp.issubdtype(d_out.dtype, jnp.floating):
        raise TypeError(f"d_out has dtype {d_out.dtype}; allowed: a floating dtype")
    for name, n, blk in (
        ("q tokens", t, max(cfg.block_q, cfg.dq_warpgroups * cfg.dq_block_q)),
        ("kv tokens", s, max(cfg.dkv_warpgroups * cfg.block_kv, cfg.dq_block_kv)),
    ):
        if n % blk:
            raise ValueError(f"{name}={n} must be a multiple of {blk} (the config's tiles)")
    if cfg.causal and s != t:
        raise ValueError(f"causal attention needs as many keys as queries; got T={t}, S={s}")
    if cfg.debug_step is not None:
        n_steps = (hq // hkv) * (t // cfg.block_q)
        if cfg.causal:
            last = (s - cfg.dkv_warpgroups * cfg.block_kv) // cfg.block_q  # last CTA's first
            n_steps = (hq // hkv) * (t // cfg.block_q - last)
        if cfg.debug_step >= n_steps:
            raise ValueError(
                f"debug_step={cfg.debug_step} out of range: the last key tile's loop "
                f"has {n_steps} steps"
            )


def attention_fp8_backward(
    res: BackwardResiduals,
    d_out: Any,
    *,
    softmax_scale: float | None = None,
    config: BackwardConfig = BackwardConfig(),
) -> Any:
    """dQ (B, T, Hq, D), dK, dV (B, S, Hkv, D) float32 of the FP8 forward's output (module
    docstring), or with a fourth :class:`BackwardDebug` when ``config.debug_step`` is set.
    Every argument is checked before anything is launched."""
    if not isinstance(config, BackwardConfig):
        raise TypeError(f"config={config!r} must be a BackwardConfig")
    _check_residuals(res, d_out, config)
    from fp4sim.kernels.harness import interpreting

    if config.tc_accumulate and interpreting():
        raise ValueError(
            "BackwardConfig.tc_accumulate=True needs the GPU: interpret mode has "
            "no rule for pl.run_state with plgpu.ACC.init; use False there"
        )
    if (config.dkv_warpgroups > 1 or config.dq_warpgroups > 1) and not interpreting():
        raise ValueError(
            f"BackwardConfig(dkv_warpgroups={config.dkv_warpgroups}, "
            f"dq_warpgroups={config.dq_warpgroups}): two compute warpgroups per CTA give wrong "
            f"gradients on the GPU with jax 0.11.2 (measured on an H200): the 32x32 block "
            f"scales need cross-warp column reductions, and Mosaic GPU's lowering gives every "
            f"warpgroup the same shared-memory scratch for them, so the two warpgroups race. Use 1 "
            f"(the default); 2 runs only in GPU interpret mode (harness.interpret), for study"
        )
    d = res.ops.q_codes.shape[3]
    softmax_scale = _checks.softmax_scale(softmax_scale, d)
    return _jitted()(res, d_out, float(softmax_scale), config)


@functools.cache
def _jitted():
    import jax

    return jax.jit(_backward, static_argnums=(2, 3))


def _backward(res: BackwardResiduals, d_out: Any, softmax_scale: float, cfg: BackwardConfig):
    import jax.numpy as jnp

    x = backward_inputs(res, d_out, softmax_scale)
    q_shape, k_shape = tuple(res.ops.q_codes.shape), tuple(res.ops.k_codes.shape)
    ab = cfg.ablation
    zq = jnp.zeros(q_shape, jnp.float32)
    zk = jnp.zeros(k_shape, jnp.float32)
    if ab is BackwardAblation.INPUTS_ONLY:  # keep every prepared input alive
        tot = sum(jnp.sum(v.astype(jnp.float32)) for v in x.values())
        return zq + tot, zk, zk
    if ab is BackwardAblation.DQ_ONLY:
        outs = (zk, zk)
    else:
        dkv = _build_dkv(q_shape, k_shape, softmax_scale, cfg)
        outs = dkv(x["q"], x["qt"], x["k"], x["v"], x["do"], x["dot"], x["rows"], x["cols"])
    if ab is BackwardAblation.DKV_ONLY:
        dq = zq
    else:
        dq = _build_dq(q_shape, k_shape, softmax_scale, cfg)(
            x["q"], x["k"], x["kt"], x["v"], x["do"], x["rows"], x["cols"]
        )
    if cfg.debug_step is None:
        dk, dv = outs
        return dq, dk, dv
    dk, dv, tiles, codes, meta = outs
    dbg = BackwardDebug(
        p=tiles[:, :, :, 0],
        ds=tiles[:, :, :, 1],
        p_scale=tiles[:, :, :, 2],
        ds_scale=tiles[:, :, :, 3],
        p_codes=_unchunk(codes[:, :, :, 0]),
        ds_codes=_unchunk(codes[:, :, :, 1]),
        q_tile=meta[..., 0],
        head=meta[..., 1],
    )
    return dq, dk, dv, dbg


def _unchunk(x: Any) -> Any:
    """(..., n_chunks, rows, 32) -> (..., rows, n_chunks·32)."""
    import jax.numpy as jnp

    x = jnp.moveaxis(x, -3, -2)
    return jnp.reshape(x, x.shape[:-2] + (x.shape[-2] * x.shape[-1],))


# --- the dK/dV kernel ---------------------------------------------------------------------------
def _when(cond: Any, fn: Any) -> None:
    """``pl.when`` for traced conditions, plain Python for static ones."""
    from jax.experimental import pallas as pl

    if isinstance(cond, (bool, np.bool_)):
        if cond:
            fn()
    else:
        pl.when(cond)(fn)


def _q_range(kv_tile: Any, bkv: int, bq: int, n_q: int, causal: bool):
    """First query tile and number of query tiles the key tile ``kv_tile`` meets."""
    import jax.numpy as jnp
    from jax import lax

    if not causal:
        return 0, n_q
    first = lax.div(kv_tile * bkv, jnp.int32(bq))
    return first, n_q - first


def _build_dkv(q_shape: tuple, k_shape: tuple, softmax_scale: float, cfg: BackwardConfig):
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    from fp4sim.kernels.harness import smem_transforms

    b_sz, t_len, hq, d = q_shape
    _, s_len, hkv, _ = k_shape
    bkv, bq = cfg.block_kv, cfg.block_q
    nch = bq // CHUNK
    group = hq // hkv
    n_q = t_len // bq
    n_kt = s_len // bkv
    n_wg = cfg.dkv_warpgroups
    f32, f8, f8b = jnp.float32, jnp.float8_e4m3fn, jnp.float8_e5m2
    wg = plgpu.Layout.WGMMA
    row_l, col_l = wg.reduce(1), wg.reduce(0)
    debug = cfg.debug_step is not None
    plain = cfg.ablation is BackwardAblation.PLAIN_CAST
    cs = np.float32(softmax_scale)
    slots = 2

    def bc_row(x, n):
        return lax.broadcast_in_dim(x, (bkv, n), [0])

    def bc_col(x):
        return lax.broadcast_in_dim(x, (bkv, bq), [1])

    def kernel(
        q_ref,
        qt_ref,
        k_ref,
        v_ref,
        do_ref,
        dot_ref,
        rows_ref,
        cols_ref,
        dk_ref,
        dv_ref,
        dbg_t_ref,
        dbg_c_ref,
        scoped,
    ):
        bi = lax.axis_index("batch")
        kvh = lax.axis_index("heads")
        w = lax.axis_index("wg") if n_wg > 1 else 0  # this warpgroup's key tile in the CTA
        cta = lax.axis_index("kv_seq")
        kt = cta * n_wg + w
        (
            (
                k_all,
                v_all,
                kc_all,
                q_smem,
                qt_smem,
                do_smem,
                dot_smem,
                r_smem,
                pt_all,
                dst_all,
                o_all,
                dbg_all,
            ),
            bars,
            kv_bar,
            cons,
        ) = scoped
        if n_wg > 1:  # per-warpgroup buffers (one warpgroup: allocated without the axis)
            k_smem, v_smem, kc_smem = k_all.at[w], v_all.at[w], kc_all.at[w]
            pt_smem, dst_smem, o_smem = pt_all.at[w], dst_all.at[w], o_all.at[w]
            dbg_t_smem = dbg_all.at[w] if debug else None
        else:
            k_smem, v_smem, kc_smem, pt_smem, dst_smem, o_smem, dbg_t_smem = (
                k_all,
                v_all,
                kc_all,
                pt_all,
                dst_all,
                o_all,
                dbg_all,
            )
        k0 = kt * bkv
        # every warpgroup of the CTA runs the loop of its first key tile (the later tiles'
        # extra causal steps are fully masked: p = 0)
        first, n_per_head = _q_range(cta * n_wg, bkv, bq, n_q, cfg.causal)
        n_steps = n_per_head * group

        def locate(step):
            g = lax.div(step, n_per_head)
            return kvh * group + g, first + lax.rem(step, n_per_head)

        def issue(step, slot):
            head, qi = locate(step)
            t0 = qi * bq
            srcs = (
                q_ref.at[bi, pl.ds(t0, bq), head],
                qt_ref.at[bi, head, pl.ds(t0 // CHUNK, nch)],
                do_ref.at[bi, pl.ds(t0, bq), head],
                dot_ref.at[bi, head, pl.ds(t0 // CHUNK, nch)],
                rows_ref.at[bi, head, :, pl.ds(t0, bq)],
            )
            dsts = (q_smem, qt_smem, do_smem, dot_smem, r_smem)
            for src, dst, bar in zip(srcs, dsts, bars):
                plgpu.copy_gmem_to_smem(src, dst.at[slot], bar.at[slot])

        plgpu.copy_gmem_to_smem(k_ref.at[bi, pl.ds(k0, bkv), kvh], k_smem, kv_bar.at[3 * w])
        plgpu.copy_gmem_to_smem(v_ref.at[bi, pl.ds(k0, bkv), kvh], v_smem, kv_bar.at[3 * w + 1])
        plgpu.copy_gmem_to_smem(
            cols_ref.at[bi, kvh, :, pl.ds(k0, bkv)], kc_smem, kv_bar.at[3 * w + 2]
        )

        def prologue():  # warpgroup 0 feeds the shared ring
            for i in range(min(slots, group * n_q)):  # static bound: no slice past the end
                pl.when(i < n_steps)(functools.partial(issue, i, i))

        _when(w == 0, prologue)
        for i in range(3):
            plgpu.barrier_wait(kv_bar.at[3 * w + i])
        kscale = plgpu.load(kc_smem.at[0], layout=row_l)
        vscale = plgpu.load(kc_smem.at[1], layout=row_l)

        def step_fn(step, carry):
            dk_acc, dv_acc = carry
            # index tiles made per step (cheap, from the lane ids): not live across the loop
            rows = plgpu.broadcasted_iota(jnp.int32, (bkv, bq), 0, layout=wg)
            cols = plgpu.broadcasted_iota(jnp.int32, (bkv, bq), 1, layout=wg)
            slot = lax.rem(step, jnp.int32(slots))
            head, qi = locate(step)
            for bar in bars:
                plgpu.barrier_wait(bar.at[slot])

            def products(s_ref, dp_ref):  # Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ, issued back to back
                plgpu.wgmma(s_ref, k_smem, q_smem.at[slot].T)
                plgpu.wgmma(dp_ref, v_smem, do_smem.at[slot].T)
                return s_ref[...], dp_ref[...]

            s_t, dp_t = pl.run_scoped(
                products, plgpu.ACC((bkv, bq), f32), plgpu.ACC((bkv, bq), f32)
            )
            cq = plgpu.load(r_smem.at[slot, 0], layout=col_l)
            lse = plgpu.load(r_smem.at[slot, 1], layout=col_l)
            u = (s_t * bc_row(kscale, bq)) * bc_col(cq)
            p = jnp.exp2(u - bc_col(lse))
            if cfg.causal:
                p = jnp.where(rows + k0 <= cols + qi * bq, p, 0.0)
            pq = _square_quantize(p, rows, cols, with_scales=debug, plain=plain)
            p_codes = pq.codes
            for j in range(nch):
                pt_smem.at[j][...] = p_codes[:, j * CHUNK : (j + 1) * CHUNK]
            dp_t = dp_t * bc_row(vscale, bq)
            dlt = plgpu.load(r_smem.at[slot, 2], layout=col_l)
            ds = p * (dp_t - bc_col(dlt))
            dsq = _square_quantize(ds, rows, cols, with_scales=debug, plain=plain)
            ds_codes = dsq.codes
            for j in range(nch):
                dst_smem.at[j][...] = ds_codes[:, j * CHUNK : (j + 1) * CHUNK]
            plgpu.commit_smem()
            if debug:

                @pl.when(step == cfg.debug_step)
                def _dump():
                    for i, tile in enumerate((p, ds, pq.scales, dsq.scales)):
                        dbg_t_smem.at[i][...] = tile
                    plgpu.commit_smem()
                    cta = (bi * hkv + kvh) * n_kt + kt  # flat: TMA strides at most 5 dims
                    for i in range(4):
                        plgpu.copy_smem_to_gmem(dbg_t_smem.at[i], dbg_t_ref.at[cta, i])
                    for j in range(nch):
                        plgpu.copy_smem_to_gmem(pt_smem.at[j], dbg_c_ref.at[2 * cta, j])
                        plgpu.copy_smem_to_gmem(dst_smem.at[j], dbg_c_ref.at[2 * cta + 1, j])
                    plgpu.wait_smem_to_gmem(0, wait_read_only=True)

            q2 = plgpu.load(r_smem.at[slot, 3], layout=col_l)  # 2^e_Q, constant per chunk
            sps = tuple(pq.row_scales)
            sds = tuple(
                dsq.row_scales[j] * _chunk_scalar(q2, cols, j)  # 2^(e_dS + e_Q)
                for j in range(nch)
            )
            if cfg.tc_accumulate:

                def both(j, refs):  # dV += Pᵀ_j·dO_j and dK += dSᵀ_j·Q_j in the tensor core
                    dv_ref, dk_ref = refs
                    plgpu.wgmma(dv_ref, pt_smem.at[j], dot_smem.at[slot, j].T)
                    plgpu.wgmma(dk_ref, dst_smem.at[j], qt_smem.at[slot, j].T)

                dv_acc, dk_acc = _accumulate_chunks(both, (dv_acc, dk_acc), (sps, sds))
            else:
                for j in range(nch):

                    def dv_c(acc_ref, j=j):  # dV += Pᵀ_j · dO_j (K = 32 queries)
                        plgpu.wgmma(acc_ref, pt_smem.at[j], dot_smem.at[slot, j].T)
                        return acc_ref[...]

                    def dk_c(acc_ref, j=j):  # dK += dSᵀ_j · Q_j
                        plgpu.wgmma(acc_ref, dst_smem.at[j], qt_smem.at[slot, j].T)
                        return acc_ref[...]

                    dv_acc = dv_acc + pl.run_scoped(dv_c, plgpu.ACC((bkv, d), f32)) * bc_row(
                        sps[j], d
                    )
                    dk_acc = dk_acc + pl.run_scoped(dk_c, plgpu.ACC((bkv, d), f32)) * bc_row(
                        sds[j], d
                    )
            nxt = step + slots
            if n_wg > 1:  # every warpgroup is done with the slot before warpgroup 0 refills it
                plgpu.barrier_arrive(cons.at[slot])

            def refill():
                if n_wg > 1:
                    plgpu.barrier_wait(cons.at[slot])  # observed every step, refill or not

                @pl.when(nxt < n_steps)
                def _():  # the slot's generic-proxy reads are ordered before the TMA refill
                    plgpu.commit_smem()
                    issue(nxt, slot)

            _when(w == 0, refill)
            return dk_acc, dv_acc

        zero = plgpu.layout_cast(jnp.full((bkv, d), 0.0, f32), wg)
        dk_acc, dv_acc = lax.fori_loop(0, n_steps, step_fn, (zero, zero))
        _write_f32(dk_acc * cs, o_smem, dk_ref.at[bi, pl.ds(k0, bkv), kvh])
        _write_f32(dv_acc, o_smem, dv_ref.at[bi, pl.ds(k0, bkv), kvh])
        plgpu.wait_smem_to_gmem(0)

    def entry(q_ref, qt_ref, k_ref, v_ref, do_ref, dot_ref, rows_ref, cols_ref, *outs):
        dk_ref, dv_ref = outs[0], outs[1]
        dbg = outs[2:] if debug else (None, None)
        tr = smem_transforms
        lead = (n_wg,) if n_wg > 1 else ()
        scratch = [
            plgpu.SMEM(lead + (bkv, d), f8, transforms=tr(f8, d)),
            plgpu.SMEM(lead + (bkv, d), f8, transforms=tr(f8, d)),
            plgpu.SMEM(lead + (2, bkv), f32),
            plgpu.SMEM((slots, bq, d), f8, transforms=tr(f8, d)),
            plgpu.SMEM((slots, nch, d, CHUNK), f8, transforms=tr(f8, CHUNK)),
            plgpu.SMEM((slots, bq, d), f8b, transforms=tr(f8b, d)),
            plgpu.SMEM((slots, nch, d, CHUNK), f8b, transforms=tr(f8b, CHUNK)),
            plgpu.SMEM((slots, 4, bq), f32),
            plgpu.SMEM(lead + (nch, bkv, CHUNK), f8, transforms=tr(f8, CHUNK)),
            plgpu.SMEM(lead + (nch, bkv, CHUNK), f8, transforms=tr(f8, CHUNK)),
            plgpu.SMEM(lead + (bkv, _OUT_COLS), f32, transforms=tr(f32, _OUT_COLS)),
            plgpu.SMEM(lead + (4, bkv, bq), f32) if debug else None,
        ]
        pl.run_scoped(
            lambda *args: kernel(
                q_ref,
                qt_ref,
                k_ref,
                v_ref,
                do_ref,
                dot_ref,
                rows_ref,
                cols_ref,
                dk_ref,
                dv_ref,
                *dbg,
                args,
            ),
            scratch,
            tuple(plgpu.Barrier(num_barriers=slots) for _ in range(5)),
            plgpu.Barrier(num_barriers=3 * n_wg),
            plgpu.Barrier(num_arrivals=n_wg, num_barriers=slots) if n_wg > 1 else None,
            **({"collective_axes": "wg"} if n_wg > 1 else {}),
        )

    out_types = [jax.ShapeDtypeStruct((b_sz, s_len, hkv, d), f32)] * 2
    if debug:
        out_types += [
            jax.ShapeDtypeStruct((b_sz * hkv * n_kt, 4, bkv, bq), f32),
            jax.ShapeDtypeStruct((b_sz * hkv * n_kt * 2, nch, bkv, CHUNK), f8),
        ]
    threads = {"num_threads": n_wg, "thread_name": "wg"} if n_wg > 1 else {}
    call = plgpu.kernel(
        entry,
        out_type=out_types,
        grid=(hkv, n_kt // n_wg, b_sz),
        grid_names=("heads", "kv_seq", "batch"),
        compiler_params=plgpu.CompilerParams(approx_math=True),
        **threads,
    )

    def run(*args):
        outs = call(*args)
        if not debug:
            return outs[0], outs[1]
        # the debug step's query tile and head (the kernel's locate(), on the XLA side)
        kt = jnp.arange(n_kt, dtype=jnp.int32)
        first = ((kt // n_wg) * n_wg * bkv) // bq if cfg.causal else jnp.zeros_like(kt)
        n_per = n_q - first
        qi = first + cfg.debug_step % n_per  # (n_kt,)
        head = (
            jnp.arange(hkv, dtype=jnp.int32)[:, None] * group + (cfg.debug_step // n_per)[None, :]
        )  # (hkv, n_kt)
        meta = jnp.stack([jnp.broadcast_to(qi, (hkv, n_kt)), head], axis=-1)
        meta = jnp.broadcast_to(meta, (b_sz, hkv, n_kt, 2))
        tiles = jnp.reshape(outs[2], (b_sz, hkv, n_kt, 4, bkv, bq))
        codes = jnp.reshape(outs[3], (b_sz, hkv, n_kt, 2, nch, bkv, CHUNK))
        return outs[0], outs[1], tiles, codes, meta

    return run


# --- the dQ kernel ------------------------------------------------------------------------------
def _build_dq(q_shape: tuple, k_shape: tuple, softmax_scale: float, cfg: BackwardConfig):
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    from fp4sim.kernels.harness import smem_transforms

    b_sz, t_len, hq, d = q_shape
    _, s_len, hkv, _ = k_shape
    bq, bkv = cfg.dq_block_q, cfg.dq_block_kv
    nch = bkv // CHUNK
    group = hq // hkv
    n_kv = s_len // bkv
    n_wg = cfg.dq_warpgroups
    f32, f8, f8b = jnp.float32, jnp.float8_e4m3fn, jnp.float8_e5m2
    wg = plgpu.Layout.WGMMA
    row_l, col_l = wg.reduce(1), wg.reduce(0)
    plain = cfg.ablation is BackwardAblation.PLAIN_CAST
    cs = np.float32(softmax_scale)
    slots = 2

    def bc_row(x, n):
        return lax.broadcast_in_dim(x, (bq, n), [0])

    def bc_col(x):
        return lax.broadcast_in_dim(x, (bq, bkv), [1])

    def kernel(q_ref, k_ref, kt_ref, v_ref, do_ref, rows_ref, cols_ref, dq_ref, scoped):
        bi = lax.axis_index("batch")
        head = lax.axis_index("heads")
        cta = lax.axis_index("q_seq")
        if cfg.causal:  # the longest loops (last query tiles) launch first
            cta = (t_len // (n_wg * bq) - 1) - cta
        w = lax.axis_index("wg") if n_wg > 1 else 0  # this warpgroup's query tile in the CTA
        (
            (q_all, do_all, r_all, k_smem, kt_smem, v_smem, c_smem, ds_all, o_all),
            bars,
            q_bar,
            cons,
        ) = scoped
        if n_wg > 1:
            q_smem, do_smem, r_smem = q_all.at[w], do_all.at[w], r_all.at[w]
            ds_smem, o_smem = ds_all.at[w], o_all.at[w]
        else:
            q_smem, do_smem, r_smem, ds_smem, o_smem = q_all, do_all, r_all, ds_all, o_all
        kvh = lax.div(head, jnp.int32(group))
        q0 = (cta * n_wg + w) * bq
        # every warpgroup runs the loop of the CTA's last query tile (the earlier tiles' extra
        # causal steps are fully masked: p = 0)
        q_end = (cta + 1) * (n_wg * bq)
        n_steps = lax.div(q_end + (bkv - 1), jnp.int32(bkv)) if cfg.causal else n_kv

        def issue(step, slot):
            s0 = step * bkv
            srcs = (
                k_ref.at[bi, pl.ds(s0, bkv), kvh],
                kt_ref.at[bi, kvh, pl.ds(s0 // CHUNK, nch)],
                v_ref.at[bi, pl.ds(s0, bkv), kvh],
                cols_ref.at[bi, kvh, :, pl.ds(s0, bkv)],
            )
            for src, dst, bar in zip(srcs, (k_smem, kt_smem, v_smem, c_smem), bars):
                plgpu.copy_gmem_to_smem(src, dst.at[slot], bar.at[slot])

        plgpu.copy_gmem_to_smem(q_ref.at[bi, pl.ds(q0, bq), head], q_smem, q_bar.at[3 * w])
        plgpu.copy_gmem_to_smem(do_ref.at[bi, pl.ds(q0, bq), head], do_smem, q_bar.at[3 * w + 1])
        plgpu.copy_gmem_to_smem(
            rows_ref.at[bi, head, :, pl.ds(q0, bq)], r_smem, q_bar.at[3 * w + 2]
        )

        def prologue():  # warpgroup 0 feeds the shared ring
            for i in range(min(slots, n_kv)):  # static bound: no slice past the end
                pl.when(i < n_steps)(functools.partial(issue, i, i))

        _when(w == 0, prologue)
        for i in range(3):
            plgpu.barrier_wait(q_bar.at[3 * w + i])
        cq = plgpu.load(r_smem.at[0], layout=row_l)
        lse = plgpu.load(r_smem.at[1], layout=row_l)
        dlt = plgpu.load(r_smem.at[2], layout=row_l)

        def step_fn(step, dq_acc):
            # index tiles made per step (cheap, from the lane ids): not live across the loop
            rows = plgpu.broadcasted_iota(jnp.int32, (bq, bkv), 0, layout=wg)
            cols = plgpu.broadcasted_iota(jnp.int32, (bq, bkv), 1, layout=wg)
            slot = lax.rem(step, jnp.int32(slots))
            for bar in bars:
                plgpu.barrier_wait(bar.at[slot])

            def products(s_ref, dp_ref):  # S = Q·Kᵀ and dP = dO·Vᵀ, issued back to back
                plgpu.wgmma(s_ref, q_smem, k_smem.at[slot].T)
                plgpu.wgmma(dp_ref, do_smem, v_smem.at[slot].T)
                return s_ref[...], dp_ref[...]

            s, dp = pl.run_scoped(products, plgpu.ACC((bq, bkv), f32), plgpu.ACC((bq, bkv), f32))
            kscale = plgpu.load(c_smem.at[slot, 0], layout=col_l)
            vscale = plgpu.load(c_smem.at[slot, 1], layout=col_l)
            u = (s * bc_col(kscale)) * bc_row(cq, bkv)
            p = jnp.exp2(u - bc_row(lse, bkv))
            if cfg.causal:
                p = jnp.where(cols + step * bkv <= rows + q0, p, 0.0)
            dp = dp * bc_col(vscale)
            ds = p * (dp - bc_row(dlt, bkv))
            dsq = _square_quantize(ds, rows, cols, plain=plain)
            ds_codes = dsq.codes
            for j in range(nch):
                ds_smem.at[j][...] = ds_codes[:, j * CHUNK : (j + 1) * CHUNK]
            plgpu.commit_smem()
            sds = tuple(
                dsq.row_scales[j] * _chunk_scalar(kscale, cols, j)  # 2^(e_dS + e_K)
                for j in range(nch)
            )
            if cfg.tc_accumulate:

                def one(j, refs):  # dQ += dS_j · K_j in the tensor core
                    plgpu.wgmma(refs[0], ds_smem.at[j], kt_smem.at[slot, j].T)

                (dq_acc,) = _accumulate_chunks(one, (dq_acc,), (sds,))
            else:
                for j in range(nch):

                    def dq_c(acc_ref, j=j):  # dQ += dS_j · K_j (K = 32 keys)
                        plgpu.wgmma(acc_ref, ds_smem.at[j], kt_smem.at[slot, j].T)
                        return acc_ref[...]

                    dq_acc = dq_acc + pl.run_scoped(dq_c, plgpu.ACC((bq, d), f32)) * bc_row(
                        sds[j], d
                    )
            nxt = step + slots
            if n_wg > 1:  # every warpgroup is done with the slot before warpgroup 0 refills it
                plgpu.barrier_arrive(cons.at[slot])

            def refill():
                if n_wg > 1:
                    plgpu.barrier_wait(cons.at[slot])  # observed every step, refill or not

                @pl.when(nxt < n_steps)
                def _():  # the slot's generic-proxy reads are ordered before the TMA refill
                    plgpu.commit_smem()
                    issue(nxt, slot)

            _when(w == 0, refill)
            return dq_acc

        zero = plgpu.layout_cast(jnp.full((bq, d), 0.0, f32), wg)
        dq_acc = lax.fori_loop(0, n_steps, step_fn, zero)
        _write_f32(dq_acc * cs, o_smem, dq_ref.at[bi, pl.ds(q0, bq), head])
        plgpu.wait_smem_to_gmem(0)

    def entry(q_ref, k_ref, kt_ref, v_ref, do_ref, rows_ref, cols_ref, dq_ref):
        tr = smem_transforms
        lead = (n_wg,) if n_wg > 1 else ()
        scratch = [
            plgpu.SMEM(lead + (bq, d), f8, transforms=tr(f8, d)),
            plgpu.SMEM(lead + (bq, d), f8b, transforms=tr(f8b, d)),
            plgpu.SMEM(lead + (4, bq), f32),
            plgpu.SMEM((slots, bkv, d), f8, transforms=tr(f8, d)),
            plgpu.SMEM((slots, nch, d, CHUNK), f8, transforms=tr(f8, CHUNK)),
            plgpu.SMEM((slots, bkv, d), f8, transforms=tr(f8, d)),
            plgpu.SMEM((slots, 2, bkv), f32),
            plgpu.SMEM(lead + (nch, bq, CHUNK), f8, transforms=tr(f8, CHUNK)),
            plgpu.SMEM(lead + (bq, _OUT_COLS), f32, transforms=tr(f32, _OUT_COLS)),
        ]
        pl.run_scoped(
            lambda *args: kernel(
                q_ref, k_ref, kt_ref, v_ref, do_ref, rows_ref, cols_ref, dq_ref, args
            ),
            scratch,
            tuple(plgpu.Barrier(num_barriers=slots) for _ in range(4)),
            plgpu.Barrier(num_barriers=3 * n_wg),
            plgpu.Barrier(num_arrivals=n_wg, num_barriers=slots) if n_wg > 1 else None,
            **({"collective_axes": "wg"} if n_wg > 1 else {}),
        )

    threads = {"num_threads": n_wg, "thread_name": "wg"} if n_wg > 1 else {}
    return plgpu.kernel(
        entry,
        out_type=jax.ShapeDtypeStruct((b_sz, t_len, hq, d), f32),
        grid=(hq, t_len // (n_wg * bq), b_sz),
        grid_names=("heads", "q_seq", "batch"),
        compiler_params=plgpu.CompilerParams(approx_math=True),
        **threads,
    )


# --- float64 reference of the kernels' numerics (the test oracle) -------------------------------
def reference_backward(
    res: BackwardResiduals,
    d_out: Any,
    *,
    softmax_scale: float,
    causal: bool,
    scores: Any = None,
    dp: Any = None,
    delta: Any = None,
) -> dict[str, np.ndarray]:
    """NumPy evaluation of the module docstring's steps 1-5 on NumPy residuals.

    float32 where the kernels' result is bit-defined given S and dP (u, p with a correctly
    rounded exp2, dS, the quantized P and dS by the emulator's quantizer
    :func:`fp4sim.attention.operands.fake_quantize`), float64 for the three gradient products
    (which the tensor core accumulates in its own order). ``scores`` (B, Hq, T, S) and ``dp``
    (B, Hq, T, S) float32: the raw products ``Q_c·K_cᵀ`` and ``dO_q·V_cᵀ`` to use instead of
    the exact ones (e.g. from :func:`fp4sim.formats.matmul.wgmma_fp8_dot`); ``delta``
    (B, T, Hq) float32 instead of the float64 row sums. Returns ``dq`` (B, T, Hq, D), ``dk``,
    ``dv`` (B, S, Hkv, D) float64, their sums of absolute terms ``abs_dq``, ``abs_dk``,
    ``abs_dv`` (for error bounds), and per query head ``p``, ``ds``, ``p_q``, ``ds_q``
    (B, Hq, T, S) float32."""
    ops = res.ops
    qc = np.asarray(ops.q_codes).astype(np.float32)
    kc = np.asarray(ops.k_codes).astype(np.float32)
    vc = np.swapaxes(np.asarray(ops.vt_codes).astype(np.float32), -1, -2)  # (B, Hkv, S, D)
    b, t, hq, d = qc.shape
    s, hkv = kc.shape[1], kc.shape[2]
    group = hq // hkv
    rep = lambda e: np.repeat(np.asarray(e, np.int64), CHUNK, axis=-1)  # noqa: E731
    eq, ek, ev = rep(ops.q_exp), rep(ops.k_exp), rep(ops.v_exp)
    c = np.float32(softmax_scale * _LOG2E)
    cs = np.float32(softmax_scale)
    lse = np.asarray(res.lse, np.float64)
    out = np.asarray(res.out).astype(np.float32)
    do_q = np.asarray(sc.fake_quantize(np.asarray(d_out, np.float32), sc.E5M2_CAST), np.float32)
    if delta is None:
        delta = np.sum(do_q.astype(np.float64) * out, axis=-1).astype(np.float32)
    delta = np.asarray(delta, np.float32)
    r = {
        name: np.zeros((b, n, h, d))
        for name, n, h in (
            ("dq", t, hq),
            ("dk", s, hkv),
            ("dv", s, hkv),
            ("abs_dq", t, hq),
            ("abs_dk", s, hkv),
            ("abs_dv", s, hkv),
        )
    }
    for name in ("p", "ds", "p_q", "ds_q"):
        r[name] = np.zeros((b, hq, t, s), np.float32)
    visible = np.tril(np.ones((t, s), bool)) if causal else np.ones((t, s), bool)
    for bi in range(b):
        for h in range(hq):
            kh = h // group
            if scores is None:
                sc_ = qc[bi, :, h].astype(np.float64) @ kc[bi, :, kh].astype(np.float64).T
            else:
                sc_ = np.asarray(scores)[bi, h]
            z = sc_.astype(np.float32) * np.exp2(ek[bi, kh]).astype(np.float32)[None, :]
            cq = (c * np.exp2(eq[bi, h]).astype(np.float32)).astype(np.float32)
            u = (z.astype(np.float32) * cq[:, None]).astype(np.float32)
            with np.errstate(invalid="ignore", over="ignore"):
                p = np.exp2(u.astype(np.float64) - lse[bi, h][:, None]).astype(np.float32)
            p = np.where(visible, p, np.float32(0.0))
            if dp is None:
                dpr = do_q[bi, :, h].astype(np.float64) @ vc[bi, kh].astype(np.float64).T
            else:
                dpr = np.asarray(dp)[bi, h]
            dpv = dpr.astype(np.float32) * np.exp2(ev[bi, kh]).astype(np.float32)[None, :]
            ds = p * (dpv.astype(np.float32) - delta[bi, :, h][:, None]).astype(np.float32)
            ds = ds.astype(np.float32)
            p_q = np.asarray(sc.fake_quantize(p, P_SQUARE_RCEIL), np.float32)
            ds_q = np.asarray(sc.fake_quantize(ds, sc.DS_SQUARE_RCEIL), np.float32)
            q_hat = qc[bi, :, h].astype(np.float64) * np.exp2(eq[bi, h])[:, None]
            k_hat = kc[bi, :, kh].astype(np.float64) * np.exp2(ek[bi, kh])[:, None]
            dq64, pq64, do64 = (
                ds_q.astype(np.float64),
                p_q.astype(np.float64),
                do_q[bi, :, h].astype(np.float64),
            )
            r["dq"][bi, :, h] = float(cs) * (dq64 @ k_hat)
            r["dk"][bi, :, kh] += float(cs) * (dq64.T @ q_hat)
            r["dv"][bi, :, kh] += pq64.T @ do64
            r["abs_dq"][bi, :, h] = float(cs) * (np.abs(dq64) @ np.abs(k_hat))
            r["abs_dk"][bi, :, kh] += float(cs) * (np.abs(dq64).T @ np.abs(q_hat))
            r["abs_dv"][bi, :, kh] += np.abs(pq64).T @ np.abs(do64)
            for name, x in (("p", p), ("ds", ds), ("p_q", p_q), ("ds_q", ds_q)):
                r[name][bi, h] = x
    return r

"""Microscaled FP8 attention forward on Hopper (sm_90a) as a Pallas Mosaic GPU kernel.

This module owns the GPU forward of the *token-block FP8* attention route: Q, K and V in E4M3
with one power-of-two exponent per 32 tokens × head_dim (FLAMIA's token-block geometry,
:data:`fp4sim.formats.blocks.Geometry.TOKEN_BLOCK` with the ``RCEIL`` rule), P quantized to E4M3
in the kernel, float32 accumulation, consistent (or mismatched) normalization, causal or not,
head_dim 64/128, GQA. It also owns the kernel's numerical specification and an exp-free, bit-exact
P converter that the tests check bitwise against an independent float64 oracle.

The warp-specialised pipeline (two compute warpgroups ping-ponged by a schedule barrier, one
TMA warpgroup feeding a ring of K, Vᵀ and key-column tiles, causal loops) is shared with the
Direct-P kernel and lives in :mod:`fp4sim.kernels.attention_common`; this module plugs in the
FP8 numerics.

Hopper-specific choices, each forced by a hardware rule (NVIDIA PTX ISA, docs.nvidia.com/cuda/parallel-thread-execution; FlashAttention-3, arXiv:2407.08608):

* FP8 ``wgmma`` wants both operands K-major: K is stored (keys, D) and passed transposed, V is
  stored transposed, **Vᵀ (D, keys)**, so the PV product reads it K-major.
* The E4M3 P tile cannot be fed to ``wgmma`` from registers: its float32 accumulator layout is
  not the 8-bit A-operand layout and Mosaic has no relayout between them. P is therefore staged
  through shared memory, which is also what GPU interpret mode needs (no A-from-registers, no
  ``pl.run_state``): the hardware and the CPU interpreter run *the same kernel*. Each PV product
  goes into a fresh accumulator that is added to the running one in registers.
* The scales factor out of the score product exactly: ``z = (Q_c·K_cᵀ)·2^(e_Q + e_K)``
  (token-block exponents are per row and per column of the score tile).
* The PV contraction runs over tokens, where both P's block scale and V's token-block exponent
  live; Hopper has no block-scaled MMA, so one ``wgmma`` over a key tile needs the product of the
  two scales to be constant along the tile. The kernel therefore *folds V's exponent into P's
  block scale*: for query row r and key tile T it picks one exponent
  ``F = A + ⌈t_max⌉ − 8`` (``A`` the largest V exponent among the row's visible keys of the
  tile, ``t_max`` the row's largest log2-domain score in the tile) and quantizes
  ``P_c(j) = E4M3(2^(t_j) · 2^(e_V(j) − F))`` (≤ 256: never saturating). P's scale for the
  32-key block B is ``2^(F − e_V(B))`` — a per-block power-of-two scale — and
  ``Σ_j p̃_j v_j = 2^F · Σ_j P_c(j)·V_c(j)``: one FP8 ``wgmma`` per tile.

The kernel's numerics, step by step (``c = fl32(softmax_scale·log2 e)``, ``c_r = c·2^e_Q(r)``
exact; every product of a float32 by a power of two is exact, so no step depends on fused
multiply-add contraction):

1. ``z = fl(S·2^e_K(j))`` with ``S = Q_c·K_cᵀ`` from the FP8 tensor core (float32 accumulation,
   not correctly rounded on Hopper: :mod:`fp4sim.kernels.wgmma_probe`); masked keys ``−inf``.
2. ``m ← max(m, max_j z_j)`` (running max of z); ``t_j = fl(fl(z_j − m)·c_r) ≤ 0``.
3. ``F = A + ⌈t_max⌉ − 8`` with ``t_max = fl(fl(max_j z_j − m)·c_r)`` (exact integer arithmetic
   on float32); ``G_j = e_V(j) − F``.
4. P codes: :attr:`PConversion.EXACT` gives exactly ``RNE_E4M3(CR32(2^frac(t_j))·2^(⌊t_j⌋ +
   G_j))`` (the correctly rounded float32 exp2, then round-to-nearest-even into E4M3, as the
   emulator's exact converter defines it, without an intermediate float32 underflow of 2^t)
   with comparisons against precomputed float32 thresholds, no exp2;
   :attr:`PConversion.HARDWARE_EXP2` uses ``ex2.approx`` then ``cvt.rn.satfinite`` (fast; checked
   by code-match rate, not bitwise).
5. Normalizer of the tile, in its units ``2^F``: consistent ``l_T = Σ_j P_c(j)·2^(−e_V(j))``
   (the represented weights), or mismatched ``Σ_j 2^(t_j + G_j)·2^(−e_V(j))`` (unquantized).
6. ``β = 2^((m_old − m_new)·c_r)``; ``acc ← acc·β + 2^F·(P_c·V_c)`` (PV from the tensor core),
   ``l ← l·β + 2^F·l_T``: both stay relative to ``2^(c_r·m)``, whatever a tile's F.
7. ``O = acc / l`` (0 where ``l = 0``); ``LSE₂ = c_r·m + log2 l`` (base 2).

Inputs: any ``T`` and ``S`` (``T == S`` when causal; top-left aligned), any ``Hq`` that is a
multiple of ``Hkv``. The wrapper pads queries to ``2·block_q`` rows and keys to a whole key
tile with zero codes; the last key tile is a *masked tail tile* (keys ``>= S`` get ``z = −inf``),
padded query rows are dropped. Zero token blocks (exponent −127, all codes zero) and NaN blocks
(exponent 128) follow :func:`attention_fp8_quantized`'s policy: zero scores or zero values (the
keys of a zero V block keep their softmax weight: the fold uses the tile's exponent for them),
and NaN rows exactly where the float64 attention of the dequantized operands has them. The
normalizer of a tile is summed as ``2^(F − E_T)·Σ_j P_c(j)·2^(E_T − e_V(j))`` (every term
<= 2^8), so tiny V exponents neither overflow nor flush it; V blocks below about 2^-118 still
leave their PV contribution to a subnormal unit ``2^F``, which the float32 SIMT path may
flush.

The matching emulator recipe: the kernel's P scale rule (V's exponent folded into a per-row,
per-tile P exponent) is not one of :mod:`fp4sim.attention.recipe`'s ``PFormat`` rules; the
nearest preset is ``FLAMIA_MXFP8`` with ``qk=QKFormat.TOKEN_BLOCK_FP8`` and
``v=VFormat.TOKEN_BLOCK_FP8`` (:data:`NEAREST_EMULATOR_RECIPE`), whose MXFP8 P uses per-32-key
scales. The exact reference for this kernel is :func:`reference_forward` (float64 NumPy,
tile-sequential) — the test oracle for the bitwise checks.

Public names: :class:`PConversion`, :class:`Ablation`, :class:`OutType`,
:class:`FP8AttentionConfig`, :class:`FP8Operands`, :func:`quantize_operands`,
:func:`attention_fp8`, :func:`attention_fp8_quantized`, :class:`DebugTile`,
:func:`e4m3_exp2_thresholds`, :func:`exact_e4m3_exp2`, :func:`reference_forward`,
:data:`SHIPPED_CONFIGS`.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from typing import Any, NamedTuple

import numpy as np

from fp4sim import _checks
from fp4sim.attention.recipe import Normalization
from fp4sim.kernels.attention_common import ceil_f32 as _ceil_f32
from fp4sim.kernels.attention_common import check_qkv_shapes as _check_qkv_shapes
from fp4sim.kernels.attention_common import floor_f32 as _floor_f32
from fp4sim.kernels.attention_common import pow2_f32 as _pow2_f32

__all__ = [
    "TOKEN_BLOCK",
    "PConversion",
    "Ablation",
    "OutType",
    "FP8AttentionConfig",
    "FP8Operands",
    "DebugTile",
    "quantize_operands",
    "attention_fp8",
    "attention_fp8_quantized",
    "e4m3_exp2_thresholds",
    "exact_e4m3_exp2",
    "reference_forward",
    "SHIPPED_CONFIGS",
    "NEAREST_EMULATOR_RECIPE",
]

TOKEN_BLOCK = 32
"""Tokens per power-of-two exponent of Q, K and V (times the whole head dimension)."""

_P_HEADROOM = 8
"""P codes of a row's largest weight in a tile land in (2^7, 2^8]: ``F = max(⌈t⌉ + e_V) − 8``."""

_LOG2E = float.fromhex("0x1.71547652b82fep+0")  # log2(e)

_ZERO_EXP = -127
"""Token-block exponent of a zero block (amax <= 448·2^-127): its codes are zero."""

_NAN_EXP = 128
"""Token-block exponent of a block with a NaN (the E8M0 NaN scale)."""

_COL_CLAMP = 126
"""Largest exponent of the normalizer column ``2^(E_T − e_V)`` (see ``_forward``)."""


class PConversion(enum.Enum):
    """How the kernel turns log2-domain scores into E4M3 P codes."""

    HARDWARE_EXP2 = "hardware_exp2"  # ex2.approx.ftz then cvt.rn.satfinite.e4m3 (fast)
    EXACT = "exact"  # thresholds: == RNE_E4M3(CR32(2^t)·2^G) bit for bit (validation)


class Ablation(enum.Enum):
    """Leave one stage out to see where time goes (results are then wrong by design)."""

    NONE = "none"
    SKIP_PV = "skip_pv"  # no PV wgmma (and no P staging to shared memory)
    SKIP_KEY_COLUMNS = "skip_key_columns"  # no key-column scale tiles: 2^e_K = 1, e_V = 0
    SKIP_NORMALIZER = "skip_normalizer"  # no row sum for the normalizer (l stays 1)


class OutType(enum.Enum):
    """Element type of the output O."""

    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    FLOAT32 = "float32"

    @property
    def dtype(self) -> np.dtype:
        import jax.numpy as jnp

        return np.dtype(
            {
                OutType.BFLOAT16: jnp.bfloat16,
                OutType.FLOAT16: jnp.float16,
                OutType.FLOAT32: jnp.float32,
            }[self]
        )


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class FP8AttentionConfig:
    """One compiled configuration of the FP8 forward kernel (hashable: a static jit argument).

    ``block_q`` rows per compute warpgroup (a CTA owns ``2·block_q``), ``block_kv`` keys per
    tile (64..256, a multiple of 64), ``max_concurrent_steps`` ring depth of the TMA pipeline.
    ``debug_step``: when an int, the kernel also returns :class:`DebugTile` for that key tile.
    ``scale_blocks``: on unmasked tiles, read the per-key factors (``2^e_K``, the fold offset,
    the normalizer column) as one SMEM scalar per 32-key token block and work on 32-key slices
    of the score tile (one FMA per element before exp2) instead of loading per-key column
    vectors; masked tiles always take the per-key path. Same bits either way.
    ``block_sums``: the consistent normalizer's per-32-key sums of the P codes come from the
    tensor core (8 indicator rows appended to the Vᵀ tile, see
    :func:`fp4sim.kernels.attention_common.build_forward`) instead of a SIMT conversion and
    sum of the codes; P codes, F and m keep their bits, the normalizer is the same sum in
    another order (the FP8 tensor core's accumulation). Ignored for MISMATCHED normalization
    and the SKIP_PV / SKIP_NORMALIZER ablations. Default on: 463 against 409 TFLOP/s at
    B2 S4096 H16 D128 on the H200 (same run, ``python -m fp4sim bench gpu --only attention``).
    """

    block_q: int = 64
    block_kv: int = 128
    max_concurrent_steps: int = 2
    causal: bool = False
    conversion: PConversion = PConversion.HARDWARE_EXP2
    normalization: Normalization = Normalization.CONSISTENT
    out_type: OutType = OutType.BFLOAT16
    debug_step: int | None = None
    ablation: Ablation = Ablation.NONE
    scale_blocks: bool = True
    block_sums: bool = True

    def __post_init__(self) -> None:
        _checks.check_int("FP8AttentionConfig", "block_q", self.block_q, 64, multiple=64)
        _checks.check_int("FP8AttentionConfig", "block_kv", self.block_kv, 64, multiple=64)
        if self.block_kv > 256:
            raise ValueError(
                f"FP8AttentionConfig.block_kv={self.block_kv} exceeds wgmma's N "
                f"limit; allowed: 64, 128, 192, 256"
            )
        _checks.check_int(
            "FP8AttentionConfig", "max_concurrent_steps", self.max_concurrent_steps, 2
        )
        for name in ("causal", "scale_blocks", "block_sums"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"FP8AttentionConfig.{name}={getattr(self, name)!r} must be a bool")
        for name, kind in (
            ("conversion", PConversion),
            ("normalization", Normalization),
            ("out_type", OutType),
            ("ablation", Ablation),
        ):
            if not isinstance(getattr(self, name), kind):
                raise TypeError(
                    f"FP8AttentionConfig.{name}={getattr(self, name)!r} must be a "
                    f"{kind.__name__}; allowed: {[m.name for m in kind]}"
                )
        if self.normalization is Normalization.EXACT:
            raise ValueError(
                "FP8AttentionConfig.normalization=EXACT needs an unquantized P; "
                "allowed: CONSISTENT, MISMATCHED"
            )
        if self.debug_step is not None:
            _checks.check_int("FP8AttentionConfig", "debug_step", self.debug_step, 0)
        if self.causal and self.block_kv % self.block_q and self.block_q % self.block_kv:
            raise ValueError(
                f"causal attention needs block_kv={self.block_kv} and block_q="
                f"{self.block_q} to divide one another"
            )

    def replace(self, **changes: Any) -> FP8AttentionConfig:
        return dataclasses.replace(self, **changes)


SHIPPED_CONFIGS: tuple[FP8AttentionConfig, ...] = (
    FP8AttentionConfig(),
    FP8AttentionConfig(causal=True),
    FP8AttentionConfig(normalization=Normalization.MISMATCHED),
    FP8AttentionConfig(conversion=PConversion.EXACT),
    FP8AttentionConfig(
        conversion=PConversion.EXACT, causal=True, debug_step=0, out_type=OutType.FLOAT32
    ),
    FP8AttentionConfig(block_kv=64),
    FP8AttentionConfig(block_q=128, block_kv=64),
    FP8AttentionConfig(scale_blocks=False, block_sums=False),
    FP8AttentionConfig(block_sums=False),
    FP8AttentionConfig(block_sums=False, causal=True, conversion=PConversion.EXACT, debug_step=0),
)
"""The configurations the package ships (cross-lowered for sm_90a in the CPU tests)."""


def _nearest_recipe():
    from fp4sim.attention import recipe as r

    return r.FLAMIA_MXFP8.replace(qk=r.QKFormat.TOKEN_BLOCK_FP8, v=r.VFormat.TOKEN_BLOCK_FP8)


NEAREST_EMULATOR_RECIPE = _nearest_recipe()
"""The emulator recipe closest to the kernel (per-32-key MXFP8 P instead of the folded scale)."""


# --- operands ---------------------------------------------------------------------------------
class FP8Operands(NamedTuple):
    """Kernel-ready token-block FP8 operands (a pytree).

    ``q_codes`` (B, T, Hq, D), ``k_codes`` (B, S, Hkv, D): float8_e4m3fn; ``vt_codes``
    (B, Hkv, D, S): V transposed so the PV product reads it K-major; ``q_exp`` (B, Hq, T/32),
    ``k_exp`` and ``v_exp`` (B, Hkv, S/32): int32 token-block exponents (value = code·2^e).
    """

    q_codes: Any
    k_codes: Any
    vt_codes: Any
    q_exp: Any
    k_exp: Any
    v_exp: Any


def quantize_operands(q: Any, k: Any, v: Any) -> FP8Operands:
    """Quantize float Q (B, T, Hq, D), K and V (B, S, Hkv, D) to token-block E4M3.

    Uses :func:`fp4sim.attention.operands.quantize_operand` with
    :data:`~fp4sim.attention.operands.TOKEN_BLOCK_POW2` (``MXFP8_E4M3``,
    ``Geometry.TOKEN_BLOCK``: exponent ``ceil(log2(amax/448))`` per 32 tokens × D). Any ``T``
    and ``S``: a last, partial token block is quantized as if padded with zeros (its exponent
    comes from its real tokens). Blocks at the minimum exponent −127 (amax <= 448·2^-127, e.g.
    all-zero blocks) are *zero blocks* and blocks holding a NaN get the NaN exponent 128: the
    codes of both are flushed to zero, which the kernel relies on (a NaN block is then carried
    by its exponent alone: see :func:`attention_fp8_quantized`). ±Inf saturates to ±448·2^e
    as in the emulator's quantizer. Works under ``jax.jit``.
    """
    import jax.numpy as jnp
    from jax import lax

    from fp4sim.attention.operands import TOKEN_BLOCK_POW2, quantize_operand
    from fp4sim.formats import blocks

    _check_qkv_shapes(tuple(q.shape), tuple(k.shape), tuple(v.shape))

    def tb(x):  # (B, N, H, D) -> codes (B, H, N, D) uint8, exponents (B, H, ceil(N/32))
        x = jnp.swapaxes(jnp.asarray(x, jnp.float32), 1, 2)
        n = x.shape[2]
        xq = quantize_operand(x, TOKEN_BLOCK_POW2)  # zero pads the partial last token block
        e = blocks.scale_exponents(xq)[..., 0]
        zero = jnp.repeat((e == _ZERO_EXP) | (e == _NAN_EXP), TOKEN_BLOCK, axis=-1)[..., None]
        codes = jnp.where(zero, jnp.uint8(0), xq.codes)[:, :, :n]
        return codes, e

    f8 = jnp.float8_e4m3fn
    qc, qe = tb(q)
    kc, ke = tb(k)
    vc, ve = tb(v)
    as_f8 = lambda c: lax.bitcast_convert_type(c, f8)  # noqa: E731
    return FP8Operands(
        q_codes=jnp.swapaxes(as_f8(qc), 1, 2),
        k_codes=jnp.swapaxes(as_f8(kc), 1, 2),
        vt_codes=jnp.swapaxes(as_f8(vc), 2, 3),
        q_exp=qe,
        k_exp=ke,
        v_exp=ve,
    )


# --- the exact, exp-free P converter -----------------------------------------------------------
def _cr32_exp2(f: np.ndarray) -> np.ndarray:
    """Correctly rounded float32 2^f for float32 f in [0, 1) (float64 exp2 then one rounding;
    the thresholds derived from it are re-checked with 60-digit arithmetic)."""
    return np.exp2(f.astype(np.float64)).astype(np.float32)


def _level(f: np.ndarray, scale: float) -> np.ndarray:
    """RNE_int(scale·CR32(2^f)): the E4M3 grid index reached from the fraction ``f``."""
    return np.rint(_cr32_exp2(f).astype(np.float64) * scale)


def _first_f_reaching(level: float, scale: float) -> np.float32:
    """Smallest float32 f in [0, 1) whose :func:`_level` is >= ``level`` (bisection on bits)."""
    lo, hi = 0, int(np.float32(1.0).view(np.uint32))  # bit patterns of 0 and 1.0
    while lo < hi:
        mid = (lo + hi) // 2
        f = np.array([mid], np.uint32).view(np.float32)
        if _level(f, scale)[0] >= level:
            hi = mid
        else:
            lo = mid + 1
    return np.array([lo], np.uint32).view(np.float32)[0]


def _verify_threshold(th: np.float32, level: float, scale: float) -> None:
    import decimal

    ctx = decimal.Context(prec=60)

    def exact_level(f32: np.float32) -> float:
        x = ctx.power(decimal.Decimal(2), decimal.Decimal(float(f32)))  # 2^f to 60 digits
        r = np.float32(float(x))  # nearest double, then float32: checked against x below
        lo_d, hi_d = (
            decimal.Decimal(float(np.nextafter(r, np.float32(0)))),
            decimal.Decimal(float(np.nextafter(r, np.float32(4)))),
        )
        rd = decimal.Decimal(float(r))
        assert abs(x - rd) <= abs(x - lo_d) and abs(x - rd) <= abs(x - hi_d), f"CR32 check at {th}"
        return float(np.rint(np.float64(r) * scale))

    below = np.nextafter(th, np.float32(-1.0))
    assert exact_level(th) >= level, (th, level, scale)
    if th > 0:
        assert exact_level(below) < level, (th, level, scale)


@functools.cache
def e4m3_exp2_thresholds() -> dict[int, tuple[float, ...]]:
    """Float32 thresholds on ``f = frac(t)`` for the exact converter, keyed by the binade.

    Key ``0`` (normal E4M3 results, binade ``n >= -6``): eight thresholds; the mantissa index is
    ``k = #{T : f >= T}`` and the value ``(1 + k/8)·2^n``. Keys ``-7 .. -10`` (E4M3 subnormals
    ``j·2^-9``): ``j = base_n + #{T : f >= T}`` with ``base_n = 2^(n+9)``. Below −10 the code is 0.
    Each threshold is the smallest float32 whose ``RNE(CR32(2^f)·scale)`` reaches the next grid
    level, so the comparison reproduces "correctly rounded exp2, then RNE" exactly, ties (to
    even) included.
    """
    out: dict[int, tuple[float, ...]] = {}
    for key, scale, levels in (
        (0, 8.0, range(9, 17)),
        (-7, 4.0, range(5, 9)),
        (-8, 2.0, range(3, 5)),
        (-9, 1.0, range(2, 3)),
        (-10, 0.5, range(1, 2)),
    ):
        ths = []
        for lev in levels:
            th = _first_f_reaching(float(lev), scale)
            _verify_threshold(th, float(lev), scale)
            ths.append(float(th))
        out[key] = tuple(ths)
    return out


def exact_e4m3_exp2(t: Any, g: Any) -> Any:
    """E4M3 values ``RNE_E4M3(CR32(2^frac(t))·2^(⌊t⌋ + g))`` (= ``RNE_E4M3(CR32(2^t)·2^g)``
    wherever 2^t is a normal float32) for float32 ``t <= 0`` (or −inf) and integer-valued
    float32 ``g`` with ``⌈t⌉ + g <= 8``, without evaluating exp2.

    Written with operations Mosaic GPU lowers on sm_90 (round-to-even, compares, selects, integer
    shifts and bitcasts), so the same function runs inside the kernel, in interpret mode and under
    plain ``jax.jit``; no step depends on FMA contraction or flush-to-zero. Returns float32 values
    on the E4M3 grid (cast them to ``float8_e4m3fn`` exactly).
    """
    import jax.numpy as jnp

    th = e4m3_exp2_thresholds()
    count = lambda f, ts: sum(jnp.where(f >= np.float32(x), 1.0, 0.0) for x in ts)  # noqa: E731
    tc = jnp.maximum(t, -1024.0)  # -inf -> far below every subnormal: code 0
    n0 = _floor_f32(tc)
    f = tc - n0  # exact: the fractional bits of tc
    n = n0 + g
    k = count(f, th[0])
    nc = jnp.minimum(jnp.maximum(n, -6.0), 8.0)
    normal = (1.0 + k * 0.125) * _pow2_f32(nc)
    sub = jnp.where(
        n == -7.0,
        4.0 + count(f, th[-7]),
        jnp.where(
            n == -8.0,
            2.0 + count(f, th[-8]),
            jnp.where(
                n == -9.0, 1.0 + count(f, th[-9]), jnp.where(n == -10.0, count(f, th[-10]), 0.0)
            ),
        ),
    )
    return jnp.where(n >= -6.0, normal, sub * float.fromhex("0x1p-9"))


# --- the kernel ---------------------------------------------------------------------------------
class DebugTile(NamedTuple):
    """Intermediates of key tile ``debug_step`` for every query row that reaches it.

    ``p_codes`` (B, Hq, T, block_kv) float8_e4m3fn: the P codes fed to the PV product;
    ``f`` the row's P exponent ``F`` (−inf where every key of the tile is masked), ``m`` the
    running max of z after the tile, ``l`` the normalizer after the tile (relative to
    ``2^(c_r·m)``): each (B, Hq, T) float32.
    Rows of causal CTAs that end before the tile are left unwritten.
    """

    p_codes: Any
    f: Any
    m: Any
    l: Any  # noqa: E741 (the normalizer is l in the FlashAttention papers)


def attention_fp8(
    q: Any,
    k: Any,
    v: Any,
    *,
    softmax_scale: float | None = None,
    config: FP8AttentionConfig = FP8AttentionConfig(),
) -> Any:
    """Quantize float Q, K, V to token-block E4M3 and run the FP8 forward kernel.

    Shapes ``q`` (B, T, Hq, D), ``k``/``v`` (B, S, Hkv, D). Returns ``(O, LSE₂)`` (or with a
    third :class:`DebugTile` when ``config.debug_step`` is set); O is (B, T, Hq, D) in
    ``config.out_type``, LSE₂ (B, Hq, T) float32 in log2 units.
    """
    ops = quantize_operands(q, k, v)
    return attention_fp8_quantized(ops, softmax_scale=softmax_scale, config=config)


def attention_fp8_quantized(
    ops: FP8Operands,
    *,
    softmax_scale: float | None = None,
    config: FP8AttentionConfig = FP8AttentionConfig(),
) -> Any:
    """Run the forward kernel on already quantized operands (see :func:`attention_fp8`).

    Any ``T`` and ``S`` (``T == S`` when causal), any ``Hq`` that is a multiple of ``Hkv``.
    Special values, as :func:`quantize_operands` produces them: a zero block (exponent −127,
    zero codes) contributes zero scores (Q, K) or zero values (V, whose keys keep their softmax
    weight); a NaN block (exponent 128, zero codes) makes every output row that attends to it
    NaN in O and LSE₂ (all rows of the batch and KV head when not causal, rows ``r >= 32·j``
    for key block ``j`` when causal, the rows of a NaN Q block), and leaves the other rows
    exact. E4M3 NaN *codes* supplied directly are not screened: the tensor core propagates
    them (``0·NaN = NaN``), also into rows that mask the key.
    """
    import jax.numpy as jnp

    if not isinstance(config, FP8AttentionConfig):
        raise TypeError(f"config={config!r} must be an FP8AttentionConfig")
    if not isinstance(ops, FP8Operands):
        raise TypeError(
            f"ops must be FP8Operands (see quantize_operands), got {type(ops).__name__}"
        )
    b, t, hq, d = ops.q_codes.shape
    s = ops.k_codes.shape[1]
    hkv = ops.k_codes.shape[2]
    _check_qkv_shapes(ops.q_codes.shape, ops.k_codes.shape, (b, s, hkv, d))
    for name, x in (("q_codes", ops.q_codes), ("k_codes", ops.k_codes), ("vt_codes", ops.vt_codes)):
        if np.dtype(x.dtype) != np.dtype(jnp.float8_e4m3fn):
            raise TypeError(f"ops.{name} has dtype {x.dtype}; allowed: float8_e4m3fn")
    if tuple(ops.vt_codes.shape) != (b, hkv, d, s):
        raise ValueError(f"ops.vt_codes shape {tuple(ops.vt_codes.shape)} must be {(b, hkv, d, s)}")
    nb = lambda n: -(-n // TOKEN_BLOCK)  # noqa: E731
    for name, x, shp in (
        ("q_exp", ops.q_exp, (b, hq, nb(t))),
        ("k_exp", ops.k_exp, (b, hkv, nb(s))),
        ("v_exp", ops.v_exp, (b, hkv, nb(s))),
    ):
        if tuple(x.shape) != shp:
            raise ValueError(f"ops.{name} shape {tuple(x.shape)} must be {shp}")
    cfg = config
    if cfg.causal and s != t:
        raise ValueError(f"causal attention needs as many keys as queries; got T={t}, S={s}")
    n_kv = _padded(s, cfg.block_kv) // cfg.block_kv
    if cfg.debug_step is not None and cfg.debug_step >= n_kv:
        raise ValueError(
            f"debug_step={cfg.debug_step} out of range; this shape has {n_kv} key tiles"
        )
    softmax_scale = _checks.softmax_scale(softmax_scale, d)
    return _attention_jit(ops, softmax_scale, cfg)


def _padded(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _attention_jit(ops: FP8Operands, softmax_scale: float, cfg: FP8AttentionConfig) -> Any:
    return _jitted_forward()(ops, softmax_scale, cfg)


@functools.cache
def _jitted_forward():
    import jax

    return jax.jit(_forward, static_argnums=(1, 2))


def _kernel_inputs(ops: FP8Operands, cfg: FP8AttentionConfig, xp: Any) -> dict[str, Any]:
    """The kernel's padded inputs, computed identically by the jitted wrapper (``xp`` = jnp) and
    by :func:`reference_forward` (``xp`` = numpy).

    Q rows are padded to a multiple of ``2·block_q`` and keys to a multiple of ``block_kv`` with
    zero codes and the zero-block exponent (the kernel masks keys ``>= S`` in its tail tile).
    Exponents are sanitised so that the kernel only sees finite factors:

    * a zero block (exponent −127) of Q or K scales by 1 (its codes are zero, so any factor
      gives zero scores; 1 keeps ``(−inf)·c_r`` and ``(z − m)·c_r`` free of ``0·inf``);
    * a zero V block takes its tile's exponent ``E_T`` (the largest exponent of the tile's
      non-zero V blocks, 0 if there is none) in the fold, so its keys keep their normalizer
      weight (their V is zero whatever the exponent);
    * a NaN block (exponent 128) counts as exponent 0 inside the kernel; instead every output
      row that attends to it (every row for non-causal attention; rows ``r >= 32·block`` for
      causal attention; the rows of a NaN Q block) is marked by a NaN row scale, and the kernel
      returns NaN in O and LSE for those rows.

    Returns ``q_scale`` (B, Hq, T_pad) float32 (``2^e_Q`` or NaN) and ``cols`` (B, Hkv, 4,
    S_pad) float32: ``2^e_K``, ``h = e_V' − E_T + 8``, ``2^min(E_T − e_V', 126)``, ``E_T``.
    """
    b, t, hq, _ = ops.q_codes.shape
    s, hkv = ops.k_codes.shape[1], ops.k_codes.shape[2]
    bkv = cfg.block_kv
    t_pad, s_pad = _padded(t, 2 * cfg.block_q), _padded(s, bkv)
    i32, f32 = np.int32, np.float32

    def rep(e, n):  # per token block -> per token, padded with the zero-block exponent
        e = xp.repeat(xp.asarray(e).astype(i32), TOKEN_BLOCK, axis=-1)
        extra = n - e.shape[-1]
        if extra > 0:
            e = xp.concatenate([e, xp.full(e.shape[:-1] + (extra,), _ZERO_EXP, i32)], axis=-1)
        return e[..., :n]

    def pow2(e):  # 2^e for integer e in [-126, 127]
        bits = ((e + 127) << 23).astype(i32)
        if xp is np:
            return bits.view(f32)
        from jax import lax

        return lax.bitcast_convert_type(bits, f32)

    eq, ek, ev = rep(ops.q_exp, t_pad), rep(ops.k_exp, s_pad), rep(ops.v_exp, s_pad)
    nan_kv = (ek == _NAN_EXP) | (ev == _NAN_EXP)  # (B, Hkv, S_pad)
    if cfg.causal:  # row r sees keys 0..r (T == S)
        seen = xp.cumsum(nan_kv.astype(i32), axis=-1) > 0
        idx = np.minimum(np.arange(t_pad), s_pad - 1)
        row_kv = seen[..., idx]
    else:
        row_kv = xp.broadcast_to(nan_kv.any(axis=-1, keepdims=True), (b, hkv, t_pad))
    row_nan = (eq == _NAN_EXP) | xp.repeat(row_kv, hq // hkv, axis=1)
    finite = lambda e: xp.where((e == _NAN_EXP) | (e == _ZERO_EXP), 0, e)  # noqa: E731
    q_scale = xp.where(row_nan, f32(np.nan), pow2(finite(eq)))
    ek = finite(ek)
    ev = xp.where(ev == _NAN_EXP, 0, ev)
    zero_v = ev == _ZERO_EXP
    tiles = (b, hkv, s_pad // bkv, bkv)
    e_tile = xp.max(xp.where(zero_v, -1000, ev).reshape(tiles), axis=-1)
    e_tile = xp.where(e_tile == -1000, 0, e_tile)
    e_tile = xp.repeat(e_tile, bkv, axis=-1)
    ev = xp.where(zero_v, e_tile, ev)
    cols = xp.stack(
        [
            pow2(ek),
            (ev - e_tile + _P_HEADROOM).astype(f32),
            pow2(xp.minimum(e_tile - ev, _COL_CLAMP)),
            e_tile.astype(f32),
        ],
        axis=2,
    )
    return {"q_scale": q_scale, "cols": cols, "t_pad": t_pad, "s_pad": s_pad}


def _pad_tokens(x: Any, axis: int, n: int, xp: Any) -> Any:
    extra = n - x.shape[axis]
    if extra <= 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return xp.pad(x, widths)


def _forward(ops: FP8Operands, softmax_scale: float, cfg: FP8AttentionConfig) -> Any:
    import jax.numpy as jnp

    t, s = ops.q_codes.shape[1], ops.k_codes.shape[1]
    ins = _kernel_inputs(ops, cfg, jnp)
    t_pad, s_pad = ins["t_pad"], ins["s_pad"]
    qc = _pad_tokens(ops.q_codes, 1, t_pad, jnp)
    kc = _pad_tokens(ops.k_codes, 1, s_pad, jnp)
    vtc = _pad_tokens(ops.vt_codes, 3, s_pad, jnp)
    call = _build_call(tuple(qc.shape), tuple(kc.shape), softmax_scale, cfg, kv_len=s)
    outs = call(qc, kc, vtc, ins["q_scale"], ins["cols"])
    if t_pad == t:
        return outs
    o, lse = outs[0][:, :t], outs[1][..., :t]
    if cfg.debug_step is None:
        return o, lse
    dbg = outs[2]
    return (
        o,
        lse,
        DebugTile(
            p_codes=dbg.p_codes[:, :, :t], f=dbg.f[..., :t], m=dbg.m[..., :t], l=dbg.l[..., :t]
        ),
    )


def _build_call(
    q_shape: tuple,
    k_shape: tuple,
    softmax_scale: float,
    cfg: FP8AttentionConfig,
    kv_len: int | None = None,
):
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental.pallas import mosaic_gpu as plgpu

    from fp4sim.kernels.attention_common import StepResult, TileMath, build_forward

    bq, bkv, d = cfg.block_q, cfg.block_kv, q_shape[3]
    c = float(np.float32(softmax_scale * _LOG2E))
    f32, f8 = jnp.float32, jnp.float8_e4m3fn
    exact = cfg.conversion is PConversion.EXACT
    consistent = cfg.normalization is Normalization.CONSISTENT
    ab = cfg.ablation
    bc_row = lambda x, n: lax.broadcast_in_dim(x, (bq, n), [0])  # noqa: E731
    bc_col = lambda x: lax.broadcast_in_dim(x, (bq, bkv), [1])  # noqa: E731

    nb = bkv // TOKEN_BLOCK
    bc_blk = lambda x: lax.broadcast_in_dim(x, (bq, TOKEN_BLOCK), [0])  # noqa: E731
    sums_on_mma = cfg.block_sums and consistent and ab is Ablation.NONE

    def l_from_sums(ctx, f_tile, e_t):
        """The tile's normalizer from the tensor core's per-block sums of the P codes:
        ``2^(F − E_T)·Σ_B 2^(E_T − e_V(B))·Σ_{j∈B} P_c(j)``."""
        # The column tile is read here, during the step (before this warpgroup releases the
        # slot after its PV product), never after the PV product.
        col = plgpu.broadcasted_iota(jnp.int32, (bq, 8), 1, layout=plgpu.Layout.WGMMA)
        w8 = jnp.zeros((bq, 8), f32)
        for b in range(nb):
            w8 = jnp.where(col == b, ctx.col_ref[2, b * TOKEN_BLOCK], w8)
        unit_l = jnp.exp2(f_tile - e_t)

        def fn(sums):  # (bq, 8): column b = block b's sum (b < nb), zero beyond
            return (sums * w8).sum(axis=1) * unit_l

        return fn

    def blocked_step(ctx, m_i, cq):
        """An unmasked tile with the per-key factors read as one scalar per 32-key token block
        (they are constant along a block): same bits as :func:`step`'s general path."""
        col = lambda i, b: ctx.col_ref[i, b * TOKEN_BLOCK]  # noqa: E731
        ks = [col(0, b) for b in range(nb)]
        hb = [col(1, b) for b in range(nb)]
        lc = [col(2, b) for b in range(nb)]
        e_t = ctx.col_ref[3, 0]
        s_b = [ctx.s[:, b * TOKEN_BLOCK : (b + 1) * TOKEN_BLOCK] for b in range(nb)]
        z_b = [x * k for x, k in zip(s_b, ks, strict=True)]  # exact: power-of-two scales
        z_el = functools.reduce(jnp.maximum, z_b)
        z_max = z_el.max(axis=1)
        m_new = jnp.maximum(m_i, z_max)
        g_row = _ceil_f32((z_max - m_new) * cq)  # every key visible: A = E_T
        f_tile = g_row + (e_t - _P_HEADROOM)
        if exact:
            p_b = [
                exact_e4m3_exp2((z - bc_blk(m_new)) * bc_blk(cq), h - bc_blk(g_row))
                for z, h in zip(z_b, hb, strict=True)
            ]
        else:  # 2^(z·c_r + h − r) with z·c_r = s·(2^e_K·c_r) exactly: one FMA per element
            r = m_new * cq + g_row
            p_b = [
                jnp.exp2(x * bc_blk(k * cq) + bc_blk(h - r))
                for x, k, h in zip(s_b, ks, hb, strict=True)
            ]
        p_all = jnp.concatenate(p_b, axis=1)
        p8 = p_all.astype(f8)
        unit = jnp.exp2(f_tile)
        l_tile = None
        if sums_on_mma:
            beta = jnp.exp2((m_i - m_new) * cq)
            return StepResult(
                p=p8,
                l_tile=None,
                m=m_new,
                beta=beta,
                pv_scale=unit,
                state=(),
                debug=(f_tile, m_new),
                l_sums=l_from_sums(ctx, f_tile, e_t),
            )
        if ab is not Ablation.SKIP_NORMALIZER:
            if consistent:
                w_all = p8.astype(f32)
                w_b = [w_all[:, b * TOKEN_BLOCK : (b + 1) * TOKEN_BLOCK] for b in range(nb)]
            elif not exact:
                w_b = p_b
            else:
                w_b = [
                    jnp.exp2((z - bc_blk(m_new)) * bc_blk(cq) + (h - bc_blk(g_row)))
                    for z, h in zip(z_b, hb, strict=True)
                ]
            acc_w = w_b[0] * lc[0]
            for w, lcb in zip(w_b[1:], lc[1:], strict=True):
                acc_w = acc_w + w * lcb
            l_tile = acc_w.sum(axis=1) * jnp.exp2(f_tile - e_t)
        beta = jnp.exp2((m_i - m_new) * cq)
        return StepResult(
            p=p8, l_tile=l_tile, m=m_new, beta=beta, pv_scale=unit, state=(), debug=(f_tile, m_new)
        )

    def step(ctx, m_i, state):
        # c·2^e_Q per row: exact scaling of c (NaN-marked rows run as zero rows)
        cq = jnp.where(ctx.rows != ctx.rows, 0.0, ctx.rows) * c
        if cfg.scale_blocks and ctx.visible is None and ab is not Ablation.SKIP_KEY_COLUMNS:
            return blocked_step(ctx, m_i, cq)
        if ab is Ablation.SKIP_KEY_COLUMNS:
            z, h, evinv, e_t = ctx.s, None, None, 0.0
        else:
            kscale, h, evinv, _ = ctx.cols()
            e_t = ctx.col_ref[3, 0]  # E_T, the tile's largest V exponent (a scalar)
            z = ctx.s * bc_col(kscale)  # exact: a power-of-two column scale
        a_off = 0.0
        if ctx.visible is not None:
            z = jnp.where(ctx.visible, z, -jnp.inf)
            if h is not None:  # A_r − E_T over the visible keys only (causal-safe)
                a_off = jnp.where(ctx.visible, bc_col(h), -jnp.inf).max(axis=1) - _P_HEADROOM
        z_max = z.max(axis=1)
        m_new = jnp.maximum(m_i, z_max)
        ceil_tmax = _ceil_f32((z_max - m_new) * cq)
        g_row = ceil_tmax + a_off  # G_j = h_j − g_row
        f_tile = g_row + (e_t - _P_HEADROOM)  # F: the tile's P·V unit is 2^F
        seen = f_tile != -jnp.inf  # False only for rows with every key of the tile masked
        g_row = jnp.where(seen, g_row, 0.0)
        hcol = float(_P_HEADROOM) if h is None else bc_col(h)
        p_u = None
        if exact:
            t = (z - bc_row(m_new, bkv)) * bc_row(cq, bkv)
            p8 = exact_e4m3_exp2(t, hcol - bc_row(g_row, bkv)).astype(f8)
        else:
            r = m_new * cq + g_row
            p_u = jnp.exp2(z * bc_row(cq, bkv) + (hcol - bc_row(r, bkv)))
            p8 = p_u.astype(f8)
        unit = jnp.exp2(f_tile)  # 2^F (0 for fully masked rows)
        l_tile = None
        if sums_on_mma:
            beta = jnp.exp2((m_i - m_new) * cq)
            return StepResult(
                p=p8,
                l_tile=None,
                m=m_new,
                beta=beta,
                pv_scale=unit,
                state=(),
                debug=(f_tile, m_new),
                l_sums=l_from_sums(ctx, f_tile, e_t),
            )
        if ab is not Ablation.SKIP_NORMALIZER:
            if consistent:
                w = p8.astype(f32)
            elif p_u is not None:
                w = p_u
            else:
                w = jnp.exp2(
                    (z - bc_row(m_new, bkv)) * bc_row(cq, bkv) + (hcol - bc_row(g_row, bkv))
                )
            # Σ_j P_c(j)·2^(F − e_V(j)) = 2^(F − E_T)·Σ_j P_c(j)·2^(E_T − e_V(j)): each term of
            # the sum is <= 2^8 (P_c carries 2^(e_V − F)), so it neither overflows nor flushes.
            l_unit = unit if h is None else jnp.exp2(f_tile - e_t)
            l_tile = (w if evinv is None else w * bc_col(evinv)).sum(axis=1) * l_unit
        beta = jnp.exp2((m_i - m_new) * cq)
        return StepResult(
            p=p8, l_tile=l_tile, m=m_new, beta=beta, pv_scale=unit, state=(), debug=(f_tile, m_new)
        )

    def finish(acc, l_i, m_i, state, rows):
        l_safe = jnp.where(l_i == 0.0, 1.0, l_i)
        poison = jnp.where(rows != rows, jnp.nan, 1.0)  # NaN-marked rows: NaN, others exact
        out = acc / lax.broadcast_in_dim(l_safe, (bq, d), [0])
        out = out * lax.broadcast_in_dim(poison, (bq, d), [0])
        lse = jnp.where(l_i == 0.0, -jnp.inf, m_i * (rows * c) + jnp.log2(l_safe)) * poison
        return out, lse

    run = build_forward(
        q_shape=q_shape,
        k_shape=k_shape,
        in_dtype=f8,
        p_dtype=f8,
        out_dtype=cfg.out_type.dtype,
        block_q=bq,
        block_kv=bkv,
        max_concurrent_steps=cfg.max_concurrent_steps,
        causal=cfg.causal,
        n_columns=4,
        row_input=True,
        math=TileMath(step=step, finish=finish, n_debug=2),
        debug_step=cfg.debug_step,
        skip_pv=ab is Ablation.SKIP_PV,
        kv_len=kv_len,
        block_sums=sums_on_mma,
    )

    def call(q_codes, k_codes, vt_codes, q_scale, kv_cols):
        outs = run(q_codes, k_codes, vt_codes, q_scale, kv_cols)
        if cfg.debug_step is None:
            return outs[0], outs[1]
        o, lse, dp, dr = outs
        return o, lse, DebugTile(p_codes=dp, f=dr[:, :, 0], m=dr[:, :, 1], l=dr[:, :, 2])

    return call


# --- float64 reference of the kernel's recipe (the test oracle) --------------------------------
def reference_forward(
    ops: FP8Operands, *, softmax_scale: float, config: FP8AttentionConfig, scores: Any = None
) -> dict[str, np.ndarray]:
    """NumPy evaluation of the kernel's numerics (module docstring, steps 1-7), tile by tile.

    Float32 where the kernel's result is bit-defined (z, m, t, F, P codes), float64 for the
    sums (normalizer, PV, which the tensor core and warp reductions order differently).
    ``scores``: optional float32 ``Q_c·K_cᵀ`` (B, Hq, T, S) to use instead of the exact product
    (e.g. scores read back from the hardware). Returns ``o`` (B, T, Hq, D) float64, ``lse``
    (B, Hq, T), and per key tile ``p_codes`` (n_kv, B, Hq, T, block_kv) float32 values
    (NaN where a row does not reach the tile), ``f``, ``m``, ``l`` (n_kv, B, Hq, T).
    """
    import ml_dtypes

    cfg = config
    ops = FP8Operands(*(np.asarray(x) for x in ops))
    t_len, s_len = ops.q_codes.shape[1], ops.k_codes.shape[1]
    ins = _kernel_inputs(ops, cfg, np)
    t_pad, s_pad = ins["t_pad"], ins["s_pad"]
    qc = _pad_tokens(ops.q_codes.astype(np.float32), 1, t_pad, np)
    kc = _pad_tokens(ops.k_codes.astype(np.float32), 1, s_pad, np)
    vtc = _pad_tokens(ops.vt_codes.astype(np.float32), 3, s_pad, np)
    b, _, hq, d = qc.shape
    hkv = kc.shape[2]
    bq, bkv = cfg.block_q, cfg.block_kv
    n_kv = s_pad // bkv
    q_scale = ins["q_scale"]
    row_nan = np.isnan(q_scale)
    kscale, ev, lcol, e_tile = (ins["cols"][:, :, i] for i in range(4))
    ev = ev + e_tile - _P_HEADROOM  # e_V' (zero blocks take E_T)
    c = np.float32(softmax_scale * _LOG2E)
    out = {
        "o": np.zeros((b, t_pad, hq, d)),
        "lse": np.zeros((b, hq, t_pad)),
        "p_codes": np.full((n_kv, b, hq, t_pad, bkv), np.nan, np.float32),
        "f": np.full((n_kv, b, hq, t_pad), np.nan),
        "m": np.full((n_kv, b, hq, t_pad), np.nan),
        "l": np.full((n_kv, b, hq, t_pad), np.nan),
    }
    for bi in range(b):
        for h in range(hq):
            kh = h // (hq // hkv)
            if scores is None:
                sc = qc[bi, :, h, :].astype(np.float64) @ kc[bi, :, kh, :].astype(np.float64).T
                sc = sc.astype(np.float32)
            else:
                sc = np.zeros((t_pad, s_pad), np.float32)
                sc[:t_len, :s_len] = np.asarray(scores)[bi, h]
            for r0 in range(0, t_pad, bq):
                rows = slice(r0, r0 + bq)
                steps = min(-(-(r0 + bq) // bkv), n_kv) if cfg.causal else n_kv
                m = np.full(bq, -np.inf, np.float32)
                f = np.zeros(bq, np.float32)
                l = np.zeros(bq)  # noqa: E741 (the normalizer, as in the FlashAttention papers)
                acc = np.zeros((bq, d))
                qs = q_scale[bi, h, rows]
                cq = (c * np.where(np.isnan(qs), 0, qs)).astype(np.float32)  # exact scaling of c
                for j in range(steps):
                    cols = slice(j * bkv, (j + 1) * bkv)
                    z = sc[rows, cols] * kscale[bi, kh, cols][None, :]
                    z = z.astype(np.float32)  # exact: power-of-two column scale
                    keys = np.arange(j * bkv, (j + 1) * bkv)[None, :]
                    visible = np.broadcast_to(keys < s_len, (bq, bkv))
                    if cfg.causal:
                        visible = visible & (np.arange(r0, r0 + bq)[:, None] >= keys)
                    z = np.where(visible, z, np.float32(-np.inf))
                    z_max = z.max(axis=1)
                    m_new = np.maximum(m, z_max)
                    with np.errstate(invalid="ignore"):
                        t = ((z - m_new[:, None]).astype(np.float32) * cq[:, None]).astype(
                            np.float32
                        )
                        t_max = ((z_max - m_new).astype(np.float32) * cq).astype(np.float32)
                    evj = ev[bi, kh, cols].astype(np.float32)
                    a_r = np.where(visible, evj[None, :], -np.inf).max(axis=1)
                    f_tile = (a_r + np.ceil(t_max) - _P_HEADROOM).astype(np.float32)
                    seen = f_tile != -np.inf
                    g = np.where(seen[:, None], evj[None, :] - f_tile[:, None], 0.0)
                    with np.errstate(invalid="ignore"):
                        n0 = np.floor(t.astype(np.float64))
                        frac = np.where(np.isfinite(n0), t - n0, 0.0)
                    p32 = np.exp2(frac).astype(np.float32)  # CR32 exp2 of the fraction
                    scaled = np.where(
                        np.isfinite(n0),
                        p32.astype(np.float64) * np.exp2(np.where(np.isfinite(n0), n0, 0.0) + g),
                        0.0,
                    )
                    codes = (
                        scaled.astype(np.float32).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
                    )
                    unit = np.exp2(f_tile.astype(np.float64))  # the tile's units 2^F
                    et = np.float64(e_tile[bi, kh, j * bkv])
                    if cfg.normalization is Normalization.CONSISTENT:  # see the kernel's step
                        l_add = (codes.astype(np.float64) * lcol[bi, kh, cols][None, :]).sum(
                            axis=1
                        ) * np.exp2(f_tile.astype(np.float64) - et)
                    else:
                        l_add = (
                            np.exp2(t.astype(np.float64) + g)
                            * np.exp2(-evj.astype(np.float64))[None, :]
                        ).sum(axis=1) * unit
                    beta = np.exp2((m.astype(np.float64) - m_new) * cq)
                    acc = (
                        acc * beta[:, None]
                        + (codes.astype(np.float64) @ (vtc[bi, kh][:, cols].T.astype(np.float64)))
                        * unit[:, None]
                    )
                    l = l * beta + l_add  # noqa: E741
                    m, f = m_new, f_tile
                    out["p_codes"][j, bi, h, rows] = codes
                    out["f"][j, bi, h, rows] = f
                    out["m"][j, bi, h, rows] = m
                    out["l"][j, bi, h, rows] = l
                # acc and l are both relative to 2^(c·m) (each tile added in its units 2^F).
                safe = np.where(l == 0, 1.0, l)
                poison = np.where(row_nan[bi, h, rows], np.nan, 1.0)
                out["o"][bi, rows, h, :] = acc / safe[:, None] * poison[:, None]
                with np.errstate(divide="ignore"):
                    out["lse"][bi, h, rows] = (
                        np.where(l == 0, -np.inf, m.astype(np.float64) * cq + np.log2(safe))
                        * poison
                    )
    out["o"] = out["o"][:, :t_len]
    for key in ("lse", "p_codes", "f", "m", "l"):
        out[key] = out[key][..., :t_len] if key != "p_codes" else out[key][:, :, :, :t_len]
    return out

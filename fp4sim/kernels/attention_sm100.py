"""Blackwell (sm_100a) attention forward: block-scaled ``tcgen05`` bodies of the shared pipeline.

This module owns the two Blackwell routes of the attention forward, written in Pallas Mosaic
GPU on :func:`fp4sim.kernels.attention_common.build_forward` with ``mma=BlockScaledMma``
(``plgpu.tcgen05_mma(..., a_scale=, b_scale=)`` at both matmul sites, float32 TMEM
accumulators, scales copied to TMEM with ``plgpu.async_copy_scales_to_tmem``):

* :attr:`BlackwellRoute.MXFP8` — the emulator recipe ``FLAMIA_MXFP8`` (or its variant with
  ``v=MXFP8_TOKENS``): Q and K E4M3 with UE8M0 per 32 along D, ``S = Q·Kᵀ`` by one
  ``kind::mxf8f6f4.block_scale`` chain; P by the exact converter into E4M3 with UE8M0 per 32
  keys (``e_B = ⌈fl(max_B t − log2 448)⌉``, codes ``RN_E4M3(CR32(2^fl(t − e_B)))`` computed
  exp-free by :func:`fp4sim.kernels.attention_mgpu.exact_e4m3_exp2`); V E4M3 with UE8M0 per
  32 tokens (the token-block exponent repeated over D for ``TOKEN_BLOCK_FP8``), ``P·V`` by a
  second ``kind::mxf8f6f4.block_scale`` chain; consistent normalizer
  ``Σ_B fl(2^e_B·Σ_{j∈B} P_j)`` in block order. D = 64 is zero-padded to 128 for QK (Mosaic
  GPU's block-scaled MMA needs K a multiple of 128 for 8-bit operands; padded columns are zero
  codes, their scales 1).
* :attr:`BlackwellRoute.DIRECT_P_FP4` — ``HW_FP4_DIRECT_P`` / ``HW_FP4_DIRECT_P_MITCHELL``:
  NVFP4 Q and K (E2M1, UE4M3 per 16, no global factor: ``kind::mxf4nvf4.block_scale
  .scale_vec::4X``), the Direct-P payload of the Hopper kernel
  (:func:`fp4sim.kernels.attention_directp_mgpu.directp_payload`) fed as **E2M1 P with its
  UE8M0 amplitude codes** ``k_B + 127`` straight into a block-scaled PV with MXFP4 V
  (``kind::mxf4nvf4.block_scale.scale_vec::2X``, Mosaic GPU's encoding of E2M1 with UE8M0 per
  32: the arithmetic of ``kind::mxf4``); normalizer ``Σ_B fl(2^k_B·fl(Σ_{j∈B} q_j / 6))``,
  ``O = fl(fl(A / 36) / L)``.

The bits these kernels should produce are the emulator's: ``attention_forward(q, k, v,
recipe, accumulation=ForwardAccumulation.TCGEN05)`` models both products with the tcgen05
accumulation of :mod:`fp4sim.formats.mma` (``scaled_matmul(..., accumulation=TCGEN05)``),
so S and P codes are defined bit for bit; O and LSE differ by the kernel's ``ex2.approx``
rescale factor and division (the Hopper kernels' tolerance contract).

**Only compiled, never run.** No Blackwell GPU has executed these kernels: every configuration
of :func:`shipped_cases` is cross-lowered for sm_100a and the PTX instructions of its lowering
are assembled by ``ptxas -arch=sm_100a`` (``tests/kernels/test_attention_sm100.py``); GPU
interpret mode cannot run block-scaled ``tcgen05_mma``. ``python -m fp4sim validate`` runs
them against the emulator on a Blackwell GPU and reports them as not for this architecture
elsewhere.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
from typing import Any, NamedTuple

import numpy as np

from fp4sim import _checks
from fp4sim.attention.recipe import (
    FLAMIA_MXFP8,
    HW_FP4_DIRECT_P,
    HW_FP4_DIRECT_P_MITCHELL,
    AttentionRecipe,
    ExactP,
    PFormat,
    QKFormat,
    VFormat,
)
from fp4sim.kernels.attention_common import pipeline_recipe_problems
from fp4sim.kernels.attention_directp_mgpu import direct_p_route_problems
from fp4sim.kernels.attention_mgpu import OutType

__all__ = [
    "BlackwellRoute",
    "BlackwellAttentionConfig",
    "BlackwellOperands",
    "shipped_cases",
    "prepare_operands",
    "attention_sm100",
    "attention_sm100_prepared",
    "kernel_avals",
    "kernel_function",
    "tile_math",
    "div6_rn",
]

_LOG2E = float.fromhex("0x1.71547652b82fep+0")
_LOG2_448 = float(np.float32(math.log2(448.0)))
_TINY = float.fromhex("0x1p-126")
_BLOCK = 128  # query rows per compute warpgroup (the MMA's M) and keys per tile


class BlackwellRoute(enum.Enum):
    """The two Blackwell attention routes (module docstring)."""

    MXFP8 = "mxfp8"
    DIRECT_P_FP4 = "direct_p_fp4"


def _default_recipe(route: BlackwellRoute) -> AttentionRecipe:
    return FLAMIA_MXFP8 if route is BlackwellRoute.MXFP8 else HW_FP4_DIRECT_P


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class BlackwellAttentionConfig:
    """One compiled configuration (hashable: a static jit argument): ``route``; ``recipe``
    (default per route: ``FLAMIA_MXFP8`` / ``HW_FP4_DIRECT_P``) must be one the route
    implements, with ``block_kv = 128``; ``causal``; ``out_type``; TMA ring depth."""

    route: BlackwellRoute = BlackwellRoute.MXFP8
    recipe: AttentionRecipe | None = None
    causal: bool = False
    out_type: OutType = OutType.BFLOAT16
    max_concurrent_steps: int = 2

    def __post_init__(self) -> None:
        if not isinstance(self.route, BlackwellRoute):
            raise TypeError(
                f"BlackwellAttentionConfig.route={self.route!r} must be a BlackwellRoute; "
                f"allowed: {[m.name for m in BlackwellRoute]}"
            )
        if self.recipe is None:
            object.__setattr__(self, "recipe", _default_recipe(self.route))
        r = self.recipe
        if not isinstance(r, AttentionRecipe):
            raise TypeError(f"BlackwellAttentionConfig.recipe={r!r} must be an AttentionRecipe")
        problems = []
        if self.route is BlackwellRoute.MXFP8:
            if r.qk is not QKFormat.MXFP8:
                problems.append("qk must be MXFP8")
            if not isinstance(r.converter, ExactP) or r.p_format is not PFormat.MXFP8:
                problems.append("converter must be ExactP into MXFP8 P")
            if r.v not in (VFormat.MXFP8_TOKENS, VFormat.TOKEN_BLOCK_FP8):
                problems.append("v must be MXFP8_TOKENS or TOKEN_BLOCK_FP8")
            if r.exp2.kind.name != "CORRECTLY_ROUNDED":
                problems.append("exp2 must be CORRECTLY_ROUNDED")
            problems += pipeline_recipe_problems(r)
        else:
            problems += direct_p_route_problems(r)
        if r.block_kv != _BLOCK:
            problems.append(f"block_kv must be {_BLOCK}")
        if problems:
            raise ValueError(
                f"BlackwellAttentionConfig.recipe is not a {self.route.name} route this kernel "
                f"implements: {'; '.join(problems)}"
            )
        if not isinstance(self.causal, bool):
            raise TypeError(f"BlackwellAttentionConfig.causal={self.causal!r} must be a bool")
        if not isinstance(self.out_type, OutType):
            raise TypeError(
                f"BlackwellAttentionConfig.out_type={self.out_type!r} must be an OutType"
            )
        _checks.check_int(
            "BlackwellAttentionConfig", "max_concurrent_steps", self.max_concurrent_steps, 2
        )

    @property
    def fp4(self) -> bool:
        return self.route is BlackwellRoute.DIRECT_P_FP4

    def replace(self, **changes: Any) -> BlackwellAttentionConfig:
        return dataclasses.replace(self, **changes)


def shipped_cases() -> tuple[tuple[BlackwellAttentionConfig, int], ...]:
    """Every (configuration, head dim) fp4sim ships for Blackwell; each is cross-lowered for
    sm_100a and its PTX assembled by ptxas in the CPU tests."""
    mx = BlackwellRoute.MXFP8
    dp = BlackwellRoute.DIRECT_P_FP4
    return (
        (BlackwellAttentionConfig(route=mx), 128),
        (BlackwellAttentionConfig(route=mx, causal=True), 128),
        (BlackwellAttentionConfig(route=mx), 64),
        (BlackwellAttentionConfig(route=mx, causal=True), 64),
        (
            BlackwellAttentionConfig(route=mx, recipe=FLAMIA_MXFP8.replace(v=VFormat.MXFP8_TOKENS)),
            128,
        ),
        (BlackwellAttentionConfig(route=dp), 128),
        (BlackwellAttentionConfig(route=dp, causal=True), 128),
        (BlackwellAttentionConfig(route=dp), 64),
        (BlackwellAttentionConfig(route=dp, recipe=HW_FP4_DIRECT_P_MITCHELL), 128),
    )


class BlackwellOperands(NamedTuple):
    """Kernel-ready operands (a pytree), all padded: ``q`` (B, T, Hq, Dqk), ``k`` (B, S, Hkv,
    Dqk) and ``vt`` (B, Hkv, D, S) element codes as ``float8_e4m3fn`` / ``float4_e2m1fn``;
    scales in the Mosaic TMEM layout: ``q_scales`` (B, Hq, T/128, Dqk/block/4, 32, 16),
    ``k_scales`` (B, Hkv, S/128, ...), ``v_scales`` (B, Hkv, 1, S/128, 32, 16) (``float8_e8m0fnu``
    or, for NVFP4 Q/K, ``float8_e4m3fn``)."""

    q: Any
    k: Any
    vt: Any
    q_scales: Any
    k_scales: Any
    v_scales: Any


def _dtypes(cfg: BlackwellAttentionConfig) -> tuple[Any, Any, int]:
    """(element dtype, Q/K scale dtype, Q/K scale block)."""
    import jax.numpy as jnp

    if cfg.fp4:
        return jnp.float4_e2m1fn, jnp.float8_e4m3fn, 16
    return jnp.float8_e4m3fn, jnp.float8_e8m0fnu, 32


def _qk_dim(cfg: BlackwellAttentionConfig, d: int) -> int:
    """Q/K's head dimension inside the kernel (MXFP8 D = 64 is zero-padded to 128)."""
    return 128 if not cfg.fp4 else d


def _pad_axis(x: Any, axis: int, n: int, value: int = 0) -> Any:
    import jax.numpy as jnp

    extra = n - x.shape[axis]
    if extra <= 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths, constant_values=value)


def prepare_operands(
    q: Any, k: Any, v: Any, config: BlackwellAttentionConfig = BlackwellAttentionConfig()
) -> BlackwellOperands:
    """Quantize float Q (B, T, Hq, D), K, V (B, S, Hkv, D) with the emulator's quantizers
    (:func:`fp4sim.attention.forward.quantize_qk` / ``quantize_v`` with ``config.recipe``) and
    lay the codes and scales out for the kernel (reinterpretations, padding and the 128x4
    scale swizzle only). Works under ``jax.jit``."""
    import jax.numpy as jnp
    from jax import lax

    from fp4sim.attention.forward import quantize_qk, quantize_v
    from fp4sim.formats import blocks, layouts
    from fp4sim.kernels.attention_common import check_qkv_shapes

    if not isinstance(config, BlackwellAttentionConfig):
        raise TypeError(f"config={config!r} must be a BlackwellAttentionConfig")
    check_qkv_shapes(tuple(q.shape), tuple(k.shape), tuple(v.shape))
    cfg, recipe = config, config.recipe
    elem, qk_scale, _ = _dtypes(cfg)
    t, d = q.shape[1], q.shape[3]
    s = k.shape[1]
    t_pad = -(-t // (2 * _BLOCK)) * 2 * _BLOCK
    s_pad = -(-s // _BLOCK) * _BLOCK
    dqk = _qk_dim(cfg, d)
    bhtd = lambda x: jnp.swapaxes(jnp.asarray(x, jnp.float32), 1, 2)  # noqa: E731

    def as_elem(codes):  # uint8 codes (one per byte) -> the MMA element dtype
        codes = jnp.asarray(codes)
        if cfg.fp4:
            return lax.bitcast_convert_type(codes.astype(jnp.uint4), elem)
        return lax.bitcast_convert_type(codes, elem)

    def qk_operand(x, n_pad):  # (B, N, H, D) -> codes (B, N_pad, H, Dqk), scales (TMEM layout)
        qa = quantize_qk(bhtd(x), recipe).quantized
        codes = _pad_axis(_pad_axis(qa.unpacked_codes(), 2, n_pad), 3, dqk)
        sc = jnp.asarray(qa.scales)  # (B, H, N, D/block)
        sc = _pad_axis(_pad_axis(sc, 2, n_pad), 3, dqk // (d // sc.shape[-1]), 127)
        sc = lax.bitcast_convert_type(layouts.to_mosaic_tmem(sc), qk_scale)
        return jnp.swapaxes(as_elem(codes), 1, 2), sc

    qc, qs = qk_operand(q, t_pad)
    kc, ks = qk_operand(k, s_pad)
    vb = bhtd(v)
    if s % 32:  # a partial last token block: quantized as if padded with zeros
        vb = jnp.pad(vb, ((0, 0), (0, 0), (0, -s % 32), (0, 0)))
    vop = quantize_v(vb, recipe)
    va = vop.quantized
    e = blocks.scale_exponents(va)  # (B, H, S/32, D or 1)
    vcodes = jnp.swapaxes(_pad_axis(jnp.asarray(va.unpacked_codes()), 2, s_pad), 2, 3)
    vcode_s = jnp.clip(jnp.broadcast_to(e, e.shape[:-1] + (d,)) + 127, 0, 255)
    vcode_s = jnp.swapaxes(vcode_s.astype(jnp.uint8), 2, 3)  # (B, H, D, S/32)
    vcode_s = _pad_axis(vcode_s, 3, s_pad // 32, 127)
    vs = lax.bitcast_convert_type(layouts.to_mosaic_tmem(vcode_s), jnp.float8_e8m0fnu)
    return BlackwellOperands(q=qc, k=kc, vt=as_elem(vcodes), q_scales=qs, k_scales=ks, v_scales=vs)


def attention_sm100(
    q: Any,
    k: Any,
    v: Any,
    *,
    softmax_scale: float | None = None,
    config: BlackwellAttentionConfig = BlackwellAttentionConfig(),
) -> Any:
    """Prepare float Q, K, V per ``config.recipe`` and run the Blackwell kernel (sm_100a
    only): ``(O, LSE₂)``, O (B, T, Hq, D) in ``config.out_type``, LSE₂ (B, Hq, T) float32 in
    log2 units. Any T and S (``T == S`` when causal)."""
    if not isinstance(config, BlackwellAttentionConfig):
        raise TypeError(f"config={config!r} must be a BlackwellAttentionConfig")
    d = q.shape[-1]
    softmax_scale = _checks.softmax_scale(softmax_scale, d)
    if config.causal and q.shape[1] != k.shape[1]:
        raise ValueError(
            f"causal attention needs as many keys as queries; got T={q.shape[1]}, S={k.shape[1]}"
        )
    return _jitted()(q, k, v, softmax_scale, config)


def attention_sm100_prepared(
    ops: BlackwellOperands,
    *,
    t: int,
    s: int,
    d: int,
    softmax_scale: float,
    config: BlackwellAttentionConfig,
) -> Any:
    """Run the kernel on :func:`prepare_operands` output (``t``, ``s`` real tokens, ``d`` the
    head dimension): ``(O, LSE₂)`` cut to the real rows."""
    if not isinstance(ops, BlackwellOperands):
        raise TypeError(f"ops must be BlackwellOperands, got {type(ops).__name__}")
    call = kernel_function(tuple(ops.q.shape), tuple(ops.k.shape), d, s, softmax_scale, config)
    o, lse = call(*ops)
    return o[:, :t], lse[..., :t]


@functools.cache
def _jitted():
    import jax

    def fwd(q, k, v, softmax_scale, cfg):
        ops = prepare_operands(q, k, v, cfg)
        return attention_sm100_prepared(
            ops, t=q.shape[1], s=k.shape[1], d=q.shape[3], softmax_scale=softmax_scale, config=cfg
        )

    return jax.jit(fwd, static_argnums=(3, 4))


def kernel_avals(cfg: BlackwellAttentionConfig, b: int, t: int, hq: int, hkv: int, d: int) -> tuple:
    """``jax.ShapeDtypeStruct`` operands of :func:`kernel_function` (for cross-lowering) for
    padded ``t`` (a multiple of 256) and ``S = t``."""
    import jax
    import jax.numpy as jnp

    elem, qk_scale, blk = _dtypes(cfg)
    dqk = _qk_dim(cfg, d)
    sds = jax.ShapeDtypeStruct
    return (
        sds((b, t, hq, dqk), elem),
        sds((b, t, hkv, dqk), elem),
        sds((b, hkv, d, t), elem),
        sds((b, hq, t // 128, dqk // blk // 4, 32, 16), qk_scale),
        sds((b, hkv, t // 128, dqk // blk // 4, 32, 16), qk_scale),
        sds((b, hkv, 1, t // 128, 32, 16), jnp.float8_e8m0fnu),
    )


def div6_rn(x: Any) -> Any:
    """float32 ``x / 6`` correctly rounded for the Direct-P payload sums (``x`` a multiple of
    1/2 in [0, 192]), without a division (Mosaic GPU's approximate one, and XLA's reciprocal
    rewrite, are not correctly rounded): ``q = fl(x·fl(1/6))`` is within one unit ``u`` of
    ``x/6``; the remainder ``r = (x − 4q) − 2q`` is exact (both subtractions are of numbers within
    a factor 2, Sterbenz) and ``|x/6 − q| ≤ u/2 ⟺ |r| ≤ 3u`` moves q by one unit where needed
    (no ties: ``x/6 = n/12`` is either exact or non-terminating in binary)."""
    import jax.numpy as jnp
    from jax import lax

    # the select keeps the product rounded: it cannot be contracted into the subtractions
    q = jnp.where(x == 0.0, 0.0, x * float(np.float32(1.0 / 6.0)))
    r = (x - 4.0 * q) - 2.0 * q
    bits = lax.bitcast_convert_type(q, jnp.int32)
    unit = lax.bitcast_convert_type(
        jnp.maximum((bits & 0x7F800000) - (23 << 23), 1 << 23), jnp.float32
    )
    return jnp.where(r > 3.0 * unit, q + unit, jnp.where(r < -3.0 * unit, q - unit, q))


def tile_math(cfg: BlackwellAttentionConfig, softmax_scale: float) -> Any:
    """The per-tile numerics of the route (a :class:`~fp4sim.kernels.attention_common.TileMath`
    on 128 x 128 tiles): written with jnp operations only (plus ``ctx.key_iota``), so the same
    functions run inside the kernel and, on plain arrays, in the CPU tests, where their P codes,
    P scale codes and tile normalizer are compared bit for bit with the emulator's."""
    import jax.numpy as jnp
    from jax import lax

    from fp4sim.kernels.attention_common import StepResult, TileMath
    from fp4sim.kernels.attention_common import pow2_f32 as _pow2_f32
    from fp4sim.kernels.attention_directp_mgpu import directp_payload
    from fp4sim.kernels.attention_mgpu import exact_e4m3_exp2

    if not isinstance(cfg, BlackwellAttentionConfig):
        raise TypeError(f"cfg={cfg!r} must be a BlackwellAttentionConfig")
    elem, _, _ = _dtypes(cfg)
    bq = bkv = _BLOCK
    nb = bkv // 32
    c = float(np.float32(softmax_scale * _LOG2E))
    bc_row = lambda x: lax.broadcast_in_dim(x, (bq, bkv), [0])  # noqa: E731
    block_of = lambda ctx: lax.shift_right_logical(ctx.key_iota(), 5)  # noqa: E731

    def ftz(x):
        return jnp.where(jnp.abs(x) < _TINY, 0.0, x)

    def scaled(x, e):
        """ftz(x·2^e) for int-valued float32 e in [−127, 127] (exact but for the flush)."""
        half = jnp.where(e < -126.0, 0.5, 1.0)
        return ftz((x * half) * _pow2_f32(jnp.maximum(e, -126.0)))

    def block_sums(vals, block):
        return [jnp.where(block == b, vals, 0.0).sum(axis=1) for b in range(nb)]

    def beta_of(m_i, m_new):
        return jnp.where(m_i == -jnp.inf, 0.0, jnp.exp2(m_i - m_new))

    def step_mxfp8(ctx, m_i, state):
        u = ftz(ctx.s * c)
        if ctx.visible is not None:
            u = jnp.where(ctx.visible, u, -jnp.inf)
        m_new = jnp.maximum(m_i, u.max(axis=1))
        t = jnp.where(bc_row(m_new) == -jnp.inf, -jnp.inf, u - bc_row(m_new))
        block = block_of(ctx)
        es = []  # e_B = ⌈clip(fl(max_B t − log2 448), −127, 127)⌉: RCEIL
        for b in range(nb):
            tb = jnp.where(block == b, t, -jnp.inf).max(axis=1)
            x = jnp.minimum(jnp.maximum(tb - _LOG2_448, -127.0), 127.0)
            r = lax.round(x, lax.RoundingMethod.TO_NEAREST_EVEN)
            es.append(r + jnp.where(r < x, 1.0, 0.0))
        e_el = bc_row(es[-1])
        for b in range(nb - 2, -1, -1):
            e_el = jnp.where(block == b, bc_row(es[b]), e_el)
        codes = exact_e4m3_exp2(t - e_el, jnp.zeros_like(t))  # RN_E4M3(CR32(2^fl(t − e_B)))
        sums = block_sums(codes, block)  # exact: at most 32 E4M3 values
        l_tile = scaled(sums[0], es[0])
        for b in range(1, nb):
            l_tile = ftz(l_tile + scaled(sums[b], es[b]))
        return StepResult(
            p=codes.astype(elem),
            l_tile=l_tile,
            m=m_new,
            beta=beta_of(m_i, m_new),
            pv_scale=None,
            state=(),
            debug=(m_new,),
            p_scales=tuple((e + 127.0).astype(jnp.int32) for e in es),
        )

    def step_directp(ctx, m_i, state):
        m_new, q, ks, _ = directp_payload(ctx, m_i, c, cfg.recipe.converter, bq, bkv)
        sums = block_sums(q, block_of(ctx))  # exact: at most 32 E2M1 payloads
        l_tile = scaled(div6_rn(sums[0]), ks[0])  # the emulator's fl(fl(Σq / 6)·2^k_B)
        for b in range(1, nb):
            l_tile = ftz(l_tile + scaled(div6_rn(sums[b]), ks[b]))
        return StepResult(
            p=q.astype(elem),
            l_tile=l_tile,
            m=m_new,
            beta=beta_of(m_i, m_new),
            pv_scale=None,
            state=(),
            debug=(m_new,),
            p_scales=tuple((k + 127.0).astype(jnp.int32) for k in ks),
        )

    a_div = 36.0 if cfg.fp4 else 1.0  # pdiv · v_div of the route

    def finish(acc, l_i, m_i, state, rows):
        pos = l_i > 0.0
        l_safe = jnp.where(pos, l_i, 1.0)
        a = acc if a_div == 1.0 else ftz(acc / a_div)
        out = jnp.where(
            lax.broadcast_in_dim(pos, a.shape, [0]),
            a / lax.broadcast_in_dim(l_safe, a.shape, [0]),
            0.0,
        )
        lse = jnp.where(pos, m_i + jnp.log2(l_safe), -jnp.inf)
        return out, lse

    return TileMath(step=step_directp if cfg.fp4 else step_mxfp8, finish=finish, n_debug=1)


def kernel_function(
    q_shape: tuple,
    k_shape: tuple,
    d: int,
    kv_len: int,
    softmax_scale: float,
    cfg: BlackwellAttentionConfig,
) -> Any:
    """The kernel as a function of the six :class:`BlackwellOperands` arrays (padded shapes
    ``q_shape``, ``k_shape``; ``d`` V's head dimension, ``kv_len`` real keys)."""
    from fp4sim.kernels.attention_common import BlockScaledMma, build_forward

    if not isinstance(cfg, BlackwellAttentionConfig):
        raise TypeError(f"cfg={cfg!r} must be a BlackwellAttentionConfig")
    elem, qk_scale, blk = _dtypes(cfg)
    return build_forward(
        q_shape=q_shape,
        k_shape=k_shape,
        in_dtype=elem,
        p_dtype=elem,
        out_dtype=cfg.out_type.dtype,
        block_q=_BLOCK,
        block_kv=_BLOCK,
        max_concurrent_steps=cfg.max_concurrent_steps,
        causal=cfg.causal,
        n_columns=0,
        row_input=False,
        math=tile_math(cfg, softmax_scale),
        debug_step=None,
        kv_len=kv_len,
        mma=BlockScaledMma(qk_scale=np.dtype(qk_scale), qk_block=blk, v_dim=d),
    )

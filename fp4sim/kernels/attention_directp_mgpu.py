"""Direct-P FP4 attention forward on Hopper (sm_90a) as a Pallas Mosaic GPU kernel.

This module owns the GPU forward of the HW-FP4 "Direct-P" route
(:data:`fp4sim.attention.recipe.HW_FP4_DIRECT_P` and ``HW_FP4_DIRECT_P_MITCHELL``): NVFP4 Q and
K, P converted to E2M1 by the affine classifier or Mitchell-P with one E8M0 amplitude ``α_B =
2^k_B`` per 32 keys (``k_B = ⌈max_{j∈B} t_j⌉``), V in MXFP4 along tokens (``β·q/6``), consistent
normalization. Hopper has no FP4 tensor-core path, so every low-precision operand is decoded
*exactly* to float16 and multiplied by the 16-bit ``wgmma`` with float32 accumulation, which the
H200 rounds correctly in practice (measured by :mod:`fp4sim.kernels.wgmma_probe`):

* Q, K: NVFP4 values ``e2m1 × UE4M3 scale`` (at most 6 significant bits, within float16's range)
  decoded by :func:`fp4sim.attention.forward.quantize_qk` outside the kernel.
* V: ``β·q`` (payload times a power of two) decoded by :func:`~fp4sim.attention.forward.quantize_v`
  outside the kernel; the two ``/6`` conventions are applied once at the end.
* P: inside the kernel, ``α_B·q_j`` in float16 (exact while ``k_B >= −23``; smaller blocks carry
  weights below 2^-23 of the row maximum and round in float16's subnormal range).

The kernel follows the emulator (:mod:`fp4sim.attention.forward` and
:mod:`fp4sim.attention.converters`) step by step, with the same float32 operations, each written
so that no multiply can be fused into the following add: ``u = ftz(z·c)``, running max ``m'``
(rescale threshold 0), ``t = u − m'``, ``k_B`` clamped to [−127, 127], ``x = t + (log2 6 − k_B)``,
affine ``max(ftz(1.5·x) + 1.2, 0)`` or Mitchell ``bits(⌊(x − s)·2^23⌋ + 127·2^23)``, E2M1 round
to nearest even with saturation. So P codes and block exponents match the emulator bit for bit
wherever the scores do (exactly summable inputs in the tests); O and LSE are compared with
tolerances (different summation orders, ``ex2.approx`` for the rescale).

The pipeline (warp specialisation, TMA ring, barriers, causal loops) is
:func:`fp4sim.kernels.attention_common.build_forward`.
Public names: :class:`DirectPConfig`, :class:`DirectPOperands`, :func:`prepare_operands`,
:func:`attention_directp`, :func:`attention_directp_prepared`, :class:`DirectPDebug`,
:data:`SHIPPED_CONFIGS`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, NamedTuple

import numpy as np

from fp4sim import _checks
from fp4sim.attention.recipe import (
    HW_FP4_DIRECT_P,
    AffineP,
    AttentionRecipe,
    BlockExponent,
    MitchellP,
    PFormat,
    QKFormat,
    VFormat,
)
from fp4sim.kernels.attention_common import pipeline_recipe_problems
from fp4sim.kernels.attention_mgpu import OutType

__all__ = [
    "DirectPConfig",
    "direct_p_route_problems",
    "DirectPOperands",
    "DirectPDebug",
    "prepare_operands",
    "attention_directp",
    "attention_directp_prepared",
    "SHIPPED_CONFIGS",
]

_LOG2E = float.fromhex("0x1.71547652b82fep+0")
_LOG2_6 = float(np.float32(math.log2(6.0)))
_TINY = float.fromhex("0x1p-126")
_P_BLOCK = 32


def direct_p_route_problems(r: AttentionRecipe) -> list[str]:
    """What keeps ``r`` from being the Direct-P route the FP4 kernels implement (Hopper's and
    Blackwell's): NVFP4 Q/K without global factor, ``AffineP``/``MitchellP`` into MXFP4 P with
    ``BLOCK_MAX_CEIL``, ``v=MXFP4_TOKENS``, and what the shared pipeline needs
    (:func:`~fp4sim.kernels.attention_common.pipeline_recipe_problems`). Empty when it is;
    the key tile is each kernel's own check."""
    problems = []
    if r.qk is not QKFormat.NVFP4 or r.qk_global.name != "NONE":
        problems.append("qk must be NVFP4 without a global factor")
    if not isinstance(r.converter, (AffineP, MitchellP)) or r.p_format is not PFormat.MXFP4:
        problems.append("converter must be AffineP or MitchellP into MXFP4 P")
    if r.block_exponent is not BlockExponent.BLOCK_MAX_CEIL:
        problems.append("block_exponent must be BLOCK_MAX_CEIL")
    if r.v is not VFormat.MXFP4_TOKENS:
        problems.append("v must be MXFP4_TOKENS")
    return problems + pipeline_recipe_problems(r)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class DirectPConfig:
    """One compiled configuration of the Direct-P kernel (hashable: a static jit argument).

    ``recipe`` must be a Direct-P route the kernel implements: ``qk=NVFP4`` without global
    factor, ``AffineP``/``MitchellP`` into ``PFormat.MXFP4`` with ``BLOCK_MAX_CEIL``,
    ``v=MXFP4_TOKENS``, consistent normalization, rescale threshold 0, no Hadamard;
    ``recipe.block_kv`` is the kernel's key tile. O defaults to float16 so that it is staged in
    Q's shared-memory buffer (float16 operands leave no room for a separate one at D = 128).
    """

    recipe: AttentionRecipe = HW_FP4_DIRECT_P
    block_q: int = 64
    max_concurrent_steps: int = 2
    causal: bool = False
    out_type: OutType = OutType.FLOAT16
    debug_step: int | None = None

    def __post_init__(self) -> None:
        r = self.recipe
        if not isinstance(r, AttentionRecipe):
            raise TypeError(f"DirectPConfig.recipe={r!r} must be an AttentionRecipe")
        problems = direct_p_route_problems(r)
        if r.block_kv not in (64, 128):
            problems.append("block_kv must be 64 or 128")
        if problems:
            raise ValueError(
                f"DirectPConfig.recipe is not a route this kernel implements: {'; '.join(problems)}"
            )
        _checks.check_int("DirectPConfig", "block_q", self.block_q, 64, multiple=64)
        _checks.check_int("DirectPConfig", "max_concurrent_steps", self.max_concurrent_steps, 2)
        if not isinstance(self.causal, bool):
            raise TypeError(f"DirectPConfig.causal={self.causal!r} must be a bool")
        if not isinstance(self.out_type, OutType):
            raise TypeError(f"DirectPConfig.out_type={self.out_type!r} must be an OutType")
        if self.debug_step is not None:
            _checks.check_int("DirectPConfig", "debug_step", self.debug_step, 0)
        if self.causal and r.block_kv % self.block_q and self.block_q % r.block_kv:
            raise ValueError(
                f"causal attention needs block_kv={r.block_kv} and block_q="
                f"{self.block_q} to divide one another"
            )

    @property
    def block_kv(self) -> int:
        return self.recipe.block_kv

    def replace(self, **changes: Any) -> DirectPConfig:
        return dataclasses.replace(self, **changes)


def _mitchell_recipe() -> AttentionRecipe:
    from fp4sim.attention.recipe import HW_FP4_DIRECT_P_MITCHELL

    return HW_FP4_DIRECT_P_MITCHELL


SHIPPED_CONFIGS: tuple[DirectPConfig, ...] = (
    DirectPConfig(),
    DirectPConfig(causal=True),
    DirectPConfig(recipe=_mitchell_recipe()),
    DirectPConfig(debug_step=0),
)
"""The configurations the package ships (cross-lowered for sm_90a in the CPU tests)."""


class DirectPOperands(NamedTuple):
    """Exactly decoded operands (a pytree): ``q`` (B, T, Hq, D), ``k`` (B, S, Hkv, D) float16
    NVFP4 values; ``vt`` (B, Hkv, D, S) float16 ``β·q`` (MXFP4 V without its /6)."""

    q: Any
    k: Any
    vt: Any


class DirectPDebug(NamedTuple):
    """Key tile ``debug_step``: ``p`` (B, Hq, T, block_kv) float16 operand ``α_B·q_j``;
    ``k`` (B, Hq, block_kv/32, T) block exponents; ``m`` running max (log2 units) and ``l`` the
    normalizer ``Σ α_B·q_j`` after the tile, (B, Hq, T). Rows of causal CTAs that end before the
    tile are left unwritten."""

    p: Any
    k: Any
    m: Any
    l: Any  # noqa: E741 (the normalizer is l in the FlashAttention papers)


def prepare_operands(
    q: Any, k: Any, v: Any, recipe: AttentionRecipe = HW_FP4_DIRECT_P
) -> DirectPOperands:
    """Quantize float Q (B, T, Hq, D), K, V (B, S, Hkv, D) per ``recipe`` with the emulator's
    quantizers and decode them exactly to float16 (works under ``jax.jit``)."""
    import jax.numpy as jnp

    from fp4sim.attention.forward import quantize_qk, quantize_v
    from fp4sim.kernels.attention_common import check_qkv_shapes as _check_qkv_shapes
    from fp4sim.kernels.attention_common import pow2_f32 as _pow2_f32

    _check_qkv_shapes(tuple(q.shape), tuple(k.shape), tuple(v.shape))
    bhtd = lambda x: jnp.swapaxes(jnp.asarray(x, jnp.float32), 1, 2)  # noqa: E731
    qv = quantize_qk(bhtd(q), recipe).values
    kv = quantize_qk(bhtd(k), recipe).values
    s = v.shape[1]
    vb = bhtd(v)
    if s % _P_BLOCK:  # a partial last token block: quantized as if padded with zeros
        vb = jnp.pad(vb, ((0, 0), (0, 0), (0, -s % _P_BLOCK), (0, 0)))
    vop = quantize_v(vb, recipe)  # values: payloads; exps (B, H, S/32, D)
    e = jnp.repeat(vop.exps, _P_BLOCK, axis=-2)
    vvals = (vop.values * _pow2_f32(jnp.maximum(e, -126)))[:, :, :s]  # exact (−127: zero block)
    f16 = jnp.float16
    return DirectPOperands(
        q=jnp.swapaxes(qv, 1, 2).astype(f16),
        k=jnp.swapaxes(kv, 1, 2).astype(f16),
        vt=jnp.swapaxes(vvals, 2, 3).astype(f16),
    )


def attention_directp(
    q: Any,
    k: Any,
    v: Any,
    *,
    softmax_scale: float | None = None,
    config: DirectPConfig = DirectPConfig(),
) -> Any:
    """Prepare float Q, K, V per ``config.recipe`` and run the kernel: ``(O, LSE₂)`` (plus a
    :class:`DirectPDebug` with a debug step). O (B, T, Hq, D) in ``config.out_type``; LSE₂
    (B, Hq, T) float32 in log2 units."""
    if not isinstance(config, DirectPConfig):
        raise TypeError(f"config={config!r} must be a DirectPConfig")
    ops = prepare_operands(q, k, v, config.recipe)
    return attention_directp_prepared(ops, softmax_scale=softmax_scale, config=config)


def attention_directp_prepared(
    ops: DirectPOperands,
    *,
    softmax_scale: float | None = None,
    config: DirectPConfig = DirectPConfig(),
) -> Any:
    """Run the Direct-P kernel on prepared operands (see :func:`attention_directp`)."""
    import jax.numpy as jnp

    from fp4sim.kernels.attention_common import check_qkv_shapes as _check_qkv_shapes

    if not isinstance(config, DirectPConfig):
        raise TypeError(f"config={config!r} must be a DirectPConfig")
    if not isinstance(ops, DirectPOperands):
        raise TypeError(
            f"ops must be DirectPOperands (see prepare_operands), got {type(ops).__name__}"
        )
    b, t, hq, d = ops.q.shape
    s, hkv = ops.k.shape[1], ops.k.shape[2]
    _check_qkv_shapes(tuple(ops.q.shape), tuple(ops.k.shape), (b, s, hkv, d))
    for name, x in (("q", ops.q), ("k", ops.k), ("vt", ops.vt)):
        if np.dtype(x.dtype) != np.dtype(jnp.float16):
            raise TypeError(f"ops.{name} has dtype {x.dtype}; allowed: float16")
    if tuple(ops.vt.shape) != (b, hkv, d, s):
        raise ValueError(f"ops.vt shape {tuple(ops.vt.shape)} must be {(b, hkv, d, s)}")
    cfg = config
    if cfg.causal and s != t:
        raise ValueError(f"causal attention needs as many keys as queries; got T={t}, S={s}")
    n_kv = -(-s // cfg.block_kv)
    if cfg.debug_step is not None and cfg.debug_step >= n_kv:
        raise ValueError(
            f"debug_step={cfg.debug_step} out of range; this shape has {n_kv} key tiles"
        )
    softmax_scale = _checks.softmax_scale(softmax_scale, d)
    return _jitted()(ops, softmax_scale, cfg)


@functools.cache
def _jitted():
    import jax
    import jax.numpy as jnp

    def pad(x, axis, multiple):
        extra = -x.shape[axis] % multiple
        if not extra:
            return x
        widths = [(0, 0)] * x.ndim
        widths[axis] = (0, extra)
        return jnp.pad(x, widths)

    def fwd(ops, softmax_scale, cfg):
        # any T and S: padded query rows are dropped, keys >= S masked in the tail tile
        t, s = ops.q.shape[1], ops.k.shape[1]
        q = pad(ops.q, 1, 2 * cfg.block_q)
        k, vt = pad(ops.k, 1, cfg.block_kv), pad(ops.vt, 3, cfg.block_kv)
        call = _build_call(tuple(q.shape), tuple(k.shape), softmax_scale, cfg, kv_len=s)
        outs = call(q, k, vt)
        if q.shape[1] == t:
            return outs
        o, lse = outs[0][:, :t], outs[1][..., :t]
        if cfg.debug_step is None:
            return o, lse
        dbg = outs[2]
        return (
            o,
            lse,
            DirectPDebug(p=dbg.p[:, :, :t], k=dbg.k[..., :t], m=dbg.m[..., :t], l=dbg.l[..., :t]),
        )

    return jax.jit(fwd, static_argnums=(1, 2))


def _e2m1_rne(a: Any) -> Any:
    """Round non-negative float32 ``a`` to the E2M1 grid, ties to even, saturating at 6."""
    import jax.numpy as jnp
    from jax import lax

    rne = lambda v: lax.round(v, lax.RoundingMethod.TO_NEAREST_EVEN)  # noqa: E731
    q = jnp.where(a < 2.0, rne(a * 2.0) * 0.5, jnp.where(a < 4.0, rne(a), rne(a * 0.5) * 2.0))
    return jnp.minimum(q, 6.0)


def _ftz(x: Any) -> Any:
    import jax.numpy as jnp

    return jnp.where(jnp.abs(x) < _TINY, 0.0, x)


def directp_payload(ctx: Any, m_i: Any, c: float, conv: Any, bq: int, bkv: int) -> tuple:
    """The Direct-P tile step shared by the Hopper and Blackwell kernels (module docstring):
    ``u = ftz(s·c)`` (masked keys −inf), the running max ``m'``, ``t = u − m'``, the block
    exponents ``k_B = clamp(⌈max_{j∈B} t_j⌉, −127, 127)`` and the E2M1 payload ``q`` of the
    affine or Mitchell converter. Returns ``(m', q, [k_B per block], k_B per element)``, float32
    in the layout of ``ctx.s``."""
    import jax.numpy as jnp
    from jax import lax

    from fp4sim.kernels.attention_common import ceil_f32 as _ceil_f32
    from fp4sim.kernels.attention_common import floor_f32 as _floor_f32

    bc_row = lambda x: lax.broadcast_in_dim(x, (bq, bkv), [0])  # noqa: E731
    u = _ftz(ctx.s * c)
    if ctx.visible is not None:
        u = jnp.where(ctx.visible, u, -jnp.inf)
    m_new = jnp.maximum(m_i, u.max(axis=1))
    t = u - bc_row(m_new)
    block = lax.shift_right_logical(ctx.key_iota(), 5)  # key // 32
    ks = []
    for blk in range(bkv // _P_BLOCK):  # k_B = clamp(⌈max_{j∈B} t_j⌉, −127, 127), −inf → −127
        tb = jnp.where(block == blk, t, -jnp.inf).max(axis=1)
        ks.append(jnp.minimum(jnp.maximum(_ceil_f32(tb), -127.0), 127.0))
    k_el = bc_row(ks[-1])
    for blk in range(len(ks) - 2, -1, -1):
        k_el = jnp.where(block == blk, bc_row(ks[blk]), k_el)
    x = t + (_LOG2_6 - k_el)
    if isinstance(conv, AffineP):
        value = jnp.maximum(_ftz(float(np.float32(conv.a)) * x) + float(np.float32(conv.b)), 0.0)
    else:  # MitchellP: 2^floor(y)·(1 + frac(y)) from the float32 bit pattern
        y = x - float(np.float32(conv.shift))
        ok = y >= -126.0
        ys = jnp.where(ok, jnp.minimum(y, 127.0), 0.0)
        bits = _floor_f32(ys * float(2**23)).astype(jnp.int32) + (127 << 23)
        value = jnp.where(ok, lax.bitcast_convert_type(bits, jnp.float32), 0.0)
    return m_new, _e2m1_rne(value), ks, k_el


def _build_call(
    q_shape: tuple,
    k_shape: tuple,
    softmax_scale: float,
    cfg: DirectPConfig,
    kv_len: int | None = None,
):
    import jax.numpy as jnp
    from jax import lax

    from fp4sim.kernels.attention_common import StepResult, TileMath, build_forward
    from fp4sim.kernels.attention_common import pow2_f32 as _pow2_f32

    bq, bkv, d = cfg.block_q, cfg.block_kv, q_shape[3]
    n_blocks = bkv // _P_BLOCK
    c = float(np.float32(softmax_scale * _LOG2E))
    conv = cfg.recipe.converter

    def step(ctx, m_i, state):
        m_new, q, ks, k_el = directp_payload(ctx, m_i, c, conv, bq, bkv)
        p32 = q * _pow2_f32(jnp.maximum(k_el, -126.0))
        p16 = p32.astype(jnp.float16)
        l_tile = p16.astype(jnp.float32).sum(axis=1)  # Σ α_B·q_j as the tensor core sees it
        beta = jnp.exp2(m_i - m_new)
        return StepResult(
            p=p16, l_tile=l_tile, m=m_new, beta=beta, pv_scale=None, state=(), debug=(*ks, m_new)
        )

    def finish(acc, l_i, m_i, state, rows):
        l_safe = jnp.where(l_i == 0.0, 1.0, l_i)
        out = acc / lax.broadcast_in_dim(l_safe * 6.0, (bq, d), [0])  # (A/36)/(Σαq/6)
        lse = jnp.where(l_i == 0.0, -jnp.inf, m_i + (jnp.log2(l_safe) - _LOG2_6))
        return out, lse

    run = build_forward(
        q_shape=q_shape,
        k_shape=k_shape,
        in_dtype=jnp.float16,
        p_dtype=jnp.float16,
        out_dtype=cfg.out_type.dtype,
        block_q=bq,
        block_kv=bkv,
        max_concurrent_steps=cfg.max_concurrent_steps,
        causal=cfg.causal,
        n_columns=0,
        row_input=False,
        math=TileMath(step=step, finish=finish, n_debug=n_blocks + 1),
        debug_step=cfg.debug_step,
        kv_len=kv_len,
    )

    def call(q16, k16, vt16):
        outs = run(q16, k16, vt16)
        if cfg.debug_step is None:
            return outs[0], outs[1]
        o, lse, dp, dr = outs
        return (
            o,
            lse,
            DirectPDebug(
                p=dp, k=dr[:, :, :n_blocks], m=dr[:, :, n_blocks], l=dr[:, :, n_blocks + 1]
            ),
        )

    return call

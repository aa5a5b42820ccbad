"""Bit-exact models of tensor-core MMA instructions: Hopper FP8 ``wgmma`` and Blackwell ``tcgen05``.

This module owns what one chain of tensor-core instructions returns for a dot product
``d = c + Σ_k a[k]·b[k]·sa·sb``, one :class:`MmaModel` per instruction kind (:class:`MmaKind`,
the registry :data:`MMA_MODELS`):

==============================  ===  ==========  =====  ===============  ======================
kind                            K    frac bits   group  block scale      elements
==============================  ===  ==========  =====  ===============  ======================
``WGMMA_FP8`` (Hopper)          32   13          1      none             E4M3, E5M2
``F8F6F4`` (tcgen05)            32   25          1      none             E4M3 E5M2 E3M2 E2M3 E2M1
``MXF8F6F4`` (block_scale)      32   25          1      UE8M0 / 32       E4M3 E5M2 E3M2 E2M3 E2M1
``MXF4`` (block_scale)          64   35          16     UE8M0 / 32       E2M1
``MXF4NVF4`` (block_scale)      64   35          16     UE8M0 or UE4M3   E2M1
                                                        / 16
==============================  ===  ==========  =====  ===============  ======================

The arithmetic is the fused multi-term addition of MMA-Sim (Xie et al., "MMA-Sim: Bit-Accurate
Reference Model of Tensor Cores and Matrix Cores", arXiv:2511.10909; github.com/microsoft/MMA-Sim),
whose Hopper FP8 width agrees with the hardware report in github.com/deepseek-ai/DeepGEMM
issue 37 (the highest 14 bits of each aligned product: 13 fraction bits) and with the H200
measurement behind :data:`fp4sim.formats.matmul.HOPPER_FP8_MODEL`; the Blackwell widths are
MMA-Sim's (no Blackwell GPU has checked them here). Per instruction:

1. *Terms.* ``group = 1``: every product ``a·b`` is a term; its alignment exponent is
   ``e(a) + e(b) + e(sa) + e(sb)``, where ``e(x) = max(floor(log2|x|), emin)`` of ``x``'s format
   (subnormals sit at the format's smallest normal exponent) and ``e(0) = zero_exponent`` (-126,
   the float32 minimum, for every format: MMA-Sim's convention; it matters only when no term is
   non-zero); block scales enter through their exponent alone. ``group = 16`` (the FP4 kinds):
   the 16 products of a scale sub-block are summed exactly first; the term is that sum times both
   scales, and its alignment exponent is ``e(sa) + e(sb)`` (UE4M3 scales: ``emin = -6``, zero
   scales -126; their sign bit is ignored).
2. *Alignment.* The accumulator ``c`` joins the terms with exponent ``max(floor(log2|c|), -126)``
   (-126 for zero). With ``E`` the largest alignment exponent, every term is truncated toward zero
   to a multiple of ``2^(E - frac_bits)`` and the truncated terms are summed exactly.
3. *Output.* The sum is truncated toward zero to ``out_frac_bits`` fraction bits below its own
   leading bit (23: float32 round-toward-zero; 13 for Hopper FP8's E8M13 accumulator), below
   2^-126 to the same number of bits below 2^-126; beyond float32's range it is ±Inf; a zero
   (exact, or truncated to nothing) is +0.
4. *Specials.* A NaN input, a NaN scale, ``Inf·0`` or ``+Inf + -Inf`` give the NaN ``0x7FFFFFFF``;
   otherwise an infinite term or accumulator gives that infinity.

A chain of instructions along K feeds each result to the next as ``c``. Everything is integer
arithmetic (aligned sums in three 16-bit limbs of int32, so jax needs no float64): NumPy and jitted
JAX give the same bits. :func:`mma_dot` is the model on decoded values; ``scaled_matmul(...,
accumulation=Accumulation.TCGEN05)`` (:mod:`fp4sim.formats.matmul`) applies it to
:class:`~fp4sim.formats.blocks.QuantizedArray` operands.
"""

from __future__ import annotations

import dataclasses
import enum
from types import ModuleType
from typing import Any

import numpy as np

from fp4sim._xp import Array, bitcast, materialize, namespace
from fp4sim.formats.f32 import bitlen, compose, pow2, split
from fp4sim.formats.spec import E2M1, E2M3, E3M2, E4M3, E5M2, UE4M3, UE8M0, FloatFormat

__all__ = ["MmaKind", "MmaModel", "MMA_MODELS", "mma_dot", "NAN_BITS"]

NAN_BITS = 0x7FFFFFFF
"""The NaN a tensor core returns (MMA-Sim's and PTX's canonical float32 NaN)."""

_U = np.uint32
_I = np.int32


class MmaKind(enum.Enum):
    """A tensor-core instruction kind (PTX names)."""

    WGMMA_FP8 = "wgmma.mma_async.f32.e4m3/e5m2"
    F8F6F4 = "tcgen05.mma.kind::f8f6f4"
    MXF8F6F4 = "tcgen05.mma.kind::mxf8f6f4.block_scale"
    MXF4 = "tcgen05.mma.kind::mxf4.block_scale"
    MXF4NVF4 = "tcgen05.mma.kind::mxf4nvf4.block_scale"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class MmaModel:
    """One instruction kind's accumulation (see the module docstring): ``k`` elements per
    instruction, ``frac_bits`` kept below the largest alignment exponent, ``group`` products
    summed exactly before alignment, the allowed element formats, the allowed
    ``(scale format, block size)`` pairs (empty: no block scale), ``out_frac_bits`` of the
    result, ``zero_exponent`` of a zero operand."""

    kind: MmaKind
    k: int
    frac_bits: int
    group: int = 1
    elements: tuple[FloatFormat, ...] = (E4M3, E5M2)
    scales: tuple[tuple[FloatFormat, int], ...] = ()
    out_frac_bits: int = 23
    zero_exponent: int = -126

    def __post_init__(self) -> None:
        from fp4sim._checks import check_int

        if not isinstance(self.kind, MmaKind):
            raise TypeError(f"MmaModel.kind={self.kind!r} must be an MmaKind")
        check_int("MmaModel", "k", self.k, 1, 256)
        check_int("MmaModel", "frac_bits", self.frac_bits, 1, 40)
        check_int("MmaModel", "group", self.group, 1, self.k)
        check_int("MmaModel", "out_frac_bits", self.out_frac_bits, 1, 23)
        check_int("MmaModel", "zero_exponent", self.zero_exponent, -1000, 0)
        if self.group == 1 and self.frac_bits > 28:
            raise ValueError(f"MmaModel.frac_bits={self.frac_bits} with group=1 must be <= 28 "
                             f"(each aligned product is summed as one 32-bit integer)")
        if self.k % self.group:
            raise ValueError(f"MmaModel.group={self.group} must divide k={self.k}")
        for fmt, block in self.scales:
            if self.group == 1 and block != self.k:
                raise ValueError(f"MmaModel.scales has block {block} for {fmt}: with group=1 "
                                 f"the block must be the instruction's k={self.k}")
            if self.k % block or block % self.group:
                raise ValueError(f"MmaModel.scales has block {block} for {fmt}: it must divide "
                                 f"k={self.k} and be a multiple of group={self.group}")


_F8F6F4 = (E4M3, E5M2, E3M2, E2M3, E2M1)
MMA_MODELS: dict[MmaKind, MmaModel] = {
    MmaKind.WGMMA_FP8: MmaModel(kind=MmaKind.WGMMA_FP8, k=32, frac_bits=13, out_frac_bits=13),
    MmaKind.F8F6F4: MmaModel(kind=MmaKind.F8F6F4, k=32, frac_bits=25, elements=_F8F6F4),
    MmaKind.MXF8F6F4: MmaModel(kind=MmaKind.MXF8F6F4, k=32, frac_bits=25, elements=_F8F6F4,
                               scales=((UE8M0, 32),)),
    MmaKind.MXF4: MmaModel(kind=MmaKind.MXF4, k=64, frac_bits=35, group=16, elements=(E2M1,),
                           scales=((UE8M0, 32),)),
    MmaKind.MXF4NVF4: MmaModel(kind=MmaKind.MXF4NVF4, k=64, frac_bits=35, group=16,
                               elements=(E2M1,), scales=((UE8M0, 32), (UE8M0, 16), (UE4M3, 16))),
}
"""The instruction models, by kind (MMA-Sim's parameters at commit c785138)."""


# --- integer pieces ---------------------------------------------------------------------------
def _small(xp: ModuleType, x: Array) -> tuple[Array, Array, Array]:
    """(sign, m, e) with |x| = m·2^e, m < 2^8, for finite float32 ``x`` with at most 8
    significant bits whose float32 significand's low 16 bits are zero (every FP8/FP6/FP4 value,
    UE8M0 2^-127 included)."""
    sign, sig, exp = split(xp, bitcast(x, np.uint32))
    return sign, sig >> _U(16), exp + _I(16)


def _exponent(xp: ModuleType, x: Array, emin: int, zero: int) -> Array:
    """MMA-Sim's exponent of finite float32 ``x``: max(floor(log2|x|), emin), ``zero`` for 0."""
    _, sig, exp = split(xp, bitcast(x, np.uint32))
    e = xp.maximum(exp + bitlen(xp, sig) - _I(1), _I(emin))
    return xp.where(sig == 0, _I(zero), e)


def _limbs(xp: ModuleType, sign: Array, p: Array, d: Array, n: int) -> list[Array]:
    """trunc(p·2^d) (p uint32, d int32) as ``n`` signed 16-bit limbs (int32), low first."""
    out = []
    for j in range(n):
        r = _I(16 * j) - d  # right shift giving limb j
        rs = xp.clip(r, 0, 31).astype(np.uint32)
        ls = xp.clip(-r, 0, 16).astype(np.uint32)
        v = xp.where(r >= 32, _U(0), xp.where(r >= 0, p >> rs, p << ls)) & _U(0xFFFF)
        v = v.astype(np.int32)
        out.append(xp.where(sign == 1, -v, v))
    return out


def _carry(xp: ModuleType, l0: Array, l1: Array, l2: Array) -> tuple[Array, Array, Array]:
    """Normalise signed limb sums so the two low limbs are in [0, 2^16)."""
    l1 = l1 + (l0 >> _I(16))
    l2 = l2 + (l1 >> _I(16))
    return l0 & _I(0xFFFF), l1 & _I(0xFFFF), l2


def _round_out(xp: ModuleType, l0: Array, l1: Array, l2: Array, lsb: Array,
               out_frac_bits: int) -> Array:
    """float32 bits of (l0 + l1·2^16 + l2·2^32)·2^lsb (signed limb sums) truncated toward zero
    to ``out_frac_bits`` bits below its leading bit (and below 2^-126); +0 for zero."""
    l0, l1, l2 = _carry(xp, l0, l1, l2)
    neg = l2 < 0
    l0, l1, l2 = _carry(xp, xp.where(neg, -l0, l0), xp.where(neg, -l1, l1),
                        xp.where(neg, -l2, l2))
    hi = l2.astype(np.uint32)
    lo = (l1.astype(np.uint32) << _U(16)) | l0.astype(np.uint32)
    n = xp.where(hi > 0, _I(32) + bitlen(xp, hi), bitlen(xp, lo))
    lead = lsb + n - _I(1)
    keep = xp.maximum(lead - _I(out_frac_bits), _I(-126 - out_frac_bits))
    t = xp.clip(keep - lsb, 0, 63)
    t_lo = xp.clip(t, 0, 31).astype(np.uint32)
    t_hi = xp.clip(32 - t, 1, 31).astype(np.uint32)
    t_up = xp.clip(t - 32, 0, 31).astype(np.uint32)
    m = xp.where(t == 0, lo, xp.where(t < 32, (lo >> t_lo) | (hi << t_hi), hi >> t_up))
    neg = neg & (m != 0)  # a sum truncated to nothing is +0
    return compose(xp, neg.astype(np.uint32), m, lsb + t)


# --- one instruction --------------------------------------------------------------------------
def _specials(xp: ModuleType, a: Array, b: Array, fa: FloatFormat, fb: FloatFormat) -> tuple:
    """(NaN, +Inf, -Inf) masks of Σ a·b over the first (K) axis; only formats with Inf need the
    products themselves."""
    nan = xp.any(xp.isnan(a), axis=0) | xp.any(xp.isnan(b), axis=0)
    if not (fa.has_inf or fb.has_inf):
        return nan, None, None
    with np.errstate(invalid="ignore", over="ignore"):
        prod = a * b
    nan = nan | xp.any(xp.isnan(prod), axis=0)
    return nan, xp.any(prod == np.inf, axis=0), xp.any(prod == -np.inf, axis=0)


def _scale_exp(xp: ModuleType, s: Array, sfmt: FloatFormat, z: int) -> Array:
    return _exponent(xp, xp.where(xp.isnan(s), np.float32(1), s), sfmt.emin, z)


def _instruction(xp: ModuleType, model: MmaModel, a: Array, b: Array, c: Array,
                 sa: Array | None, sb: Array | None, fa: FloatFormat, fb: FloatFormat,
                 sfmt: FloatFormat | None, block: int) -> Array:
    """One instruction, K leading: a, b (k, ...) float32 values (broadcasting); sa, sb
    (k // block, ...) float32 scales or None; c float32 of the result's shape; float32 result.
    Work that depends on one operand only is done on that operand's own shape; the reductions
    run over the leading axis (contiguous for XLA's vectorised loops)."""
    z = model.zero_exponent
    k = a.shape[0]
    if sa is not None and sfmt is UE4M3:
        sa, sb = xp.abs(sa), xp.abs(sb)
    nan, pinf, ninf = _specials(xp, a, b, fa, fb)
    nan = nan | xp.isnan(c)
    if sa is not None:
        nan = nan | xp.any(xp.isnan(sa), axis=0) | xp.any(xp.isnan(sb), axis=0)
    c_inf = xp.isinf(c)
    pinf = (c == np.inf) if pinf is None else pinf | (c == np.inf)
    ninf = (c == -np.inf) if ninf is None else ninf | (c == -np.inf)
    nan = nan | (pinf & ninf)
    # the accumulator as a term (exact float32 significand)
    csafe = xp.where(c_inf | xp.isnan(c), np.float32(0), c)
    c_sign, c_sig, c_exp = split(xp, bitcast(csafe, np.uint32))
    c_top = _exponent(xp, csafe, -126, -126)
    a = xp.where(xp.isfinite(a), a, np.float32(0))  # results with specials are overwritten
    b = xp.where(xp.isfinite(b), b, np.float32(0))
    if model.group == 1:
        ta = _exponent(xp, a, fa.emin, z)
        tb = _exponent(xp, b, fb.emin, z)
        ses = _I(0)
        if sa is not None:  # one scale per row and column of the instruction (block == k)
            sea, seb = _scale_exp(xp, sa, sfmt, z), _scale_exp(xp, sb, sfmt, z)
            ta, tb, ses = ta + sea, tb + seb, (sea + seb)[0]
        lsb = xp.maximum(xp.max(ta + tb, axis=0), c_top) - _I(model.frac_bits)
        # Each term a·b·2^(sea+seb-lsb) is below 2^(frac_bits + 2) <= 2^30 and a·b (exact:
        # at most 8 significant bits) times a power of two is exact; what falls below 2^-126 is
        # truncated to 0 anyway, so a factor clamped at 2^-126 changes nothing.
        f = xp.clip(ses - lsb, -126, 127)
        with np.errstate(over="ignore", under="ignore"):
            y = (a * b) * pow2(f, a)[None]
        kint = xp.trunc(y).astype(np.int32)
        l0 = xp.sum(kint & _I(0xFFFF), axis=0)
        l1 = xp.sum(kint >> _I(16), axis=0)
        l2 = xp.zeros(l0.shape, dtype=np.int32)
    else:
        g = model.group
        with np.errstate(invalid="ignore", over="ignore"):
            prod = a * b
        s = xp.sum(xp.reshape(prod, (k // g, g) + prod.shape[1:]), axis=1)  # exact: E2M1
        sign = bitcast(s, np.uint32) >> _U(31)
        p = xp.abs(s * np.float32(4)).astype(np.uint32)  # an integer below 2^12
        e = _I(-2)
        top = _I(0)
        if sa is not None:
            rep = block // g
            sa_g = xp.where(xp.isnan(sa), np.float32(1), sa)
            sb_g = xp.where(xp.isnan(sb), np.float32(1), sb)
            if rep != 1:
                sa_g, sb_g = xp.repeat(sa_g, rep, axis=0), xp.repeat(sb_g, rep, axis=0)
            _, m_sa, e_sa = _small(xp, sa_g)
            _, m_sb, e_sb = _small(xp, sb_g)
            p = p * (m_sa * m_sb)
            e = e + (e_sa + e_sb)
            top = _exponent(xp, sa_g, sfmt.emin, z) + _exponent(xp, sb_g, sfmt.emin, z)
        top = xp.broadcast_to(top, s.shape)
        lsb = xp.maximum(xp.max(top, axis=0), c_top) - _I(model.frac_bits)
        limbs = _limbs(xp, sign, p, xp.broadcast_to(e - lsb[None], s.shape), 3)
        l0, l1, l2 = (xp.sum(v, axis=0) for v in limbs)
    c0, c1, c2 = _limbs(xp, c_sign, c_sig, c_exp - lsb, 3)
    bits = _round_out(xp, l0 + c0, l1 + c1, l2 + c2, lsb, model.out_frac_bits)
    bits = xp.where(pinf, _U(0x7F800000), xp.where(ninf, _U(0xFF800000), bits))
    bits = xp.where(nan, _U(NAN_BITS), bits)
    return bitcast(bits, np.float32)


def _check_format(fmt: Any, allowed: tuple[FloatFormat, ...], name: str,
                  kind: MmaKind) -> FloatFormat:
    if fmt not in allowed:
        raise ValueError(f"{name}={fmt!r} is not an element format of {kind.name}; allowed: "
                         f"{[f.name for f in allowed]}")
    return fmt


def mma_dot(a: Any, b: Any, *, model: MmaModel, a_format: FloatFormat = E4M3,
            b_format: FloatFormat = E4M3, a_scale: Any = None, b_scale: Any = None,
            scale_format: FloatFormat | None = None, block: int | None = None,
            c: Any = None) -> Any:
    """``c + Σ_k a[..., k]·b[..., k]·sa·sb`` through a chain of ``model`` instructions along K.

    ``a``, ``b``: float32 element values (of ``a_format``/``b_format``) broadcasting against
    each other, K a multiple of ``model.k``. ``a_scale``, ``b_scale``: float32 block-scale values
    ``(..., K // block)`` of ``scale_format`` (both or neither; UE8M0 0x00 is 2^-127, 0xFF NaN),
    required by the block-scaled kinds. ``c``: float32 initial accumulator (default +0),
    broadcasting to the result. Returns float32 ``(...)`` bits as the model defines them."""
    if not isinstance(model, MmaModel):
        raise TypeError(f"model={model!r} must be an MmaModel (e.g. MMA_MODELS[MmaKind.MXF4])")
    _check_format(a_format, model.elements, "a_format", model.kind)
    _check_format(b_format, model.elements, "b_format", model.kind)
    xp = namespace(a, b)
    a = xp.asarray(a, dtype=np.float32)
    b = xp.asarray(b, dtype=np.float32)
    K = a.shape[-1]
    if b.shape[-1] != K:
        raise ValueError(f"a has K={K} but b has K={b.shape[-1]}")
    if K % model.k or K == 0:
        raise ValueError(f"K={K} must be a positive multiple of {model.kind.name}'s k={model.k}")
    if (a_scale is None) != (b_scale is None):
        raise ValueError("a_scale and b_scale must be given together")
    if model.scales and a_scale is None:
        raise ValueError(f"{model.kind.name} needs block scales (a_scale=, b_scale=); allowed "
                         f"(scale_format, block): {[(f.name, n) for f, n in model.scales]}")
    if a_scale is not None:
        if (scale_format, block) not in model.scales:
            raise ValueError(f"(scale_format, block)=({scale_format!r}, {block!r}) is not "
                             f"allowed for {model.kind.name}; allowed: "
                             f"{[(f.name, n) for f, n in model.scales]}")
        a_scale = xp.asarray(a_scale, dtype=np.float32)
        b_scale = xp.asarray(b_scale, dtype=np.float32)
        for nm, s in (("a_scale", a_scale), ("b_scale", b_scale)):
            if s.shape[-1] * block != K:
                raise ValueError(f"{nm} has {s.shape[-1]} scales along K; K={K} with "
                                 f"block {block} needs {K // block}")
    out_shape = np.broadcast_shapes(a.shape[:-1], b.shape[:-1])
    acc = (xp.zeros(out_shape, dtype=np.float32) if c is None
           else xp.broadcast_to(xp.asarray(c, dtype=np.float32), out_shape))
    nd = len(out_shape) + 1

    def k_first(x):  # (..., K) -> (K, ...) with the batch rank of the result
        x = xp.reshape(x, (1,) * (nd - x.ndim) + tuple(x.shape))
        return xp.moveaxis(x, -1, 0)

    # computed once, before the (K, M, N) work: XLA would otherwise fuse whatever produced the
    # operands (a decode, say) into every term
    a, b = materialize((k_first(a), k_first(b)))
    if a_scale is not None:
        a_scale, b_scale = materialize((k_first(a_scale), k_first(b_scale)))
    kk = model.k
    for start in range(0, K, kk):
        sa = sb = None
        if a_scale is not None:
            ss = slice(start // block, (start + kk) // block)
            sa, sb = a_scale[ss], b_scale[ss]
        acc = _instruction(xp, model, a[start:start + kk], b[start:start + kk], acc, sa, sb,
                           a_format, b_format, scale_format, block or kk)
        acc = materialize(acc)  # one result per instruction: XLA must not re-fuse the chain
    return acc

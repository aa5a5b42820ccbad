"""Block-scaled matrix products: what a block-scaled MMA computes, under named accumulation models.

This module owns ``scaled_matmul(a, b)`` for two :class:`~fp4sim.formats.blocks.QuantizedArray`
operands ``a (..., M, K)`` and ``b`` — ``(..., N, K)`` ("K-major", ``BLayout.NK``, what every
block-scaled MMA consumes) or ``(..., K, N)`` (``BLayout.KN``, e.g. V stored (tokens, head_dim) in
P·V) — returning float32 ``(..., M, N)``:

    out[m, n] = g_a · g_b · Σ_k (s_a[m, k] · s_b[n, k]) · a[m, k] · b[n, k]

where ``s`` is the block scale that covers each element (any geometry: MX blocks along K, token
blocks, 32x32 squares, blocks along M or N) and ``g`` the FP32 global factors, which must not vary
along K.

Element products are exact (E2M1·E2M1 has 4 significant bits, E4M3·E4M3 8); each term's scales
are applied exactly (powers of two by exponent arithmetic). How the sum is accumulated is an
:class:`Accumulation`:

``EXACT``      every term exact, summed in float64, rounded once to float32. Equals a float64
               dequantize-then-matmul whenever that sum is exact (e.g. terms on a common grid).
               Needs float64: NumPy, or jax with ``jax_enable_x64`` (else ``TypeError``).
``FLOAT32``    a float32 accumulator; terms (each exact product times its block scales, rounded
               once to float32) are added one by one in increasing K. NumPy and jitted JAX give
               the same bits (each term is exact or correctly rounded with integer arithmetic, so
               FMA contraction cannot change it).
``HOPPER_FP8`` Hopper's FP8 ``wgmma`` accumulator (measured on an H200 by :mod:`fp4sim.kernels.wgmma_probe`, as microsoft/MMA-Sim models it: FP8 wgmma is *not*
               float32-exact). Per scale block along K (which must be whole 32-element wgmma
               steps; the whole K for operands whose scales do not vary along K) the products go
               through :func:`wgmma_fp8_dot` with a :class:`WgmmaFp8Model`, and the block results
               are scaled and added in float32 (the usual "promote per block" scheme, since
               Hopper has no block-scaled MMA).
``TCGEN05``    Blackwell's ``tcgen05.mma`` (:mod:`fp4sim.formats.mma`): the instruction kind follows
               from the operands (:func:`tcgen05_kind`): no block scale ``kind::f8f6f4``; UE8M0
               per 32 ``kind::mxf8f6f4.block_scale`` (``kind::mxf4.block_scale`` for E2M1 x E2M1);
               UE4M3 or UE8M0 per 16 with E2M1 ``kind::mxf4nvf4.block_scale``. The block scales
               are applied inside the instruction chain (the hardware's fused multi-term adder,
               :data:`~fp4sim.formats.mma.MMA_MODELS`); FP32 global factors (NVFP4's second
               level) multiply the result in float32, as a kernel's epilogue does. The scale
               blocks must run along K with the kind's block size, K a multiple of the
               instruction's K (32, or 64 for the FP4 kinds).

``WgmmaFp8Model(group, frac_bits, acc_in_group, align, out_frac_bits, emin)``: products are
consumed ``group`` at a time; the terms of a group (and the running accumulator when
``acc_in_group``) are aligned to the largest exponent among them (a product's exponent is the sum
of its factors' exponents, each clamped below at ``emin``, under ``Align.EXPONENT_SUM``) and
truncated toward zero to ``frac_bits`` bits below it, summed exactly, optionally truncated toward
zero to ``out_frac_bits`` fraction bits of the sum's own leading bit, and the sum becomes the new
accumulator. All integer arithmetic, so NumPy and jitted JAX agree bit for bit.
``HOPPER_FP8_MODEL`` reproduces every output of an H200 FP8 ``wgmma`` measurement bit for bit
(see its docstring).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import numpy as np

from fp4sim._xp import bitcast, namespace
from fp4sim.formats.blocks import BlockFormat, QuantizedArray, block_extents, expand_scales
from fp4sim.formats.f32 import bitlen, compose, ldexp_f32, mul_f32, split
from fp4sim.formats.mma import MMA_MODELS, MmaKind, mma_dot
from fp4sim.formats.spec import E2M1, UE4M3, UE8M0, FloatFormat

__all__ = [
    "Accumulation",
    "Align",
    "BLayout",
    "WgmmaFp8Model",
    "HOPPER_FP8_MODEL",
    "scaled_matmul",
    "wgmma_fp8_dot",
    "tcgen05_kind",
]


class Accumulation(enum.Enum):
    """How the products of a block-scaled matmul are summed (see the module docstring)."""

    EXACT = "exact"
    FLOAT32 = "float32"
    HOPPER_FP8 = "hopper_fp8"
    TCGEN05 = "tcgen05"


class Align(enum.Enum):
    """Which exponent of a product the alignment uses."""

    EXPONENT_SUM = "exponent_sum"  # e(a) + e(b): the product's significand is in [1, 4)
    VALUE = "value"  # floor(log2 |a·b|)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class WgmmaFp8Model:
    """Alignment-and-truncation model of a tensor-core accumulator (see the module docstring)."""

    group: int = 32
    frac_bits: int = 13
    acc_in_group: bool = True
    align: Align = Align.EXPONENT_SUM
    out_frac_bits: int | None = None
    emin: int = -6

    def __post_init__(self) -> None:
        if not isinstance(self.group, int) or self.group < 1:
            raise ValueError(f"WgmmaFp8Model.group={self.group!r} must be a positive int")
        if not isinstance(self.frac_bits, int) or not 1 <= self.frac_bits <= 24:
            raise ValueError(f"WgmmaFp8Model.frac_bits={self.frac_bits!r} must be in 1..24")
        if not isinstance(self.acc_in_group, bool):
            raise TypeError(f"WgmmaFp8Model.acc_in_group={self.acc_in_group!r} must be a bool")
        if not isinstance(self.align, Align):
            raise TypeError(f"WgmmaFp8Model.align={self.align!r} must be an Align")
        if self.out_frac_bits is not None and not (
            isinstance(self.out_frac_bits, int) and 1 <= self.out_frac_bits <= 23
        ):
            raise ValueError(
                f"WgmmaFp8Model.out_frac_bits={self.out_frac_bits!r} must be None or in 1..23"
            )
        if not isinstance(self.emin, int):
            raise TypeError(f"WgmmaFp8Model.emin={self.emin!r} must be an int")


HOPPER_FP8_MODEL = WgmmaFp8Model(
    group=32, frac_bits=13, acc_in_group=True, align=Align.EXPONENT_SUM, out_frac_bits=13, emin=-6
)
"""Hopper FP8 ``wgmma`` (E4M3 x E4M3, float32 accumulator). Per 32-product instruction: input
exponents are clamped below at E4M3's emin (-6); the products (aligned by exponent sum) and the
running accumulator are aligned to the largest exponent among them and truncated toward zero
13 bits below it; the exact sum is truncated toward zero to 13 fraction bits of its own leading
bit (a zero sum is +0). This is the block-FMA model of Khattak & Mikaitis ("Accurate Models of
NVIDIA Tensor Cores", ACM TACO 2026, arXiv:2512.07004) with the parameters the ``mmaemu``
package validates for H100 cuBLAS FP8 GEMMs. Against the H200 measurement stored in
``fp4sim/golden/data/wgmma_fp8_h200.npz`` (15 cases x 4096 outputs, K = 32..512, N(0, 2), wide-exponent
and one-large-term data) it is bit-exact on every output; float32 accumulation in K order
matches 0-32 %."""

_U = np.uint32


class BLayout(enum.Enum):
    """How the second operand is stored: ``NK`` (..., N, K), the K-major layout of every
    block-scaled MMA; ``KN`` (..., K, N), e.g. V (tokens, head_dim) in P·V."""

    NK = "nk"
    KN = "kn"


def _check_operand(q: Any, name: str) -> None:
    if not isinstance(q, QuantizedArray):
        raise TypeError(f"{name}={q!r} must be a QuantizedArray")
    if q.ndim < 2:
        raise ValueError(f"{name} has shape {q.shape}; need at least 2 dimensions")
    if q.format.divisor != 1.0:
        raise ValueError(
            f"{name} is {q.format.name} (rule {q.format.rule.name}: values divided "
            f"by {q.format.divisor:g}), which no block-scaled MMA applies; allowed: "
            f"formats with value code·scale·global"
        )


def _operand(q: QuantizedArray, name: str, kn: bool):
    """(values (..., R, K) float32, per-element scales (kind, (..., R, K), NaN mask) or None,
    K extent of a scale block (K when scales do not vary along K), global factor broadcastable
    to (..., R, 1) or None)."""
    xp = namespace(q.codes)

    def swap(v):
        return xp.swapaxes(v, -1, -2) if kn else v

    vals = swap(q.values())
    K = vals.shape[-1]
    shape = q.shape
    ext = block_extents(shape, q.format, q.geometry, q.axis)
    sshape = tuple(n // b for n, b in zip(shape, ext))
    sc, k_ext = None, K
    if q.format.scale is not None:
        k_ext = ext[-2] if kn else ext[-1]
        if q.format.pow2:
            code = swap(expand_scales(q.scales.astype(np.int32), q))
            sc = ("exp", code - 127, code == 255)
        else:
            sc = ("val", swap(expand_scales(q.scale_values(), q)), None)
    g = q.global_scale
    if g is not None and g.ndim:
        g = xp.reshape(g, (1,) * (len(shape) - g.ndim) + tuple(g.shape))
        if g.shape[-2 if kn else -1] != 1:
            raise ValueError(
                f"{name}.global_scale has shape {tuple(q.global_scale.shape)}: it "
                f"varies along the contraction axis, which no MMA can apply"
            )
        g = swap(expand_scales(xp.broadcast_to(g, sshape), q))[..., :, :1]
    return vals, sc, k_ext, g


def _scale_terms(xp, terms, sa, sb):
    """terms (..., M, N, k) times the per-element scales sa (..., M, k) and sb (..., N, k)."""
    out, nan, exps = terms, None, []
    for side, s in (("a", sa), ("b", sb)):
        if s is None:
            continue
        kind, v, n = s
        v = v[..., :, None, :] if side == "a" else v[..., None, :, :]
        if n is not None:
            n = n[..., :, None, :] if side == "a" else n[..., None, :, :]
            nan = n if nan is None else nan | n
        if kind == "exp":
            exps.append(v)
        else:
            out = mul_f32(out, v)
    if exps:
        out = ldexp_f32(out, exps[0] if len(exps) == 1 else exps[0] + exps[1])
    if nan is not None:
        out = xp.where(nan, np.float32(np.nan), out)
    return out


def _at(s, k):
    """The scales of K index ``k`` only (keeping a length-1 K axis), or None."""
    if s is None:
        return None
    kind, v, nan = s
    return kind, v[..., k : k + 1], None if nan is None else nan[..., k : k + 1]


def scaled_matmul(
    a: QuantizedArray,
    b: QuantizedArray,
    *,
    accumulation: Accumulation = Accumulation.FLOAT32,
    model: WgmmaFp8Model = HOPPER_FP8_MODEL,
    b_layout: BLayout = BLayout.NK,
) -> Any:
    """float32 ``(..., M, N)`` product of ``a (..., M, K)`` and ``b`` (``(..., N, K)``, or
    ``(..., K, N)`` with ``b_layout=BLayout.KN``); any geometry whose scales are applied per
    element of K (see the module docstring)."""
    _check_operand(a, "a")
    _check_operand(b, "b")
    if not isinstance(accumulation, Accumulation):
        raise TypeError(
            f"accumulation={accumulation!r} must be an Accumulation; allowed: "
            f"{[m.name for m in Accumulation]}"
        )
    if not isinstance(model, WgmmaFp8Model):
        raise TypeError(f"model={model!r} must be a WgmmaFp8Model")
    if not isinstance(b_layout, BLayout):
        raise TypeError(
            f"b_layout={b_layout!r} must be a BLayout; allowed: {[m.name for m in BLayout]}"
        )
    kb = b.shape[-2] if b_layout is BLayout.KN else b.shape[-1]
    if a.shape[-1] != kb:
        raise ValueError(f"a has K={a.shape[-1]} but b ({b_layout.name}) has K={kb}")
    xp = namespace(a.codes, b.codes)
    av, sa, ka, ga = _operand(a, "a", False)
    bv, sb, kb_ext, gb = _operand(b, "b", b_layout is BLayout.KN)
    K = av.shape[-1]

    if accumulation is Accumulation.EXACT:
        if xp is not np:
            import jax

            if not jax.config.jax_enable_x64:
                raise TypeError(
                    "accumulation=EXACT needs float64: use NumPy operands or enable jax_enable_x64"
                )
        from fp4sim.formats.blocks import dequantize

        da = dequantize(a).astype(np.float64)
        db = dequantize(b).astype(np.float64)
        sub = "...mk,...kn->...mn" if b_layout is BLayout.KN else "...mk,...nk->...mn"
        return xp.einsum(sub, da, db).astype(np.float32)

    acc = None
    if accumulation is Accumulation.TCGEN05:
        acc = _tcgen05(xp, a, b, av, bv, ka, kb_ext, b_layout is BLayout.KN)
    elif accumulation is Accumulation.FLOAT32:
        terms = _scale_terms(xp, av[..., :, None, :] * bv[..., None, :, :], sa, sb)
        for k in range(K):  # the float32 accumulator, in increasing K
            acc = terms[..., k] if acc is None else acc + terms[..., k]
    else:
        chunk = min(ka, kb_ext)  # one wgmma chain per scale block along K, promoted in float32
        if chunk < K and chunk % 32:
            raise ValueError(
                f"accumulation=HOPPER_FP8 needs scale blocks along K that are whole "
                f"32-element wgmma steps; got {chunk}"
            )
        for start in range(0, K, chunk):
            ks = slice(start, start + chunk)
            part = wgmma_fp8_dot(av[..., :, None, ks], bv[..., None, :, ks], model)[..., None]
            part = _scale_terms(xp, part, _at(sa, start), _at(sb, start))[..., 0]
            acc = part if acc is None else acc + part
    out = acc
    if ga is not None:
        out = mul_f32(out, ga)
    if gb is not None:
        out = mul_f32(out, xp.swapaxes(gb, -1, -2) if xp.ndim(gb) else gb)
    return out


def tcgen05_kind(a: BlockFormat, b: BlockFormat) -> tuple[MmaKind, FloatFormat | None, int | None]:
    """(instruction kind, scale format, scale block) of a Blackwell ``tcgen05.mma`` for operands
    of block formats ``a`` and ``b``; ``ValueError`` for a pair no kind takes."""
    for name, f in (("a", a), ("b", b)):
        if not isinstance(f, BlockFormat):
            raise TypeError(f"{name}={f!r} must be a BlockFormat")
    if (a.scale, a.block_size if a.scale else None) != (b.scale, b.block_size if b.scale else None):
        raise ValueError(
            f"operands {a.name} and {b.name} have different block scales "
            f"({a.scale}/{a.block_size}, {b.scale}/{b.block_size}); a block-scaled "
            f"tcgen05.mma takes one scale format and block size for both"
        )
    fp4 = a.elem is E2M1 and b.elem is E2M1
    if a.scale is None:
        kind, scale, block = MmaKind.F8F6F4, None, None
    elif a.scale is UE8M0 and a.block_size == 32:
        kind, scale, block = (MmaKind.MXF4 if fp4 else MmaKind.MXF8F6F4), UE8M0, 32
    elif a.scale in (UE8M0, UE4M3) and a.block_size == 16 and fp4:
        kind, scale, block = MmaKind.MXF4NVF4, a.scale, 16
    else:
        raise ValueError(
            f"no tcgen05.mma kind takes {a.name} x {b.name} ({a.elem}/{b.elem} "
            f"elements, {a.scale} per {a.block_size}); allowed: no block scale, "
            f"UE8M0 per 32, or E2M1 with UE8M0/UE4M3 per 16"
        )
    model = MMA_MODELS[kind]
    for name, f in (("a", a), ("b", b)):
        if f.elem not in model.elements:
            raise ValueError(
                f"{name}.elem={f.elem} is not an element format of {kind.name}; "
                f"allowed: {[e.name for e in model.elements]}"
            )
    return kind, scale, block


def _tcgen05(
    xp: Any, a: QuantizedArray, b: QuantizedArray, av: Any, bv: Any, ka: int, kb: int, kn: bool
) -> Any:
    """The product of the element values with the block scales applied inside a chain of
    tcgen05 instructions (no global factors)."""
    kind, sfmt, block = tcgen05_kind(a.format, b.format)
    model = MMA_MODELS[kind]
    K = av.shape[-1]
    if K % model.k:
        raise ValueError(
            f"accumulation=TCGEN05 ({kind.name}) needs K a multiple of {model.k}; got K={K}"
        )
    scales = []
    if sfmt is not None:
        for name, q, k_ext, swap in (("a", a, ka, False), ("b", b, kb, kn)):
            if k_ext != block:
                raise ValueError(
                    f"accumulation=TCGEN05 ({kind.name}) needs {name}'s scale "
                    f"blocks along K of {block} elements; {name} has {k_ext}"
                )
            v = expand_scales(q.scale_values(), q)
            scales.append((xp.swapaxes(v, -1, -2) if swap else v)[..., ::block])
    kw = {}
    if scales:
        kw = dict(
            a_scale=scales[0][..., :, None, :],
            b_scale=scales[1][..., None, :, :],
            scale_format=sfmt,
            block=block,
        )
    return mma_dot(
        av[..., :, None, :],
        bv[..., None, :, :],
        model=model,
        a_format=a.format.elem,
        b_format=b.format.elem,
        **kw,
    )


def _exponent(xp: Any, x: Any) -> Any:
    """floor(log2|x|) of float32 ``x`` as int32 (-1000 for zero), from the bits."""
    _, sig, exp = split(xp, bitcast(x, np.uint32))
    return xp.where(sig == 0, np.int32(-1000), exp + bitlen(xp, sig) - 1)


def wgmma_fp8_dot(a: Any, b: Any, model: WgmmaFp8Model = HOPPER_FP8_MODEL, *, c: Any = None) -> Any:
    """``c`` + Σ_k a[..., k]·b[..., k] under ``model`` for float32 inputs whose products are exact
    (FP8/FP6/FP4 values), broadcasting ``a`` and ``b``; ``c``: the initial accumulator (default
    +0); float32 result."""
    xp = namespace(a, b)
    a = xp.asarray(a, dtype=np.float32)
    b = xp.asarray(b, dtype=np.float32)
    with np.errstate(over="ignore"):
        prods = a * b  # exact for the element formats this models
    if model.align is Align.EXPONENT_SUM:
        emin = np.int32(model.emin)
        tops = xp.maximum(_exponent(xp, a), emin) + xp.maximum(_exponent(xp, b), emin)
        tops = xp.where(prods == 0, np.int32(-1000), tops)
    else:
        tops = _exponent(xp, prods)
    K = prods.shape[-1]
    acc = xp.zeros(prods.shape[:-1], dtype=np.float32)
    if c is not None:
        acc = xp.broadcast_to(xp.asarray(c, dtype=np.float32), acc.shape)
    G = model.group
    for start in range(0, K, G):
        terms = prods[..., start : start + G]
        top = tops[..., start : start + G]
        if model.acc_in_group:
            terms = xp.concatenate([acc[..., None], terms], axis=-1)
            top = xp.concatenate([_exponent(xp, acc)[..., None], top], axis=-1)
        s = _aligned_sum(xp, terms, top, model.frac_bits, model.out_frac_bits)
        acc = s if model.acc_in_group else acc + s
    return acc


def _aligned_sum(
    xp: Any, terms: Any, top: Any, frac_bits: int, out_frac_bits: int | None = None
) -> Any:
    """Align finite float32 terms (last axis) to the largest of ``top`` (their alignment
    exponents), truncate toward zero to ``frac_bits`` bits below it, sum exactly; then truncate
    toward zero to ``out_frac_bits`` bits below the sum's own leading bit (if given); float32
    result (correctly rounded; +0 for a zero sum)."""
    bits = bitcast(terms, np.uint32)
    sign, sig, exp = split(xp, bits)
    emax = xp.max(top, axis=-1, keepdims=True)
    lsb = emax - frac_bits  # exponent of the last kept bit
    shift = lsb - exp  # > 0: drop bits (truncate), <= 0: exact left shift
    rs = xp.clip(shift, 0, 31).astype(np.uint32)
    ls = xp.clip(-shift, 0, 31).astype(np.uint32)
    mag = xp.where(shift >= 32, _U(0), xp.where(shift > 0, sig >> rs, sig << ls))
    n = xp.where(sign == 1, -mag.astype(np.int32), mag.astype(np.int32))
    total = xp.sum(n, axis=-1)
    neg = (total < 0).astype(np.uint32)
    mag = xp.abs(total).astype(np.uint32)
    if out_frac_bits is not None:
        drop = xp.clip(bitlen(xp, mag) - 1 - out_frac_bits, 0, 31).astype(np.uint32)
        mag = (mag >> drop) << drop
    out = compose(xp, neg, mag, lsb[..., 0])
    return bitcast(out, np.float32)

"""Block-scaled matrix products: what a block-scaled MMA computes, under named accumulation models.

This module owns ``scaled_matmul(a, b)`` for two :class:`~fp4sim.formats.blocks.QuantizedArray`
operands ``a (..., M, K)`` and ``b (..., N, K)`` (both blocked along K, the contraction axis,
"K-major" like every block-scaled MMA), returning float32 ``(..., M, N)``:

    out[m, n] = g_a · g_b · Σ_blocks (s_a · s_b) · Σ_{k in block} a_k · b_k

Element products are exact (E2M1·E2M1 has 4 significant bits, E4M3·E4M3 8); scales are applied
per block. How the sum is accumulated is an :class:`Accumulation`:

``EXACT``      every term exact, summed in float64, rounded once to float32. Equals a float64
               dequantize-then-matmul whenever that sum is exact (e.g. terms on a common grid).
               Needs float64: NumPy, or jax with ``jax_enable_x64`` (else ``TypeError``).
``FLOAT32``    a float32 accumulator; terms (each exact product times its block scales, rounded
               once to float32) are added one by one in increasing K. NumPy and jitted JAX give
               the same bits (each term is exact or correctly rounded with integer arithmetic, so
               FMA contraction cannot change it).
``HOPPER_FP8`` a model of Hopper's FP8 ``wgmma`` accumulator (pallas_mgpu.md §1.5: FP8 wgmma is
               *not* float32-exact; DeepSeek-V3 reports "around 14 bits"). Per K-block (the MX
               block; the whole K for operands without block scales) the products go through
               :func:`wgmma_fp8_dot` with a :class:`WgmmaFp8Model`, and the block results are
               scaled and added in float32 (the usual "promote to CUDA cores per block" scheme).

``WgmmaFp8Model(group, frac_bits, acc_in_group)``: products are consumed ``group`` at a time; the
terms of a group (and the running accumulator when ``acc_in_group``) are aligned to the largest
exponent among them and truncated toward zero to ``frac_bits`` bits below it, summed exactly, and
the sum becomes the new accumulator (correctly rounded to float32). All integer arithmetic.
``HOPPER_FP8_MODEL`` holds the parameters fitted to H200 measurements (see its docstring: 84 %
of measured outputs bit-exact, the rest within 1.1e-3 of sum|a·b|).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import numpy as np

from fp4sim._xp import bitcast, namespace
from fp4sim.formats.blocks import (
    Geometry,
    QuantizedArray,
    _compose,
    _split,
    ldexp_f32,
    mul_f32,
)

__all__ = ["Accumulation", "Align", "WgmmaFp8Model", "HOPPER_FP8_MODEL", "scaled_matmul", "wgmma_fp8_dot"]


class Accumulation(enum.Enum):
    """How the products of a block-scaled matmul are summed (see the module docstring)."""

    EXACT = "exact"
    FLOAT32 = "float32"
    HOPPER_FP8 = "hopper_fp8"


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

    def __post_init__(self) -> None:
        if not isinstance(self.group, int) or self.group < 1:
            raise ValueError(f"WgmmaFp8Model.group={self.group!r} must be a positive int")
        if not isinstance(self.frac_bits, int) or not 1 <= self.frac_bits <= 24:
            raise ValueError(f"WgmmaFp8Model.frac_bits={self.frac_bits!r} must be in 1..24")
        if not isinstance(self.acc_in_group, bool):
            raise TypeError(f"WgmmaFp8Model.acc_in_group={self.acc_in_group!r} must be a bool")
        if not isinstance(self.align, Align):
            raise TypeError(f"WgmmaFp8Model.align={self.align!r} must be an Align")


HOPPER_FP8_MODEL = WgmmaFp8Model(group=32, frac_bits=13, acc_in_group=True,
                                 align=Align.EXPONENT_SUM)
"""Hopper FP8 ``wgmma`` (E4M3 x E4M3, float32 accumulator) as fitted to H200 measurements
(``tests/golden/wgmma_fp8_h200.npz``, 15 cases x 4096 outputs, K = 32..512): per 32-product
instruction, the products and the running accumulator are aligned to the largest exponent-sum
among them and truncated toward zero 13 bits below it. It reproduces 83.8 % of the measured
outputs bit for bit (64-97 % per case; float32 accumulation in K order: 0-32 %), and its largest
deviation from the hardware is 1.1e-3 of sum|a·b| (the hardware's own deviation from the exact
sum reaches 3.0e-3). Every hardware output lies on the 13-fraction-bit grid of its own leading
bit, which this model does not fully explain: the remaining mismatches are an open question."""

_U = np.uint32


def _check_operand(q: Any, name: str) -> None:
    if not isinstance(q, QuantizedArray):
        raise TypeError(f"{name}={q!r} must be a QuantizedArray")
    if q.ndim < 2:
        raise ValueError(f"{name} has shape {q.shape}; need (..., rows, K)")
    if q.format.scale is not None and (q.geometry is not Geometry.BLOCK or q.axis != -1):
        raise ValueError(f"{name} must be blocked along its last (K) axis with Geometry.BLOCK; "
                         f"got {q.geometry.name} along axis {q.axis}")


def _operand(q: QuantizedArray):
    """(element values (..., R, K) float32, per-block scale as (exponent int32 | value f32) or
    None, block size along K, global factor (..., R, 1) or scalar or None)."""
    xp = namespace(q.codes)
    vals = q.values()
    if q.format.scale is None:
        return vals, None, None, q.shape[-1], q.global_scale
    if q.format.pow2:
        code = q.scales.astype(np.int32)
        sc = ("exp", code - 127, code == 255)
    else:
        sc = ("val", q.scale_values(), None)
    g = q.global_scale
    if g is not None and g.ndim:
        g = xp.reshape(g, tuple(g.shape[:-1]) + (1,)) if g.shape[-1] == 1 else g
    return vals, sc, q.format.block_size, q.shape[-1], g


def _scale_terms(xp, terms, sa, sb, blk):
    """terms (..., M, N, k) times their block scales; the last axis holds whole blocks."""
    def expand(side, s):  # (..., R, nb) -> broadcastable (..., M|1, 1|N, k)
        kind, v, nan = s
        v = xp.repeat(v, blk, axis=-1)
        nan = None if nan is None else xp.repeat(nan, blk, axis=-1)
        if side == "a":
            return kind, v[..., :, None, :], None if nan is None else nan[..., :, None, :]
        return kind, v[..., None, :, :], None if nan is None else nan[..., None, :, :]

    out, nan = terms, None
    exps = []
    for side, s in (("a", sa), ("b", sb)):
        if s is None:
            continue
        kind, v, n = expand(side, s)
        if kind == "exp":
            exps.append(v)
        else:
            out = mul_f32(out, v)
        if n is not None:
            nan = n if nan is None else nan | n
    if exps:
        out = ldexp_f32(out, exps[0] if len(exps) == 1 else exps[0] + exps[1])
    if nan is not None:
        out = xp.where(nan, np.float32(np.nan), out)
    return out


def scaled_matmul(a: QuantizedArray, b: QuantizedArray, *,
                  accumulation: Accumulation = Accumulation.FLOAT32,
                  model: WgmmaFp8Model = HOPPER_FP8_MODEL) -> Any:
    """float32 ``(..., M, N)`` product of ``a (..., M, K)`` and ``b (..., N, K)`` (see module doc)."""
    _check_operand(a, "a")
    _check_operand(b, "b")
    if not isinstance(accumulation, Accumulation):
        raise TypeError(f"accumulation={accumulation!r} must be an Accumulation; allowed: "
                        f"{[m.name for m in Accumulation]}")
    if not isinstance(model, WgmmaFp8Model):
        raise TypeError(f"model={model!r} must be a WgmmaFp8Model")
    if a.shape[-1] != b.shape[-1]:
        raise ValueError(f"a has K={a.shape[-1]} but b has K={b.shape[-1]}")
    xp = namespace(a.codes, b.codes)
    av, sa, bsa, K, ga = _operand(a)
    bv, sb, bsb, _, gb = _operand(b)
    if sa is not None and sb is not None and bsa != bsb:
        raise ValueError(f"a and b have different K blocks ({bsa} vs {bsb})")
    blk = bsa if sa is not None else (bsb if sb is not None else K)

    if accumulation is Accumulation.EXACT:
        if np.dtype(xp.zeros((), dtype=np.float64).dtype) != np.float64:
            raise TypeError("accumulation=EXACT needs float64: use NumPy operands or enable "
                            "jax_enable_x64")
        out = _exact(xp, a, b)
        return out.astype(np.float32)

    acc = None
    if accumulation is Accumulation.FLOAT32:
        terms = _scale_terms(xp, av[..., :, None, :] * bv[..., None, :, :], sa, sb, blk)
        for k in range(K):  # the float32 accumulator, in increasing K
            acc = terms[..., k] if acc is None else acc + terms[..., k]
    else:
        for j in range(K // blk):
            ks = slice(j * blk, (j + 1) * blk)
            part = wgmma_fp8_dot(av[..., :, None, ks], bv[..., None, :, ks], model)[..., None]
            part = _scale_terms(xp, part, _block(sa, j), _block(sb, j), 1)[..., 0]
            acc = part if acc is None else acc + part
    out = acc
    for g, side in ((ga, "a"), (gb, "b")):
        if g is not None:
            g = xp.asarray(g, dtype=np.float32)
            if g.ndim:
                g = g if side == "a" else xp.swapaxes(g, -1, -2)
            out = mul_f32(out, g)
    return out


def _block(s, j):
    """The scales of K-block ``j`` only (as a one-block scale tuple), or None."""
    if s is None:
        return None
    kind, v, nan = s
    return kind, v[..., j:j + 1], None if nan is None else nan[..., j:j + 1]


def _exact(xp, a: QuantizedArray, b: QuantizedArray) -> Any:
    from fp4sim.formats.blocks import dequantize

    da = dequantize(a).astype(np.float64)
    db = dequantize(b).astype(np.float64)
    return xp.einsum("...mk,...nk->...mn", da, db)


def _exponent(xp: Any, x: Any) -> Any:
    """floor(log2|x|) of float32 ``x`` as int32 (-1000 for zero), from the bits."""
    _, sig, exp = _split(xp, bitcast(x, np.uint32))
    return xp.where(sig == 0, np.int32(-1000), exp + _bitlen_i(xp, sig) - 1)


def wgmma_fp8_dot(a: Any, b: Any, model: WgmmaFp8Model = HOPPER_FP8_MODEL) -> Any:
    """Σ_k a[..., k]·b[..., k] under ``model`` for float32 inputs whose products are exact
    (FP8/FP6/FP4 values), broadcasting ``a`` and ``b``; float32 result."""
    xp = namespace(a, b)
    a = xp.asarray(a, dtype=np.float32)
    b = xp.asarray(b, dtype=np.float32)
    with np.errstate(over="ignore"):
        prods = a * b  # exact for the element formats this models
    if model.align is Align.EXPONENT_SUM:
        tops = _exponent(xp, a) + _exponent(xp, b)
        tops = xp.where(prods == 0, np.int32(-1000), tops)
    else:
        tops = _exponent(xp, prods)
    K = prods.shape[-1]
    acc = xp.zeros(prods.shape[:-1], dtype=np.float32)
    G = model.group
    for start in range(0, K, G):
        terms = prods[..., start:start + G]
        top = tops[..., start:start + G]
        if model.acc_in_group:
            terms = xp.concatenate([acc[..., None], terms], axis=-1)
            top = xp.concatenate([_exponent(xp, acc)[..., None], top], axis=-1)
        s = _aligned_sum(xp, terms, top, model.frac_bits)
        acc = s if model.acc_in_group else acc + s
    return acc


def _aligned_sum(xp: Any, terms: Any, top: Any, frac_bits: int) -> Any:
    """Align finite float32 terms (last axis) to the largest of ``top`` (their alignment
    exponents), truncate toward zero to ``frac_bits`` bits below it, sum exactly; correctly
    rounded float32 result."""
    bits = bitcast(terms, np.uint32)
    sign, sig, exp = _split(xp, bits)
    emax = xp.max(top, axis=-1, keepdims=True)
    lsb = emax - frac_bits  # exponent of the last kept bit
    shift = lsb - exp  # > 0: drop bits (truncate), <= 0: exact left shift
    rs = xp.clip(shift, 0, 31).astype(np.uint32)
    ls = xp.clip(-shift, 0, 31).astype(np.uint32)
    mag = xp.where(shift >= 32, _U(0), xp.where(shift > 0, sig >> rs, sig << ls))
    n = xp.where(sign == 1, -mag.astype(np.int32), mag.astype(np.int32))
    total = xp.sum(n, axis=-1)
    neg = (total < 0).astype(np.uint32)
    out = _compose(xp, neg, xp.abs(total).astype(np.uint32), lsb[..., 0])
    return bitcast(out, np.float32)


def _bitlen_i(xp, sig):
    from fp4sim.formats.blocks import _bitlen

    return _bitlen(xp, sig)

"""Packing of sub-byte element codes: two FP4 codes per byte, four FP6 codes per three bytes.

This module owns the storage order of packed FP4 (E2M1) and FP6 (E2M3, E3M2) codes; nothing
else in fp4sim shifts codes into bytes. Unpacked codes are ``uint8`` arrays with one code per
byte (the code in the low bits, the high bits zero), as :func:`fp4sim.formats.encode` returns
them. Packing works along any ``axis``; the packed axis is shorter (``n/2`` bytes for FP4,
``3n/4`` bytes for FP6) and every other axis is unchanged.

The default orders read a packed axis as a **little-endian bit stream**: code ``i`` occupies
bits ``[w*i, w*(i+1))`` (w = 4 or 6) of the packed bytes taken least significant byte first.
The FP4 orders:

* :attr:`NibbleOrder.INTERLEAVED` (the default): byte ``k`` holds element ``2k`` in bits 0-3
  (low nibble) and element ``2k+1`` in bits 4-7. This is the order of PTX/CUTLASS packed
  ``e2m1x2`` memory operands, torchao (``pack_uint4``, test "7654:3210 = val1:val0"),
  TransformerEngine, Triton and FlashInfer. (PTX ``cvt.rn.satfinite.e2m1x2.f32 d, a, b`` puts
  ``a`` in the *upper* nibble, so kernels pass the odd element first.)
* :attr:`NibbleOrder.SPLIT_HALF`: the llama.cpp/ggml ``block_mxfp4`` pairing. Within each block
  of 32 elements, byte ``j`` (j < 16) holds element ``j`` in the low nibble and element
  ``j + 16`` in the high nibble (``dequantize_row_mxfp4``). :attr:`NibbleOrder.SPLIT_HALF_16`
  is the same pairing in blocks of 16 (ggml's NVFP4 sub-blocks: ``j`` and ``j + 8``). Only the
  element bytes are modelled; ggml's block struct also stores the scale byte in front of them.

FP6 (``nbits == 6``) has a single order, the little-endian 24-bit group used by AMD's
rocRoller (``setFp6``/``getFp6``) and by CUTLASS's packed MXFP6 operands (as lightx2v packs them
for ``cutlass_scaled_mxfp6_mxfp8_mm``). On Blackwell, TMA's ``.b6x16_p32`` copy moves 16 such
packed codes (12 bytes) from global to shared memory and appends 4 bytes of padding, the
"contiguously packed along with padding" form ``tcgen05.mma .kind::mxf8f6f4`` reads; that
padding is not modelled here. With codes ``a, b, c, d`` (6 bits each)::

    byte 0 = a        | (b & 0x03) << 6
    byte 1 = b >> 2   | (c & 0x0F) << 4
    byte 2 = c >> 4   | d << 2

(Older torchao ``pack_uint6`` split each code into a 4-bit and a 2-bit part stored in separate
bytes; that order is not offered.) The one-code-per-byte form with two zero padding bits at the
top is simply the unpacked ``codes``.

Lengths: FP4 packs pairs (or whole 32/16-element groups for the split orders) and FP6 packs
quadruples. A length that is not a multiple raises ``ValueError`` unless ``pad=True``, which
appends zero codes (+0) to the next multiple; :func:`unpack` then takes ``length=`` to drop them.
Codes with bits above the format's width are rejected on NumPy (``ValueError`` naming
``codes``); under jax (no data-dependent errors) those bits are ignored. Everything is integer
bit manipulation written once against :func:`fp4sim._xp.namespace`, so NumPy and jitted jax
give identical bytes.
"""

from __future__ import annotations

import enum
import operator
from typing import Any

import numpy as np

from fp4sim._xp import Array, is_jax, namespace
from fp4sim.formats.spec import FloatFormat

__all__ = ["NibbleOrder", "pack", "unpack", "packed_length", "pack_group_size"]


class NibbleOrder(enum.Enum):
    """Which two FP4 elements share a byte (element with the lower index in the low nibble)."""

    INTERLEAVED = "interleaved"  # (2k, 2k+1): PTX/CUTLASS, torchao, TE, Triton, FlashInfer
    SPLIT_HALF = "split_half"  # (j, j+16) in blocks of 32: ggml/llama.cpp MXFP4
    SPLIT_HALF_16 = "split_half_16"  # (j, j+8) in blocks of 16: ggml/llama.cpp NVFP4

    @property
    def block(self) -> int:
        """Elements per pairing block (2 for interleaved)."""
        return {"interleaved": 2, "split_half": 32, "split_half_16": 16}[self.value]


def _check_fmt(fmt: Any, order: Any) -> int:
    if not isinstance(fmt, FloatFormat):
        raise TypeError(f"fmt={fmt!r} must be a FloatFormat (E2M1, E2M3 or E3M2)")
    if fmt.nbits not in (4, 6):
        raise ValueError(
            f"fmt={fmt} has {fmt.nbits}-bit codes; packing needs a 4-bit (E2M1) "
            f"or 6-bit (E2M3, E3M2) format"
        )
    if not isinstance(order, NibbleOrder):
        raise TypeError(f"order={order!r} must be a NibbleOrder")
    if fmt.nbits == 6 and order is not NibbleOrder.INTERLEAVED:
        raise ValueError(
            f"order={order} applies to 4-bit codes only; {fmt} packs 4 codes per "
            f"3 bytes in one order (use NibbleOrder.INTERLEAVED)"
        )
    return fmt.nbits


def pack_group_size(fmt: FloatFormat, order: NibbleOrder = NibbleOrder.INTERLEAVED) -> int:
    """Codes per indivisible packed group: 2 (FP4), 32 or 16 (FP4 split orders), 4 (FP6)."""
    nbits = _check_fmt(fmt, order)
    return 4 if nbits == 6 else order.block


def packed_length(
    n: int, fmt: FloatFormat, *, order: NibbleOrder = NibbleOrder.INTERLEAVED, pad: bool = False
) -> int:
    """Bytes that ``n`` codes occupy along the packed axis (``pad=True``: after zero padding)."""
    g = pack_group_size(fmt, order)
    n = operator.index(n)
    if n < 0:
        raise ValueError(f"n={n} must be >= 0")
    if n % g and not pad:
        raise ValueError(
            f"n={n} codes of {fmt} ({order.name}) do not fill whole groups of {g}; "
            f"pass pad=True to pad with zero codes"
        )
    groups = -(-n // g)
    return groups * g * fmt.nbits // 8


def _axis(axis: Any, ndim: int, name: str) -> int:
    try:
        axis = operator.index(axis)
    except TypeError:
        raise TypeError(f"axis={axis!r} must be an int") from None
    if not -ndim <= axis < ndim:
        raise ValueError(
            f"axis={axis} is out of range for {name} with {ndim} dimensions "
            f"(allowed: {-ndim}..{ndim - 1})"
        )
    return axis % ndim


def _check_uint8(x: Array, name: str) -> None:
    if not hasattr(x, "dtype") or not hasattr(x, "shape"):
        raise TypeError(f"{name} must be a NumPy or jax array of uint8, got {type(x).__name__}")
    if np.dtype(x.dtype) != np.uint8:
        raise TypeError(f"{name} has dtype {x.dtype}; allowed: uint8")
    if x.ndim == 0:
        raise ValueError(f"{name} is a scalar; packing needs at least one axis")


def pack(
    codes: Array,
    fmt: FloatFormat,
    *,
    axis: int = -1,
    order: NibbleOrder = NibbleOrder.INTERLEAVED,
    pad: bool = False,
) -> Any:
    """Pack one-code-per-byte ``codes`` (uint8) of a 4- or 6-bit ``fmt`` along ``axis``.

    FP4: ``n`` codes → ``n/2`` bytes in the given :class:`NibbleOrder`. FP6: ``n`` codes →
    ``3n/4`` bytes (the little-endian 24-bit group of the module docstring). With ``pad=True``
    the axis is first padded with zero codes to a whole number of groups
    (:func:`pack_group_size`); otherwise a partial group raises ``ValueError``.
    """
    nbits = _check_fmt(fmt, order)
    _check_uint8(codes, "codes")
    if not isinstance(pad, bool):
        raise TypeError(f"pad={pad!r} must be a bool")
    xp = namespace(codes)
    ax = _axis(axis, codes.ndim, "codes")
    n = codes.shape[ax]
    g = pack_group_size(fmt, order)
    mask = np.uint8((1 << nbits) - 1)
    if is_jax(codes):
        codes = codes & mask
    elif codes.size and int(np.max(codes)) > int(mask):
        raise ValueError(
            f"codes contains {int(np.max(codes)):#x}, not a {nbits}-bit {fmt} code "
            f"(allowed: 0..{int(mask):#x})"
        )
    c = xp.moveaxis(codes, ax, -1)
    if n % g:
        if not pad:
            raise ValueError(
                f"codes has {n} elements along axis {axis}, not a multiple of "
                f"{g} ({fmt}, {order.name}); pass pad=True to pad with zero codes"
            )
        c = xp.pad(c, [(0, 0)] * (c.ndim - 1) + [(0, g - n % g)])
    lead = tuple(c.shape[:-1])
    m = c.shape[-1]
    if nbits == 4:
        if order is NibbleOrder.INTERLEAVED:
            pairs = xp.reshape(c, lead + (m // 2, 2))
            lo, hi = pairs[..., 0], pairs[..., 1]
        else:
            halves = xp.reshape(c, lead + (m // g, 2, g // 2))
            lo = xp.reshape(halves[..., 0, :], lead + (m // 2,))
            hi = xp.reshape(halves[..., 1, :], lead + (m // 2,))
        out = lo | (hi << np.uint8(4))
    else:
        quads = xp.reshape(c, lead + (m // 4, 4))
        a, b, cc, d = quads[..., 0], quads[..., 1], quads[..., 2], quads[..., 3]
        b0 = a | ((b & np.uint8(0x03)) << np.uint8(6))
        b1 = (b >> np.uint8(2)) | ((cc & np.uint8(0x0F)) << np.uint8(4))
        b2 = (cc >> np.uint8(4)) | (d << np.uint8(2))
        out = xp.reshape(xp.stack([b0, b1, b2], axis=-1), lead + (3 * (m // 4),))
    return xp.moveaxis(out.astype(np.uint8), -1, ax)


def unpack(
    packed: Array,
    fmt: FloatFormat,
    *,
    axis: int = -1,
    order: NibbleOrder = NibbleOrder.INTERLEAVED,
    length: int | None = None,
) -> Any:
    """Inverse of :func:`pack`: one uint8 code per byte along ``axis``.

    ``length`` (the unpadded number of codes) drops the zero codes that ``pack(..., pad=True)``
    appended; it must round up to exactly the packed size.
    """
    nbits = _check_fmt(fmt, order)
    _check_uint8(packed, "packed")
    xp = namespace(packed)
    ax = _axis(axis, packed.ndim, "packed")
    nb = packed.shape[ax]
    g = pack_group_size(fmt, order)
    bytes_per_group = g * nbits // 8
    if nb % bytes_per_group:
        raise ValueError(
            f"packed has {nb} bytes along axis {axis}, not a multiple of "
            f"{bytes_per_group} ({fmt}, {order.name}: {g} codes per "
            f"{bytes_per_group} bytes)"
        )
    m = nb // bytes_per_group * g
    if length is not None:
        try:
            length = operator.index(length)
        except TypeError:
            raise TypeError(f"length={length!r} must be an int or None") from None
        if not (0 <= length <= m and -(-length // g) * g == m):
            raise ValueError(
                f"length={length} does not match {nb} packed bytes of {fmt} "
                f"({order.name}): allowed {max(m - g + 1, 0)}..{m}"
            )
    p = xp.moveaxis(packed, ax, -1)
    lead = tuple(p.shape[:-1])
    if nbits == 4:
        lo = p & np.uint8(0x0F)
        hi = p >> np.uint8(4)
        if order is NibbleOrder.INTERLEAVED:
            out = xp.reshape(xp.stack([lo, hi], axis=-1), lead + (m,))
        else:
            lo = xp.reshape(lo, lead + (m // g, g // 2))
            hi = xp.reshape(hi, lead + (m // g, g // 2))
            out = xp.reshape(xp.stack([lo, hi], axis=-2), lead + (m,))
    else:
        tri = xp.reshape(p, lead + (m // 4, 3))
        b0, b1, b2 = tri[..., 0], tri[..., 1], tri[..., 2]
        a = b0 & np.uint8(0x3F)
        b = (b0 >> np.uint8(6)) | ((b1 & np.uint8(0x0F)) << np.uint8(2))
        c = (b1 >> np.uint8(4)) | ((b2 & np.uint8(0x03)) << np.uint8(4))
        d = b2 >> np.uint8(2)
        out = xp.reshape(xp.stack([a, b, c, d], axis=-1), lead + (m,))
    out = out.astype(np.uint8)
    if length is not None and length != m:
        out = out[..., :length]
    return xp.moveaxis(out, -1, ax)

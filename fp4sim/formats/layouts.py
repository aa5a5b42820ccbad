"""Memory layouts of block-scale matrices: plain row-major, the 128x4 swizzle, Mosaic GPU's view.

This module owns where each block scale of a matrix sits in memory for the consumers of
block-scaled matrix products; it never looks at the values (any dtype is moved as is; fp4sim's
scale codes are uint8). A scale matrix is ``(..., rows, cols)``: ``rows`` is the M (or N)
dimension of the operand and ``cols = K / block`` (one scale per block of 16 or 32 elements
along K). Leading axes are batch axes; every matrix of the batch is laid out on its own
(per-batch padding). Padding the flattened ``(batch*rows, cols)`` matrix instead (FlashInfer's
alternative; also what torchao 0.18's ``to_mx(..., is_swizzled_scales=True)`` does, which there
only works when ``rows % 128 == 0``, where both agree) is had by reshaping first.

:attr:`ScaleLayout.PLAIN` — the row-major ``(..., rows, cols)`` array itself.

:attr:`ScaleLayout.SWIZZLED_128X4` — cuBLAS's "1D block scaling factors layout", the layout
Blackwell's block-scaled MMA (``tcgen05.mma ... block_scale``) consumes and what torchao's
``to_blocked``, TransformerEngine's ``gemm_swizzled_scale_idx`` and FlashInfer's 128x4 layout
produce. The matrix is zero-padded to ``R = 128*ceil(rows/128)`` rows and
``C = 4*ceil(cols/4)`` columns and cut into 128x4 tiles, stored one after the other in
row-of-tiles-major order (tile ``(i, j)`` at ``(i*C/4 + j) * 512`` bytes). Inside a tile the
scale at tile-local ``(r, c)`` sits at byte ``(r % 32)*16 + (r // 32)*4 + c``: the tile is a
32x16 array whose row ``r % 32`` interleaves the four rows ``r % 32 + {0, 32, 64, 96}``. The
result is a flat ``(..., R*C)`` array per matrix (:func:`blocked_offset` gives the formula).

:attr:`ScaleLayout.MOSAIC_TMEM` — the shared-memory array that Mosaic GPU's
``plgpu.async_copy_scales_to_tmem`` copies into a ``TMEMLayout.SCALES_LAYOUT`` TMEM ref
(``tcgen05.py``'s ``format_scales``): shape ``(..., R/128, C/4, 32, 16)``, contiguous, no SMEM
transforms. Element ``[i, j, r % 32, (r // 32)*4 + c]`` is the scale of row ``128i + r``,
column ``4j + c``. It holds exactly the bytes of ``SWIZZLED_128X4`` in the same order; only the
shape differs (Mosaic needs ``rows % 128 == 0`` and ``cols % 4 == 0``, which the zero padding
provides; one copy takes at most two 128-row tiles).

:attr:`ScaleLayout.SWIZZLED_8X4` — FlashInfer's / TensorRT-LLM's ``SWIZZLED_8x4`` layout for
small M (decode): rows padded to a multiple of 8 and columns to 4, 8x4 tiles stored in
row-of-tiles order, each tile row-major (32 bytes; FlashInfer's
``compute_sf_index_swizzled_8x4_gpu``). Flat ``(..., R*C)`` per matrix.

Padding regions hold zero codes (0x00: 2^-127 for UE8M0, +0 for UE4M3), what torchao's
``to_blocked`` writes (``torch.zeros``; checked against its stored output). Padded rows only feed
output rows that do not exist; padded K-blocks multiply padded (zero) elements, so a finite
padding scale adds nothing, but a NaN code (0xFF for UE8M0, 0x7F for UE4M3) there would turn the
whole output row into NaN. :func:`check_padding` verifies the padding is zero and
:func:`padding_mask` says where it is.

Everything is reshapes, transposes and zero padding written once against
:func:`fp4sim._xp.namespace`, so NumPy and jitted jax give identical bytes.
"""

from __future__ import annotations

import enum
import operator
from types import ModuleType
from typing import Any

import numpy as np

from fp4sim._xp import Array, namespace

__all__ = [
    "ScaleLayout",
    "SCALE_TILE_ROWS",
    "SCALE_TILE_COLS",
    "padded_scale_shape",
    "layout_shape",
    "blocked_offset",
    "to_blocked",
    "from_blocked",
    "to_mosaic_tmem",
    "from_mosaic_tmem",
    "to_swizzled_8x4",
    "from_swizzled_8x4",
    "to_layout",
    "from_layout",
    "padding_mask",
    "check_padding",
]

SCALE_TILE_ROWS = 128  # rows per swizzle tile (the MMA's M per CTA)
SCALE_TILE_COLS = 4  # scale columns per swizzle tile (4 scales = 64 or 128 elements of K)
_SUB = 32  # rows per interleaved sub-tile: a tile is stored as 32 x (4 * 4)
_W = SCALE_TILE_COLS * SCALE_TILE_ROWS // _SUB  # 16 bytes per row of the 32x16 tile
_TR, _TC = SCALE_TILE_ROWS, SCALE_TILE_COLS
_TR8 = 8  # rows per tile of the 8x4 layout


class ScaleLayout(enum.Enum):
    """Where each scale of a ``(..., rows, cols)`` scale matrix lives in memory."""

    PLAIN = "plain"  # row-major (..., rows, cols)
    SWIZZLED_128X4 = "swizzled_128x4"  # cuBLAS / tcgen05 / torchao to_blocked: flat (..., R*C)
    MOSAIC_TMEM = "mosaic_tmem"  # (..., R/128, C/4, 32, 16): Mosaic async_copy_scales_to_tmem
    SWIZZLED_8X4 = "swizzled_8x4"  # FlashInfer / TRT-LLM small-M: 8x4 tiles, flat (..., R8*C)


def _dim(value: Any, name: str) -> int:
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name}={value!r} must be an int") from None
    if value < 1:
        raise ValueError(f"{name}={value} must be >= 1")
    return value


def _check_layout(layout: Any) -> None:
    if not isinstance(layout, ScaleLayout):
        raise TypeError(f"layout={layout!r} must be a ScaleLayout")


def padded_scale_shape(
    rows: int, cols: int, layout: ScaleLayout = ScaleLayout.SWIZZLED_128X4
) -> tuple[int, int]:
    """``(R, C)``: ``rows`` rounded up to a multiple of 128 (8 for ``SWIZZLED_8X4``, 1 for
    ``PLAIN``) and ``cols`` to a multiple of 4 (1 for ``PLAIN``)."""
    _check_layout(layout)
    rows, cols = _dim(rows, "rows"), _dim(cols, "cols")
    if layout is ScaleLayout.PLAIN:
        return (rows, cols)
    tr = _TR8 if layout is ScaleLayout.SWIZZLED_8X4 else _TR
    return (-(-rows // tr) * tr, -(-cols // _TC) * _TC)


def layout_shape(layout: ScaleLayout, rows: int, cols: int) -> tuple[int, ...]:
    """Shape of one ``rows x cols`` scale matrix in ``layout`` (batch axes not included)."""
    r, c = padded_scale_shape(rows, cols, layout)
    if layout is ScaleLayout.PLAIN:
        return (r, c)
    if layout is ScaleLayout.MOSAIC_TMEM:
        return (r // _TR, c // _TC, _SUB, _W)
    return (r * c,)


def blocked_offset(
    row: Any, col: Any, cols: int, layout: ScaleLayout = ScaleLayout.SWIZZLED_128X4
) -> Any:
    """Byte offset of scale ``(row, col)`` in the flat buffer of one matrix with ``cols`` scale
    columns: the cuBLAS formula for ``SWIZZLED_128X4`` (and ``MOSAIC_TMEM``, same bytes), the
    8x4-tile formula for ``SWIZZLED_8X4``, row-major for ``PLAIN``. Works on ints and integer
    arrays."""
    c_pad = padded_scale_shape(1, cols, layout)[1]
    if layout is ScaleLayout.PLAIN:
        return row * c_pad + col
    if layout is ScaleLayout.SWIZZLED_8X4:
        tile = (row // _TR8) * (c_pad // _TC) + col // _TC
        return tile * (_TR8 * _TC) + (row % _TR8) * _TC + col % _TC
    tile = (row // _TR) * (c_pad // _TC) + col // _TC
    r = row % _TR
    return tile * (_TR * _TC) + (r % _SUB) * _W + (r // _SUB) * _TC + col % _TC


def _check_matrix(x: Array, name: str, min_ndim: int) -> None:
    if not hasattr(x, "dtype") or not hasattr(x, "shape"):
        raise TypeError(f"{name} must be a NumPy or jax array, got {type(x).__name__}")
    if x.ndim < min_ndim:
        raise ValueError(f"{name} has shape {tuple(x.shape)}; need at least {min_ndim} axes")


def _pad(xp: ModuleType, scales: Array, layout: ScaleLayout = ScaleLayout.SWIZZLED_128X4) -> Array:
    rows, cols = scales.shape[-2:]
    r, c = padded_scale_shape(rows, cols, layout)
    if (r, c) == (rows, cols):
        return scales
    return xp.pad(scales, [(0, 0)] * (scales.ndim - 2) + [(0, r - rows), (0, c - cols)])


def to_mosaic_tmem(scales: Array) -> Array:
    """``(..., rows, cols)`` → ``(..., R/128, C/4, 32, 16)``, zero-padded (``MOSAIC_TMEM``)."""
    _check_matrix(scales, "scales", 2)
    xp = namespace(scales)
    p = _pad(xp, scales)
    lead = tuple(p.shape[:-2])
    r, c = p.shape[-2:]
    nb = len(lead)
    # rows split as (tile i, row-quarter q = r//32, r%32); cols as (tile j, c%4)
    t = xp.reshape(p, lead + (r // _TR, _TR // _SUB, _SUB, c // _TC, _TC))
    axes = tuple(range(nb)) + tuple(nb + a for a in (0, 3, 2, 1, 4))
    t = xp.transpose(t, axes)  # (i, j, r%32, q, c%4)
    return xp.reshape(t, lead + (r // _TR, c // _TC, _SUB, _W))


def _crop(
    full: Any,
    rows: int | None,
    cols: int | None,
    name: str,
    layout: ScaleLayout = ScaleLayout.SWIZZLED_128X4,
) -> Any:
    r, c = full.shape[-2:]
    rows = r if rows is None else _dim(rows, "rows")
    cols = c if cols is None else _dim(cols, "cols")
    want = padded_scale_shape(rows, cols, layout)
    if want != (r, c):
        raise ValueError(
            f"rows={rows}, cols={cols} pad to {want}, but {name} holds a padded {r}x{c} matrix"
        )
    return full[..., :rows, :cols]


def from_mosaic_tmem(tmem: Array, rows: int | None = None, cols: int | None = None) -> Array:
    """Inverse of :func:`to_mosaic_tmem`; ``rows``/``cols`` (default: the padded size) crop
    the padding away."""
    _check_matrix(tmem, "tmem", 4)
    xp = namespace(tmem)
    lead = tuple(tmem.shape[:-4])
    ti, tj, s, w = tmem.shape[-4:]
    if (s, w) != (_SUB, _W):
        raise ValueError(
            f"tmem has shape {tuple(tmem.shape)}; the last two axes must be ({_SUB}, {_W})"
        )
    nb = len(lead)
    t = xp.reshape(tmem, lead + (ti, tj, _SUB, _TR // _SUB, _TC))
    axes = tuple(range(nb)) + tuple(nb + a for a in (0, 3, 2, 1, 4))
    t = xp.transpose(t, axes)  # (i, q, r%32, j, c%4)
    full = xp.reshape(t, lead + (ti * _TR, tj * _TC))
    return _crop(full, rows, cols, "tmem")


def to_blocked(scales: Array) -> Array:
    """``(..., rows, cols)`` → flat ``(..., R*C)`` in the cuBLAS 128x4 swizzle, zero-padded."""
    t = to_mosaic_tmem(scales)
    xp = namespace(t)
    return xp.reshape(t, tuple(t.shape[:-4]) + (-1,))


def from_blocked(blocked: Array, rows: int, cols: int) -> Array:
    """Inverse of :func:`to_blocked` for a ``rows x cols`` scale matrix (padding dropped)."""
    _check_matrix(blocked, "blocked", 1)
    xp = namespace(blocked)
    r, c = padded_scale_shape(rows, cols)
    if blocked.shape[-1] != r * c:
        raise ValueError(
            f"blocked has {blocked.shape[-1]} scales per matrix; a {rows}x{cols} "
            f"scale matrix pads to {r}x{c} = {r * c}"
        )
    t = xp.reshape(
        blocked, tuple(blocked.shape[:-1]) + layout_shape(ScaleLayout.MOSAIC_TMEM, rows, cols)
    )
    return from_mosaic_tmem(t, rows, cols)


def to_swizzled_8x4(scales: Array) -> Array:
    """``(..., rows, cols)`` → flat ``(..., R*C)`` in FlashInfer's 8x4 layout (rows padded to
    8, cols to 4, zeros): 8x4 tiles in row-of-tiles order, each tile row-major (32 bytes)."""
    _check_matrix(scales, "scales", 2)
    xp = namespace(scales)
    p = _pad(xp, scales, ScaleLayout.SWIZZLED_8X4)
    lead = tuple(p.shape[:-2])
    r, c = p.shape[-2:]
    nb = len(lead)
    t = xp.reshape(p, lead + (r // _TR8, _TR8, c // _TC, _TC))
    t = xp.transpose(t, tuple(range(nb)) + tuple(nb + a for a in (0, 2, 1, 3)))
    return xp.reshape(t, lead + (r * c,))


def from_swizzled_8x4(x: Array, rows: int, cols: int) -> Array:
    """Inverse of :func:`to_swizzled_8x4` for a ``rows x cols`` scale matrix."""
    _check_matrix(x, "x", 1)
    xp = namespace(x)
    r, c = padded_scale_shape(rows, cols, ScaleLayout.SWIZZLED_8X4)
    if x.shape[-1] != r * c:
        raise ValueError(
            f"x has {x.shape[-1]} scales per matrix; a {rows}x{cols} scale matrix "
            f"in SWIZZLED_8X4 pads to {r}x{c} = {r * c}"
        )
    lead = tuple(x.shape[:-1])
    nb = len(lead)
    t = xp.reshape(x, lead + (r // _TR8, c // _TC, _TR8, _TC))
    t = xp.transpose(t, tuple(range(nb)) + tuple(nb + a for a in (0, 2, 1, 3)))
    return _crop(xp.reshape(t, lead + (r, c)), rows, cols, "x", ScaleLayout.SWIZZLED_8X4)


def to_layout(scales: Array, layout: ScaleLayout) -> Array:
    """``(..., rows, cols)`` scales in ``layout`` (``PLAIN`` returns them unchanged)."""
    _check_layout(layout)
    if layout is ScaleLayout.PLAIN:
        _check_matrix(scales, "scales", 2)
        return scales
    if layout is ScaleLayout.SWIZZLED_128X4:
        return to_blocked(scales)
    if layout is ScaleLayout.SWIZZLED_8X4:
        return to_swizzled_8x4(scales)
    return to_mosaic_tmem(scales)


def from_layout(x: Array, layout: ScaleLayout, rows: int, cols: int) -> Array:
    """Inverse of :func:`to_layout`: the ``(..., rows, cols)`` scale matrix."""
    _check_layout(layout)
    if layout is ScaleLayout.PLAIN:
        _check_matrix(x, "x", 2)
        if tuple(x.shape[-2:]) != (_dim(rows, "rows"), _dim(cols, "cols")):
            raise ValueError(f"x has shape {tuple(x.shape)}; expected (..., {rows}, {cols})")
        return x
    if layout is ScaleLayout.SWIZZLED_128X4:
        return from_blocked(x, rows, cols)
    if layout is ScaleLayout.SWIZZLED_8X4:
        return from_swizzled_8x4(x, rows, cols)
    _check_matrix(x, "x", 4)
    want = layout_shape(layout, rows, cols)
    if tuple(x.shape[-4:]) != want:
        raise ValueError(
            f"x has shape {tuple(x.shape)}; a {rows}x{cols} scale matrix in "
            f"{layout.name} is (..., {', '.join(map(str, want))})"
        )
    return from_mosaic_tmem(x, rows, cols)


def padding_mask(layout: ScaleLayout, rows: int, cols: int) -> np.ndarray:
    """Boolean NumPy array shaped like one matrix in ``layout``: True at padding positions."""
    r, c = padded_scale_shape(rows, cols, layout)
    valid = np.zeros((r, c), dtype=bool)
    valid[:rows, :cols] = True
    return ~to_layout(valid, layout)


def check_padding(x: Array, layout: ScaleLayout, rows: int, cols: int) -> None:
    """Raise ``ValueError`` unless every padding position of ``x`` (concrete array, any batch
    axes, one ``rows x cols`` matrix per batch entry in ``layout``) holds a zero code."""
    mask = padding_mask(layout, rows, cols)
    x = np.asarray(x)
    if tuple(x.shape[x.ndim - mask.ndim :]) != mask.shape:
        raise ValueError(
            f"x has shape {x.shape}; a {rows}x{cols} scale matrix in {layout.name} "
            f"is (..., {', '.join(map(str, mask.shape))})"
        )
    bad = np.broadcast_to(mask, x.shape) & (x != 0)
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"x has {int(bad.sum())} nonzero padding entries (first at index "
            f"{first}, value {x[first]!r}); padding must hold zero codes"
        )

"""Scale layouts: the 128x4 swizzle against a loop over the cuBLAS formula and against torchao's
stored ``to_blocked`` output, Mosaic GPU's ``format_scales`` view, round trips, padding
validation, NumPy == jit, and bad input."""

from __future__ import annotations

import hashlib
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fp4sim import golden
from fp4sim.formats.layouts import (
    ScaleLayout,
    blocked_offset,
    check_padding,
    from_blocked,
    from_layout,
    from_mosaic_tmem,
    from_swizzled_8x4,
    layout_shape,
    padded_scale_shape,
    padding_mask,
    to_blocked,
    to_layout,
    to_mosaic_tmem,
    to_swizzled_8x4,
)

PRESETS = golden.DATA_DIR / "presets"
LAYOUTS = tuple(ScaleLayout)


def oracle_blocked(s: np.ndarray) -> np.ndarray:
    """cuBLAS "1D block scaling factors layout", one scale at a time: 128x4 tiles in
    row-of-tiles order, 512 bytes each, (r, c) -> (r % 32) * 16 + (r // 32) * 4 + c inside."""
    rows, cols = s.shape
    n_row_tiles = (rows + 127) // 128
    n_col_tiles = (cols + 3) // 4
    out = np.zeros(n_row_tiles * n_col_tiles * 512, dtype=s.dtype)
    for i in range(rows):
        for j in range(cols):
            tile = (i // 128) * n_col_tiles + (j // 4)
            r, c = i % 128, j % 4
            out[tile * 512 + (r % 32) * 16 + (r // 32) * 4 + c] = s[i, j]
    return out


def oracle_8x4(s: np.ndarray) -> np.ndarray:
    """FlashInfer compute_sf_index_swizzled_8x4: [m tile, k tile, 8, 4], one scale at a time."""
    rows, cols = s.shape
    n_k_tiles = (cols + 3) // 4
    out = np.zeros(((rows + 7) // 8) * 8 * n_k_tiles * 4, dtype=s.dtype)
    for i in range(rows):
        for j in range(cols):
            out[(i // 8) * n_k_tiles * 32 + (j // 4) * 32 + (i % 8) * 4 + j % 4] = s[i, j]
    return out


def mosaic_format_scales(s: np.ndarray) -> np.ndarray:
    """The conversion documented in jax's tcgen05.py (jax/_src/pallas/mosaic_gpu), for padded input."""
    mn, kk = s.shape
    return (
        s.reshape(mn // 128, 4, 32, kk // 4, 4)
        .transpose(0, 3, 2, 1, 4)
        .reshape(mn // 128, kk // 4, 32, 16)
    )


def random_scales(rng, shape) -> np.ndarray:
    return rng.integers(1, 256, size=shape, dtype=np.uint8)  # nonzero: padding stays visible


@pytest.mark.parametrize("rows,cols", [(1, 1), (128, 4), (130, 6), (257, 9), (32, 3), (256, 8)])
def test_blocked_matches_cublas_formula(rows, cols):
    s = random_scales(np.random.default_rng(rows * 100 + cols), (rows, cols))
    want = oracle_blocked(s)
    got = to_blocked(s)
    assert got.shape == (padded_scale_shape(rows, cols)[0] * padded_scale_shape(rows, cols)[1],)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(from_blocked(got, rows, cols), s)
    i, j = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    np.testing.assert_array_equal(got[blocked_offset(i, j, cols)], s)


@pytest.mark.parametrize("rows,cols", [(1, 1), (8, 4), (9, 6), (130, 3)])
def test_8x4_matches_flashinfer_formula(rows, cols):
    s = random_scales(np.random.default_rng(rows + cols), (rows, cols))
    got = to_swizzled_8x4(s)
    np.testing.assert_array_equal(got, oracle_8x4(s))
    np.testing.assert_array_equal(from_swizzled_8x4(got, rows, cols), s)
    assert padded_scale_shape(rows, cols, ScaleLayout.SWIZZLED_8X4) == (
        -(-rows // 8) * 8,
        -(-cols // 4) * 4,
    )


def test_cublas_worked_example():
    # Rows 0, 32, 64, 96 of a tile share the first 16-byte row: [r0c0..r0c3, r32c0.., r64.., r96..]
    s = np.zeros((128, 4), np.int32)
    for r in range(128):
        for c in range(4):
            s[r, c] = 1000 * r + c
    b = to_blocked(s)
    assert b[:16].tolist() == [
        0,
        1,
        2,
        3,
        32000,
        32001,
        32002,
        32003,
        64000,
        64001,
        64002,
        64003,
        96000,
        96001,
        96002,
        96003,
    ]
    assert b[16:20].tolist() == [1000, 1001, 1002, 1003]


def test_matches_torchao_to_blocked():
    d = np.load(PRESETS / "torchao_to_blocked.npz")
    shapes = [k[len("scales_") :] for k in d.files if k.startswith("scales_")]
    assert len(shapes) >= 4
    for shape in shapes:
        rows, cols = map(int, shape.split("x"))
        s, b = d[f"scales_{shape}"], d[f"blocked_{shape}"]
        np.testing.assert_array_equal(to_blocked(s), b, err_msg=shape)
        np.testing.assert_array_equal(from_blocked(b, rows, cols), s, err_msg=shape)
        check_padding(b, ScaleLayout.SWIZZLED_128X4, rows, cols)  # torchao pads with zeros


def test_torchao_vectors_match_provenance():
    """Every stored torchao file is the one PROVENANCE.md lists (sha256), loads without pickle."""
    listed = dict(
        re.findall(
            r"^\| `(torchao_\w+\.npz)` \| `([0-9a-f]{64})` \|",
            (PRESETS / "PROVENANCE.md").read_text(),
            flags=re.M,
        )
    )
    stored = sorted(p.name for p in PRESETS.glob("torchao_*.npz"))
    assert stored and sorted(listed) == stored
    for name in stored:
        assert hashlib.sha256((PRESETS / name).read_bytes()).hexdigest() == listed[name], name
        with np.load(PRESETS / name, allow_pickle=False) as d:
            assert all(d[k].dtype.kind in "uifbU" for k in d.files), name


def test_matches_torchao_swizzled_tensors():
    d = np.load(PRESETS / "torchao_to_blocked.npz")
    # MXTensor scales of a (2, 128, 128) input: per-batch and flattened padding agree here
    plain, swz = d["mx_batched_scales_plain"], d["mx_batched_scales_swizzled"]
    np.testing.assert_array_equal(to_blocked(plain).reshape(swz.shape), swz)
    # NVFP4Tensor scales of a (130, 64) input: rows padded to 256
    plain, swz = d["nvfp4_scales_plain"], d["nvfp4_scales_swizzled"]
    np.testing.assert_array_equal(to_blocked(plain), swz.ravel())
    np.testing.assert_array_equal(from_blocked(swz.ravel(), *plain.shape), plain)


@pytest.mark.parametrize("rows,cols", [(128, 4), (256, 8), (130, 6), (1, 1)])
def test_mosaic_layout_is_format_scales(rows, cols):
    s = random_scales(np.random.default_rng(7), (rows, cols))
    r, c = padded_scale_shape(rows, cols)
    padded = np.zeros((r, c), np.uint8)
    padded[:rows, :cols] = s
    t = to_mosaic_tmem(s)
    assert t.shape == (r // 128, c // 4, 32, 16)
    assert t.shape == layout_shape(ScaleLayout.MOSAIC_TMEM, rows, cols)
    np.testing.assert_array_equal(t, mosaic_format_scales(padded))
    np.testing.assert_array_equal(t.ravel(), to_blocked(s))  # same bytes as the cuBLAS layout
    np.testing.assert_array_equal(from_mosaic_tmem(t, rows, cols), s)
    np.testing.assert_array_equal(from_mosaic_tmem(t), padded)


@st.composite
def scale_batches(draw):
    batch = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    rows = draw(st.integers(1, 300))
    cols = draw(st.integers(1, 11))
    seed = draw(st.integers(0, 2**32 - 1))
    return random_scales(np.random.default_rng(seed), batch + (rows, cols))


@given(scale_batches(), st.sampled_from(LAYOUTS))
def test_round_trip_and_padding(s, layout):
    rows, cols = s.shape[-2:]
    x = to_layout(s, layout)
    assert x.shape == s.shape[:-2] + layout_shape(layout, rows, cols)
    np.testing.assert_array_equal(from_layout(x, layout, rows, cols), s)
    check_padding(x, layout, rows, cols)
    mask = padding_mask(layout, rows, cols)
    r, c = padded_scale_shape(rows, cols, layout)
    assert int(mask.sum()) == r * c - rows * cols
    # the flat layouts put scale (i, j) at blocked_offset(i, j)
    if x.ndim == s.ndim - 1:
        i, j = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
        np.testing.assert_array_equal(x[..., blocked_offset(i, j, cols, layout)], s)
    # every batch entry is laid out on its own
    if s.ndim > 2:
        np.testing.assert_array_equal(
            x[(0,) * (s.ndim - 2)], to_layout(s[(0,) * (s.ndim - 2)], layout)
        )
    # a nonzero byte in the padding is caught, and only there
    if mask.any():
        bad = np.array(x)
        flat_pos = int(np.flatnonzero(mask.ravel())[-1])
        bad.reshape(bad.shape[: bad.ndim - mask.ndim] + (-1,))[
            (0,) * (bad.ndim - mask.ndim) + (flat_pos,)
        ] = 7
        with pytest.raises(ValueError, match="nonzero padding"):
            check_padding(bad, layout, rows, cols)


def test_numpy_and_jit_identical():
    import jax

    s = random_scales(np.random.default_rng(9), (2, 130, 6))
    for layout in (ScaleLayout.SWIZZLED_128X4, ScaleLayout.MOSAIC_TMEM, ScaleLayout.SWIZZLED_8X4):
        got = jax.jit(lambda a, layout=layout: to_layout(a, layout))(jax.numpy.asarray(s))
        want = to_layout(s, layout)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got), want)
        back = jax.jit(lambda a, layout=layout: from_layout(a, layout, 130, 6))(got)
        np.testing.assert_array_equal(np.asarray(back), s)


def test_bad_input():
    s = np.zeros((4, 4), np.uint8)
    with pytest.raises(ValueError, match="at least 2 axes"):
        to_blocked(np.zeros(4, np.uint8))
    with pytest.raises(TypeError, match="NumPy or jax array"):
        to_blocked([[1, 2]])
    with pytest.raises(ValueError, match="blocked has 100 scales per matrix"):
        from_blocked(np.zeros(100, np.uint8), 4, 4)
    with pytest.raises(ValueError, match="rows=0 must be >= 1"):
        padded_scale_shape(0, 4)
    with pytest.raises(TypeError, match="cols=2.0 must be an int"):
        padded_scale_shape(4, 2.0)
    with pytest.raises(TypeError, match="ScaleLayout"):
        to_layout(s, "swizzled")
    with pytest.raises(ValueError, match="last two axes must be"):
        from_mosaic_tmem(np.zeros((1, 1, 16, 32), np.uint8))
    with pytest.raises(ValueError, match="pad to"):
        from_mosaic_tmem(to_mosaic_tmem(s), 200, 4)  # 200 rows need two row tiles, not one
    with pytest.raises(ValueError, match="expected"):
        from_layout(s, ScaleLayout.PLAIN, 4, 5)
    with pytest.raises(ValueError, match="MOSAIC_TMEM is"):
        from_layout(np.zeros((1, 2, 32, 16), np.uint8), ScaleLayout.MOSAIC_TMEM, 4, 4)
    with pytest.raises(ValueError, match="SWIZZLED_8X4 pads to 8x4 = 32"):
        from_swizzled_8x4(np.zeros(16, np.uint8), 4, 4)
    with pytest.raises(ValueError, match="a 4x4 scale matrix in SWIZZLED_128X4"):
        check_padding(np.zeros(10, np.uint8), ScaleLayout.SWIZZLED_128X4, 4, 4)

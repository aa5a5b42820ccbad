"""Packing of FP4/FP6 codes: exhaustive byte tables against hand-written oracles, ggml's split-half
pairing, torchao's packed bytes, hypothesis round trips, NumPy == jit bits, and bad input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fp4sim import golden
from fp4sim.formats import E2M1, E2M3, E3M2, E4M3, UE8M0
from fp4sim.formats.packing import NibbleOrder, pack, pack_group_size, packed_length, unpack

PRESETS = golden.DATA_DIR / "presets"
FP6 = (E2M3, E3M2)
FP4_ORDERS = tuple(NibbleOrder)


# --- independent oracles: one element at a time, bit positions written out -------------------
def oracle_pack_fp4(codes: list[int], order: NibbleOrder) -> list[int]:
    n = len(codes)
    out = [0] * (n // 2)
    if order is NibbleOrder.INTERLEAVED:
        for i, c in enumerate(codes):  # element i -> byte i // 2, nibble i % 2
            out[i // 2] |= c << (4 * (i % 2))
        return out
    g = order.block
    # ggml dequantize_row_mxfp4: y[j] = lo(qs[j]), y[j + g/2] = hi(qs[j])
    for i, c in enumerate(codes):
        blk, j = divmod(i, g)
        half, pos = divmod(j, g // 2)
        out[blk * (g // 2) + pos] |= c << (4 * half)
    return out


def oracle_pack_fp6(codes: list[int]) -> list[int]:
    """Little-endian bit stream: code i at bits [6i, 6i + 6) of the whole packed integer."""
    total = 0
    for i, c in enumerate(codes):
        total |= c << (6 * i)
    return list(total.to_bytes(len(codes) * 6 // 8, "little"))


# --- exhaustive --------------------------------------------------------------------------------
def test_fp4_every_nibble_pair():
    lo, hi = np.meshgrid(
        np.arange(16, dtype=np.uint8), np.arange(16, dtype=np.uint8), indexing="ij"
    )
    codes = np.stack([lo.ravel(), hi.ravel()], axis=-1)  # (256, 2): every (even, odd) pair
    packed = pack(codes, E2M1)
    assert packed.shape == (256, 1) and packed.dtype == np.uint8
    np.testing.assert_array_equal(packed[:, 0], lo.ravel() | (hi.ravel() << 4))
    # and every byte unpacks to (low nibble, high nibble)
    every = np.arange(256, dtype=np.uint8)[:, None]
    np.testing.assert_array_equal(
        unpack(every, E2M1), np.stack([every[:, 0] & 15, every[:, 0] >> 4], axis=-1)
    )


def test_torchao_worked_example():
    # torchao test_fp4_pack_unpack: "7654:3210 = val1:val0"
    assert pack(np.array([0x1, 0x2], np.uint8), E2M1).tolist() == [0x21]
    assert pack(np.array([0xF, 0x0, 0x0, 0x8], np.uint8), E2M1).tolist() == [0x0F, 0x80]


@pytest.mark.parametrize("order", FP4_ORDERS)
def test_fp4_orders_match_oracle(order):
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 16, size=(3, 64), dtype=np.uint8)
    got = pack(codes, E2M1, order=order)
    want = np.array([oracle_pack_fp4(row.tolist(), order) for row in codes], dtype=np.uint8)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(unpack(got, E2M1, order=order), codes)


def test_split_half_is_ggml_pairing():
    # byte j of a 32-block holds elements j (low) and j + 16 (high)
    codes = (np.arange(32) % 16).astype(np.uint8)
    codes[16:] = 15 - codes[16:]
    packed = pack(codes, E2M1, order=NibbleOrder.SPLIT_HALF)
    for j in range(16):
        assert packed[j] & 0xF == codes[j] and packed[j] >> 4 == codes[j + 16]
    packed16 = pack(codes, E2M1, order=NibbleOrder.SPLIT_HALF_16)
    for blk in range(2):
        for j in range(8):
            b = packed16[blk * 8 + j]
            assert b & 0xF == codes[16 * blk + j] and b >> 4 == codes[16 * blk + j + 8]


@pytest.mark.parametrize("fmt", FP6)
def test_fp6_every_code_at_every_position(fmt):
    rng = np.random.default_rng(1)
    rows = []
    for pos in range(4):
        for code in range(64):
            row = rng.integers(0, 64, size=4, dtype=np.uint8)
            row[pos] = code
            rows.append(row)
    codes = np.stack(rows)  # (256, 4)
    got = pack(codes, fmt)
    want = np.array([oracle_pack_fp6(r.tolist()) for r in codes], dtype=np.uint8)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(unpack(got, fmt), codes)


def test_fp6_worked_example():
    # a = 0b111111, b = 0, c = 0b010101, d = 0b101010 (module docstring's byte formulas)
    got = pack(np.array([0x3F, 0x00, 0x15, 0x2A], np.uint8), E2M3)
    assert got.tolist() == [0x3F, 0x50, 0xA9]
    # rocRoller getFp6: index 1 = (b0 >> 6) | (b1 & 0xF) << 2
    b = np.array([0xC0, 0x0F, 0x00], np.uint8)
    assert unpack(b, E3M2).tolist() == [0x00, 0x3F, 0x00, 0x00]


def test_fp6_random_bytes_round_trip():
    rng = np.random.default_rng(2)
    raw = rng.integers(0, 256, size=(4096, 3), dtype=np.uint8)
    codes = unpack(raw, E2M3)
    assert codes.max() < 64
    np.testing.assert_array_equal(pack(codes, E2M3), raw)


# --- cross-library: torchao's packed bytes -----------------------------------------------------
@pytest.mark.parametrize(
    "name,keys",
    [
        ("torchao_mx_e2m1.npz", [("codes_floor", "packed_floor"), ("codes_rceil", "packed_rceil")]),
        ("torchao_nvfp4.npz", [("codes", "packed")]),
        ("torchao_nvfp4_pts.npz", [("codes", "packed")]),
    ],
)
def test_matches_torchao_pack_uint4(name, keys):
    d = np.load(PRESETS / name)
    for codes_key, packed_key in keys:
        np.testing.assert_array_equal(pack(d[codes_key], E2M1), d[packed_key])
        np.testing.assert_array_equal(unpack(d[packed_key], E2M1), d[codes_key])


# --- properties --------------------------------------------------------------------------------
@st.composite
def packing_cases(draw):
    fmt = draw(st.sampled_from([E2M1, E2M3, E3M2]))
    order = draw(st.sampled_from(FP4_ORDERS)) if fmt is E2M1 else NibbleOrder.INTERLEAVED
    g = pack_group_size(fmt, order)
    ndim = draw(st.integers(1, 3))
    axis = draw(st.integers(-ndim, ndim - 1))
    shape = [draw(st.integers(1, 4)) for _ in range(ndim)]
    shape[axis] = g * draw(st.integers(1, 3)) - draw(st.integers(0, g - 1))
    seed = draw(st.integers(0, 2**32 - 1))
    codes = np.random.default_rng(seed).integers(0, 1 << fmt.nbits, size=shape, dtype=np.uint8)
    return fmt, order, axis, codes


@given(packing_cases())
def test_round_trip_any_axis_with_padding(case):
    fmt, order, axis, codes = case
    n = codes.shape[axis]
    packed = pack(codes, fmt, axis=axis, order=order, pad=True)
    expect = list(codes.shape)
    expect[axis] = packed_length(n, fmt, order=order, pad=True)
    assert list(packed.shape) == expect
    np.testing.assert_array_equal(unpack(packed, fmt, axis=axis, order=order, length=n), codes)
    # packing along an axis is packing the moved-to-last array
    np.testing.assert_array_equal(
        np.moveaxis(packed, axis, -1),
        pack(np.ascontiguousarray(np.moveaxis(codes, axis, -1)), fmt, order=order, pad=True),
    )
    # the padding codes are zeros: unpack without length shows them
    full = unpack(packed, fmt, axis=axis, order=order)
    assert not np.moveaxis(full, axis, -1)[..., n:].any()


def test_packed_length():
    assert packed_length(32, E2M1) == 16
    assert packed_length(31, E2M1, pad=True) == 16
    assert packed_length(17, E2M1, order=NibbleOrder.SPLIT_HALF, pad=True) == 16
    assert packed_length(8, E3M2) == 6
    assert packed_length(5, E3M2, pad=True) == 6
    assert packed_length(0, E2M1) == 0
    with pytest.raises(ValueError, match="pad=True"):
        packed_length(3, E2M1)


# --- NumPy == jit ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "fmt,order,axis,shape",
    [
        (E2M1, NibbleOrder.INTERLEAVED, -1, (3, 10)),
        (E2M1, NibbleOrder.SPLIT_HALF, 0, (64, 2)),
        (E2M1, NibbleOrder.SPLIT_HALF_16, 1, (2, 17, 3)),
        (E2M3, NibbleOrder.INTERLEAVED, -1, (5, 9)),
        (E3M2, NibbleOrder.INTERLEAVED, 0, (8, 3)),
    ],
)
def test_numpy_and_jit_identical(fmt, order, axis, shape):
    import jax

    rng = np.random.default_rng(3)
    codes = rng.integers(0, 1 << fmt.nbits, size=shape, dtype=np.uint8)
    n = shape[axis]
    f = jax.jit(lambda c: pack(c, fmt, axis=axis, order=order, pad=True))
    g = jax.jit(lambda p: unpack(p, fmt, axis=axis, order=order, length=n))
    want = pack(codes, fmt, axis=axis, order=order, pad=True)
    got = f(jax.numpy.asarray(codes))
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(np.asarray(got), want)
    np.testing.assert_array_equal(np.asarray(g(got)), codes)


def test_jax_ignores_bits_above_the_format():
    import jax.numpy as jnp

    codes = np.array([0x13, 0xF2], np.uint8)  # high bits set: NumPy rejects, jax masks
    assert np.asarray(pack(jnp.asarray(codes), E2M1)).tolist() == [0x23]
    with pytest.raises(ValueError, match="codes contains 0xf2"):
        pack(codes, E2M1)


# --- QuantizedArray uses these defaults ---------------------------------------------------------
def test_blocks_pack_uses_this_module():
    from fp4sim.formats import blocks

    x = np.random.default_rng(4).standard_normal((4, 64)).astype(np.float32)
    q = blocks.quantize(x, blocks.MXFP4)
    qp = q.pack()
    np.testing.assert_array_equal(qp.codes, pack(q.codes, E2M1))
    np.testing.assert_array_equal(qp.unpack().codes, q.codes)


# --- bad input ---------------------------------------------------------------------------------
def test_bad_input():
    ok = np.zeros(4, np.uint8)
    with pytest.raises(TypeError, match="codes has dtype int32"):
        pack(ok.astype(np.int32), E2M1)
    with pytest.raises(TypeError, match="codes must be"):
        pack([0, 1], E2M1)
    with pytest.raises(ValueError, match="8-bit codes"):
        pack(ok, E4M3)
    with pytest.raises(ValueError, match="8-bit codes"):
        unpack(ok, UE8M0)
    with pytest.raises(TypeError, match="FloatFormat"):
        pack(ok, "E2M1")
    with pytest.raises(TypeError, match="NibbleOrder"):
        pack(ok, E2M1, order="split_half")
    with pytest.raises(ValueError, match="4-bit codes only"):
        pack(ok, E2M3, order=NibbleOrder.SPLIT_HALF)
    with pytest.raises(ValueError, match="3 elements along axis -1, not a multiple of 2"):
        pack(np.zeros(3, np.uint8), E2M1)
    with pytest.raises(ValueError, match="not a multiple of 32"):
        pack(np.zeros(16, np.uint8), E2M1, order=NibbleOrder.SPLIT_HALF)
    with pytest.raises(ValueError, match="not a 6-bit E2M3 code"):
        pack(np.array([64, 0, 0, 0], np.uint8), E2M3)
    with pytest.raises(ValueError, match="axis=2 is out of range"):
        pack(np.zeros((2, 2), np.uint8), E2M1, axis=2)
    with pytest.raises(ValueError, match="scalar"):
        pack(np.uint8(3) * np.ones((), np.uint8), E2M1)
    with pytest.raises(ValueError, match="not a multiple of 3"):
        unpack(np.zeros(4, np.uint8), E3M2)
    with pytest.raises(ValueError, match="length=5 does not match"):
        unpack(np.zeros(4, np.uint8), E2M1, length=5)
    with pytest.raises(ValueError, match="length=6 does not match"):
        unpack(np.zeros(4, np.uint8), E2M1, length=6)  # 6 would pack to 3 bytes, not 4
    with pytest.raises(TypeError, match="pad=1"):
        pack(ok, E2M1, pad=1)

"""Format specifications and policies: derived numbers against ml_dtypes.finfo and by hand."""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest

from fp4sim.formats import (
    ALL_FORMATS,
    DEFAULT_POLICY,
    E2M1,
    E2M3,
    E3M2,
    E4M3,
    E5M2,
    UE4M3,
    UE5M3,
    UE8M0,
    FloatFormat,
    NanEncoding,
    Overflow,
    Policy,
    Rounding,
    SignedZero,
    finfo,
    format_by_name,
    inf_code,
    max_code,
    nan_code,
    value_table,
)


@pytest.mark.parametrize(
    "fmt", [f for f in ALL_FORMATS if f.dtype is not None], ids=lambda f: f.name
)
def test_finfo_matches_ml_dtypes(fmt):
    ours, ref = finfo(fmt), ml_dtypes.finfo(fmt.dtype)
    assert ours.max == float(ref.max)
    assert ours.min_normal == float(ref.tiny)
    assert ours.min_subnormal == float(ref.smallest_subnormal)
    assert ours.eps == float(ref.eps)
    assert (ours.emax, ours.emin) == (ref.maxexp - 1, ref.minexp)
    assert (ours.ebits, ours.mbits) == (ref.nexp, ref.nmant)
    if fmt.signed:
        assert ours.bits == ref.bits


def test_hand_checked_constants():
    assert (E2M1.max, E2M3.max, E3M2.max, E4M3.max, E5M2.max) == (6.0, 7.5, 28.0, 448.0, 57344.0)
    assert UE8M0.emax == 127 and UE8M0.max == float.fromhex("0x1p127")
    assert (
        UE8M0.min_subnormal == UE8M0.min_normal == float.fromhex("0x1p-127") and not UE8M0.has_zero
    )
    assert (
        UE4M3.max == 448.0 and UE4M3.nbits == 7 and UE4M3.min_subnormal == float.fromhex("0x1p-9")
    )
    assert UE5M3.max == float.fromhex("0x1.cp16") == 114688.0
    assert UE5M3.min_subnormal == float.fromhex("0x1p-17") and UE5M3.min_normal == float.fromhex(
        "0x1p-14"
    )
    assert [max_code(f) for f in (E2M1, E4M3, E5M2, UE8M0, UE4M3, UE5M3)] == [
        0x7,
        0x7E,
        0x7B,
        0xFE,
        0x7E,
        0xFE,
    ]
    assert [nan_code(f) for f in (E2M1, E4M3, E5M2, UE8M0)] == [None, 0x7F, 0x7E, 0xFF]
    assert [inf_code(f) for f in (E4M3, E5M2)] == [None, 0x7C]


@pytest.mark.parametrize("fmt", ALL_FORMATS, ids=lambda f: f.name)
def test_finfo_agrees_with_the_value_table(fmt):
    t = value_table(fmt).astype(np.float64)
    fin = t[np.isfinite(t)]
    info = finfo(fmt)
    assert fin.max() == info.max and value_table(fmt)[info.max_code] == info.max
    assert fin[fin > 0].min() == info.min_subnormal
    assert np.min(fin[fin > 1]) - 1 == info.eps
    assert info.has_nan == bool(np.isnan(t).any()) and info.has_inf == bool(np.isinf(t).any())
    assert info.has_zero == bool((t == 0).any())


def test_policy_is_frozen_hashable_and_validated():
    assert DEFAULT_POLICY == Policy(rounding=Rounding.NEAREST_EVEN, overflow=Overflow.SATURATE)
    assert hash(Policy()) == hash(DEFAULT_POLICY)
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT_POLICY.rounding = Rounding.UP
    with pytest.raises(TypeError, match="Policy.rounding='nearest_even'"):
        Policy(rounding="nearest_even")
    with pytest.raises(TypeError, match="Policy.flush_inputs=1"):
        Policy(flush_inputs=1)
    with pytest.raises(TypeError):
        Policy(Rounding.UP)  # keyword-only
    assert (
        len({Policy(), Policy(rounding=Rounding.UP), Policy(signed_zero=SignedZero.POSITIVE)}) == 3
    )


def test_format_by_name_and_validation():
    assert format_by_name("e2m1") is E2M1 and format_by_name("UE8M0") is UE8M0
    with pytest.raises(ValueError, match="format='fp4'.*allowed"):
        format_by_name("fp4")
    with pytest.raises(ValueError, match="out of range"):
        FloatFormat(name="bad", ebits=9, mbits=0, bias=1, signed=False, nan=NanEncoding.NONE)
    with pytest.raises(ValueError, match="do not fit"):
        FloatFormat(name="bad", ebits=5, mbits=3, bias=15, signed=True, nan=NanEncoding.NONE)

"""Element-format specifications and conversion policies: what a format *is*, never how to encode.

A :class:`FloatFormat` is a frozen, hashable description of a small binary floating-point format
(sign/exponent/mantissa widths, bias, which bit patterns are NaN or Inf). Everything else a user
asks about a format (its largest finite value, its smallest subnormal, its epsilon) is derived
from those fields, so there is one source of truth per format.

The named formats are module constants, each tied to its ml_dtypes dtype where ml_dtypes has one:

========  =====  ====  ====  =========  ============  =========================================
name      bits   e     m     bias       specials      ml_dtypes
========  =====  ====  ====  =========  ============  =========================================
E2M1      4      2     1     1          none          float4_e2m1fn   (max 6)
E2M3      6      2     3     1          none          float6_e2m3fn   (max 7.5)
E3M2      6      3     2     3          none          float6_e3m2fn   (max 28)
E4M3      8      4     3     7          NaN S.1111.111 float8_e4m3fn  (max 448)
E5M2      8      5     2     15         IEEE Inf/NaN  float8_e5m2     (max 57344)
UE8M0     8      8     0     127        NaN 0xFF      float8_e8m0fnu  (2^-127 .. 2^127, no zero)
UE4M3     8(7)   4     3     7          NaN 0x7F      float8_e4m3fn   (sign bit must be 0)
UE5M3     8      5     3     15         NaN 0xFF      none            (max 114688; fp4sim's choice)
========  =====  ====  ====  =========  ============  =========================================

UE5M3 is the unsigned E5M3 scale format that the HW-FP4 paper suggests for future FP4 training;
no library defines it, so fp4sim fixes: IEEE-style subnormals, no Inf, only 0xFF is NaN.

Conversion policies (:class:`Rounding`, :class:`Overflow`, :class:`NanPolicy`,
:class:`SignedZero`, :class:`Policy`) are enums and a frozen config; the default policy is
round-to-nearest-even with saturation to the finite maximum, which is what PTX
``cvt.rn.satfinite`` does.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any

import ml_dtypes
import numpy as np

__all__ = [
    "NanEncoding",
    "FloatFormat",
    "E2M1",
    "E2M3",
    "E3M2",
    "E4M3",
    "E5M2",
    "UE8M0",
    "UE4M3",
    "UE5M3",
    "ELEMENT_FORMATS",
    "SCALE_FORMATS",
    "ALL_FORMATS",
    "ML_DTYPE_FORMATS",
    "format_by_name",
    "Rounding",
    "Overflow",
    "NanPolicy",
    "SignedZero",
    "Policy",
    "DEFAULT_POLICY",
]


class NanEncoding(enum.Enum):
    """Which bit patterns of a format mean NaN (and whether Inf exists)."""

    NONE = "none"  # every pattern is a finite number (E2M1, E2M3, E3M2)
    ALL_ONES = (
        "all_ones"  # only exponent and mantissa all ones is NaN (E4M3 fn, UE8M0, UE4M3, UE5M3)
    )
    IEEE = "ieee"  # top exponent: mantissa 0 is Inf, others NaN (E5M2)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class FloatFormat:
    """A small binary floating-point format.

    ``signed`` formats have a sign bit above the exponent; unsigned ones (the scale formats)
    do not use one. ``ebits``/``mbits`` count exponent and mantissa bits, ``bias`` is the exponent
    bias. ``subnormals`` says whether exponent field 0 encodes subnormals (and zero): it is False
    only for UE8M0, where field 0 is the value 2^-127 and there is no zero.
    """

    name: str
    ebits: int
    mbits: int
    bias: int
    signed: bool
    nan: NanEncoding
    subnormals: bool = True
    dtype: Any = None  # the ml_dtypes scalar type, or None when ml_dtypes has no such format

    def __post_init__(self) -> None:
        if not (1 <= self.ebits <= 8 and 0 <= self.mbits <= 7):
            raise ValueError(f"{self.name}: ebits={self.ebits}, mbits={self.mbits} out of range")
        if self.nbits > 8:
            raise ValueError(f"{self.name}: {self.nbits} bits do not fit one uint8 code")

    # --- bit layout -------------------------------------------------------------------------
    @property
    def nbits(self) -> int:
        """Significant bits of a code (sign + exponent + mantissa)."""
        return int(self.signed) + self.ebits + self.mbits

    @property
    def num_codes(self) -> int:
        return 1 << self.nbits

    @property
    def sign_mask(self) -> int:
        return (1 << (self.ebits + self.mbits)) if self.signed else 0

    @property
    def magnitude_mask(self) -> int:
        return (1 << (self.ebits + self.mbits)) - 1

    # --- derived numbers ---------------------------------------------------------------------
    @property
    def emax(self) -> int:
        """Unbiased exponent of the largest finite binade."""
        top = (1 << self.ebits) - 1
        if self.nan is NanEncoding.IEEE or (self.nan is NanEncoding.ALL_ONES and self.mbits == 0):
            top -= 1  # the top exponent field holds only Inf/NaN (E5M2) or only NaN (UE8M0)
        return top - self.bias

    @property
    def emin(self) -> int:
        """Unbiased exponent of the smallest normal binade (UE8M0: of its smallest value)."""
        return (1 if self.subnormals else 0) - self.bias

    @property
    def max(self) -> float:
        """Largest finite value."""
        mant_top = (1 << self.mbits) - 1
        if self.nan is NanEncoding.ALL_ONES and self.mbits > 0:
            mant_top -= 1  # the all-ones pattern is NaN (UE8M0's NaN took its whole binade)
        return math.ldexp(1.0 + mant_top / (1 << self.mbits), self.emax)

    @property
    def min_normal(self) -> float:
        return math.ldexp(1.0, self.emin)

    @property
    def min_subnormal(self) -> float:
        """Smallest positive value (UE8M0: 2^-127, its smallest code)."""
        if not self.subnormals:
            return math.ldexp(1.0, self.emin)
        return math.ldexp(1.0, self.emin - self.mbits)

    @property
    def eps(self) -> float:
        """Distance from 1.0 to the next larger value."""
        return math.ldexp(1.0, -self.mbits)

    @property
    def has_inf(self) -> bool:
        return self.nan is NanEncoding.IEEE

    @property
    def has_nan(self) -> bool:
        return self.nan is not NanEncoding.NONE

    @property
    def has_zero(self) -> bool:
        return self.subnormals

    @property
    def np_dtype(self) -> np.dtype | None:
        return None if self.dtype is None else np.dtype(self.dtype)

    def __repr__(self) -> str:
        return self.name

    def __str__(self) -> str:
        return self.name


E2M1 = FloatFormat(
    name="E2M1",
    ebits=2,
    mbits=1,
    bias=1,
    signed=True,
    nan=NanEncoding.NONE,
    dtype=ml_dtypes.float4_e2m1fn,
)
E2M3 = FloatFormat(
    name="E2M3",
    ebits=2,
    mbits=3,
    bias=1,
    signed=True,
    nan=NanEncoding.NONE,
    dtype=ml_dtypes.float6_e2m3fn,
)
E3M2 = FloatFormat(
    name="E3M2",
    ebits=3,
    mbits=2,
    bias=3,
    signed=True,
    nan=NanEncoding.NONE,
    dtype=ml_dtypes.float6_e3m2fn,
)
E4M3 = FloatFormat(
    name="E4M3",
    ebits=4,
    mbits=3,
    bias=7,
    signed=True,
    nan=NanEncoding.ALL_ONES,
    dtype=ml_dtypes.float8_e4m3fn,
)
E5M2 = FloatFormat(
    name="E5M2",
    ebits=5,
    mbits=2,
    bias=15,
    signed=True,
    nan=NanEncoding.IEEE,
    dtype=ml_dtypes.float8_e5m2,
)
UE8M0 = FloatFormat(
    name="UE8M0",
    ebits=8,
    mbits=0,
    bias=127,
    signed=False,
    nan=NanEncoding.ALL_ONES,
    subnormals=False,
    dtype=ml_dtypes.float8_e8m0fnu,
)
UE4M3 = FloatFormat(
    name="UE4M3",
    ebits=4,
    mbits=3,
    bias=7,
    signed=False,
    nan=NanEncoding.ALL_ONES,
    dtype=ml_dtypes.float8_e4m3fn,
)
UE5M3 = FloatFormat(
    name="UE5M3", ebits=5, mbits=3, bias=15, signed=False, nan=NanEncoding.ALL_ONES, dtype=None
)

ELEMENT_FORMATS = (E2M1, E2M3, E3M2, E4M3, E5M2)
SCALE_FORMATS = (UE8M0, UE4M3, UE5M3)
ALL_FORMATS = ELEMENT_FORMATS + SCALE_FORMATS
ML_DTYPE_FORMATS: dict[str, FloatFormat] = {
    np.dtype(f.dtype).name: f for f in (*ELEMENT_FORMATS, UE8M0)
}
"""The format whose codes each ml_dtypes dtype stores, one per byte, by dtype name (UE4M3
shares E4M3's ``float8_e4m3fn`` and is reached from E4M3 one way only)."""


def format_by_name(name: str) -> FloatFormat:
    """The format constant called ``name`` (case-insensitive), for CLIs and file manifests."""
    for f in ALL_FORMATS:
        if f.name.lower() == str(name).lower():
            return f
    raise ValueError(f"format={name!r} is unknown; allowed: {[f.name for f in ALL_FORMATS]}")


class Rounding(enum.Enum):
    """How a value between two representable neighbours is resolved."""

    NEAREST_EVEN = "nearest_even"  # ties to the even code (PTX cvt.rn, ml_dtypes, IEEE default)
    NEAREST_AWAY = "nearest_away"  # ties away from zero (microxcaling's default "nearest")
    TOWARD_ZERO = "toward_zero"  # truncate the magnitude (cvt.rz)
    UP = "up"  # toward +inf (cvt.rp)
    DOWN = "down"  # toward -inf (cvt.rm)
    STOCHASTIC = "stochastic"  # round up with probability equal to the fraction; needs random bits


class Overflow(enum.Enum):
    """What a finite value beyond the representable range becomes."""

    SATURATE = "saturate"  # clamp to +-max (cvt .satfinite)
    NAN = "nan"  # the format's NaN (ml_dtypes cast semantics for E4M3)
    INF = "inf"  # +-Inf; only for formats that have Inf (E5M2)


class NanPolicy(enum.Enum):
    """What a NaN input becomes."""

    PROPAGATE = (
        "propagate"  # the format's NaN; formats without NaN: ValueError on NumPy, +max under jax
    )
    ZERO = "zero"  # +0 (TransformerEngine's E2M1 reference)
    MAX = "max"  # +max (what satfinite conversions of NaN to E2M1 give on some hardware)
    RAISE = "raise"  # ValueError when a NaN is present (NumPy only; under jit it is PROPAGATE)


class SignedZero(enum.Enum):
    """Whether -0 (and values rounding to zero from below) keep their sign."""

    KEEP = "keep"  # -0 encodes as the negative zero code (ml_dtypes, PTX)
    POSITIVE = "positive"  # every zero encodes as +0 (TransformerEngine's E2M1 reference)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Policy:
    """A complete conversion policy: a frozen, hashable value usable as a static jit argument.

    ``flush_inputs``: inputs below the float32 normal range (|x| < 2^-126) are treated as zero
    before conversion (what ``.ftz`` instructions do). ``flush_outputs``: results that would be
    subnormal in the *target* format (after rounding) become zero of the same sign.
    The exact semantics of every field are in :mod:`fp4sim.formats.codec`.
    """

    rounding: Rounding = Rounding.NEAREST_EVEN
    overflow: Overflow = Overflow.SATURATE
    nan: NanPolicy = NanPolicy.PROPAGATE
    signed_zero: SignedZero = SignedZero.KEEP
    flush_inputs: bool = False
    flush_outputs: bool = False

    def __post_init__(self) -> None:
        for field, kind in (
            ("rounding", Rounding),
            ("overflow", Overflow),
            ("nan", NanPolicy),
            ("signed_zero", SignedZero),
        ):
            value = getattr(self, field)
            if not isinstance(value, kind):
                raise TypeError(
                    f"Policy.{field}={value!r} must be a {kind.__name__} member; "
                    f"allowed: {[m.name for m in kind]}"
                )
        for field in ("flush_inputs", "flush_outputs"):
            if not isinstance(getattr(self, field), bool):
                raise TypeError(f"Policy.{field}={getattr(self, field)!r} must be a bool")


DEFAULT_POLICY = Policy()

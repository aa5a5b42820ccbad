"""Bit-exact element codecs: ``encode`` floats to format codes and ``decode`` codes to float32.

This module owns the conversion between real numbers and the codes of the formats in
:mod:`fp4sim.formats.spec`, under every :class:`~fp4sim.formats.spec.Policy`. It is written once
against the array namespace (:mod:`fp4sim._xp`): NumPy arrays give NumPy results, jax arrays
(also under ``jax.jit``/``vmap``) give jax results with the same bits. All rounding is done on
the integer bit pattern of the input, so XLA's flush-to-zero of float32 subnormals on CPU cannot
change a result.

How a value is encoded (magnitude first, sign last):

1. The input's bits are read as an unsigned integer (float32 → uint32; bfloat16 and float16 are
   widened exactly to float32 bits with integer operations; float64 → uint64, exact, no double
   rounding). Integer and other dtypes are rejected (``TypeError`` naming ``values``).
2. With ``policy.flush_inputs``, inputs below the float32 normal range (``|x| < 2^-126``, for
   every input dtype; float16 subnormals are float32 normals and stay; with ``exp_shift``, the
   shifted value is compared) become zero of the same sign.
3. The magnitude is split into the code just below it (``base``) and the discarded fraction
   ``f`` in [0, 1) of one step of the format's grid at that place (subnormal steps included). The
   fraction is kept as ``floor(f · 2^W)`` for the source word width W (exact for every float32
   input whose step is at most 2^32 source ulps, i.e. every case that can be a tie). With
   ``exp_shift=k`` the value split is the exact ``x · 2^k``: ``k`` is added to the exponent
   (source subnormals normalized first), so a power-of-two block scale costs no separate
   scaling pass and no intermediate rounding; all later steps see the shifted value.
   (Implementation: the nearest and directed modes add their rounding increment below the kept
   bits of ``target exponent << MS | mantissa`` and shift once; the carry runs into the exponent.)
4. :class:`Rounding` decides whether to add one to ``base``:
   ``NEAREST_EVEN`` f > 1/2, or f = 1/2 and ``base`` odd; ``NEAREST_AWAY`` f ≥ 1/2;
   ``TOWARD_ZERO`` never; ``UP``/``DOWN`` when f > 0 and the sign points that way;
   ``STOCHASTIC`` iff ``floor(f · 2^32) > random_bits`` (uint32 per element), so the probability
   of rounding up is ``floor(f · 2^32) / 2^32``: exact for every float32 input whose step is at
   most 2^32 float32 ulps, and at most 2^-32 below f otherwise.
   Adding one to a code is always the next larger value (carries go into the exponent field).
5. Overflow: the rounded code (on the grid continued beyond the maximum with the top binade's
   spacing) is larger than the largest finite code, or the input is ±Inf. :class:`Overflow`
   then gives ±max (``SATURATE``), the format's NaN (``NAN``; formats with a NaN only) or ±Inf
   (``INF``; E5M2 only). A policy the format cannot honour raises ``ValueError`` naming
   ``policy``. Note that directed rounding decides overflow the same way (an E5M2 input of 70000
   under ``TOWARD_ZERO`` with ``INF`` gives Inf, because the grid value it truncates to lies
   above the maximum).
6. ``policy.flush_outputs``: a rounded result that is subnormal in the target format becomes
   zero of the same sign.
7. NaN inputs follow :class:`NanPolicy`: ``PROPAGATE`` gives the format's NaN with the input's
   sign (E4M3 ``S.1111.111``, E5M2 the quiet ``S.11111.10``, scale formats their all-ones code).
   For formats without NaN (E2M1, E2M3, E3M2) ``PROPAGATE`` gives +max on every backend (what
   PTX ``cvt.rn.satfinite`` does with NaN). ``ZERO`` gives +0, ``MAX`` gives +max. ``RAISE``
   raises ``ValueError`` naming ``values`` when ``values`` holds a NaN (or, for unsigned
   formats, a negative value): on NumPy at once; under jax through
   ``jax.experimental.checkify.check``, so the same message comes from ``err.throw()`` of a
   ``checkify.checkify``-wrapped function (a ``JaxRuntimeError``, a ``ValueError``), eagerly
   at once, and staging it under ``jax.jit`` without ``checkify`` is refused by JAX. Where it
   does not raise it acts as ``PROPAGATE``.
8. :class:`SignedZero`: ``KEEP`` keeps the sign of zero results (``-0.0`` and negative values that
   round to zero give the negative zero code); ``POSITIVE`` gives +0 for every zero.

Unsigned scale formats (UE8M0, UE4M3, UE5M3) carry no sign: ``-0.0`` encodes as ``+0``, and every
other negative input (including ``-Inf``) is *invalid* and handled exactly like a NaN input (so
with the default policy it gives the NaN code; under ``NanPolicy.RAISE`` NumPy raises).

UE8M0 has no zero: every input below 2^-127, zero included, encodes as 0x00 (= 2^-127) under
every rounding mode (what TransformerEngine, cuDNN and torch do for 0; ml_dtypes gives NaN).
Between 2^-127 and 2^-126 (float32 subnormals) it rounds like any other binade. Its ties
(1.5·2^e) go to the even code under ``NEAREST_EVEN`` (3 → 2) and up under ``NEAREST_AWAY``
(3 → 4); the ml_dtypes cast equals ``NEAREST_AWAY`` except that ml_dtypes sends
(2^-127, 1.5·2^-127) up to 2^-126 and 0 to NaN.

Where ml_dtypes casts coincide with a policy (checked by the tests): E2M1, E2M3, E3M2 with the
default policy on non-NaN inputs (ml_dtypes turns NaN into -0); E4M3 with
``Policy(overflow=Overflow.NAN)``; E5M2 with ``Policy(overflow=Overflow.INF)``; UE4M3 as
``float8_e4m3fn`` with ``Overflow.NAN`` on non-negative inputs; UE8M0 as ``float8_e8m0fnu`` with
``Policy(rounding=Rounding.NEAREST_AWAY, overflow=Overflow.NAN)`` on inputs >= 1.5·2^-127.

Decoding builds the float32 bit pattern from the code with integer operations (the UE8M0 code
0x00 is the float32 subnormal 2^-127, which survives as bits even where XLA flushes arithmetic).
NaN codes decode to a quiet NaN with the code's sign. Codes with bits set above the format's
width (e.g. 0x10 and up for E2M1) are not codes of the format: they decode to the canonical NaN
0x7FC00000 on every backend (no data-dependent error, so NumPy and ``jax.jit`` agree).
"""

from __future__ import annotations

import dataclasses
from types import ModuleType
from typing import Any

import ml_dtypes
import numpy as np

from fp4sim._checks import NARROW_FLOAT_DTYPES, as_float_array, check_static
from fp4sim._xp import (
    Array,
    adopt,
    bitcast,
    is_foreign,
    is_jax,
    like_caller,
    namespace,
    no_derivative,
)
from fp4sim.formats.spec import (
    DEFAULT_POLICY,
    ML_DTYPE_FORMATS,
    FloatFormat,
    NanEncoding,
    NanPolicy,
    Overflow,
    Policy,
    Rounding,
    SignedZero,
)

__all__ = [
    "encode",
    "decode",
    "all_codes",
    "value_table",
    "finite_codes",
    "max_code",
    "nan_code",
    "inf_code",
    "FormatInfo",
    "finfo",
    "check_policy",
    "widen_to_f32",
    "bf16_round",
    "bf16_values",
]


# --- source floating-point types ------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class _Source:
    """Bit layout of an IEEE binary input type (after widening float16/bfloat16 to float32)."""

    width: int
    ebits: int
    mbits: int
    uint: Any

    @property
    def bias(self) -> int:
        return (1 << (self.ebits - 1)) - 1


_NP_CHUNK = 1 << 20  # elements per NumPy pass of encode/decode (bounds the temporaries)
_F32 = _Source(32, 8, 23, np.uint32)
_F64 = _Source(64, 11, 52, np.uint64)
_ALLOWED_DTYPES = (
    "float32, float16, bfloat16, float64 or a float8/float6/float4 of ml_dtypes "
    f"({', '.join(NARROW_FLOAT_DTYPES)})"
)


# --- format facts as integer codes ----------------------------------------------------------
def _emask(fmt: FloatFormat) -> int:
    return (1 << fmt.ebits) - 1


def max_code(fmt: FloatFormat) -> int:
    """The code of +max (the largest finite value)."""
    _check_format(fmt)
    if fmt.nan is NanEncoding.NONE:
        return fmt.magnitude_mask
    if fmt.nan is NanEncoding.IEEE:
        return (_emask(fmt) << fmt.mbits) - 1
    return fmt.magnitude_mask - 1


def nan_code(fmt: FloatFormat) -> int | None:
    """The code encode gives for +NaN (None when the format has no NaN)."""
    _check_format(fmt)
    if fmt.nan is NanEncoding.NONE:
        return None
    if fmt.nan is NanEncoding.IEEE:
        return (_emask(fmt) << fmt.mbits) | (1 << (fmt.mbits - 1))  # quiet NaN: top mantissa bit
    return fmt.magnitude_mask


def inf_code(fmt: FloatFormat) -> int | None:
    """The code of +Inf (None when the format has no Inf)."""
    _check_format(fmt)
    return (_emask(fmt) << fmt.mbits) if fmt.has_inf else None


# --- finfo ----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class FormatInfo:
    """Machine facts about a format, like ``numpy.finfo`` (values as Python floats)."""

    name: str
    bits: int  # significant bits of a code (sign + exponent + mantissa)
    ebits: int
    mbits: int
    bias: int
    emax: int  # unbiased exponent of the largest finite binade
    emin: int  # unbiased exponent of the smallest normal binade (UE8M0: of its smallest value)
    max: float
    min_normal: float
    min_subnormal: float  # smallest positive value
    eps: float  # distance from 1 to the next larger value
    has_inf: bool
    has_nan: bool
    has_zero: bool
    signed: bool
    max_code: int
    nan_code: int | None
    inf_code: int | None


def finfo(fmt: FloatFormat) -> FormatInfo:
    """:class:`FormatInfo` of ``fmt``, derived from its spec fields."""
    _check_format(fmt)
    return FormatInfo(
        name=fmt.name,
        bits=fmt.nbits,
        ebits=fmt.ebits,
        mbits=fmt.mbits,
        bias=fmt.bias,
        emax=fmt.emax,
        emin=fmt.emin,
        max=fmt.max,
        min_normal=fmt.min_normal,
        min_subnormal=fmt.min_subnormal,
        eps=fmt.eps,
        has_inf=fmt.has_inf,
        has_nan=fmt.has_nan,
        has_zero=fmt.has_zero,
        signed=fmt.signed,
        max_code=max_code(fmt),
        nan_code=nan_code(fmt),
        inf_code=inf_code(fmt),
    )


# --- tables -------------------------------------------------------------------------------
def all_codes(fmt: FloatFormat) -> np.ndarray:
    """Every code of ``fmt`` (0 .. 2^bits - 1, NaN and Inf codes included), as uint8."""
    _check_format(fmt)
    return np.arange(fmt.num_codes, dtype=np.uint8)


def value_table(fmt: FloatFormat) -> np.ndarray:
    """``decode(all_codes(fmt), fmt)``: float32 value of every code (NaN/Inf where they are)."""
    return decode(all_codes(fmt), fmt)


def finite_codes(fmt: FloatFormat) -> np.ndarray:
    """The codes of ``fmt`` whose values are finite, as uint8 in code order."""
    codes = all_codes(fmt)
    return codes[np.isfinite(value_table(fmt))]


# --- validation -----------------------------------------------------------------------------
def _check_format(fmt: Any) -> None:
    check_static(
        "fmt", fmt, FloatFormat, "fp4sim.E2M1; fp4sim.format_by_name turns a name into one"
    )
    if not (fmt.min_subnormal >= 2.0**-149 and fmt.max < 2.0**128):
        raise ValueError(
            f"fmt={fmt!r}: its values must all be float32 values (2^-149 .. < 2^128) "
            f"for decode to return float32"
        )


def check_policy(fmt: FloatFormat, policy: Policy) -> None:
    """Raise ``ValueError`` naming ``policy`` when ``fmt`` cannot honour it (data-independent)."""
    _check_format(fmt)
    check_static("policy", policy, Policy, "fp4sim.Policy(rounding=fp4sim.Rounding.UP)")
    if policy.overflow is Overflow.INF and not fmt.has_inf:
        raise ValueError(
            f"policy.overflow={policy.overflow} is invalid for {fmt}: it has no Inf; "
            f"allowed: Overflow.SATURATE" + (", Overflow.NAN" if fmt.has_nan else "")
        )
    if policy.overflow is Overflow.NAN and not fmt.has_nan:
        raise ValueError(
            f"policy.overflow={policy.overflow} is invalid for {fmt}: it has no NaN; "
            f"allowed: Overflow.SATURATE"
        )


def _source_bits(xp: ModuleType, values: Array) -> tuple[Any, _Source]:
    """The input as unsigned-integer bits of float32 (or float64), widened exactly."""
    dtype = np.dtype(values.dtype)
    if dtype == np.float32:
        return bitcast(values, np.uint32), _F32
    if dtype == np.float64:
        return bitcast(values, np.uint64), _F64
    if dtype == np.dtype(ml_dtypes.bfloat16):
        return bitcast(values, np.uint16).astype(np.uint32) << 16, _F32
    if dtype == np.float16:
        h = bitcast(values, np.uint16).astype(np.uint32)
        sign = (h >> 15) << 31
        e = (h >> 10) & 0x1F
        m = h & 0x3FF
        p = _ilog2_small(xp, m, 10)  # leading-bit position of a subnormal's mantissa
        sub = ((p.astype(np.uint32) + 103) << 23) | (
            (m - (np.uint32(1) << p.astype(np.uint32))) << (23 - p).astype(np.uint32)
        )
        sub = xp.where(m == 0, np.uint32(0), sub)
        normal = ((e + 112) << 23) | (m << 13)
        special = np.uint32(0x7F800000) | (m << 13)
        mag = xp.where(e == 0, sub, xp.where(e == 0x1F, special, normal))
        return sign | mag, _F32
    if dtype.name in NARROW_FLOAT_DTYPES:  # the codes through their own decoder: exact
        if is_jax(values) and ml_dtypes.finfo(dtype).bits < 8:
            # jax stores float6/float4 as sub-byte types: no bitcast to uint8, and XLA:CPU
            # (jax 0.11-0.12) fails to compile their conversion to float32
            raise TypeError(
                f"values is a jax {dtype} array: jax's sub-byte floats cannot be read "
                f"exactly under XLA; pass the same values as a NumPy {dtype} array or as "
                f"float32, or their codes to decode"
            )
        fmt = ML_DTYPE_FORMATS[dtype.name]
        return bitcast(decode(bitcast(values, np.uint8), fmt), np.uint32), _F32
    raise TypeError(
        f"values has dtype {dtype}; allowed: {_ALLOWED_DTYPES} "
        f"(integer arrays are codes: use decode)"
    )


def widen_to_f32(values: Array) -> Array:
    """float32 ``values`` of a bfloat16, float16, float32 or ml_dtypes float8/float6/float4
    array, widened exactly (integer operations on the bit patterns: float16 subnormals become
    float32 normals, no FTZ; narrow floats through their format's decoder)."""
    xp = namespace(values)
    values = xp.asarray(values)
    if np.dtype(values.dtype) == np.float64:
        raise TypeError(
            "values has dtype float64; allowed: float32, bfloat16, float16 "
            "(widening is exact; round float64 to float32 yourself)"
        )
    return bitcast(_source_bits(xp, values)[0], np.float32)


def bf16_round(x: Array) -> Array:
    """uint16 bfloat16 bit patterns of float32 ``x``, rounded to nearest even (NaN stays a
    quiet NaN with its sign; Inf stays Inf)."""
    xp = namespace(x)
    b = bitcast(xp.asarray(as_float_array("x", x, xp), dtype=np.float32), np.uint32)
    rounded = (b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    nan = (b & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    out = xp.where(nan, (b >> np.uint32(16)) | np.uint32(0x40), rounded)
    return out.astype(np.uint16)


def bf16_values(codes: Array) -> Array:
    """float32 values of uint16 bfloat16 bit patterns (exact)."""
    xp = namespace(codes)
    return bitcast(xp.asarray(codes).astype(np.uint32) << np.uint32(16), np.float32)


def _ilog2_small(xp: ModuleType, m: Array, nbits: int) -> Array:
    """floor(log2(m)) for m < 2^nbits as int32 (0 for m == 0), by comparisons."""
    p = xp.zeros(m.shape, dtype=np.int32)
    for k in range(1, nbits):
        p = p + (m >= (1 << k)).astype(np.int32)
    return p


# --- encode ---------------------------------------------------------------------------------
def encode(
    values: Array,
    fmt: FloatFormat,
    policy: Policy = DEFAULT_POLICY,
    *,
    random_bits: Array = None,
    exp_shift: Array = None,
) -> Any:
    """Codes (uint8, same shape) of ``values`` in ``fmt`` under ``policy`` (see module doc).

    ``random_bits`` (uint32, same shape as ``values``) is required for ``Rounding.STOCHASTIC``
    and rejected otherwise. ``exp_shift`` (integers broadcastable to the shape of ``values``)
    encodes the exact ``values · 2^exp_shift`` instead, rounded once (no intermediate float32:
    what a power-of-two block scale needs); every step of the module doc, flushing included,
    applies to the shifted value. Works on NumPy arrays and on jax arrays under
    ``jax.jit``/``vmap`` (pass ``fmt`` and ``policy`` as static arguments or close over them).
    A PyTorch tensor (any float dtype, bfloat16 included, any device) or another ``__dlpack__``
    array is read through :func:`fp4sim._xp.adopt`; a tensor gets a uint8 tensor back on its
    device.
    """
    if is_foreign(values) or is_foreign(random_bits) or is_foreign(exp_shift):
        codes = _encode(
            adopt(values, "values"),
            fmt,
            policy,
            random_bits=adopt(random_bits, "random_bits"),
            exp_shift=adopt(exp_shift, "exp_shift"),
        )
        return like_caller(codes, values)
    return _encode(values, fmt, policy, random_bits=random_bits, exp_shift=exp_shift)


def _encode(
    values: Array,
    fmt: FloatFormat,
    policy: Policy = DEFAULT_POLICY,
    *,
    random_bits: Array = None,
    exp_shift: Array = None,
) -> Any:
    """Codes (uint8, same shape) of ``values`` in ``fmt`` under ``policy`` (see module doc).

    ``random_bits`` (uint32, same shape as ``values``) is required for ``Rounding.STOCHASTIC``
    and rejected otherwise. ``exp_shift`` (integers broadcastable to the shape of ``values``)
    encodes the exact ``values · 2^exp_shift`` instead, rounded once (no intermediate float32:
    what a power-of-two block scale needs); every step of the module doc, flushing included,
    applies to the shifted value. Works on NumPy arrays and on jax arrays under
    ``jax.jit``/``vmap`` (pass ``fmt`` and ``policy`` as static arguments or close over them).
    """
    check_policy(fmt, policy)
    xp = namespace(values, random_bits, exp_shift)
    if xp is not np and not is_jax(values):
        values = np.asarray(values)
        if values.dtype == np.float64 and xp.asarray(values).dtype != np.float64:
            raise TypeError(
                "values is a float64 NumPy array but random_bits or exp_shift is a "
                "jax array and jax_enable_x64 is off: converting would round twice; "
                "pass float32 values or NumPy arrays"
            )
    values = no_derivative(xp.asarray(as_float_array("values", values, xp)), "encode")
    if xp is np and values.ndim == 0:  # NumPy scalars warn where the integer steps below wrap
        one = lambda a: None if a is None else np.reshape(a, (1,))  # noqa: E731
        return encode(
            one(values), fmt, policy, random_bits=one(random_bits), exp_shift=one(exp_shift)
        ).reshape(())
    if policy.rounding is not Rounding.STOCHASTIC and random_bits is not None:
        raise ValueError(
            f"random_bits is only used by Rounding.STOCHASTIC, not by "
            f"policy.rounding={policy.rounding}; pass random_bits=None"
        )
    if (
        xp is np
        and values.size > _NP_CHUNK
        and (exp_shift is None or np.shape(exp_shift) == values.shape)
        and (random_bits is None or np.shape(random_bits) == values.shape)
    ):
        # NumPy, a large input: bounded passes (the integer steps need ~12 bytes per element)
        flat = lambda a: None if a is None else np.reshape(a, (-1,))  # noqa: E731
        v, rb, es = flat(values), flat(random_bits), flat(exp_shift)
        out = np.empty(v.shape, np.uint8)
        for i in range(0, v.size, _NP_CHUNK):
            sl = slice(i, i + _NP_CHUNK)
            out[sl] = encode(
                v[sl],
                fmt,
                policy,
                random_bits=None if rb is None else rb[sl],
                exp_shift=None if es is None else es[sl],
            )
        return out.reshape(values.shape)
    u, src = _source_bits(xp, values)

    if policy.rounding is Rounding.STOCHASTIC:
        if random_bits is None:
            raise TypeError(
                "random_bits is required for Rounding.STOCHASTIC: a uint32 array of "
                f"the shape of values {tuple(values.shape)}"
            )
        random_bits = xp.asarray(random_bits)
        if np.dtype(random_bits.dtype) != np.uint32:
            raise TypeError(f"random_bits has dtype {random_bits.dtype}; allowed: uint32")
        if tuple(random_bits.shape) != tuple(values.shape):
            raise ValueError(
                f"random_bits has shape {tuple(random_bits.shape)}; it must equal "
                f"the shape of values {tuple(values.shape)}"
            )
    elif random_bits is not None:
        raise ValueError(
            f"random_bits is only used by Rounding.STOCHASTIC, not by "
            f"policy.rounding={policy.rounding}; pass random_bits=None"
        )
    if exp_shift is not None:
        exp_shift = xp.asarray(exp_shift)
        if np.dtype(exp_shift.dtype).kind not in "iu":
            raise TypeError(f"exp_shift has dtype {exp_shift.dtype}; allowed: integers")
        try:
            if np.broadcast_shapes(tuple(exp_shift.shape), tuple(values.shape)) != tuple(
                values.shape
            ):
                raise ValueError
        except ValueError:
            raise ValueError(
                f"exp_shift has shape {tuple(exp_shift.shape)}; it must broadcast "
                f"to the shape of values {tuple(values.shape)}"
            ) from None

    W, MS, U = src.width, src.mbits, src.uint
    E, M = fmt.ebits, fmt.mbits
    sbit = (u >> (W - 1)).astype(np.int32)  # 1 for negative
    sign = sbit == 1
    mag_bits = u & ((1 << (W - 1)) - 1)
    exp_all = ((1 << src.ebits) - 1) << MS
    isnan = mag_bits > exp_all
    isinf = mag_bits == exp_all

    # Write |x| (times 2^exp_shift) as (te, mant): te is the biased exponent in the target, mant
    # the source mantissa bits. A format without subnormals (UE8M0) is handled as the subnormal
    # format one bias higher, whose normal codes are offset by one binade (everything below its
    # smallest value clamps).
    bias = fmt.bias if fmt.subnormals else fmt.bias + 1
    offset = 0 if fmt.subnormals else (1 << M)
    kk0 = bias - src.bias
    mmask = U((1 << MS) - 1)
    # Source subnormals need their own exponent when they may land in a target binade that is
    # normal (a target bias near the source's, or a positive shift). Otherwise they lie 2+ bits
    # below the target's smallest step and only their being nonzero matters.
    normalize = exp_shift is not None or kk0 > -(M + 2)
    if normalize:
        # A subnormal's bits are its integer significand fm; float(fm) is exact and normal on
        # every backend (no flush-to-zero involved), and its bits less (bias + MS - 1) binades
        # are the subnormal's normalized form: a negative exponent field (wrapping, read signed).
        sint, sflt = (np.int32, np.float32) if W == 32 else (np.int64, np.float64)
        nb = bitcast(mag_bits.astype(sint).astype(sflt), U) - U((src.bias + MS - 1) << MS)
        mag_n = xp.where(mag_bits <= mmask, nb, mag_bits)
        fe = (bitcast(mag_n, sint) >> MS).astype(np.int32)
        mant = mag_n & mmask
    else:
        fe = (mag_bits >> MS).astype(np.int32)
        mant = mag_bits & mmask
    top = ((max_code(fmt) + offset) >> M) + 1  # from this target exponent on, all overflow
    if exp_shift is None:
        kk = kk0
    else:
        # Beyond these bounds every finite nonzero value overflows / rounds and flushes like 0,
        # so clipping the shift changes no result and keeps the integers below in range.
        lo = -((2 << src.ebits) + W + 16)
        kk = xp.clip(exp_shift.astype(np.int32), lo, top + MS + 2 - kk0) + kk0
    te = te_in = fe + kk
    # Zeros: normalized, they carry a hidden bit at the smallest exponent, far below the grid
    # unless a shift lifts them near it; not normalized, they are the one input whose directed
    # rounding must not move away from zero.
    nonzero = mag_bits != 0
    kk_max = kk0 + (0 if exp_shift is None else top + MS + 2 - kk0)
    zero_guard = normalize and kk_max - (src.bias + MS - 1) > -(M + 2)

    if policy.rounding is Rounding.STOCHASTIC:
        # the discarded fraction f of one grid step as floor(f · 2^W), exact for any shift
        sig = mant | U(1 << MS)
        if not normalize:
            sig = xp.where(fe > 0, sig, mant)
            te = xp.maximum(te, 1 + kk0)
        dropped = (MS - M) + xp.maximum(1 - te, 0)
        sh = xp.minimum(dropped, MS + 1).astype(U)
        rem = sig & ((U(1) << sh) - U(1))
        lsh = (W - xp.minimum(dropped, W)).astype(U)
        rsh = xp.clip(dropped - W, 0, W - 1).astype(U)
        frac = xp.where(dropped <= W, rem << lsh, sig >> rsh)
        frac32 = frac if W == 32 else (frac >> (W - 32)).astype(np.uint32)
        up = frac32 > random_bits
        if normalize:
            up = up & nonzero
        mag = ((xp.maximum(te, 1) - 1) << M) + (sig >> sh).astype(np.int32) + up.astype(np.int32)
    else:
        # w = the significand with the target exponent above it: for te >= 1 its top bits are
        # already the code (te << M | mantissa); below, the hidden bit is kept and more bits are
        # dropped. Rounding adds below the kept bits and lets the carry run up (into the
        # exponent where the mantissa is all ones).
        if (1 << src.ebits) - 1 + kk_max > (1 << (W - MS)) - 2:
            te = xp.minimum(te, top)  # keep te << MS inside the word (UE8M0 from float32)
        sh = xp.clip((MS - M + 1) - te, MS - M, MS + 2).astype(U)
        w = (xp.maximum(te, 1).astype(U) << U(MS)) | mant
        r = policy.rounding
        if r is Rounding.NEAREST_EVEN:
            odd = (w >> sh) & U(1)  # parity of the code below: minus the offset (UE8M0: 1)
            half_m1 = U((1 << W) - 1) >> (U(W + 1) - sh)  # 2^(sh-1) - 1
            w = w + half_m1 + (odd ^ U(offset & 1) if offset & 1 else odd)
        elif r is Rounding.NEAREST_AWAY:
            w = w + (U(1) << (sh - U(1)))
        elif r in (Rounding.UP, Rounding.DOWN):
            away = (~sign if r is Rounding.UP else sign) & nonzero
            w = w + xp.where(away, (U(1) << sh) - U(1), U(0))
        mag = (w >> sh).astype(np.int32)
    mag = mag - offset

    if fmt.subnormals:
        if policy.flush_outputs:
            mag = xp.where(mag < (1 << M), 0, mag)
    else:
        mag = xp.maximum(mag, 0)
    if zero_guard:
        mag = xp.where(nonzero, mag, 0)
    if policy.flush_inputs:  # below the float32 normal range (after the shift), any input dtype
        flushed = (te_in < kk0 + src.bias - 126) & ~(isnan | isinf)
        mag = xp.where(flushed, 0, mag)
        mag_bits = xp.where(flushed, U(0), mag_bits)
    invalid = isnan
    if not fmt.signed:
        invalid = invalid | (sign & (mag_bits != 0))

    if policy.nan is NanPolicy.RAISE:
        msg = (
            f"values contains NaN{' or negative values' if not fmt.signed else ''} and "
            f"policy.nan={policy.nan}"
        )
        if is_jax(invalid):
            from jax.experimental import checkify

            checkify.check(~xp.any(invalid), msg)
        elif np.any(invalid):
            raise ValueError(msg)

    mx = max_code(fmt)
    overflow = (mag > mx) | isinf
    if policy.overflow is Overflow.SATURATE:
        ovf = mx
    elif policy.overflow is Overflow.NAN:
        ovf = fmt.magnitude_mask if fmt.nan is NanEncoding.ALL_ONES else nan_code(fmt)
    else:
        ovf = inf_code(fmt)
    mag = xp.where(overflow, ovf, mag)

    if policy.nan in (NanPolicy.PROPAGATE, NanPolicy.RAISE) and fmt.has_nan:
        nan_mag, nan_keeps_sign = nan_code(fmt), fmt.signed
    elif policy.nan is NanPolicy.ZERO:
        nan_mag, nan_keeps_sign = 0, False
    else:  # MAX, or PROPAGATE/RAISE for a format without NaN
        nan_mag, nan_keeps_sign = mx, False
    mag = xp.where(invalid, nan_mag, mag)
    if not fmt.signed:
        return mag.astype(np.uint8)
    keep = None if nan_keeps_sign else ~invalid
    if policy.signed_zero is SignedZero.POSITIVE:
        keep = (mag != 0) if keep is None else keep & (mag != 0)
    if keep is not None:
        sbit = xp.where(keep, sbit, 0)
    return ((sbit << (E + M)) | mag).astype(np.uint8)


# --- decode ---------------------------------------------------------------------------------
def decode(codes: Array, fmt: FloatFormat) -> Array:
    """float32 values (same shape) of the uint8 ``codes`` of ``fmt`` (see module doc).

    A PyTorch tensor or another ``__dlpack__`` array of codes is read through
    :func:`fp4sim._xp.adopt`; a tensor gets a float32 tensor back on its device."""
    if is_foreign(codes):
        return like_caller(decode(adopt(codes, "codes"), fmt), codes)
    _check_format(fmt)
    xp = namespace(codes)
    if isinstance(codes, (str, bytes)):
        raise TypeError(f"codes={codes!r} is a string; allowed: arrays of unsigned integers")
    if isinstance(codes, (list, tuple, int)):  # Python integers: codes if they fit a byte
        codes = np.asarray(codes)
        if codes.dtype.kind in "iu" and (
            codes.size == 0 or (codes.min() >= 0 and codes.max() <= 0xFF)
        ):
            codes = codes.astype(np.uint8)
    codes = xp.asarray(codes)
    if xp is np and not codes.dtype.isnative:
        codes = codes.astype(codes.dtype.newbyteorder("="))
    dtype = np.dtype(codes.dtype)
    if dtype.kind != "u":
        raise TypeError(f"codes has dtype {dtype}; allowed: unsigned integers (uint8 codes)")
    if xp is np and codes.size > _NP_CHUNK:  # bounded passes on NumPy
        flat = np.reshape(codes, (-1,))
        out = np.empty(flat.shape, np.float32)
        for i in range(0, flat.size, _NP_CHUNK):
            out[i : i + _NP_CHUNK] = decode(flat[i : i + _NP_CHUNK], fmt)
        return out.reshape(codes.shape)
    E, M, B = fmt.ebits, fmt.mbits, fmt.bias
    wide = codes.astype(np.uint32)
    c = wide & np.uint32(fmt.num_codes - 1)
    sign = ((c >> (E + M)) & 1) << 31 if fmt.signed else xp.zeros(c.shape, dtype=np.uint32)
    e = ((c >> M) & _emask(fmt)).astype(np.int32)
    m = c & ((1 << M) - 1)
    mant = m << (23 - M)

    fexp = e - B + 127  # float32 exponent field of a normal code
    normal = (xp.maximum(fexp, 1).astype(np.uint32) << 23) | mant
    if fmt.subnormals:
        # m * 2^(1-B-M) = (m / 2^p) * 2^(p+1-B-M) with p the leading-bit position of m
        p = _ilog2_small(xp, m, max(M, 1))
        sub = (((p + (128 - B - M)).astype(np.uint32)) << 23) | (
            (m - (np.uint32(1) << p.astype(np.uint32))) << (23 - p).astype(np.uint32)
        )
        sub = xp.where(m == 0, np.uint32(0), sub)
        bits = xp.where(e == 0, sub, normal)
    else:  # no subnormals (UE8M0): the bottom binade may be a float32 subnormal, e.g. 2^-127
        low = (np.uint32(1 << 23) | mant) >> xp.clip(1 - fexp, 0, 31).astype(np.uint32)
        bits = xp.where(fexp >= 1, normal, low)

    mag = c & fmt.magnitude_mask
    if fmt.nan is NanEncoding.ALL_ONES:
        bits = xp.where(mag == fmt.magnitude_mask, np.uint32(0x7FC00000), bits)
    elif fmt.nan is NanEncoding.IEEE:
        top = e == _emask(fmt)
        bits = xp.where(top & (m == 0), np.uint32(0x7F800000), bits)
        bits = xp.where(top & (m != 0), np.uint32(0x7FC00000), bits)
    bits = xp.where(wide >= np.uint32(fmt.num_codes), np.uint32(0x7FC00000), sign | bits)
    return bitcast(bits, np.float32)

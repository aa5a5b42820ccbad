"""Block (microscaled) quantization: block formats, scale rules, geometries and ``QuantizedArray``.

This module owns the step from float arrays to *block-scaled* codes and back: which elements
share a scale, how that scale is chosen and encoded, how elements are scaled before the element
codec (:mod:`fp4sim.formats.codec`) rounds them, and how ``dequantize`` applies the scales. It is
written once against the array namespace (:mod:`fp4sim._xp`): NumPy in, NumPy out; jax in (also
under ``jax.jit``/``vmap``/``lax.scan``), jax out, with the same bits.

Public names
============

``ScaleRule``
    How a block scale follows from the block's max-abs ``amax`` (``M`` = element max,
    ``e_M = floor(log2 M)``). Power-of-two exponents are clamped to UE8M0's [−127, 127].

    * ``RCEIL`` (default for power-of-two scales): the descale ``d = fl32(amax · fl32(1/M))``
      rounded *up* onto the scale grid. UE8M0: ``2^ceil(log2 d)`` by the TE/cuDNN/torchao bit
      rule (exponent + 1 iff a mantissa bit is set; an f32-subnormal ``d`` rounds up only above
      2^-127). UE4M3/UE5M3: the next scale value at or above ``d``.
    * ``FLOOR`` (OCP MX v1.0 specification, github.com/microsoft/microxcaling, torchao FLOOR): ``2^(floor(log2 amax) − e_M)``; block
      maxima above ``M·2^e`` are *clamped* to ``±M`` by the saturating element cast.
    * ``CEIL`` (torchao CEIL): ``2^(ceil(log2 amax) − e_M)``.
    * ``EVEN`` (torchao EVEN): round ``amax`` to the element's mantissa width (ties up), then
      ``FLOOR``.
    * ``NEAREST`` (default for UE4M3/UE5M3 scales, NVFP4): ``d`` to the nearest scale value,
      ties to even (satfinite).
    * ``AMPLITUDE`` (UE8M0 only; Direct-P's V operand, ``VFormat.MXFP4_TOKENS`` of
      :mod:`fp4sim.attention.recipe`): the scale is the block's amplitude ``β = 2^e`` itself,
      ``e = ceil(log2 amax)`` (bitwise: the exponent field − 127, plus 1 when a mantissa bit is
      set; clamped to [−127, 127], 2^-127 for a zero block), and the elements are
      ``RN_elem(fl(fl(x·2^-e)·M))`` — two float32 roundings, each flushed to +0 below 2^-126
      (:func:`fp4sim.formats.f32.ldexp_ftz`, :func:`~fp4sim.formats.f32.mul_ftz`) — so the
      represented value is ``β·q/M``: a scale rule with the non-power-of-two divisor
      ``M = elem.max`` (6 for E2M1; :attr:`BlockFormat.divisor`). Not OCP MX: ``CEIL`` scales
      by ``2^(e − e_M)``, a grid that differs by the factor ``M/2^e_M`` (1.5 for E2M1).
``Geometry``
    Which elements share one scale: ``BLOCK`` (``block_size`` consecutive elements along
    ``axis``; default), ``PER_ROW`` (the whole of ``axis``), ``PER_TENSOR`` (all),
    ``TOKEN_BLOCK`` (``block_size`` consecutive rows along ``axis`` — tokens, normally ``-2`` —
    times the *whole last axis*: FLAMIA's 32 tokens × head_dim), ``SQUARE`` (``block_size ×
    block_size`` tiles of the last two axes: FLAMIA's / cuDNN's 32×32 dS).
``GlobalScale``
    The optional FP32 second level (NVFP4): ``NONE``, ``PER_TENSOR`` (amax of the whole tensor;
    leaks across tokens under causal masking), ``PER_ROW`` (amax over ``axis`` per row: "per
    token" for Q/K blocked along head_dim), ``CONSTANT`` (given by the caller as
    ``global_scale=`` (decode factor) or ``global_encode_scale=`` (encode factor)).
``Arithmetic``
    The order of float32 operations a library uses (matters at exact ties and in special
    cases): ``TRANSFORMER_ENGINE`` (default), ``TORCHAO``, ``JAX``; see the class.
``NonFinite``
    The UE8M0 code of blocks holding Inf/NaN: ``SATFINITE`` (NaN → 0xFF, Inf → 0xFE; TE and
    fp4sim's default), ``NAN`` (both → 0xFF; torchao ≥ PR #4725), ``JAX`` (NaN wraps to
    0x00, Inf → 0xFF: JAX's ``cast_to_e8m0_with_rounding_up``), ``FORMULA`` (NaN → 0xFF, Inf →
    what the rule's formula gives for Inf's bits, at most 0xFE: torchao 0.18's 247 for E4M3
    FLOOR, 254 for RCEIL).
``BlockFormat``
    Frozen, hashable: ``name``, ``elem``, ``scale`` (``None`` = no block scale), ``block_size``,
    ``rule``, ``policy`` (the element :class:`~fp4sim.formats.spec.Policy`), ``global_scale``,
    ``arithmetic``, ``min_scale`` (lower clamp of the block scale value before it is encoded;
    torchao NVFP4: 2^-6), ``nonfinite``; ``.replace(**changes)``, ``.pow2``, ``.divisor``.
Constants
    ``MXFP4``, ``MXFP6_E2M3``, ``MXFP6_E3M2``, ``MXFP8_E4M3`` (= ``MXFP8``), ``MXFP8_E5M2`` (UE8M0
    per 32, ``RCEIL``); ``NVFP4`` (UE4M3 per 16, ``NEAREST``, per-tensor FP32 factor, TE order);
    ``NVFP4_SINGLE`` (no FP32 factor); ``FP8_E4M3_PER_TENSOR`` (no block scale, FP32 per-tensor
    factor); ``MXFP4_AMPLITUDE`` (E2M1, UE8M0 per 32, ``AMPLITUDE``: value ``β·q/6``).
``QuantizedArray``
    A registered jax pytree. Children: ``codes`` (uint8; one code per byte, or packed along the
    last axis when ``packed``), ``scales`` (uint8 scale codes, ``shape[d] // extent[d]`` per
    axis, or ``None``), ``global_scale`` (float32 decode factor broadcastable to the scales, or
    ``None``). Static: ``format``, ``geometry``, ``axis`` (negative), ``packed``. Invariants
    (dtypes, shapes, block divisibility) are checked on construction; codes beyond a format's
    width are values, not errors (they dequantize to NaN on every backend, as in ``decode``).
``quantize(x, fmt, *, axis=-1, geometry=Geometry.BLOCK, rule=None, global_scale=None,
global_encode_scale=None, pack=False) -> QuantizedArray``; ``dequantize(q) -> float32``
``block_extents(shape, fmt, geometry, axis)``
    Per axis, how many consecutive elements share a scale.
``scale_exponents(q) -> int32``
    The power of two of every UE8M0 scale (code − 127; the NaN code 0xFF gives 128), for
    kernels that apply scales by exponent arithmetic.
``expand_scales(values, q)``
    Broadcast a per-block array to the element shape.
``global_decode_scale(amax, fmt)``, ``global_encode_scale(amax, fmt)``
    The NVFP4 FP32 factors (torchao/JAX decode form ``amax/2688``; TE encode form).
``round_trip(x, fmt, ...)``
    ``dequantize(quantize(x, fmt, ...))`` for a ``BlockFormat``, ``decode(encode(x, fmt,
    policy))`` for a ``FloatFormat``, as float32, whose derivative under ``jax.grad`` / ``jax.jvp``
    is the straight-through estimator (the identity with respect to ``x``; the fake-quantization
    convention of torchao and TransformerEngine). Differentiating ``quantize`` or ``encode``
    themselves raises :class:`fp4sim._xp.NoDerivativeError` (their outputs are integer codes).
``ldexp_f32``, ``mul_f32``, ``div_f32``
    The exact, FTZ-proof float32 steps of :mod:`fp4sim.formats.f32` (re-exported here).

Exactness and platforms
=======================
Block amax is a max over the *integer* bit patterns of ``|x|`` (exact, NaN-aware, immune to XLA
CPU's flush-to-zero). Power-of-two scales are applied by integer exponent arithmetic:
``dequantize`` with a correctly rounded (RNE) result even in the float32 subnormal range
(``ldexp_f32``); ``quantize`` hands each block's exponent to the element encoder
(``codec.encode(..., exp_shift=-e)``), which rounds the exact ``x·2^-e`` once, straight from the
bits of ``x`` (no scaled float32 intermediate).
The float32 multiplies of the UE4M3 (NVFP4) path go through ``mul_f32``: the significands are
multiplied natively in [1, 4) and the exponent is applied with integers, which equals IEEE float32
arithmetic whenever the result is normal, on every platform, FTZ or not (a product below 2^-126
may be rounded twice: the one documented deviation from IEEE; NumPy and jax still agree bit for
bit). Its divisions go through ``div_f32``, an IEEE division whose significand quotient is a
float32 reciprocal estimate made exact by integer remainder corrections (no float division, no
integer division), exact on every backend.
Dequantization of NVFP4 (``code · s_e4m3 · g``) is correctly rounded with integer arithmetic.

Partial trailing blocks are rejected (``ValueError`` naming ``x``); pad the input yourself.
Inputs: float32; bfloat16 and float16 are widened exactly; float64 (also Python lists and
scalars) is rounded to float32 first by NumPy's cast (one rounding before quantization: for
the exact encoding of float64 values use :func:`fp4sim.formats.codec.encode`); objects exposing
``__array__`` or ``__dlpack__`` are read as NumPy arrays; big-endian arrays are byte-swapped.
The behaviour on special values of every public function: ``docs/input_policy.md``.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from types import ModuleType
from typing import Any

import ml_dtypes
import numpy as np

from fp4sim._checks import (
    NARROW_FLOAT_DTYPES,
    as_f32,
    as_float_array,
    check_bool,
    check_static,
)
from fp4sim._xp import (
    Array,
    NoDerivativeError,
    adopt,
    bitcast,
    is_jax,
    is_traced,
    materialize,
    namespace,
    no_derivative,
    straight_through,
)
from fp4sim.formats import codec
from fp4sim.formats.f32 import (
    bitlen,
    compose,
    div_f32,
    f32_bits,
    ldexp_f32,
    ldexp_ftz,
    mul_f32,
    mul_ftz,
    split,
)
from fp4sim.formats.spec import (
    DEFAULT_POLICY,
    E2M1,
    E2M3,
    E3M2,
    E4M3,
    E5M2,
    UE4M3,
    UE8M0,
    FloatFormat,
    NanPolicy,
    Policy,
    Rounding,
)

__all__ = [
    "ScaleRule",
    "Geometry",
    "GlobalScale",
    "Arithmetic",
    "NonFinite",
    "BlockFormat",
    "MXFP4",
    "MXFP6_E2M3",
    "MXFP6_E3M2",
    "MXFP8_E4M3",
    "MXFP8_E5M2",
    "MXFP8",
    "NVFP4",
    "NVFP4_SINGLE",
    "FP8_E4M3_PER_TENSOR",
    "MXFP4_AMPLITUDE",
    "BLOCK_FORMATS",
    "QuantizedArray",
    "quantize",
    "quantize_with_block_amax",
    "round_trip",
    "NoDerivativeError",
    "dequantize",
    "block_extents",
    "scale_exponents",
    "expand_scales",
    "global_decode_scale",
    "global_encode_scale",
    "ldexp_f32",
    "mul_f32",
    "div_f32",
    "element_policy",
    "tensor_amax_bits",
]


# --- enums ----------------------------------------------------------------------------------
class ScaleRule(enum.Enum):
    """How the block scale follows from the block max-abs (see the module docstring)."""

    RCEIL = "rceil"
    FLOOR = "floor"
    CEIL = "ceil"
    EVEN = "even"
    NEAREST = "nearest"
    AMPLITUDE = "amplitude"


_POW2_RULES = (
    ScaleRule.RCEIL,
    ScaleRule.FLOOR,
    ScaleRule.CEIL,
    ScaleRule.EVEN,
    ScaleRule.AMPLITUDE,
)


class Geometry(enum.Enum):
    """Which elements share one scale."""

    BLOCK = "block"
    PER_ROW = "per_row"
    PER_TENSOR = "per_tensor"
    TOKEN_BLOCK = "token_block"
    SQUARE = "square"


class GlobalScale(enum.Enum):
    """The optional FP32 per-tensor / per-row second scale level."""

    NONE = "none"
    PER_TENSOR = "per_tensor"
    PER_ROW = "per_row"
    CONSTANT = "constant"


class Arithmetic(enum.Enum):
    """Order of float32 operations (what each library computes, step by step).

    ``M`` element max, ``S`` scale max (448 for UE4M3), ``g`` the global decode factor,
    ``amax_b`` the block max-abs, ``s`` the decoded block scale.

    * ``TRANSFORMER_ENGINE``: MX descale ``amax·fl(1/M)``. NVFP4 ``S_enc = (M·S)/amax_t``
      (0 → 1, Inf → float32 max), ``g = 1/S_enc``; block ``s = E4M3(amax_b · (S_enc · fl(1/M)))``;
      elements ``x · fl(1/(s·g))`` (0 when ``s = 0``).
    * ``TORCHAO``: MX as TE, except that blocks with scale code 0 (2^-127) scale their elements by
      2^0 under RCEIL and by 2^126 under the other rules (torchao's reciprocal / ``F32_MIN_NORMAL``
      clamp). NVFP4 ``g = amax_t/(M·S)``; ``s = E4M3(clamp((amax_b/M)/g, min_scale, S))``;
      elements ``x · ((1/g)/s)``; dequantized as ``code · fl(g·s)``. Without a global factor
      ``g = 1``.
    * ``JAX``: MX descale ``amax/M`` (a true division). NVFP4 ``x' = x/g``;
      ``s = E4M3(clip(amax(x')/M, 0, S))``; elements ``x'/s`` (0/0 gives NaN, as in JAX).
    """

    TRANSFORMER_ENGINE = "transformer_engine"
    TORCHAO = "torchao"
    JAX = "jax"


class NonFinite(enum.Enum):
    """UE8M0 scale code of a block holding NaN or Inf."""

    SATFINITE = "satfinite"  # NaN -> 0xFF, Inf -> 0xFE
    NAN = "nan"  # NaN and Inf -> 0xFF
    JAX = "jax"  # NaN -> 0x00 (uint8 wrap), Inf -> 0xFF
    FORMULA = "formula"  # NaN -> 0xFF; Inf -> the rule's formula on Inf's bits (torchao 0.18)


# --- BlockFormat ----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class BlockFormat:
    """A complete block-scaled representation: storage *and* the rules that produce it.

    Hashable, so usable as a static ``jax.jit`` argument. ``scale=None`` means no per-block scale
    (element cast with only the optional FP32 global factor).
    """

    name: str
    elem: FloatFormat
    scale: FloatFormat | None
    block_size: int = 32
    rule: ScaleRule = ScaleRule.RCEIL
    policy: Policy = DEFAULT_POLICY
    global_scale: GlobalScale = GlobalScale.NONE
    arithmetic: Arithmetic = Arithmetic.TRANSFORMER_ENGINE
    min_scale: float = 0.0
    nonfinite: NonFinite = NonFinite.SATFINITE

    def __post_init__(self) -> None:
        if not isinstance(self.elem, FloatFormat) or not self.elem.signed:
            raise TypeError(
                f"BlockFormat.elem={self.elem!r} must be a signed FloatFormat "
                f"(E2M1, E2M3, E3M2, E4M3, E5M2)"
            )
        if self.scale is not None and (
            not isinstance(self.scale, FloatFormat) or self.scale.signed
        ):
            raise TypeError(
                f"BlockFormat.scale={self.scale!r} must be an unsigned scale format "
                f"(UE8M0, UE4M3, UE5M3) or None"
            )
        if (
            not isinstance(self.block_size, int)
            or isinstance(self.block_size, bool)
            or self.block_size < 1
        ):
            raise ValueError(f"BlockFormat.block_size={self.block_size!r} must be a positive int")
        for field, kind in (
            ("rule", ScaleRule),
            ("policy", Policy),
            ("global_scale", GlobalScale),
            ("arithmetic", Arithmetic),
            ("nonfinite", NonFinite),
        ):
            if not isinstance(getattr(self, field), kind):
                raise TypeError(
                    f"BlockFormat.{field}={getattr(self, field)!r} must be a {kind.__name__}"
                )
        if self.scale is UE8M0 and self.rule is ScaleRule.NEAREST:
            raise ValueError(
                f"BlockFormat.rule={self.rule} is not defined for UE8M0 scales; "
                f"allowed: {[r.name for r in _POW2_RULES]}"
            )
        if (
            self.scale is not None
            and self.scale is not UE8M0
            and self.rule not in (ScaleRule.NEAREST, ScaleRule.RCEIL)
        ):
            raise ValueError(
                f"BlockFormat.rule={self.rule} needs power-of-two (UE8M0) scales; "
                f"allowed for {self.scale}: NEAREST, RCEIL"
            )
        if not (isinstance(self.min_scale, float) and self.min_scale >= 0.0):
            raise ValueError(f"BlockFormat.min_scale={self.min_scale!r} must be a float >= 0")
        if self.rule is ScaleRule.AMPLITUDE and self.scale is not UE8M0:
            raise ValueError(
                f"BlockFormat {self.name!r}: rule=AMPLITUDE needs UE8M0 (power-of-two) "
                f"block scales; got scale={self.scale}"
            )
        if self.rule is ScaleRule.AMPLITUDE and (
            self.global_scale is not GlobalScale.NONE
            or self.arithmetic is not Arithmetic.TRANSFORMER_ENGINE
            or self.min_scale
        ):
            raise ValueError(
                f"BlockFormat {self.name!r}: rule=AMPLITUDE (value β·q/M) is defined "
                f"without an FP32 factor, min_scale or other arithmetic; allowed: "
                f"global_scale=NONE, arithmetic=TRANSFORMER_ENGINE, min_scale=0.0 "
                f"(got {self.global_scale.name}, {self.arithmetic.name}, "
                f"{self.min_scale})"
            )
        codec.check_policy(self.elem, element_policy(self))

    @property
    def pow2(self) -> bool:
        """True when block scales are powers of two (UE8M0)."""
        return self.scale is UE8M0

    @property
    def divisor(self) -> float:
        """The constant every value is divided by: ``elem.max`` under ``ScaleRule.AMPLITUDE``
        (value ``2^e·q/M``), else 1.0 (value ``code·scale·global``)."""
        return float(self.elem.max) if self.rule is ScaleRule.AMPLITUDE else 1.0

    def replace(self, **changes: Any) -> BlockFormat:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def __repr__(self) -> str:
        return self.name


def element_policy(fmt: BlockFormat) -> Policy:
    """The policy ``quantize`` encodes ``fmt``'s elements with: ``fmt.policy``, except that an
    element format without NaN cannot PROPAGATE (or RAISE): in a block the NaN is carried by the
    scale, so the element code of a NaN input is +0 (what TransformerEngine's reference gives)."""
    check_static("fmt", fmt, BlockFormat, "fp4sim.MXFP4")
    if not fmt.elem.has_nan and fmt.policy.nan in (NanPolicy.PROPAGATE, NanPolicy.RAISE):
        return dataclasses.replace(fmt.policy, nan=NanPolicy.ZERO)
    return fmt.policy


MXFP4 = BlockFormat(name="MXFP4", elem=E2M1, scale=UE8M0, block_size=32)
MXFP6_E2M3 = BlockFormat(name="MXFP6_E2M3", elem=E2M3, scale=UE8M0, block_size=32)
MXFP6_E3M2 = BlockFormat(name="MXFP6_E3M2", elem=E3M2, scale=UE8M0, block_size=32)
MXFP8_E4M3 = BlockFormat(name="MXFP8_E4M3", elem=E4M3, scale=UE8M0, block_size=32)
MXFP8_E5M2 = BlockFormat(name="MXFP8_E5M2", elem=E5M2, scale=UE8M0, block_size=32)
MXFP8 = MXFP8_E4M3
NVFP4 = BlockFormat(
    name="NVFP4",
    elem=E2M1,
    scale=UE4M3,
    block_size=16,
    rule=ScaleRule.NEAREST,
    global_scale=GlobalScale.PER_TENSOR,
)
NVFP4_SINGLE = BlockFormat(
    name="NVFP4_SINGLE", elem=E2M1, scale=UE4M3, block_size=16, rule=ScaleRule.NEAREST
)
FP8_E4M3_PER_TENSOR = BlockFormat(
    name="FP8_E4M3_PER_TENSOR",
    elem=E4M3,
    scale=None,
    block_size=1,
    global_scale=GlobalScale.PER_TENSOR,
)
MXFP4_AMPLITUDE = BlockFormat(
    name="MXFP4_AMPLITUDE", elem=E2M1, scale=UE8M0, block_size=32, rule=ScaleRule.AMPLITUDE
)
"""Direct-P's V operand (:class:`ScaleRule` ``AMPLITUDE``): per 32 elements
``β = 2^ceil(log2 amax)``, payload ``RN_E2M1(fl(6·fl(x/β)))`` (flushed), value ``β·q/6``."""
BLOCK_FORMATS = (
    MXFP4,
    MXFP6_E2M3,
    MXFP6_E3M2,
    MXFP8_E4M3,
    MXFP8_E5M2,
    NVFP4,
    NVFP4_SINGLE,
    FP8_E4M3_PER_TENSOR,
    MXFP4_AMPLITUDE,
)


_U = np.uint32


# --- geometry ---------------------------------------------------------------------------------
def _norm_axis(axis: Any, ndim: int, name: str = "axis") -> int:
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise TypeError(f"{name}={axis!r} must be an int")
    if not -ndim <= axis < ndim:
        raise ValueError(
            f"{name}={axis} is out of range for an array with {ndim} dimensions "
            f"(allowed: {-ndim}..{ndim - 1})"
        )
    return int(axis) % ndim - ndim


def block_extents(
    shape: tuple[int, ...], fmt: BlockFormat, geometry: Geometry = Geometry.BLOCK, axis: int = -1
) -> tuple[int, ...]:
    """Per axis of ``shape``, how many consecutive elements share one scale.

    Raises ``ValueError`` naming ``x`` when an axis does not divide into whole blocks.
    """
    check_static("fmt", fmt, BlockFormat, "fp4sim.MXFP8")
    if not isinstance(shape, (tuple, list)) or not all(
        isinstance(n, (int, np.integer)) and not isinstance(n, bool) for n in shape
    ):
        raise TypeError(f"shape={shape!r} must be a tuple of ints")
    if not isinstance(geometry, Geometry):
        raise TypeError(
            f"geometry={geometry!r} must be a Geometry; allowed: {[g.name for g in Geometry]}"
        )
    nd = len(shape)
    if nd == 0:
        raise ValueError("x must have at least one dimension")
    ext = [1] * nd
    bs = fmt.block_size
    if geometry is Geometry.PER_TENSOR:
        ext = list(shape)
    elif geometry is Geometry.BLOCK:
        ext[_norm_axis(axis, nd)] = bs
    elif geometry is Geometry.PER_ROW:
        a = _norm_axis(axis, nd)
        ext[a] = shape[a]
    elif geometry is Geometry.TOKEN_BLOCK:
        a = _norm_axis(axis, nd)
        if nd < 2 or a == -1:
            raise ValueError(
                f"axis={axis} for TOKEN_BLOCK must be a token axis other than the "
                f"last (head_dim) axis of a >=2-d array (shape {shape})"
            )
        ext[a] = bs
        ext[-1] = shape[-1]
    elif geometry is Geometry.SQUARE:
        if nd < 2:
            raise ValueError(f"SQUARE blocks need a >=2-d array; got shape {shape}")
        ext[-1] = ext[-2] = bs
    for d, (n, b) in enumerate(zip(shape, ext)):
        if b == 0 or n % b:
            raise ValueError(
                f"x has shape {shape}: axis {d - nd} of length {n} is not a multiple "
                f"of the {geometry.name} block extent {b} of {fmt.name}; pad x first"
            )
    return tuple(ext)


def _blocked_shape(shape: tuple[int, ...], ext: tuple[int, ...]) -> tuple[int, ...]:
    out: list[int] = []
    for n, b in zip(shape, ext):
        out += [n // b, b]
    return tuple(out)


def _block_reduce_axes(nd: int) -> tuple[int, ...]:
    return tuple(2 * d + 1 for d in range(nd))


def expand_scales(values: Array, q: QuantizedArray) -> Array:
    """Broadcast an array shaped like ``q.scales`` (one value per block) to the element shape."""
    check_static("q", q, QuantizedArray, "fp4sim.quantize(x, fp4sim.MXFP8)")
    xp = namespace(values)
    values = xp.asarray(values)
    if np.dtype(values.dtype).kind not in "fiub" and np.dtype(values.dtype).name != "bfloat16":
        raise TypeError(f"values has dtype {values.dtype}; allowed: numeric arrays")
    shape = q.shape
    ext = block_extents(shape, q.format, q.geometry, q.axis)
    v = xp.reshape(
        values, _blocked_shape(tuple(s // b for s, b in zip(shape, ext)), (1,) * len(shape))
    )
    return xp.reshape(xp.broadcast_to(v, _blocked_shape(shape, ext)), shape)


# --- QuantizedArray ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class QuantizedArray:
    """Block-quantized data: element codes, scale codes, optional FP32 global decode factor.

    ``codes`` is uint8: one code per byte with the logical shape, or, when ``packed``, two FP4
    codes per byte (four FP6 codes per three bytes) along the last axis (even index in the low
    nibble; see :mod:`fp4sim.formats.packing`). ``scales`` has one uint8 code per block
    (``shape[d] // extent[d]`` along each axis) or is ``None`` for formats without a block scale.
    ``global_scale`` is the float32 *decode* factor actually applied by :func:`dequantize`,
    broadcastable to the scales' shape, or ``None``.
    """

    codes: Array
    scales: Array | None
    global_scale: Array | None
    format: BlockFormat
    geometry: Geometry = Geometry.BLOCK
    axis: int = -1
    packed: bool = False

    def __post_init__(self) -> None:
        fmt = self.format
        if not isinstance(fmt, BlockFormat):
            raise TypeError(f"format={fmt!r} must be a BlockFormat")
        if not isinstance(self.geometry, Geometry):
            raise TypeError(f"geometry={self.geometry!r} must be a Geometry")
        if not isinstance(self.packed, bool):
            raise TypeError(f"packed={self.packed!r} must be a bool")
        if self.packed and fmt.elem.nbits not in (4, 6):
            raise ValueError(
                f"packed=True needs 4- or 6-bit elements; {fmt.elem} has {fmt.elem.nbits} bits"
            )
        if not _is_array(self.codes):  # pytree internals (None, sentinels) during transforms
            return
        if np.dtype(self.codes.dtype) != np.uint8:
            raise TypeError(f"codes has dtype {self.codes.dtype}; allowed: uint8")
        if (self.scales is None) != (fmt.scale is None):
            raise ValueError(
                f"scales is {'None' if self.scales is None else 'given'} but "
                f"{fmt.name}.scale is {fmt.scale}"
            )
        if self.global_scale is None and fmt.global_scale is not GlobalScale.NONE:
            raise ValueError(
                f"global_scale is None but {fmt.name} has a {fmt.global_scale.name} FP32 factor"
            )
        shape = self.shape
        ext = block_extents(shape, fmt, self.geometry, self.axis)
        want = tuple(n // b for n, b in zip(shape, ext))
        if self.scales is not None:
            if np.dtype(self.scales.dtype) != np.uint8:
                raise TypeError(f"scales has dtype {self.scales.dtype}; allowed: uint8")
            if tuple(self.scales.shape) != want:
                raise ValueError(
                    f"scales has shape {tuple(self.scales.shape)}; {fmt.name} "
                    f"{self.geometry.name} blocks of codes shaped {shape} need {want}"
                )
        if self.global_scale is not None:
            if np.dtype(self.global_scale.dtype) != np.float32:
                raise TypeError(
                    f"global_scale has dtype {self.global_scale.dtype}; allowed: float32"
                )
            try:
                np.broadcast_shapes(tuple(self.global_scale.shape), want)
            except ValueError:
                raise ValueError(
                    f"global_scale shape {tuple(self.global_scale.shape)} does not "
                    f"broadcast to the scales' shape {want}"
                ) from None

    @property
    def shape(self) -> tuple[int, ...]:
        """Logical (unpacked) shape."""
        s = tuple(self.codes.shape)
        if not self.packed:
            return s
        per = 2 if self.format.elem.nbits == 4 else 4 / 3
        return s[:-1] + (int(round(s[-1] * per)),)

    @property
    def ndim(self) -> int:
        return len(self.codes.shape)

    def unpacked_codes(self) -> Array:
        """One element code per byte, in the logical shape."""
        if not self.packed:
            return self.codes
        from fp4sim.formats import packing

        return packing.unpack(self.codes, self.format.elem)

    def pack(self) -> QuantizedArray:
        """The same data with codes packed along the last axis."""
        if self.packed:
            return self
        from fp4sim.formats import packing

        return dataclasses.replace(
            self, codes=packing.pack(self.codes, self.format.elem), packed=True
        )

    def unpack(self) -> QuantizedArray:
        if not self.packed:
            return self
        return dataclasses.replace(self, codes=self.unpacked_codes(), packed=False)

    def values(self) -> Array:
        """Decoded element values (float32) before any scale is applied."""
        return codec.decode(self.unpacked_codes(), self.format.elem)

    def scale_values(self) -> Array:
        """Decoded block scales (float32; UE8M0 0x00 is the float32 subnormal 2^-127 as bits)."""
        if self.scales is None:
            raise ValueError(f"{self.format.name} has no block scales")
        return codec.decode(self.scales, self.format.scale)


def _is_array(x: object) -> bool:
    return isinstance(x, np.ndarray) or is_jax(x)


def _flatten(q: QuantizedArray):
    return (q.codes, q.scales, q.global_scale), (q.format, q.geometry, q.axis, q.packed)


def _unflatten(aux, children):
    fmt, geometry, axis, packed = aux
    codes, scales, gs = children
    obj = object.__new__(QuantizedArray)
    for name, value in (
        ("codes", codes),
        ("scales", scales),
        ("global_scale", gs),
        ("format", fmt),
        ("geometry", geometry),
        ("axis", axis),
        ("packed", packed),
    ):
        object.__setattr__(obj, name, value)
    return obj


try:  # registering is cheap; jax is a hard dependency of fp4sim, but keep NumPy-only use working
    import jax as _jax

    _jax.tree_util.register_pytree_node(QuantizedArray, _flatten, _unflatten)
except ImportError:  # pragma: no cover
    pass


# --- scale derivation -------------------------------------------------------------------------
def _ue8m0_from_descale(xp: ModuleType, d_bits: Array) -> Array:
    """UE8M0 code of a float32 descale d >= 0 rounded up (TE / cuDNN / torchao RCEIL bit rule)."""
    field = (d_bits >> _U(23)) & _U(0xFF)
    mant = d_bits & _U(0x7FFFFF)
    up = (mant != 0) & (field != _U(0xFE)) & ~((field == 0) & (mant <= _U(0x400000)))
    return xp.minimum(field + up.astype(np.uint32), _U(0xFE)).astype(np.int32)


def _pow2_scale_code(xp: ModuleType, amax_bits: Array, fmt: BlockFormat, rule: ScaleRule) -> Array:
    """int32 UE8M0 code (0..254; 255 = NaN) of blocks with max-abs bits ``amax_bits``."""
    e_m = fmt.elem.emax
    field = ((amax_bits >> _U(23)) & _U(0xFF)).astype(np.int32)
    if rule is ScaleRule.RCEIL:
        amax = bitcast(amax_bits, np.float32)
        if fmt.arithmetic is Arithmetic.JAX:
            d = div_f32(amax, np.float32(fmt.elem.max))
        else:
            d = mul_f32(amax, np.float32(1.0) / np.float32(fmt.elem.max))
        code = _ue8m0_from_descale(xp, f32_bits(xp, d))
    else:
        if rule is ScaleRule.EVEN:
            half = _U(1 << (23 - fmt.elem.mbits - 1))
            field = (((amax_bits + half) >> _U(23)) & _U(0x1FF)).astype(np.int32)
        # floor(log2 amax): the exponent field (subnormal and zero blocks clamp to 2^-127 anyway)
        e = field - 127 - (0 if rule is ScaleRule.AMPLITUDE else e_m)
        if rule in (ScaleRule.CEIL, ScaleRule.AMPLITUDE):
            e = e + ((amax_bits & _U(0x7FFFFF)) != 0).astype(np.int32)
        code = xp.clip(e + 127, 0, 254)
    is_nan = amax_bits > _U(0x7F800000)
    is_inf = amax_bits == _U(0x7F800000)
    if fmt.nonfinite is NonFinite.SATFINITE:
        nan_c, inf_c = 255, 254
    elif fmt.nonfinite is NonFinite.NAN:
        nan_c, inf_c = 255, 255
    elif fmt.nonfinite is NonFinite.JAX:
        nan_c, inf_c = 0, 255
    else:
        return xp.where(is_nan, np.int32(255), code)
    code = xp.where(is_inf, np.int32(inf_c), code)
    return xp.where(is_nan, np.int32(nan_c), code)


def _block_amax_bits(xp: ModuleType, bits: Array, blocked: tuple[int, ...]) -> Array:
    """Max-abs bits per block, shaped ``blocked`` with the block axes kept (size 1).

    Integer max (exact, NaN-aware). Shaped for XLA CPU, which vectorizes a max over a non-minor
    axis but emits scalar code for a max over a short minor axis: the unit axes are dropped, the
    block's minor extent b is split into (f, b/f) with f = 8 (or 4, 2) and maxed over f first."""
    red = _block_reduce_axes(len(blocked) // 2)
    keep = [i for i, n in enumerate(blocked) if n != 1]
    a = xp.reshape(bits & _U(0x7FFFFFFF), [blocked[i] for i in keep])
    axes = [keep.index(i) for i in red if i in keep]
    minor = bool(axes) and axes[-1] == a.ndim - 1
    major = tuple(axes[:-1] if minor else axes)
    if major:
        a = xp.max(a, axis=major, keepdims=True)
    if minor:
        b = a.shape[-1]
        f = next((f for f in (8, 4, 2) if b % f == 0 and b // f >= 2), None)
        if f is not None:
            a = xp.max(xp.reshape(a, tuple(a.shape[:-1]) + (f, b // f)), axis=-2)
        a = xp.max(a, axis=-1, keepdims=True)
    # materialized: otherwise XLA fuses the max tree into every element's consumer
    return materialize(xp.reshape(a, tuple(1 if i in red else n for i, n in enumerate(blocked))))


def tensor_amax_bits(xp: ModuleType, bits: Array) -> Array:
    """Max-abs bits (uint32) of the whole array of float32 bit patterns ``bits``: rows of 4096 (or fewer) elements maxed pairwise (halves
    of the row range, which XLA CPU vectorizes; its full reduction is ~4x slower), then one row."""
    mag = bits & _U(0x7FFFFFFF)
    if math.prod(mag.shape) == 0:  # an empty tensor: amax 0 (no element to take it from)
        return xp.zeros((), dtype=np.uint32)
    cols = math.gcd(int(np.prod(mag.shape)), 4096)
    if cols < 256:
        return xp.max(mag)
    a = xp.reshape(mag, (-1, cols))
    while a.shape[0] > 1:
        h = a.shape[0] // 2
        top = xp.maximum(a[:h], a[h : 2 * h])
        a = xp.concatenate([top, a[2 * h :]]) if a.shape[0] % 2 else top
    return xp.max(materialize(a))


def global_decode_scale(amax: Array, fmt: BlockFormat = NVFP4) -> Array:
    """The NVFP4 decode factor ``amax/(M·S)`` (2688 for NVFP4) as float32 (torchao/JAX form)."""
    xp = namespace(amax)
    check_static("fmt", fmt, BlockFormat, "fp4sim.NVFP4")
    return div_f32(as_f32("amax", amax, xp), np.float32(_global_max(fmt)))


def global_encode_scale(amax: Array, fmt: BlockFormat = NVFP4) -> Array:
    """TE's encode factor ``(M·S)/amax`` as float32, capped at float32 max (amax 0), 1 where it
    would be 0 (amax Inf)."""
    return _encode_factor(amax, fmt)


def _encode_factor(amax: Array, fmt: BlockFormat) -> Array:
    xp = namespace(amax)
    check_static("fmt", fmt, BlockFormat, "fp4sim.NVFP4")
    amax = as_f32("amax", amax, xp)
    s = div_f32(np.float32(_global_max(fmt)), amax)
    s = xp.minimum(s, np.float32(np.finfo(np.float32).max))
    return xp.where(s == 0, np.float32(1.0), s)


def _global_max(fmt: BlockFormat) -> float:
    return fmt.elem.max * (fmt.scale.max if fmt.scale is not None else 1.0)


# --- quantize ---------------------------------------------------------------------------------
def _as_f32(x: Array, xp: Any = np) -> Array:
    """float32 ``x``: float32 as it is, bfloat16/float16 and ml_dtypes' float8/float6/float4
    widened exactly, float64 (and Python
    lists, scalars, objects exposing ``__array__``/``__dlpack__``) rounded to float32 by NumPy's
    cast (round to nearest even, subnormals kept); big-endian arrays byte-swapped."""
    x = as_float_array("x", x, xp)
    dt = np.dtype(x.dtype)
    if dt == np.float32:
        return x
    if dt in (np.dtype(ml_dtypes.bfloat16), np.float16) or dt.name in NARROW_FLOAT_DTYPES:
        return codec.widen_to_f32(x)
    if dt == np.float64 and not is_jax(x):
        return namespace(x).asarray(x.astype(np.float32))
    return x.astype(np.float32)


def quantize(
    x: Any,
    fmt: BlockFormat,
    *,
    axis: int = -1,
    geometry: Geometry = Geometry.BLOCK,
    rule: ScaleRule | None = None,
    global_scale: Any = None,
    global_encode_scale: Any = None,
    pack: bool = False,
    random_bits: Any = None,
) -> QuantizedArray:
    """Quantize ``x`` to ``fmt`` with scales shared per ``geometry`` block along ``axis``.

    ``rule`` overrides ``fmt.rule``. ``global_scale`` (decode factor) or ``global_encode_scale``
    (encode factor, TE's ``S_enc``) are required exactly when ``fmt.global_scale`` is
    ``CONSTANT`` (scalar or broadcastable to the scales' shape). ``pack=True`` packs FP4/FP6
    codes along the last axis. ``random_bits`` (uint32, the shape of ``x``) is required when
    ``fmt.policy.rounding`` is ``Rounding.STOCHASTIC`` (the elements are rounded stochastically,
    see :func:`fp4sim.formats.codec.encode`; the block scales keep the rule's rounding) and
    rejected otherwise. See the module docstring for the scale rules and the
    :class:`Arithmetic` orders. ``x`` may also be a PyTorch tensor (float32, bfloat16 or float16,
    any device) or another ``__dlpack__`` array: it is read as NumPy (:func:`fp4sim._xp.adopt`)
    and the result holds NumPy codes and scales, the same bits as for the same values in NumPy.
    Not differentiable (integer codes): :func:`round_trip` is.
    """
    x = adopt(x, "x")
    return quantize_with_block_amax(
        x,
        fmt,
        axis=axis,
        geometry=geometry,
        rule=rule,
        global_scale=global_scale,
        global_encode_scale=global_encode_scale,
        pack=pack,
        random_bits=random_bits,
    )[0]


def quantize_with_block_amax(
    x: Array,
    fmt: BlockFormat,
    *,
    axis: int = -1,
    geometry: Geometry = Geometry.BLOCK,
    rule: ScaleRule | None = None,
    global_scale: Any = None,
    global_encode_scale: Any = None,
    pack: bool = False,
    random_bits: Any = None,
) -> tuple[QuantizedArray, Any]:
    """:func:`quantize` and, for power-of-two block scales without an FP32 factor, the max-abs
    bit pattern (uint32) of ``x`` in each block, shaped like the scales (the quantizer's own,
    not a second pass; what :func:`fp4sim.attention.operands.fake_quantize_stats` bounds the
    dequantized values with); ``None`` for the other formats."""
    check_static("fmt", fmt, BlockFormat, "fp4sim.MXFP8, fp4sim.MXFP4, fp4sim.NVFP4")
    pack = check_bool("pack", pack)
    if rule is not None:
        if not isinstance(rule, ScaleRule):
            raise TypeError(
                f"rule={rule!r} must be a ScaleRule; allowed: {[r.name for r in ScaleRule]}"
            )
        fmt = fmt.replace(rule=rule)
    xp = namespace(x, random_bits)
    x = no_derivative(_as_f32(x, xp), "quantize")
    shape = tuple(x.shape)
    if fmt.policy.rounding is Rounding.STOCHASTIC:
        if random_bits is None:
            raise TypeError(
                f"random_bits is required: {fmt.name}.policy.rounding is "
                f"Rounding.STOCHASTIC; pass a uint32 array of the shape of x {shape}"
            )
        random_bits = xp.asarray(random_bits)
        if np.dtype(random_bits.dtype) != np.uint32:
            raise TypeError(f"random_bits has dtype {random_bits.dtype}; allowed: uint32")
        if tuple(random_bits.shape) != shape:
            raise ValueError(
                f"random_bits has shape {tuple(random_bits.shape)}; it must equal "
                f"the shape of x {shape}"
            )
    elif random_bits is not None:
        raise ValueError(
            f"random_bits is only used when {fmt.name}.policy.rounding is "
            f"Rounding.STOCHASTIC, not {fmt.policy.rounding}; pass random_bits=None"
        )
    ext = block_extents(shape, fmt, geometry, axis)
    axis = _norm_axis(axis, len(shape))
    scale_shape = tuple(n // b for n, b in zip(shape, ext))
    bits = bitcast(x, np.uint32)
    factors = _global_factors(
        xp, bits, fmt, shape, ext, axis, geometry, scale_shape, global_scale, global_encode_scale
    )
    chunks = _np_chunks(xp, shape, ext)
    if chunks is None:
        q, block_amax = _quantize_blocks(
            xp, x, bits, fmt, shape, ext, axis, geometry, factors, random_bits
        )
    else:  # NumPy, a large input: slabs of whole blocks bound the temporaries (independent)
        d, rows = chunks
        parts = []
        for r0 in range(0, shape[d], rows):
            sl = (slice(None),) * d + (slice(r0, min(shape[d], r0 + rows)),)
            sub = tuple(x[sl].shape)
            f = (
                None
                if factors is None
                else tuple(_rows_of(a, sl, len(shape), ext) for a in factors)
            )
            parts.append(
                _quantize_blocks(
                    xp,
                    x[sl],
                    bits[sl],
                    fmt,
                    sub,
                    ext,
                    axis,
                    geometry,
                    f,
                    None if random_bits is None else random_bits[sl],
                )
            )

        def cat(arrs: list) -> Any:
            return None if arrs[0] is None else np.concatenate(arrs, axis=d)

        q = QuantizedArray(
            cat([p[0].codes for p in parts]),
            cat([p[0].scales for p in parts]),
            None if factors is None else np.asarray(factors[0], np.float32),
            fmt,
            geometry,
            axis,
            False,
        )
        block_amax = cat([p[1] for p in parts])
    if pack:  # materialize the codes first: XLA would otherwise re-run the encoder per nibble
        q = dataclasses.replace(q, codes=materialize(q.codes)).pack()
    return q, block_amax


_NP_CHUNK = 1 << 20  # elements per NumPy pass of quantize/encode/decode (temporaries ~16x this)


def _np_chunks(xp: Any, shape: tuple[int, ...], ext: tuple[int, ...]) -> tuple[int, int] | None:
    """(axis d, length along d: a multiple of the block extent there) of the NumPy passes, the
    first axis along which slabs of whole blocks hold at most about ``_NP_CHUNK`` elements; None
    for one pass (jax, a small input, or no such axis)."""
    n = math.prod(shape)
    if xp is not np or n <= _NP_CHUNK:
        return None
    best = None  # (slab elements, axis, length): the thinnest slabs if none is small enough
    for d, (size, e) in enumerate(zip(shape, ext)):
        if size <= e:
            continue
        unit = (n // size) * e  # elements of one slab one block thick along d
        rows = max(1, _NP_CHUNK // unit) * e
        if rows < size:
            if unit <= _NP_CHUNK:
                return d, rows
            if best is None or unit < best[0]:
                best = (unit, d, rows)
    return None if best is None else best[1:]


def _rows_of(a: Any, sl: tuple, nd: int, ext: tuple[int, ...]) -> Any:
    """The part of a factor (broadcastable to the scales' shape) for the slab ``sl`` (slices
    along the first ``len(sl)`` axes, whole blocks)."""
    a = np.asarray(a)
    if a.ndim == 0:
        return a
    a = np.reshape(a, (1,) * (nd - a.ndim) + a.shape)
    d, s = len(sl) - 1, sl[-1]
    if a.shape[d] == 1:
        return a
    return a[(slice(None),) * d + (slice(s.start // ext[d], -(-s.stop // ext[d])),)]


def _positive_finite(xp: Any, v: Any) -> Any:
    """float32 ``v`` in (0, Inf), compared as bits (FTZ-proof)."""
    b = f32_bits(xp, v)
    return (b > _U(0)) & (b < _U(0x7F800000))


def _global_factors(
    xp: Any,
    bits: Any,
    fmt: BlockFormat,
    shape: tuple[int, ...],
    ext: tuple[int, ...],
    axis: int,
    geometry: Geometry,
    scale_shape: tuple[int, ...],
    global_scale: Any,
    global_encode_scale: Any,
) -> tuple[Any, Any] | None:
    """(decode factor, encode factor) of the FP32 second level, or None.

    A ``CONSTANT`` factor must broadcast to the scales' shape and be finite and > 0 with a
    finite, nonzero reciprocal: a concrete value that is not raises ``ValueError`` naming the
    argument on every backend; a traced one (known only when the jitted function runs) makes
    the stored decode factor NaN, so every dequantized value is NaN (never a silent 0)."""
    # --- FP32 global factor -----------------------------------------------------------------
    if (
        global_scale is not None or global_encode_scale is not None
    ) and fmt.global_scale is not GlobalScale.CONSTANT:
        raise ValueError(
            f"global_scale/global_encode_scale given but {fmt.name}.global_scale is "
            f"{fmt.global_scale.name}; use "
            f"fmt.replace(global_scale=GlobalScale.CONSTANT)"
        )
    g_dec = s_enc = None  # decode factor, encode factor (float32 arrays)
    gmode = fmt.global_scale
    if gmode is GlobalScale.CONSTANT:
        if (global_scale is None) == (global_encode_scale is None):
            raise ValueError(
                f"{fmt.name} has a CONSTANT FP32 factor: give exactly one of "
                f"global_scale= (decode) or global_encode_scale= (encode)"
            )
        name = "global_scale" if global_scale is not None else "global_encode_scale"
        raw = global_scale if global_scale is not None else global_encode_scale
        given = as_f32(name, raw, xp if is_jax(raw) else np)  # NumPy (concrete) unless jax
        try:
            fits = np.broadcast_shapes(tuple(given.shape), scale_shape) == scale_shape
        except ValueError:
            fits = False
        if not fits:
            raise ValueError(
                f"{name} has shape {tuple(given.shape)}; it must broadcast to the "
                f"scales' shape {scale_shape} (a scalar, or one factor per block)"
            )
        if not is_traced(given):  # a concrete factor: checked on the host, on every backend
            gn = np.asarray(given, dtype=np.float32)
            ok = _positive_finite(np, gn) & _positive_finite(np, div_f32(np.float32(1.0), gn))
            if not bool(np.all(ok)):
                bad = gn[~np.broadcast_to(ok, gn.shape)]
                raise ValueError(
                    f"{name} holds {bad.ravel()[0]!r}; a CONSTANT FP32 factor must "
                    f"be finite and > 0 with a finite reciprocal (0 would "
                    f"dequantize every element to 0, a negative or NaN factor "
                    f"to NaN)"
                )
        given = xp.asarray(given)
        if global_scale is not None:
            g_dec = given
            s_enc = div_f32(np.float32(1.0), g_dec)
        else:
            s_enc = given
            g_dec = div_f32(np.float32(1.0), s_enc)
        if is_traced(given):  # known only when the jitted function runs: NaN, never a silent 0
            ok = _positive_finite(xp, g_dec) & _positive_finite(xp, s_enc)
            g_dec = xp.where(ok, g_dec, np.float32(np.nan))
    elif gmode is not GlobalScale.NONE:
        if gmode is GlobalScale.PER_TENSOR:
            amax_t = tensor_amax_bits(xp, bits)
        else:
            if any(b != 1 for d, b in enumerate(ext) if d - len(shape) != axis):
                raise ValueError(
                    f"a PER_ROW FP32 factor (amax over axis={axis}) needs blocks that "
                    f"lie within one row; {geometry.name} blocks have extents {ext}"
                )
            amax_t = xp.max(bits & _U(0x7FFFFFFF), axis=axis, keepdims=True, initial=np.uint32(0))
        amax_t = bitcast(xp.asarray(amax_t, dtype=np.uint32), np.float32)
        if fmt.arithmetic is Arithmetic.TRANSFORMER_ENGINE:
            s_enc = _encode_factor(amax_t, fmt)
            g_dec = div_f32(np.float32(1.0), s_enc)
        else:
            g_dec = global_decode_scale(amax_t, fmt)
            s_enc = div_f32(np.float32(1.0), g_dec)
    if g_dec is None:
        return None
    if is_jax(g_dec):
        # Materialize the two factors once instead of re-deriving them inside every consumer.
        from jax import lax

        g_dec, s_enc = lax.optimization_barrier((g_dec, s_enc))
    return g_dec, s_enc


def _quantize_blocks(
    xp: Any,
    x: Any,
    bits: Any,
    fmt: BlockFormat,
    shape: tuple[int, ...],
    ext: tuple[int, ...],
    axis: int,
    geometry: Geometry,
    factors: Any,
    random_bits: Any,
) -> tuple[QuantizedArray, Any]:
    """The block scales and element codes of float32 ``x`` (one pass; unpacked)."""
    blocked = _blocked_shape(shape, ext)
    scale_shape = tuple(n // b for n, b in zip(shape, ext))
    xb = xp.reshape(x, blocked)
    g_dec, s_enc = (None, None) if factors is None else factors
    g_dec_b = None if g_dec is None else _to_blocked(xp, g_dec, shape, blocked)
    s_enc_b = None if s_enc is None else _to_blocked(xp, s_enc, shape, blocked)

    # --- block scales and scaled elements ---------------------------------------------------
    scales = shift = None
    policy = element_policy(fmt)
    if fmt.scale is None:
        if g_dec is None:
            y = xb
        elif fmt.arithmetic is Arithmetic.TRANSFORMER_ENGINE:
            y = mul_f32(xb, s_enc_b)
        elif fmt.arithmetic is Arithmetic.TORCHAO:
            y = mul_f32(xb, div_f32(np.float32(1.0), g_dec_b))
        else:
            y = div_f32(xb, g_dec_b)
    elif fmt.pow2:
        amax_bits = _block_amax_bits(xp, bits, blocked)
        if g_dec is not None:  # a power-of-two block scale under an FP32 factor: scale x first
            xb = mul_f32(xb, s_enc_b)
            amax_bits = _block_amax_bits(xp, bitcast(xp.reshape(xb, shape), np.uint32), blocked)
        # materialized once: the scale chain is not redone per element or per consumer
        code = materialize(_pow2_scale_code(xp, amax_bits, fmt, fmt.rule))
        e = code - 127
        if fmt.arithmetic is Arithmetic.JAX:  # code 0xFF decodes to +Inf: x/Inf
            xb = xp.where(code == 255, div_f32(xb, np.float32(np.inf)), xb)
        elif fmt.arithmetic is Arithmetic.TORCHAO:  # torchao's handling of the 2^-127 code
            e = (
                xp.where(code == 0, np.int32(0), e)
                if fmt.rule is ScaleRule.RCEIL
                else xp.maximum(e, np.int32(-126))
            )
        if fmt.rule is ScaleRule.AMPLITUDE:
            # fl(fl(x·2^-e)·M), both flushed, then the element rounding (the value is 2^e·q/M)
            y = mul_ftz(
                ldexp_ftz(xb, -xp.where(code == 255, np.int32(0), e)), np.float32(fmt.elem.max)
            )
        else:
            # the elements are encoded as the exact x·2^-e: one rounding, exponent arithmetic only
            y, shift = xb, -xp.where(code == 255, np.int32(0), e)
        scales = code.astype(np.uint8)
    else:
        y, scales = _e4m3_scaled(xp, xb, bits, blocked, fmt, g_dec_b, s_enc_b)

    if shift is None:
        codes = codec.encode(xp.reshape(y, shape), fmt.elem, policy, random_bits=random_bits)
    else:  # without the unit axes of the blocked shape (XLA CPU lays those out badly)
        keep = [i for i, n in enumerate(blocked) if n != 1]
        y = xp.reshape(y, [blocked[i] for i in keep])
        shift = xp.reshape(shift, [shift.shape[i] for i in keep])
        rb = None if random_bits is None else xp.reshape(random_bits, tuple(y.shape))
        codes = xp.reshape(
            codec.encode(y, fmt.elem, policy, exp_shift=shift, random_bits=rb), shape
        )
    if scales is not None:
        scales = xp.reshape(scales, scale_shape)
    if g_dec is not None:
        g_dec = xp.asarray(g_dec, dtype=np.float32)
    q = QuantizedArray(codes, scales, g_dec, fmt, geometry, axis, False)
    block_amax = None
    if fmt.pow2 and g_dec is None:
        block_amax = xp.reshape(amax_bits, scale_shape)
    return q, block_amax


def round_trip(
    x: Any,
    fmt: BlockFormat | FloatFormat,
    policy: Policy | None = None,
    *,
    random_bits: Any = None,
    **quantize_args: Any,
) -> Any:
    """float32 ``dequantize(quantize(x, fmt, random_bits=..., **quantize_args))`` (``fmt`` a
    :class:`BlockFormat`; ``policy`` must be None: the block format carries it) or
    ``decode(encode(x, fmt, policy, random_bits=...), fmt)`` (``fmt`` a
    :class:`~fp4sim.formats.spec.FloatFormat`; ``policy`` defaults to the default policy).

    The one differentiable form of the quantizers: under ``jax.grad``/``jax.jvp`` its derivative
    is the straight-through estimator, ``d round_trip(x) / dx = identity`` (also at NaN, Inf,
    saturated and flushed elements), and zero with respect to ``random_bits`` and the global
    scales. NumPy and jax inputs give the same bits as the two calls it stands for."""
    if isinstance(fmt, BlockFormat):
        if policy is not None:
            raise TypeError(
                f"policy={policy!r}: a BlockFormat carries its policy; use "
                f"fmt.replace(policy=...) and pass policy=None"
            )
        gs = quantize_args.pop("global_scale", None)
        ges = quantize_args.pop("global_encode_scale", None)

        def fn(v, bits, g, ge):
            return dequantize(
                quantize(
                    v,
                    fmt,
                    random_bits=bits,
                    global_scale=g,
                    global_encode_scale=ge,
                    **quantize_args,
                )
            )

        return straight_through(fn, x, random_bits, gs, ges)
    if isinstance(fmt, FloatFormat):
        if quantize_args:
            raise TypeError(
                f"round_trip with the element format {fmt} takes no "
                f"{sorted(quantize_args)} (block-format arguments)"
            )
        pol = DEFAULT_POLICY if policy is None else policy

        def efn(v, bits):
            return codec.decode(codec.encode(v, fmt, pol, random_bits=bits), fmt)

        return straight_through(efn, x, random_bits)
    raise TypeError(f"fmt={fmt!r} must be a BlockFormat (e.g. MXFP8) or a FloatFormat (e.g. E4M3)")


def _to_blocked(xp: Any, g: Any, shape: tuple[int, ...], blocked: tuple[int, ...]) -> Any:
    """A global factor (scalar, or broadcastable to the scales' shape) shaped to broadcast
    against the blocked elements ``(n0/b0, b0, n1/b1, b1, ...)``."""
    g = xp.asarray(g, dtype=np.float32)
    if g.ndim == 0:
        return g
    nd = len(shape)
    g = xp.reshape(g, (1,) * (nd - g.ndim) + tuple(g.shape))
    target: list[int] = []
    for d in range(nd):
        target += [g.shape[d], 1]
    return xp.reshape(g, tuple(target))


def _clip_scale(xp: ModuleType, v: Array, lo: float, hi: Array) -> Array:
    """``clip(v, lo, hi)`` for float32 ``v >= +0`` or NaN (kept), compared as bit patterns: a
    float max/min would see a float32-subnormal ``v`` as 0 where XLA flushes (XLA CPU's DAZ)."""
    vb = f32_bits(xp, v)
    lo_b, hi_b = f32_bits(np, lo), f32_bits(np, hi)
    out = xp.where(vb < lo_b, lo_b, xp.where((vb > hi_b) & (vb <= _U(0x7F800000)), hi_b, vb))
    return bitcast(out, np.float32)


def _e4m3_scaled(xp, xb, bits, blocked, fmt, g_dec, s_enc):
    """(scaled elements, scale codes) for UE4M3/UE5M3 block scales, per ``fmt.arithmetic``."""
    M = np.float32(fmt.elem.max)
    S = np.float32(fmt.scale.max)
    spolicy = Policy(
        rounding=(Rounding.UP if fmt.rule is ScaleRule.RCEIL else Rounding.NEAREST_EVEN)
    )
    f32max = np.float32(np.finfo(np.float32).max)
    one = np.float32(1.0)
    if fmt.arithmetic is Arithmetic.JAX:
        xs = xb if g_dec is None else div_f32(xb, g_dec)
        amax = bitcast(_block_amax_bits(xp, bitcast(xs, np.uint32), blocked), np.float32)
        s_val = _clip_scale(xp, div_f32(amax, M), fmt.min_scale, S)
        s_code = codec.encode(s_val, fmt.scale, spolicy)
        s = codec.decode(s_code, fmt.scale)
        return div_f32(xs, s), s_code
    amax = bitcast(_block_amax_bits(xp, bits, blocked), np.float32)
    if fmt.arithmetic is Arithmetic.TRANSFORMER_ENGINE:
        k = one / M if s_enc is None else mul_f32(s_enc, one / M)
        s_val = _clip_scale(xp, mul_f32(amax, k), fmt.min_scale, S)
        s_code = codec.encode(s_val, fmt.scale, spolicy)
        s = codec.decode(s_code, fmt.scale)
        denom = s if g_dec is None else mul_f32(s, g_dec)
        enc = xp.minimum(div_f32(one, denom), f32max)
        return mul_f32(xb, enc), s_code
    # TORCHAO
    base = div_f32(amax, M)
    s_val = base if g_dec is None else div_f32(base, g_dec)
    s_val = _clip_scale(xp, s_val, fmt.min_scale, S)
    s_code = codec.encode(s_val, fmt.scale, spolicy)
    s = codec.decode(s_code, fmt.scale)
    inv_g = one if g_dec is None else div_f32(one, g_dec)
    return mul_f32(xb, div_f32(inv_g, s)), s_code


# --- dequantize -------------------------------------------------------------------------------
def scale_exponents(q: QuantizedArray) -> Array:
    """int32 power-of-two exponents of UE8M0 scales (code − 127; NaN code 0xFF gives 128)."""
    check_static("q", q, QuantizedArray, "fp4sim.quantize(x, fp4sim.MXFP8)")
    if not q.format.pow2:
        raise ValueError(
            f"scale_exponents needs UE8M0 scales; {q.format.name} has {q.format.scale}"
        )
    return q.scales.astype(np.int32) - 127


def _mul_exact_small(xp: ModuleType, v: Array, g: Array) -> Array:
    """Correctly rounded float32 v·g for v with <= 8 significant bits and any float32 g."""
    vb, gb = bitcast(v, np.uint32), bitcast(g, np.uint32)
    _, sv, ev = split(xp, vb)
    _, sg, eg = split(xp, gb)
    nv = bitlen(xp, sv)
    sh = xp.clip(nv - 8, 0, 31).astype(np.uint32)  # v's significand has <= 8 bits: drop zeros
    sv = sv >> sh
    ev = ev + sh.astype(np.int32)
    out = compose(xp, (vb ^ gb) >> _U(31), sv * sg, ev + eg)
    plain = (
        ((vb & _U(0x7FFFFFFF)) != 0)
        & ((gb & _U(0x7FFFFFFF)) != 0)
        & ((vb & _U(0x7F800000)) != _U(0x7F800000))
        & ((gb & _U(0x7F800000)) != _U(0x7F800000))
    )
    return xp.where(plain, bitcast(out, np.float32), mul_f32(v, g))


def dequantize(q: QuantizedArray) -> Array:
    """float32 values ``code · scale · global`` (correctly rounded, FTZ-proof)."""
    if not isinstance(q, QuantizedArray):
        raise TypeError(f"q={q!r} must be a QuantizedArray")
    fmt = q.format
    xp = namespace(q.codes)
    shape = q.shape
    ext = block_extents(shape, fmt, q.geometry, q.axis)
    chunks = _np_chunks(xp, shape, ext)
    if chunks is not None and not (q.packed and chunks[0] == len(shape) - 1):
        # NumPy, a large input: slabs of whole blocks bound the temporaries
        d, rows = chunks
        out = np.empty(shape, np.float32)
        for r0 in range(0, shape[d], rows):
            sl = (slice(None),) * d + (slice(r0, min(shape[d], r0 + rows)),)
            ssl = (slice(None),) * d + (slice(r0 // ext[d], -(-sl[d].stop // ext[d])),)
            sub = object.__new__(QuantizedArray)
            for name, value in (
                ("codes", q.codes[sl]),
                ("scales", None if q.scales is None else q.scales[ssl]),
                (
                    "global_scale",
                    None
                    if q.global_scale is None
                    else _rows_of(q.global_scale, sl, len(shape), ext),
                ),
                ("format", fmt),
                ("geometry", q.geometry),
                ("axis", q.axis),
                ("packed", q.packed),
            ):
                object.__setattr__(sub, name, value)
            out[sl] = dequantize(sub)
        return out
    v = q.values()
    shape = tuple(v.shape)
    blocked = _blocked_shape(shape, ext)
    vb = xp.reshape(v, blocked)
    sshape = _blocked_shape(tuple(n // b for n, b in zip(shape, ext)), (1,) * len(shape))
    if fmt.scale is None:
        out = vb
    elif fmt.pow2:
        code = xp.reshape(q.scales.astype(np.int32), sshape)
        out = ldexp_f32(vb, code - 127)
        if fmt.divisor != 1.0:
            # AMPLITUDE: fl(2^e·q/M), one rounding: 2^e·q is exact (at least 2^-149) unless it
            # overflows, and then 2^e·fl(q/M) is normal, so the scaling is exact
            m = np.float32(fmt.divisor)
            out = xp.where(xp.isinf(out), ldexp_f32(div_f32(vb, m), code - 127), div_f32(out, m))
        out = xp.where(code == 255, np.float32(np.nan), out)
    else:
        s = xp.reshape(q.scale_values(), sshape)
        if q.global_scale is not None and fmt.arithmetic is Arithmetic.TORCHAO:
            # torchao: code · fl(g · s)
            gs = mul_f32(_to_blocked(xp, q.global_scale, shape, blocked), s)
            out = _mul_exact_small(xp, vb, xp.broadcast_to(gs, vb.shape))
            return xp.reshape(out, shape)
        out = vb * s  # exact: <= 2 x 4 significant bits, result within the float32 normal range
    if q.global_scale is not None:
        g = _to_blocked(xp, q.global_scale, shape, blocked)
        out = _mul_exact_small(xp, out, xp.broadcast_to(g, out.shape))
    return xp.reshape(out, shape)

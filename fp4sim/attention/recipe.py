"""Every attention recipe: the frozen, hashable descriptions of a low-precision forward and of a
training step, and the named ones.

An :class:`AttentionRecipe` names every numerical choice between the raw inputs and the output
(see docs/algorithms.md); a :class:`TrainingRecipe` adds the backward's formats (its operand
scalings are :class:`~fp4sim.attention.operands.OperandScaling`). Both are static ``jax.jit``
arguments. This module owns no arithmetic: the converters live in
:mod:`fp4sim.attention.converters`, the forward in :mod:`fp4sim.attention.forward`, the backward
in :mod:`fp4sim.attention.backward` and :mod:`fp4sim.attention.autodiff`. The named recipes:
:data:`PRESETS` (forward routes), :data:`TRAINING_PRESETS` and :data:`LEAK_TABLE` (training).

Notation. ``z`` raw scores ``q·k`` (float32), ``u = fl(c·z)`` with
``c = softmax_scale·log2(e)`` (float32), row running max ``m = max u`` over the keys seen so far,
log2-domain score ``t = fl(u − m) ≤ 0`` (−inf for masked keys), probability ``p = 2^t``. Key
blocks are 32 keys (MX) or 16 keys (NV). ``fl`` is float32 round-to-nearest-even.

Fields of :class:`AttentionRecipe`:

* ``qk``: :class:`QKFormat` of Q and K (quantized along the head dimension, per token), and
  ``qk_global``: the NVFP4 FP32 global factor mode (:class:`QKGlobalScale`).
* ``converter``: one of :class:`ExactP`, :class:`AffineP`, :class:`MitchellP`,
  :class:`SchraudolphP`, :class:`LogGroupP`, :class:`SageTwoLevelP`, :class:`FixedScaleP`;
  ``p_format``: :class:`PFormat` of P; ``block_exponent``: :class:`BlockExponent` (the Direct-P
  ``k_B`` rule, decision 1 below).
* ``v``: :class:`VFormat` of V (quantized along tokens where it has blocks).
* ``normalization``: :class:`Normalization` (consistent / mismatched / exact).
* Tiles: ``block_kv`` keys per online-softmax tile, ``fragment`` keys per softmax fragment (the
  N32 fragments of Hardware-Aware FP4 FlashAttention-4 (arXiv:2609.04105); the FA4 exp2 schedule runs per fragment), ``pv_group`` keys per PV
  instruction (the K64 groups of the same paper: block partial sums of one group are added together
  before they reach the float32 accumulator), ``block_q`` query rows per tile (kept for kernels;
  no route here depends on it numerically).
* ``exp2``: :class:`Exp2Model` (correctly rounded, or FA4's polynomial on a share of pairs).
* ``rescale_threshold``: the running max moves only when a tile's max exceeds it by more than
  this many log2 units (FA4/HAO use 0 with quantized P, cuDNN's reference 4.0).
* Flush-to-zero is modelled, not optional: all float32 arithmetic of the emulator (softmax,
  normalizer, rescale, accumulation) flushes results below 2^-126 to zero, like ``.ftz`` SIMT
  instructions, explicitly, so NumPy and XLA agree (:mod:`fp4sim.formats.f32`). The order of
  the consistent normalizer that survives it is the forward's; the unsafe orders are in
  :mod:`fp4sim.attention.normalization`.
* ``hadamard``: rotate Q and K by the orthonormal Walsh-Hadamard matrix along the head
  dimension before quantization (as FLAMIA does, after QuIP#).

Decisions where the papers leave a choice open, all documented here once:

1. Direct-P ``k_B``: default ``BlockExponent.BLOCK_MAX_CEIL`` (``k_B = ceil(max_{j∈B} t_j)``,
   clamped to [−127, 127]); ``ROW_ANCHOR`` sets ``k_B = 0`` (anchored at the running row max).
   The payload is ``RN_E2M1_sat(u)`` (cvt.rn.satfinite semantics, ties to even).
2. Code comparisons count every element (:func:`fp4sim.attention.metrics.code_match_rate`).
3. Mitchell shift default ``log2(1.25) − 1/4`` (boundary aligned), value path then RNE.
4. Schraudolph: code = ``floor(2^mbits·(t + scale_log2 − shift)) + bias·2^mbits`` taken directly
   as the BF16 / E4M3 bit pattern, clamped to [0, max]; shift default 0.0576 (zero mean).
5. V in MXFP4 uses the Direct-P amplitude convention ``β·q/6`` with ``β = 2^ceil(log2 amax)``.
6. NVFP4 global factor: ``QKGlobalScale.NONE`` (constant 1, causal-safe) by default.
7. exp2 "exact" = correctly rounded float32 exp2 with flush of results below 2^-126
   (:mod:`fp4sim.attention.exp2`); MUFU ``ex2.approx`` is not modelled bit-exactly, so the FA4
   schedule's "native" pairs use the correctly rounded exp2.
8. cuDNN's fixed P scale: 16 by default (``FixedScaleP.scale``), 256 available.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any

from fp4sim._checks import check_int
from fp4sim.attention import operands as ops
from fp4sim.attention.operands import OperandScaling
from fp4sim.formats.blocks import MXFP8_E4M3
from fp4sim.formats.spec import E2M1, E4M3, UE4M3, UE8M0, FloatFormat

__all__ = [
    "QKFormat",
    "QKGlobalScale",
    "VFormat",
    "PFormat",
    "BlockExponent",
    "Normalization",
    "Exp2Kind",
    "Exp2Model",
    "ExactP",
    "AffineP",
    "MitchellP",
    "SchraudolphP",
    "LogGroupP",
    "SageTwoLevelP",
    "FixedScaleP",
    "Converter",
    "CONVERTER_TYPES",
    "MITCHELL_BOUNDARY_SHIFT",
    "SCHRAUDOLPH_ZERO_MEAN_SHIFT",
    "AttentionRecipe",
    "EXACT_F32",
    "HW_FP4_DIRECT_P",
    "HW_FP4_DIRECT_P_MITCHELL",
    "HW_FP4_FP8_PV",
    "HAO_LOG_NVFP4",
    "HAO_LOG_MXFP8",
    "SAGE3_TWO_LEVEL",
    "CUDNN_FP8_FIXED",
    "FLAMIA_MXFP8",
    "FLAMIA_NVFP4",
    "PRESETS",
    "preset_by_name",
    "DeltaSource",
    "DsProbabilities",
    "BackwardAccumulation",
    "ForwardAccumulation",
    "TrainingRecipe",
    "P_MXFP8_KEYS",
    "TRAINING_PRESETS",
    "LEAK_TABLE",
    "training_preset",
]

MITCHELL_BOUNDARY_SHIFT = math.log2(1.25) - 0.25
"""Shift (log2 units) aligning Mitchell's 1.0/1.5 E2M1 boundary with exp2's: 0x1.269a3c...p-4."""
SCHRAUDOLPH_ZERO_MEAN_SHIFT = 0.0576
"""Shift (log2 units) making Schraudolph's piecewise-linear 2^x error zero-mean."""


class QKFormat(enum.Enum):
    """Representation of Q and K (always per token: scale groups run along the head dim)."""

    FLOAT32 = "float32"  # unquantized (the convergence baseline)
    BF16 = "bf16"  # round to nearest even bfloat16
    FP8_PER_TENSOR = "fp8_per_tensor"  # E4M3 payload, one FP32 scale amax/448 per (batch, head)
    MXFP8 = "mxfp8"  # E4M3 payload, UE8M0 per 32 along head dim, 2^ceil(log2(amax/448))
    NVFP4 = "nvfp4"  # E2M1 payload, UE4M3 per 16 along head dim (RNE), FP32 global factor
    TOKEN_BLOCK_FP8 = "token_block_fp8"  # E4M3, one power-of-two exponent per 32 tokens x D


class QKGlobalScale(enum.Enum):
    """The NVFP4 FP32 global factor ``s_enc = 6·448/amax`` (NVIDIA NVFP4, arXiv:2509.25149)."""

    NONE = "none"  # s_enc = s_dec = 1 (SageAttention3; causal-safe)
    PER_TENSOR = "per_tensor"  # amax over each (batch, head) tensor: leaks the future if causal
    PER_TOKEN = "per_token"  # amax over each token's row (causal-safe)


GlobalScale = QKGlobalScale  # the first published name; not in __all__ (formats has its own)


class VFormat(enum.Enum):
    """Representation of V (scale groups run along tokens, the PV contraction axis)."""

    FLOAT32 = "float32"
    BF16 = "bf16"
    FP8 = "fp8"  # plain E4M3 cast, no scale (HAO's "FP8 PV")
    MXFP8_TOKENS = "mxfp8_tokens"  # E4M3, UE8M0 per 32 tokens per column, 2^ceil(log2(amax/448))
    MXFP4_TOKENS = "mxfp4_tokens"  # E2M1, beta=2^ceil(log2 amax) per 32 tokens, value beta*q/6
    NVFP4_TOKENS = "nvfp4_tokens"  # E2M1, UE4M3 RN(amax/6) per 16 tokens per column, no global
    TOKEN_BLOCK_FP8 = "token_block_fp8"  # E4M3, one 2^ceil(log2(amax/448)) per 32 tokens x Dv


class PFormat(enum.Enum):
    """Representation of the probabilities P that enter the PV product."""

    FLOAT32 = "float32"  # unquantized float32 p (exact converter only)
    BF16 = "bf16"  # BF16 bit patterns (uint16 codes)
    FP8 = "fp8"  # E4M3, no per-block scale (a fixed or no scale)
    MXFP8 = "mxfp8"  # E4M3, UE8M0 per 32 keys
    MXFP4 = "mxfp4"  # E2M1, UE8M0 amplitude alpha per 32 keys, value alpha*q/6 (Direct-P)
    NVFP4 = "nvfp4"  # E2M1, UE4M3 per 16 keys

    @property
    def block(self) -> int:
        """Keys per scale block (1 for formats without block scales)."""
        return {PFormat.MXFP8: 32, PFormat.MXFP4: 32, PFormat.NVFP4: 16}.get(self, 1)

    @property
    def element(self) -> FloatFormat | None:
        """The element format of P's codes (None: BF16 bit patterns or float32 bits)."""
        return {
            PFormat.FP8: E4M3,
            PFormat.MXFP8: E4M3,
            PFormat.MXFP4: E2M1,
            PFormat.NVFP4: E2M1,
        }.get(self)

    @property
    def scale(self) -> FloatFormat | None:
        """The block scale format of P (UE8M0 for MXFP4/MXFP8, UE4M3 for NVFP4, else None)."""
        return {PFormat.MXFP8: UE8M0, PFormat.MXFP4: UE8M0, PFormat.NVFP4: UE4M3}.get(self)

    @property
    def divisor(self) -> float:
        """The payload convention's constant divisor: 6 for MXFP4 P (Direct-P's ``α·q/6``: the
        largest E2M1 payload 6 stands for the block amplitude ``α = 2^k_B``), else 1. The
        represented weight of key j is ``values_j · 2^(exps_B + factor_exp) / divisor``."""
        return 6.0 if self is PFormat.MXFP4 else 1.0

    @property
    def block_exponents(self) -> bool:
        """Whether P tiles carry an int32 power-of-two exponent per block (UE8M0 scales: MXFP4's
        amplitude ``k_B``, MXFP8's ``e_B``); NVFP4's UE4M3 scales are folded into the values."""
        return self in (PFormat.MXFP4, PFormat.MXFP8)


class BlockExponent(enum.Enum):
    """How the Direct-P amplitude exponent ``k_B`` of a P block is chosen."""

    BLOCK_MAX_CEIL = "block_max_ceil"  # k_B = ceil(max_{j in B} t_j): block max payload in (3, 6]
    ROW_ANCHOR = "row_anchor"  # k_B = 0: every block anchored at the running row max


class Normalization(enum.Enum):
    """Which weights the softmax denominator sums."""

    CONSISTENT = "consistent"  # the represented weights the PV product consumes (Direct-P)
    MISMATCHED = "mismatched"  # the unquantized float32 weights (HAO, Sage, cuDNN, Attn-QAT)
    EXACT = "exact"  # unquantized p in numerator and denominator: P is not quantized at all


class Exp2Kind(enum.Enum):
    """Model of the hardware exp2."""

    CORRECTLY_ROUNDED = "correctly_rounded"  # float32 exp2 correctly rounded, FTZ output
    FA4_POLY = "fa4_poly"  # FA4's degree-3 polynomial emulation on the scheduled pairs


def _check_float(owner: str, name: str, value: Any, *, positive: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError(f"{owner}.{name}={value!r} must be a finite float")
    if positive and value <= 0:
        raise ValueError(f"{owner}.{name}={value!r} must be > 0")


def _check_enum(owner: str, name: str, value: Any, kind: type[enum.Enum]) -> None:
    if not isinstance(value, kind):
        raise TypeError(
            f"{owner}.{name}={value!r} must be a {kind.__name__} member; "
            f"allowed: {[m.name for m in kind]}"
        )


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Exp2Model:
    """exp2 model. With ``FA4_POLY``, FA4's schedule picks the emulated element pairs: within
    each fragment, the pair starting at even element ``k`` is emulated iff
    ``k mod emulate_freq ≥ emulate_freq − emulate_res`` and the fragment is not among the last
    ``native_last_fragments`` of its tile (FlashAttention-4, github.com/Dao-AILab/flash-attention; defaults 16, 4, 1 give
    25 % emulated). ``emulate_res = emulate_freq`` and ``native_last_fragments = 0`` emulate all.
    """

    kind: Exp2Kind = Exp2Kind.CORRECTLY_ROUNDED
    emulate_freq: int = 16
    emulate_res: int = 4
    native_last_fragments: int = 1

    def __post_init__(self) -> None:
        _check_enum("Exp2Model", "kind", self.kind, Exp2Kind)
        check_int("Exp2Model", "emulate_freq", self.emulate_freq, 2)
        if self.emulate_freq % 2:
            raise ValueError(f"Exp2Model.emulate_freq={self.emulate_freq} must be even (pairs)")
        check_int("Exp2Model", "emulate_res", self.emulate_res, 0, self.emulate_freq)
        check_int("Exp2Model", "native_last_fragments", self.native_last_fragments, 0)


class _ConverterFacts:
    """The constants every converter declares (used by the forward, the backward's rebuild of P
    and the kernels, instead of rediscovering them): :meth:`factor_exp`, the fixed power of two
    of its P values (``−log2`` of a fixed P scale), and :meth:`unit`, the constant ratio between
    its MMA units and probabilities."""

    __slots__ = ()

    def factor_exp(self, p_format: PFormat) -> int:
        """The constant power-of-two exponent applied to every P value (0 unless a fixed scale)."""
        return 0

    def unit(self, p_format: PFormat) -> float:
        """Constant ratio between the converter's MMA units (``values · 2^exps · 2^factor_exp``)
        and probabilities: the payload divisor of ``p_format`` (6 for MXFP4) unless the
        converter scales P by a constant of its own."""
        return p_format.divisor


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ExactP(_ConverterFacts):
    """exp2 (per :class:`Exp2Model`) then round-to-nearest-even into the P format."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class AffineP(_ConverterFacts):
    """Direct-P affine classifier ``payload = RN_E2M1_sat(max(0, a·x + b))`` (Hardware-Aware FP4 FlashAttention-4 (arXiv:2609.04105)).

    ``x = fl(t + fl(log2(6) − k_B))``; ``a·x + b`` is evaluated as ``fl(fl(a·x) + b)``.
    """

    a: float = 1.5
    b: float = 1.2

    def __post_init__(self) -> None:
        _check_float("AffineP", "a", self.a, positive=True)
        _check_float("AffineP", "b", self.b)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class MitchellP(_ConverterFacts):
    """Mitchell-P: ``y = fl(x − shift)``, value ``bitcast_f32(floor(y·2^23) + 127·2^23)``
    (= ``2^floor(y)·(1 + frac(y))``), then ``RN_E2M1_sat`` (FLAMIA)."""

    shift: float = MITCHELL_BOUNDARY_SHIFT

    def __post_init__(self) -> None:
        _check_float("MitchellP", "shift", self.shift)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class SchraudolphP(_ConverterFacts):
    """Schraudolph's integer exp2 for 8/16-bit P (N. Schraudolph, Neural Computation 11(4), 1999): the code bit pattern is
    ``floor(2^mbits·(t + scale_log2 − shift)) + bias·2^mbits`` clamped to [0, largest finite],
    for P in BF16 (mbits 7, bias 127) or E4M3 (mbits 3, bias 7). ``scale_log2`` is a fixed
    power-of-two scale on P (FA4 FP8 uses +8); the PV product divides it out exactly.
    """

    shift: float = SCHRAUDOLPH_ZERO_MEAN_SHIFT
    scale_log2: int = 0

    def __post_init__(self) -> None:
        _check_float("SchraudolphP", "shift", self.shift)
        check_int("SchraudolphP", "scale_log2", self.scale_log2, -64, 64)

    def factor_exp(self, p_format: PFormat) -> int:
        return -self.scale_log2


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class LogGroupP(_ConverterFacts):
    """HAO's log-domain group quantizer (github.com/hao-ai-lab/flash-attention-fp4). ``offset`` log2(6) (NVFP4 P) or log2(448)
    (MXFP8 P) is implied by the P format; ``clamp`` is the fully-masked-group guard (−100)."""

    clamp: float = -100.0

    def __post_init__(self) -> None:
        _check_float("LogGroupP", "clamp", self.clamp)

    def unit(self, p_format: PFormat) -> float:
        """6 (NVFP4 P: payloads scaled to the E2M1 max) or 448 (MXFP8 P: to the E4M3 max)."""
        return 6.0 if p_format is PFormat.NVFP4 else 448.0


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class SageTwoLevelP(_ConverterFacts):
    """SageAttention3's two-level P quantizer (arXiv:2505.11594): row factor 448·6, per-16 E4M3 scale."""

    def unit(self, p_format: PFormat) -> float:
        """2688 = 448·6: P is scaled by the row factor before its two-level quantization."""
        return 2688.0


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class FixedScaleP(_ConverterFacts):
    """cuDNN's fixed-scale FP8 P (github.com/NVIDIA/cudnn-frontend): ``E4M3(p·scale)``; ``scale`` a power of two."""

    scale: float = 16.0

    def __post_init__(self) -> None:
        _check_float("FixedScaleP", "scale", self.scale, positive=True)
        m, _ = math.frexp(self.scale)
        if m != 0.5:
            raise ValueError(f"FixedScaleP.scale={self.scale!r} must be a power of two")

    def factor_exp(self, p_format: PFormat) -> int:
        return -int(round(math.log2(self.scale)))


Converter = ExactP | AffineP | MitchellP | SchraudolphP | LogGroupP | SageTwoLevelP | FixedScaleP
CONVERTER_TYPES = (ExactP, AffineP, MitchellP, SchraudolphP, LogGroupP, SageTwoLevelP, FixedScaleP)

# Which P formats each converter can produce.
_CONVERTER_P_FORMATS: dict[type, tuple[PFormat, ...]] = {
    ExactP: tuple(PFormat),
    AffineP: (PFormat.MXFP4,),
    MitchellP: (PFormat.MXFP4,),
    SchraudolphP: (PFormat.BF16, PFormat.FP8),
    LogGroupP: (PFormat.NVFP4, PFormat.MXFP8),
    SageTwoLevelP: (PFormat.NVFP4,),
    FixedScaleP: (PFormat.FP8,),
}


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class AttentionRecipe:
    """One low-precision attention forward (see the module docstring for every field)."""

    qk: QKFormat = QKFormat.NVFP4
    qk_global: QKGlobalScale = QKGlobalScale.NONE
    converter: Converter = AffineP()
    p_format: PFormat = PFormat.MXFP4
    block_exponent: BlockExponent = BlockExponent.BLOCK_MAX_CEIL
    v: VFormat = VFormat.MXFP4_TOKENS
    normalization: Normalization = Normalization.CONSISTENT
    block_q: int = 128
    block_kv: int = 128
    fragment: int = 32
    pv_group: int = 64
    exp2: Exp2Model = Exp2Model()
    rescale_threshold: float = 0.0
    hadamard: bool = False

    def __post_init__(self) -> None:
        own = "AttentionRecipe"
        _check_enum(own, "qk", self.qk, QKFormat)
        _check_enum(own, "qk_global", self.qk_global, QKGlobalScale)
        _check_enum(own, "p_format", self.p_format, PFormat)
        _check_enum(own, "block_exponent", self.block_exponent, BlockExponent)
        _check_enum(own, "v", self.v, VFormat)
        _check_enum(own, "normalization", self.normalization, Normalization)
        if not isinstance(self.converter, CONVERTER_TYPES):
            raise TypeError(
                f"{own}.converter={self.converter!r} must be one of "
                f"{[t.__name__ for t in CONVERTER_TYPES]}"
            )
        allowed = _CONVERTER_P_FORMATS[type(self.converter)]
        if self.p_format not in allowed:
            raise ValueError(
                f"{own}: converter {type(self.converter).__name__} cannot produce "
                f"p_format={self.p_format.name}; allowed: {[f.name for f in allowed]}"
            )
        if self.p_format is PFormat.FLOAT32 and self.normalization is Normalization.MISMATCHED:
            raise ValueError(
                f"{own}: normalization=MISMATCHED needs a quantized P; "
                f"p_format=FLOAT32 allows CONSISTENT or EXACT"
            )
        if not isinstance(self.exp2, Exp2Model):
            raise TypeError(f"{own}.exp2={self.exp2!r} must be an Exp2Model")
        for name in ("block_q", "block_kv", "fragment", "pv_group"):
            check_int(own, name, getattr(self, name), 1)
        pb = max(
            self.p_format.block,
            32
            if self.v in (VFormat.MXFP8_TOKENS, VFormat.MXFP4_TOKENS, VFormat.TOKEN_BLOCK_FP8)
            else 1,
            16 if self.v is VFormat.NVFP4_TOKENS else 1,
        )
        if self.fragment % pb:
            raise ValueError(
                f"{own}.fragment={self.fragment} must be a multiple of the P/V scale block {pb}"
            )
        if self.pv_group % pb:
            raise ValueError(
                f"{own}.pv_group={self.pv_group} must be a multiple of the P/V scale block {pb}"
            )
        if self.block_kv % self.fragment or self.block_kv % self.pv_group:
            raise ValueError(
                f"{own}.block_kv={self.block_kv} must be a multiple of fragment="
                f"{self.fragment} and pv_group={self.pv_group}"
            )
        _check_float(own, "rescale_threshold", self.rescale_threshold)
        if self.rescale_threshold < 0:
            raise ValueError(f"{own}.rescale_threshold={self.rescale_threshold!r} must be >= 0")
        if isinstance(self.converter, FixedScaleP):
            limit = math.log2(448.0 / self.converter.scale)
            if self.rescale_threshold > limit:
                raise ValueError(
                    f"{own}.rescale_threshold={self.rescale_threshold} lets "
                    f"p·{self.converter.scale} exceed E4M3's 448; allowed <= {limit:.3f}"
                )
        if not isinstance(self.hadamard, bool):
            raise TypeError(f"{own}.hadamard={self.hadamard!r} must be a bool")
        if self.normalization is Normalization.EXACT and self.p_format is not PFormat.FLOAT32:
            raise ValueError(
                f"{own}: normalization=EXACT means unquantized P in numerator and "
                f"denominator; it needs p_format=FLOAT32, not {self.p_format.name}"
            )
        if self.qk_global is not QKGlobalScale.NONE and self.qk is not QKFormat.NVFP4:
            raise ValueError(
                f"{own}.qk_global={self.qk_global.name} applies only to "
                f"qk=NVFP4, not {self.qk.name}"
            )

    @property
    def qk_block(self) -> int:
        """Head-dim elements per Q/K scale group (the head dim must be a multiple)."""
        return {QKFormat.MXFP8: 32, QKFormat.NVFP4: 16}.get(self.qk, 1)

    @property
    def qk_scaling(self) -> OperandScaling:
        """The :class:`~fp4sim.attention.operands.OperandScaling` of ``qk`` with ``qk_global``, as
        :func:`fp4sim.attention.forward.quantize_qk` applies it (blocks along the head dim)."""
        fmt = self.qk
        if fmt is QKFormat.FLOAT32:
            return ops.FLOAT32
        if fmt is QKFormat.BF16:
            return ops.BF16_CAST  # element-wise rounding: no scale at all
        if fmt is QKFormat.FP8_PER_TENSOR:  # one FP32 factor over the tensor, no block scale
            return ops.FP8_PER_TENSOR_QK
        if fmt is QKFormat.MXFP8:
            return ops.MXFP8_HEAD_DIM
        if fmt is QKFormat.TOKEN_BLOCK_FP8:
            return ops.TOKEN_BLOCK_POW2
        return {
            QKGlobalScale.NONE: ops.NVFP4_HEAD_DIM,
            QKGlobalScale.PER_TENSOR: ops.NVFP4_HEAD_DIM_PER_TENSOR,
            QKGlobalScale.PER_TOKEN: ops.NVFP4_HEAD_DIM_PER_TOKEN,
        }[self.qk_global]

    @property
    def v_scaling(self) -> OperandScaling:
        """The :class:`~fp4sim.attention.operands.OperandScaling` of ``v``, as
        :func:`fp4sim.attention.forward.quantize_v` applies it (blocks along tokens).
        ``FLOAT32`` and ``BF16`` have no scale; ``MXFP4_TOKENS`` is Direct-P's amplitude rule
        (``operands.DIRECT_P_V``: ``blocks.MXFP4_AMPLITUDE``, value β·q/6)."""
        fmt = self.v
        if fmt is VFormat.FLOAT32:
            return ops.FLOAT32
        if fmt is VFormat.BF16:
            return ops.BF16_CAST
        return ops.V_SCALINGS[fmt.name]

    @property
    def v_block(self) -> int:
        """Tokens per V scale group along the key axis (1 if V has no token groups)."""
        return {
            VFormat.MXFP8_TOKENS: 32,
            VFormat.MXFP4_TOKENS: 32,
            VFormat.NVFP4_TOKENS: 16,
            VFormat.TOKEN_BLOCK_FP8: 32,
        }.get(self.v, 1)

    def replace(self, **changes: Any) -> AttentionRecipe:
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)


# --- named presets for the published routes ------------------------------------------------
EXACT_F32 = AttentionRecipe(
    qk=QKFormat.FLOAT32,
    converter=ExactP(),
    p_format=PFormat.FLOAT32,
    v=VFormat.FLOAT32,
    normalization=Normalization.EXACT,
)
"""Every format float32: converges to the float64 reference up to float32 rounding."""

HW_FP4_DIRECT_P = AttentionRecipe()
"""The fast forward of Hardware-Aware FP4 FlashAttention-4 (arXiv:2609.04105): NVFP4 Q/K, Direct-P affine (1.5, 1.2) into MXFP4 P with
``k_B = ceil(block max)``, MXFP4 V along tokens (β·q/6), consistent normalization."""

HW_FP4_DIRECT_P_MITCHELL = AttentionRecipe(converter=MitchellP())
"""The same route with the Mitchell-P converter (98.7 % code match, as published)."""

HW_FP4_FP8_PV = AttentionRecipe(
    converter=ExactP(), p_format=PFormat.MXFP8, v=VFormat.TOKEN_BLOCK_FP8
)
"""The HW-FP4 paper's retained FP8 P/V route: NVFP4 Q/K, exact P in E4M3 with UE8M0 per 32
keys, V E4M3 with one power-of-two exponent per 32 tokens, consistent normalization."""

HAO_LOG_NVFP4 = AttentionRecipe(
    qk_global=QKGlobalScale.PER_TENSOR,
    converter=LogGroupP(),
    p_format=PFormat.NVFP4,
    v=VFormat.NVFP4_TOKENS,
    normalization=Normalization.MISMATCHED,
)
"""HAO flash-attention-fp4, NVFP4 Q/K with per-tensor global factor, log-domain NVFP4 P,
NVFP4 V, mismatched normalizer (from its code)."""

HAO_LOG_MXFP8 = AttentionRecipe(
    qk=QKFormat.MXFP8,
    converter=LogGroupP(),
    p_format=PFormat.MXFP8,
    v=VFormat.MXFP8_TOKENS,
    normalization=Normalization.MISMATCHED,
)
"""HAO flash-attention-fp4, MXFP8 Q/K, log-domain MXFP8 P, MXFP8 V, mismatched (from its code)."""

SAGE3_TWO_LEVEL = AttentionRecipe(
    converter=SageTwoLevelP(),
    p_format=PFormat.NVFP4,
    v=VFormat.NVFP4_TOKENS,
    normalization=Normalization.MISMATCHED,
)
"""SageAttention3 (arXiv:2505.11594, from its code): NVFP4 Q/K without global factor (its Q/K smoothing is not
modelled), two-level NVFP4 P, NVFP4 V along tokens, mismatched normalizer."""

CUDNN_FP8_FIXED = AttentionRecipe(
    qk=QKFormat.MXFP8,
    converter=FixedScaleP(scale=16.0),
    p_format=PFormat.FP8,
    v=VFormat.MXFP8_TOKENS,
    normalization=Normalization.MISMATCHED,
    rescale_threshold=4.0,
)
"""cuDNN MXFP8 SDPA reference (github.com/NVIDIA/cudnn-frontend, from its code): MXFP8 Q/K/V, P = E4M3(16·p) with rescale threshold 4,
mismatched normalizer."""

FLAMIA_MXFP8 = AttentionRecipe(
    qk=QKFormat.MXFP8, converter=ExactP(), p_format=PFormat.MXFP8, v=VFormat.TOKEN_BLOCK_FP8
)
"""FLAMIA MXFP8 route (as described; fp4sim's reconstruction): MXFP8 Q/K (per token), exact MXFP8 P, token-block V,
consistent normalization."""

FLAMIA_NVFP4 = AttentionRecipe(
    qk_global=QKGlobalScale.PER_TOKEN,
    converter=ExactP(),
    p_format=PFormat.NVFP4,
    v=VFormat.TOKEN_BLOCK_FP8,
)
"""FLAMIA NVFP4 route (as described; fp4sim's reconstruction): NVFP4 Q/K with per-token global factor, exact NVFP4
P, token-block V, consistent normalization."""

PRESETS: dict[str, AttentionRecipe] = {
    "exact_f32": EXACT_F32,
    "hw_fp4_direct_p": HW_FP4_DIRECT_P,
    "hw_fp4_direct_p_mitchell": HW_FP4_DIRECT_P_MITCHELL,
    "hw_fp4_fp8_pv": HW_FP4_FP8_PV,
    "hao_log_nvfp4": HAO_LOG_NVFP4,
    "hao_log_mxfp8": HAO_LOG_MXFP8,
    "sage3_two_level": SAGE3_TWO_LEVEL,
    "cudnn_fp8_fixed": CUDNN_FP8_FIXED,
    "flamia_mxfp8": FLAMIA_MXFP8,
    "flamia_nvfp4": FLAMIA_NVFP4,
}


def preset_by_name(name: str) -> AttentionRecipe:
    """The preset called ``name`` (case-insensitive), for CLIs and reports."""
    key = str(name).lower()
    if key not in PRESETS:
        raise ValueError(f"preset={name!r} is unknown; allowed: {sorted(PRESETS)}")
    return PRESETS[key]


# --- training recipes: the forward plus every backward format --------------------------------
class DeltaSource(enum.Enum):
    """Which dO and which O the row term ``D = rowsum(dO ∘ O)`` uses."""

    QUANTIZED_D_OUT = "quantized_d_out"  # the same quantized dO copy as dP, the forward's O
    FLOAT_D_OUT = "float_d_out"  # the float32 dO while dP uses the quantized copy (a mismatch)
    HIGH_PRECISION_OUTPUT = "high_precision_output"  # quantized dO, and O_hp = Σ p V̂ / Σ p from
    #                                                  the unquantized p (Attn-QAT principle 2)


class DsProbabilities(enum.Enum):
    """Which P the softmax gradient ``dS = P ∘ (dP − D)`` uses."""

    REPRESENTED = "represented"  # the forward's P̃, rebuilt bit for bit (Direct-P)
    HIGH_PRECISION = "high_precision"  # p = 2^(u − LSE₂), unquantized (Attn-QAT)


class BackwardAccumulation(enum.Enum):
    """How the backward's float32 matrix products accumulate."""

    SEQUENTIAL = "sequential"  # fl(fl(a·b) + acc) term by term in contraction order, flushed:
    #                            the same bits on NumPy and under jit (the emulator's spec)
    BACKEND = "backend"  # the backend's matmul (BLAS / XLA dot): fast, last bits backend-dependent


class ForwardAccumulation(enum.Enum):
    """How the forward's two tensor-core products (scores, PV) accumulate."""

    SEQUENTIAL = "sequential"  # the forward's spec (fp4sim.attention.forward, steps 1 and 4):
    #                            exact block partials or float32 sums in contraction order,
    #                            flushed; what the Hopper kernels' tile math follows
    TCGEN05 = "tcgen05"  # Blackwell's block-scaled tcgen05.mma (fp4sim.formats.mma): S = one
    #                      instruction chain over the head dim, each tile's P·V one chain over
    #                      its keys from a zero accumulator (what fp4sim's sm_100a bodies issue)


def _check_scaling(owner: str, name: str, value: Any) -> None:
    if not isinstance(value, OperandScaling):
        raise TypeError(
            f"{owner}.{name}={value!r} must be an OperandScaling (see fp4sim.attention.causal)"
        )


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class TrainingRecipe:
    """One low-precision attention *training* step: the forward recipe plus every backward format.

    ``forward`` is the :class:`~fp4sim.attention.recipe.AttentionRecipe` whose Q/K format
    (``qk``, ``qk_global``: quantized along the head dimension by
    :func:`fp4sim.attention.forward.quantize_qk`), converter, P format, normalization, tiling
    and exp2 model make the forward; its ``v`` must be ``FLOAT32`` because the training path
    quantizes V itself with ``v`` (:class:`~fp4sim.attention.operands.OperandScaling`: it needs
    token-axis options that ``VFormat`` lacks — OCP floor, per-token, per-tensor — and
    document-aligned groups). Backward formats: ``d_out`` (the one quantized dO copy for dV and
    dP), ``p_backward`` (P as the dV operand, rows = queries), ``ds`` (the dQ/dK operand).
    ``delta`` chooses the dO and O in ``D = rowsum(dO ∘ O)``, ``ds_probabilities`` the P in
    ``dS = P ∘ (dP − D)`` (:class:`DsProbabilities`; Attn-QAT uses unquantized p there and
    ``D`` from the high-precision output); ``accumulation`` the float32 order of the
    backward's products (:class:`BackwardAccumulation`). ``dq`` (optional) quantizes the dQ
    output (e.g. for communication); under a causal mask its scale must be per query row
    (:func:`fp4sim.attention.causal.leak_class`). ``rebuild`` is the recipe the backward
    rebuilds P with: ``None`` means the forward's own (bit-identical P, the matched case);
    anything else is a deliberate mismatch (:mod:`fp4sim.attention.consistency`); it must keep
    the forward's Q/K format. ``segment_aligned``: with segment ids, scale groups that span
    tokens are split at document boundaries (a document never shares a scale with another).
    Hashable: a static ``jax.jit`` argument.
    """

    name: str
    forward: AttentionRecipe
    v: OperandScaling
    d_out: OperandScaling
    p_backward: OperandScaling
    ds: OperandScaling
    delta: DeltaSource = DeltaSource.QUANTIZED_D_OUT
    rebuild: AttentionRecipe | None = None
    segment_aligned: bool = True
    accumulation: BackwardAccumulation = BackwardAccumulation.SEQUENTIAL
    ds_probabilities: DsProbabilities = DsProbabilities.REPRESENTED
    dq: OperandScaling | None = None

    def __post_init__(self) -> None:
        own = "TrainingRecipe"
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"{own}.name={self.name!r} must be a non-empty str")
        for field in ("forward", "rebuild"):
            value = getattr(self, field)
            if value is None and field == "rebuild":
                continue
            if not isinstance(value, AttentionRecipe):
                raise TypeError(f"{own}.{field}={value!r} must be an AttentionRecipe")
            if value.v is not VFormat.FLOAT32:
                raise ValueError(
                    f"{own}.{field} has v={value.v.name}; the training path "
                    f"quantizes V itself (field v), so it must be FLOAT32"
                )
            if value.hadamard:
                raise ValueError(
                    f"{own}.{field}.hadamard=True is not supported by the training "
                    f"path (dQ/dK would need the inverse rotation); allowed: False"
                )
        if self.rebuild is not None and (self.rebuild.qk, self.rebuild.qk_global) != (
            self.forward.qk,
            self.forward.qk_global,
        ):
            raise ValueError(
                f"{own}.rebuild must keep the forward's Q/K format "
                f"{self.forward.qk.name}/{self.forward.qk_global.name} (the backward "
                f"reuses the saved quantized Q/K); got {self.rebuild.qk.name}/"
                f"{self.rebuild.qk_global.name}"
            )
        for field in ("v", "d_out", "p_backward", "ds"):
            _check_scaling(own, field, getattr(self, field))
        if self.dq is not None:
            _check_scaling(own, "dq", self.dq)
        if not isinstance(self.delta, DeltaSource):
            raise TypeError(
                f"{own}.delta={self.delta!r} must be a DeltaSource; allowed: "
                f"{[m.name for m in DeltaSource]}"
            )
        if not isinstance(self.segment_aligned, bool):
            raise TypeError(f"{own}.segment_aligned={self.segment_aligned!r} must be a bool")
        if not isinstance(self.ds_probabilities, DsProbabilities):
            raise TypeError(
                f"{own}.ds_probabilities={self.ds_probabilities!r} must be a "
                f"DsProbabilities; allowed: {[m.name for m in DsProbabilities]}"
            )
        if not isinstance(self.accumulation, BackwardAccumulation):
            raise TypeError(
                f"{own}.accumulation={self.accumulation!r} must be a "
                f"BackwardAccumulation; "
                f"allowed: {[m.name for m in BackwardAccumulation]}"
            )

    @property
    def rebuild_recipe(self) -> AttentionRecipe:
        """The recipe the backward rebuilds P with (the forward's unless a mismatch is set)."""
        return self.forward if self.rebuild is None else self.rebuild

    @property
    def qk(self) -> OperandScaling:
        """The Q/K scaling of the forward as an :class:`~fp4sim.attention.operands.OperandScaling`
        (for the leak classification and the probe's scale check)."""
        return self.forward.qk_scaling

    def replace(self, **changes: Any) -> TrainingRecipe:
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)


# --- named training recipes -----------------------------------------------------------------
P_MXFP8_KEYS = ops.OperandScaling(name="P MXFP8 32 keys", fmt=MXFP8_E4M3, axis=-1)
"""P as the dV operand: E4M3 with one UE8M0 (rounded up) per 32 keys of a query row."""

_F32_FWD = AttentionRecipe(
    qk=QKFormat.FLOAT32,
    converter=ExactP(),
    p_format=PFormat.FLOAT32,
    v=VFormat.FLOAT32,
    normalization=Normalization.EXACT,
    block_kv=64,
    pv_group=32,
)
_FP8_P_FWD = AttentionRecipe(
    qk=QKFormat.NVFP4,
    converter=ExactP(),
    p_format=PFormat.MXFP8,
    v=VFormat.FLOAT32,
    normalization=Normalization.CONSISTENT,
    block_kv=64,
)
_FP4_P_FWD = _FP8_P_FWD.replace(p_format=PFormat.MXFP4)


def _route(
    name: str,
    fwd: AttentionRecipe,
    *,
    v: OperandScaling = ops.TOKEN_BLOCK_POW2,
    d_out: OperandScaling = ops.E5M2_CAST,
    p_backward: OperandScaling = P_MXFP8_KEYS,
    ds: OperandScaling = ops.DS_SQUARE_RCEIL,
    delta: DeltaSource = DeltaSource.QUANTIZED_D_OUT,
) -> TrainingRecipe:
    return TrainingRecipe(
        name=name, forward=fwd, v=v, d_out=d_out, p_backward=p_backward, ds=ds, delta=delta
    )


TRAINING_PRESETS: dict[str, TrainingRecipe] = {
    "float32": _route(
        "float32",
        _F32_FWD,
        v=ops.FLOAT32,
        d_out=ops.FLOAT32,
        p_backward=ops.FLOAT32,
        ds=ops.FLOAT32,
    ),
    "direct_p_fp8_training": _route("direct_p_fp8_training", _FP8_P_FWD),
    "direct_p_fp4_forward": _route("direct_p_fp4_forward", _FP4_P_FWD),
    "direct_p_affine_fp4": _route("direct_p_affine_fp4", _FP4_P_FWD.replace(converter=AffineP())),
    "flamia_mxfp8_training": _route("flamia_mxfp8_training", _FP8_P_FWD.replace(qk=QKFormat.MXFP8)),
    "cudnn_mxfp8_like": _route(
        "cudnn_mxfp8_like",
        AttentionRecipe(
            qk=QKFormat.MXFP8,
            converter=FixedScaleP(scale=16.0),
            p_format=PFormat.FP8,
            v=VFormat.FLOAT32,
            normalization=Normalization.MISMATCHED,
            rescale_threshold=4.0,
            block_kv=64,
        ),
        v=ops.MXFP8_TOKENS_RCEIL,
        d_out=ops.MXFP8_HEAD_DIM,
        ds=ops.OperandScaling(name="dS MXFP8 32 keys", fmt=MXFP8_E4M3, axis=-1),
    ),
    "attn_qat_nvfp4": TrainingRecipe(
        name="attn_qat_nvfp4",
        forward=AttentionRecipe(
            qk=QKFormat.NVFP4,
            converter=ExactP(),
            p_format=PFormat.NVFP4,
            v=VFormat.FLOAT32,
            normalization=Normalization.MISMATCHED,
            block_kv=64,
        ),
        v=ops.NVFP4_HEAD_DIM,
        d_out=ops.FLOAT32,
        p_backward=ops.FLOAT32,
        ds=ops.FLOAT32,
        delta=DeltaSource.HIGH_PRECISION_OUTPUT,
        ds_probabilities=DsProbabilities.HIGH_PRECISION,
    ),
}
"""Training routes (forward + backward formats), key tiles of 64:

* ``float32`` — every format float32: matches the float64 reference to float32 accuracy.
* ``direct_p_fp8_training`` — the FP8 P/V training route of Hardware-Aware FP4 FlashAttention-4 (arXiv:2609.04105) and FLAMIA: NVFP4 Q/K per token (UE4M3, no FP32
  factor), exact MXFP8 P, consistent normalization, token-block (32 × D, power of two) E4M3 V,
  E5M2 dO, MXFP8 P (32 keys) for dV, 32×32 power-of-two E4M3 dS.
* ``direct_p_fp4_forward`` — the same with 4-bit P (Direct-P, exact converter, MXFP4) forward.
* ``direct_p_affine_fp4`` — the same with the affine Direct-P classifier (1.5x + 1.2).
* ``flamia_mxfp8_training`` (as described; reconstructed) — MXFP8 Q/K, otherwise as the FP8 route.
* ``cudnn_mxfp8_like`` (from cuDNN's code, approximated) — MXFP8 Q/K/V (V per 32 tokens, RCEIL), P = E4M3(16p)
  with rescale threshold 4 and the mismatched normalizer, MXFP8 dO, dS 1×32 along keys (one copy
  for dQ and dK here; cuDNN keeps a second copy along queries for dK).
* ``attn_qat_nvfp4`` (from its code, approximated) — Attn-QAT (arXiv:2603.00040): NVFP4 Q/K/V (V per token along the head
  dim), NVFP4 P (16 keys, UE4M3, exact exp2) with the mismatched normalizer; backward: dV from
  the forward's quantized P, dS from the *unquantized* p with ``D = rowsum(dO ∘ O_hp)`` (its
  principle 2); dO and dS float32 (BF16 in the original).

Measured gradient error (rel-L2 of dQ, dK, dV vs float64; Gaussian Q/K/V/dO, N = 128,
d = 64, causal, seed 0, NumPy): float32 3.1e-7 / 3.6e-7 / 3.0e-7; direct_p_fp8_training
0.171 / 0.173 / 0.120; direct_p_fp4_forward 0.218 / 0.223 / 0.155; direct_p_affine_fp4
0.350 / 0.359 / 0.304; flamia_mxfp8_training 0.080 / 0.081 / 0.068; cudnn_mxfp8_like
0.062 / 0.063 / 0.051; attn_qat_nvfp4 0.181 / 0.186 / 0.135. The NVFP4 Q/K routes are dominated by E2M1 Q/K (unit roundoff 2^-2).
"""


def _leak_row(
    name: str, v: ops.OperandScaling, ds: ops.OperandScaling = ops.DS_PER_ROW
) -> TrainingRecipe:
    return _route(name, _FP4_P_FWD, v=v, ds=ds)


LEAK_TABLE: dict[str, TrainingRecipe] = {
    "V unquantized": _leak_row("V unquantized", ops.FLOAT32),
    "V per-token pow2 (exact option)": _leak_row(
        "V per-token pow2 (exact option)", ops.PER_TOKEN_POW2
    ),
    "V token-block 32xD ceil E4M3": _leak_row("V token-block 32xD ceil E4M3", ops.TOKEN_BLOCK_POW2),
    "V MXFP8 32-token RCEIL": _leak_row("V MXFP8 32-token RCEIL", ops.MXFP8_TOKENS_RCEIL),
    "V MXFP8 32-token OCP floor": _leak_row("V MXFP8 32-token OCP floor", ops.MXFP8_TOKENS_FLOOR),
    "V MXFP4 32-token": _leak_row("V MXFP4 32-token", ops.MXFP4_TOKENS_RCEIL),
    "V NVFP4 16-token": _leak_row("V NVFP4 16-token", ops.NVFP4_TOKENS),
    "V per-tensor FP8 amax/448": _leak_row("V per-tensor FP8 amax/448", ops.FP8_PER_TENSOR_AMAX),
    "V per-tensor pow2": _leak_row("V per-tensor pow2", ops.PER_TENSOR_POW2),
    "dS 32x32 floor (V per-token)": _leak_row(
        "dS 32x32 floor (V per-token)", ops.PER_TOKEN_POW2, ops.DS_SQUARE_FLOOR
    ),
}
"""The configurations of FLAMIA's leak table in order: NVFP4 Q/K per token (UE4M3, no FP32 factor),
exact MXFP4 P with consistent normalization, E5M2 dO, the listed V scaling, and the exact
per-query-row dS option (except the last row, which uses 32×32 OCP-floor dS tiles)."""


def training_preset(name: str) -> TrainingRecipe:
    """The :data:`TRAINING_PRESETS` or :data:`LEAK_TABLE` entry called ``name``."""
    for table in (TRAINING_PRESETS, LEAK_TABLE):
        if name in table:
            return table[name]
    raise ValueError(
        f"recipe={name!r} is unknown; allowed: {sorted(TRAINING_PRESETS) + sorted(LEAK_TABLE)}"
    )

"""Named block formats that reproduce other libraries' quantizers bit for bit where they differ.

This module owns the mapping "library X's quantizer" →
:class:`~fp4sim.formats.blocks.BlockFormat`.
Each preset is an ordinary frozen ``BlockFormat``; pass it to
:func:`~fp4sim.formats.blocks.quantize`. What each imitates (and how the test suite checks it):

``OCP_MXFP4`` … ``OCP_MXFP8_E5M2`` — the OCP MX v1.0 specification's reference conversion as implemented by
    microsoft/microxcaling (``mx/mx_ops.py``): ``ScaleRule.FLOOR`` (block maxima above ``M·2^e``
    clamp to ``±M``), elements rounded to nearest with ties **away** from zero (microxcaling's
    default ``round='nearest'``), saturating. Checked against an independent float64 transcription
    of microxcaling's algorithm in the tests (microxcaling is not installable here).
``TORCHAO_MX[(elem, rule)]`` — torchao 0.18 ``to_mx`` with ``ScaleCalculationMode`` FLOOR, RCEIL,
    CEIL, EVEN: RNE, saturating, NaN blocks → 0xFF, Inf blocks → the formula's code (247 for
    E4M3 FLOOR, 254 for RCEIL). Element codes of NaN inputs differ (torchao: 0x3 for E2M1);
    the NaN scale makes the block NaN either way. Checked against stored torchao vectors
    (``fp4sim/golden/data/presets/torchao_mx_*.npz``).
``TORCHAO_NVFP4`` / ``TORCHAO_NVFP4_SINGLE`` — torchao ``nvfp4_quantize`` with a per-tensor scale
    ``amax/2688`` (decode form) / without one: block scale ``(amax_b/6)/g`` clamped to
    [2^-6, 448] then RNE to E4M3; elements ``x · ((1/g)/s)``. Checked against stored vectors.
``TE_MXFP8`` / ``TE_NVFP4`` — TransformerEngine's MXFP8 kernels / ``NVFP4QuantizerRef``: RCEIL via
    ``amax·fl(1/448)``, satfinite E8M0 (Inf → 0xFE); NVFP4 ``S_enc = 2688/amax`` (0 → 1),
    ``s = E4M3(amax_b·(S_enc·fl(1/6)))``, elements ``x · fl(1/(s·fl(1/S_enc)))``, NaN → +0 in the
    E2M1 cast (TE's threshold table). One known difference: TE's table sends an input of exactly
    −0.0 to +0 (code 0) but small negatives to −0 (code 8); fp4sim's ``SignedZero.KEEP`` gives −0
    for both. TE itself is not installable here (CUDA build); the tests check this preset against
    an independent NumPy transcription of ``NVFP4QuantizerRef``'s steps.
``JAX_MXFP8`` / ``JAX_NVFP4`` — ``jax._src.cudnn.scaled_matmul_stablehlo.quantize`` as it behaves
    on a GPU (no flush-to-zero): MXFP8 descale ``amax/448`` (true division), NaN blocks → scale
    0x00 (uint8 wrap), Inf blocks → 0xFF; NVFP4 ``x/g`` first, ``s = E4M3(clip(amax/6, 0, 448))``,
    elements ``x/s``. ``JAX_NVFP4`` takes its FP32 decode factor as ``global_scale=`` (JAX's default
    is 1.0). Checked directly against the installed JAX on data without all-zero or subnormal
    blocks (where XLA CPU's flush-to-zero makes JAX's own CPU results NaN).
"""

from __future__ import annotations

from fp4sim.formats.blocks import (
    MXFP4,
    MXFP6_E2M3,
    MXFP6_E3M2,
    MXFP8_E4M3,
    MXFP8_E5M2,
    NVFP4,
    Arithmetic,
    BlockFormat,
    GlobalScale,
    NonFinite,
    ScaleRule,
)
from fp4sim.formats.spec import NanPolicy, Policy, Rounding

__all__ = [
    "OCP_MXFP4",
    "OCP_MXFP6_E2M3",
    "OCP_MXFP6_E3M2",
    "OCP_MXFP8_E4M3",
    "OCP_MXFP8_E5M2",
    "TORCHAO_MX",
    "TORCHAO_NVFP4",
    "TORCHAO_NVFP4_SINGLE",
    "TE_MXFP8",
    "TE_NVFP4",
    "JAX_MXFP8",
    "JAX_NVFP4",
    "BLOCK_PRESETS",
    "preset",
]

_MX = (MXFP4, MXFP6_E2M3, MXFP6_E3M2, MXFP8_E4M3, MXFP8_E5M2)
_AWAY = Policy(rounding=Rounding.NEAREST_AWAY)

OCP_MXFP4, OCP_MXFP6_E2M3, OCP_MXFP6_E3M2, OCP_MXFP8_E4M3, OCP_MXFP8_E5M2 = (
    f.replace(name="OCP_" + f.name, rule=ScaleRule.FLOOR, policy=_AWAY) for f in _MX
)

TORCHAO_MX: dict[tuple[str, ScaleRule], BlockFormat] = {
    (f.elem.name, rule): f.replace(
        name=f"TORCHAO_{f.name}_{rule.name}",
        rule=rule,
        arithmetic=Arithmetic.TORCHAO,
        nonfinite=NonFinite.FORMULA,
    )
    for f in _MX
    for rule in (ScaleRule.FLOOR, ScaleRule.RCEIL, ScaleRule.CEIL, ScaleRule.EVEN)
}

TORCHAO_NVFP4 = NVFP4.replace(
    name="TORCHAO_NVFP4", arithmetic=Arithmetic.TORCHAO, min_scale=float.fromhex("0x1p-6")
)
TORCHAO_NVFP4_SINGLE = TORCHAO_NVFP4.replace(
    name="TORCHAO_NVFP4_SINGLE", global_scale=GlobalScale.NONE
)

TE_MXFP8 = MXFP8_E4M3.replace(name="TE_MXFP8")
TE_NVFP4 = NVFP4.replace(name="TE_NVFP4", policy=Policy(nan=NanPolicy.ZERO))

JAX_MXFP8 = MXFP8_E4M3.replace(name="JAX_MXFP8", arithmetic=Arithmetic.JAX, nonfinite=NonFinite.JAX)
JAX_NVFP4 = NVFP4.replace(
    name="JAX_NVFP4", arithmetic=Arithmetic.JAX, global_scale=GlobalScale.CONSTANT
)

BLOCK_PRESETS: dict[str, BlockFormat] = {
    f.name: f
    for f in (
        OCP_MXFP4,
        OCP_MXFP6_E2M3,
        OCP_MXFP6_E3M2,
        OCP_MXFP8_E4M3,
        OCP_MXFP8_E5M2,
        *TORCHAO_MX.values(),
        TORCHAO_NVFP4,
        TORCHAO_NVFP4_SINGLE,
        TE_MXFP8,
        TE_NVFP4,
        JAX_MXFP8,
        JAX_NVFP4,
    )
}


def preset(name: str) -> BlockFormat:
    """The preset called ``name`` (case-insensitive), for CLIs and manifests."""
    for key, fmt in BLOCK_PRESETS.items():
        if key.lower() == str(name).lower():
            return fmt
    raise ValueError(f"preset={name!r} is unknown; allowed: {sorted(BLOCK_PRESETS)}")

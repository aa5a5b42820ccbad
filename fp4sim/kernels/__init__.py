"""Pallas Mosaic GPU kernels (Hopper sm_90a now; Blackwell sm_100a variants cross-lowered only).

Importing this package does not initialise a GPU backend; kernels are built on first call.
"""

from fp4sim.kernels.attention_mgpu import (
    Ablation,
    DebugTile,
    FP8AttentionConfig,
    FP8Operands,
    OutType,
    PConversion,
    attention_fp8,
    attention_fp8_quantized,
    quantize_operands,
)
from fp4sim.kernels.harness import (
    Arch,
    KernelRaceError,
    cross_lower,
    device_arch,
    gpu_available,
    interpret,
    interpret_params,
    interpreting,
    smem_transforms,
)

__all__: list[str] = [
    "Ablation",
    "DebugTile",
    "FP8AttentionConfig",
    "FP8Operands",
    "OutType",
    "PConversion",
    "attention_fp8",
    "attention_fp8_quantized",
    "quantize_operands",
    "Arch",
    "KernelRaceError",
    "cross_lower",
    "device_arch",
    "gpu_available",
    "interpret",
    "interpret_params",
    "interpreting",
    "smem_transforms",
]

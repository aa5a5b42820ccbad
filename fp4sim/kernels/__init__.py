"""Pallas Mosaic GPU kernels (Hopper sm_90a now; Blackwell sm_100a variants cross-lowered only).

Importing this package does not initialise a GPU backend; kernels are built on first call.
"""

from fp4sim.kernels.attention_bwd_mgpu import (
    BackwardConfig,
    BackwardDebug,
    BackwardResiduals,
    attention_fp8_backward,
    reference_backward,
)
from fp4sim.kernels.attention_directp_mgpu import (
    DirectPConfig,
    DirectPDebug,
    DirectPOperands,
    attention_directp,
    attention_directp_prepared,
)
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
    reference_forward,
)
from fp4sim.kernels.attention_vjp_mgpu import emulator_recipe, fp8_attention
from fp4sim.kernels.decoders import (
    e2m1_to_f16,
    e4m3_to_f16,
    e5m2_to_f16,
    e8m0_exponent,
    e8m0_to_f32,
    ue4m3_to_f32,
    unpack_e2m1,
)
from fp4sim.kernels.quantize_mgpu import (
    QuantKernelConfig,
    gpu_quantize,
    swizzled_scales,
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
    "BackwardConfig",
    "BackwardDebug",
    "BackwardResiduals",
    "attention_fp8_backward",
    "reference_backward",
    "emulator_recipe",
    "fp8_attention",
    "Ablation",
    "DebugTile",
    "DirectPConfig",
    "DirectPDebug",
    "DirectPOperands",
    "attention_directp",
    "attention_directp_prepared",
    "FP8AttentionConfig",
    "FP8Operands",
    "OutType",
    "reference_forward",
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
    "e2m1_to_f16",
    "e4m3_to_f16",
    "e5m2_to_f16",
    "e8m0_exponent",
    "e8m0_to_f32",
    "ue4m3_to_f32",
    "unpack_e2m1",
    "QuantKernelConfig",
    "gpu_quantize",
    "swizzled_scales",
]

"""Pallas Mosaic GPU kernels (Hopper sm_90a now; Blackwell sm_100a variants cross-lowered only).

Importing this package does not initialise a GPU backend; kernels are built on first call.
"""

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

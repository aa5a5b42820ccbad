"""Pallas Mosaic GPU kernels (Hopper sm_90a now; Blackwell sm_100a variants cross-lowered only).

Importing this package does not initialise a GPU backend; kernels are built on first call.
"""

__all__: list[str] = []

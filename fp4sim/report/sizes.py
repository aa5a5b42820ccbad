"""How big each experiment of the report is: :class:`Sizes` and the named sizes.

:data:`QUICK` (CI, well under a minute), :data:`DEFAULT` (``make demo``, a few minutes on two
CPU cores; the 8,000,000-point code-match grid) and :data:`FULL` (longer sequences, more blocks).
"""

from __future__ import annotations

import dataclasses

__all__ = ["Sizes", "QUICK", "DEFAULT", "FULL", "SIZES"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sizes:
    """How big each experiment of the report is. Frozen and hashable (experiments are cached on it)."""

    name: str
    grid_points: int  # deterministic uniform grid of x on [-6, log2 6) for code-match rates
    attn_rows: int  # query rows of the attention-like code-match experiment
    attn_keys: int  # keys per row there
    head_dim: int
    seq_lens: tuple[int, ...]  # error-vs-exact sweep over sequence length
    block_sizes: tuple[int, ...]  # key-tile sizes (block_kv) swept at the middle sequence length
    scale_blocks: int  # blocks of the scale-rule clipping-rate experiment
    leak_tokens: int  # N of the causal-leak probe
    jit_presets: int  # attention presets whose forward is compared NumPy vs jax.jit (compiles)
    seed: int = 20261129

    def __post_init__(self) -> None:
        for f in (
            "grid_points",
            "attn_rows",
            "attn_keys",
            "head_dim",
            "scale_blocks",
            "leak_tokens",
            "jit_presets",
        ):
            v = getattr(self, f)
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"Sizes.{f}={v!r} must be a positive int")
        for f in ("seq_lens", "block_sizes"):
            v = getattr(self, f)
            if (
                not isinstance(v, tuple)
                or not v
                or not all(isinstance(n, int) and n > 0 for n in v)
            ):
                raise ValueError(f"Sizes.{f}={v!r} must be a non-empty tuple of positive ints")


QUICK = Sizes(
    name="quick",
    grid_points=200_000,
    attn_rows=16,
    attn_keys=512,
    head_dim=64,
    seq_lens=(128, 256),
    block_sizes=(64, 128),
    scale_blocks=2_000,
    leak_tokens=128,
    jit_presets=2,
)


DEFAULT = Sizes(
    name="default",
    grid_points=8_000_000,
    attn_rows=256,
    attn_keys=4096,
    head_dim=128,
    seq_lens=(256, 512, 1024),
    block_sizes=(64, 128, 256),
    scale_blocks=20_000,
    leak_tokens=128,
    jit_presets=10,
)


FULL = Sizes(
    name="full",
    grid_points=8_000_000,
    attn_rows=256,
    attn_keys=4096,
    head_dim=128,
    seq_lens=(512, 1024, 2048, 4096),
    block_sizes=(64, 128, 256, 512),
    scale_blocks=200_000,
    leak_tokens=256,
    jit_presets=10,
)


SIZES = {s.name: s for s in (QUICK, DEFAULT, FULL)}

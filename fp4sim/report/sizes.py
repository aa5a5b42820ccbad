"""How big each experiment of the report is: :class:`Sizes` and the named sizes.

:data:`QUICK` (CI, well under a minute), :data:`DEFAULT` (``make demo``, a few minutes on two
CPU cores; the 8,000,000-point code-match grid) and :data:`FULL` (longer sequences, more blocks).
``seeds`` is how many independent random draws the error and code-match tables (and the Direct-P
norm study) average over; :attr:`Sizes.seed_values` are the seeds themselves, the first one
``seed`` (so a one-seed run gives the numbers of the first seed of a longer one).
"""

from __future__ import annotations

import dataclasses
import math

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
    seeds: int  # independent random draws of the error and code-match tables (mean ± std)
    study_seq_len: int  # sequence length of the Direct-P norm study (the article's 1024)
    study_scales: tuple[float, ...]  # score-spread factors of the Direct-P norm study
    seed: int = 20261129

    SEED_STRIDE = 10_000  # seed i is seed + i·SEED_STRIDE (inputs add their length, < 10,000)

    @property
    def seed_values(self) -> tuple[int, ...]:
        """The ``seeds`` seeds: ``seed + i·SEED_STRIDE`` for i = 0 .. seeds − 1."""
        return tuple(self.seed + i * self.SEED_STRIDE for i in range(self.seeds))

    def __post_init__(self) -> None:
        for f in (
            "grid_points",
            "attn_rows",
            "attn_keys",
            "head_dim",
            "scale_blocks",
            "leak_tokens",
            "jit_presets",
            "seeds",
            "study_seq_len",
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
        v = self.study_scales
        if (
            not isinstance(v, tuple)
            or not v
            or not all(
                isinstance(x, (int, float))
                and not isinstance(x, bool)
                and math.isfinite(x)
                and x > 0
                for x in v
            )
        ):
            raise ValueError(
                f"Sizes.study_scales={v!r} must be a non-empty tuple of positive finite floats"
            )
        if any(s >= self.SEED_STRIDE for s in (*self.seq_lens, self.study_seq_len)):
            raise ValueError(
                f"Sizes: sequence lengths {self.seq_lens}, {self.study_seq_len} must be below "
                f"{self.SEED_STRIDE} (the seed stride)"
            )


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
    seeds=2,
    study_seq_len=128,
    study_scales=(1.0, 4.0),
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
    seeds=3,
    study_seq_len=1024,
    study_scales=(0.5, 1.0, 2.0, 3.0, 4.0, 6.0),
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
    seeds=5,
    study_seq_len=1024,
    study_scales=(0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0),
)


SIZES = {s.name: s for s in (QUICK, DEFAULT, FULL)}

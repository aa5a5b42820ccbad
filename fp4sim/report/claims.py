"""What the literature reports, and where: the only numbers of the report typed in by hand.

:data:`SOURCES` names every public source the report cites (paper, repository or specification,
with its address); :func:`cite` renders one as a Markdown link. :data:`EXPECTED` maps a topic to
the values that the report's tables set beside what fp4sim computes: numbers published by a paper
or a library (the table says which, with :func:`cite`), or values that follow in closed form from
the definitions (``12/7``) or from an independent float64 computation, marked "expected".
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["Source", "SOURCES", "cite", "EXPECTED", "PRESET_SOURCES", "preset_source"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Source:
    """A public source: a short name, its full title and its address."""

    short: str
    title: str
    url: str


SOURCES: dict[str, Source] = {
    s.short: s
    for s in (
        Source(
            short="HW-FP4 FA4",
            url="https://arxiv.org/abs/2609.04105",
            title="R. Hu, Hardware-Aware FP4 FlashAttention-4 (Direct-P), arXiv:2609.04105, 2026",
        ),
        Source(
            short="FLAMIA",
            url="https://github.com/yandex-research/flamia-blackwell-attention",
            title="F. Velikonivtsev, M. Koltakov, D. Kuznedelev (Yandex Research), FLAMIA: FLAsh MIcroscaling "
            "Attention for Fast and Causally Safe Training on Blackwell, 2026",
        ),
        Source(
            short="FlashAttention-3",
            url="https://arxiv.org/abs/2407.08608",
            title="J. Shah et al., FlashAttention-3: Fast and Accurate Attention with Asynchrony and "
            "Low-precision, arXiv:2407.08608, 2024",
        ),
        Source(
            short="FlashAttention-4",
            url="https://github.com/Dao-AILab/flash-attention",
            title="FlashAttention-4 (arXiv:2603.05451), the CuTe DSL kernels in Dao-AILab/flash-attention "
            "(flash_attn/cute)",
        ),
        Source(
            short="SageAttention3",
            url="https://arxiv.org/abs/2505.11594",
            title="J. Zhang et al., SageAttention3: Microscaling FP4 Attention for Inference and an "
            "Exploration of 8-bit Training, arXiv:2505.11594 (code: github.com/thu-ml/SageAttention)",
        ),
        Source(
            short="Attn-QAT",
            url="https://arxiv.org/abs/2603.00040",
            title="Attn-QAT, 4-bit attention with quantization-aware training, arXiv:2603.00040 "
            "(FP4 FlashAttention-4 fork: github.com/hao-ai-lab/flash-attention-fp4)",
        ),
        Source(
            short="HAO flash-attention-fp4",
            url="https://github.com/hao-ai-lab/flash-attention-fp4",
            title="hao-ai-lab/flash-attention-fp4, FP4/FP8 FlashAttention-4 fork (README and benchmarks)",
        ),
        Source(
            short="OCP MX v1.0",
            url="https://www.opencompute.org/documents/ocp-microscaling-formats-mx-v1-0-spec-final-pdf",
            title="Open Compute Project, OCP Microscaling Formats (MX) v1.0 Specification, 2023 "
            "(and B. D. Rouhani et al., Microscaling Data Formats for Deep Learning, arXiv:2310.10537)",
        ),
        Source(
            short="microxcaling",
            url="https://github.com/microsoft/microxcaling",
            title="microsoft/microxcaling, the MX reference emulation",
        ),
        Source(
            short="NVFP4",
            url="https://docs.nvidia.com/cuda/parallel-thread-execution/",
            title="NVIDIA PTX ISA (cvt, block-scaled mma) and NVIDIA, Pretraining Large Language Models "
            "with NVFP4, arXiv:2509.25149",
        ),
        Source(
            short="cuDNN",
            url="https://github.com/NVIDIA/cudnn-frontend",
            title="NVIDIA cudnn-frontend (MXFP8 SDPA reference) and the cuDNN BlockScaling documentation",
        ),
        Source(
            short="TransformerEngine",
            url="https://github.com/NVIDIA/TransformerEngine",
            title="NVIDIA TransformerEngine (MXFP8 and NVFP4 recipes)",
        ),
        Source(
            short="torchao",
            url="https://github.com/pytorch/ao",
            title="pytorch/ao (torchao) MX and NVFP4 quantizers",
        ),
        Source(
            short="MMA-Sim",
            url="https://github.com/microsoft/MMA-Sim",
            title="microsoft/MMA-Sim, bit-accurate models of tensor-core matrix multiply-accumulate",
        ),
        Source(
            short="ml_dtypes",
            url="https://github.com/jax-ml/ml_dtypes",
            title="jax-ml/ml_dtypes, NumPy dtypes for FP8/FP6/FP4 formats",
        ),
        Source(
            short="MXFP8 recipe",
            url="https://arxiv.org/abs/2506.08027",
            title="A. Mishra et al., Recipes for Pre-training LLMs with MXFP8, arXiv:2506.08027",
        ),
    )
}


def cite(short: str) -> str:
    """The Markdown link ``[short](url)`` of a source in :data:`SOURCES`."""
    if short not in SOURCES:
        raise ValueError(f"short={short!r} is not a source; allowed: {sorted(SOURCES)}")
    return f"[{short}]({SOURCES[short].url})"


# --- the values set beside fp4sim's (the only numbers typed in by hand) ----------------------------

EXPECTED: dict[str, Any] = {
    # the E2M1 grid (OCP MX v1.0, NVIDIA PTX ISA)
    "e2m1_magnitudes": (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0),
    # two-key example: w = [1, 0.4], alpha = 1 -> represented [1, 1/3]; outputs per V (closed form)
    "norm_weights": (1.0, 0.4),
    "norm_represented": (1.0, 1.0 / 3.0),
    "norm_outputs": {
        (2.0, 2.0): {"EXACT": 2.0, "CONSISTENT": 2.0, "MISMATCHED": 40 / 21},
        (0.0, 6.0): {"EXACT": 12 / 7, "CONSISTENT": 1.5, "MISMATCHED": 10 / 7},
    },
    # alpha = 2^-126, sixteen payloads 0.5 -> per-element 0, sum-first (8/6)·2^-126 (closed form)
    "ftz_denominator": {"PER_ELEMENT": 0.0, "PAYLOAD_SUM_FIRST": 1.5673258e-38},
    # code match on the uniform grid x in [-6, log2 6), 8,000,000 points (independent float64 computation)
    "code_match_grid": {
        "affine": 0.632884,
        "mitchell_s0": 0.95161,
        "mitchell_zero_mean": 0.98504,
        "mitchell_boundary": 0.98671,
    },
    "code_match_claimed": {"affine": 0.633, "mitchell_boundary": 0.987},  # HW-FP4 FA4 / FLAMIA
    # Gaussian-logit attention simulation, d 128, N 4096, 256 rows (independent float64 computation)
    "code_match_attention": {"affine": 0.438, "mitchell_boundary": 0.9798},
    # Direct-P affine behaviour: x -> (exact E2M1 value, affine E2M1 value) (closed form)
    "affine_table": (
        (-1.0, 0.5, 0.0),
        (-0.5, 0.5, 0.5),
        (0.0, 1.0, 1.0),
        (0.585, 1.5, 2.0),
        (1.0, 2.0, 3.0),
        (1.585, 3.0, 4.0),
        (2.0, 4.0, 4.0),
        (2.585, 6.0, 6.0),
    ),
    # HW-FP4 FA4's Direct-P affine forward error as printed (cosine "≈ 0.944", rel-L2 0.3366),
    # with half a unit of the last printed digit (the Direct-P norm study's band)
    "direct_p_article": {
        "cosine": 0.944,
        "cosine_halfwidth": 0.0005,
        "rel_l2": 0.3366,
        "rel_l2_halfwidth": 0.00005,
    },
    # output error against exact / BF16 attention on Gaussian Q/K/V, as published
    "route_errors": {
        "hw_fp4_direct_p": "rel-L2 0.3366, cosine ≈ 0.944 (" + cite("HW-FP4 FA4") + ")",
        "hao_log_nvfp4": "cosine 0.9817, NVFP4 QK + NVFP4 PV ("
        + cite("HAO flash-attention-fp4")
        + " README)",
        "hao_log_mxfp8": "cosine 0.9985, MXFP8 QK + FP8 PV ("
        + cite("HAO flash-attention-fp4")
        + " README)",
    },
    # in the row order of fp4sim.attention.LEAK_TABLE: (leak_O expected, leak_dQ expected,
    # expected class, FLAMIA's measurement); the expected magnitudes from an independent float64
    # emulation (N 128, d 64, g = 4)
    "leak_table": (
        ("0", "0", "exactly 0", ""),
        ("0", "0", "exactly 0", ""),
        ("0", "0", "~0 (E4M3 subnormals only)", ""),
        ("1.5e-7", "0–1e-7", "tiny", "6.9e-6 (cuDNN MXFP8)"),
        ("6.3e-3", "3.5e-4–1.5e-3", "large", "1.1e-1 (floor)"),
        ("2.3e-2", "1.3e-2", "large", "1.7e-1 (HW-FP4)"),
        ("1.6e-2", "2.7e-2", "large", ""),
        ("5.0e-2", "6.0e-2", "large", "9.8e-2 (per-tensor)"),
        ("9.1e-7", "≤ 7.7e-7", "tiny", ""),
        ("0", "6.3e-7", "small, non-zero", ""),
    ),
    # w = [1, 0.4], V = [0, 6], dO = 1: row sum of dS (closed form)
    "ds_row_sum": {"CONSISTENT": 0.0, "MISMATCHED": 0.068027},
    # inputs -> E2M1 value, round-to-nearest-even, saturating (every tie, and beyond max)
    "e2m1_rne_examples": (
        (0.25, 0.0),
        (0.75, 1.0),
        (1.25, 1.0),
        (1.75, 2.0),
        (2.5, 2.0),
        (3.5, 4.0),
        (5.0, 4.0),
        (6.19, 6.0),
        (100.0, 6.0),
    ),
}


PRESET_SOURCES: dict[str, str] = {
    "hw_fp4": "HW-FP4 FA4",
    "direct_p": "HW-FP4 FA4",
    "hao": "HAO flash-attention-fp4",
    "sage3": "SageAttention3",
    "cudnn": "cuDNN",
    "flamia": "FLAMIA",
    "attn_qat": "Attn-QAT",
}
"""The source (a :data:`SOURCES` key) of each named recipe, by the prefix of its name."""


def preset_source(name: str) -> str:
    """The Markdown link to the paper or repository a recipe named ``name`` follows ("—" for
    fp4sim's own baselines, e.g. ``exact_f32``)."""
    for prefix, short in PRESET_SOURCES.items():
        if name.startswith(prefix):
            return cite(short)
    return "—"

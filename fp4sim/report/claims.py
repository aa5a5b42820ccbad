"""What the articles and the seeds reported: the only numbers of the report typed in by hand.

:data:`SEED` maps a topic to the published (or previously reproduced) values that the report's
tables set beside what fp4sim computes.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SEED"]


# --- what the seeds reported (cited; the only numbers typed in by hand) ----------------------------

SEED: dict[str, Any] = {
    # seed_algorithms.md §1.1
    "e2m1_magnitudes": (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0),
    # seed_algorithms.md §4.1: w = [1, 0.4], alpha = 1 -> represented [1, 1/3]; outputs per V
    "norm_weights": (1.0, 0.4),
    "norm_represented": (1.0, 1.0 / 3.0),
    "norm_outputs": {(2.0, 2.0): {"EXACT": 2.0, "CONSISTENT": 2.0, "MISMATCHED": 40 / 21},
                     (0.0, 6.0): {"EXACT": 12 / 7, "CONSISTENT": 1.5, "MISMATCHED": 10 / 7}},
    # seed_algorithms.md §4.3: alpha = 2^-126, sixteen payloads 0.5 -> per-element 0, sum-first
    "ftz_denominator": {"PER_ELEMENT": 0.0, "PAYLOAD_SUM_FIRST": 1.5673258e-38},
    # seed_algorithms.md §2.7, §2.8, §7, §8 item 3: code-match on the uniform grid x in [-6, log2 6)
    "code_match_grid": {"affine": 0.632884, "mitchell_s0": 0.95161, "mitchell_zero_mean": 0.98504,
                        "mitchell_boundary": 0.98671},
    "code_match_claimed": {"affine": 0.633, "mitchell_boundary": 0.987},  # [B] FLAMIA / HW-FP4
    # seed_algorithms.md §2.7/§2.8 [R]: Gaussian-logit attention simulation (d 128, N 4096, 256 rows)
    "code_match_attention": {"affine": 0.438, "mitchell_boundary": 0.9798},
    # seed_algorithms.md §2.7 behaviour table: x -> (exact E2M1 value, affine E2M1 value)
    "affine_table": ((-1.0, 0.5, 0.0), (-0.5, 0.5, 0.5), (0.0, 1.0, 1.0), (0.585, 1.5, 2.0),
                     (1.0, 2.0, 3.0), (1.585, 3.0, 4.0), (2.0, 4.0, 4.0), (2.585, 6.0, 6.0)),
    # seed_algorithms.md §7: output error against exact / BF16 attention on Gaussian Q/K/V
    "route_errors": {"hw_fp4_direct_p": "rel-L2 0.3366, cosine ≈ 0.944 [B]",
                     "hao_log_nvfp4": "cosine 0.9817 (NVFP4 QK + NVFP4 PV) [C:doc]",
                     "hao_log_mxfp8": "cosine 0.9985 (MXFP8 QK + FP8 PV) [C:doc]"},
    # seed_algorithms.md §6.3, in the row order of fp4sim.attention.LEAK_TABLE:
    # (leak_O [R], leak_dQ [R], expected class, FLAMIA's measurement [B])
    "leak_table": (("0", "0", "exactly 0", ""), ("0", "0", "exactly 0", ""),
                   ("0", "0", "~0 (E4M3 subnormals only)", ""),
                   ("1.5e-7", "0–1e-7", "tiny", "6.9e-6 (cuDNN MXFP8)"),
                   ("6.3e-3", "3.5e-4–1.5e-3", "large", "1.1e-1 (floor)"),
                   ("2.3e-2", "1.3e-2", "large", "1.7e-1 (HW-FP4)"),
                   ("1.6e-2", "2.7e-2", "large", ""),
                   ("5.0e-2", "6.0e-2", "large", "9.8e-2 (per-tensor)"),
                   ("9.1e-7", "≤ 7.7e-7", "tiny", ""),
                   ("0", "6.3e-7", "small, non-zero", "")),
    # seed_algorithms.md §5.2: w = [1, 0.4], V = [0, 6], dO = 1: row sum of dS
    "ds_row_sum": {"CONSISTENT": 0.0, "MISMATCHED": 0.068027},
    # seed_algorithms.md §8 item 1 (inputs -> E2M1 value, RNE, saturating)
    "e2m1_rne_examples": ((0.25, 0.0), (0.75, 1.0), (1.25, 1.0), (1.75, 2.0), (2.5, 2.0), (3.5, 4.0),
                          (5.0, 4.0), (6.19, 6.0), (100.0, 6.0)),
}

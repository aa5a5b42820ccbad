# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Code-match rates of the probability converters
#
# Direct-P FP4 attention never evaluates exp on the fast path: it maps the log2-domain score
# straight to an E2M1 payload. How often does the shortcut pick the same code as the exact
# converter (exp2, then round to nearest even)? Hardware-Aware FP4 FlashAttention-4 (arXiv:2609.04105) claims 63.3 % for
# the affine classifier and FLAMIA 98.7 % for Mitchell-P; this notebook measures both, on the published uniform grid and on
# attention-like scores.
#
# Notation (as in `fp4sim.attention.recipe`): `t = c·(z − m) ≤ 0` log2-domain scores against the row max,
# key blocks of 32 with block exponent `k_B = ceil(max t)`, coordinate `x = t − k_B + log2 6`, so
# `2^x` is the exact payload before rounding. Tables are `fp4sim.report.Table` values, figures the
# report's (`fp4sim.figures.draw`). Set `FP4SIM_SMALL=1` to run quickly (CI does).

# %%
import math
import os

import numpy as np
from IPython.display import display

import fp4sim
from fp4sim import figures
from fp4sim.report import DEFAULT, QUICK, Table

SMALL = os.environ.get("FP4SIM_SMALL") == "1"
N = 100_000 if SMALL else 8_000_000  # the published rates use 8,000,000 points
SIZES = QUICK if SMALL else DEFAULT  # the report's experiment sizes, for the figures

converters = {
    "exact": fp4sim.ExactP(),
    "affine (1.5x + 1.2)": fp4sim.AffineP(),
    "Mitchell, shift 0": fp4sim.MitchellP(shift=0.0),
    "Mitchell, shift 0.0576": fp4sim.MitchellP(shift=0.0576),
    "Mitchell, boundary shift": fp4sim.MitchellP(),  # log2(1.25) - 1/4, the default
}

# %% [markdown]
# ## The uniform grid x ∈ [−6, log2 6)

# %%
x = fp4sim.uniform_grid(N)
Table(
    title=f"Code-match rate on the uniform grid ({N:,} points)",
    columns=("converter", "payload equal to the exact converter's"),
    rows=tuple(
        (name, f"{100 * fp4sim.code_match_rate(converters[name], converters['exact'], x):.2f} %")
        for name in list(converters)[1:]
    ),
)

# %% [markdown]
# The payload each converter picks along x (the report's figure, on its own grid):

# %%
fig = figures.draw("converter_code_maps", sizes=SIZES)

# %% [markdown]
# Where do they disagree? Print the x-intervals in which Mitchell with the boundary-aligned shift
# picks another payload: one band per octave just below the 1.5/2 boundary, and the 0/0.5
# boundary.

# %%
codes = {
    name: fp4sim.direct_p_payload(converters[name], x)
    for name in ("exact", "Mitchell, boundary shift")
}
wrong = codes["Mitchell, boundary shift"] != codes["exact"]
edges = np.flatnonzero(np.diff(wrong.astype(np.int8)))
Table(
    title="Where Mitchell with the boundary shift picks another payload",
    columns=("from x", "to x", "exact payload", "Mitchell payload"),
    rows=tuple(
        (
            f"{x[a + 1]:.4f}",
            f"{x[b]:.4f}",
            *(fp4sim.decode(codes[n][a + 1 : a + 2], fp4sim.E2M1)[0] for n in codes),
        )
        for a, b in zip(edges[::2], edges[1::2])
    ),
)

# %% [markdown]
# Direct-P skips exp2 altogether. Routes that evaluate it in software instead, like
# FlashAttention-4's degree-3 polynomial emulation of `ex2`, stay within about 1e-4 relative error
# of 2^x (the report's figure):

# %%
fig = figures.draw("exp2_error", sizes=SIZES)

# %% [markdown]
# ## Attention-like scores
#
# Gaussian Q and K, 32-key blocks: many exact codes are 0 there (probabilities more than 2^-3
# below their block maximum), which the affine classifier handles worst.

# %%
rng = np.random.default_rng(0)
rows, keys, d = (16, 512, 64) if SMALL else (256, 4096, 128)
q = rng.standard_normal((rows, d)).astype(np.float32)
k = rng.standard_normal((keys, d)).astype(np.float32)
u = (q @ k.T) * np.float32(math.log2(math.e) / math.sqrt(d))
t = (u - u.max(axis=-1, keepdims=True)).astype(np.float32)

exact_tile = fp4sim.convert_tile(fp4sim.HW_FP4_DIRECT_P.replace(converter=fp4sim.ExactP()), t)
rows = []
for name in ("affine (1.5x + 1.2)", "Mitchell, boundary shift"):
    tile = fp4sim.convert_tile(fp4sim.HW_FP4_DIRECT_P.replace(converter=converters[name]), t)
    same = np.mean(np.asarray(tile.codes) == np.asarray(exact_tile.codes))
    rows.append((name, f"{100 * same:.2f} %", np.array_equal(tile.k, exact_tile.k)))
display(
    Table(
        title=f"Attention-like scores ({len(t)} rows × {keys} keys, d = {d})",
        columns=("converter", "P codes equal to exact", "block exponents identical"),
        rows=tuple(rows),
        note=f"Exact codes that are 0: {100 * np.mean(np.asarray(exact_tile.codes) == 0):.1f} %.",
    )
)

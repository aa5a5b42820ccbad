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
# # Normalization and error of the published routes
#
# When P is quantized, the softmax denominator can be built from the represented weights
# (consistent, Direct-P) or from the unquantized ones (mismatched: HAO, SageAttention3, cuDNN's
# reference). The two-key example shows the difference; then we measure each published
# route's output error against exact attention. Tables are `fp4sim.report.Table` values, figures
# the report's (`fp4sim.figures.draw`). Set `FP4SIM_SMALL=1` to run quickly (CI does).

# %%
import os

import numpy as np
from IPython.display import display

import fp4sim
from fp4sim import figures
from fp4sim.report import DEFAULT, QUICK, Table

SMALL = os.environ.get("FP4SIM_SMALL") == "1"
SIZES = QUICK if SMALL else DEFAULT  # the report's experiment sizes, for the figures

# %% [markdown]
# ## The two-key example
#
# Weights w = [1, 0.4] in one block with α = 1: the exact converter gives payloads
# RN_E2M1(6w) = [6, 2], so the represented weights are [1, 1/3].

# %%
w = np.array([1.0, 0.4])
x = fp4sim.direct_p_coordinate(np.log2(w).astype(np.float32), np.int32(0))
payload = fp4sim.decode(fp4sim.direct_p_payload(fp4sim.ExactP(), x), fp4sim.E2M1).astype(np.float64)
represented = payload / 6
print("payloads", payload, "represented", represented)
display(
    Table(
        title="The two-key example: the output under each normalizer",
        columns=("V", *(n.name.lower() for n in fp4sim.Normalization)),
        rows=tuple(
            (
                str(v),
                *(
                    float(fp4sim.normalize(w, represented, np.array(v), n).out)
                    for n in fp4sim.Normalization
                ),
            )
            for v in ([2.0, 2.0], [0.0, 6.0])
        ),
    )
)

# %% [markdown]
# Only the consistent normalizer reproduces a constant V exactly (a convex combination).

# %% [markdown]
# ## Error of each published route against exact attention
#
# Gaussian Q, K, V; every preset recipe through the tiled forward emulator (NumPy), compared with
# the float64 reference.

# %%
rng = np.random.default_rng(0)
s, d = (128, 64) if SMALL else (1024, 128)
q, k, v = (rng.standard_normal((1, s, d)).astype(np.float32) for _ in range(3))
ref = fp4sim.attention_reference(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64))
rows = []
for name, recipe in fp4sim.attention.PRESETS.items():
    e = fp4sim.error_summary(fp4sim.attention_forward(q, k, v, recipe).out, ref.out)
    rows.append((name, f"{e.cosine:.5f}", f"{e.rel_l2:.4f}"))
Table(
    title=f"Each preset route against exact attention (S = {s}, d = {d})",
    columns=("route", "cosine", "relative L2"),
    rows=tuple(rows),
)

# %% [markdown]
# Over sequence lengths and key-tile sizes (the report's figure, on its own inputs):

# %%
fig = figures.draw("route_errors", sizes=SIZES)

# %% [markdown]
# ## Consistent vs mismatched on the same route
#
# The Direct-P route with its converter and formats fixed, only the normalizer changed.

# %%
rows = []
for norm in (fp4sim.Normalization.CONSISTENT, fp4sim.Normalization.MISMATCHED):
    recipe = fp4sim.HW_FP4_DIRECT_P.replace(normalization=norm)
    e = fp4sim.error_summary(fp4sim.attention_forward(q, k, v, recipe).out, ref.out)
    rows.append((norm.name, f"{e.cosine:.5f}", f"{e.rel_l2:.4f}"))
Table(
    title="Direct-P with each normalizer",
    columns=("normalization", "cosine", "relative L2"),
    rows=tuple(rows),
)

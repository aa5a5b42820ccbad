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
# # The causal leak probe
#
# A causal mask hides future tokens from the matrix products, but not from the *quantization*:
# any scale shared by tokens i < j lets token j change how token i's elements are rounded, so an
# earlier output depends on a masked future input. The probe (after FLAMIA, github.com/yandex-research/flamia-blackwell-attention): perturb
# the input of a future token j* so that it becomes its scale group's maximum, check that a scale
# really changed, rerun forward and backward, and measure the largest relative change of the
# earlier rows of O and dQ. Exactly zero means the earlier rows are bitwise identical.
#
# Tables are `fp4sim.report.Table` values, figures the report's (`fp4sim.figures.draw`). Set
# `FP4SIM_SMALL=1` to run quickly (CI does).

# %%
import os

import fp4sim
from fp4sim import figures
from fp4sim.report import DEFAULT, QUICK, Table

SMALL = os.environ.get("FP4SIM_SMALL") == "1"
SIZES = QUICK if SMALL else DEFAULT  # the report's experiment sizes, for the figures
names = list(fp4sim.LEAK_TABLE)
if SMALL:  # one configuration of each class
    names = [n for n in names if fp4sim.LEAK_TABLE[n] is not None][:: max(1, len(names) // 4)]

# %% [markdown]
# ## FLAMIA's leak table
#
# Each row is a training recipe that differs only in how V (or dS) is scaled; `leak_class` predicts
# the class from the scaling's properties, the probe measures it.

# %%
rows = []
for name in names:
    rep = fp4sim.leak_probe(fp4sim.LEAK_TABLE[name], n_tokens=128)
    rows.append((name, rep.leak_o, rep.leak_dq, rep.bitwise_o and rep.bitwise_dq, rep.vacuous))
Table(
    title="The leak probe (N = 128 tokens)",
    columns=("configuration", "leak of O", "leak of dQ", "bitwise", "vacuous"),
    rows=tuple(rows),
)

# %% [markdown]
# Every configuration of the table (the report's figure):

# %%
fig = figures.draw("leak_classes", sizes=SIZES)

# %% [markdown]
# ## The perturbation must move a shared scale
#
# A leak only shows when the future token actually changes a scale its group shares with earlier
# tokens. With a small gain the shared per-tensor exponent stays put and the probe reads 0; the
# report lists which operands' scales changed (`changed_operands`) and flags a probe in which none
# did as vacuous.

# %%
leaky = (
    fp4sim.LEAK_TABLE["V per-tensor pow2"]
    if "V per-tensor pow2" in fp4sim.LEAK_TABLE
    else fp4sim.LEAK_TABLE[names[-1]]
)
rows = []
for gain in (1.3, 4.0):
    rep = fp4sim.leak_probe(leaky, n_tokens=128, gain=gain)
    rows.append(
        (gain, rep.leak_o, rep.leak_dq, ", ".join(rep.changed_operands) or "none", rep.vacuous)
    )
Table(
    title="The same probe with a small and a large gain",
    columns=("gain", "leak of O", "leak of dQ", "scales changed in", "vacuous"),
    rows=tuple(rows),
)

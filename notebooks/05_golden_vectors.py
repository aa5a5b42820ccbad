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
# # Golden vectors for your kernel CI
#
# fp4sim's golden vectors are the exact bits its emulators produce for a registry of named cases:
# every code and tie of every format, the microscaling rules where libraries disagree, converter
# outputs and attention intermediates. They ship with fp4sim in `fp4sim/golden/data/`
# (`golden.DATA_DIR`) as plain `.npz` files (uint8 codes, float32 values) with a `manifest.json`;
# `FORMAT.md` there describes the layout for readers in other languages.
#
# This notebook lists the cases, materialises a few into a scratch folder, reads them back the way
# a kernel's CI would, and shows what `check` says when a bit changes.
#
# Tables are `fp4sim.report.Table` values (Jupyter renders them). Set `FP4SIM_SMALL=1` to run it
# quickly (CI does).

# %%
import json
import os
import shutil
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

import fp4sim
from fp4sim import golden
from fp4sim.report import Table

SMALL = os.environ.get("FP4SIM_SMALL") == "1"
Table(
    title=f"fp4sim {fp4sim.__version__}: {len(golden.CASES)} golden cases registered (the first 12)",
    columns=("case", "description"),
    rows=tuple((name, golden.CASES[name].description) for name in sorted(golden.CASES)[:12]),
)

# %% [markdown]
# ## Write a few cases
#
# `golden.write(dir, names)` is what `python -m fp4sim golden write --out DIR` runs. Files are
# byte-reproducible: the same arrays give the same sha256 on every machine.

# %%
scratch = Path(tempfile.mkdtemp(prefix="fp4sim-golden-"))
names = ["formats.e2m1.all_codes", "formats.e2m1.ties", "formats.e4m3.specials"]
if not SMALL:
    names += [
        n for n in sorted(golden.CASES) if n.startswith(("attention.", "formats.mx", "formats.nv"))
    ]
manifest = golden.write(scratch, names)
print(json.dumps(manifest["cases"]["formats.e2m1.all_codes"], indent=1)[:900])

# %% [markdown]
# ## Read them like a kernel CI would
#
# A case is a ZIP of `.npy` arrays. Codes are `uint8` (one FP4 code per byte, not packed), values
# are IEEE float32; compare them as bit patterns.

# %%
with np.load(scratch / "formats.e2m1.ties.npz") as z:
    arrays = {name: z[name] for name in z.files}
inputs, rne = arrays["inputs"], arrays["codes_nearest_even"]
ties = np.isin(inputs, [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
Table(
    title="E2M1 round to nearest even on the tie midpoints, as stored",
    columns=("input", "code", "value"),
    rows=tuple(
        (f"{x:g}", f"0x{c:X}", v)
        for x, c, v in sorted(zip(inputs[ties], rne[ties], fp4sim.decode(rne[ties], fp4sim.E2M1)))
    ),
)

# %% [markdown]
# Every rounding mode of the case, read back from the file, as the rounding error `decoded − input`
# on the non-negative inputs: on a tie the modes part, on the float32 neighbours of a tie they
# agree with round to nearest.

# %%
keep = inputs >= 0
x = inputs[keep]
fig, ax = plt.subplots(figsize=(7.0, 3.2), layout="constrained")
for key, marker, dx in (
    ("codes_nearest_even", "o", -0.03),
    ("codes_nearest_away", "x", 0.0),
    ("codes_toward_zero", "+", 0.03),
):
    err = fp4sim.decode(arrays[key][keep], fp4sim.E2M1) - x
    ax.plot(x + dx, err, marker, label=key.removeprefix("codes_").replace("_", " "))
ax.set_xlabel("input (E2M1 values, the ties between them and their float32 neighbours)")
ax.set_ylabel("decoded − input")
ax.set_title("formats.e2m1.ties (markers shifted apart horizontally)")
ax.legend()
ax.grid(alpha=0.3)

# %% [markdown]
# A consumer can verify one array without trusting the ZIP layer: the manifest's array hash is
# sha256 of `"<dtype>|<shape>|"` followed by the raw little-endian bytes.

# %%
meta = manifest["cases"]["formats.e2m1.ties"]["arrays"]["codes_nearest_even"]
print(meta, golden.array_sha256(rne) == meta["sha256"])

# %% [markdown]
# ## What `check` reports when something drifts
#
# Flip one byte of a stored file and `check` names the case; the same happens when an emulator
# bit changes (the regenerated arrays no longer equal the stored ones).

# %%
print("clean:", golden.check(scratch, names), "cases bit-identical")
path = scratch / "formats.e2m1.ties.npz"
blob = bytearray(path.read_bytes())
blob[-7] ^= 0x40
path.write_bytes(bytes(blob))
try:
    golden.check(scratch, names)
except golden.GoldenMismatch as e:
    print(e)
else:
    raise AssertionError("a corrupted file passed the check")

# %% [markdown]
# The set shipped with fp4sim is checked in CI by `tests/test_golden.py` (and by
# `python -m fp4sim golden check` wherever fp4sim is installed); regenerate it after an intended
# change with `python -m fp4sim golden write --out fp4sim/golden/data` from a source checkout and
# explain the change in the commit.

# %% [markdown]
# ## Clean up
#
# The scratch folder was only for this walk-through; remove it so the notebook leaves nothing
# behind.

# %%
shutil.rmtree(scratch)
print("removed", scratch)

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
# # A tour of the formats
#
# fp4sim models the element formats of NVIDIA's block-scaled tensor cores (E2M1 = FP4, E4M3 and
# E5M2 = FP8, E2M3/E3M2 = FP6) and their scale formats (UE8M0 for MX, UE4M3 for NVFP4, UE5M3), bit
# for bit. Codes are plain `uint8` (one code per byte); values are `float32`.
#
# Tables are `fp4sim.report.Table` values (Jupyter renders them), figures are the report's
# (`fp4sim.figures.draw`, shown inline). Set `FP4SIM_SMALL=1` to run it quickly (CI does): the
# figures then use the report's quick sizes.

# %%
import os

import ml_dtypes
import numpy as np
from IPython.display import display

import fp4sim
from fp4sim import figures
from fp4sim.report import DEFAULT, QUICK, Table

SMALL = os.environ.get("FP4SIM_SMALL") == "1"
SIZES = QUICK if SMALL else DEFAULT  # the report's experiment sizes, for the figures

Table(
    title="The element and scale formats",
    columns=("format", "bits", "max", "min normal", "min subnormal", "Inf", "NaN"),
    rows=tuple(
        (fmt.name, i.bits, i.max, i.min_normal, i.min_subnormal, i.has_inf, i.has_nan)
        for fmt in fp4sim.ALL_FORMATS
        for i in [fp4sim.finfo(fmt)]
    ),
)

# %% [markdown]
# ## E2M1: the 16 codes
#
# `decode` builds each value's float32 bit pattern with integer operations; it agrees with
# ml_dtypes' `float4_e2m1fn` on every code.

# %%
codes = fp4sim.all_codes(fp4sim.E2M1)
values = fp4sim.decode(codes, fp4sim.E2M1)
assert np.array_equal(values, codes.view(ml_dtypes.float4_e2m1fn).astype(np.float32))
Table(
    title="E2M1 codes",
    columns=("code", *(f"0x{c:X}" for c in codes[:8])),
    rows=(
        ("value", *values[:8]),
        ("code", *(f"0x{c:X}" for c in codes[8:])),
        ("value", *values[8:]),
    ),
)

# %% [markdown]
# On the real line, with the round-to-nearest-even decision boundaries:

# %%
fig = figures.draw("e2m1_grid", sizes=SIZES)

# %% [markdown]
# ## Encoding: round to nearest even, saturate
#
# The default policy is what PTX `cvt.rn.satfinite` does: ties go to the even code (0.25 → 0,
# 0.75 → 1, 1.25 → 1, 1.75 → 2, 2.5 → 2, 3.5 → 4, 5 → 4) and everything beyond ±6 becomes ±6.

# %%
x = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.19, 100.0, -0.0, -0.2], dtype=np.float32)
c = fp4sim.encode(x, fp4sim.E2M1)
Table(
    title="E2M1, round to nearest even with saturation",
    columns=("x", *(f"{v:g}" for v in x)),
    rows=(("code", *(f"0x{v:X}" for v in c)), ("value", *fp4sim.decode(c, fp4sim.E2M1))),
)

# %% [markdown]
# Other policies are named, never strings: ties away from zero (microxcaling), toward zero,
# directed, and stochastic rounding with explicit random bits. Each is a frozen `Policy`.

# %%
roundings = (fp4sim.Rounding.NEAREST_AWAY, fp4sim.Rounding.TOWARD_ZERO, fp4sim.Rounding.UP)
display(
    Table(
        title="E2M1 under other rounding policies",
        columns=("rounding", *(f"{v:g}" for v in x[:7])),
        rows=tuple(
            (
                r.name,
                *fp4sim.decode(
                    fp4sim.encode(x[:7], fp4sim.E2M1, fp4sim.Policy(rounding=r)), fp4sim.E2M1
                ),
            )
            for r in roundings
        ),
    )
)

rng = np.random.default_rng(0)
n = 2_000 if SMALL else 200_000
xs = np.full(n, 2.25, dtype=np.float32)  # a quarter of the way from 2 to 3
sr = fp4sim.decode(
    fp4sim.encode(
        xs,
        fp4sim.E2M1,
        fp4sim.Policy(rounding=fp4sim.Rounding.STOCHASTIC),
        random_bits=rng.integers(0, 2**32, n, dtype=np.uint32),
    ),
    fp4sim.E2M1,
)
print(
    f"stochastic rounding of 2.25: mean {sr.mean():.4f} (unbiased: 2.25), P(3) = {(sr == 3).mean():.3f}"
)

# %% [markdown]
# ## FP8 and the overflow policies
#
# E4M3 has no infinity: beyond 448 it saturates (default) or gives NaN (what an ml_dtypes cast does).
# E5M2 has IEEE infinities.

# %%
big = np.array([300.0, 464.0, 500.0, 1e6], dtype=np.float32)
Table(
    title="E4M3 beyond its largest value",
    columns=("encoding", *(f"{v:g}" for v in big)),
    rows=(
        *(
            (
                f"fp4sim, Overflow.{o.name}",
                *fp4sim.decode(
                    fp4sim.encode(big, fp4sim.E4M3, fp4sim.Policy(overflow=o)), fp4sim.E4M3
                ),
            )
            for o in (fp4sim.Overflow.SATURATE, fp4sim.Overflow.NAN)
        ),
        ("ml_dtypes cast", *big.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)),
    ),
)

# %% [markdown]
# ## Scale formats
#
# UE8M0 is a pure power of two 2^(e−127); its smallest code 0x00 is 2^-127, a float32 *subnormal*,
# which fp4sim decodes as bits so that XLA's flush-to-zero on CPU cannot lose it.

# %%
e8_codes = np.array([0x00, 0x01, 0x7F, 0x80, 0xFE, 0xFF], dtype=np.uint8)
e8 = fp4sim.decode(e8_codes, fp4sim.UE8M0)
Table(
    title="UE8M0 scale codes",
    columns=("code", *(f"0x{c:02X}" for c in e8_codes)),
    rows=(("value", *e8),),
    note="0xFF is NaN; the values are 2^(code − 127).",
)

# %% [markdown]
# ## The same code under jax.jit
#
# The emulators are written once against an array namespace: jax arrays in, jax arrays out, with
# the same bits, also for subnormal inputs that XLA's CPU backend flushes in arithmetic.

# %%
import jax
import jax.numpy as jnp

xs = np.array([1e-40, 0.3, 2.5, 7.0, -448.0], dtype=np.float32)
rows = []
for fmt in (fp4sim.E2M1, fp4sim.E4M3, fp4sim.E5M2):
    a = fp4sim.encode(xs, fmt)
    b = np.asarray(jax.jit(lambda v, fmt=fmt: fp4sim.encode(v, fmt))(jnp.asarray(xs)))
    rows.append((fmt.name, *(f"0x{v:02X}" for v in a), np.array_equal(a, b)))
Table(
    title="Codes, NumPy and jax.jit",
    columns=("format", *(f"{v:g}" for v in xs), "identical under jit"),
    rows=tuple(rows),
)

# %% [markdown]
# ## Block scaling: MXFP8, MXFP4, NVFP4
#
# A block format shares one scale per block of 32 (MX, UE8M0 power of two) or 16 (NVFP4, UE4M3)
# elements. The scale rule is named: OCP's `FLOOR` can clip a block's maximum (amax 500 in E4M3
# becomes 448), TransformerEngine/cuDNN's `RCEIL` rounds the scale up and never clips.

# %%
from fp4sim.formats import blocks

x = np.zeros((1, 32), dtype=np.float32)
x[0, :4] = [500.0, 3.0, -0.75, 1e-3]
rows = []
for rule in (blocks.ScaleRule.FLOOR, blocks.ScaleRule.RCEIL):
    q = blocks.quantize(x, blocks.MXFP8, rule=rule)
    scale = fp4sim.decode(q.scales, fp4sim.UE8M0)[0, 0]
    rows.append((rule.name, f"2^{int(np.log2(scale))}", *blocks.dequantize(q)[0, :4]))
display(
    Table(
        title="One MXFP8 block under the two scale rules",
        columns=("rule", "scale", *(f"{v:g}" for v in x[0, :4])),
        rows=tuple(rows),
    )
)

y = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
rows = []
for fmt in (blocks.MXFP4, blocks.NVFP4):
    q = blocks.quantize(y, fmt)
    err = np.linalg.norm(blocks.dequantize(q) - y) / np.linalg.norm(y)
    rows.append((fmt.name, str(q.codes.shape), str(q.codes.dtype), str(q.scales.shape), err))
display(
    Table(
        title="FP4 block formats on Gaussian values",
        columns=("format", "codes", "dtype", "scales", "relative error"),
        rows=tuple(rows),
    )
)

# %% [markdown]
# How often `FLOOR` clips a block's maximum, measured and predicted, for each element format
# (the report's figure):

# %%
fig = figures.draw("scale_rule_clipping", sizes=SIZES)

# %% [markdown]
# Two FP4 codes per byte (the even-indexed element in the low nibble) is an explicit step:

# %%
q = blocks.quantize(y, blocks.MXFP4)
packed = fp4sim.pack(q.codes, fp4sim.E2M1)
print(q.codes[0, :4], "->", [f"0x{b:02X}" for b in packed[0, :2]])
assert np.array_equal(fp4sim.unpack(packed, fp4sim.E2M1), q.codes)

"""The causal leak probe: the classes of FLAMIA's leak table as tests.

Setup (the probe's defaults): N = 128 tokens, d = 64, target token 77 in the 32-token group
64..95, input gain 5, NVFP4 Q/K per token, exact MXFP4 P with consistent normalization, E5M2
dO, the per-query-row dS option unless the row says otherwise. Classes: exactly zero (bitwise)
for per-token and the exact options; tiny (< 1e-4) for power-of-two round-up scales shared
along tokens; large (> 1e-3) for OCP floor with clamping, MXFP4/NVFP4 along tokens, per-tensor
non-power-of-two scales.
"""

from __future__ import annotations

import numpy as np
import pytest

from fp4sim.attention import operands
from fp4sim.attention.autodiff import LEAK_TABLE, TRAINING_PRESETS
from fp4sim.attention.causal import LeakClass, leak_class
from fp4sim.attention.leak import leak_metric, leak_probe
from fp4sim.attention.recipe import QKFormat
from fp4sim.attention.recipe import QKGlobalScale as GlobalScale

CLASS_OF_ROW = {
    "V unquantized": LeakClass.NONE,
    "V per-token pow2 (exact option)": LeakClass.NONE,
    "V token-block 32xD ceil E4M3": LeakClass.SUBNORMAL,
    "V MXFP8 32-token RCEIL": LeakClass.SUBNORMAL,
    "V MXFP8 32-token OCP floor": LeakClass.LARGE,
    "V MXFP4 32-token": LeakClass.LARGE,
    "V NVFP4 16-token": LeakClass.LARGE,
    "V per-tensor FP8 amax/448": LeakClass.LARGE,
    "V per-tensor pow2": LeakClass.SUBNORMAL,
    "dS 32x32 floor (V per-token)": LeakClass.LARGE,
}


def test_table_rows_are_the_seed_rows_in_order():
    assert list(LEAK_TABLE) == list(CLASS_OF_ROW)
    for name, recipe in LEAK_TABLE.items():
        worst = max(
            (leak_class(s) for s in (recipe.qk, recipe.v, recipe.ds)),
            key=[LeakClass.NONE, LeakClass.SUBNORMAL, LeakClass.LARGE].index,
        )
        assert worst is CLASS_OF_ROW[name], name


@pytest.mark.parametrize("name", list(LEAK_TABLE))
def test_leak_class_observed(name):
    rep = leak_probe(LEAK_TABLE[name])
    assert not rep.vacuous, rep
    cls = CLASS_OF_ROW[name]
    if cls is LeakClass.NONE:
        assert rep.bitwise_o and rep.bitwise_dq and rep.leak_o == 0 and rep.leak_dq == 0, rep
    elif cls is LeakClass.SUBNORMAL:
        assert rep.leak_o < 1e-4 and rep.leak_dq < 1e-4, rep
    elif name.startswith("dS"):
        # the V operand is per token: O cannot leak; dQ leaks through the shared dS tile scale
        assert rep.bitwise_o and rep.leak_dq > 0, rep
    else:
        assert rep.leak_o > 1e-3 and rep.leak_dq > 1e-3, rep


@pytest.mark.parametrize(
    "qk_global, qk, cls",
    [
        (GlobalScale.NONE, QKFormat.NVFP4, LeakClass.NONE),  # constant global factor (1)
        (GlobalScale.PER_TOKEN, QKFormat.NVFP4, LeakClass.NONE),
        (GlobalScale.PER_TENSOR, QKFormat.NVFP4, LeakClass.LARGE),
        (GlobalScale.NONE, QKFormat.FP8_PER_TENSOR, LeakClass.LARGE),
        (GlobalScale.NONE, QKFormat.MXFP8, LeakClass.NONE),
    ],
)
def test_qk_global_factor_for_causal_training(qk_global, qk, cls):
    base = LEAK_TABLE["V per-token pow2 (exact option)"]
    recipe = base.replace(
        name=f"{qk.name}/{qk_global.name}", forward=base.forward.replace(qk=qk, qk_global=qk_global)
    )
    assert leak_class(recipe.qk) is cls
    rep = leak_probe(recipe)
    assert not rep.vacuous
    if cls is LeakClass.NONE:
        assert rep.bitwise_o and rep.bitwise_dq, rep
    else:
        assert rep.leak_o > 1e-3 and rep.leak_dq > 1e-3, rep


def test_probe_reports_vacuous_when_no_scale_changes():
    # float32 Q/K and a gain that leaves the target far below its V groups' maxima
    recipe = LEAK_TABLE["V MXFP8 32-token RCEIL"]
    recipe = recipe.replace(name="vacuous", forward=recipe.forward.replace(qk=QKFormat.FLOAT32))
    rep = leak_probe(recipe, gain=1.0 + 2.0**-10)
    assert rep.vacuous and rep.changed_operands == ()
    assert "VACUOUS" in str(rep)
    rep = leak_probe(recipe)
    assert not rep.vacuous and rep.changed_operands == ("v",)


def test_leak_metric_zero_iff_bitwise():
    a = np.arange(12, dtype=np.float32).reshape(4, 3) + 1
    assert leak_metric(a, a.copy(), 3) == (0.0, True)
    b = a.copy()
    b[3] = 99  # at or after the target: not measured
    assert leak_metric(a, b, 3) == (0.0, True)
    b = a.copy()
    b[1, 1] = np.nextafter(b[1, 1], np.float32(np.inf))  # one ulp earlier
    value, same = leak_metric(a, b, 3)
    assert not same and 0 < value < 1e-6
    zero_a = np.zeros((2, 2), np.float32)
    zero_b = zero_a.copy()
    zero_b[0, 0] = -0.0  # a sign-of-zero change is a bit change, reported as inf (0 scale)
    assert leak_metric(zero_a, zero_b, 2) == (float("inf"), False)


def test_probe_bad_arguments_named():
    recipe = TRAINING_PRESETS["direct_p_fp8_training"]
    with pytest.raises(ValueError, match="target"):
        leak_probe(recipe, target=0)
    with pytest.raises(ValueError, match="gain"):
        leak_probe(recipe, gain=-1.0)
    with pytest.raises(TypeError, match="TrainingRecipe"):
        leak_probe(recipe.forward)
    with pytest.raises(ValueError, match="n_tokens"):
        leak_probe(recipe, n_tokens=0)


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=8, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    target=st.integers(33, 63),
    gain=st.floats(1.5, 100.0),
    name=st.sampled_from(["V unquantized", "V per-token pow2 (exact option)"]),
)
def test_property_exact_options_never_leak(seed, target, gain, name):
    rep = leak_probe(
        LEAK_TABLE[name], n_tokens=64, d_model=32, head_dim=32, target=target, gain=gain, seed=seed
    )
    assert rep.bitwise_o and rep.bitwise_dq, rep


@pytest.mark.parametrize(
    "scaling, leaks",
    [
        (operands.PER_TOKEN_POW2, False),  # the causal dQ scale: one exponent per query row
        (
            operands.MXFP8_TOKENS_FLOOR,
            True,
        ),  # 32 query rows share a scale: dQ of earlier rows leaks
    ],
)
def test_dq_output_scale_must_be_causal(scaling, leaks):
    recipe = LEAK_TABLE["V per-token pow2 (exact option)"]
    recipe = recipe.replace(name=f"dQ {scaling.name}", dq=scaling)
    rep = leak_probe(recipe)
    assert rep.bitwise_o, rep  # the forward is untouched
    assert (leak_class(scaling) is not LeakClass.NONE) == leaks
    if leaks:
        assert rep.leak_dq > 1e-3, rep
    else:
        assert rep.bitwise_dq, rep

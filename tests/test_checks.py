"""The shared validators of fp4sim._checks, and that the attention entry points use them."""

from __future__ import annotations

import numpy as np
import pytest

import fp4sim
from fp4sim import _checks


@pytest.mark.parametrize("good, want", [(None, 0.125), (0.5, 0.5), (2, 2.0),
                                        (np.float32(0.25), 0.25), (np.float64(0.1), 0.1)])
def test_softmax_scale_accepts_positive_finite_reals(good, want):
    got = _checks.softmax_scale(good, 64)
    assert type(got) is float and got == want


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan"), np.float32(-1)])
def test_softmax_scale_rejects_bad_values_naming_it(bad):
    with pytest.raises(ValueError, match="softmax_scale=.* must be a positive finite number"):
        _checks.softmax_scale(bad, 64)


@pytest.mark.parametrize("bad", [True, np.bool_(True), "0.1", [0.1], None.__class__])
def test_softmax_scale_rejects_bad_types_naming_it(bad):
    with pytest.raises(TypeError, match="softmax_scale=.* must be a positive finite number"):
        _checks.softmax_scale(bad, 64)


def test_every_attention_entry_point_uses_the_one_check():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 32, 32)).astype(np.float32) for _ in range(3))
    for call in (lambda s: fp4sim.attention_reference(q, k, v, softmax_scale=s),
                 lambda s: fp4sim.attention_forward(q, k, v, fp4sim.EXACT_F32, softmax_scale=s),
                 lambda s: fp4sim.training_forward(q, k, v, fp4sim.TRAINING_PRESETS["float32"],
                                                   softmax_scale=s)):
        call(np.float32(0.125))  # a NumPy scalar is a number
        with pytest.raises(ValueError, match="must be a positive finite number"):
            call(-0.5)


def test_check_int():
    assert _checks.check_int("C", "n", 64, 1) == 64
    with pytest.raises(TypeError, match=r"C\.n=True must be an int"):
        _checks.check_int("C", "n", True, 1)
    with pytest.raises(ValueError, match=r"C\.n=0 out of range; allowed 1\.\.inf"):
        _checks.check_int("C", "n", 0, 1)
    with pytest.raises(ValueError, match=r"C\.n=9 out of range; allowed 1\.\.8"):
        _checks.check_int("C", "n", 9, 1, 8)
    with pytest.raises(ValueError, match="must be >= 64 and a multiple of 64"):
        _checks.check_int("C", "n", 96, 64, multiple=64)

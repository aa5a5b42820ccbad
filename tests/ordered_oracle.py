"""Test-side oracle shared by the ordered-sum fast-path tests (forward and backward): the
emulator's SEQUENTIAL float32 product chain written term by term, independently of
fp4sim.attention, and a bitwise comparison that treats NaN as NaN. Importable from the tests
because pytest puts ``tests/`` on ``sys.path`` (``pythonpath`` in pyproject.toml)."""

from __future__ import annotations

import numpy as np


def ftz(x):
    """float32 with every |x| < 2^-126 flushed to +0 (the emulator's flush)."""
    x = np.asarray(x, np.float32)
    return np.where(np.abs(x) < np.float32(2.0**-126), np.float32(0.0), x)


def flushed_chain(a, b):
    """The SEQUENTIAL spec of ``a @ b`` over the last axis of ``a``, term by term:
    acc_k = ftz(acc_{k-1} + ftz(a_k b_k))."""
    with np.errstate(all="ignore"):
        acc = ftz(a[..., :, 0, None] * b[..., 0, None, :])
        for k in range(1, a.shape[-1]):
            acc = ftz(acc + ftz(a[..., :, k, None] * b[..., k, None, :]))
    return acc


def assert_same_bits(got, want):
    """``got`` equals ``want`` bit for bit, NaN positions matching (any NaN payload)."""
    got = np.asarray(got, np.float32)
    assert got.shape == want.shape
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))

"""The shared validators of fp4sim._checks, and that the attention entry points use them."""

from __future__ import annotations

import numpy as np
import pytest

import fp4sim
from fp4sim import _checks


@pytest.mark.parametrize(
    "good, want",
    [(None, 0.125), (0.5, 0.5), (2, 2.0), (np.float32(0.25), 0.25), (np.float64(0.1), 0.1)],
)
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
    for call in (
        lambda s: fp4sim.attention_reference(q, k, v, softmax_scale=s),
        lambda s: fp4sim.attention_forward(q, k, v, fp4sim.EXACT_F32, softmax_scale=s),
        lambda s: fp4sim.training_forward(
            q, k, v, fp4sim.TRAINING_PRESETS["float32"], softmax_scale=s
        ),
    ):
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


# --- issue 15, items 6, 9, 10, 11: one wording for each kind of bad input ---------------------
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

RNG = np.random.default_rng(6)
Q, K, V = (RNG.standard_normal((1, 32, 32)).astype(np.float32) for _ in range(3))
F32 = fp4sim.TRAINING_PRESETS["float32"]


def test_numpy_scalars_are_numbers_everywhere():
    want = fp4sim.attention_forward(Q, K, V, fp4sim.EXACT_F32, softmax_scale=0.125).out
    for s in (np.float32(0.125), np.float64(0.125), np.float16(0.125)):
        got = fp4sim.attention_forward(Q, K, V, fp4sim.EXACT_F32, softmax_scale=s).out
        np.testing.assert_array_equal(got, want)
        fp4sim.attention_reference(Q, K, V, softmax_scale=s)
        fp4sim.training_forward(Q, K, V, F32, softmax_scale=s)
    assert _checks.check_real("x", np.float32(2)) == 2.0
    assert fp4sim.attention_forward(Q, K, V, fp4sim.EXACT_F32, causal=np.bool_(True)).out.shape


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda b: fp4sim.quantize(Q, fp4sim.MXFP4, pack=b), "pack"),
        (
            lambda b: fp4sim.attention_forward(Q, K, V, fp4sim.EXACT_F32, return_intermediates=b),
            "return_intermediates",
        ),
        (lambda b: fp4sim.attention_forward(Q, K, V, fp4sim.EXACT_F32, causal=b), "causal"),
        (lambda b: fp4sim.attention_reference(Q, K, V, causal=b), "causal"),
        (lambda b: fp4sim.training_forward(Q, K, V, F32, causal=b), "causal"),
        (lambda b: fp4sim.emulated_attention(Q, K, V, F32, causal=b), "causal"),
        (lambda b: fp4sim.attention_mask(4, 4, causal=b), "causal"),
    ],
)
@pytest.mark.parametrize("bad", ["no", "False", 0, 1, None])
def test_booleans_must_be_booleans(call, name, bad):
    with pytest.raises(TypeError, match=f"{name}=.* must be a bool"):
        call(bad)


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda x: fp4sim.exp2_rn(x), "x"),
        (lambda x: fp4sim.exp2_fa4(x), "x"),
        (lambda x: fp4sim.direct_p_payload(fp4sim.ExactP(), x), "x"),
        (lambda x: fp4sim.training_forward(x, K, V, F32), "q"),
        (lambda x: fp4sim.attention_forward(x, K, V, fp4sim.EXACT_F32), "q"),
        (lambda x: fp4sim.attention_reference(Q, x, V), "k"),
        (lambda x: fp4sim.emulated_attention(Q, K, x, F32), "v"),
        (lambda x: fp4sim.encode(x, fp4sim.E2M1), "values"),
        (lambda x: fp4sim.quantize(x, fp4sim.MXFP8), "x"),
        (lambda x: fp4sim.convert_tile(fp4sim.EXACT_F32, x), "t"),
    ],
)
@pytest.mark.parametrize(
    "bad",
    [
        "a",
        b"a",
        np.array(["1.0"]),
        {"a": 1},
        np.int32([[1]]),
        np.array([True]),
        np.array([object()]),
    ],
)
def test_non_float_data_is_a_type_error_naming_the_argument(call, name, bad):
    with pytest.raises(TypeError, match=rf"^{name}\b"):
        call(bad)


def test_configs_that_are_not_configs():
    with pytest.raises(TypeError, match="recipe='hw_fp4_direct_p' must be an AttentionRecipe"):
        fp4sim.convert_tile("hw_fp4_direct_p", np.zeros((1, 128), np.float32))
    with pytest.raises(TypeError, match="recipe=.* must be a TrainingRecipe"):
        fp4sim.training_forward(Q, K, V, fp4sim.EXACT_F32)
    with pytest.raises(TypeError, match="fmt=.* must be a BlockFormat"):
        fp4sim.quantize(Q, fp4sim.E2M1)
    with pytest.raises(TypeError, match="policy=.* must be a Policy"):
        fp4sim.encode(Q, fp4sim.E2M1, "rne")


def test_a_format_traced_by_jit_is_told_to_be_static():
    for f, fmt in ((fp4sim.encode, fp4sim.E2M1), (fp4sim.decode, fp4sim.E2M1)):
        arg = jnp.asarray(Q) if f is fp4sim.encode else jnp.zeros(4, jnp.uint8)
        with pytest.raises(TypeError, match="fmt is a traced jax value.*static argument"):
            jax.jit(f)(arg, fmt)
    with pytest.raises(TypeError, match="policy is a traced jax value.*static"):
        jax.jit(lambda x, p: fp4sim.encode(x, fp4sim.E2M1, p))(jnp.asarray(Q), jnp.float32(1))
    with pytest.raises(TypeError, match="softmax_scale=.*static argument"):
        jax.jit(lambda s: fp4sim.attention_forward(Q, K, V, fp4sim.EXACT_F32, softmax_scale=s).out)(
            0.1
        )


def test_shapes_that_do_not_match():
    with pytest.raises(ValueError, match=r"shapes differ: p \(2, 3\), dp \(3, 2\)"):
        fp4sim.softmax_grad(
            np.ones((2, 3), np.float32), np.ones((3, 2), np.float32), np.ones(2, np.float32)
        )
    with pytest.raises(ValueError, match="delta has shape"):
        fp4sim.softmax_grad(
            np.ones((2, 3), np.float32), np.ones((2, 3), np.float32), np.ones(3, np.float32)
        )


def test_lists_float64_big_endian_and_array_likes_are_accepted_consistently():
    x = (RNG.standard_normal((2, 64)) * 4).astype(np.float32)
    for fmt in (fp4sim.MXFP8, fp4sim.NVFP4, fp4sim.MXFP4):
        want = fp4sim.quantize(x, fmt)
        for same in (
            x.tolist(),
            x.astype(np.float64),
            x.astype(">f4"),
            _ArrayLike(x),
            _DlpackOnly(x),
        ):
            got = fp4sim.quantize(same, fmt)
            np.testing.assert_array_equal(got.codes, want.codes)
            np.testing.assert_array_equal(got.scales, want.scales)
    for fmt in (fp4sim.E2M1, fp4sim.E4M3):
        want = fp4sim.encode(x, fmt)
        for same in (
            x.tolist(),
            x.astype(np.float64),
            x.astype(">f4"),
            _ArrayLike(x),
            _DlpackOnly(x),
        ):
            np.testing.assert_array_equal(fp4sim.encode(same, fmt), want)
        np.testing.assert_array_equal(fp4sim.decode(want.tolist(), fmt), fp4sim.decode(want, fmt))
        np.testing.assert_array_equal(
            fp4sim.decode(want.astype(">u2"), fmt), fp4sim.decode(want, fmt)
        )
    out = fp4sim.attention_forward(Q.astype(">f4"), K.tolist(), _ArrayLike(V), fp4sim.EXACT_F32).out
    np.testing.assert_array_equal(out, fp4sim.attention_forward(Q, K, V, fp4sim.EXACT_F32).out)


def test_empty_inputs():
    for fmt in fp4sim.BLOCK_FORMATS:
        q = fp4sim.quantize(np.zeros((0, 32), np.float32), fmt)
        assert fp4sim.dequantize(q).shape == (0, 32)
    assert fp4sim.encode(np.zeros((0,), np.float32), fp4sim.E2M1).shape == (0,)
    assert fp4sim.decode(np.zeros((0,), np.uint8), fp4sim.E2M1).shape == (0,)
    with pytest.raises(ValueError, match="empty attention"):
        fp4sim.attention_forward(Q[:, :0], K, V, fp4sim.EXACT_F32)


class _ArrayLike:
    """What a CPU torch tensor offers NumPy: ``__array__``."""

    def __init__(self, a):
        self.a = a

    def __array__(self, dtype=None, copy=None):
        return self.a if dtype is None else self.a.astype(dtype)


class _DlpackOnly:
    """An object exposing only the DLPack protocol."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, **kw):
        return self.a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


# --- every public function, a catalogue of bad arguments: TypeError/ValueError only ------------
_BAD = ["abc", b"abc", None, object(), True, {"a": 1}, np.array(["x"]), np.array([object()])]
_GOOD = {
    "x": np.ones((2, 32), np.float32),
    "values": np.ones((2, 32), np.float32),
    "codes": np.zeros((2, 32), np.uint8),
    "fmt": fp4sim.E2M1,
    "q": np.ones((1, 32, 32), np.float32),
    "k": np.ones((1, 32, 32), np.float32),
    "v": np.ones((1, 32, 32), np.float32),
}


def _public_functions():
    import inspect

    for name in fp4sim.__all__:
        f = getattr(fp4sim, name)
        if inspect.isfunction(f):
            req = [
                p
                for p in inspect.signature(f).parameters.values()
                if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
            ]
            yield name, f, req


@pytest.mark.parametrize(
    "name, f, req", list(_public_functions()), ids=lambda v: v if isinstance(v, str) else ""
)
def test_every_public_function_rejects_bad_arguments_with_a_clear_error(name, f, req):
    """No AttributeError/IndexError/KeyError and no NumPy conversion message leaks out of a
    public function given a string, bytes, None, an object, a bool, a dict or a string/object
    array in any required position."""
    for i, p in enumerate(req):
        for bad in _BAD:
            args = [
                bad if j == i else _GOOD.get(q.name, np.ones((2, 32), np.float32))
                for j, q in enumerate(req)
            ]
            try:
                f(*args)
            except (TypeError, ValueError) as e:
                assert "could not convert" not in str(e), (name, p.name, bad, e)
                assert "has no attribute" not in str(e), (name, p.name, bad, e)

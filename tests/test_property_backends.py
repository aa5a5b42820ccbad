"""Issue 15: NumPy and jitted JAX give identical bits, or the same error, for drawn inputs.

Hypothesis draws the format (element or block, the library presets included), the conversion
policy, the scale rule, the attention preset, the shape and where special values go: NaN of
both signs (and with payloads), ±Inf, ±0, float32 subnormals, values beyond the format's max,
all-zero blocks. Each case runs once on NumPy and once under ``jax.jit`` (formats, policies and
recipes static; ``NanPolicy.RAISE`` through ``checkify``, its documented jax form) and must
give the same bits or the same error (type and message). The example counts keep the whole
file under a minute on two CPU cores (jit compilations dominate; they are cached per format).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from jax.experimental import checkify

import fp4sim
from fp4sim.formats.presets import BLOCK_PRESETS

SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))

SPECIAL_BITS = np.uint32(
    [
        0x7FC00000,
        0xFFC00000,
        0x7F800001,
        0xFFFFFFFF,  # NaN, both signs
        0x7F800000,
        0xFF800000,
        0x00000000,
        0x80000000,  # ±Inf, ±0
        0x00000001,
        0x807FFFFF,
        0x00400000,
        0x80000100,  # subnormals
        0x7F7FFFFF,
        0xFF7FFFFF,
        0x4F000000,
        0xCB000000,
    ]
)  # beyond max


def _values(shape, seed, n_special, zero_rows, scale_exp):
    """float32 data: normal values times 2^scale_exp, ``n_special`` specials at random places,
    ``zero_rows`` leading rows (blocks) of zeros."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * np.float64(2.0) ** scale_exp).astype(np.float32)
    flat = x.reshape(-1)
    if flat.size:
        where = rng.integers(0, flat.size, n_special)
        flat[where] = SPECIAL_BITS[rng.integers(0, len(SPECIAL_BITS), n_special)].view(np.float32)
        if x.ndim == 2:
            x[:zero_rows] = 0.0
    return x


def _outcome(f, *args):
    """('ok', leaves as uint bits) or ('error', type, message)."""
    try:
        out = f(*args)
    except (TypeError, ValueError) as e:
        return ("error", ValueError if isinstance(e, ValueError) else TypeError, str(e))
    leaves = jax.tree_util.tree_leaves(out)
    return (
        "ok",
        [
            np.asarray(a).view(f"u{np.asarray(a).dtype.itemsize}")
            if np.asarray(a).dtype.kind == "f"
            else np.asarray(a)
            for a in leaves
        ],
    )


def _same(a, b):
    assert a[0] == b[0], (a[:2], b[:2])
    if a[0] == "error":
        assert a[1:] == b[1:]
        return
    assert len(a[1]) == len(b[1])
    for x, y in zip(a[1], b[1]):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(x, y)


def _checkified(f):
    """f jitted; an error from checkify (NanPolicy.RAISE) raised as the ValueError it is."""
    cj = checkify.checkify(jax.jit(f))

    def run(*args):
        err, out = cj(*args)
        msg = err.get()
        if msg is not None:
            raise ValueError(msg.split(" (`check` failed)")[0])
        return out

    return run


# --- element codec --------------------------------------------------------------------------
@st.composite
def policies(draw, fmt):
    overflows = (
        [fp4sim.Overflow.SATURATE]
        + ([fp4sim.Overflow.NAN] if fmt.has_nan else [])
        + ([fp4sim.Overflow.INF] if fmt.has_inf else [])
    )
    return fp4sim.Policy(
        rounding=draw(st.sampled_from(list(fp4sim.Rounding))),
        overflow=draw(st.sampled_from(overflows)),
        nan=draw(st.sampled_from(list(fp4sim.NanPolicy))),
        signed_zero=draw(st.sampled_from(list(fp4sim.SignedZero))),
        flush_inputs=draw(st.booleans()),
        flush_outputs=draw(st.booleans()),
    )


@functools.cache
def _jit_encode(fmt, policy):
    return _checkified(lambda x, rb: fp4sim.encode(x, fmt, policy, random_bits=rb))


@settings(max_examples=40, **SETTINGS)
@given(
    data=st.data(),
    fmt=st.sampled_from(fp4sim.ALL_FORMATS),
    shape=st.sampled_from([(0,), (1,), (64,), (3, 32)]),
    seed=st.integers(0, 2**16),
    n_special=st.integers(0, 12),
    scale_exp=st.integers(-140, 120),
)
def test_encode_and_decode(data, fmt, shape, seed, n_special, scale_exp):
    policy = data.draw(policies(fmt))
    x = _values(shape, seed, n_special, 0, scale_exp)
    rb = None
    if policy.rounding is fp4sim.Rounding.STOCHASTIC:
        rb = np.random.default_rng(seed).integers(0, 2**32, shape, dtype=np.uint32)
    want = _outcome(lambda v, r: fp4sim.encode(v, fmt, policy, random_bits=r), x, rb)
    got = _outcome(
        _jit_encode(fmt, policy), jnp.asarray(x), None if rb is None else jnp.asarray(rb)
    )
    _same(want, got)
    codes = np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)  # beyond, too
    _same(
        _outcome(fp4sim.decode, codes, fmt),
        _outcome(jax.jit(fp4sim.decode, static_argnums=1), jnp.asarray(codes), fmt),
    )


# --- block quantization ---------------------------------------------------------------------
BLOCKS = list(fp4sim.BLOCK_FORMATS) + list(BLOCK_PRESETS.values())


@st.composite
def block_formats(draw):
    fmt = draw(st.sampled_from(BLOCKS))
    if fmt.scale is not None:
        rules = (
            [
                fp4sim.ScaleRule.RCEIL,
                fp4sim.ScaleRule.FLOOR,
                fp4sim.ScaleRule.CEIL,
                fp4sim.ScaleRule.EVEN,
            ]
            if fmt.pow2
            else [fp4sim.ScaleRule.NEAREST, fp4sim.ScaleRule.RCEIL]
        )
        fmt = fmt.replace(rule=draw(st.sampled_from(rules)))
    if draw(st.booleans()):
        fmt = fmt.replace(policy=draw(policies(fmt.elem)))
    return fmt


@functools.cache
def _jit_quantize(fmt, geometry, axis, kw):
    kw = dict(kw)

    def f(x, rb):
        q = fp4sim.quantize(x, fmt, geometry=geometry, axis=axis, random_bits=rb, **kw)
        return q, fp4sim.dequantize(q)

    return _checkified(f)


@settings(max_examples=32, **SETTINGS)
@given(
    fmt=block_formats(),
    geo=st.sampled_from(
        [
            (fp4sim.Geometry.BLOCK, -1),
            (fp4sim.Geometry.BLOCK, -1),
            (fp4sim.Geometry.PER_ROW, -1),
            (fp4sim.Geometry.SQUARE, -1),
            (fp4sim.Geometry.TOKEN_BLOCK, -2),
        ]
    ),
    rows=st.sampled_from([0, 1, 32]),
    cols=st.sampled_from([32, 64]),
    seed=st.integers(0, 2**16),
    n_special=st.integers(0, 10),
    zero_rows=st.integers(0, 2),
    scale_exp=st.integers(-140, 120),
    const=st.sampled_from([None, 1.0, 0.25, 0.0, -1.0]),
)
def test_quantize_and_dequantize(
    fmt, geo, rows, cols, seed, n_special, zero_rows, scale_exp, const
):
    geometry, axis = geo
    x = _values((rows, cols), seed, n_special, zero_rows, scale_exp)
    kw = ()
    if fmt.global_scale is fp4sim.GlobalScale.CONSTANT:
        kw = (("global_scale", 1.0 if const is None else const),)
    rb = None
    if fmt.policy.rounding is fp4sim.Rounding.STOCHASTIC:
        rb = np.random.default_rng(seed).integers(0, 2**32, x.shape, dtype=np.uint32)

    def f(v, r):
        q = fp4sim.quantize(v, fmt, geometry=geometry, axis=axis, random_bits=r, **dict(kw))
        return q, fp4sim.dequantize(q)

    want = _outcome(f, x, rb)
    got = _outcome(
        _jit_quantize(fmt, geometry, axis, kw),
        jnp.asarray(x),
        None if rb is None else jnp.asarray(rb),
    )
    _same(want, got)


# --- attention presets ----------------------------------------------------------------------
@functools.cache
def _jit_forward(recipe):
    return jax.jit(lambda q, k, v: tuple(fp4sim.attention_forward(q, k, v, recipe))[:2])


@settings(max_examples=6, **SETTINGS)
@given(
    name=st.sampled_from(sorted(fp4sim.PRESETS)),
    seed=st.integers(0, 2**16),
    where=st.sampled_from([0, 1, 2]),
    n_special=st.integers(0, 3),
    zero_rows=st.integers(0, 32),
    scale_exp=st.integers(-20, 20),
)
def test_attention_forward(name, seed, where, n_special, zero_rows, scale_exp):
    recipe = fp4sim.PRESETS[name]
    qkv = [
        _values(
            (32, 64),
            seed + i,
            n_special if i == where else 0,
            zero_rows if i == where else 0,
            scale_exp,
        )
        for i in range(3)
    ]
    with np.errstate(all="ignore"):
        want = _outcome(lambda *a: tuple(fp4sim.attention_forward(*a, recipe))[:2], *qkv)
    got = _outcome(_jit_forward(recipe), *map(jnp.asarray, qkv))
    _same(want, got)


def _intermediates(q, k, v, recipe):
    """O, LSE and every intermediate array of the forward (the quantized operands' values,
    exponents and factors; anchors, P codes, scales, block exponents, numerator, normalizer)."""
    res = fp4sim.attention_forward(q, k, v, recipe, return_intermediates=True)
    it = res.intermediates
    ops = [
        getattr(op, f) for op in (it.q, it.k, it.v) for f in ("values", "exps", "post", "post_exp")
    ]
    rest = [it.anchors, it.p_codes, it.p_scales, it.p_k, it.numerator, it.normalizer]
    return tuple(x for x in [res.out, res.lse, *ops, *rest] if x is not None)


@functools.cache
def _jit_intermediates(recipe):
    return jax.jit(lambda q, k, v: _intermediates(q, k, v, recipe))


@settings(max_examples=6, **SETTINGS)
@given(
    name=st.sampled_from(sorted(fp4sim.PRESETS)),
    seed=st.integers(0, 2**16),
    where=st.sampled_from([1, 0, 2]),  # K first: its specials reach every row's P blocks
    n_special=st.integers(1, 3),
    scale_exp=st.integers(-20, 20),
)
# a NaN in K inside P blocks that hold numbers (the intermediates once differed there)
@example(name="flamia_nvfp4", seed=0, where=1, n_special=2, scale_exp=0)
def test_attention_forward_intermediates(name, seed, where, n_special, scale_exp):
    """With ``return_intermediates=True`` every intermediate, not only O and LSE: 128 keys, so
    that a special value in K lands in P blocks that also hold numbers (where XLA CPU's
    vectorized max reductions once dropped a NaN that NumPy's kept)."""
    recipe = fp4sim.PRESETS[name]
    shapes = [(32, 64), (128, 64), (128, 64)]
    qkv = [
        _values(s, seed + i, n_special if i == where else 0, 0, scale_exp)
        for i, s in enumerate(shapes)
    ]
    with np.errstate(all="ignore"):
        want = _outcome(lambda *a: _intermediates(*a, recipe), *qkv)
    got = _outcome(_jit_intermediates(recipe), *map(jnp.asarray, qkv))
    _same(want, got)

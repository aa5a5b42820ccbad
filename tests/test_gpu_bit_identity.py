"""On a GPU machine: the jitted emulators give the same bits on the GPU as on the CPU backend.

fp4sim promises that emulator results do not depend on where they run. XLA's GPU backend
makes different choices from its CPU backend (fused multiply-add contraction, division
rewrites, flush-to-zero), so this is checked on the hardware: the same jitted function runs on
``jax.devices("gpu")[0]`` and ``jax.devices("cpu")[0]`` and every output is compared as bits.
The training route's gradients are compared too: on the GPU their ordered float32 sums run
on the Pallas kernels of ``fp4sim.attention.ordered_gpu``, on the CPU on the jnp loops.
Skipped without a GPU (the CPU-only legs of the same property, NumPy against jitted JAX on the
CPU, run everywhere in the per-module tests).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from fp4sim import formats
from fp4sim.attention import PRESETS, attention_forward

pytestmark = pytest.mark.gpu


def _bits(x):
    x = np.asarray(x)
    return x.view(np.dtype(f"u{x.dtype.itemsize}")) if x.dtype.kind == "f" else x


def _run_on(device, fn, *args):
    args = jax.device_put(args, device)
    out = jax.jit(fn)(*args)
    return jax.tree_util.tree_map(lambda a: np.asarray(jax.device_get(a)), out)


def _assert_same_bits(a, b, what):
    leaves_a, tree_a = jax.tree_util.tree_flatten(a)
    leaves_b, tree_b = jax.tree_util.tree_flatten(b)
    assert tree_a == tree_b, what
    for i, (x, y) in enumerate(zip(leaves_a, leaves_b)):
        bad = int(np.count_nonzero(_bits(x) != _bits(y)))
        assert bad == 0, f"{what}: leaf {i} differs in {bad} of {x.size} elements (GPU vs CPU)"


@pytest.mark.parametrize("name", ["E2M1", "E4M3", "E5M2", "UE8M0", "UE4M3"])
def test_encode_decode_gpu_equals_cpu(name):
    fmt = formats.format_by_name(name)
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(1 << 16) * np.exp2(rng.integers(-40, 20, 1 << 16))).astype(np.float32)
    x[:8] = [0.0, -0.0, np.inf, -np.inf, 1e-45, -1e-40, 3e38, 2.0**-127]
    if not fmt.signed:
        x = np.abs(x)
    fn = lambda v: formats.decode(formats.encode(v, fmt), fmt)  # noqa: E731
    _assert_same_bits(
        _run_on(jax.devices("gpu")[0], fn, x), _run_on(jax.devices("cpu")[0], fn, x), name
    )


@pytest.mark.parametrize("fmt_name", ["MXFP8_E4M3", "MXFP4", "NVFP4"])
def test_quantize_gpu_equals_cpu(fmt_name):
    fmt = getattr(formats, fmt_name)
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((64, 256)) * np.exp2(rng.integers(-30, 30, (64, 1)))).astype(
        np.float32
    )
    x[3, :32] = 0.0
    x[5, 7] = 1e-41
    fn = lambda v: (lambda q: (q.codes, q.scales, formats.dequantize(q)))(formats.quantize(v, fmt))  # noqa: E731
    _assert_same_bits(
        _run_on(jax.devices("gpu")[0], fn, x), _run_on(jax.devices("cpu")[0], fn, x), fmt_name
    )


@pytest.mark.parametrize(
    "preset",
    [
        "hw_fp4_direct_p",
        "hw_fp4_direct_p_mitchell",
        "hao_log_mxfp8",
        "hw_fp4_fp8_pv",
        "flamia_mxfp8",
        "exact_f32",
    ],
)
@pytest.mark.parametrize("causal", [False, True])
def test_attention_forward_gpu_equals_cpu(preset, causal):
    recipe = PRESETS[preset]
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((2, 256, 128)).astype(np.float32) for _ in range(3))

    def fn(q, k, v):
        return attention_forward(q, k, v, recipe, causal=causal, return_intermediates=True)

    gpu = _run_on(jax.devices("gpu")[0], fn, q, k, v)
    cpu = _run_on(jax.devices("cpu")[0], fn, q, k, v)
    _assert_same_bits(gpu.out, cpu.out, f"{preset} O")
    _assert_same_bits(gpu.lse, cpu.lse, f"{preset} LSE")
    _assert_same_bits(gpu.intermediates.p_codes, cpu.intermediates.p_codes, f"{preset} P codes")


@pytest.mark.parametrize(
    ("recipe_name", "causal"),
    [
        ("direct_p_fp8_training", True),
        ("direct_p_fp8_training", False),
        ("direct_p_fp4_forward", True),
    ],
)
def test_training_gradients_gpu_equals_cpu(recipe_name, causal):
    """The training route's dQ, dK, dV (jit(grad) through emulated_attention, two heads under
    vmap): on the GPU the ordered sums run on fp4sim.attention.ordered_gpu's kernels, on the
    CPU on the jnp loops; the bits must agree."""
    import jax.numpy as jnp

    from fp4sim.attention.autodiff import emulated_attention, training_preset

    recipe = training_preset(recipe_name)
    rng = np.random.default_rng(3)
    q, k, v, do = (rng.standard_normal((2, 256, 64)).astype(np.float32) for _ in range(4))

    def grads(q, k, v, do):
        return jax.grad(
            lambda q, k, v: jnp.sum(
                jax.vmap(lambda a, b, c: emulated_attention(a, b, c, recipe, causal=causal))(
                    q, k, v
                )
                * do
            ),
            argnums=(0, 1, 2),
        )(q, k, v)

    gpu = _run_on(jax.devices("gpu")[0], grads, q, k, v, do)
    cpu = _run_on(jax.devices("cpu")[0], grads, q, k, v, do)
    _assert_same_bits(gpu, cpu, f"{recipe_name} causal={causal} gradients")


def test_ordered_kernel_gpu_equals_numpy_chain():
    """The flushed-chain kernel on the GPU against the term-by-term NumPy oracle, on operands
    whose products straddle 2^-126 (flushes), with Inf and NaN (NaN positions compared)."""
    from ordered_oracle import assert_same_bits, flushed_chain, ftz

    from fp4sim.attention import ordered_gpu

    rng = np.random.default_rng(4)
    shape_a, shape_b = (4, 2, 64, 96), (4, 2, 96, 64)
    a = (rng.standard_normal(shape_a) * np.exp2(rng.integers(-66, -58, shape_a))).astype(np.float32)
    b = (rng.standard_normal(shape_b) * np.exp2(rng.integers(-66, -58, shape_b))).astype(np.float32)
    a[0, 0, 0, 5] = np.inf
    a[1, 1, 3, 7] = np.nan
    want = flushed_chain(a, b)
    want = ftz(want[:, 0] + want[:, 1])
    fn = lambda x, y: ordered_gpu.ordered_product_kernel(x, y, plain=False)  # noqa: E731
    got = _run_on(jax.devices("gpu")[0], fn, a, b)
    assert_same_bits(got, want)


@pytest.mark.parametrize(
    ("preset", "causal"),
    [("hw_fp4_direct_p", False), ("hw_fp4_direct_p", True), ("hw_fp4_direct_p_mitchell", False)],
)
def test_direct_p_forward_kernels_gpu_equal_cpu(preset, causal, monkeypatch):
    """O and LSE without intermediates: on the GPU the Direct-P family runs on the kernels of
    fp4sim.attention.direct_p_gpu (opt-in: FP4SIM_GPU_KERNELS=all; padded keys: 1000 is not a
    multiple of the 128-key tile)."""
    monkeypatch.setenv("FP4SIM_GPU_KERNELS", "all")
    recipe = PRESETS[preset]
    rng = np.random.default_rng(5)
    q = rng.standard_normal((2, 512, 128)).astype(np.float32)
    k, v = (rng.standard_normal((2, 1000, 128)).astype(np.float32) for _ in range(2))
    fn = lambda q, k, v: attention_forward(q, k, v, recipe, causal=causal)[:2]  # noqa: E731
    gpu = _run_on(jax.devices("gpu")[0], fn, q, k, v)
    cpu = _run_on(jax.devices("cpu")[0], fn, q, k, v)
    _assert_same_bits(gpu, cpu, f"{preset} causal={causal} O, LSE")


@pytest.mark.parametrize("kernels", ["default", "all"])
def test_scores_with_a_wide_range_gpu_equal_cpu(kernels, monkeypatch):
    """Scores whose ordered block sum rounds: head-dim blocks of Q/K scaled by up to 2^±12
    (NVFP4 scales far apart within a row) and an Inf key (saturated to the largest code), so
    the running sum of the 16-element block partials needs more than 24 bits (on the CPU it
    differs from the exact sum in 163,700 of 163,840 scores). A kernel that lets its matrix unit
    start a block's product from the running sum, or from the next partial, rounds inside the
    block: on the H200 that made the LSE differ in 63 of 512 rows (2026-12-03) until every
    block partial was flushed before its add."""
    if kernels == "all":
        monkeypatch.setenv("FP4SIM_GPU_KERNELS", "all")
    rng = np.random.default_rng(8)
    scale = np.exp2(rng.integers(-12, 13, (2, 1, 128 // 16, 1))).astype(np.float32)
    q = (rng.standard_normal((2, 256, 8, 16)) * scale).reshape(2, 256, 128).astype(np.float32)
    k = (rng.standard_normal((2, 320, 8, 16)) * scale).reshape(2, 320, 128).astype(np.float32)
    v = rng.standard_normal((2, 320, 128)).astype(np.float32)
    k[0, 5, 3] = np.inf
    for preset, causal in (("hw_fp4_direct_p", False), ("hw_fp4_direct_p_mitchell", True)):
        recipe = PRESETS[preset]

        def fn(q, k, v, recipe=recipe, causal=causal):
            return attention_forward(q, k, v, recipe, causal=causal)[:2]

        gpu = _run_on(jax.devices("gpu")[0], fn, q, k, v)
        cpu = _run_on(jax.devices("cpu")[0], fn, q, k, v)
        _assert_same_bits(gpu, cpu, f"{preset} causal={causal} kernels={kernels} O, LSE")

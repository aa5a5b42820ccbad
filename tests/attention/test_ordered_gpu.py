"""The GPU kernels of the ordered sums (fp4sim.attention.ordered_gpu), checked on the CPU.

The kernels run here in Pallas interpret mode and must give the NumPy definition's bits: the
flushed chain term by term (tests/ordered_oracle.py, written independently of fp4sim), the plain
chain where its products are exact, the causal ranges and the skipped blocks of the backward,
and the training route's gradients and the FP8-PV forward end to end with
``FP4SIM_GPU_KERNELS=interpret`` (the dispatch then takes the kernels on the CPU too). The
kernels are also lowered for ``cuda`` (Triton MLIR) to catch unsupported operations without a
GPU; the GPU run itself is tests/test_gpu_bit_identity.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from cuda_lowering import cuda_text as _cuda_text
from ordered_oracle import assert_same_bits, flushed_chain, ftz

from fp4sim.attention import ordered_gpu as og


def _plain(a, b):
    """The plain chain acc + a_k·b_k (NumPy, no FMA) and one flush, over a's last axis."""
    with np.errstate(all="ignore"):
        acc = a[..., :, 0, None] * b[..., 0, None, :]
        for k in range(1, a.shape[-1]):
            acc = acc + a[..., :, k, None] * b[..., k, None, :]
    return ftz(acc)


def _grouped(parts):
    """Partials (B, G, I, J) added over G in order, flushed."""
    g = parts[:, 0]
    for j in range(1, parts.shape[1]):
        g = ftz(g + parts[:, j])
    return g


def _flushy(rng, shape):
    """Random float32 whose products straddle 2^-126 (many flush, some stay normal)."""
    return (rng.standard_normal(shape) * np.exp2(rng.integers(-66, -58, shape))).astype(np.float32)


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("groups", [1, 3])
def test_chain_kernel_equals_flushed_chain(transposed, groups):
    rng = np.random.default_rng(1)
    a, b = _flushy(rng, (2, groups, 32, 20)), _flushy(rng, (2, groups, 20, 16))
    want = _grouped(flushed_chain(a, b))
    with np.errstate(all="ignore"):
        prods = a[..., :, :, None] * b[..., None, :, :]
        unflushed = _grouped(np.sum(prods, axis=-2, dtype=np.float64).astype(np.float32))
    assert 0.2 < np.mean(np.abs(prods) < 2.0**-126) < 0.9  # many products flush, not all
    assert np.mean(want != unflushed) > 0.2  # and the flushes change the sums
    a_in = np.swapaxes(a, -1, -2) if transposed else a
    got = jax.jit(
        lambda x, y: og.ordered_product_kernel(
            x, y, plain=False, transposed=transposed, interpret=True
        )
    )(a_in, b)
    assert_same_bits(got, want)


def test_chain_kernel_with_inf_nan_and_large_values():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((1, 1, 16, 8)).astype(np.float32)
    b = rng.standard_normal((1, 1, 8, 16)).astype(np.float32)
    a[0, 0, 0, 3] = np.inf
    a[0, 0, 1, 2] = -np.inf
    b[0, 0, 2, 5] = 0.0  # -inf·0 = NaN in row 1, column 5
    a[0, 0, 2, 0] = np.nan
    a[0, 0, 3, :] = 3e38  # overflows to Inf on the way
    got = jax.jit(lambda x, y: og.ordered_product_kernel(x, y, plain=False, interpret=True))(a, b)
    want = _grouped(flushed_chain(a, b))
    assert np.isnan(want).any() and np.isinf(want).any()
    assert_same_bits(got, want)


@pytest.mark.parametrize("groups", [1, 2])
def test_plain_kernel_equals_plain_chain(groups):
    rng = np.random.default_rng(3)
    # 4-bit by 4-bit significands: every product exact (the plain chain's premise), sums round
    a = (
        rng.integers(-15, 16, (2, groups, 16, 64))
        * np.exp2(rng.integers(-4, 20, (2, groups, 16, 64)))
    ).astype(np.float32)
    b = (rng.integers(-15, 16, (2, groups, 64, 32)) * 0.125).astype(np.float32)
    want = _grouped(_plain(a, b))
    got = jax.jit(lambda x, y: og.ordered_product_kernel(x, y, plain=True, interpret=True))(a, b)
    assert_same_bits(got, want)


@pytest.mark.parametrize("transposed", [False, True])
def test_backward_product_ranges_and_skipped_blocks(transposed):
    """Causal zeros in a (the contraction range per row block) and a ``needed`` mask with
    all-zero blocks: the kernel's output is the plain chain's, +0 where nothing is needed."""
    rng = np.random.default_rng(4)
    n = 64
    a = (rng.integers(-7, 8, (2, n, n)) * 0.25).astype(np.float32)
    a = np.tril(a) if not transposed else np.triu(a)  # stored (K, I) when transposed
    b = (rng.integers(-7, 8, (2, n, 32)) * 0.5).astype(np.float32)
    a_mat = np.swapaxes(a, -1, -2) if transposed else a
    needed = np.ones((2, n, 32), np.float32)
    needed[:, :16, 16:] = 0.0  # one all-zero output block (tiles of 16 here)
    needed[1, 20, 3] = np.nan
    want = _plain(a_mat, b)
    got = jax.jit(lambda x, y, z: og.backward_product(x, y, True, z, transposed, interpret=True))(
        a, b, needed
    )
    got = np.asarray(got)
    keep = needed != 0
    assert_same_bits(np.where(keep, got, 0.0), np.where(keep, want, 0.0))
    assert not got[:, :16, 16:].view(np.uint32).any()  # skipped: +0
    got_chain = jax.jit(
        lambda x, y: og.backward_product(x, y, False, None, transposed, interpret=True)
    )(a, b)
    assert_same_bits(got_chain, flushed_chain(a_mat, b))


def test_tile_shape():
    assert og.tile_shape(8, 2048, 128) == (32, 64)  # at most 32 rows: 1024 programs
    assert og.tile_shape(8, 512, 64) == (16, 32)  # halved towards two programs per SM
    assert og.tile_shape(1, 128, 64) == (16, 16)  # not below 16
    assert og.tile_shape(1, 100, 64) is None  # rows not a multiple of 16: the jnp path
    assert og.tile_shape(64, 48, 64) == (16, 32)


def test_mode_and_dispatch(monkeypatch):
    monkeypatch.setenv(og.ENV, "maybe")
    with pytest.raises(ValueError, match="FP4SIM_GPU_KERNELS"):
        og.mode()
    x = jnp.ones((1, 1, 16, 4), jnp.float32)
    y = jnp.ones((1, 1, 4, 16), jnp.float32)

    def gpu(a, b, *, interpret):
        return og.ordered_product_kernel(a, b, plain=True, interpret=interpret)

    def default(a, b):
        return jnp.zeros((1, 16, 16), jnp.float32)

    on_cuda = jax.devices()[0].platform == "gpu"  # the kernel runs where jit lowers for cuda
    texts = {}
    for m in ("0", "1", "interpret"):
        monkeypatch.setenv(og.ENV, m)
        texts[m] = str(
            jax.make_jaxpr(lambda a, b: og.on_gpu(gpu, default, a, b, family="ordered"))(x, y)
        )
        out = jax.jit(lambda a, b: og.on_gpu(gpu, default, a, b, family="ordered"))(x, y)
        kernel = m == "interpret" or (m == "1" and on_cuda)
        assert float(out[0, 0, 0]) == (4.0 if kernel else 0.0)
    assert "pallas_call" not in texts["0"]
    assert "pallas_call" in texts["1"] and "platform_index" in texts["1"]
    # NumPy inputs never dispatch
    assert og.on_gpu(gpu, lambda a, b: "numpy", np.ones(2), np.ones(2), family="ordered") == "numpy"
    # the default leaves the Direct-P kernels off; "all" turns them on
    monkeypatch.setenv(og.ENV, "1")
    assert og.mode() == "ordered,pv,rows,scores"
    monkeypatch.setenv(og.ENV, "all")
    assert og.mode() == "direct_p,ordered,pv,rows,scores"
    # a subset of the families: the others take the default
    monkeypatch.setenv(og.ENV, "scores, rows")
    assert og.mode() == "rows,scores"
    assert "pallas_call" not in str(
        jax.make_jaxpr(lambda a, b: og.on_gpu(gpu, default, a, b, family="ordered"))(x, y)
    )
    assert "pallas_call" in str(
        jax.make_jaxpr(lambda a, b: og.on_gpu(gpu, default, a, b, family="scores"))(x, y)
    )
    monkeypatch.setenv(og.ENV, "scores,bogus")
    with pytest.raises(ValueError, match="subset"):
        og.mode()
    with pytest.raises(ValueError, match="family"):
        og.on_gpu(gpu, default, x, y, family="other")


def _count_kernel_calls(monkeypatch):
    """A list that records every trace of ``ordered_product_kernel`` (plain flag) from now."""
    calls = []
    kernel = og.ordered_product_kernel

    def counting(*args, **kw):
        calls.append(kw["plain"])
        return kernel(*args, **kw)

    monkeypatch.setattr(og, "ordered_product_kernel", counting)
    return calls


def _bits_equal(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.slow
def test_training_route_through_the_kernels_equals_numpy(monkeypatch):
    """The FP8 training route's gradients (causal, two heads under vmap) with every ordered
    sum on the kernels (interpret mode) equal the jnp path's and the NumPy emulator's."""
    from fp4sim.attention.autodiff import (
        emulated_attention,
        training_backward,
        training_forward,
        training_preset,
    )

    rec = training_preset("direct_p_fp8_training")
    rng = np.random.default_rng(5)
    q, k, v, do = (rng.standard_normal((2, 128, 64)).astype(np.float32) for _ in range(4))

    calls = _count_kernel_calls(monkeypatch)

    def grads(m):
        monkeypatch.setenv(og.ENV, m)
        calls.clear()
        f = jax.jit(
            jax.grad(
                lambda q, k, v: jnp.sum(
                    jax.vmap(lambda a, b, c: emulated_attention(a, b, c, rec, causal=True))(q, k, v)
                    * do
                ),
                argnums=(0, 1, 2),
            )
        )
        out = [np.asarray(x) for x in f(q, k, v)]
        # interpret: the forward's PV sums and the four backward products (plain and chain
        # branch of each) were traced on the kernel
        assert (len(calls) >= 10) == (m == "interpret"), calls
        return out

    kernels, plain_jnp = grads("interpret"), grads("0")
    for a, b in zip(kernels, plain_jnp):
        assert _bits_equal(a, b)
    _, saved = training_forward(q[1], k[1], v[1], rec, causal=True)
    for a, b in zip(training_backward(saved, do[1], rec).grads, kernels):
        assert _bits_equal(a, b[1])


@pytest.mark.parametrize(
    ("preset", "causal", "gpu_chunk"),
    [
        ("hw_fp4_fp8_pv", False, None),
        ("hw_fp4_fp8_pv", True, 64),
        ("hw_fp4_direct_p", True, None),
        ("hw_fp4_direct_p", False, 64),
    ],
)
def test_forward_through_the_kernels_equals_numpy(monkeypatch, preset, causal, gpu_chunk):
    """Forwards with NVFP4 Q/K (the exact score kernel) and, for the FP8 P/V route, ordered PV
    sums (E4M3 P, token-block FP8 V); masked keys (−inf scores), 192 query rows: more than one
    CPU row chunk, one GPU row chunk by default, three of ``gpu_chunk``."""
    from fp4sim.attention import PRESETS, attention_forward, forward

    monkeypatch.setenv(og.ENV, "interpret")
    if gpu_chunk is not None:
        monkeypatch.setattr(forward, "_GPU_ROW_CHUNK", gpu_chunk)
    calls = _count_kernel_calls(monkeypatch)
    scores = []
    kernel = og.exact_scores
    monkeypatch.setattr(og, "exact_scores", lambda *a, **kw: scores.append(1) or kernel(*a, **kw))
    pvs = []
    pv_kernel = og.exact_pv_fold
    monkeypatch.setattr(og, "exact_pv_fold", lambda *a, **kw: pvs.append(1) or pv_kernel(*a, **kw))
    if preset == "hw_fp4_direct_p":  # the exact scores of the XLA path, not the Direct-P kernels
        monkeypatch.setattr(forward, "_fused_direct_p", lambda *a: False)
    rec = PRESETS[preset]
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((1, 192, 64)).astype(np.float32) for _ in range(3))
    fn = jax.jit(lambda q, k, v: attention_forward(q, k, v, rec, causal=causal)[:2])
    got = fn(q, k, v)
    assert scores and (bool(calls) == (preset == "hw_fp4_fp8_pv"))
    assert bool(pvs) == (preset == "hw_fp4_direct_p")  # FP4 P and V: the exact PV kernel
    want = attention_forward(q, k, v, rec, causal=causal)
    assert _bits_equal(got[0], want.out) and _bits_equal(got[1], want.lse)


@pytest.mark.parametrize("plain", [False, True])
def test_kernels_lower_for_cuda(plain):
    text = _cuda_text(
        lambda a, b, n: og.backward_product(a, b, plain, n, True),
        (2, 512, 256),
        (2, 512, 64),
        (2, 256, 64),
    )
    assert "xla.gpu.triton" in text
    text = _cuda_text(
        lambda a, b: og.grouped_product(a, b, 2, plain), (2, 4, 128, 32), (2, 4, 32, 64)
    )
    assert "xla.gpu.triton" in text


def test_exact_scores_kernel():
    """NVFP4-valued Q/K (E2M1 payload × UE4M3 scale): the kernel's block sums equal the CPU's
    ordered sum of exact block partials; lowered for cuda too."""
    from fp4sim.formats.codec import decode, value_table
    from fp4sim.formats.spec import E2M1, UE4M3

    rng = np.random.default_rng(7)
    scales = np.asarray(value_table(UE4M3), np.float32)
    scales = scales[np.isfinite(scales) & (scales > 0)]

    def operand(s):
        codes = rng.integers(0, 16, (2, s, 64)).astype(np.uint8)
        sc = rng.choice(scales, (2, s, 4)).astype(np.float32)
        return (np.asarray(decode(codes, E2M1)) * np.repeat(sc, 16, axis=-1)).astype(np.float32)

    qv, kv = operand(32), operand(48)
    parts = np.einsum(
        "bsnk,btnk->bnst",
        qv.reshape(2, 32, 4, 16).astype(np.float64),
        kv.reshape(2, 48, 4, 16).astype(np.float64),
    ).astype(np.float32)
    want = parts[:, 0]
    for b in range(1, 4):
        want = want + parts[:, b]
    got = jax.jit(lambda a, b: og.exact_scores(a, b, 16, interpret=True))(qv, kv)
    assert_same_bits(got, want)
    assert "xla.gpu.triton" in _cuda_text(
        lambda a, b: og.exact_scores(a, b, 16), (2, 128, 128), (2, 256, 128)
    )


@pytest.mark.parametrize("per_group", [1, 2, 4])
def test_exact_pv_fold_kernel(per_group):
    """FP4 P (E2M1 × a power of two per sub-block row) times FP4 V (E2M1 × UE4M3): the kernel's
    numerator equals the exact sub-block partials, flushed, added in group order with flushed
    adds, folded tile by tile as ``A ← fl(A·r_i)`` plus the group sums (what the forward
    computes on the CPU); lowered for cuda too."""
    from fp4sim.formats.codec import decode, value_table
    from fp4sim.formats.spec import E2M1, UE4M3

    rng = np.random.default_rng(11)
    scales = np.asarray(value_table(UE4M3), np.float32)
    scales = scales[np.isfinite(scales) & (scales > 0)]
    nt, ns, sq, sub, dv = 3, 4, 48, 32, 32
    p = np.asarray(decode(rng.integers(0, 16, (2, nt, ns, sq, sub)).astype(np.uint8), E2M1))
    # per (row, sub-block) a power of two over 100 binades (every product stays normal: the
    # forward's operands are flushed below 2^-126 and its P scales keep the products above it)
    p = (p * np.exp2(rng.integers(-100, 0, (2, nt, ns, sq, 1)))).astype(np.float32)
    v = np.asarray(decode(rng.integers(0, 16, (2, nt, ns, sub, dv)).astype(np.uint8), E2M1))
    # one scale per sub-block and column (the forward's sub-blocks never straddle a V block)
    v = (v * rng.choice(scales, (2, nt, ns, 1, dv))).astype(np.float32)
    exact = np.matmul(p.astype(np.float64), v.astype(np.float64))
    assert np.array_equal(exact.astype(np.float32), exact)  # every partial exact in float32
    parts = ftz(exact.astype(np.float32))
    assert np.ptp(np.log2(np.abs(parts[parts != 0]))) > 80  # partials over many binades
    parts = parts.reshape(2, nt, ns // per_group, per_group, sq, dv)
    g = parts[:, :, :, 0]
    for j in range(1, per_group):
        g = ftz(g + parts[:, :, :, j])
    # rescale factors in (0, 1], exact ones and zeros (a row whose earlier tiles were masked)
    rt = rng.uniform(0.0, 1.0, (2, nt, sq)).astype(np.float32)
    rt[:, :, :4] = 1.0
    rt[:, 0, 4:8] = 0.0
    want = np.zeros((2, sq, dv), np.float32)
    for i in range(nt):
        want = ftz(want * rt[:, i, :, None])
        for j in range(ns // per_group):
            want = ftz(want + g[:, i, j])
    got = jax.jit(lambda a, b, r: og.exact_pv_fold(a, b, r, per_group, interpret=True))(p, v, rt)
    assert_same_bits(got, want)
    other = og.exact_pv_fold(p, v, rt, per_group, interpret=True, block=(16, 16), num_warps=2)
    assert_same_bits(other, want)  # any program block: the same bits
    with pytest.raises(ValueError, match="block"):
        og.exact_pv_fold(p, v, rt, per_group, interpret=True, block=(32, 32))  # 48 rows
    assert "xla.gpu.triton" in _cuda_text(
        lambda a, b, r: og.exact_pv_fold(a, b, r, per_group),
        (2, nt, ns, 64, sub),
        (2, nt, ns, sub, 128),
        (2, nt, 64),
    )

"""Foreign arrays in, the caller's type out, and codes <-> ml_dtypes / PyTorch arrays.

PyTorch is not installed on the CI machine (a CPU wheel for Python 3.12 is not available from
its registry mirror; the default wheel is a multi-GB CUDA build), so the PyTorch tests skip
there (each names the reason); the DLPack path that PyTorch tensors take is tested with a
minimal object that implements ``__dlpack__`` over a NumPy array. Where torch is installed the
CPU-tensor tests run (they pass with torch 2.14.1, CPU); the CUDA-tensor tests (marked ``gpu``)
also need a CUDA device visible to torch: ``scripts/nb_h200.sh`` runs the whole file on the
GPU machine (torch with CUDA beside jax's CUDA backend).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import fp4sim
from fp4sim import _xp
from fp4sim.formats import blocks

RNG = np.random.default_rng(20261202)
X = (RNG.standard_normal((4, 64)) * 3).astype(np.float32)
ML_FORMATS = [fp4sim.E2M1, fp4sim.E2M3, fp4sim.E3M2, fp4sim.E4M3, fp4sim.E5M2, fp4sim.UE8M0]


class DLPackOnly:
    """An array type fp4sim does not know: only the DLPack protocol, over a NumPy array."""

    def __init__(self, a: np.ndarray) -> None:
        self._a = a

    def __dlpack__(self, **kwargs):
        return self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


class Unreadable:
    def __dlpack__(self, **kwargs):
        raise BufferError("device memory")

    def __dlpack_device__(self):
        return (2, 0)  # kDLCUDA


def test_dlpack_objects_give_the_same_bits_as_numpy():
    codes = fp4sim.encode(DLPackOnly(X), fp4sim.E2M1)
    assert isinstance(codes, np.ndarray) and np.array_equal(codes, fp4sim.encode(X, fp4sim.E2M1))
    back = fp4sim.decode(DLPackOnly(codes), fp4sim.E2M1)
    assert np.array_equal(back, fp4sim.decode(codes, fp4sim.E2M1))
    q, r = blocks.quantize(DLPackOnly(X), blocks.NVFP4), blocks.quantize(X, blocks.NVFP4)
    assert np.array_equal(q.codes, r.codes) and np.array_equal(q.scales, r.scales)
    qq, kk, vv = (RNG.standard_normal((1, 64, 32)).astype(np.float32) for _ in range(3))
    a = fp4sim.attention_forward(
        DLPackOnly(qq), DLPackOnly(kk), DLPackOnly(vv), fp4sim.HW_FP4_DIRECT_P
    )
    b = fp4sim.attention_forward(qq, kk, vv, fp4sim.HW_FP4_DIRECT_P)
    assert np.array_equal(a.out, b.out) and np.array_equal(a.lse, b.lse)


def test_numpy_and_jax_pass_unchanged():
    assert _xp.adopt(X) is X
    assert not _xp.is_foreign(X) and not _xp.is_foreign(None) and not _xp.is_foreign(1.5)
    assert _xp.like_caller(X, X) is X


def test_an_unreadable_dlpack_object_is_a_clear_type_error():
    with pytest.raises(TypeError, match=r"values: Unreadable object cannot be read through DLPack"):
        fp4sim.encode(Unreadable(), fp4sim.E2M1)


@pytest.mark.parametrize("fmt", ML_FORMATS, ids=lambda f: f.name)
def test_codes_to_ml_dtypes_and_back(fmt):
    codes = np.arange(fmt.num_codes, dtype=np.uint8)
    typed = fp4sim.to_ml_dtypes(codes, fmt)
    assert typed.dtype == np.dtype(fmt.dtype)
    got, want = typed.astype(np.float32), fp4sim.decode(codes, fmt)
    assert np.array_equal(got, want, equal_nan=True)
    back, f = fp4sim.from_ml_dtypes(typed)
    assert f is fmt and np.array_equal(back, codes)


@pytest.mark.parametrize(
    "fmt", [fp4sim.E2M1, fp4sim.E2M3, fp4sim.E3M2, fp4sim.E4M3, fp4sim.E5M2], ids=lambda f: f.name
)
def test_ml_dtypes_casts_read_as_fp4sim_codes(fmt):
    x = np.clip(X, -fmt.max, fmt.max)  # in range: ml_dtypes and fp4sim both round to nearest even
    codes, f = fp4sim.from_ml_dtypes(x.astype(fmt.dtype))
    assert f is fmt and np.array_equal(codes, fp4sim.encode(x, fmt))


def test_ue4m3_scales_view_as_float8_e4m3fn():
    q = blocks.quantize(X, blocks.NVFP4_SINGLE)
    s = fp4sim.to_ml_dtypes(q.scales, fp4sim.UE4M3)
    assert s.dtype == np.dtype(ml_dtypes.float8_e4m3fn)
    assert np.array_equal(s.astype(np.float32), fp4sim.decode(q.scales, fp4sim.UE4M3))


def test_conversion_errors_name_the_argument():
    with pytest.raises(ValueError, match="UE5M3 has no ml_dtypes dtype"):
        fp4sim.to_ml_dtypes(np.zeros(4, np.uint8), fp4sim.UE5M3)
    with pytest.raises(ValueError, match="codes contains 0x10"):
        fp4sim.to_ml_dtypes(np.array([16], np.uint8), fp4sim.E2M1)
    with pytest.raises(TypeError, match="codes has dtype float32"):
        fp4sim.to_ml_dtypes(X, fp4sim.E4M3)
    with pytest.raises(TypeError, match="arr must be a NumPy array of an ml_dtypes dtype"):
        fp4sim.from_ml_dtypes(X)
    with pytest.raises(TypeError, match="t must be a torch.Tensor"):
        fp4sim.from_torch(X)
    with pytest.raises(ValueError, match="E2M3 has no PyTorch dtype"):
        fp4sim.to_torch(np.zeros(4, np.uint8), fp4sim.E2M3)


# --- PyTorch (skipped where torch is not installed) -----------------------------------------------


def _torch():
    return pytest.importorskip("torch", reason="torch is not installed")


def _cuda():
    torch = _torch()
    if not torch.cuda.is_available():
        pytest.skip(f"torch {torch.__version__} sees no CUDA device here")
    return torch


def _bf16_pair(torch, shape=(4, 64), *, device="cpu", requires_grad=True):
    """A bf16 tensor (requiring grad) and the same values as a NumPy ml_dtypes.bfloat16 array."""
    g = torch.Generator().manual_seed(20261202)
    t = (torch.randn(*shape, generator=g) * 3).to(torch.bfloat16).to(device)
    t.requires_grad_(requires_grad)
    same = t.detach().cpu().float().numpy().astype(ml_dtypes.bfloat16)  # exact: bf16 -> f32 -> bf16
    return t, same


def test_torch_bf16_through_quantize_gives_the_numpy_bits():
    torch = _torch()
    t, same = _bf16_pair(torch)
    for fmt in (blocks.NVFP4, blocks.MXFP4, blocks.MXFP8):
        q, r = blocks.quantize(t, fmt), blocks.quantize(same, fmt)
        # documented: quantize returns NumPy codes and scales for any input
        assert isinstance(q.codes, np.ndarray) and isinstance(q.scales, np.ndarray)
        assert np.array_equal(q.codes, r.codes) and np.array_equal(q.scales, r.scales)
        assert np.array_equal(blocks.dequantize(q), blocks.dequantize(r))
    assert t.requires_grad and t.grad is None  # read, not changed or differentiated


def test_torch_bf16_attention_forward_gives_the_numpy_bits():
    torch = _torch()
    (q, qn), (k, kn), (v, vn) = (_bf16_pair(torch, (1, 64, 32)) for _ in range(3))
    a = fp4sim.attention_forward(q, k, v, fp4sim.HW_FP4_DIRECT_P, causal=True)
    b = fp4sim.attention_forward(qn, kn, vn, fp4sim.HW_FP4_DIRECT_P, causal=True)
    assert isinstance(a.out, np.ndarray)  # documented: the results are NumPy
    assert np.array_equal(a.out, b.out) and np.array_equal(a.lse, b.lse)


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
def test_torch_float8_tensors_are_values_and_codes(name):
    # from_torch reads a float8 tensor's codes; as values it is what it holds, widened exactly
    torch = _torch()
    t = torch.from_numpy(np.clip(X, -400, 400)).to(getattr(torch, name))
    codes, fmt = fp4sim.from_torch(t)
    assert np.array_equal(codes, t.view(torch.uint8).numpy())
    assert np.array_equal(fp4sim.decode(codes, fmt), t.float().numpy())
    got = fp4sim.encode(t, fp4sim.E2M1)
    assert np.array_equal(got.numpy(), fp4sim.encode(t.float().numpy(), fp4sim.E2M1))
    q = blocks.quantize(t.requires_grad_(False), blocks.NVFP4)
    ref = blocks.quantize(t.float().numpy(), blocks.NVFP4)
    assert np.array_equal(q.codes, ref.codes) and np.array_equal(q.scales, ref.scales)


@pytest.mark.parametrize(
    "name",
    [
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e8m0fnu",
        "float6_e2m3fn",
        "float6_e3m2fn",
        "float4_e2m1fn",
    ],
)
def test_narrow_float_arrays_are_values_widened_exactly(name):
    """Every code of an ml_dtypes narrow float, as values: float32 widening equal to ml_dtypes'
    own cast (NaN where it is NaN), the same E2M1 codes and NVFP4 blocks as those float32
    values, on NumPy and (8-bit dtypes) under jax.jit; jax sub-byte arrays raise TypeError."""
    import jax
    import jax.numpy as jnp

    from fp4sim.formats import codec

    dt = np.dtype(getattr(ml_dtypes, name))
    x = np.arange(2 ** ml_dtypes.finfo(dt).bits, dtype=np.uint8).view(dt)
    x = np.tile(x, 64 // x.size + 1)[:64].reshape(4, 16) if x.size < 64 else x.reshape(-1, 16)
    f = x.astype(np.float32)
    w = codec.widen_to_f32(x)
    nan = np.isnan(f)
    assert np.array_equal(np.isnan(w), nan) and np.array_equal(w[~nan], f[~nan])
    assert np.array_equal(w.view(np.uint32)[~nan], f.view(np.uint32)[~nan])  # ±0 kept
    assert np.array_equal(fp4sim.encode(x, fp4sim.E2M1), fp4sim.encode(f, fp4sim.E2M1))
    finite = np.where(np.isfinite(f), f, 0).astype(np.float32)
    xf = np.where(np.isfinite(f), x, np.zeros((), dt)).astype(dt)
    q, ref = blocks.quantize(xf, blocks.NVFP4), blocks.quantize(finite, blocks.NVFP4)
    assert np.array_equal(q.codes, ref.codes) and np.array_equal(q.scales, ref.scales)
    if ml_dtypes.finfo(dt).bits == 8:
        got = jax.jit(lambda v: fp4sim.encode(v, fp4sim.E2M1))(jnp.asarray(x))
        assert np.array_equal(np.asarray(got), fp4sim.encode(f, fp4sim.E2M1))
    else:
        with pytest.raises(TypeError, match="sub-byte floats"):
            jax.jit(codec.widen_to_f32)(jnp.asarray(x))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_torch_encode_decode_return_tensors(dtype):
    torch = _torch()
    t = torch.from_numpy(X).to(getattr(torch, dtype)).requires_grad_(True)
    codes = fp4sim.encode(t, fp4sim.E4M3)
    assert (
        isinstance(codes, torch.Tensor) and codes.dtype == torch.uint8 and codes.device == t.device
    )
    ref = fp4sim.encode(t.detach().float().numpy(), fp4sim.E4M3)
    assert np.array_equal(codes.numpy(), ref)
    vals = fp4sim.decode(codes, fp4sim.E4M3)
    assert isinstance(vals, torch.Tensor) and vals.dtype == torch.float32
    assert np.array_equal(vals.numpy(), fp4sim.decode(ref, fp4sim.E4M3))


@pytest.mark.parametrize(
    "fmt", [fp4sim.E4M3, fp4sim.E5M2, fp4sim.UE8M0, fp4sim.E2M1], ids=lambda f: f.name
)
def test_torch_low_precision_tensors_round_trip(fmt):
    torch = _torch()
    codes = fp4sim.encode(np.abs(X) if not fmt.signed else X, fmt)
    t = fp4sim.to_torch(codes, fmt)
    back, f = fp4sim.from_torch(t)
    assert f is fmt and np.array_equal(back, codes)
    if fmt is not fp4sim.E2M1:  # torch converts its float8 dtypes to float32 itself
        assert np.array_equal(t.float().numpy(), fp4sim.decode(codes, fmt), equal_nan=True)
    else:
        assert t.dtype == torch.float4_e2m1fn_x2 and t.shape[-1] == codes.shape[-1] // 2


# --- CUDA tensors (marked gpu: scripts/nb_h200.sh runs them on the GPU machine) -------------------


@pytest.mark.gpu
def test_cuda_bf16_tensors_give_the_numpy_bits_and_stay_on_the_device():
    torch = _cuda()
    t, same = _bf16_pair(torch, device="cuda")
    codes = fp4sim.encode(t, fp4sim.E4M3)
    assert codes.device == t.device and codes.dtype == torch.uint8
    assert np.array_equal(codes.cpu().numpy(), fp4sim.encode(same, fp4sim.E4M3))
    vals = fp4sim.decode(codes, fp4sim.E4M3)
    assert vals.device == t.device and vals.dtype == torch.float32
    assert np.array_equal(
        vals.cpu().numpy(), fp4sim.decode(fp4sim.encode(same, fp4sim.E4M3), fp4sim.E4M3)
    )
    for fmt in (blocks.NVFP4, blocks.MXFP4, blocks.MXFP8):
        q, r = blocks.quantize(t, fmt), blocks.quantize(same, fmt)
        assert np.array_equal(q.codes, r.codes) and np.array_equal(q.scales, r.scales)


@pytest.mark.gpu
def test_cuda_bf16_attention_forward_gives_the_numpy_bits():
    torch = _cuda()
    (q, qn), (k, kn), (v, vn) = (_bf16_pair(torch, (1, 64, 32), device="cuda") for _ in range(3))
    a = fp4sim.attention_forward(q, k, v, fp4sim.HW_FP4_DIRECT_P)
    b = fp4sim.attention_forward(qn, kn, vn, fp4sim.HW_FP4_DIRECT_P)
    assert np.array_equal(a.out, b.out) and np.array_equal(a.lse, b.lse)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "fmt", [fp4sim.E4M3, fp4sim.E5M2, fp4sim.UE8M0, fp4sim.E2M1], ids=lambda f: f.name
)
def test_cuda_low_precision_tensors_round_trip(fmt):
    torch = _cuda()
    codes = fp4sim.encode(np.abs(X) if not fmt.signed else X, fmt)
    t = fp4sim.to_torch(codes, fmt, device="cuda")
    assert isinstance(t, torch.Tensor) and t.device.type == "cuda"
    back, f = fp4sim.from_torch(t)
    assert f is fmt and np.array_equal(back, codes)


def test_the_narrow_float_dtypes_are_the_formats_with_an_ml_dtype():
    """The input check's list of narrow float dtypes (``fp4sim._checks``, below the formats
    layer) names exactly the dtypes whose codes an fp4sim format stores."""
    from fp4sim import _checks
    from fp4sim.formats import spec

    assert set(_checks.NARROW_FLOAT_DTYPES) == set(spec.ML_DTYPE_FORMATS)
    for name, fmt in spec.ML_DTYPE_FORMATS.items():
        assert np.dtype(fmt.dtype).name == name

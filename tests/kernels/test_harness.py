"""The kernel test harness: interpret-mode runner, race detection, cross-lowering, GPU detection."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from fp4sim.kernels import harness
from fp4sim.kernels.harness import Arch, KernelRaceError, cross_lower, interpret, interpreting


def _add_one():
    def body(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1.0

    return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((256,), jnp.float32))


def _e8m0_cast():
    def body(x_ref, o_ref):  # fp8 e8m0 casts exist only on Blackwell
        o_ref[...] = x_ref[...].astype(jnp.float8_e8m0fnu).astype(jnp.float32)

    return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((256,), jnp.float32))


def test_interpret_runs_a_kernel_on_cpu():
    x = jnp.arange(256, dtype=jnp.float32)
    np.testing.assert_array_equal(np.asarray(interpret(_add_one(), x)), np.arange(256) + 1.0)


def test_interpreting_is_true_only_while_tracing_under_interpret():
    seen = []

    def probe(x):
        seen.append(interpreting())
        return x

    assert not interpreting()
    interpret(probe, jnp.zeros(4))
    assert seen == [True] and not interpreting()


def _racy_kernel():
    """Two warpgroups store to the same SMEM word with no barrier between them."""

    def body(o_ref, s_ref):
        wg = jax.lax.axis_index("wg")
        s_ref[...] = jnp.full((128,), wg, jnp.int32)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(s_ref, o_ref.at[pl.ds(0, 128)])
        plgpu.wait_smem_to_gmem(0)

    return plgpu.kernel(
        body,
        out_type=jax.ShapeDtypeStruct((128,), jnp.int32),
        scratch_types=[plgpu.SMEM((128,), jnp.int32)],
        num_threads=2,
        thread_name="wg",
    )


def test_race_detector_reports_a_race():
    with pytest.raises(KernelRaceError, match="race"):
        interpret(_racy_kernel())
    # state was reset: the next run is clean
    np.testing.assert_array_equal(np.asarray(interpret(_add_one(), jnp.zeros(256))), 1.0)


def test_interpret_state_is_reset_after_a_failing_kernel():
    def bad(x):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        interpret(bad, jnp.zeros(4))
    np.testing.assert_array_equal(np.asarray(interpret(_add_one(), jnp.zeros(256))), 1.0)


def test_cross_lower_targets_the_requested_arch():
    import jax.experimental.mosaic.gpu.utils as mgpu_utils

    orig = mgpu_utils._infer_arch
    aval = jax.ShapeDtypeStruct((256,), jnp.float32)
    with pytest.raises(ValueError, match="Blackwell"):
        cross_lower(_e8m0_cast(), aval)  # sm_90a: no e8m0 conversion
    text = cross_lower(_e8m0_cast(), aval, arch=Arch.SM100A)
    assert "mosaic_gpu" in text
    assert mgpu_utils._infer_arch is orig  # the arch patch was undone
    with pytest.raises(ValueError, match="Blackwell"):
        cross_lower(_e8m0_cast(), aval)


def test_cross_lower_catches_what_interpret_mode_lets_through():
    # fp8 wgmma with an N-major B runs in interpret mode but is illegal on Hopper
    def body(a_g, b_g, o_g, a_s, b_s, o_s, bar):
        plgpu.copy_gmem_to_smem(a_g, a_s, bar.at[0])
        plgpu.copy_gmem_to_smem(b_g, b_s, bar.at[1])
        plgpu.barrier_wait(bar.at[0])
        plgpu.barrier_wait(bar.at[1])

        def mm(acc):
            plgpu.wgmma(acc, a_s, b_s)
            return acc[...]

        o_s[...] = pl.run_scoped(mm, plgpu.ACC((64, 64), jnp.float32))
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_s, o_g)
        plgpu.wait_smem_to_gmem(0)

    f8 = jnp.float8_e4m3fn
    k = plgpu.kernel(
        body,
        out_type=jax.ShapeDtypeStruct((64, 64), jnp.float32),
        scratch_types=[
            plgpu.SMEM((64, 64), f8, transforms=harness.smem_transforms(f8, 64)),
            plgpu.SMEM((64, 64), f8, transforms=harness.smem_transforms(f8, 64)),
            plgpu.SMEM((64, 64), jnp.float32),
            plgpu.Barrier(num_barriers=2),
        ],
    )
    a = jnp.asarray(np.eye(64, dtype=np.float32)).astype(f8)
    b = jnp.asarray(np.arange(64 * 64, dtype=np.float32).reshape(64, 64) % 7).astype(f8)
    out = interpret(k, a, b)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(b.astype(jnp.float32)))
    with pytest.raises(ValueError, match="transpose"):
        cross_lower(k, a, b)


def test_smem_transforms():
    til, sw = harness.smem_transforms(jnp.float16, 64)
    assert sw.swizzle == 128 and til.tiling == (8, 64)
    til, sw = harness.smem_transforms(jnp.float8_e4m3fn, 64)
    assert sw.swizzle == 64 and til.tiling == (8, 64)
    til, sw = harness.smem_transforms(jnp.float4_e2m1fn, 256)
    assert sw.swizzle == 128 and til.tiling == (8, 256)


def test_bad_arguments_name_the_argument():
    with pytest.raises(TypeError, match="arch"):
        cross_lower(_add_one(), jnp.zeros(256), arch=(9, 0))
    with pytest.raises(ValueError, match="num_sms"):
        interpret(_add_one(), jnp.zeros(256), num_sms=0)
    with pytest.raises(TypeError, match="fn"):
        interpret(3)
    with pytest.raises(TypeError, match="detect_races"):
        harness.interpret_params(detect_races="yes")
    with pytest.raises(ValueError, match="minor"):
        harness.smem_transforms(jnp.float16, 0)


def test_gpu_detection_is_consistent():
    if harness.gpu_available():
        assert harness.device_arch() is not None
    else:
        assert harness.device_arch() is None


@pytest.mark.gpu
def test_device_is_hopper_or_newer():
    assert harness.device_arch() >= (9, 0)


def test_small_xla_cpu_pool_warns_before_interpreting(monkeypatch):
    """Fewer than MIN_CPU_THREADS XLA:CPU threads (NPROC or the CPU count) is where the GPU
    interpreter deadlocks on multi-warpgroup kernels: interpret() says so instead of hanging
    silently; the suite itself runs with NPROC=8 (tests/conftest.py)."""
    monkeypatch.setenv("NPROC", "2")
    assert harness.xla_cpu_threads() == 2
    with pytest.warns(RuntimeWarning, match="NPROC=8"):
        harness.warn_if_small_cpu_pool()
    monkeypatch.setenv("NPROC", str(harness.MIN_CPU_THREADS))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        harness.warn_if_small_cpu_pool()

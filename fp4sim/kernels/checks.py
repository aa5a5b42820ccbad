"""The kernel checks of ``python -m fp4sim validate``: each kernel against the emulator, per GPU.

This module owns the registry :data:`CHECKS`: for every fp4sim kernel, which architectures run
it and how its output is compared with the emulator, by the kernel's own contract:

* ``quantize.*`` (:mod:`fp4sim.kernels.quantize_mgpu`, any sm_90 or newer GPU): codes, scales
  and global factor **bitwise** equal to :func:`fp4sim.formats.blocks.quantize` on a tensor with
  wide exponents, subnormals, zeros, NaN and Inf;
* ``wgmma_probe.fp8`` (Hopper): one E4M3 ``wgmma`` chain **bitwise** equal to
  :data:`~fp4sim.formats.matmul.HOPPER_FP8_MODEL`;
* ``attention_fp8.exact_debug`` (Hopper): the FP8 attention kernel with exact P conversion on
  integer-valued operands: P codes, row sums and maxima of a debug tile **bitwise** equal to
  the emulator's reference, O within 2e-3 of its largest magnitude (the FP8 ``wgmma``
  accumulation bound measured on the H200);
* ``attention_directp.float_inputs`` (Hopper): the Direct-P FP4 kernel on Gaussian inputs:
  relative L2 distance to the emulator's forward at most 2e-2 (scores are not exact, a P code
  may flip at a boundary);
* ``blackwell_matmul.*`` (Blackwell, sm_100): :func:`fp4sim.kernels.blackwell_matmul_mgpu.\
blackwell_scaled_matmul` **bitwise** equal to ``scaled_matmul(..., accumulation=TCGEN05)``;
* ``attention_sm100.*`` (Blackwell, sm_100): every shipped configuration of
  :mod:`fp4sim.kernels.attention_sm100` (MXFP8 and Direct-P FP4 routes) on Gaussian inputs,
  float32 O within relative L2 distance 1e-4 of ``attention_forward(...,
  accumulation=ForwardAccumulation.TCGEN05)`` and LSE within 1e-4 (absolute, natural log): the
  emulator defines S and P bit for bit, the kernel's ``ex2.approx`` rescale and division leave
  rounding-level differences. These kernels have only been compiled (never run): on other
  architectures they are listed as not for this architecture.

:func:`run_checks` runs those an architecture supports and returns :class:`CheckResult` rows.
A check that raises is reported as ``ERROR`` with the message; the others still run.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = [
    "Verdict",
    "KernelCheck",
    "CheckResult",
    "CHECKS",
    "supported",
    "run_checks",
    "quantize_check",
    "attention_fp8_check",
    "attention_directp_check",
    "blackwell_attention_error",
]


class Verdict(enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    ERROR = "error"


@dataclasses.dataclass(frozen=True, kw_only=True)
class KernelCheck:
    """``name``; the architectures that run it (``min_arch`` <= capability, and the major
    version in ``majors`` when given); its ``contract`` in words; ``run() -> (passed, detail,
    compared)``; ``compiled_only``: the kernel has only been compiled (cross-lowered, its PTX
    assembled), never run on its GPU by this project (the Blackwell kernels)."""

    name: str
    kernel: str
    contract: str
    min_arch: tuple[int, int]
    majors: tuple[int, ...] | None
    run: Callable[[], tuple[bool, str, int]]
    compiled_only: bool = False

    def runs_on(self, arch: tuple[int, int]) -> bool:
        return tuple(arch) >= self.min_arch and (self.majors is None or arch[0] in self.majors)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckResult:
    name: str
    kernel: str
    contract: str
    verdict: Verdict
    detail: str
    compared: int
    seconds: float

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["verdict"] = self.verdict.name
        return d


# --- inputs -----------------------------------------------------------------------------------
def _special_tensor(n: int, dtype: Any, *, finite: bool, seed: int) -> Any:
    """n x n: Gaussian rows over a wide exponent range, subnormal rows, ±0 rows, lone smallest
    subnormals, and (unless ``finite``) NaN and ±Inf."""
    import jax.numpy as jnp

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, n)).astype(np.float32)
    u = rng.integers(-120, 121, (n, 1)).astype(np.float32)
    x = x * np.exp2(u).astype(np.float32)
    x[8:16] = (rng.standard_normal((8, n)) * 2.0**-130).astype(np.float32)
    x[16], x[17] = 0.0, -0.0
    x[18, 5::64] = np.float32(2.0**-149)
    if not finite:
        x[0, 3::96], x[1, 7::80], x[2, 11::128] = np.nan, np.inf, -np.inf
        x[3, 0::32] = np.nan
    return jnp.asarray(x).astype(dtype)


def _mismatches(a: Any, b: Any) -> int:
    if a is None or b is None:
        return 0 if a is None and b is None else -1
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype == np.float32:
        a, b = a.view(np.uint32), b.view(np.uint32)
    return int(np.sum(a != b)) if a.shape == b.shape else -1


# --- the checks -------------------------------------------------------------------------------
def quantize_check(fmt_name: str, dtype_name: str, finite: bool, n: int = 1024) -> Callable:
    """The check of ``gpu_quantize`` for one format and input dtype on an ``n x n`` tensor."""

    def run() -> tuple[bool, str, int]:
        import jax
        import jax.numpy as jnp

        from fp4sim.formats import blocks
        from fp4sim.kernels.quantize_mgpu import gpu_quantize

        fmt = getattr(blocks, fmt_name)
        x = _special_tensor(n, getattr(jnp, dtype_name), finite=finite, seed=7)
        qk = jax.block_until_ready(gpu_quantize(x, fmt))
        qe = jax.jit(lambda v: blocks.quantize(v, fmt, pack=bool(qk.packed)))(x)
        bad = {
            k: _mismatches(getattr(qk, k), getattr(qe, k))
            for k in ("codes", "scales", "global_scale")
        }
        count = int(np.asarray(qe.codes).size + np.asarray(qe.scales).size)
        return all(v == 0 for v in bad.values()), f"mismatches {bad}", count

    return run


def _wgmma_check() -> tuple[bool, str, int]:
    import ml_dtypes

    from fp4sim.formats.matmul import HOPPER_FP8_MODEL, wgmma_fp8_dot
    from fp4sim.kernels.wgmma_probe import fp8_wgmma

    rng = np.random.default_rng(20261202)
    e4 = ml_dtypes.float8_e4m3fn
    bad = n = 0
    for k in (32, 128, 512):
        a = (rng.standard_normal((64, k)) * 2).astype(e4)
        b = (rng.standard_normal((64, k)) * 2).astype(e4)
        hw = np.asarray(fp8_wgmma(a, b))
        model = wgmma_fp8_dot(
            a.astype(np.float32)[:, None, :], b.astype(np.float32)[None], HOPPER_FP8_MODEL
        )
        bad += int(np.sum(hw.view(np.uint32) != model.view(np.uint32)))
        n += hw.size
    return bad == 0, f"{bad} of {n} outputs differ from HOPPER_FP8_MODEL", n


def attention_fp8_check(
    b: int = 2,
    t: int = 512,
    hq: int = 4,
    hkv: int = 2,
    d: int = 128,
    steps: tuple[int, ...] = (0, 3),
) -> Callable:
    """The check of the FP8 attention kernel (exact P conversion, debug tiles ``steps``)."""
    return lambda: _attention_fp8(b, t, hq, hkv, d, steps)


def _attention_fp8(
    b: int, t: int, hq: int, hkv: int, d: int, steps: tuple[int, ...]
) -> tuple[bool, str, int]:
    import jax.numpy as jnp
    import ml_dtypes

    from fp4sim.kernels import attention_mgpu as am

    f8 = ml_dtypes.float8_e4m3fn
    rng = np.random.default_rng(11)
    qc = rng.integers(-3, 4, (b, t, hq, d)).astype(np.float32).astype(f8)
    kc = rng.integers(-3, 4, (b, t, hkv, d)).astype(np.float32).astype(f8)
    vt = (rng.standard_normal((b, hkv, d, t)) * 60).astype(np.float32).astype(f8)
    nb = t // am.TOKEN_BLOCK
    ops = am.FP8Operands(
        jnp.asarray(qc),
        jnp.asarray(kc),
        jnp.asarray(vt),
        jnp.asarray(rng.integers(-4, -1, (b, hq, nb)), jnp.int32),
        jnp.asarray(rng.integers(-3, 0, (b, hkv, nb)), jnp.int32),
        jnp.asarray(rng.integers(-3, 4, (b, hkv, nb)), jnp.int32),
    )
    nops = am.FP8Operands(*(np.asarray(x) for x in ops))
    bad, n, worst = 0, 0, 0.0
    for causal in (False, True):
        for step in steps:
            cfg = am.FP8AttentionConfig(
                causal=causal,
                conversion=am.PConversion.EXACT,
                debug_step=step,
                out_type=am.OutType.FLOAT32,
            )
            out = am.attention_fp8_quantized(ops, softmax_scale=2.0, config=cfg)
            ref = am.reference_forward(nops, softmax_scale=2.0, config=cfg)
            reached = ~np.isnan(ref["f"][step])
            for got, want in (
                (np.asarray(out[2].p_codes).astype(np.float32), ref["p_codes"][step]),
                (np.asarray(out[2].f), ref["f"][step].astype(np.float32)),
                (np.asarray(out[2].m), ref["m"][step].astype(np.float32)),
            ):
                bad += int(np.sum(got[reached] != want[reached]))
                n += int(reached.sum())
            o = np.asarray(out[0], np.float64)
            worst = max(worst, float(np.abs(o - ref["o"]).max() / np.abs(ref["o"]).max()))
    return (
        bad == 0 and worst <= 2e-3,
        (f"{bad} of {n} debug values differ; O max error {worst:.2e} of max|O| (bound 2e-3)"),
        n,
    )


def attention_directp_check(t: int = 1024, h: int = 2, d: int = 128) -> Callable:
    """The check of the Direct-P FP4 attention kernel on Gaussian (1, t, h, d) inputs."""
    return lambda: _attention_directp(t, h, d)


def _attention_directp(t: int, h: int, d: int) -> tuple[bool, str, int]:
    import jax.numpy as jnp

    from fp4sim.attention import forward as fw
    from fp4sim.kernels import attention_directp_mgpu as dp

    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, t, h, d)).astype(np.float32) for _ in range(3))
    cfg = dp.DirectPConfig()
    o, _ = dp.attention_directp(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), config=cfg)
    res = fw.attention_forward(
        q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), cfg.recipe
    )
    ro = res.out.transpose(0, 2, 1, 3)
    diff = float(np.linalg.norm(np.asarray(o) - ro) / np.linalg.norm(ro))
    return diff <= 2e-2 and math.isfinite(diff), f"rel-L2 {diff:.3e} (bound 2e-2)", ro.size


def _blackwell_check(fmt_name: str) -> Callable:
    def run() -> tuple[bool, str, int]:
        from fp4sim.formats import blocks
        from fp4sim.formats.matmul import Accumulation, scaled_matmul
        from fp4sim.kernels.blackwell_matmul_mgpu import blackwell_scaled_matmul

        fmt = getattr(blocks, fmt_name)
        rng = np.random.default_rng(5)
        x = rng.standard_normal((256, 512)) * np.exp2(rng.integers(-8, 9, (256, 1)))
        a = blocks.quantize(x.astype(np.float32), fmt)
        b = blocks.quantize(rng.standard_normal((256, 512)).astype(np.float32), fmt)
        got = np.asarray(blackwell_scaled_matmul(a, b))
        want = scaled_matmul(a, b, accumulation=Accumulation.TCGEN05)
        bad = _mismatches(got, want)
        return bad == 0, f"{bad} of {want.size} outputs differ from the TCGEN05 model", want.size

    return run


def blackwell_attention_error(
    config: Any, d: int, *, t: int = 512, h: int = 2, seed: int = 13
) -> tuple[float, float]:
    """(relative L2 distance of O, max absolute LSE difference in nats) between the sm_100a
    attention kernel (:func:`fp4sim.kernels.attention_sm100.attention_sm100`, float32 O) and
    the emulator with ``ForwardAccumulation.TCGEN05`` on Gaussian (1, t, h, d) inputs. Needs a
    Blackwell GPU."""
    import jax.numpy as jnp

    from fp4sim.attention import forward as fw
    from fp4sim.attention.recipe import ForwardAccumulation
    from fp4sim.kernels.attention_mgpu import OutType
    from fp4sim.kernels.attention_sm100 import attention_sm100

    cfg = config.replace(out_type=OutType.FLOAT32)
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((1, t, h, d)).astype(np.float32) for _ in range(3))
    o, lse2 = attention_sm100(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), config=cfg)
    res = fw.attention_forward(
        *(x.transpose(0, 2, 1, 3) for x in (q, k, v)),
        cfg.recipe,
        causal=cfg.causal,
        accumulation=ForwardAccumulation.TCGEN05,
    )
    ro = res.out.transpose(0, 2, 1, 3)
    err = float(np.linalg.norm(np.asarray(o, np.float64) - ro) / np.linalg.norm(ro))
    lse_err = float(np.max(np.abs(np.asarray(lse2, np.float64) * math.log(2.0) - res.lse)))
    return err, lse_err


def _blackwell_attention_check(index: int) -> Callable:
    def run() -> tuple[bool, str, int]:
        from fp4sim.kernels.attention_sm100 import shipped_cases

        cfg, d = shipped_cases()[index]
        err, lse_err = blackwell_attention_error(cfg, d)
        ok = err <= 1e-4 and lse_err <= 1e-4 and math.isfinite(err) and math.isfinite(lse_err)
        return ok, f"O rel-L2 {err:.3e}, LSE max diff {lse_err:.3e} (bounds 1e-4)", 512 * 2 * d

    return run


def _blackwell_attention_name(index: int) -> str:
    """``attention_sm100.<mxfp8|directp>.<full|causal>.d<D>`` plus ``.mitchell`` (Mitchell-P
    converter) or ``.mxfp8v`` (MXFP8_TOKENS V) for the non-default recipes."""
    from fp4sim.attention.recipe import MitchellP, VFormat
    from fp4sim.kernels.attention_sm100 import BlackwellRoute, shipped_cases

    cfg, d = shipped_cases()[index]
    route = "mxfp8" if cfg.route is BlackwellRoute.MXFP8 else "directp"
    extra = ""
    if isinstance(cfg.recipe.converter, MitchellP):
        extra = ".mitchell"
    elif cfg.recipe.v is VFormat.MXFP8_TOKENS:
        extra = ".mxfp8v"
    return f"attention_sm100.{route}.{'causal' if cfg.causal else 'full'}.d{d}{extra}"


def _n_blackwell_attention() -> int:
    from fp4sim.kernels.attention_sm100 import shipped_cases

    return len(shipped_cases())


_HOPPER, _BLACKWELL = (9, 0), (10, 0)
CHECKS: tuple[KernelCheck, ...] = (
    KernelCheck(
        name="wgmma_probe.fp8",
        kernel="wgmma_probe.fp8_wgmma",
        contract="bitwise vs HOPPER_FP8_MODEL",
        min_arch=_HOPPER,
        majors=(9,),
        run=_wgmma_check,
    ),
    *(
        KernelCheck(
            name=f"quantize.{f.lower()}.{d}",
            kernel="quantize_mgpu.gpu_quantize",
            contract="bitwise (codes, scales, global factor)",
            min_arch=_HOPPER,
            majors=None,
            run=quantize_check(f, d, fin),
        )
        for f, d, fin in (
            ("MXFP8_E4M3", "bfloat16", False),
            ("MXFP8_E5M2", "bfloat16", False),
            ("MXFP4", "bfloat16", False),
            ("NVFP4", "bfloat16", True),
            ("MXFP8_E4M3", "float32", False),
            ("NVFP4", "float16", True),
        )
    ),
    KernelCheck(
        name="attention_fp8.exact_debug",
        kernel="attention_mgpu.attention_fp8_quantized",
        contract="P codes/row sums/maxima bitwise; O within 2e-3 of max|O|",
        min_arch=_HOPPER,
        majors=(9,),
        run=attention_fp8_check(),
    ),
    KernelCheck(
        name="attention_directp.float_inputs",
        kernel="attention_directp_mgpu.attention_directp",
        contract="rel-L2 to the emulator <= 2e-2",
        min_arch=_HOPPER,
        majors=(9,),
        run=attention_directp_check(),
    ),
    *(
        KernelCheck(
            name=f"blackwell_matmul.{f.lower()}",
            kernel="blackwell_matmul_mgpu.blackwell_scaled_matmul",
            contract="bitwise vs scaled_matmul(accumulation=TCGEN05)",
            min_arch=_BLACKWELL,
            majors=(10,),
            run=_blackwell_check(f),
            compiled_only=True,
        )
        for f in ("MXFP8_E4M3", "MXFP4", "NVFP4")
    ),
    *(
        KernelCheck(
            name=_blackwell_attention_name(i),
            kernel="attention_sm100.attention_sm100",
            contract="O rel-L2 <= 1e-4, LSE <= 1e-4 vs attention_forward(accumulation=TCGEN05)",
            min_arch=_BLACKWELL,
            majors=(10,),
            run=_blackwell_attention_check(i),
            compiled_only=True,
        )
        for i in range(_n_blackwell_attention())
    ),
)
"""Every kernel check (see the module docstring)."""


def supported(arch: tuple[int, int]) -> list[KernelCheck]:
    """The checks a GPU of compute capability ``arch`` runs."""
    return [c for c in CHECKS if c.runs_on(arch)]


def run_checks(
    arch: tuple[int, int],
    names: list[str] | None = None,
    progress: Callable[[CheckResult], None] | None = None,
    time_budget_s: float | None = None,
) -> list[CheckResult]:
    """Run the checks ``arch`` supports (those named, if given); one :class:`CheckResult`
    each, in registry order; none is started after ``time_budget_s`` seconds."""
    out = []
    start = time.perf_counter()
    for c in supported(arch):
        if names and c.name not in names:
            continue
        if time_budget_s is not None and time.perf_counter() - start > time_budget_s:
            break
        t0 = time.perf_counter()
        try:
            ok, detail, n = c.run()
            verdict = Verdict.PASS if ok else Verdict.FAIL
        except Exception as e:  # reported, and the other checks still run
            verdict, n = Verdict.ERROR, 0
            detail = f"{type(e).__name__}: {e}"[:500]
            tb = traceback.format_exc().strip().splitlines()
            detail += " | " + " / ".join(tb[-3:])[:400]
        r = CheckResult(
            name=c.name,
            kernel=c.kernel,
            contract=c.contract,
            verdict=verdict,
            detail=detail,
            compared=n,
            seconds=time.perf_counter() - t0,
        )
        out.append(r)
        if progress is not None:
            progress(r)
    return out

"""GPU benchmark section ``attention``: fp4sim's FP8 attention forward against its peers.

Owns the measurement of :mod:`fp4sim.kernels.attention_mgpu` on the GPU, side by side in one
run with cuDNN bf16 (``jax.nn.dot_product_attention(implementation="cudnn")``), cuDNN FP8 with
per-tensor scales (``jax._src.cudnn.fused_attention_stablehlo.dot_product_attention(...,
use_fp8=True)``) and JAX's own Pallas ``attention_mgpu`` (f16). For every shape it reports the
time, TFLOP/s (``4·B·T·S·H·D``, halved when causal) and the relative L2 error of each method
against a float64 reference evaluated on a sample of query rows, plus the kernel variants that
leave one stage out (where the time goes). Only numbers measured in this run are reported.

Run it alone with ``python -m fp4sim.benchmarks.gpu_attention --out DIR`` or as the
``attention`` section of ``python -m fp4sim bench gpu``.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from fp4sim.benchmarks import median_device_time

__all__ = ["add_arguments", "run_section", "measure", "main", "SHAPES"]

SHAPES: tuple[tuple[int, int, int, int, bool], ...] = (
    (2, 4096, 16, 128, False),
    (2, 4096, 16, 128, True),
    (1, 16384, 16, 128, True),
    (1, 8192, 16, 64, True),
    (1, 16384, 16, 64, False),
    (1, 4000, 12, 128, True),
    (4, 2048, 16, 128, False),
    (1, 32768, 16, 128, True),
)
"""(batch, sequence, heads, head_dim, causal) measured by default: issue 17's seven shapes (the
three with a cuDNN-FP8 parity target first, then the D64 ones, so that a run cut short by its
time budget still covers every kind) and one whose length is not a multiple of the tiles and
whose head count is not a power of two (B1 S4000 H12 causal)."""

_SAMPLE_ROWS = 256


def _sample_heads(h: int) -> tuple[int, ...]:
    """The heads whose rows the float64 reference evaluates: the first and the last."""
    return tuple(sorted({0, h - 1}))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of this section (prefixed: they share ``python -m fp4sim bench gpu``'s parser)."""
    parser.add_argument(
        "--attention-quick",
        action="store_true",
        help="attention: only B2 S4096 H16 D128 (non-causal, causal), fewer variants",
    )
    parser.add_argument(
        "--attention-core",
        action="store_true",
        help="attention: every shape, only the default FP8 kernel, Direct-P "
        "affine and the cuDNN peers (no variants, no Mitchell)",
    )
    parser.add_argument(
        "--attention-reps",
        type=int,
        default=5,
        help="attention: timing repetitions (the median is reported)",
    )
    parser.add_argument(
        "--attention-iters", type=int, default=10, help="attention: calls per timing repetition"
    )


def _reference_rows(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    rows: np.ndarray,
    head: int,
    scale: float,
    causal: bool,
) -> np.ndarray:
    """float64 attention output of batch 0, query ``rows`` of ``head`` (kv head = head // g)."""
    g = q.shape[2] // k.shape[2]
    qs = q[0, rows, head].astype(np.float64)
    ks = k[0, :, head // g].astype(np.float64)
    vs = v[0, :, head // g].astype(np.float64)
    s = (qs @ ks.T) * scale
    if causal:
        s = np.where(np.arange(ks.shape[0])[None, :] <= rows[:, None], s, -np.inf)
    s = s - s.max(axis=1, keepdims=True)
    p = np.exp(s)
    return (p @ vs) / p.sum(axis=1, keepdims=True)


def _rel_l2(out: Any, ref: dict[int, np.ndarray], rows: np.ndarray) -> float:
    o = np.asarray(out, dtype=np.float32)
    num = den = 0.0
    for h, r in ref.items():
        d = o[0, rows, h].astype(np.float64) - r
        num += float(np.sum(d * d))
        den += float(np.sum(r * r))
    return math.sqrt(num / den)


def _cudnn_fp8(q: Any, k: Any, v: Any, scale: float, causal: bool):
    """cuDNN FP8 forward with per-tensor scales: E4M3 inputs, P scaled by 256, E4M3 output."""
    import jax.numpy as jnp
    from jax._src.cudnn import fused_attention_stablehlo as fa

    f8 = jnp.float8_e4m3fn
    one = lambda x: jnp.asarray(x, jnp.float32).reshape(1, 1, 1, 1)  # noqa: E731
    amax = [jnp.max(jnp.abs(x)).astype(jnp.float32) for x in (q, k, v)]
    qq, kq, vq = [(x.astype(jnp.float32) * (448.0 / a)).astype(f8) for x, a in zip((q, k, v), amax)]
    params = {key: one(1.0) for key in fa.fp8_params_keys}
    params.update(
        descale_q=one(amax[0] / 448.0),
        descale_k=one(amax[1] / 448.0),
        descale_v=one(amax[2] / 448.0),
        scale_s=one(256.0),
        descale_s=one(1.0 / 256.0),
        scale_o=one(448.0 / amax[2]),
        descale_o=one(amax[2] / 448.0),
    )
    mask = fa.MaskType.CAUSAL if causal else fa.MaskType.NO_MASK

    def call(qq, kq, vq, params):
        out, _, _ = fa.dot_product_attention(
            qq,
            kq,
            vq,
            fp8_params=params,
            scale=scale,
            mask_type=mask,
            qkv_layout="BTNH",
            use_fp8=True,
        )
        return out

    return (qq, kq, vq, params), call, (lambda out: out.astype(jnp.float32) * (amax[2] / 448.0))


def run_section(args: argparse.Namespace, context: Any = None) -> dict[str, Any]:
    """The ``attention`` section of ``python -m fp4sim bench gpu`` (see :mod:`.gpu`)."""
    deadline = None if context is None else context.deadline
    return measure(
        quick=args.attention_quick,
        reps=args.attention_reps,
        iters=args.attention_iters,
        deadline=deadline,
        context=context,
        core_only=getattr(args, "attention_core", False),
    )


def measure(
    *,
    quick: bool = False,
    reps: int = 5,
    iters: int = 10,
    deadline: float | None = None,
    out_dir: str | None = None,
    context: Any = None,
    core_only: bool = False,
) -> dict[str, Any]:
    """Measure every method on every shape; return (and write) the JSON-able results, with the
    ``rows`` of :mod:`fp4sim.benchmarks.gpu`'s summary table. Stops starting new shapes after
    ``deadline`` (``time.monotonic()``)."""
    import jax
    import jax.numpy as jnp

    from fp4sim.attention.recipe import HW_FP4_DIRECT_P_MITCHELL, Normalization
    from fp4sim.kernels import attention_directp_mgpu as dp
    from fp4sim.kernels import attention_mgpu as am

    if not any(d.platform == "gpu" for d in jax.devices()):
        print("gpu_attention: no GPU visible to jax; nothing measured", file=sys.stderr)
        return {"ok": False, "reason": "no GPU"}
    dev = next(d for d in jax.devices() if d.platform == "gpu")
    results: dict[str, Any] = {
        "device": dev.device_kind,
        "jax": jax.__version__,
        "flops": "4*B*T*S*H*D, halved when causal",
        "shapes": [],
    }

    def write() -> None:  # after every shape, so a cut-short run still leaves its numbers
        if out_dir:
            os.makedirs(out_dir, exist_ok=True)
            with open(os.path.join(out_dir, "attention.json"), "w") as f:
                json.dump(results, f, indent=1)

    shapes = SHAPES[:2] if quick else SHAPES
    base = am.FP8AttentionConfig()
    all_variants = {
        "fp4sim_fp8": base,
        "fp4sim_fp8_mismatched": base.replace(normalization=Normalization.MISMATCHED),
        "fp4sim_fp8_bkv64": base.replace(block_kv=64),
        "fp4sim_fp8_bq128_bkv64": base.replace(block_q=128, block_kv=64),
        # the kernel as it was: per-key column vectors, normalizer summed on SIMT
        "fp4sim_fp8_columns": base.replace(scale_blocks=False, block_sums=False),
        "fp4sim_fp8_simt_sums": base.replace(block_sums=False),  # normalizer summed on SIMT
        "ablate_no_pv": base.replace(ablation=am.Ablation.SKIP_PV),
        "ablate_no_key_columns": base.replace(ablation=am.Ablation.SKIP_KEY_COLUMNS),
        "ablate_no_normalizer": base.replace(ablation=am.Ablation.SKIP_NORMALIZER),
    }
    core = (
        ("fp4sim_fp8",)
        if core_only
        else ("fp4sim_fp8", "fp4sim_fp8_columns", "fp4sim_fp8_simt_sums", "ablate_no_pv")
    )
    d64_variants = {  # the D64 shapes try their own tiles
        "fp4sim_fp8_bkv64": base.replace(block_kv=64),
        "fp4sim_fp8_bq128_bkv64": base.replace(block_q=128, block_kv=64),
    }
    directp = {
        "fp4sim_directp_affine": dp.DirectPConfig(),
        "fp4sim_directp_mitchell": dp.DirectPConfig(recipe=HW_FP4_DIRECT_P_MITCHELL),
    }
    ok = True

    def measure_shape(i_shape: int, b: int, s: int, h: int, d: int, causal: bool) -> None:
        """Every method at one shape, into ``results`` (the closures below bind this
        call's arrays, freed when it returns)."""
        nonlocal ok
        # every variant on the first shape; the main ones (and one ablation) on the others
        variants = {
            k: v
            for k, v in all_variants.items()
            if (i_shape == 0 and not quick and not core_only) or k in core
        }
        if d == 64 and not quick and not core_only:
            variants.update(d64_variants)
        scale = 1.0 / math.sqrt(d)
        flops = 4.0 * b * s * s * h * d / (2.0 if causal else 1.0)
        keys = jax.random.split(jax.random.key(0), 3)
        q, k, v = (jax.random.normal(kk, (b, s, h, d), jnp.float32) for kk in keys)
        qn, kn, vn = (np.asarray(x) for x in (q, k, v))
        rows = np.unique(np.linspace(0, s - 1, _SAMPLE_ROWS).astype(np.int64))
        ref = {hh: _reference_rows(qn, kn, vn, rows, hh, scale, causal) for hh in _sample_heads(h)}
        entry: dict[str, Any] = {
            "B": b,
            "S": s,
            "H": h,
            "D": d,
            "causal": causal,
            "gflop": flops / 1e9,
            "methods": {},
        }
        print(f"== B{b} S{s} H{h} D{d} causal={causal}", flush=True)

        def record(
            name: str, fn: Callable[[], Any], post: Callable[[Any], Any] | None = None, **extra: Any
        ) -> None:
            nonlocal ok
            try:
                sec = median_device_time(fn, reps, iters)
                out = fn()
                err = _rel_l2(post(out) if post else out, ref, rows)
                entry["methods"][name] = {
                    "ms": sec * 1e3,
                    "tflops": flops / sec / 1e12,
                    "rel_l2": err,
                    **extra,
                }
                print(
                    f"  {name:26s} {sec * 1e3:8.3f} ms {flops / sec / 1e12:7.1f} TFLOP/s "
                    f"rel-L2 {err:.3e}",
                    flush=True,
                )
            except Exception as e:  # record the failure, keep measuring the others
                ok = False
                entry["methods"][name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                print(f"  {name:26s} FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)

        # fp4sim FP8: quantize once (timed separately), then the kernel on quantized operands.
        quant = jax.jit(am.quantize_operands)
        t_q = median_device_time(lambda: quant(q, k, v), reps, iters)
        ops = quant(q, k, v)
        entry["fp4sim_quantize_ms"] = t_q * 1e3
        for name, cfg in variants.items():
            c = cfg.replace(causal=causal)
            record(
                name,
                lambda c=c: am.attention_fp8_quantized(ops, softmax_scale=scale, config=c)[0],
                config=str(c),
            )
        # Direct-P FP4 (NVFP4 Q/K, E2M1 P, MXFP4 V decoded exactly to float16)
        for name, dcfg in directp.items():
            if (quick or core_only) and name != "fp4sim_directp_affine":
                continue
            dcfg = dcfg.replace(causal=causal)
            prep = jax.jit(functools.partial(dp.prepare_operands, recipe=dcfg.recipe))
            dops = prep(q, k, v)
            record(
                name,
                lambda c=dcfg, o=dops: dp.attention_directp_prepared(
                    o, softmax_scale=scale, config=c
                )[0],
                config=str(dcfg.recipe.converter),
            )
            del dops
        # cuDNN bf16
        qb, kb, vb = (x.astype(jnp.bfloat16) for x in (q, k, v))
        cud = jax.jit(
            lambda a, b_, c_: jax.nn.dot_product_attention(
                a, b_, c_, scale=scale, is_causal=causal, implementation="cudnn"
            )
        )
        record("cudnn_bf16", lambda: cud(qb, kb, vb))
        # cuDNN fp8 (per-tensor scales)
        try:
            args8, call8, post8 = _cudnn_fp8(q, k, v, scale, causal)
            call8 = jax.jit(call8)
            record("cudnn_fp8", lambda: call8(*args8), post=post8)
        except Exception as e:
            ok = False
            entry["methods"]["cudnn_fp8"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        # JAX Pallas attention_mgpu (f16, no softmax scale: q pre-scaled), on the first shape
        try:
            if i_shape or core_only:
                raise _Skip
            from jax.experimental.pallas.ops.gpu import attention_mgpu as jam

            qh = (q * scale).astype(jnp.float16)
            kh, vh = k.astype(jnp.float16), v.astype(jnp.float16)
            jcfg = jam.TuningConfig(block_q=64, block_kv=128, max_concurrent_steps=2, causal=causal)
            jfn = jax.jit(lambda a, b_, c_: jam.attention(a, b_, c_, jcfg))
            record("jax_attention_mgpu_f16", lambda: jfn(qh, kh, vh))
        except _Skip:
            pass
        except Exception as e:
            ok = False
            entry["methods"]["jax_attention_mgpu_f16"] = {"error": f"{type(e).__name__}: {e}"[:300]}
        m = entry["methods"]
        entry["target"] = _targets(m, b, s, h, d, causal)
        print(f"  target: {entry['target']}", flush=True)
        results["shapes"].append(entry)
        tag = f"B{b} S{s} H{h} D{d}{' causal' if causal else ''}"
        fp8_peer = m.get("cudnn_fp8", {}).get("tflops")
        for name, r in m.items():
            if "tflops" in r:
                results.setdefault("rows", []).append(
                    {
                        "name": f"attn {tag} {name}",
                        "ms": r["ms"],
                        "rate": f"{r['tflops']:.0f} TFLOP/s",
                        "ratio": r["tflops"] / fp8_peer if fp8_peer else None,
                        "ratio_to": "cudnn_fp8",
                        "check": f"relL2 {r['rel_l2']:.2e}",
                    }
                )
        write()

    for i_shape, (b, s, h, d, causal) in enumerate(shapes):
        if deadline is not None and time.monotonic() > deadline:
            results.setdefault("skipped_shapes", []).append([b, s, h, d, causal])
            continue
        measure_shape(i_shape, b, s, h, d, causal)

    results["ok"] = ok
    results["summary"] = _summary(results)
    write()
    _print_table(results)
    if context is None:  # standalone: print the summary last here (bench gpu prints it itself)
        print("\n" + "\n".join(results["summary"]), flush=True)
    return results


class _Skip(Exception):
    """A method this shape leaves out (to keep the run short)."""


def _ratio(m: dict[str, Any], a: str, b: str, key: str = "tflops") -> float | None:
    if key in m.get(a, {}) and key in m.get(b, {}) and m[b][key]:
        return m[a][key] / m[b][key]
    return None


_FP8_PARITY_SHAPES = (
    (2, 4096, 16, 128, False),
    (2, 4096, 16, 128, True),
    (1, 16384, 16, 128, True),
)
"""Issue 17: FP8 >= 1.0x cuDNN FP8 at these shapes, >= 1.15x cuDNN bf16 at every shape."""


def _targets(m: dict[str, Any], b: int, s: int, h: int, d: int, causal: bool) -> dict[str, Any]:
    """Issue 17's ratios and whether each target is met (None: a method failed)."""
    fp8 = "fp4sim_fp8"
    out = {
        "fp8_vs_cudnn_fp8": _ratio(m, fp8, "cudnn_fp8"),
        "fp8_vs_cudnn_bf16": _ratio(m, fp8, "cudnn_bf16"),
        "affine_vs_fp8": _ratio(m, "fp4sim_directp_affine", fp8),
        "mitchell_vs_fp8": _ratio(m, "fp4sim_directp_mitchell", fp8),
        "error_vs_cudnn_fp8": _ratio(m, fp8, "cudnn_fp8", "rel_l2"),
    }
    need_fp8 = 1.0 if (b, s, h, d, causal) in _FP8_PARITY_SHAPES else None
    checks = {
        "fp8_vs_cudnn_fp8": need_fp8,
        "fp8_vs_cudnn_bf16": 1.15,
        "affine_vs_fp8": 0.6,
        "mitchell_vs_fp8": 0.5,
    }
    met = {}
    for key, need in checks.items():
        if need is not None:
            met[key] = None if out[key] is None else bool(out[key] >= need)
    met["error_vs_cudnn_fp8"] = (
        None if out["error_vs_cudnn_fp8"] is None else bool(out["error_vs_cudnn_fp8"] <= 1.0)
    )
    out["met"] = met
    return out


def _fmt(x: float | None) -> str:
    return "  n/a" if x is None else f"{x:5.2f}"


def _summary(results: dict[str, Any]) -> list[str]:
    """The closing lines: one per shape with issue 17's ratios."""
    lines = [
        "summary (TFLOP/s ratios in one run; error ratio = rel-L2 vs float64 over cuDNN "
        "fp8's, <= 1 wanted)"
    ]
    for e in results["shapes"]:
        tag = f"B{e['B']} S{e['S']} H{e['H']} D{e['D']}{' causal' if e['causal'] else ''}"
        tg = e.get("target", {})
        missed = [k for k, v in tg.get("met", {}).items() if v is False]
        lines.append(
            f"{tag:26s} FP8 / cuDNN fp8 {_fmt(tg.get('fp8_vs_cudnn_fp8'))}  "
            f"FP8 / cuDNN bf16 {_fmt(tg.get('fp8_vs_cudnn_bf16'))}  "
            f"Direct-P / FP8 {_fmt(tg.get('affine_vs_fp8'))} (Mitchell "
            f"{_fmt(tg.get('mitchell_vs_fp8'))})  error ratio "
            f"{_fmt(tg.get('error_vs_cudnn_fp8'))}  missed: "
            f"{', '.join(missed) or 'none'}"
        )
    for sh in results.get("skipped_shapes", []):
        lines.append(
            f"B{sh[0]} S{sh[1]} H{sh[2]} D{sh[3]}{' causal' if sh[4] else ''}: "
            f"skipped (time budget)"
        )
    return lines


def _print_table(results: dict[str, Any]) -> None:
    print("\nshape                      method                      TFLOP/s   rel-L2")
    for e in results["shapes"]:
        tag = f"B{e['B']} S{e['S']} H{e['H']} D{e['D']}{' causal' if e['causal'] else ''}"
        for name, r in e["methods"].items():
            if "tflops" in r:
                print(f"{tag:26s} {name:26s} {r['tflops']:8.1f} {r['rel_l2']:9.2e}")
            else:
                print(f"{tag:26s} {name:26s}   FAILED")


def main(argv: list[str] | None = None) -> int:
    """``python -m fp4sim.benchmarks.gpu_attention [--out DIR] [--attention-quick] ...``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="directory for attention.json")
    add_arguments(parser)
    args = parser.parse_args(argv)
    res = measure(
        quick=args.attention_quick,
        reps=args.attention_reps,
        iters=args.attention_iters,
        out_dir=args.out,
    )
    return 0 if res.get("ok", False) else 1


if __name__ == "__main__":
    raise SystemExit(main())

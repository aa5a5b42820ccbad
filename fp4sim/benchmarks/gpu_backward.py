"""GPU benchmark section ``backward``: fp4sim's FP8 attention backward against its peers.

Owns the measurement of :mod:`fp4sim.kernels.attention_bwd_mgpu` on the GPU, side by side in
one run with cuDNN bf16's backward (``jax.nn.dot_product_attention(implementation="cudnn")``
under ``jax.vjp``), cuDNN FP8's backward (``jax._src.cudnn.fused_attention_stablehlo.
dot_product_attention(..., use_fp8=True)`` under ``jax.vjp``, per-tensor scales) and JAX's
Pallas ``attention_mgpu`` backward (f16; non-causal only: jax 0.11.2 has no causal backward
there). Only the backward call is timed (each method's forward runs once, outside the timer,
and its VJP closure is jitted). TFLOP/s count 2.5x the forward's ``4·B·T·S·H·D`` (halved when
causal). Accuracy: relative L2 of dQ, dK, dV of batch 0, head 0 against the float64 gradients
of the same float inputs. Only numbers measured in this run are reported.

Run it alone with ``python -m fp4sim.benchmarks.gpu_backward --out DIR`` or as the
``backward`` section of ``python -m fp4sim bench gpu``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from fp4sim.benchmarks import median_device_time

__all__ = ["add_arguments", "run_section", "measure", "reference_head_grads", "main", "SHAPES"]

SHAPES: tuple[tuple[int, int, int, int, bool], ...] = (
    (2, 4096, 16, 128, False),
    (2, 4096, 16, 128, True),
    (1, 16384, 16, 128, True),
)
"""(batch, sequence, heads, head_dim, causal) measured by default."""

_BWD_FLOP_FACTOR = 2.5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of this section (prefixed: they share ``python -m fp4sim bench gpu``'s parser)."""
    parser.add_argument(
        "--backward-quick",
        action="store_true",
        help="backward: only B2 S4096 H16 D128 (non-causal, causal)",
    )
    parser.add_argument(
        "--backward-reps",
        type=int,
        default=5,
        help="backward: timing repetitions (the median is reported)",
    )
    parser.add_argument(
        "--backward-iters", type=int, default=10, help="backward: calls per timing repetition"
    )
    parser.add_argument(
        "--backward-shape",
        type=int,
        nargs=5,
        action="append",
        default=None,
        metavar=("B", "S", "H", "D", "CAUSAL"),
        help="backward: measure this shape instead (repeatable)",
    )
    parser.add_argument(
        "--backward-methods",
        nargs="+",
        default=None,
        metavar="NAME",
        help="backward: measure only these methods (e.g. fp4sim_fp8_bwd "
        "cudnn_bf16_bwd fp4sim_fp8_bwd_tc); all by default",
    )


def reference_head_grads(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    do: np.ndarray,
    *,
    scale: float,
    causal: bool,
    chunk: int = 2048,
) -> tuple[np.ndarray, ...]:
    """float64 dQ, dK, dV of one head: ``q``, ``do`` (T, D), ``k``, ``v`` (S, D), computed in
    row chunks (two passes: the LSE and D, then the gradients), so S = 16384 fits in memory."""
    q, k, v, do = (np.asarray(x, np.float64) for x in (q, k, v, do))
    t, s = q.shape[0], k.shape[0]
    lse = np.empty(t)
    out = np.empty_like(do)
    cols = np.arange(s)
    for r0 in range(0, t, chunk):
        rows = np.arange(r0, min(t, r0 + chunk))
        sc = (q[rows] @ k.T) * scale
        if causal:
            sc = np.where(cols[None, :] <= rows[:, None] + (s - t), sc, -np.inf)
        m = sc.max(axis=1, keepdims=True)
        p = np.exp(sc - m)
        lsum = p.sum(axis=1, keepdims=True)
        lse[rows] = (m + np.log(lsum))[:, 0]
        out[rows] = (p / lsum) @ v
    delta = np.sum(do * out, axis=1)
    dq = np.zeros_like(q)
    dk = np.zeros_like(k)
    dv = np.zeros_like(v)
    for r0 in range(0, t, chunk):
        rows = np.arange(r0, min(t, r0 + chunk))
        sc = (q[rows] @ k.T) * scale
        if causal:
            sc = np.where(cols[None, :] <= rows[:, None] + (s - t), sc, -np.inf)
        p = np.exp(sc - lse[rows, None])
        dp = do[rows] @ v.T
        ds = p * (dp - delta[rows, None])
        dq[rows] = scale * (ds @ k)
        dk += scale * (ds.T @ q[rows])
        dv += p.T @ do[rows]
    return dq, dk, dv


def _rel(got: Any, ref: np.ndarray) -> float:
    g = np.asarray(got, np.float64)
    return float(np.linalg.norm(g - ref) / np.linalg.norm(ref))


def _cudnn_fp8_vjp(q: Any, k: Any, v: Any, do: Any, scale: float, causal: bool):
    """cuDNN FP8 attention (per-tensor scales, E4M3 Q/K/V/O/dO, P scaled by 256) and its VJP.
    Returns ``(backward, post)``: ``backward()`` runs the jitted VJP closure, ``post`` maps its
    (dq, dk, dv) to float32 values of the float inputs' gradients.

    The backward's output and dP scales are 1. Its timing is representative; its accuracy
    figures are not: on the H200 (2026-12-02) dQ/dK came out at rel-L2 0.9 against float64
    (dV 0.06), most likely because small gradients underflow E4M3 at scale 1. A calibrated
    variant (cuDNN's own amax of dQ, dK, dV, dP mapped to 448) measured worse (dV 4.3), so how
    jax 0.11.2's wrapper applies ``scale_dQ``/``scale_dK``/``scale_dV`` to the returned
    gradients is still to be established; the bench reports these errors as measured."""
    import jax
    import jax.numpy as jnp
    from jax._src.cudnn import fused_attention_stablehlo as fa

    f8 = jnp.float8_e4m3fn
    one = lambda x: jnp.asarray(x, jnp.float32).reshape(1, 1, 1, 1)  # noqa: E731
    amax = [jnp.max(jnp.abs(x)).astype(jnp.float32) for x in (q, k, v, do)]
    qq, kq, vq = [
        (x.astype(jnp.float32) * (448.0 / a)).astype(f8) for x, a in zip((q, k, v), amax[:3])
    ]
    params = {key: one(1.0) for key in fa.fp8_params_keys}
    params.update(
        descale_q=one(amax[0] / 448.0),
        descale_k=one(amax[1] / 448.0),
        descale_v=one(amax[2] / 448.0),
        scale_s=one(256.0),
        descale_s=one(1.0 / 256.0),
        scale_o=one(448.0 / amax[2]),
        descale_o=one(amax[2] / 448.0),
        descale_dO=one(amax[3] / 448.0),
    )
    mask = fa.MaskType.CAUSAL if causal else fa.MaskType.NO_MASK

    def f(qq, kq, vq):
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

    _, vjp = jax.vjp(f, qq, kq, vq)
    dq8 = (do.astype(jnp.float32) * (448.0 / amax[3])).astype(f8)
    bwd = jax.jit(vjp)

    def post(g):  # cuDNN returns dQ·scale_dQ etc. of the real (descaled) tensors; scale 1
        return tuple(x.astype(jnp.float32) for x in g)

    return (lambda: bwd(dq8)), post


def run_section(args: argparse.Namespace, context: Any = None) -> dict[str, Any]:
    """The ``backward`` section of ``python -m fp4sim bench gpu`` (see :mod:`.gpu`)."""
    deadline = None if context is None else context.deadline
    shapes = None
    if getattr(args, "backward_shape", None):
        shapes = tuple((b, s, h, d, bool(c)) for b, s, h, d, c in args.backward_shape)
    return measure(
        quick=args.backward_quick,
        reps=args.backward_reps,
        iters=args.backward_iters,
        deadline=deadline,
        shapes=shapes,
        methods=getattr(args, "backward_methods", None),
    )


def measure(
    *,
    quick: bool = False,
    reps: int = 5,
    iters: int = 10,
    deadline: float | None = None,
    out_dir: str | None = None,
    shapes: tuple | None = None,
    interpret: bool = False,
    methods: list[str] | None = None,
) -> dict[str, Any]:
    """Measure every method on every shape; return (and write) the JSON-able results, with the
    ``rows`` of :mod:`fp4sim.benchmarks.gpu`'s summary table. Stops starting new shapes after
    ``deadline`` (``time.monotonic()``). ``interpret``: run only fp4sim's kernels, in Pallas
    interpret mode on the CPU (the section's own test at tiny shapes; the times mean nothing).
    ``methods``: only these method names (all by default)."""
    import jax

    if not interpret and not any(d.platform == "gpu" for d in jax.devices()):
        print("gpu_backward: no GPU visible to jax; nothing measured", file=sys.stderr)
        return {"ok": False, "reason": "no GPU"}
    dev = jax.devices()[0] if interpret else next(d for d in jax.devices() if d.platform == "gpu")
    results: dict[str, Any] = {
        "device": dev.device_kind + (" (interpret)" if interpret else ""),
        "jax": jax.__version__,
        "flops": "2.5 x 4*B*T*S*H*D, halved when causal",
        "error": "rel-L2 of dq/dk/dv, batch 0 head 0, vs float64",
        "shapes": [],
    }

    def write() -> None:  # after every shape, so a cut-short run still leaves its numbers
        if out_dir:
            os.makedirs(out_dir, exist_ok=True)
            with open(os.path.join(out_dir, "backward.json"), "w") as f:
                json.dump(results, f, indent=1)

    if shapes is None:
        shapes = SHAPES[:2] if quick else SHAPES
    ok = True
    for i_shape, (b, s, h, d, causal) in enumerate(shapes):
        if deadline is not None and time.monotonic() > deadline:
            results.setdefault("skipped_shapes", []).append([b, s, h, d, causal])
            continue
        entry, shape_ok = _one_shape(
            b,
            s,
            h,
            d,
            causal,
            reps=reps,
            iters=iters,
            interpret=interpret,
            methods=methods,
            ablations=(i_shape == 0 and not quick) or bool(methods),
        )
        ok = ok and shape_ok
        results["shapes"].append(entry)
        if interpret:
            continue
        m = entry["methods"]
        tag = f"B{b} S{s} H{h} D{d}{' causal' if causal else ''}"
        bf16 = m.get("cudnn_bf16_bwd", {}).get("tflops")
        for name, r in m.items():
            if "tflops" in r and not name.startswith("ablate"):
                results.setdefault("rows", []).append(
                    {
                        "name": f"bwd {tag} {name}",
                        "ms": r["ms"],
                        "rate": f"{r['tflops']:.0f} TFLOP/s",
                        "ratio": r["tflops"] / bf16 if bf16 else None,
                        "ratio_to": "cudnn_bf16_bwd",
                        "check": f"relL2 dq {r['rel_l2_dq']:.2e}",
                    }
                )
        write()
    results["ok"] = ok
    write()
    _print_table(results)
    return results


class _Skipped(Exception):
    """A method left out by ``methods``."""


def _one_shape(
    b: int,
    s: int,
    h: int,
    d: int,
    causal: bool,
    *,
    reps: int,
    iters: int,
    interpret: bool,
    ablations: bool = False,
    methods: list[str] | None = None,
) -> tuple[dict[str, Any], bool]:
    """Every method (or those named in ``methods``) at one shape: ``(entry, ok)``."""
    import jax
    import jax.numpy as jnp

    from fp4sim.kernels import attention_bwd_mgpu as bw
    from fp4sim.kernels import attention_mgpu as am
    from fp4sim.kernels.harness import interpret as run_interpreted

    ok = True
    scale = 1.0 / math.sqrt(d)
    flops = _BWD_FLOP_FACTOR * 4.0 * b * s * s * h * d / (2.0 if causal else 1.0)
    keys = jax.random.split(jax.random.key(0), 4)
    q, k, v, do = (jax.random.normal(kk, (b, s, h, d), jnp.float32) for kk in keys)
    t_ref = time.perf_counter()
    ref = reference_head_grads(
        *(np.asarray(x[0, :, 0]) for x in (q, k, v, do)), scale=scale, causal=causal
    )
    entry: dict[str, Any] = {
        "B": b,
        "S": s,
        "H": h,
        "D": d,
        "causal": causal,
        "gflop": flops / 1e9,
        "reference_s": time.perf_counter() - t_ref,
        "methods": {},
    }
    print(
        f"== B{b} S{s} H{h} D{d} causal={causal} (float64 reference {entry['reference_s']:.1f} s)",
        flush=True,
    )

    def want(name: str) -> bool:
        return methods is None or name in methods

    def record(
        name: str, fn: Callable[[], Any], post: Callable[[Any], Any] | None = None, **extra: Any
    ) -> None:
        nonlocal ok
        if interpret:
            fn = (lambda f: lambda: run_interpreted(f))(fn)
        try:
            sec = median_device_time(fn, reps, iters)
            g = fn()
            g = post(g) if post else g
            errs = [_rel(x[0, :, 0], r) for x, r in zip(g, ref)]
            nan = any(bool(jnp.isnan(x).any()) for x in g)
            entry["methods"][name] = {
                "ms": sec * 1e3,
                "tflops": flops / sec / 1e12,
                "rel_l2_dq": errs[0],
                "rel_l2_dk": errs[1],
                "rel_l2_dv": errs[2],
                "nan": nan,
                **extra,
            }
            print(
                f"  {name:28s} {sec * 1e3:8.3f} ms {flops / sec / 1e12:7.1f} TFLOP/s "
                f"rel-L2 dq/dk/dv {errs[0]:.2e}/{errs[1]:.2e}/{errs[2]:.2e}"
                f"{' NaN!' if nan else ''}",
                flush=True,
            )
        except Exception as e:  # record the failure, keep measuring the others
            ok = False
            entry["methods"][name] = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
            print(f"  {name:28s} FAILED {type(e).__name__}: {str(e)[:400]}", flush=True)

    # fp4sim FP8: the forward kernel once (its residuals), then the backward call timed
    base = bw.BackwardConfig(causal=causal)
    ab = bw.BackwardAblation
    # (two compute warpgroups per CTA are refused on the GPU: BackwardConfig's docstring)
    variants = [("fp4sim_fp8_bwd", base)]
    if ablations:  # where the time goes (results wrong by design: their errors mean nothing)
        if not interpret:
            variants.append(("fp4sim_fp8_bwd_tc", base.replace(tc_accumulate=True)))
        variants += [
            ("ablate_dkv_only", base.replace(ablation=ab.DKV_ONLY)),
            ("ablate_plain_cast", base.replace(ablation=ab.PLAIN_CAST)),
        ]
    for name, bcfg in variants:
        if not want(name):
            continue
        try:
            ops = jax.jit(am.quantize_operands)(q, k, v)
            fcfg = am.FP8AttentionConfig(causal=causal)
            fwd = lambda ops=ops, fcfg=fcfg: am.attention_fp8_quantized(  # noqa: E731
                ops, softmax_scale=scale, config=fcfg
            )
            o, lse = run_interpreted(fwd) if interpret else fwd()
            res = bw.BackwardResiduals(ops, o, lse)
            record(
                name,
                lambda res=res, c=bcfg: bw.attention_fp8_backward(
                    res, do, softmax_scale=scale, config=c
                ),
                config=str(bcfg),
            )
            del ops, o, lse, res
        except Exception as e:
            ok = False
            entry["methods"][name] = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
            print(f"  {name:28s} FAILED {type(e).__name__}: {str(e)[:400]}", flush=True)
    if interpret:  # cuDNN and JAX's Mosaic kernels need the GPU
        return entry, ok
    # cuDNN bf16
    try:
        if not want("cudnn_bf16_bwd"):
            raise _Skipped
        qb, kb, vb, dob = (x.astype(jnp.bfloat16) for x in (q, k, v, do))
        _, vjp = jax.vjp(
            lambda a, b_, c_: jax.nn.dot_product_attention(
                a, b_, c_, scale=scale, is_causal=causal, implementation="cudnn"
            ),
            qb,
            kb,
            vb,
        )
        vjp = jax.jit(vjp)
        record("cudnn_bf16_bwd", lambda: vjp(dob))
    except _Skipped:
        pass
    except Exception as e:
        ok = False
        entry["methods"]["cudnn_bf16_bwd"] = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
    # cuDNN fp8
    try:
        if not want("cudnn_fp8_bwd"):
            raise _Skipped
        fn8, post8 = _cudnn_fp8_vjp(q, k, v, do, scale, causal)
        record("cudnn_fp8_bwd", fn8, post=post8)
    except _Skipped:
        pass
    except Exception as e:
        ok = False
        entry["methods"]["cudnn_fp8_bwd"] = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
        print(f"  cudnn_fp8_bwd FAILED {type(e).__name__}: {str(e)[:400]}", flush=True)
    # JAX Pallas attention_mgpu (f16, q pre-scaled; no causal backward in jax 0.11.2)
    if not causal and want("jax_attention_mgpu_f16_bwd"):
        try:
            from jax.experimental.pallas.ops.gpu import attention_mgpu as jam

            qh = (q * scale).astype(jnp.float16)
            kh, vh, doh = (x.astype(jnp.float16) for x in (k, v, do))
            jcfg = jam.TuningConfig(
                block_q=64,
                block_kv=128,
                max_concurrent_steps=2,
                causal=False,
                block_q_dq=64,
                block_kv_dq=64,
                block_q_dkv=64,
                block_kv_dkv=64,
            )
            _, jvjp = jax.vjp(lambda a, b_, c_: jam.attention(a, b_, c_, jcfg), qh, kh, vh)
            jvjp = jax.jit(jvjp)
            record(
                "jax_attention_mgpu_f16_bwd",
                lambda: jvjp(doh),
                post=lambda g: (g[0].astype(jnp.float32) * scale, g[1], g[2]),
            )
        except Exception as e:
            ok = False
            entry["methods"]["jax_attention_mgpu_f16_bwd"] = {
                "error": f"{type(e).__name__}: {str(e)[:400]}"
            }
            print(
                f"  jax_attention_mgpu_f16_bwd FAILED {type(e).__name__}: {str(e)[:400]}",
                flush=True,
            )
    m = entry["methods"]
    mine, peer = m.get("fp4sim_fp8_bwd", {}), m.get("cudnn_bf16_bwd", {})
    if "tflops" in mine and "tflops" in peer:
        entry["target"] = {
            "speedup_vs_cudnn_bf16": mine["tflops"] / peer["tflops"],
            "met": bool(mine["tflops"] >= peer["tflops"]),
        }
        print(f"  target (>= 1.0x cuDNN bf16 backward): {entry['target']}", flush=True)
    return entry, ok


def _print_table(results: dict[str, Any]) -> None:
    print(
        "\nshape                      method                        ms   TFLOP/s  "
        "rel-L2 dq / dk / dv"
    )
    for e in results["shapes"]:
        tag = f"B{e['B']} S{e['S']} H{e['H']} D{e['D']}{' causal' if e['causal'] else ''}"
        for name, r in e["methods"].items():
            if "tflops" in r:
                print(
                    f"{tag:26s} {name:28s} {r['ms']:7.3f} {r['tflops']:7.1f}  "
                    f"{r['rel_l2_dq']:.2e} / {r['rel_l2_dk']:.2e} / {r['rel_l2_dv']:.2e}"
                )
            else:
                print(f"{tag:26s} {name:28s}   FAILED")


def main(argv: list[str] | None = None) -> int:
    """``python -m fp4sim.benchmarks.gpu_backward [--out DIR] [--backward-quick] ...``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="directory for backward.json")
    add_arguments(parser)
    args = parser.parse_args(argv)
    shapes = None
    if args.backward_shape:
        shapes = tuple((b, s, h, d, bool(c)) for b, s, h, d, c in args.backward_shape)
    res = measure(
        quick=args.backward_quick,
        reps=args.backward_reps,
        iters=args.backward_iters,
        out_dir=args.out,
        shapes=shapes,
        methods=args.backward_methods,
    )
    return 0 if res.get("ok", False) else 1


if __name__ == "__main__":
    raise SystemExit(main())

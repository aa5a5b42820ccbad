"""Smoke test of the FP8 attention backward kernels on the GPU (scripts/gpubwd_h200.sh, step 1).

Every shipped backward configuration at small shapes (D64/D128, causal or not, GQA): the
gradients must be finite and close to the float64 model of the kernels' numerics
(``reference_backward`` on exact products; the tensor core's FP8 accumulation and ex2.approx
keep it within ~1e-2), and the P/dS codes of the dK/dV kernel's debug tiles must equal the
emulator's quantizer on the kernel's own p/dS. One line per case: ``PASS``/``FAIL name ...``.
``--case NAME`` runs one case; ``--interpret`` runs the cases at T = 128 in Pallas interpret mode
on the CPU (a check of this script itself).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import traceback

import jax.numpy as jnp
import numpy as np

from fp4sim.attention import operands as sc
from fp4sim.kernels import attention_bwd_mgpu as bw
from fp4sim.kernels import attention_mgpu as am

CASES = {
    "d128": (bw.BackwardConfig(), (1, 512, 2, 2, 128)),
    "d128_causal": (bw.BackwardConfig(causal=True), (1, 512, 2, 2, 128)),
    "d64_gqa_causal": (bw.BackwardConfig(causal=True), (1, 384, 4, 1, 64)),
    "d128_q128": (bw.BackwardConfig(block_q=128, dq_block_kv=128), (1, 512, 2, 1, 128)),
    "d64_causal_debug": (bw.BackwardConfig(causal=True, debug_step=1), (1, 256, 2, 1, 64)),
    "d128_tc": (bw.BackwardConfig(tc_accumulate=True), (1, 512, 2, 2, 128)),
    "d64_causal_gqa_tc": (bw.BackwardConfig(causal=True, tc_accumulate=True), (1, 384, 4, 1, 64)),
}


def run(name: str, t_override: int | None = None) -> str:
    cfg, (b, t, hq, hkv, d) = CASES[name]
    t = t_override or t
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((b, t, hq, d)).astype(np.float32) * 2)
    k, v = (jnp.asarray(rng.standard_normal((b, t, hkv, d)).astype(np.float32)) for _ in "kv")
    do = jnp.asarray(rng.standard_normal((b, t, hq, d)).astype(np.float32))
    scale = 1.0 / math.sqrt(d)
    ops = am.quantize_operands(q, k, v)
    o, lse = am.attention_fp8_quantized(
        ops, softmax_scale=scale, config=am.FP8AttentionConfig(causal=cfg.causal)
    )
    res = bw.BackwardResiduals(ops, o, lse)
    t0 = time.perf_counter()
    out = bw.attention_fp8_backward(res, do, softmax_scale=scale, config=cfg)
    out[0].block_until_ready()
    t_first = time.perf_counter() - t0
    npres = bw.BackwardResiduals(
        am.FP8Operands(*(np.asarray(x) for x in ops)), np.asarray(o), np.asarray(lse)
    )
    ref = bw.reference_backward(npres, np.asarray(do), softmax_scale=scale, causal=cfg.causal)
    msg = [f"first call {t_first:.1f} s"]
    ok = True
    for gname, g in zip(("dq", "dk", "dv"), out[:3]):
        g = np.asarray(g, np.float64)
        fin = bool(np.isfinite(g).all())
        rel = float(np.linalg.norm(g - ref[gname]) / np.linalg.norm(ref[gname]))
        ok &= fin and rel < 2e-2
        msg.append(f"{gname} rel {rel:.2e}{'' if fin else ' NONFINITE'}")
    if cfg.debug_step is not None:
        dbg = out[3]
        bad = 0
        for bi in range(b):
            for kh in range(hkv):
                for kt in range(t // cfg.block_kv):
                    for tile, scaling, codes, sc_ in (
                        (dbg.p, bw.P_SQUARE_RCEIL, dbg.p_codes, dbg.p_scale),
                        (dbg.ds, sc.DS_SQUARE_RCEIL, dbg.ds_codes, dbg.ds_scale),
                    ):
                        x = np.asarray(tile)[bi, kh, kt].T
                        want = np.asarray(sc.fake_quantize(x, scaling), np.float32)
                        got = (
                            np.asarray(codes)[bi, kh, kt].T.astype(np.float32)
                            * np.asarray(sc_)[bi, kh, kt].T
                        )
                        bad += int(np.sum(got != want))
        ok &= bad == 0
        msg.append(f"debug tiles: {bad} codes differ from the emulator's quantizer")
    return ("PASS " if ok else "FAIL ") + name + " " + "; ".join(msg)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", choices=sorted(CASES), default=None)
    parser.add_argument("--interpret", action="store_true")
    args = parser.parse_args()
    names = [args.case] if args.case else list(CASES)
    n_fail = 0
    for name in names:
        try:
            if args.interpret and CASES[name][0].tc_accumulate:
                line = f"SKIP {name} (tc_accumulate needs the GPU)"
            elif args.interpret:
                from fp4sim.kernels.harness import interpret

                line = interpret(lambda name=name: run(name, 128))
            else:
                line = run(name)
        except Exception as e:  # report and go on
            line = f"FAIL {name} {type(e).__name__}: {str(e)[:500]}"
            traceback.print_exc()
        n_fail += line.startswith("FAIL")
        print(line, flush=True)
    print(f"{len(names) - n_fail}/{len(names)} passed")
    return 1 if n_fail else 0


if __name__ == "__main__":
    sys.exit(main())

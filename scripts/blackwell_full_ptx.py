"""On a GPU machine (with jax's CUDA plugin): compile every Blackwell matmul configuration (or
every sm_100a attention body, or both) for sm_100a through Mosaic GPU's own pipeline, keep the
PTX it dumps, assemble it with ``ptxas -arch=sm_100a``.

The compile targets sm_100a (the architecture query is patched, as in
``fp4sim.kernels.harness.cross_lower``); loading the result on a Hopper GPU fails after the PTX
has been written, which is all this needs. Usage (from the repository root):

    MOSAIC_GPU_DUMP_PTX=1 MOSAIC_GPU_DUMP_TO=$OUT/ptx python scripts/blackwell_full_ptx.py \
        $OUT/ptx [N] [matmul|attention|all]

(N: the first N configurations of each kind only; default kind ``matmul``.)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jax
import jax.experimental.mosaic.gpu.utils as mgpu_utils

from fp4sim.kernels import attention_sm100, ptx_check
from fp4sim.kernels.blackwell_matmul_mgpu import avals, build_kernel, shipped_configs


def _kernels(kind: str, count: int | None) -> list:
    """(name, function, operand structs) of the kernels to compile."""
    out = []
    if kind in ("matmul", "all"):
        for cfg in shipped_configs()[:count]:
            m, n, k = 256, 256, 512
            out.append((str(cfg), build_kernel(cfg, m, n, k), avals(cfg, m, n, k)))
    if kind in ("attention", "all"):
        for cfg, d in attention_sm100.shipped_cases()[:count]:
            av = attention_sm100.kernel_avals(cfg, 1, 512, 2, 1, d)
            fn = attention_sm100.kernel_function(
                tuple(av[0].shape), tuple(av[1].shape), d, 472, 0.125, cfg
            )
            out.append((f"attention {cfg} d={d}", fn, av))
    return out


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "ptx")
    count = int(sys.argv[2]) if len(sys.argv) > 2 else None
    kind = sys.argv[3] if len(sys.argv) > 3 else "matmul"
    if kind not in ("matmul", "attention", "all"):
        raise SystemExit(f"kind={kind!r}; allowed: matmul, attention, all")
    out.mkdir(parents=True, exist_ok=True)
    old = mgpu_utils._infer_arch
    mgpu_utils._infer_arch = lambda: (10, 0)
    try:
        for cfg, fn, av in _kernels(kind, count):
            structs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in av]
            try:
                jax.jit(lambda *xs, fn=fn: fn(*xs)).trace(*structs).lower().compile()
                print(f"{cfg}: compiled", flush=True)
            except Exception as e:  # expected on Hopper once the sm_100a cubin is loaded
                print(
                    f"{cfg}: compile/load stopped: {type(e).__name__}: {str(e)[:300]}", flush=True
                )
    finally:
        mgpu_utils._infer_arch = old
    ptxas = ptx_check.find_ptxas()
    files = sorted(out.rglob("*.ptx"))
    print(f"{len(files)} PTX files under {out}; ptxas {ptxas}")
    bad = 0
    for f in files:
        text = f.read_text()
        target = next((ln for ln in text.splitlines() if ln.startswith(".target")), "?")
        proc = subprocess.run(
            [ptxas, "-arch=sm_100a", str(f), "-o", str(f.with_suffix(".cubin"))],
            capture_output=True,
            text=True,
        )
        ok = proc.returncode == 0
        bad += not ok
        print(
            f"{'OK  ' if ok else 'FAIL'} {f.name} ({target}, tcgen05.mma: "
            f"{text.count('tcgen05.mma')}) {proc.stderr.strip()[:400]}"
        )
    return 1 if bad or not files else 0


if __name__ == "__main__":
    raise SystemExit(main())

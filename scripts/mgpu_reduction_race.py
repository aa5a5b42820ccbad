"""Smallest reproducer of a Mosaic GPU gap at jax 0.11.2: cross-warp reductions race between
Pallas threads (warpgroups).

    PYTHONPATH=. python scripts/mgpu_reduction_race.py              # on a Hopper GPU
    PYTHONPATH=. python scripts/mgpu_reduction_race.py --interpret  # interpret mode (passes)

Measured on the H200 (2026-12-03, jax 0.11.2): with one warpgroup 0 of 4096 outputs differ
from NumPy, with two 8192 of 8192; in interpret mode both pass, and it lowers for sm_90a.

A kernel with ``num_threads`` warpgroups; each builds a (64, 64) float32 tile in the WGMMA
register layout from iota (values differ between warpgroups), takes ``reps`` column maxima
(``x.max(axis=0)``: a reduction across the four warps of the warpgroup, which Mosaic stages
through shared memory), sums them and stores the result broadcast over the rows. With one
warpgroup the result equals NumPy's; with two, both warpgroups use the same shared-memory
scratch region (``ModuleContext.scratch_view`` in ``jax/_src/pallas/mosaic_gpu/lowering.py``)
at the same time. Prints, for 1 and 2 warpgroups, how many outputs differ from NumPy; for two,
per warpgroup, how many of its outputs equal its own or the other warpgroup's expected values;
and a control: the same two-warpgroup kernel with the reduction left out (the elementwise
values summed and stored), which must match. Exit status 1 when one warpgroup or the control
is wrong (the two-warpgroup reduction is the gap being shown, not a failure of the script).
"""

from __future__ import annotations

import argparse

import numpy as np

ROWS = COLS = 64


def expected(n_wg: int, reps: int, reduce: bool = True) -> np.ndarray:
    rows, cols = np.meshgrid(np.arange(ROWS), np.arange(COLS), indexing="ij")
    out = np.zeros((n_wg, ROWS, COLS), np.float32)
    for w in range(n_wg):
        x = ((rows * 7 + cols * 13) % 61 + 100 * w).astype(np.float32)
        acc = np.zeros(COLS, np.float32)
        if not reduce:
            acc = np.zeros((ROWS, COLS), np.float32)
        for r in range(reps):
            y = x * np.float32(r + 1) + np.float32(r)
            acc = acc + (y.max(axis=0) if reduce else y)
        out[w] = acc[None, :] if reduce else acc
    return out


def build(n_wg: int, reps: int, reduce: bool = True):
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    from fp4sim.kernels.harness import smem_transforms

    wg = plgpu.Layout.WGMMA

    def body(o_ref):
        def scoped(o_smem):
            w = lax.axis_index("wg") if n_wg > 1 else 0
            rows = plgpu.broadcasted_iota(jnp.int32, (ROWS, COLS), 0, layout=wg)
            cols = plgpu.broadcasted_iota(jnp.int32, (ROWS, COLS), 1, layout=wg)
            x = (lax.rem(rows * 7 + cols * 13, 61) + 100 * w).astype(jnp.float32)
            acc = None
            for r in range(reps):
                y = x * float(r + 1) + float(r)
                m = y.max(axis=0) if reduce else y  # across the warps, or none (the control)
                acc = m if acc is None else acc + m
            tile = lax.broadcast_in_dim(acc, (ROWS, COLS), [1]) if reduce else acc
            dst = o_smem.at[w] if n_wg > 1 else o_smem.at[0]
            dst[...] = tile
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(dst, o_ref.at[w])
            plgpu.wait_smem_to_gmem(0)

        pl.run_scoped(
            scoped,
            plgpu.SMEM(
                (n_wg, ROWS, COLS), jnp.float32, transforms=smem_transforms(jnp.float32, COLS)
            ),
            **({"collective_axes": "wg"} if n_wg > 1 else {}),
        )

    threads = {"num_threads": n_wg, "thread_name": "wg"} if n_wg > 1 else {}
    return plgpu.kernel(
        body, out_type=jax.ShapeDtypeStruct((n_wg, ROWS, COLS), jnp.float32), **threads
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--interpret", action="store_true")
    ap.add_argument("--reps", type=int, default=16)
    args = ap.parse_args()
    import jax

    from fp4sim.kernels import harness

    bad_total = 0
    for n_wg, reduce in ((1, True), (2, True), (2, False)):
        fn = build(n_wg, args.reps, reduce)
        run = (lambda f=fn: harness.interpret(f)) if args.interpret else jax.jit(fn)
        got = np.asarray(run())
        want = expected(n_wg, args.reps, reduce)
        bad = int(np.count_nonzero(got != want))
        bad_total += bad if (n_wg == 1 or not reduce) else 0
        what = "column maxima" if reduce else "control, no cross-warp reduction"
        print(
            f"{n_wg} warpgroup(s), {what}: {bad} of {got.size} outputs differ from NumPy",
            flush=True,
        )
        if n_wg == 2 and reduce:
            for w in range(2):
                own = int(np.count_nonzero(got[w] == want[w]))
                other = int(np.count_nonzero(got[w] == want[1 - w]))
                print(
                    f"  warpgroup {w}: {own} of {got[w].size} equal its own expected values, "
                    f"{other} warpgroup {1 - w}'s",
                    flush=True,
                )
    return 1 if bad_total else 0


if __name__ == "__main__":
    raise SystemExit(main())

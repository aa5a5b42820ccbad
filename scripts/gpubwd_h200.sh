#!/usr/bin/env bash
# GPU attention backward (issue 18) on the H200, the final short run. Total wall time <= 46 s
# (the lead's limit is 50 s):
#   1. the backward bench section at B2 S4096 H16 D128, non-causal and causal: ours (default
#      config), cuDNN bf16's and cuDNN FP8's backward side by side             (timeout 45 s)
# (Add e.g. `--backward-methods fp4sim_fp8_bwd_2wg fp4sim_fp8_bwd_tc_2wg` for the variants.)
# It runs the section module directly (python -m fp4sim.benchmarks.gpu_backward: the
# `backward` section of `python -m fp4sim bench gpu` without the ceilings, which take ~30 s).
# Each part is under `timeout`; a failure is logged and the next part still runs.
# Run from the repository root; everything goes under $OUT (default ./gpubwd-out).
# The longer checks of the first run (pytest -m gpu, the two-layer model) are in
# tests/kernels/test_attention_bwd_mgpu.py; scripts/gpubwd_smoke.py is an optional smoke.
set -u
OUT=${OUT:-$PWD/gpubwd-out}
mkdir -p "$OUT"
PY=${PYTHON:-$(bash scripts/find_python.sh 2>/dev/null || command -v python3)}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export XLA_PYTHON_CLIENT_PREALLOCATE=false
log() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$OUT/steps.log"; }
log "start; python $PY; git $(git rev-parse --short HEAD 2>/dev/null)"

log "bench 1: ours vs cuDNN bf16 and fp8, B2 S4096 H16 D128 non-causal and causal"
timeout 45 "$PY" -m fp4sim.benchmarks.gpu_backward --out "$OUT/bench1" \
  --backward-shape 2 4096 16 128 0 --backward-shape 2 4096 16 128 1 \
  --backward-methods fp4sim_fp8_bwd cudnn_bf16_bwd cudnn_fp8_bwd --backward-reps 2 --backward-iters 3 \
  > "$OUT/bench1.txt" 2>&1
log "bench 1 rc=$?"
grep -E "^  |target" "$OUT/bench1.txt" | tee -a "$OUT/steps.log"

log "done"

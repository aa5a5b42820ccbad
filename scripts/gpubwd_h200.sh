#!/usr/bin/env bash
# GPU attention backward (issue 18) on the H200. Total wall time <= 5.2 minutes:
#   1. smoke of every backward configuration + Mosaic's ptxas report  (timeout  50 s)
#   2. pytest -m gpu of the backward tests (not the model)            (timeout  90 s)
#   3. pytest: jax.grad of a two-layer model vs emulated_attention     (timeout  50 s)
#   4. python -m fp4sim bench gpu --only backward, 3 shapes           (timeout 120 s)
# Each part is under `timeout`; a failure is logged and the next part still runs.
# Run from the repository root; everything goes under $OUT (default ./gpubwd-out).
set -u
OUT=${OUT:-$PWD/gpubwd-out}
mkdir -p "$OUT"
PY=${PYTHON:-$(bash scripts/find_python.sh 2>/dev/null || command -v python3)}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export XLA_PYTHON_CLIENT_PREALLOCATE=false
log() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$OUT/steps.log"; }
log "start; python $PY; git $(git rev-parse --short HEAD 2>/dev/null)"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1

# 1. smoke, with Mosaic's ptxas resource report (registers, spills) of every kernel it builds
log "smoke"
mkdir -p "$OUT/dump"
MOSAIC_GPU_DUMP_TO="$OUT/dump" MOSAIC_GPU_DUMP_PTXAS=1 \
  timeout 50 "$PY" scripts/gpubwd_smoke.py > "$OUT/smoke.txt" 2>&1
log "smoke rc=$?"
grep -E '^(PASS|FAIL)|passed' "$OUT/smoke.txt" | tee -a "$OUT/steps.log"
grep -rhoE 'Used [0-9]+ registers|[0-9]+ bytes spill (stores|loads)|[0-9]+ bytes stack frame' \
  "$OUT/dump" "$OUT/smoke.txt" 2>/dev/null | sort | uniq -c > "$OUT/ptxas_summary.txt"
log "ptxas: $(tr '\n' ';' < "$OUT/ptxas_summary.txt")"

# 2. GPU tests of the backward kernels (debug tiles bitwise, gradient bound)
log "pytest -m gpu (kernels)"
timeout 90 "$PY" -m pytest -q -m gpu -p no:cacheprovider -s \
  tests/kernels/test_attention_bwd_mgpu.py -k "not two_layer" > "$OUT/pytest_gpu.txt" 2>&1
log "pytest rc=$? $(tail -1 "$OUT/pytest_gpu.txt")"

# 3. the two-layer model: jax.grad with our kernels vs emulated_attention, both on the GPU
log "pytest two-layer model"
timeout 50 "$PY" -m pytest -q -m gpu -p no:cacheprovider -s \
  tests/kernels/test_attention_bwd_mgpu.py -k two_layer > "$OUT/pytest_model.txt" 2>&1
log "model rc=$? $(tail -1 "$OUT/pytest_model.txt")"

# 4. bench (the summary table is printed last)
log "bench"
timeout 120 "$PY" -m fp4sim bench gpu --only backward --budget-s 105 --backward-reps 3 \
  --backward-iters 5 --out "$OUT/bench" > "$OUT/bench.txt" 2>&1
log "bench rc=$?"
tail -14 "$OUT/bench.txt" | tee -a "$OUT/steps.log"
log "done"

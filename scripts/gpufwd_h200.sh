#!/usr/bin/env bash
# GPU attention forward (issue 17, issue 15 item 13) on the H200. Total wall time <= 4 minutes
# for parts 1-3 (what matters most, in that order); 4-5 only run if the caller allows more:
#   1. smoke test of 18 configurations / odd inputs at small shapes   (timeout  40 s)
#   2. python -m fp4sim bench gpu --only attention at the 7 shapes    (timeout 150 s)
#   3. ncu SpeedOfLight + WarpStateStats (+ compute/memory/launch)    (timeout  45 s)
#   4. Mosaic's ptxas report and SASS of the default kernel           (timeout  20 s)
#   5. compute-sanitizer on the first failed smoke case (if any)      (timeout  30 s)
#   6. pytest -m gpu of the attention-forward kernel tests            (timeout  60 s)
# Run from the repository root; everything goes under $OUT (default ./gpufwd-out).
set -u
OUT=${OUT:-$PWD/gpufwd-out}
mkdir -p "$OUT"
PY=${PYTHON:-$(bash scripts/find_python.sh 2>/dev/null || command -v python3)}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export XLA_PYTHON_CLIENT_PREALLOCATE=false
log() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$OUT/steps.log"; }
log "start; python $PY; git $(git rev-parse --short HEAD 2>/dev/null)"

# 1. smoke
log "smoke"
timeout 40 "$PY" scripts/gpufwd_smoke.py > "$OUT/smoke.txt" 2>&1
log "smoke rc=$? $(tail -1 "$OUT/smoke.txt")"

# 2. bench (the summary lines are printed last)
log "bench"
timeout 150 "$PY" -m fp4sim bench gpu --only attention --budget-s 120 --attention-reps 3 \
  --attention-iters 5 --out "$OUT/bench" > "$OUT/bench.txt" 2>&1
log "bench rc=$?"
tail -9 "$OUT/bench.txt" | tee -a "$OUT/steps.log"

# 3. ncu of the main kernel (and cuDNN fp8 / bf16 beside it)
if command -v ncu > /dev/null; then
  log "ncu"
  timeout 45 ncu --profile-from-start off --clock-control none --target-processes all \
    --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis --section LaunchStats \
    -o "$OUT/attn" -f "$PY" scripts/gpufwd_ncu_probe.py > "$OUT/ncu_run.txt" 2>&1
  log "ncu rc=$?"
  [ -f "$OUT/attn.ncu-rep" ] && timeout 15 ncu -i "$OUT/attn.ncu-rep" --page details \
    > "$OUT/ncu_details.txt" 2>&1
else
  log "no ncu on PATH"
fi

# 4. ptxas resources and SASS of the default FP8 kernel (Mosaic's own dumps)
log "sass"
mkdir -p "$OUT/dump"
MOSAIC_GPU_DUMP_TO="$OUT/dump" MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_SASS=1 \
  timeout 20 "$PY" scripts/gpufwd_smoke.py --case fp8_default_d128 > "$OUT/dump/run.txt" 2>&1
log "sass rc=$?; $(ls "$OUT/dump" | wc -l) files"

# 5. compute-sanitizer on the first failing smoke case
first=$(grep -m1 '^FAIL' "$OUT/smoke.txt" | awk '{print $2}')
if [ -n "$first" ] && command -v compute-sanitizer > /dev/null; then
  log "compute-sanitizer on $first"
  timeout 30 compute-sanitizer --tool memcheck --print-limit 20 \
    "$PY" scripts/gpufwd_smoke.py --case "$first" > "$OUT/sanitizer.txt" 2>&1
  log "sanitizer rc=$?"
fi

# 6. GPU tests of the attention forward
log "pytest -m gpu"
timeout 60 "$PY" -m pytest -m gpu -x -q -p no:cacheprovider tests/kernels/test_attention_mgpu.py \
  tests/kernels/test_attention_mgpu_directp.py > "$OUT/pytest_gpu.txt" 2>&1
log "pytest rc=$? $(tail -1 "$OUT/pytest_gpu.txt")"
log "done"

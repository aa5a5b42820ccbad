#!/usr/bin/env bash
# Blackwell attention bodies (issue 20, helper "bw") on the H200. Total wall time <= 240 s:
#   1. the P-scale store of the sm_100a attention bodies (a per-thread permuted SMEM store,
#      plgpu.inline_mgpu) run on the H200 with the WGMMA row layout (the same code Blackwell runs
#      with the TCGEN05 one): pytest -m gpu -k p_scale_store_on_gpu                   (timeout 60 s)
#   2. python -m fp4sim validate --only wgmma_probe.fp8: the table lists every Blackwell check
#      as "(not for sm_90; only compiled, never run)"                                  (timeout 60 s)
#   3. every sm_100a attention body (9 configurations) compiled by Mosaic GPU's own pipeline
#      for sm_100a, the whole-kernel PTX dumped and assembled with ptxas -arch=sm_100a
#      (scripts/blackwell_full_ptx.py ... attention); loading the sm_100a cubin on the H200 is
#      expected to fail after the PTX is written                                       (timeout 110 s)
# Each part is under `timeout`; a failure is logged and the next part still runs.
# Run from the repository root; everything goes under $OUT (default ./bw-out).
set -u
OUT=${OUT:-$PWD/bw-out}
mkdir -p "$OUT"
PY=${PYTHON:-$(bash scripts/find_python.sh 2>/dev/null || command -v python3)}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export XLA_PYTHON_CLIENT_PREALLOCATE=false
log() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$OUT/steps.log"; }
log "start; python $PY; git $(git rev-parse --short HEAD 2>/dev/null)"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1

log "P-scale store on the GPU"
timeout 60 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_attention_sm100.py \
  -k p_scale_store_on_gpu > "$OUT/p_scale_store.txt" 2>&1
log "p_scale_store rc=$?"
tail -3 "$OUT/p_scale_store.txt" | tee -a "$OUT/steps.log"

log "validate (table with the Blackwell checks listed as not run)"
timeout 60 "$PY" -m fp4sim validate --only wgmma_probe.fp8 --out "$OUT/validate.json" \
  > "$OUT/validate.txt" 2>&1
log "validate rc=$?"
grep -E "attention_sm100|blackwell_matmul|passed" "$OUT/validate.txt" | tee -a "$OUT/steps.log"

log "full-kernel PTX of the sm_100a attention bodies"
MOSAIC_GPU_DUMP_PTX=1 MOSAIC_GPU_DUMP_TO="$OUT/ptx" \
  timeout 110 "$PY" scripts/blackwell_full_ptx.py "$OUT/ptx" 9 attention > "$OUT/full_ptx.txt" 2>&1
log "full ptx rc=$?"
grep -E '^(OK|FAIL)|PTX files|compile' "$OUT/full_ptx.txt" | cut -c1-300 | tee -a "$OUT/steps.log"
log "done"

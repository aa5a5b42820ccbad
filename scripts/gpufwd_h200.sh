#!/usr/bin/env bash
# GPU attention forward (issue 17) on the H200, final run: total wall time <= 65 s.
#   1. python -m fp4sim bench gpu --only attention --attention-core: the 8 shapes (parity shapes
#      first), only the default FP8 kernel, Direct-P affine, cuDNN bf16 / fp8   (timeout 62 s)
# The first run's full script (smoke, all variants, ncu, SASS dump) is in git history
# (commit d69cf2a); the README's "Measured on the H200" has the final figures.
# Run from the repository root; everything goes under $OUT (default ./gpufwd-out).
set -u
OUT=${OUT:-$PWD/gpufwd-out}
mkdir -p "$OUT"
PY=${PYTHON:-$(bash scripts/find_python.sh 2>/dev/null || command -v python3)}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export XLA_PYTHON_CLIENT_PREALLOCATE=false
log() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$OUT/steps.log"; }
log "start; python $PY"
timeout 62 "$PY" -m fp4sim bench gpu --only attention --attention-core --budget-s 42 \
  --attention-reps 2 --attention-iters 4 --out "$OUT/bench" > "$OUT/bench.txt" 2>&1
log "bench rc=$?"
tail -9 "$OUT/bench.txt" | tee -a "$OUT/steps.log"
log "done"

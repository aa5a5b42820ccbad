#!/usr/bin/env bash
# gpuemu (issue 19) on the H200: the emulators under jax.jit on the GPU, fast and bit-identical
# to the CPU. Total wall time: at most 115 s (the final run's limit is 120 s): bench attention
# under a 34 s `timeout`, then bench training in what is left of 114 s. Run from the repository
# root; everything goes under $OUT:
#   env.txt                 GPU, commit
#   training_s2048.log/.json
#                           bench training H8 S2048 D128 causal direct_p_fp8_training (jnp f32 vs
#                           emulated fwd+bwd in one run, --targets-only: these two sides, compiled
#                           at once; head 0's gradients recomputed on the CPU backend in the
#                           same process and compared bit for bit, printed after the timings)
#   attention_all.log/.json bench attention --device gpu (Direct-P forward vs cuDNN bf16, S4096
#                           D128) with FP4SIM_GPU_KERNELS=all (the Direct-P kernels, opt-in), O and
#                           LSE compared bit for bit with the CPU backend's (--check-cpu); if that
#                           fails early, attention.log/.json: the default kernels
# (S512 D64: measured in gpuemu-1, 4.18x, bit-identical; the GPU tests: gpuemu-1 and later runs.)
set -u
OUT=${OUT:-out-gpuemu}
mkdir -p "$OUT"
PY=$(bash scripts/find_python.sh 2>/dev/null || command -v python3)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export XLA_PYTHON_CLIENT_PREALLOCATE=false
export PYTHONUNBUFFERED=1  # a part cut by its timeout keeps what it printed
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start )) s] $*" | tee -a "$OUT/timeline.txt"; }

stamp "env"
{ nvidia-smi --query-gpu=name,clocks.sm --format=csv 2>&1; git log -1 --oneline 2>&1; } \
  > "$OUT/env.txt"

stamp "bench attention (FP4SIM_GPU_KERNELS=all: with the Direct-P kernels)"
FP4SIM_GPU_KERNELS=all timeout -k 2 34 "$PY" -m fp4sim bench attention --device gpu --repeats 5 \
  --check-cpu --json "$OUT/attention_all.json" > "$OUT/attention_all.log" 2>&1
rc=$?
echo "rc=$rc" >> "$OUT/attention_all.log"
used=$(( $(date +%s) - start ))
if [ "$rc" != 0 ] && [ "$used" -lt 22 ]; then  # the Direct-P kernels failed early: the default
  stamp "bench attention (default kernels)"
  timeout -k 2 "$(( 36 - used ))" "$PY" -m fp4sim bench attention --device gpu --repeats 5 \
    --json "$OUT/attention.json" > "$OUT/attention.log" 2>&1
  echo "rc=$?" >> "$OUT/attention.log"
fi

stamp "bench training S2048"
timeout -k 2 "$(( 114 - ($(date +%s) - start) ))" "$PY" -m fp4sim bench training --seq 2048 \
  --head-dim 128 --heads 8 --also none --targets-only --check-heads 1 \
  --json "$OUT/training_s2048.json" > "$OUT/training_s2048.log" 2>&1
echo "rc=$?" >> "$OUT/training_s2048.log"

stamp "done"

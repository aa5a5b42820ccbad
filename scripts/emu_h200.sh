#!/usr/bin/env bash
# emu (issue 19) on the H200: the emulators fast under jax.jit on the GPU, bit-identical to the
# CPU. Runs the two benches the "Must show" names, each with --profile (a jax.profiler
# trace of the emulated call, summarised per kernel as a text table: fp4sim.benchmarks.profile).
# Total wall time at most 235 s (each part under `timeout`). Run from the repository root;
# everything goes under $OUT, small text files only (the raw traces go to /tmp, removed):
#   env.txt                  GPU, clocks, commit
#   timeline.txt             seconds since start of each part
#   attention_all.log/.json  bench attention --device gpu (Direct-P forward hw_fp4_direct_p vs
#                            cuDNN bf16, S4096 D128) with FP4SIM_GPU_KERNELS=all (the Direct-P
#                            kernels), O and LSE compared bit for bit with the CPU backend
#                            (--check-cpu); per-kernel table in prof_attention_all/profile.txt
#   attention_default.log/.json
#                            the same with the default kernels (FP4SIM_GPU_KERNELS unset, no CPU
#                            check); prof_attention_default/profile.txt
#   training.log/.json       bench training --seq 2048 --head-dim 128 --heads 8 --also 512x64
#                            --targets-only --check-heads 1: jnp f32 fwd+bwd vs emulated fwd+bwd
#                            of direct_p_fp8_training (causal), both shapes in one run, head 0's
#                            gradients recomputed on the CPU backend in the same process and
#                            compared bit for bit; per-kernel tables of the emulated fwd+bwd in
#                            prof_training/s2048_d128/profile.txt and prof_training/s512_d64/
set -u
OUT=${OUT:-out-emu}
mkdir -p "$OUT"
PY=$(bash scripts/find_python.sh 2>/dev/null || command -v python3)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export XLA_PYTHON_CLIENT_PREALLOCATE=false
export PYTHONUNBUFFERED=1  # a part cut by its timeout keeps what it printed
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start )) s] $*" | tee -a "$OUT/timeline.txt"; }
left() { echo $(( $1 - ($(date +%s) - start) )); }

stamp "env"
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv 2>&1; git log -1 --oneline 2>&1
  git status --short 2>&1 | head -5; } > "$OUT/env.txt"

stamp "bench attention, FP4SIM_GPU_KERNELS=all (the Direct-P kernels), --check-cpu"
FP4SIM_GPU_KERNELS=all timeout -k 2 "$(left 45)" "$PY" -m fp4sim bench attention --device gpu \
  --repeats 7 --check-cpu --profile "$OUT/prof_attention_all" --json "$OUT/attention_all.json" \
  > "$OUT/attention_all.log" 2>&1
echo "rc=$?" >> "$OUT/attention_all.log"

stamp "bench attention, default kernels"
timeout -k 2 "$(left 80)" "$PY" -m fp4sim bench attention --device gpu --repeats 7 \
  --profile "$OUT/prof_attention_default" --json "$OUT/attention_default.json" \
  > "$OUT/attention_default.log" 2>&1
echo "rc=$?" >> "$OUT/attention_default.log"

stamp "bench training S2048 D128 then S512 D64"
timeout -k 2 "$(left 232)" "$PY" -m fp4sim bench training --seq 2048 --head-dim 128 --heads 8 \
  --also 512x64 --targets-only --check-heads 1 --profile "$OUT/prof_training" \
  --json "$OUT/training.json" > "$OUT/training.log" 2>&1
echo "rc=$?" >> "$OUT/training.log"

stamp "done"

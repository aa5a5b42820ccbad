#!/usr/bin/env bash
# emu (issue 19) on the H200: the emulators fast under jax.jit on the GPU, bit-identical to the
# CPU. Total wall time at most about 210 s (300 s with EMU_PROFILE=1) (each part under `timeout`). Run from the repository
# root; everything goes under $OUT (small text files; pack them into one archive to bring back):
#   env.txt                        GPU, clocks, commit
#   timeline.txt                   seconds since start of each part
#   sweep512.log, sweep.log (+ sweep*/kernel_sweep.json), only with EMU_SWEEP=1
#                                  scripts/emu_kernel_sweep.py: the four backward products of the
#                                  training route at H8 S512 D64 and H8 S2048 D128 under several
#                                  tiles / warps / unroll / stages, bits compared with the default
#   training.log/.json             bench training --seq 512 --head-dim 64 --heads 8 --also 2048x128
#                                  --targets-only --check-heads 1: jnp f32 fwd+bwd vs emulated
#                                  fwd+bwd of direct_p_fp8_training (causal), head 0's gradients
#                                  recomputed on the CPU backend in the same process, bit for bit
#   attention_default.log/.json    bench attention --device gpu (Direct-P forward hw_fp4_direct_p
#                                  vs cuDNN bf16, S4096 D128), O and LSE vs the CPU backend
#   attention_all.log/.json        the same with FP4SIM_GPU_KERNELS=all (the opt-in Direct-P kernels)
#   only with EMU_PROFILE=1 (about 90 s more):
#   attention_nocb.log, prof_attention_nocb/profile.txt
#                                  the same with XLA's command buffers off and --profile: the
#                                  emulator's per-kernel time table (with command buffers on, the
#                                  trace shows a single command-buffer entry)
#   training_nocb.log, prof_training_nocb/s2048_d128/profile.txt
#                                  the emulated fwd+bwd's per-kernel table at S2048 D128 H8
set -u
OUT=${OUT:-out-emu}
mkdir -p "$OUT"
PY=$(bash scripts/find_python.sh 2>/dev/null || command -v python3)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export XLA_PYTHON_CLIENT_PREALLOCATE=false
export PYTHONUNBUFFERED=1  # a part cut by its timeout keeps what it printed
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start )) s] $*" | tee -a "$OUT/timeline.txt"; }
left() { local l=$(( $1 - ($(date +%s) - start) )); [ "$l" -gt 5 ] && echo "$l" || echo 5; }

stamp "env"
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv 2>&1; git log -1 --oneline 2>&1
  git status --short 2>&1 | head -5; } > "$OUT/env.txt"

if [ "${EMU_SWEEP:-0}" = 1 ]; then
stamp "ordered-sum kernel sweep, S512 D64 and S2048 D128"
timeout -k 2 35 "$PY" scripts/emu_kernel_sweep.py --budget 25 --seq 512 --head-dim 64 \
  --out "$OUT/sweep512" > "$OUT/sweep512.log" 2>&1
echo "rc=$?" >> "$OUT/sweep512.log"
timeout -k 2 50 "$PY" scripts/emu_kernel_sweep.py --budget 40 --out "$OUT/sweep" \
  > "$OUT/sweep.log" 2>&1
echo "rc=$?" >> "$OUT/sweep.log"
fi
start=$(date +%s)  # the budgets below count from here

stamp "bench training S512 D64 and S2048 D128, H8"
timeout -k 2 "$(left 170)" "$PY" -m fp4sim bench training --seq 512 --head-dim 64 --heads 8 \
  --also 2048x128 --targets-only --check-heads 1 --json "$OUT/training.json" \
  > "$OUT/training.log" 2>&1
echo "rc=$?" >> "$OUT/training.log"

stamp "bench attention, default kernels, --check-cpu"
timeout -k 2 "$(left 190)" "$PY" -m fp4sim bench attention --device gpu --repeats 7 --check-cpu \
  --json "$OUT/attention_default.json" > "$OUT/attention_default.log" 2>&1
echo "rc=$?" >> "$OUT/attention_default.log"

stamp "bench attention, FP4SIM_GPU_KERNELS=all (the opt-in Direct-P kernels)"
FP4SIM_GPU_KERNELS=all timeout -k 2 "$(left 210)" "$PY" -m fp4sim bench attention --device gpu \
  --repeats 7 --json "$OUT/attention_all.json" > "$OUT/attention_all.log" 2>&1
echo "rc=$?" >> "$OUT/attention_all.log"

if [ "${EMU_PROFILE:-0}" = 1 ]; then
stamp "per-kernel profile of bench attention with XLA's command buffers off (else one entry)"
XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_gpu_enable_command_buffer=" timeout -k 2 "$(left 230)" \
  "$PY" -m fp4sim bench attention --device gpu --repeats 3 --profile "$OUT/prof_attention_nocb" \
  > "$OUT/attention_nocb.log" 2>&1
echo "rc=$?" >> "$OUT/attention_nocb.log"

stamp "per-kernel profile of the emulated fwd+bwd at S2048 D128 H8, command buffers off"
XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_gpu_enable_command_buffer=" timeout -k 2 "$(left 300)" \
  "$PY" -m fp4sim bench training --seq 2048 --head-dim 128 --heads 8 --also none --targets-only \
  --check-heads 0 --repeats 3 --profile "$OUT/prof_training_nocb" > "$OUT/training_nocb.log" 2>&1
echo "rc=$?" >> "$OUT/training_nocb.log"

fi
stamp "done"

#!/usr/bin/env bash
# emu (issue 19) on the H200: the emulators fast under jax.jit on the GPU, bit-identical to the
# CPU. Runs the benches the "Must show" names, each with --profile (a jax.profiler trace
# of the emulated call, summarised per kernel as a text table: fp4sim.benchmarks.profile), and a
# sweep of the ordered-sum kernel's Triton configurations at the backward's shapes. Total wall
# time at most 255 s (each part under `timeout`, in this order of priority). Run from the
# repository root; everything goes under $OUT, small text files only (raw traces: /tmp, removed):
#   env.txt                  GPU, clocks, commit
#   timeline.txt             seconds since start of each part
#   training.log/.json       bench training --seq 512 --head-dim 64 --heads 8 --also 2048x128
#                            --targets-only --check-heads 1: jnp f32 fwd+bwd vs emulated fwd+bwd
#                            of direct_p_fp8_training (causal), head 0's gradients recomputed on
#                            the CPU backend in the same process and compared bit for bit;
#                            per-kernel table of the emulated fwd+bwd:
#                            prof_training/s2048_d128/profile.txt
#   sweep.log, sweep/kernel_sweep.json
#                            scripts/emu_kernel_sweep.py (45 s): dV, dP, dQ, dK kernels at
#                            H8 S2048 D128 under several tiles / warps / unroll / stages, bits
#                            compared with the default configuration
#   attention_all.log/.json  bench attention --device gpu (Direct-P forward hw_fp4_direct_p vs
#                            cuDNN bf16, S4096 D128) with FP4SIM_GPU_KERNELS=all (the Direct-P
#                            kernels), O and LSE compared bit for bit with the CPU backend
#                            (--check-cpu); per-kernel table in prof_attention_all/profile.txt
#   attention_default.log/.json
#                            the same with the default kernels (FP4SIM_GPU_KERNELS unset, no CPU
#                            check); prof_attention_default/profile.txt
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

stamp "bench training S2048 D128 (with --profile)"
timeout -k 2 "$(left 150)" "$PY" -m fp4sim bench training --seq 512 --head-dim 64 --heads 8 \
  --also 2048x128 --targets-only --check-heads 1 --profile "$OUT/prof_training" \
  --json "$OUT/training.json" > "$OUT/training.log" 2>&1
echo "rc=$?" >> "$OUT/training.log"

stamp "ordered-sum kernel sweep"
timeout -k 2 "$(left 200)" "$PY" scripts/emu_kernel_sweep.py --budget 40 --out "$OUT/sweep" \
  > "$OUT/sweep.log" 2>&1
echo "rc=$?" >> "$OUT/sweep.log"

stamp "bench attention, FP4SIM_GPU_KERNELS=all (the Direct-P kernels), --check-cpu"
FP4SIM_GPU_KERNELS=all timeout -k 2 "$(left 232)" "$PY" -m fp4sim bench attention --device gpu \
  --repeats 7 --check-cpu --profile "$OUT/prof_attention_all" --json "$OUT/attention_all.json" \
  > "$OUT/attention_all.log" 2>&1
echo "rc=$?" >> "$OUT/attention_all.log"

stamp "bench attention, default kernels"
timeout -k 2 "$(left 253)" "$PY" -m fp4sim bench attention --device gpu --repeats 7 \
  --profile "$OUT/prof_attention_default" --json "$OUT/attention_default.json" \
  > "$OUT/attention_default.log" 2>&1
echo "rc=$?" >> "$OUT/attention_default.log"

stamp "done"

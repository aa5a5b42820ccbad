#!/usr/bin/env bash
# gpuemu (issue 19) on the H200: the emulators under jax.jit on the GPU, fast and bit-identical
# to the CPU. Total wall time: at most 235 s (each part under `timeout`, the last one gets what
# is left of 235 s). Run from the repository root; everything goes under $OUT:
#   env.txt                 GPU, jax, devices, commit
#   training_s2048.log/.json, training_s512.log/.json
#                           bench training H8 S2048 D128, then H8 S512 D64 (jnp f32 vs emulated
#                           fwd+bwd in one run; at S2048 head 0's gradients recomputed on the CPU
#                           backend in the same process and compared bit for bit; S512 was
#                           compared in gpuemu-1, and by the training test below)
#   attention_all.log/.json bench attention --device gpu (Direct-P forward vs cuDNN bf16, S4096
#                           D128) with FP4SIM_GPU_KERNELS=all (the Direct-P kernels, opt-in)
#   attention.log/.json     the same with the default kernels (ordered, scores, rows)
#   pytest.log              the new GPU tests of tests/test_gpu_bit_identity.py, most important
#                           first (Direct-P kernels, training gradients, the chain kernel)
set -u
OUT=${OUT:-out-gpuemu}
mkdir -p "$OUT"
PY=$(bash scripts/find_python.sh 2>/dev/null || command -v python3)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export XLA_PYTHON_CLIENT_PREALLOCATE=false
export PYTHONUNBUFFERED=1  # a part cut by its timeout keeps what it printed
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start )) s] $*" | tee -a "$OUT/timeline.txt"; }
left() { local l=$(( 235 - ($(date +%s) - start) )); [ "$l" -lt 5 ] && l=5; echo "$l"; }

stamp "env"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv 2>&1
  git log -1 --oneline 2>&1; } > "$OUT/env.txt"

stamp "bench training S2048"
timeout -k 3 100 "$PY" -m fp4sim bench training --seq 2048 --head-dim 128 --heads 8 --also none \
  --check-heads 1 --json "$OUT/training_s2048.json" > "$OUT/training_s2048.log" 2>&1
echo "rc=$?" >> "$OUT/training_s2048.log"
stamp "bench training S512"
timeout -k 3 35 "$PY" -m fp4sim bench training --seq 512 --head-dim 64 --heads 8 --also none \
  --check-heads 0 --json "$OUT/training_s512.json" > "$OUT/training_s512.log" 2>&1
echo "rc=$?" >> "$OUT/training_s512.log"

stamp "bench attention (FP4SIM_GPU_KERNELS=all: with the Direct-P kernels)"
FP4SIM_GPU_KERNELS=all timeout -k 3 40 "$PY" -m fp4sim bench attention --device gpu --repeats 5 \
  --json "$OUT/attention_all.json" > "$OUT/attention_all.log" 2>&1
echo "rc=$?" >> "$OUT/attention_all.log"
stamp "bench attention (default kernels: ordered,scores,rows)"
timeout -k 3 30 "$PY" -m fp4sim bench attention --device gpu --repeats 5 \
  --json "$OUT/attention.json" > "$OUT/attention.log" 2>&1
echo "rc=$?" >> "$OUT/attention.log"

T=tests/test_gpu_bit_identity.py
stamp "pytest gpu (new tests, $(left) s left)"
timeout -k 3 "$(left)" "$PY" -m pytest -m gpu -v -p no:cacheprovider \
  "$T::test_direct_p_forward_kernels_gpu_equal_cpu" \
  "$T::test_training_gradients_gpu_equals_cpu[direct_p_fp8_training-False]" \
  "$T::test_ordered_kernel_gpu_equals_numpy_chain" \
  "$T::test_attention_forward_gpu_equals_cpu[True-hw_fp4_direct_p]" \
  "$T::test_training_gradients_gpu_equals_cpu[direct_p_fp4_forward-True]" \
  > "$OUT/pytest.log" 2>&1
echo "rc=$?" >> "$OUT/pytest.log"
stamp "done"

#!/usr/bin/env bash
# gpuemu (issue 19) on the H200: the emulators under jax.jit on the GPU, fast and bit-identical
# to the CPU. Total wall time: at most 8 minutes (each part under `timeout`: 15 + 190 + 60 +
# 40 + 50 + 80 + 40 s = 475 s). Run from the repository root; everything goes under $OUT:
#   env.txt                 GPU, jax, devices
#   training.log/.json      bench training H8 S512 D64 and H8 S2048 D128 (jnp f32 vs emulated
#                           fwd+bwd in one run; 2 heads' gradients recomputed on the CPU backend
#                           and compared bit for bit)
#   attention.log/.json     bench attention --device gpu (Direct-P forward vs cuDNN bf16, S4096 D128)
#   profile_forward/        per-kernel GPU time of the Direct-P forward (jax.profiler trace,
#                           summary.json, optimized_hlo.txt), log in profile_forward.log
#   row_chunks.log          experiment: the Direct-P forward with other query-row chunks
#   pytest_new.log, pytest_rest.log   pytest -m gpu tests/test_gpu_bit_identity.py (the new
#                           training/kernel tests first, then the others)
set -u
OUT=${OUT:-out-gpuemu}
mkdir -p "$OUT"
PY=$(bash scripts/find_python.sh 2>/dev/null || command -v python3)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export XLA_PYTHON_CLIENT_PREALLOCATE=false
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start )) s] $*" | tee -a "$OUT/timeline.txt"; }

stamp "env"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
  timeout -k 5 15 "$PY" -c "import jax, jaxlib; print(jax.__version__, jaxlib.__version__, jax.devices())" 2>&1
  git log -1 --oneline 2>&1; } > "$OUT/env.txt"

stamp "bench training"
timeout -k 5 190 "$PY" -m fp4sim bench training --seq 512 --head-dim 64 --heads 8 --also 2048x128 \
  --json "$OUT/training.json" > "$OUT/training.log" 2>&1
echo "rc=$?" >> "$OUT/training.log"

stamp "bench attention"
timeout -k 5 60 "$PY" -m fp4sim bench attention --device gpu --json "$OUT/attention.json" \
  > "$OUT/attention.log" 2>&1
echo "rc=$?" >> "$OUT/attention.log"

stamp "profile Direct-P forward"
timeout -k 5 40 "$PY" scripts/gpuemu_profile.py --what forward --seq 4096 --head-dim 128 \
  --out "$OUT/profile_forward" > "$OUT/profile_forward.log" 2>&1
echo "rc=$?" >> "$OUT/profile_forward.log"
rm -rf "$OUT/profile_forward/trace"  # large; summary.json keeps the table

stamp "row chunks"
timeout -k 5 50 "$PY" scripts/gpuemu_profile.py --what row-chunks --chunks 128,1024,4096 \
  --seq 4096 --head-dim 128 --out "$OUT/row_chunks" > "$OUT/row_chunks.log" 2>&1
echo "rc=$?" >> "$OUT/row_chunks.log"

NEW="training or ordered_kernel or fp8_pv"
stamp "pytest gpu (new tests)"
timeout -k 5 80 "$PY" -m pytest -m gpu -v -p no:cacheprovider --durations=0 \
  tests/test_gpu_bit_identity.py -k "$NEW" > "$OUT/pytest_new.log" 2>&1
echo "rc=$?" >> "$OUT/pytest_new.log"
stamp "pytest gpu (the others)"
timeout -k 5 40 "$PY" -m pytest -m gpu -v -p no:cacheprovider tests/test_gpu_bit_identity.py \
  -k "not ($NEW)" > "$OUT/pytest_rest.log" 2>&1
echo "rc=$?" >> "$OUT/pytest_rest.log"
stamp "done"

#!/usr/bin/env bash
# The PyTorch interop tests and the GPU notebook on the GPU machine (Python 3.12, jax 0.11.2 with
# CUDA, torch with CUDA). Run from the repository root; everything goes under $OUT. Total wall
# time: at most about 5 minutes (each part under its own `timeout`).
#   env.txt              GPU, commit, Python / torch / jax versions and devices
#   interop.log/.xml     pytest tests/test_interop.py (junit xml): the CPU-tensor tests (bf16 and
#                        grad-requiring tensors through quantize/encode/decode/attention_forward,
#                        same bits as NumPy; results in the caller's type) and the CUDA-tensor
#                        tests (marked gpu: tensors on the device, results back on it)
#   notebook_gpu.log/.xml
#                        pytest tests/test_notebooks.py -k gpu_notebook_executes: notebooks/06
#                        executed as a notebook (nbclient + ipykernel; skipped, with the reason
#                        in the log, where those are not installed)
#   notebook_gpu_script.log
#                        notebooks/06 run as a plain script (FP4SIM_SMALL=1, MPLBACKEND=Agg), so
#                        that the notebook's code is checked on the GPU even without nbclient
set -u
OUT=${OUT:-out-nb}
mkdir -p "$OUT"
PY=$(bash scripts/find_python.sh 2>/dev/null || command -v python3)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # jax and torch share the GPU in one process
export PYTHONUNBUFFERED=1
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start )) s] $*" | tee -a "$OUT/timeline.txt"; }

stamp "env"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
  git log -1 --oneline 2>&1
  timeout -k 2 60 "$PY" - <<'EOF' 2>&1
import sys
print("python", sys.version.split()[0], sys.executable)
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
          torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
except Exception as e:
    print("torch: not importable:", e)
try:
    import jax
    print("jax", jax.__version__, jax.devices())
except Exception as e:
    print("jax: not importable:", e)
for m in ("nbclient", "nbformat", "ipykernel", "jupytext", "matplotlib"):
    try:
        print(m, __import__(m).__version__)
    except Exception as e:
        print(m, "not importable:", e)
EOF
} > "$OUT/env.txt"

stamp "tests/test_interop.py (CPU and CUDA tensors)"
timeout -k 5 150 "$PY" -m pytest -q -p no:cacheprovider -rs tests/test_interop.py \
  --junitxml="$OUT/interop.xml" > "$OUT/interop.log" 2>&1
echo "rc=$?" >> "$OUT/interop.log"
tail -n 12 "$OUT/interop.log"

stamp "tests/test_notebooks.py -k gpu_notebook_executes (notebooks/06 as a notebook)"
timeout -k 5 240 "$PY" -m pytest -q -p no:cacheprovider -rs tests/test_notebooks.py -k gpu_notebook_executes \
  --junitxml="$OUT/notebook_gpu.xml" > "$OUT/notebook_gpu.log" 2>&1
echo "rc=$?" >> "$OUT/notebook_gpu.log"
tail -n 8 "$OUT/notebook_gpu.log"

if grep -q "skipped" "$OUT/notebook_gpu.log" && ! grep -q " passed" "$OUT/notebook_gpu.log"; then
  stamp "notebooks/06 as a script (the notebook test was skipped)"
  (cd "$OUT" && FP4SIM_SMALL=1 MPLBACKEND=Agg timeout -k 5 150 "$PY" \
    "$OLDPWD/notebooks/06_gpu_kernels.py") > "$OUT/notebook_gpu_script.log" 2>&1
  echo "rc=$?" >> "$OUT/notebook_gpu_script.log"
  tail -n 20 "$OUT/notebook_gpu_script.log"
fi
stamp "done"

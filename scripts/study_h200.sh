#!/usr/bin/env bash
# The training study (issue 21) on one H200: python -m fp4sim train --study --device gpu.
# Total wall time: at most 5 minutes (the study's own budget is STUDY_BUDGET_S, default 250 s,
# counted from its process's start and covering the compilations; a hard `timeout` of
# budget + 30 s stops it in any case; the rest takes seconds).
# Runs from the repository root; writes everything under $OUT:
#   $OUT/study/train_study.json  the record (regenerate figure + table here with
#                                python -m fp4sim train --replot $OUT/study/train_study.json)
#   $OUT/study/train_table.md    the table; train_loss.png too if matplotlib is installed
#   $OUT/study/jax_cache/        jax's persistent compilation cache (a second run reuses it)
#   $OUT/study_log.txt           the log: compile times per recipe, steps/s per recipe
#   $OUT/env.txt                 GPU, driver, versions
# Sets nothing about git: the caller passes FP4SIM_GIT_REVISION (the copy has no .git).
# Knobs (environment): STUDY_BUDGET_S, STUDY_ARGS (extra arguments, e.g. "--batch 4"),
# STUDY_ACCUMULATION (backend | sequential; default: sequential where the GPU kernels exist),
# STUDY_XLA_FLAGS (appended to XLA_FLAGS; the study adds --xla_gpu_deterministic_ops=true).
set -u
: "${OUT:?OUT must name the output folder}"
cd "$(dirname "$0")/.."
mkdir -p "$OUT/study"
PY=${PYTHON:-python3}
BUDGET=${STUDY_BUDGET_S:-250}
{
  date -u
  echo "FP4SIM_GIT_REVISION=${FP4SIM_GIT_REVISION:-<unset>}"
  nproc
  timeout 20 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
  timeout 30 "$PY" -c "from importlib.metadata import version as v; print(*(f'{n} {v(n)}' \
for n in ('jax', 'jaxlib', 'optax', 'numpy')))" 2>&1
} > "$OUT/env.txt"
cat "$OUT/env.txt"
# The emulated backward's accumulation: the bit-exact ordered sums where the emulator has its GPU
# kernels (fp4sim.attention.ordered_gpu, issue 19), else the backend's dot (the ordered sums as
# jnp loops are ~200x plain attention on the GPU). STUDY_ACCUMULATION overrides.
if PYTHONPATH="$PWD" "$PY" -c "import importlib.util, sys; \
sys.exit(importlib.util.find_spec('fp4sim.attention.ordered_gpu') is None)" 2>/dev/null; then
  ACC=${STUDY_ACCUMULATION:-sequential}
else
  ACC=${STUDY_ACCUMULATION:-backend}
fi
echo "accumulation: $ACC" | tee -a "$OUT/env.txt"
if [ -n "${STUDY_XLA_FLAGS:-}" ]; then export XLA_FLAGS="${XLA_FLAGS:-} $STUDY_XLA_FLAGS"; fi
# shellcheck disable=SC2086
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" timeout --kill-after=5 $((BUDGET + 30)) \
  "$PY" -m fp4sim train --study --device gpu --time-budget-s "$BUDGET" --no-progress \
  --accumulation "$ACC" \
  --out "$OUT/study" ${STUDY_ARGS:-} > "$OUT/study_log.txt" 2>&1
rc=$?
echo "study exit status: $rc" | tee -a "$OUT/study_log.txt"
grep -v '^|' "$OUT/study_log.txt" | tail -n 60
exit $rc

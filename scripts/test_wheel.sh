#!/usr/bin/env bash
# Build fp4sim's wheel, install it into a fresh virtual environment outside the repository and
# run what a user of the wheel runs: `golden check` (the shipped golden vectors, bit for bit),
# `reproduce --quick` (the report), from a folder that is not the repository, so nothing of
# the checkout is importable, and the notebooks, executed as notebooks in an IPython kernel of
# the venv's interpreter (tests/test_notebooks.py: the kernel imports the installed wheel).
# Optionally pin another jax and run the emulator subset of the test suite against the installed
# wheel (CI does this with jax 0.12.0.1, see .ci/run).
#
#   bash scripts/test_wheel.sh                      # the wheel with the dependencies pip chooses
#   bash scripts/test_wheel.sh --jax 0.12.0.1       # ... next to jax/jaxlib 0.12.0.1
#   bash scripts/test_wheel.sh --jax 0.12.0.1 --tests   # + the emulator subset (EMULATOR_TESTS)
#
# Environment: PYTHON (the interpreter to build the venv with; default: scripts/find_python.sh),
# FP4SIM_WHEEL_EXTRAS (extras to install, default "plot"), KEEP=1 keeps the temporary folder.
# Time on the 2-core CI machine: about 1.5 min for the wheel and the two commands (pip's cache
# warm), about 30 s more for the notebooks (nbclient, ipykernel, jupytext, matplotlib and pytest
# are installed next to the wheel for them), plus the subset's time with --tests (see
# EMULATOR_TESTS).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)

# The emulator subset: the element and block codecs, library presets, layouts, packing, the
# block-scaled matmul, the golden vectors, the public API and the argument checks, and the
# attention recipes, converters, normalizers, exp2 models, causal classes, metrics, the tiled
# forward and the custom_vjp training path (NumPy == jax.jit bit identity is what a jax version
# can break). Slow and GPU tests excluded. Measured with jax 0.12.0.1 on the loaded 2-core machine:
# 577 tests in about 5.5 minutes (measured on Python 3.13; 510 tests took 4 min on 3.12 before
# main added tests), 8 minutes with the wheel and venv.
EMULATOR_TESTS=(
  tests/formats tests/test_golden.py tests/test_api.py tests/test_checks.py
  tests/attention/test_recipe.py tests/attention/test_converters.py tests/attention/test_normalization.py
  tests/attention/test_exp2.py tests/attention/test_causal.py tests/attention/test_metrics.py
  tests/attention/test_forward.py tests/attention/test_autodiff.py
)

jax_version=""
run_tests=0
while [ $# -gt 0 ]; do
  case "$1" in
    --jax) jax_version="$2"; shift 2 ;;
    --tests) run_tests=1; shift ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "test_wheel.sh: unknown argument $1 (allowed: --jax VERSION, --tests)" >&2; exit 2 ;;
  esac
done

py=${PYTHON:-$(bash "$repo/scripts/find_python.sh")}
work=$(mktemp -d "${TMPDIR:-/tmp}/fp4sim-wheel.XXXXXX")
if [ "${KEEP:-0}" != 1 ]; then trap 'rm -rf "$work"' EXIT; fi
echo "test_wheel: building the wheel in $work"
# build from a copy of the working tree (tracked and untracked, not ignored, files), so that the
# build leaves nothing (build/, *.egg-info) in the checkout
mkdir -p "$work/src"
if git -C "$repo" rev-parse --git-dir >/dev/null 2>&1; then
  (cd "$repo" && git ls-files -co --exclude-standard -z | while IFS= read -r -d '' f; do
     [ -e "$f" ] && printf '%s\0' "$f"; done | tar --null -T - -cf -) | tar -C "$work/src" -xf -
else
  tar -C "$repo" --exclude=.venv --exclude=build --exclude='*.egg-info' -cf - . | tar -C "$work/src" -xf -
fi
"$py" -m pip wheel -q --no-deps -w "$work/dist" "$work/src"
wheel=$(ls "$work"/dist/fp4sim-*.whl)

# what a wheel must carry: the golden vectors, the license, the type marker
"$py" - "$wheel" <<'EOF'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
need = ["fp4sim/py.typed", "fp4sim/golden/data/manifest.json", "fp4sim/golden/data/FORMAT.md"]
missing = [n for n in need if n not in names]
if not any(n.endswith("licenses/LICENSE") or n.endswith("/LICENSE") for n in names):
    missing.append("LICENSE")
if not any(n.startswith("fp4sim/golden/data/") and n.endswith(".npz") for n in names):
    missing.append("fp4sim/golden/data/*.npz")
if missing:
    sys.exit(f"test_wheel: the wheel lacks {missing}")
print(f"test_wheel: {sys.argv[1].rsplit('/', 1)[-1]}: {len(names)} files, golden data, LICENSE, py.typed")
EOF

"$py" -m venv "$work/venv"
vpy="$work/venv/bin/python"
"$vpy" -m pip install -q --upgrade pip >/dev/null
extras=${FP4SIM_WHEEL_EXTRAS-plot}
spec="$wheel"
[ -n "$extras" ] && spec="fp4sim[$extras] @ file://$wheel"
pins=()
[ -n "$jax_version" ] && pins=("jax==$jax_version" "jaxlib==$jax_version")
# the notebooks' runner (tests/test_notebooks.py) and what the notebooks import
pins+=("pytest>=8" "nbclient>=0.10" "nbformat>=5.10" "ipykernel>=6.29" "jupytext>=1.16" "matplotlib>=3.8")
[ "$run_tests" = 1 ] && pins+=("hypothesis>=6.100")
"$vpy" -m pip install -q "$spec" "${pins[@]}"

cd "$work"  # outside the repository: only the installed wheel is importable
"$vpy" - "$repo" <<'EOF'
import sys, fp4sim, jax, ml_dtypes, numpy
if fp4sim.__file__.startswith(sys.argv[1]):
    sys.exit(f"test_wheel: fp4sim imported from the repository ({fp4sim.__file__})")
print(f"test_wheel: fp4sim {fp4sim.__version__} from {fp4sim.__file__}; jax {jax.__version__}, "
      f"ml_dtypes {ml_dtypes.__version__}, numpy {numpy.__version__}, Python {sys.version.split()[0]}")
EOF
"$vpy" -m fp4sim --version
"$vpy" -m fp4sim golden check --no-progress
"$vpy" -m fp4sim reproduce --quick --no-progress --out "$work/report" >/dev/null
test -s "$work/report/report.md" && test -s "$work/report/results.json"
echo "test_wheel: reproduce --quick wrote $(wc -l < "$work/report/report.md") lines of report.md"
# commands write into the working directory, never into the installed package
site=$("$vpy" -c 'import fp4sim, pathlib; print(pathlib.Path(fp4sim.__file__).parent)')
before=$(find "$site" -not -path '*__pycache__*' | sort | md5sum)
if "$vpy" -c 'import matplotlib' 2>/dev/null; then
  "$vpy" -m fp4sim figures --quick --no-progress --only e2m1_grid >/dev/null
  test -s "$work/figures/e2m1_grid.png"
fi
"$vpy" -m fp4sim golden write --no-progress --case formats.e2m1.all_codes >/dev/null
test -s "$work/golden/manifest.json"

# the notebooks, executed as notebooks (jupytext + nbclient) in a kernel of "$vpy" that imports
# the installed wheel (the test checks the kernel's fp4sim.__file__); the test files from the
# checkout (see --tests below for why pytest's console script keeps the checkout off sys.path)
echo "test_wheel: the notebooks, executed as notebooks against the installed wheel"
(cd "$repo" && "$work/venv/bin/pytest" -q -p no:cacheprovider -m "not gpu" tests/test_notebooks.py)
[ "$(find "$site" -not -path '*__pycache__*' | sort | md5sum)" = "$before" ] || {
  echo "test_wheel: a command or a notebook wrote into $site" >&2; exit 1; }
echo "test_wheel: figures, golden write and the notebooks wrote into the working directory only"

if [ "$run_tests" = 1 ]; then
  # the tests from the checkout, the library from the wheel: pytest's console script does not
  # put the working directory on sys.path, and rootdir-relative test paths import by file
  cd "$repo"
  echo "test_wheel: the emulator subset against the installed wheel"
  "$work/venv/bin/pytest" -q -p no:cacheprovider -m "not slow and not gpu" "${EMULATOR_TESTS[@]}"
fi
echo "test_wheel: OK"

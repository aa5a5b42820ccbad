#!/usr/bin/env bash
# Print the path of a Python 3.12 interpreter: $PYTHON if set, else python3.12 on PATH,
# else the newest 3.12.x that pyenv knows. Exit 1 with a clear message if there is none.
set -euo pipefail
is312() { "$1" -c 'import sys; raise SystemExit(sys.version_info[:2] != (3, 12))' 2>/dev/null; }
if [ -n "${PYTHON:-}" ]; then
  is312 "$PYTHON" && { echo "$PYTHON"; exit 0; }
  echo "PYTHON=$PYTHON is not a Python 3.12 interpreter" >&2; exit 1
fi
for cand in python3.12 python3 python; do
  p=$(command -v "$cand" 2>/dev/null) || continue
  is312 "$p" && { echo "$p"; exit 0; }
done
root=$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")
for p in $(ls -d "$root"/versions/3.12*/bin/python3.12 2>/dev/null | sort -V -r); do
  is312 "$p" && { echo "$p"; exit 0; }
done
echo "fp4sim needs Python 3.12 (jax 0.11.2 requires >= 3.12); none found on PATH or in pyenv ($root)." >&2
echo "Install one (e.g. 'pyenv install 3.12') or run with PYTHON=/path/to/python3.12." >&2
exit 1

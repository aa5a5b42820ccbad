# fp4sim: every target bootstraps its own virtual environment from this repo's files, with the
# GPU kernels' tested configuration (the `gpu` extra: jax 0.11.2); CI also runs the emulator
# subset against jax 0.12.0.1 from the built wheel (scripts/test_wheel.sh, called by .ci/run).
# Finds a Python 3.12 on PATH, else through pyenv; override with PYTHON=/path/to/python3.12.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.fp4sim-installed

.PHONY: demo test venv bench clean

$(STAMP): pyproject.toml scripts/find_python.sh
	@set -e; py=$$(PYTHON="$(PYTHON)" bash scripts/find_python.sh); \
	echo "fp4sim: building $(VENV) with $$py"; \
	"$$py" -m venv $(VENV); \
	$(PY) -m pip install -q --upgrade pip >/dev/null; \
	$(PY) -m pip install -q -e ".[dev,gpu]"; \
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) -m fp4sim reproduce $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q $(ARGS)

bench: $(STAMP)
	$(PY) -m fp4sim bench $(or $(ARGS),formats)

clean:
	rm -rf $(VENV)

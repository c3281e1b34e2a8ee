# npumoe-lab: `make demo` and `make test` set everything up from this repository's own files.
PY      ?= python3.11
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed-$(shell cat requirements.lock pyproject.toml 2>/dev/null | sha256sum | cut -c1-16)
export NPUMOE_THREADS ?= 2

.PHONY: setup test test-fast test-slow demo bench bench-rounds cpu-loop lock clean-venv notebooks

setup: $(STAMP)

$(VENV)/bin/python:
	@command -v $(PY) >/dev/null 2>&1 || { echo "need Python 3.11 ($(PY)) on PATH"; exit 1; }
	$(PY) -m venv $(VENV)

# Install only when requirements.lock or pyproject.toml changed since the last install.
$(STAMP): $(VENV)/bin/python requirements.lock pyproject.toml
	$(BIN)/pip install --quiet --disable-pip-version-check torch==2.13.0
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements.lock
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	rm -f $(VENV)/.installed-*; touch $(STAMP)

# the fast lane (unit tests, under a minute) first, then the slow one (notebooks, browser, sweeps, whole models)
test: test-fast test-slow

test-fast: setup
	NPUMOE_NO_PROGRESS=1 $(BIN)/python -m pytest -q -m "not slow" $(PYTEST_ARGS)

test-slow: setup
	NPUMOE_NO_PROGRESS=1 $(BIN)/python -m pytest -q -m "slow" $(PYTEST_ARGS)

demo: setup
	$(BIN)/npumoe-lab demo --out results/demo

bench: setup
	$(BIN)/python bench/moe_layer.py $(BENCH_ARGS)
	$(BIN)/python bench/sim_grid.py --draws 200
	$(BIN)/python bench/sim_scaling.py
	$(BIN)/python bench/explorer_update.py --browser
	$(BIN)/python bench/accuracy_curve.py --slice 16 $(ACCURACY_ARGS)

# the targets over ROUNDS fresh processes (median, range, rounds meeting each): ~2.5 min a round quiet
ROUNDS ?= 5
bench-rounds: setup
	$(BIN)/python bench/rounds.py --rounds $(ROUNDS) $(ROUNDS_ARGS)

# measure -> fit-device -> held-out runs DRAWN from a declared grid -> validate-device --runs (docs/CPU_LOOP.md);
# sized for ~8 min on 2 quiet cores. Default: the development draw; an acceptance: LOOP_ARGS="--draw SEED" with a
# seed registered in docs/CPU_LOOP.md before the run. Run it on a QUIET host: busy rows are flagged and excluded.
cpu-loop: setup
	$(BIN)/python bench/cpu_loop.py --out results/cpu-loop --threads $(NPUMOE_THREADS) $(LOOP_ARGS)

notebooks: setup
	$(BIN)/jupytext --sync notebooks/*.py

# Re-resolve the full pin set from requirements.in (needs the package registries).
lock: SHELL:=/bin/bash
lock:
	rm -rf /tmp/npumoe-lock && $(PY) -m venv /tmp/npumoe-lock
	/tmp/npumoe-lock/bin/pip install --quiet torch==2.13.0
	/tmp/npumoe-lock/bin/pip install --quiet -r requirements.in -c <(echo torch==2.13.0)
	/tmp/npumoe-lock/bin/pip freeze --exclude-editable | grep -v '^npumoe' > requirements.lock

clean-venv:
	rm -rf $(VENV)

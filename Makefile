# The front door. Targets set up .venv themselves; variables map onto Hydra overrides:
#   make train MODEL=llama-7b STRATEGY=zero3 PRECISION=bf16 NODES=2 GPUS=8 ARGS="train.lr=1e-5"
PYTHON ?= python3
VENV ?= .venv
# The exact tested set (the highest versions pyproject.toml's ranges allow that were tested);
# `make test-lowest` builds .venv-lowest from constraints-lowest.txt instead.
CONSTRAINTS ?= constraints.txt
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

OVERRIDES := $(if $(MODEL),model=$(MODEL)) $(if $(DATASET),dataset=$(DATASET)) \
	$(if $(STRATEGY),strategy=$(STRATEGY)) $(if $(PRECISION),precision=$(PRECISION)) \
	$(if $(CLUSTER),cluster=$(CLUSTER)) $(if $(NODES),cluster.nodes=$(NODES)) \
	$(if $(GPUS),cluster.gpus_per_node=$(GPUS)) $(if $(PEFT),peft=$(PEFT)) \
	$(if $(OBJECTIVE),objective=$(OBJECTIVE)) $(ARGS)


.PHONY: venv ops train submit plan estimate ds-configs data test test-full test-fast test-lowest \
	lint bench test-gpu clean

venv: $(STAMP)

# torch first, pinned: the CPU build on local disk; a bare `torch` requirement would pull CUDA.
# Then the project within the constraints file's exact versions (pyproject.toml holds ranges).
$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -c $(CONSTRAINTS) -e '.[dev,qlora,eval]'
	touch $(STAMP)

# DeepSpeed's CPU ops, built once into $(VENV)/torch_extensions (launcher/engines/deepspeed/ops.py):
# the suite's ZeRO runs and optimizer tests load them; a run that needs one and finds it
# missing builds it there itself (about a minute each on 2 cores).
OPS := $(VENV)/.ops-built
ops: $(OPS)
$(OPS): $(STAMP)
	$(BIN)/python -m launcher.engines.deepspeed.ops
	touch $(OPS)

train: venv
	$(BIN)/ftl train $(OVERRIDES)

submit: venv
	$(BIN)/ftl submit $(OVERRIDES)

plan: venv
	$(BIN)/ftl plan $(OVERRIDES)

estimate: venv
	$(BIN)/ftl estimate $(OVERRIDES)

ds-configs: venv
	$(BIN)/python -m launcher.engines.deepspeed.ds_config --write-all ds_configs

data: venv
	$(BIN)/python scripts/make_data.py

# What CI runs (.ci/run): ruff, the layer contract (pyproject.toml [tool.importlinter]),
# every behaviour once, in about 20 minutes on 2 cores; the 30 slowest tests and every
# training run's wall time are printed at the end.
test: venv ops
	$(BIN)/ruff check launcher tests scripts bench
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m pytest -q --timeout=1800 --durations=30

# Everything `make test` runs plus the long versions (tests marked `full`): chaos x20, the
# whole memory and world-size matrices, every launcher x strategy pair; then `make
# test-lowest`. Not in CI.
test-full: venv ops
	$(BIN)/ruff check launcher tests scripts bench
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m pytest -q --timeout=3600 --durations=30 -m 'full or not full'
	$(MAKE) test-lowest

# The lower bounds of pyproject.toml's ranges, proven: a second environment (.venv-lowest,
# constraints-lowest.txt: the lowest supported transformers, accelerate, deepspeed, datasets,
# peft and trl; torch 2.13.0, the CPU build this machine has) runs the estimate and
# validation tests, TRL packing, one ddp, ZeRO-3, FSDP and LoRA training run and ftl eval
# (lm-eval's offline task loading, the LoRA run's adapter and merged model). Not in CI.
LOWEST_SLICE := tests/unit/test_estimate.py tests/unit/test_validate.py tests/unit/test_packing.py \
	'tests/integration/test_train_strategies.py::test_strategy_trains_sharded_and_saves_a_loadable_model[ddp-torchrun-fp32]' \
	'tests/integration/test_train_strategies.py::test_strategy_trains_sharded_and_saves_a_loadable_model[zero3-torchrun-fp32]' \
	'tests/integration/test_train_strategies.py::test_strategy_trains_sharded_and_saves_a_loadable_model[fsdp-torchrun-fp32]' \
	'tests/integration/test_train_peft.py::test_lora_trains_adapters_and_saves_a_merged_model[ddp]' \
	tests/unit/test_eval_tasks.py tests/integration/test_eval.py
test-lowest:
	$(MAKE) VENV=.venv-lowest CONSTRAINTS=constraints-lowest.txt ops
	.venv-lowest/bin/python -m pytest -q --timeout=1800 --durations=10 $(LOWEST_SLICE)

test-fast: venv
	$(BIN)/python -m pytest -q -m 'not slow and not full'

# Benchmarks print a table and write bench/results/<name>.json (ratios measured side by side).
# About 30 minutes on 2 cores; the GPU one is separate: `make test-gpu` on a GPU machine.
bench: venv
	$(BIN)/python bench/plan_latency.py
	$(BIN)/python bench/preprocess.py
	$(BIN)/python bench/train_overhead.py
	$(BIN)/python bench/strategy_table.py

# The GPU check (issue 34): with an NVIDIA GPU, bench/gpu.sh installs .venv-gpu and runs the
# matrix of short ftl train rows (strategies, fp16, QLoRA, attention kernels, Liger, compile,
# MoE) in under 8 minutes into bench/results/gpu_matrix.json; without one it prints the plan
# (rows, overrides, budget; each row `ftl plan`ned here when .venv exists), installs nothing
# and exits 0.
test-gpu:
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		bash bench/gpu.sh; \
	else \
		echo "make test-gpu: no NVIDIA GPU here (nvidia-smi): the plan only"; \
		bash bench/gpu.sh --plan; \
	fi

lint: venv
	$(BIN)/ruff check launcher tests scripts bench
	$(BIN)/lint-imports --no-cache

clean:
	rm -rf $(VENV) .venv-lowest outputs

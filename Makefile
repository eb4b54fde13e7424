# attnlab: `make help` lists every target. The first use of any target builds .venv (Python 3.11,
# torch CPU build pinned by TORCH, the package in editable mode with its dev extras).
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# Committed run records (results.json, config, small artifacts) behind the committed tables in results/.
PUBLISHED ?= results/runs
# The trivial baselines of those runs (make baselines); a reproduce into other folders names its own.
BASELINES ?= results/baselines
# Files whose generated blocks `make tables` fills: the tables of README.md and docs/*.md (each block lives on
# its subject's page), each paper's "What held" claims in experiments/<paper>/README.md.
empty :=
comma := ,
TABLE_PAGES := [$(subst $(empty) $(empty),$(comma),README.md $(sort $(wildcard docs/*.md experiments/*/README.md)))]
DEMO_DIR := runs/demo/$(shell date +%Y-%m-%d_%H-%M-%S)
# Our machines keep real datasets in ../shared/data; elsewhere set ATTNLAB_DATA_ROOT (or paths.data_root).
ifneq ($(wildcard ../shared/data),)
export ATTNLAB_DATA_ROOT ?= $(abspath ../shared/data)
endif

.DEFAULT_GOAL := help
.PHONY: help install demo test test-slow test-gpu test-all lint format golden bench baselines tables check-tables migrate-records curves publish-runs rerun clean gpu-check

help: ## List every target with a one-line description
	@awk -v color=$$([ -t 1 ] && echo 1) 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_%-]+:.*## / {name[++n] = $$1; \
	  text[n] = $$2; if (length($$1) > width) width = length($$1)} END {on = color ? "\033[36m" : ""; \
	  off = color ? "\033[0m" : ""; for (i = 1; i <= n; i++) printf "  %s%-" width "s%s  %s\n", on, name[i], off, text[i]}' \
	  $(MAKEFILE_LIST)

$(STAMP): pyproject.toml
	@test -n "$(PYTHON)" || { echo "error: python3.11 not found; install Python 3.11 or set PYTHON=" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first and pinned, so nothing below can pull a multi-GB CUDA build on a CPU machine
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	@touch $(STAMP)

install: $(STAMP) ## Create .venv and install attnlab with its dev extras

demo: $(STAMP) ## Train a vanilla Transformer on the copy task (CPU, a few minutes) and print its table
	$(BIN)/attnlab-train experiment=demo/copy logger=wandb hydra.run.dir=$(DEMO_DIR)
	@echo
	@echo "The demo: a small Transformer learns to copy digit strings; test_train_len/ is its accuracy at the training lengths, test/ at up to 10x them (as UT Table 4's columns), test_ood/ only beyond the training lengths (the length generalisation itself)."
	$(BIN)/attnlab-table table=summary runs=$(DEMO_DIR)
	@echo
	@# the training loss (logged every 25 updates) shows the learning; the demo validates only twice
	$(BIN)/python -m attnlab.results.curves $(DEMO_DIR) --metric train/loss --out $(DEMO_DIR)/curves/train_loss
	@echo "run folder:        $(DEMO_DIR)"
	@echo "run record:        $(DEMO_DIR)/results.json"
	@echo "CSV metrics:       $(DEMO_DIR)/csv/metrics.csv"
	@echo "wandb offline run: $$(ls -d $(DEMO_DIR)/wandb/offline-run-* 2>/dev/null | head -n1)  (upload: wandb sync <that folder>)"

# The default tier runs in TEST_JOBS pytest-xdist worker processes (auto = one per CPU core; TEST_JOBS=0 runs it
# in this process, e.g. for pdb). The slow tier stays in one process: its DDP and kill-and-resume tests start
# processes of their own.
TEST_JOBS ?= auto
test: $(STAMP) ## Run the default test tier (fast, offline; what CI runs) over TEST_JOBS workers; prints the 15 slowest tests
	$(BIN)/python -m pytest -n $(TEST_JOBS) --durations=15 $(PYTEST_ARGS)

test-slow: $(STAMP) ## Run the slow tier: real training runs, DDP on CPU, notebooks
	$(BIN)/python -m pytest -m slow $(PYTEST_ARGS)

test-gpu: $(STAMP) ## Run the GPU tier (needs a CUDA device)
	$(BIN)/python -m pytest -m gpu $(PYTEST_ARGS)

test-all: $(STAMP) ## Run every tier that this machine can run
	$(BIN)/python -m pytest -m "not gpu or gpu" $(PYTEST_ARGS)

lint: $(STAMP) ## Lint with ruff
	$(BIN)/ruff check src tests

format: $(STAMP) ## Format and fix what ruff can
	$(BIN)/ruff check --fix src tests
	$(BIN)/ruff format src tests

golden: $(STAMP) ## Rewrite the resolved-config snapshots in tests/golden (review the diff!)
	UPDATE_GOLDEN=1 $(BIN)/python -m pytest tests/test_config.py -k golden -q

bench: $(STAMP) ## Run the performance benchmarks (ratios vs same-process baselines; results/bench/); BENCH_ARGS=--quick
	$(BIN)/python benchmarks/run_all.py $(BENCH_ARGS)

baselines: $(STAMP) ## Compute the trivial baseline of every published run's task from the local data (results/baselines; before make tables)
	$(BIN)/python -m attnlab.cli.baselines --runs $(PUBLISHED) --out $(BASELINES) --data-root $(ATTNLAB_DATA_ROOT)

tables: $(STAMP) ## Rebuild every results table and results/CLAIMS.md from the committed run records in results/runs (no training)
	$(BIN)/attnlab-table table=all runs=$(PUBLISHED) out=results/ readme=$(TABLE_PAGES)

check-tables: $(STAMP) ## Fail unless every committed table, results/CLAIMS.md and the documented tables (README.md, docs/) are what results/ gives, and every published record's hash is what its command composes today (CI runs this)
	$(BIN)/attnlab-table table=all runs=$(PUBLISHED) out=results/ readme=$(TABLE_PAGES) check=true
	$(BIN)/python benchmarks/summary.py --check
	$(BIN)/python -m attnlab.cli.record_hashes check --runs $(PUBLISHED)

migrate-records: $(STAMP) ## After a config schema change: rewrite the hash of each published record whose command still composes the same values (proved key by key); lists the rest to retrain
	$(BIN)/python -m attnlab.cli.record_hashes migrate --runs $(PUBLISHED) --baselines $(BASELINES)

publish-runs: $(STAMP) ## Copy the records of finished preset runs (RUNS=runs) into results/runs for committing
	$(BIN)/python -m attnlab.results.publish $(RUNS) $(PUBLISHED)

# A make variable as one shell word: single-quoted, its own single quotes closed, escaped and reopened (a
# RECORD path with a space, a quote or a $ reaches the command as it was given).
shell_quote = '$(subst ','\'',$(1))'

rerun: $(STAMP) ## Rerun one published run (RECORD=results/runs/<experiment>/s<seed>-<hash>) with its recorded command; compare with its cell's spread (RERUN_ARGS: your own overrides, e.g. ones the record is not trusted with)
	@test -n $(call shell_quote,$(RECORD)) || { echo "error: give the record to rerun, e.g. make rerun RECORD=results/runs/ut/table4/transformer_copy/s1-<hash>" >&2; exit 2; }
	$(BIN)/python -m attnlab.results.rerun --published $(call shell_quote,$(PUBLISHED)) -- $(call shell_quote,$(RECORD)) $(RERUN_ARGS)

METRIC ?= val/loss
BY ?=
curves: $(STAMP) ## Plot METRIC (default val/loss) against step for the runs under RUNS, one curve per value of BY (config keys), mean and band over seeds -> curves/<metric>.{png,svg}
	$(BIN)/python -m attnlab.results.curves $(RUNS) --metric $(METRIC) --by "$(BY)"

clean: ## Remove the virtual environment and caches (runs/ and results/ stay)
	rm -rf $(VENV) .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

# Paper-table targets (make reproduce-<paper>-<table>)
include make/reproduce.mk

gpu-check: $(STAMP) ## On a machine with one CUDA GPU: the gpu tests, BigBird kernels, paper-size and laptop runs -> results/bench/gpu/ (GPU_CHECK_ARGS=--dry-run on CPU)
	$(BIN)/python benchmarks/gpu_check.py $(GPU_CHECK_ARGS)

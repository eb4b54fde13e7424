# Paper tables: `make reproduce-<paper>-<table>` trains every row of one paper table as ONE Hydra multirun
# over rows x seeds, then builds the table(s) from the run records. Included from the Makefile.
#
#   make reproduce-ut-table4                                   # laptop scale, seeds 1,2,3, on this CPU
#   make reproduce-lra-table1 SEEDS=1 ARGS="trainer.max_steps=200"
#   make reproduce-ut-table4 SCALE=paper HARDWARE=gpu8 LAUNCHER=submitit_slurm_attnlab   # on SLURM
#
# Runs train into RUNS (runs/ by default); the records of the table's runs (results.json, resolved config,
# ponder/attention artifacts: kilobytes, no checkpoints) are then published into results/runs/<experiment>/,
# and the tables are built from there, so committing results/ commits a table together with what it was
# built from (`make check-tables`, run by CI, holds them equal).
#
# Rows whose completed run record already exists for the same config hash, in RUNS or in the published
# records (PUBLISHED, results/runs), are skipped (ATTNLAB_SKIP_EXISTING=1, see attnlab.results.lookup); delete a record, or pass a changed override, to
# train it again. Rows are the presets under src/attnlab/conf/experiment/<paper>/<table>/, listed by make
# itself: Hydra 1.3's glob() sweep only sees the options directly in a group's folder, never nested ones
# (`experiment=glob(ut/table4/*)` expands to nothing), so the rows are passed as an explicit choice list.
# A table whose columns come from different tasks has one spec per task (experiments/<paper>/<table>_<task>.yaml);
# every spec named <table>.yaml or <table>_*.yaml is built.

SEEDS ?= 1,2,3
# ROWS: make patterns (% = any text) over the row names, to run part of a table, e.g. ROWS=%gl_en for the one
# QKNorm pair with local data; the table is built from whatever records exist (missing rows stay "missing").
ROWS ?= %
SCALE ?= cpu
HARDWARE ?= cpu
ARGS ?=
# On CPU hardware the rows x seeds run JOBS at a time (Hydra's joblib launcher), each with CORES/JOBS torch
# threads: it fills the machine, though on 2 cores it gains little over one job at 2 threads (1.13x measured
# on six UT Table 4 runs: docs/performance.md, results/bench/sweep.md).
# LAUNCHER=basic runs them one after another; LAUNCHER=submitit_slurm_attnlab sends them to SLURM.
CORES := $(shell nproc 2>/dev/null || echo 1)
JOBS ?= $(CORES)
LAUNCHER ?= $(if $(filter cpu%,$(HARDWARE)),joblib_attnlab)
repro_threads = $(shell echo $$(( $(CORES) / $(JOBS) > 0 ? $(CORES) / $(JOBS) : 1 )))
repro_launcher = $(if $(LAUNCHER),hydra/launcher=$(LAUNCHER)) \
	$(if $(filter joblib_attnlab,$(LAUNCHER)),hydra.launcher.n_jobs=$(JOBS) hardware.torch_threads=$(repro_threads))
RUNS ?= $(or $(ATTNLAB_RUNS_DIR),runs)
TABLES_OUT ?= results/
EXPERIMENT_CONF := src/attnlab/conf/experiment
TABLE_SPECS := experiments

repro_comma := ,
repro_empty :=
repro_space := $(repro_empty) $(repro_empty)
# $(call repro_rows,ut/table4) -> ut/table4/transformer_addition,ut/table4/transformer_copy,...
# An optional second argument is a name prefix that ROWS does not see: $(call repro_rows,synthesizer/t5,pretrain_)
# with ROWS=transformer -> synthesizer/t5/pretrain_transformer.
repro_rows = $(subst $(repro_space),$(repro_comma),$(filter $(addprefix $(1)/$(2),$(ROWS)),$(sort $(patsubst $(EXPERIMENT_CONF)/%.yaml,%,$(wildcard $(EXPERIMENT_CONF)/$(1)/$(2)*.yaml)))))
# $(call repro_specs,ut/table4) -> ut/table4_addition ut/table4_copy ut/table4_reverse
repro_specs = $(sort $(patsubst $(TABLE_SPECS)/%.yaml,%,$(wildcard $(TABLE_SPECS)/$(1).yaml $(TABLE_SPECS)/$(1)_*.yaml)))

# $(call reproduce,<paper>/<table>): train the rows (skipping existing records), then build every spec.
define reproduce
	@test -n "$(call repro_rows,$(1))" || { echo "error: no presets under $(EXPERIMENT_CONF)/$(1) match ROWS=$(ROWS) (make patterns over the file names, e.g. ROWS=%gl_en)" >&2; exit 2; }
	@test -n "$(call repro_specs,$(1))" || { echo "error: no table spec $(TABLE_SPECS)/$(1)[_*].yaml" >&2; exit 2; }
	ATTNLAB_SKIP_EXISTING=1 ATTNLAB_PUBLISHED_RUNS=$(PUBLISHED) $(BIN)/attnlab-train -m experiment=$(call repro_rows,$(1)) seed=$(SEEDS) \
		scale=$(SCALE) hardware=$(HARDWARE) paths.runs_dir=$(RUNS) $(repro_launcher) $(ARGS)
	$(BIN)/python -m attnlab.results.publish $(RUNS) $(PUBLISHED) --only $(1)
	$(BIN)/python -m attnlab.cli.baselines --runs $(PUBLISHED) --out $(BASELINES) --data-root $(ATTNLAB_DATA_ROOT) $(foreach spec,$(call repro_specs,$(1)),--table $(spec))
	$(foreach spec,$(call repro_specs,$(1)),$(BIN)/attnlab-table table=$(spec) runs=$(PUBLISHED) out=$(TABLES_OUT) baselines=$(BASELINES) print=true &&) true
endef

.PHONY: reproduce-ut-table4 reproduce-ut-table7 reproduce-lra-table1 reproduce-qknorm-table1 \
	reproduce-synthesizer-table2 reproduce-synthesizer-table6 reproduce-synthesizer-table7 reproduce-list gpu-estimates \
	reproduce-synthesizer-table3 reproduce-synthesizer-table4 reproduce-synthesizer-table5 \
	reproduce-ut-table1 reproduce-ut-table3 reproduce-ut-table5 reproduce-ut-table6 reproduce-ut-fixed_table5 reproduce-ut-fixed_table4 reproduce-ut-fixed_table6 reproduce-ut-fixed2_table6 reproduce-synthesizer-fixed_table2 reproduce-qknorm-fixed_table1 \
	reproduce-bigbird-table1 reproduce-bigbird-table10

reproduce-list: ## List every reproduce target: rows, seeds, table specs, estimated wall time (SCALE=gpu: GPU-hours)
	@$(BIN)/python -m attnlab.cli.reproduce_list --seeds $(SEEDS) --jobs $(JOBS) --conf $(EXPERIMENT_CONF) --experiments $(TABLE_SPECS) --published $(PUBLISHED) --scale $(if $(filter gpu,$(SCALE)),gpu,cpu) --hardware $(HARDWARE) --args "$(ARGS)" --t5-pretrain-dir $(T5_PRETRAIN_DIR)

gpu-estimates: $(STAMP) ## Estimate each scale=gpu preset's GPU time from FLOPs and its data (results/gpu/estimates.json)
	$(BIN)/python -m attnlab.cli.gpu_estimate --out results/gpu/estimates.json --data-root $(ATTNLAB_DATA_ROOT)

# Every reproduce target, for the hint below: one per preset folder <paper>/<table>, and the T5 path's two.
REPRO_TARGETS := $(sort $(foreach d,$(filter-out synthesizer/t5 demo/%,$(patsubst $(EXPERIMENT_CONF)/%/,%,\
	$(wildcard $(EXPERIMENT_CONF)/*/*/))),reproduce-$(subst /,-,$(d)))) \
	reproduce-synthesizer-table4-t5 reproduce-synthesizer-table5-t5

# `make reproduce-table2` names no paper: print the targets it could mean instead of make's "No rule".
reproduce-table%:
	@matches="$(filter %-table$*,$(REPRO_TARGETS)) $(filter %-table$*-t5,$(REPRO_TARGETS))"; \
	if [ -n "$$(echo $$matches)" ]; then \
		echo "make reproduce-table$*: which paper? Matching targets:" >&2; \
		for m in $$matches; do echo "  make $$m" >&2; done; \
	else echo "make reproduce-table$*: no paper has a table $* here; see make reproduce-list" >&2; fi; exit 2

reproduce-ut-table4: $(STAMP) ## UT Table 4: copy/reverse/addition, Transformer vs UT (SEEDS= SCALE= HARDWARE= LAUNCHER= ARGS=)
	$(call reproduce,ut/table4)

reproduce-ut-table7: $(STAMP) ## UT Table 7: WMT14 En-De BLEU, Transformer base vs UT small/base
	$(call reproduce,ut/table7)

reproduce-lra-table1: $(STAMP) ## LRA Table 1, ListOps column: Transformer, Synthesizer, BigBird
	$(call reproduce,lra/table1)

reproduce-qknorm-table1: $(STAMP) ## QKNorm main table: baseline vs QKNorm on the five low-resource pairs
	$(call reproduce,qknorm/table1)

reproduce-qknorm-fixed_table1: override SEEDS = 21,22,23,24,25,26
reproduce-qknorm-fixed_table1: $(STAMP) ## QKNorm gl-en: pre-registered fixed-n test, non-inferiority and superiority (6 seeds per row, one look)
	$(call reproduce,qknorm/fixed_table1)

reproduce-synthesizer-table2: $(STAMP) ## Synthesizer Table 2: WMT14 En-De/En-Fr BLEU per attention variant
	$(call reproduce,synthesizer/table2)

reproduce-synthesizer-fixed_table2: override SEEDS = 21,22,23,24,25,26,27,28
reproduce-synthesizer-fixed_table2: $(STAMP) ## Synthesizer Table 2 LM: pre-registered D+V and R+V against the Transformer (8 seeds per row, one look)
	$(call reproduce,synthesizer/fixed_table2)

reproduce-synthesizer-table6: $(STAMP) ## Synthesizer Table 6: number of heads 2..32
	$(call reproduce,synthesizer/table6)

reproduce-synthesizer-table7: $(STAMP) ## Synthesizer Table 7: synthesizing functions (linear, conv, bottleneck, GLU)
	$(call reproduce,synthesizer/table7)

reproduce-bigbird-table1: $(STAMP) ## BigBird Table 1: MLM at 512, full vs random vs window vs random + window
	$(call reproduce,bigbird/table1)

reproduce-bigbird-table10: $(STAMP) ## BigBird Table 10: MLM bits per token/char, full at 512 vs BigBird-ITC at 2048/4096
	$(call reproduce,bigbird/table10)

reproduce-synthesizer-table3: $(STAMP) ## Synthesizer Table 3: CNN/DailyMail ROUGE, PersonaChat BLEU/ROUGE/CIDEr per attention
	$(call reproduce,synthesizer/table3)

reproduce-synthesizer-table4: $(STAMP) ## Synthesizer Table 4: GLUE dev per attention (T5-base size, from scratch)
	$(call reproduce,synthesizer/table4)

reproduce-synthesizer-table5: $(STAMP) ## Synthesizer Table 5: SuperGLUE dev per attention (T5-base size, from scratch)
	$(call reproduce,synthesizer/table5)

reproduce-ut-table1: $(STAMP) ## UT Table 1: bAbI joint 10k/1k, Transformer vs UT vs UT+ACT
	$(call reproduce,ut/table1)

reproduce-ut-table3: $(STAMP) ## UT Table 3: LAMBADA LM, Transformer vs UT base (6/8/9 steps, ACT)
	$(call reproduce,ut/table3)

reproduce-ut-table5: $(STAMP) ## UT Table 5: Learning to Execute memorization (copy/double/reverse), Transformer vs UT
	$(call reproduce,ut/table5)

# Pre-registered fixed-n protocols (issue 53): the seeds are part of the spec (its `preregistered.seeds`), so the
# target fixes them; the table is read once, at that n.
reproduce-ut-fixed_table5: override SEEDS = 21,22,23,24,25,26,27,28
reproduce-ut-fixed_table5: $(STAMP) ## UT Table 5 reverse, pre-registered fixed-n replication (8 seeds per row, one look)
	$(call reproduce,ut/fixed_table5)

reproduce-ut-fixed_table4: override SEEDS = 21,22,23,24,25
reproduce-ut-fixed_table4: $(STAMP) ## UT Table 4 copy and reverse decided beyond the training lengths, pre-registered fixed-n (5 seeds per row, one look)
	$(call reproduce,ut/fixed_table4)

reproduce-ut-fixed_table6: override SEEDS = 21,22,23,24,25,26,27,28
reproduce-ut-fixed_table6: $(STAMP) ## UT Table 6 addition at a reduced size (2 digits, nesting 1), pre-registered fixed-n (8 seeds per row, one look)
	$(call reproduce,ut/fixed_table6)

reproduce-ut-fixed2_table6: override SEEDS = 31,32,33,34,35,36,37,38
reproduce-ut-fixed2_table6: $(STAMP) ## UT Table 6 addition at a reduced size and 6000 updates, a second pre-registered fixed-n protocol (8 seeds per row, one look)
	$(call reproduce,ut/fixed2_table6)

reproduce-ut-table6: $(STAMP) ## UT Table 6: Learning to Execute program evaluation (program/control/addition)
	$(call reproduce,ut/table6)

# Synthesizer Tables 4-5, the T5 path (docs/tasks.md, "T5-style path"): per attention row and seed, span-corruption
# pre-training (synthesizer/t5/pretrain_<row>), then the GLUE (Table 4) or SuperGLUE (Table 5) mixture trained
# from those weights (synthesizer/t5/multitask_<benchmark>_<row>, init_from = the pre-training's
# checkpoints/last.ckpt). Pre-training runs go to fixed folders, $(T5_PRETRAIN_DIR)/synthesizer/t5/pretrain_<row>-s<seed>,
# so the second multirun names each job's checkpoint (Hydra resolves ${pretrain_experiment} and ${seed} per job).
# One pre-training per row and seed serves both tables: a finished one is skipped (ATTNLAB_SKIP_EXISTING), an
# interrupted one resumes in its folder. Only RUNS is searched for finished pre-trainings (ATTNLAB_PUBLISHED_RUNS=$(RUNS)):
# the published records carry no checkpoint for the mixture to start from. SEEDS, SCALE, HARDWARE, LAUNCHER and ARGS apply to both steps.
T5_PRETRAIN_DIR ?= $(RUNS)/t5_pretrain
# $(call t5_rows,pretrain) -> synthesizer/t5/pretrain_dense,...,synthesizer/t5/pretrain_transformer; ROWS patterns
# match the row part (ROWS=transformer -> pretrain_transformer and multitask_<benchmark>_transformer).
t5_rows = $(call repro_rows,synthesizer/t5,$(1)_)

# $(call reproduce_t5,<glue|superglue>,<table4|table5>): pre-train, train the mixture from it, build the table.
define reproduce_t5
	@test -n "$(call t5_rows,multitask_$(1))" || { echo "error: no presets $(EXPERIMENT_CONF)/synthesizer/t5/multitask_$(1)_<row>.yaml match ROWS=$(ROWS) (make patterns over <row>, e.g. ROWS='transformer random')" >&2; exit 2; }
	ATTNLAB_SKIP_EXISTING=1 ATTNLAB_PUBLISHED_RUNS=$(RUNS) $(BIN)/attnlab-train -m experiment=$(call t5_rows,pretrain) seed=$(SEEDS) \
		scale=$(SCALE) hardware=$(HARDWARE) paths.runs_dir=$(RUNS) hydra.sweep.dir=$(T5_PRETRAIN_DIR) \
		'hydra.sweep.subdir=$${experiment_name}-s$${seed}' $(repro_launcher) $(ARGS)
	ATTNLAB_SKIP_EXISTING=1 ATTNLAB_PUBLISHED_RUNS=$(PUBLISHED) $(BIN)/attnlab-train -m experiment=$(call t5_rows,multitask_$(1)) seed=$(SEEDS) \
		scale=$(SCALE) hardware=$(HARDWARE) paths.runs_dir=$(RUNS) \
		'init_from=$(T5_PRETRAIN_DIR)/$${pretrain_experiment}-s$${seed}/checkpoints/last.ckpt' \
		$(repro_launcher) $(ARGS)
	$(BIN)/python -m attnlab.results.publish $(RUNS) $(PUBLISHED) --only synthesizer/t5
	$(foreach spec,$(call repro_specs,synthesizer/t5_$(2)),$(BIN)/attnlab-table table=$(spec) runs=$(PUBLISHED) out=$(TABLES_OUT) baselines=$(BASELINES) print=true &&) true
endef

.PHONY: reproduce-synthesizer-table4-t5 reproduce-synthesizer-table5-t5

reproduce-synthesizer-table4-t5: $(STAMP) ## Synthesizer Table 4, T5 path: span-corruption pre-training, then the GLUE mixture from it
	$(call reproduce_t5,glue,table4)

reproduce-synthesizer-table5-t5: $(STAMP) ## Synthesizer Table 5, T5 path: the same pre-training, then the SuperGLUE mixture from it
	$(call reproduce_t5,superglue,table5)

# Mechanism probes (experiments/probes/README.md): generated tasks on which one paper's mechanism decides the
# outcome, 5 seeds by default (SEEDS= overrides), built into results/probes/ and never into a paper table.
PROBE_TARGETS := reproduce-probes-synthesizer reproduce-probes-bigbird reproduce-probes-ut reproduce-probes-qknorm
.PHONY: $(PROBE_TARGETS)
$(PROBE_TARGETS): SEEDS = 1,2,3,4,5

reproduce-probes-synthesizer: $(STAMP) ## Probe: Synthesizer variants on a fixed alignment (reverse) vs content lookup (recall)
	$(call reproduce,probes/synthesizer)

reproduce-probes-bigbird: $(STAMP) ## Probe: BigBird building blocks on associative recall far beyond the window
	$(call reproduce,probes/bigbird)

reproduce-probes-ut: $(STAMP) ## Probe: Transformer, UT and UT + ACT on pointer chasing of 1-3 hops (steps per hop)
	$(call reproduce,probes/ut)

reproduce-probes-qknorm: $(STAMP) ## Probe: a learning-rate sweep (6 rates, 2 decades) of the baseline and QKNorm on a small LM
	$(call reproduce,probes/qknorm)

# The redesigned probes (issue 53), beside the published ones: fresh seeds 21-25 whatever SEEDS= says (the seeds of
# `preregistered` blocks of probes/bigbird2_recall and probes/ut2_depth).
REDESIGNED_PROBE_TARGETS := reproduce-probes-bigbird2 reproduce-probes-ut2
.PHONY: $(REDESIGNED_PROBE_TARGETS)

reproduce-probes-bigbird2: override SEEDS = 21,22,23,24,25
reproduce-probes-bigbird2: $(STAMP) ## Probe, redesigned: BigBird blocks on recall with no fact or query in a global block, 2 and 4 layers
	$(call reproduce,probes/bigbird2)

reproduce-probes-ut2: override SEEDS = 21,22,23,24,25
reproduce-probes-ut2: $(STAMP) ## Probe, redesigned: a 1-layer Transformer, the same layer as a 4-step UT and two UT + ACT rows on 1-3 hops
	$(call reproduce,probes/ut2)

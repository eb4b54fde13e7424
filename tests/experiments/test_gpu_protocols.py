"""The one-GPU protocols (``scale=gpu``) of the paper tables: every spec states one (or why it has none), its presets
carry it, the budgets keep their table's schedule rule, and each table's protocol trains a few steps at tiny width
on this CPU (its data, its task and root gpu blocks; only the width, the steps and the data sizes cut).

The rows' equality at scale=gpu is checked with the other scales in test_rules.py.
"""

from __future__ import annotations

import math

import pytest
import yaml
from omegaconf import OmegaConf, open_dict

from tests.experiments.paper_presets import SPECS, gpu_presets, gpu_tables, preset_yaml, presets
from tests.experiments.test_rules import _config

PAPER_SPECS = sorted(p for p in SPECS.glob("*/*.yaml") if p.parent.name not in ("probes", "demo"))


def _spec(path):
    return yaml.safe_load(path.read_text())


def _spec_experiments(spec: dict) -> list[str]:
    out = []
    for row in spec["rows"]:
        names = (row.get("match") or {}).get("experiment", [])
        out += [names] if isinstance(names, str) else list(names)  # a row may pool several presets
    return out


@pytest.mark.parametrize("path", PAPER_SPECS, ids=[f"{p.parent.name}/{p.stem}" for p in PAPER_SPECS])
def test_every_paper_spec_states_its_gpu_protocol_and_its_presets_carry_it(path):
    spec = _spec(path)
    gpu = spec.get("gpu")
    assert gpu and gpu.get("protocol"), f"{path}: add a gpu block (the one-GPU protocol, or 'None: <why>')"
    rows = _spec_experiments(spec)
    if path.stem.startswith("t5_"):  # the T5 path trains its pre-training presets too
        rows += [e for e in presets("synthesizer/t5") if e.rsplit("/", 1)[1].startswith("pretrain_")]
    with_block = [e for e in rows if "gpu" in (preset_yaml(e).get("at_scale") or {})]
    if str(gpu["protocol"]).startswith("None"):
        assert not with_block, f"{path}: no one-GPU protocol, yet {with_block} carry an at_scale.gpu block"
    else:
        missing = sorted(set(rows) - set(with_block))
        assert not missing, f"{path}: these rows have no root at_scale.gpu block: {missing}"


GPU_PRESETS = gpu_presets()


def test_every_gpu_preset_is_a_row_of_a_spec_with_a_gpu_protocol():
    assert len(GPU_PRESETS) >= 90, "the one-GPU protocols went missing from the presets"
    covered = set()
    for path in PAPER_SPECS:
        spec = _spec(path)
        if not str((spec.get("gpu") or {}).get("protocol", "None")).startswith("None"):
            covered |= set(_spec_experiments(spec))
    covered |= {e for e in presets("synthesizer/t5") if e.rsplit("/", 1)[1].startswith("pretrain_")}
    assert sorted(set(GPU_PRESETS) - covered) == []


# Task keys that cut an evaluation set; a one-GPU protocol scores whole test sets (the paper's size where local).
EVAL_CUTS = ("max_eval_examples", "max_eval_pairs", "max_eval_passages", "max_test_tokens")


@pytest.mark.parametrize("table", gpu_tables())
def test_gpu_budget_keeps_the_warmup_inside_the_run_and_the_test_sets_whole(table):
    for experiment in presets(table):
        if experiment not in GPU_PRESETS:
            continue
        cfg = _config(experiment, "gpu")  # composed and validated as the CLI does
        steps, warmup = int(cfg.trainer.max_steps), int(cfg.optim.warmup_steps)
        assert warmup <= steps // 5, f"{experiment} at scale=gpu: warmup {warmup} of {steps} updates"
        cuts = {key: cfg.task[key] for key in EVAL_CUTS if cfg.task.get(key) is not None}
        assert not cuts, f"{experiment}: scale=gpu cuts its evaluation sets ({cuts})"


# Tables whose one-GPU budget is cut from the paper's and follows T2T's rule: warmup a tenth of the updates, the peak
# rate 2.0 * d^-0.5 * 8000^-0.5 (the peak of the paper's schedule at the row's width).
GPU_RULE_TABLES = ("ut/table1", "ut/table3", "ut/table7", "synthesizer/table2", "synthesizer/table3",
                   "synthesizer/table6", "synthesizer/table7")


@pytest.mark.parametrize("table", GPU_RULE_TABLES)
def test_cut_gpu_budgets_follow_the_one_schedule_rule(table):
    for experiment in presets(table):
        if experiment not in GPU_PRESETS:
            continue
        cfg = _config(experiment, "gpu")
        assert cfg.optim.schedule == "inverse_sqrt"
        assert int(cfg.optim.warmup_steps) == int(cfg.trainer.max_steps) // 10, experiment
        peak = 2.0 * cfg.model.d_model ** -0.5 * 8000 ** -0.5
        assert math.isclose(float(cfg.optim.lr), peak, rel_tol=1e-3), f"{experiment}: lr {cfg.optim.lr} != {peak:.4g}"


def test_a_gpu_protocol_that_keeps_the_paper_preset_is_the_paper_preset():
    """``gpu: {}`` says "the paper-scale preset as it stands": its composed config equals scale=paper's."""
    same = [e for e in GPU_PRESETS if not (preset_yaml(e)["at_scale"]["gpu"] or {})]
    assert same, "expected some tables whose paper preset fits one GPU-hour"
    one_per_table = {e.rsplit("/", 1)[0]: e for e in same}.values()  # a composition costs half a second
    for experiment in one_per_table:
        gpu = OmegaConf.to_container(_config(experiment, "gpu"), resolve=False)
        paper = OmegaConf.to_container(_config(experiment, "paper"), resolve=False)
        gpu.pop("scale"), paper.pop("scale")
        assert gpu == paper, experiment


def _tiny_representative(table: str) -> str:
    """A dense-attention row of the table (the sparse rows need sequences of several blocks)."""
    rows = [e for e in presets(table) if e in GPU_PRESETS]
    dense = [e for e in rows if "bigbird" not in e and "window" not in e and "random_only" not in e]
    return (dense or rows)[0]


TINY_WIDTH = ["model.d_model=16", "model.num_heads=2", "model.d_ff=32", "model.encoder_layers=1",
              "model.decoder_layers=1", "trainer.max_steps=2", "trainer.val_check_interval=2",
              "trainer.limit_val_batches=1", "trainer.enable_progress_bar=false", "batch.sentences_per_update=4",
              "batch.eval_batch_size=4", "hardware=cpu", "logger=csv"]


@pytest.mark.parametrize("table", gpu_tables())
def test_each_gpu_protocol_trains_a_few_steps_at_tiny_width(table, tmp_path, monkeypatch):
    from attnlab.training.run import run
    from tests.conftest import SHARED_DATA, compose, require_shared_data
    from tests.tasks.task_inventory import data_needs, shrink

    monkeypatch.setenv("ATTNLAB_TOKENIZER_CACHE", str(tmp_path / "tokenizers"))
    experiment = _tiny_representative(table)
    overrides = [f"experiment={experiment}", "scale=gpu", f"paths.data_root={SHARED_DATA}", *TINY_WIDTH]
    task = OmegaConf.to_container(_config(experiment, "gpu").task, resolve=False)
    needs = data_needs(task)
    assert needs.kind != "hub", f"{experiment}: a one-GPU protocol must read local data, not {needs.hub}"
    require_shared_data(*needs.files)  # the shared data folder is present in CI, absent in a user's clone
    block = preset_yaml(experiment)["at_scale"]["gpu"] or {}
    if "batch.tokens_per_update" in block:
        overrides.append("batch.tokens_per_update=256")
    if "task.val_fraction" in block:  # bAbI's validation is a fraction of the few training questions left
        overrides.append("task.val_fraction=0.5")
    cfg = compose(overrides, run_dir=tmp_path / "run")
    shrink(cfg.task)
    # what the few examples left need: evaluation streams cut to whole blocks rather than to 4096 tokens (BigBird
    # Table 10), room for the longer pieces of a tiny vocabulary
    with open_dict(cfg):
        if "eval_tokens_multiple" in cfg.task:
            cfg.task.eval_tokens_multiple = int(cfg.task.block_len)
        cfg.model.max_len = None
    record = run(cfg, run_dir=tmp_path / "run", command=f"pytest {experiment} scale=gpu", cli_overrides=overrides)
    assert record["status"] == "completed"
    assert record["scale"] == "gpu"
    assert record["metrics"]["final"], f"{experiment}: no test metric at scale=gpu"



@pytest.mark.parametrize("table", gpu_tables())
def test_committed_gpu_estimates_are_of_the_budgets_the_presets_state(table):
    """A changed step budget without `make gpu-estimates` leaves reproduce-list SCALE=gpu timing an old protocol."""
    import json

    estimates = json.loads((SPECS.parent / "results" / "gpu" / "estimates.json").read_text())["rows"]
    for experiment in presets(table):
        if experiment in GPU_PRESETS:
            cfg = _config(experiment, "gpu")
            assert estimates[experiment]["steps"] == int(cfg.trainer.max_steps), (
                f"{experiment}: results/gpu/estimates.json is stale; run `make gpu-estimates` and commit it")

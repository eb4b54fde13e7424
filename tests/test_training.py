"""End-to-end runs of the training function per task family, the run record and the loggers."""

from __future__ import annotations

import json

import pytest
import torch

from attnlab.results.record import read_record, validate_record
from attnlab.training.build import build_datamodule, build_module, derive_batching
from attnlab.training.run import run
from tests.conftest import TINY, TINY_ALGO, compose

LISTOPS_TINY = ["task=lra/listops", "task.at_scale.cpu.train_size=32", "task.at_scale.cpu.val_size=8",
                "task.at_scale.cpu.test_size=8", "task.at_scale.cpu.min_len=16", "task.at_scale.cpu.max_len=40"]


@pytest.mark.parametrize(
    "family_overrides",
    [
        ["task=algo/copy", *TINY_ALGO],
        ["task=algo/addition", *TINY_ALGO],
        LISTOPS_TINY,
        ["task=lm/wikitext2", "task.at_scale.cpu.block_len=16"],
    ],
    ids=["seq2seq-copy", "seq2seq-addition", "classification-listops", "lm-wikitext2"],
)
def test_fast_dev_run_per_task_family(family_overrides, tmp_path, tiny_wikitext):
    cfg = compose([*TINY, *family_overrides, "debug=fdr", f"paths.data_root={tiny_wikitext}"],
                  run_dir=tmp_path / "run")
    record = run(cfg, run_dir=tmp_path / "run", command="pytest")
    assert record["status"] == "completed"
    assert validate_record(record) == []
    assert record["params"]["total"] > 0
    final = record["metrics"]["final"]
    assert any(k.startswith("test") for k in final), final
    assert record["cost"]["steps"] == 1  # fast_dev_run: exactly one optimizer step


def test_results_json_schema_and_content(tmp_path):
    cfg = compose([*TINY, *TINY_ALGO, "logger=csv"], run_dir=tmp_path)
    run(cfg, run_dir=tmp_path, command="attnlab-train test")
    record = read_record(tmp_path / "results.json")
    assert validate_record(record) == []
    for key in ("config_hash", "git", "seed", "hardware", "metrics", "params", "cost", "wandb_run_id"):
        assert key in record
    assert len(record["config_hash"]) == 64
    assert record["metrics"]["final"]["test/seq_acc"] is not None
    assert "val/loss" in record["metrics"]["best"]
    assert record["cost"]["steps"] == 4
    # this run's CPU time, not the process's since start-up (a launcher worker runs several jobs): a tiny run
    # costs a few CPU seconds per thread of wall time at most, and the threads it ran on are named
    cost = record["cost"]
    assert 0 < cost["cpu_s"] <= cost["wall_s"] * torch.get_num_threads() + 1
    assert cost["torch_threads"] == torch.get_num_threads()
    assert record["cost"]["tokens_per_s"] is None or record["cost"]["tokens_per_s"] > 0
    metrics_csv = (tmp_path / "csv" / "metrics.csv").read_text()
    assert "train/loss" in metrics_csv and "val/loss" in metrics_csv
    assert "model/params/total" in metrics_csv
    # The header (results.record.record_header, shared by every writer) holds what the completed record's own
    # dict literal spelled out before issue 40, and the record has exactly the schema's keys.
    from attnlab.results.record import _NESTED, _TOP

    assert set(record) == set(_TOP) | {"extra"}
    assert all(set(fields) <= set(record[key]) for key, fields in _NESTED.items())
    literal = {"schema_version": 1, "status": "completed", "error": None, "experiment": cfg.get("experiment_name"),
               "row": cfg.get("row"), "task": cfg.task.name,
               "model": {"name": cfg.model.name, "attention": cfg.model.attention.name,
                         "recurrence": cfg.model.recurrence.name},
               "seed": int(cfg.seed), "scale": cfg.scale.name,
               "hardware": {"name": cfg.hardware.name, "accelerator": cfg.hardware.accelerator,
                            "devices": cfg.hardware.devices, "num_nodes": cfg.hardware.num_nodes,
                            "precision": str(cfg.hardware.precision)},
               "run_dir": str(tmp_path.resolve()), "command": "attnlab-train test", "wandb_run_id": None}
    assert {key: record[key] for key in literal} == literal
    assert set(record["versions"]) == {"python", "torch", "lightning", "attnlab"}


def test_wandb_offline_run_folder_is_produced(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg = compose([*TINY, *TINY_ALGO, "logger=wandb"], run_dir=tmp_path)
    record = run(cfg, run_dir=tmp_path, command="pytest")
    offline = list((tmp_path / "wandb").glob("offline-run-*"))
    assert offline, "no wandb offline run folder"
    assert record["wandb_run_id"] and record["wandb_run_id"] in offline[0].name
    assert any(offline[0].glob("*.wandb")), "offline run has no .wandb file to sync"


def test_wandb_failure_never_stops_training(tmp_path, monkeypatch):
    from attnlab.training import wandb_run as wandb_module

    def broken(*args, **kwargs):
        raise RuntimeError("wandb is broken")

    monkeypatch.setattr(wandb_module, "wandb_settings", broken)
    cfg = compose([*TINY, *TINY_ALGO, "logger=wandb"], run_dir=tmp_path)
    record = run(cfg, run_dir=tmp_path, command="pytest")
    assert record["status"] == "completed" and record["wandb_run_id"] is None


def test_global_batch_is_independent_of_hardware(tmp_path):
    one = compose(["batch.sentences_per_update=64", "hardware=cpu", "hardware.max_batch_per_device=16"],
                  run_dir=tmp_path)
    assert derive_batching(one) == (16, 4)
    two = compose(["batch.sentences_per_update=64", "hardware=ddp_sim", "hardware.max_batch_per_device=16"],
                  run_dir=tmp_path)
    assert derive_batching(two) == (16, 2)
    eight = compose(["batch.sentences_per_update=4096", "hardware=gpu8"], run_dir=tmp_path)
    micro, accumulate = derive_batching(eight)
    assert micro * accumulate * 8 == 4096


def test_build_module_and_datamodule_from_config(tmp_path):
    cfg = compose([*TINY, *TINY_ALGO], run_dir=tmp_path)
    module = build_module(cfg)
    dm = build_datamodule(cfg)
    batch = next(iter(dm.train_dataloader()))
    loss, aux, tokens = module.compute_loss(batch)
    assert loss.ndim == 0 and tokens > 0
    loss.backward()
    assert all(p.grad is not None for p in module.model.parameters() if p.requires_grad)


def test_experiment_with_debug_fdr_applies_the_debug_settings(tmp_path):
    cfg = compose(["experiment=demo/copy", "debug=fdr", *TINY_ALGO], run_dir=tmp_path)
    record = run(cfg, run_dir=tmp_path, command="pytest")
    assert record["cost"]["steps"] == 1
    assert record["experiment"] == "demo/copy"
    assert not (tmp_path / "csv").exists()  # debug=fdr turns loggers off
    assert not (tmp_path / "checkpoints").exists()


def test_run_record_is_json_with_no_nan(tmp_path):
    cfg = compose([*TINY, *TINY_ALGO, "logger=none"], run_dir=tmp_path)
    run(cfg, run_dir=tmp_path, command="pytest")
    text = (tmp_path / "results.json").read_text()
    json.loads(text)
    assert "NaN" not in text and "Infinity" not in text


def test_token_budget_batches_train_and_respect_the_budget(tmp_path):
    """``batch.tokens_per_update`` trains with length-bucketed micro-batches no larger than the budget."""
    cfg = compose([*TINY, *TINY_ALGO, "batch.tokens_per_update=96", "hardware.max_batch_per_device=8",
                   "logger=none"], run_dir=tmp_path)
    dm = build_datamodule(cfg)
    micro_tokens = dm.micro_tokens
    assert micro_tokens and micro_tokens <= 96
    for batch in dm.train_dataloader():
        assert batch["src"].numel() <= micro_tokens and batch["src"].shape[0] <= 8
    record = run(cfg, run_dir=tmp_path, command="pytest")
    assert record["status"] == "completed" and record["cost"]["steps"] == 4


def test_skip_existing_returns_the_completed_record_of_the_same_config(tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    first_dir = runs / "first"
    cfg = compose([*TINY, *TINY_ALGO, "logger=none", f"paths.runs_dir={runs}"], run_dir=first_dir)
    first = run(cfg, run_dir=first_dir, command="pytest")
    monkeypatch.setenv("ATTNLAB_SKIP_EXISTING", "1")
    second_dir = runs / "second"
    again = run(compose([*TINY, *TINY_ALGO, "logger=none", f"paths.runs_dir={runs}"], run_dir=second_dir),
                run_dir=second_dir, command="pytest")
    assert again["run_dir"] == first["run_dir"]
    assert not (second_dir / "results.json").exists()
    other = run(compose([*TINY, *TINY_ALGO, "logger=none", "seed=7", f"paths.runs_dir={runs}"],
                        run_dir=runs / "third"), run_dir=runs / "third", command="pytest")
    assert other["run_dir"] != first["run_dir"]  # another seed is another row: trained


def test_training_batches_say_which_token_tensors_hold_padding_and_only_training_batches():
    """Read on the host before the copy (``on_before_batch_transfer``): a flag saying "no padding" where there
    is some would let attention see padding keys, so each tensor is judged on its own."""
    from types import SimpleNamespace

    from attnlab.training.modules import PADDED

    module = build_module(compose([*TINY, *TINY_ALGO]))
    pad = module.task_info["pad_id"]
    src = torch.tensor([[5, 6, pad], [5, 6, 7]])
    tgt = torch.tensor([[5, 6], [7, 8]])
    module._trainer = SimpleNamespace(training=True)
    batch = module.on_before_batch_transfer({"src": src, "tgt_in": tgt, "tgt_out": tgt}, 0)
    assert batch[PADDED] == {"src": True, "tgt_in": False}
    module._trainer = SimpleNamespace(training=False)  # validating or testing: masks as always
    assert PADDED not in module.on_before_batch_transfer({"src": src, "tgt_in": tgt}, 0)


@pytest.mark.slow
def test_a_compiled_run_trains_as_the_eager_one(tmp_path):
    """hardware.compile=true (torch.compile of the training forward, Inductor's C++ on CPU) changes how fast,
    not what: 6 updates with dropout off end at the eager run's weights to float tolerance, under the same
    checkpoint names. The key projections' biases are left out, as in the DDP test: their gradient is zero in
    exact arithmetic, so Adam turns rounding noise into full steps there. (With dropout on, Inductor draws its
    own masks: the runs differ as two seeds do.) About 20 seconds, most of it compiling."""
    from torch._dynamo.utils import counters

    from tests.reliability.helpers import run_with_callbacks, weights

    ends = {}
    for name, extra in (("eager", []), ("compiled", ["hardware.compile=true"])):
        counters.clear()
        record = run_with_callbacks(tmp_path / name, extra=["trainer.max_steps=6", "model.dropout=0.0",
                                                            "model.attention_dropout=0.0", *extra])
        assert record["status"] == "completed"
        assert (counters["stats"]["unique_graphs"] > 0) == (name == "compiled")  # compiled, and only then
        ends[name] = weights(tmp_path / name / "checkpoints" / "last.ckpt")
    eager, compiled = ends["eager"], ends["compiled"]
    assert compiled.keys() == eager.keys()
    for key in eager:
        if not key.endswith("k_proj.bias"):
            torch.testing.assert_close(compiled[key], eager[key], rtol=1e-4, atol=1e-5, msg=key)


@pytest.mark.parametrize("hold", [0, 2])
def test_a_held_halting_unit_gets_no_update_until_its_hold_ends(hold):
    """``model.recurrence.halting_hold_updates``: the training module drops the halting unit's gradients at
    updates 0..hold-1, so AdamW (which skips a parameter without a gradient, weight decay included) leaves W and b
    exactly as initialised, while every other parameter learns; from update ``hold`` on, they learn too. Fails if
    the hold is ignored, never released, or drops the wrong parameters."""
    from types import SimpleNamespace

    module = build_module(compose(["experiment=probes/ut2/ut_act_deep",
                                   f"model.recurrence.halting_hold_updates={hold}"]))
    halting = [p for name, p in module.model.named_parameters() if "halting_unit" in name]
    others = [p for name, p in module.model.named_parameters() if "halting_unit" not in name]
    assert len(halting) == 2
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-2, weight_decay=0.1)
    for update in range(hold + 1):
        module._trainer = SimpleNamespace(global_step=update, loggers=[])
        before_halting = [p.detach().clone() for p in halting]
        before_others = [p.detach().clone() for p in others]
        optimizer.zero_grad()
        sum((p.square() + p).sum() for p in module.parameters()).backward()  # a gradient for every parameter
        module.on_before_optimizer_step(optimizer)
        optimizer.step()
        moved = [not torch.equal(p, b) for p, b in zip(halting, before_halting)]
        assert moved == [update >= hold] * 2, f"update {update} of a hold of {hold}"
        assert all(not torch.equal(p, b) for p, b in zip(others, before_others))
    module._trainer = None

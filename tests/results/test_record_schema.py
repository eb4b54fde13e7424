"""The record schema is written once (results/record.py's dataclasses): the validation tables and the header every
writer starts from are derived from it. These tests hold the derived forms to what they replaced (issue 40.1):
the literal tables of schema version 1 and the dict literals each writer spelled out, compared field by field for
the same inputs."""

from __future__ import annotations

import dataclasses
import platform
from pathlib import Path

import pytest

from attnlab.results import record as rec_mod

# The validation tables of schema version 1 as they were written out by hand before they were derived.
_INT, _NUM = (int,), (int, float)
V1_TOP = {
    "schema_version": (_INT, False), "status": ((str,), False), "error": ((str,), True),
    "experiment": ((str,), True), "row": ((str,), True), "task": ((str,), False), "model": ((dict,), False),
    "seed": (_INT, False), "scale": ((str,), False), "config_hash": ((str,), False), "git": ((dict,), False),
    "hardware": ((dict,), False), "metrics": ((dict,), False), "params": ((dict,), False),
    "cost": ((dict,), False), "metric_flavours": ((dict,), False), "wandb_run_id": ((str,), True),
    "run_dir": ((str,), False), "command": ((str,), False), "created": ((str,), False),
    "versions": ((dict,), False),
}
V1_NESTED = {
    "model": {"name": ((str,), False), "attention": ((str,), False), "recurrence": ((str,), False)},
    "git": {"commit": ((str,), True), "dirty": ((bool,), True)},
    "hardware": {"name": ((str,), False), "accelerator": ((str,), False), "devices": ((int, str, list), False),
                 "num_nodes": (_INT, False), "precision": ((str, int), False)},
    "metrics": {"final": ((dict,), False), "best": ((dict,), False)},
    "params": {"total": (_INT, True), "trainable": (_INT, True)},
    "cost": {"wall_s": (_NUM, True), "tokens_per_s": (_NUM, True), "peak_mem_mb": (_NUM, True)},
}
V1_REQUIRED_WHEN_FAILED = {"schema_version", "status", "error", "run_dir", "command", "created", "metrics"}


def test_validation_tables_are_derived_to_the_v1_tables():
    # An annotation edited in a dataclass (float -> int, a dropped "| None") would change what every reader
    # accepts; the order matters too: problems are listed, and shown, in it.
    assert list(rec_mod._TOP.items()) == list(V1_TOP.items())
    assert dict(rec_mod._OPTIONAL_TOP) == {"extra": ((dict,), False)}
    derived = {k: list(v.items()) for k, v in rec_mod._NESTED.items()}
    assert derived == {k: list(v.items()) for k, v in V1_NESTED.items()}
    assert list(rec_mod._NESTED) == list(V1_NESTED)
    assert rec_mod._REQUIRED_WHEN_FAILED_KEYS == V1_REQUIRED_WHEN_FAILED


def test_header_has_every_schema_key_and_reads_the_config_keys():
    header = rec_mod.record_header(lambda key: f"<{key}>", status="running", config_hash="ab",
                                   git={"commit": "c", "dirty": False}, run_dir="/r", command="attnlab-train",
                                   created="2025-01-01T00:00:00")
    assert list(header) == list(V1_TOP)  # extra is optional and not added
    for key, fields in V1_NESTED.items():
        assert set(header[key]) == set(fields), key
    assert header["model"] == {"name": "<model.name>", "attention": "<model.attention.name>",
                               "recurrence": "<model.recurrence.name>"}
    assert (header["experiment"], header["seed"], header["hardware"]["precision"]) == \
        ("<experiment_name>", "<seed>", "<hardware.precision>")
    assert header["metrics"] == {"final": {}, "best": {}}
    assert header["cost"] == {"wall_s": None, "tokens_per_s": None, "peak_mem_mb": None}
    assert header["schema_version"] == rec_mod.SCHEMA_VERSION and header["error"] is None
    other = rec_mod.record_header(lambda key: None, status="running", config_hash="ab", git={}, run_dir="/r",
                                  command="c", created="2025-01-01T00:00:00")
    other["metrics"]["final"]["x/y"] = 1.0  # the defaults are fresh per record, not shared
    assert header["metrics"]["final"] == {}


# ----------------------------------------------------------------------------------------------------------
# The writers' dict literals before the header constructor, for the same inputs.


def _old_record_from_wandb(summary, config, state, run_id, url):
    from attnlab.results.record import config_hash, sanitize_record
    from attnlab.results.wandb_records import _STATE, _first

    final = {k: v for k, v in summary.items() if "/" in k and not k.startswith(("_", "model/params/"))
             and isinstance(v, (int, float)) and not isinstance(v, bool)}
    status = _STATE.get(state, "failed")
    plain_config = {k: v for k, v in config.items() if not k.startswith("_")}
    record = {
        "schema_version": 1, "status": status, "error": None if status != "failed" else f"wandb run state {state}",
        "experiment": _first(config, "experiment_name", "experiment.name"),
        "row": _first(config, "row", "experiment.row"),
        "task": _first(config, "task.name") or "unknown",
        "model": {"name": _first(config, "model.name") or "unknown",
                  "attention": _first(config, "model.attention.name") or "unknown",
                  "recurrence": _first(config, "model.recurrence.name") or "unknown"},
        "seed": _first(config, "seed") if isinstance(_first(config, "seed"), int) else -1,
        "scale": _first(config, "scale.name") or "cpu",
        "config_hash": summary.get("config_hash") or config_hash(plain_config),
        "git": {"commit": _first(config, "git.commit"), "dirty": _first(config, "git.dirty")},
        "hardware": {
            "name": _first(config, "hardware.name") or "unknown",
            "accelerator": _first(config, "hardware.accelerator", "trainer.accelerator") or "unknown",
            "devices": _first(config, "hardware.devices", "trainer.devices") or 1,
            "num_nodes": _first(config, "hardware.num_nodes", "trainer.num_nodes") or 1,
            "precision": _first(config, "hardware.precision", "trainer.precision") or "32-true",
        },
        "metrics": {"final": final, "best": {}},
        "params": {"total": summary.get("model/params/total"), "trainable": summary.get("model/params/trainable")},
        "cost": {"wall_s": summary.get("_runtime"), "tokens_per_s": summary.get("perf/tokens_per_s"),
                 "peak_mem_mb": summary.get("perf/peak_mem_mb")},
        "metric_flavours": {}, "wandb_run_id": run_id, "run_dir": url, "command": f"(wandb run {url})",
        "created": summary.get("created") or "1970-01-01T00:00:00", "versions": {},
    }
    return sanitize_record(record)


WANDB_CASES = [
    ({"test/seq_acc": 0.5, "val/loss": float("nan"), "_runtime": 12.5, "model/params/total": 10,
      "model/params/trainable": 9, "perf/tokens_per_s": 100.0, "created": "2025-06-01T12:00:00", "flag/x": True},
     {"experiment_name": "ut/table1", "row": "UT", "task": {"name": "algo/copy"}, "seed": 3,
      "model": {"name": "ut", "attention": {"name": "vanilla"}, "recurrence": {"name": "act"}},
      "scale": {"name": "gpu"}, "git": {"commit": "abc", "dirty": True},
      "hardware": {"name": "gpu1", "accelerator": "gpu", "devices": [0, 1], "num_nodes": 2, "precision": 32}},
     "finished"),
    ({}, {}, "crashed"),  # nothing known: every default
    ({"config_hash": "ff"},  # an older run: the trainer's arguments, experiment as a group
     {"experiment": {"name": "e", "row": "r"}, "seed": "7", "_wandb": {"x": 1},
      "trainer": {"accelerator": "cpu", "devices": 0, "num_nodes": 1, "precision": "bf16-mixed"}}, "running"),
    ({}, {"seed": 0, "scale": {"name": ""}, "hardware": {"devices": "auto"}}, "killed"),
]


@pytest.mark.parametrize(("summary", "config", "state"), WANDB_CASES)
def test_wandb_record_equals_the_old_literal(summary, config, state):
    from attnlab.results.wandb_records import record_from_wandb

    new = record_from_wandb(summary, config, state, "run1", "https://wandb.ai/e/p/runs/run1")
    old = _old_record_from_wandb(summary, config, state, "run1", "https://wandb.ai/e/p/runs/run1")
    assert new == old
    assert list(new) == list(V1_TOP)  # and no key added or lost


def _old_config_record(cfg, run_dir, command, *, status, error=None, extra=None, git, config_hash, created):
    """write_config_record's literal, as written before the header constructor (git, hash and time given)."""
    import torch
    from omegaconf import OmegaConf

    import attnlab

    def pick(dotted):
        try:
            return OmegaConf.select(cfg, dotted)
        except Exception:  # noqa: BLE001
            return None

    record = {
        "schema_version": 1, "status": status, "error": error, "experiment": pick("experiment_name"),
        "row": pick("row"), "task": pick("task.name"),
        "model": {"name": pick("model.name"), "attention": pick("model.attention.name"),
                  "recurrence": pick("model.recurrence.name")},
        "seed": pick("seed"), "scale": pick("scale.name"), "git": git, "config_hash": config_hash,
        "hardware": {"name": pick("hardware.name"), "accelerator": pick("hardware.accelerator"),
                     "devices": pick("hardware.devices"), "num_nodes": pick("hardware.num_nodes"),
                     "precision": str(pick("hardware.precision"))},
        "metrics": {"final": {}, "best": {}}, "params": {"total": None, "trainable": None},
        "cost": {"wall_s": None, "tokens_per_s": None, "peak_mem_mb": None}, "metric_flavours": {},
        "wandb_run_id": None, "run_dir": str(Path(run_dir).resolve()), "command": command, "created": created,
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "attnlab": attnlab.__version__},
    }
    if extra:
        record["extra"] = extra
    return record


def _broken_config():
    from omegaconf import OmegaConf

    # a misspelled interpolation and missing groups: what a failure before validation can leave
    return OmegaConf.create({"seed": 5, "task": {"name": "${nope.missing}"}, "model": {"name": "m"},
                             "paths": {"runs_dir": "runs"}})


STOPPED = {"interrupted": {"signal": "SIGINT", "step": 0, "checkpoint": None, "resume_with": "attnlab-train",
                           "phase": "before training"}}


@pytest.mark.parametrize(("which", "status", "error", "extra"), [
    ("composed", "failed", "ConfigError: seed=-1 must be an integer", None),
    ("composed", "interrupted", None, STOPPED),
    ("broken", "failed", "InterpolationKeyError: nope.missing", None),  # only a failed record may be this empty
])
def test_config_record_equals_the_old_literal(tmp_path, monkeypatch, which, status, error, extra):
    from attnlab.training import record_writers
    from tests.conftest import compose

    cfg = compose(["experiment=demo/copy"], run_dir=tmp_path) if which == "composed" else _broken_config()
    git = {"commit": "0" * 40, "dirty": False}
    monkeypatch.setattr(record_writers, "git_state", lambda: dict(git))
    monkeypatch.setattr(record_writers.time, "strftime", lambda fmt: "2025-06-01T12:00:00+0000")
    assert record_writers.write_config_record(cfg, tmp_path / "run", "attnlab-train x=1", status=status, error=error,
                                       extra=extra)
    written = rec_mod.read_record(tmp_path / "run" / rec_mod.RECORD_FILENAME)
    old = _old_config_record(cfg, tmp_path / "run", "attnlab-train x=1", status=status, error=error, extra=extra,
                             git=git, config_hash=record_writers.asked_config_hash(cfg),
                             created="2025-06-01T12:00:00+0000")
    assert written == rec_mod.sanitize_record(old)
    if which == "broken":
        assert written["task"] is None and written["hardware"]["precision"] == "None"


# ----------------------------------------------------------------------------------------------------------
# The schema declares what readers read, and nothing else passes (issue 51.3).

REPO = Path(__file__).resolve().parents[2]


def test_every_committed_record_loads():
    """The records behind the committed tables stay valid under the declared nested fields (old ones lack some
    optional cost fields: cpu_s, segments, torch_threads, the steady-state figures)."""
    from attnlab.results.loading import load_records

    runs = REPO / "results" / "runs"
    loaded, corrupt = load_records([str(runs)], skip_corrupt=True)
    assert not corrupt, [c.reason for c in corrupt[:3]]
    assert len(loaded) == len(list(runs.rglob("results.json"))) > 0


@pytest.mark.parametrize("dotted", ["cost.cpu_s", "cost.step_s", "cost.mfu", "cost.torch_threads",
                                    "extra.attention_coverage", "extra.debug", "extra.skipped_batches",
                                    "extra.attention_kernels", "extra.test_checkpoint"])
def test_the_fields_readers_read_are_declared(dotted):
    """results/listing.py (cost.cpu_s, cost.torch_threads), benchmarks/gpu_check.py (cost.step_s, cost.mfu,
    extra.attention_kernels), claims' preconditions (extra.attention_coverage), render/summary.py (extra.debug)."""
    section, name = dotted.split(".")
    cls = {"cost": rec_mod.Cost, "extra": rec_mod.Extra}[section]
    assert name in {f.name for f in dataclasses.fields(cls)}


def _a_record() -> dict:
    return next(iter(sorted((REPO / "results" / "runs").rglob("results.json")))).read_text()


@pytest.mark.parametrize(("where", "key"), [("cost", "cpu_sec"), ("extra", "coverage"), ("git", "branch"),
                                            ("extra.attention_coverage", "mean")])
def test_an_unknown_nested_key_is_refused(where, key):
    import json

    record = json.loads(_a_record())
    node = record
    for part in where.split("."):
        node = node.setdefault(part, {})
    if where == "extra.attention_coverage":
        node.update(attended_fraction_mean=0.5, attended_fraction_max=0.5, attended_fraction_min=0.5,
                    dense_fallback_share=0.0, lengths={"min": 1, "max": 2}, block_size=None)
    assert rec_mod.validate_record(record) == []
    node[key] = 1
    problems = rec_mod.validate_record(record)
    assert problems == [f"unknown key(s) {where}.{key} (a record's fields are results/record.py's "
                        f"{ {'cost': 'Cost', 'extra': 'Extra', 'git': 'GitInfo'}.get(where, 'AttentionCoverage')})"]


def test_a_declared_optional_field_is_typed_where_present():
    import json

    record = json.loads(_a_record())
    record["cost"]["mfu"] = "high"
    record["extra"]["skipped_batches"] = None
    assert rec_mod.validate_record(record) == ["cost.mfu must be int or float or null, got str",
                                               "extra.skipped_batches must be int, got NoneType"]


def test_a_writer_fills_the_sections_as_dataclasses():
    """Fields left unset are not written; a misspelt section or field fails where it is written."""
    header = rec_mod.record_header(lambda key: None, status="failed", error="x", config_hash="ab", git={},
                                   run_dir="/r", command="c", created="2025-01-01T00:00:00",
                                   cost=rec_mod.Cost(wall_s=1.0, tokens_per_s=None, peak_mem_mb=None, cpu_s=0.5),
                                   extra=rec_mod.Extra(debug="fdr"))
    assert header["cost"] == {"wall_s": 1.0, "tokens_per_s": None, "peak_mem_mb": None, "cpu_s": 0.5}
    assert header["extra"] == {"debug": "fdr"} and rec_mod.validate_record(header) == []
    with pytest.raises(TypeError):
        rec_mod.Cost(wall_s=1.0, tokens_per_s=None, peak_mem_mb=None, cpu_sec=0.5)
    with pytest.raises(TypeError, match="no record field"):
        rec_mod.record_header(lambda key: None, status="running", config_hash="ab", git={}, run_dir="/r",
                              command="c", created="2025-01-01T00:00:00", ponder={})

"""Run record schema, atomic writes, NaN handling, config hash."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from attnlab.results import record as rec_mod
from attnlab.results.record import (
    Cost,
    GitInfo,
    HardwareInfo,
    Metrics,
    ModelInfo,
    ParamCount,
    RecordError,
    RunRecord,
    config_hash,
    find_records,
    read_record,
    validate_record,
    write_record,
)


def test_good_record_is_valid(record_factory):
    assert validate_record(record_factory()) == []
    assert validate_record(record_factory(status="failed", error="CUDA out of memory")) == []
    assert validate_record(record_factory(status="running", **{"params.total": None})) == []


def test_dataclass_round_trips(tmp_path):
    run = RunRecord(
        status="completed",
        task="algo/copy",
        model=ModelInfo("transformer_small", "vanilla", "stacked"),
        seed=1,
        scale="cpu",
        config_hash="0f" * 32,
        git=GitInfo("abc123", True),
        hardware=HardwareInfo("cpu", "cpu", 1, 1, "32-true"),
        run_dir=str(tmp_path),
        command="attnlab-train seed=1",
        created="2025-06-01T12:00:00",
        metrics=Metrics(final={"test/seq_acc": 1.0}),
        params=ParamCount(10, 10),
        cost=Cost(1.0, None, None),
    )
    written = write_record(tmp_path, run)
    assert read_record(tmp_path / "results.json") == written
    assert written["schema_version"] == 1 and written["extra"] == {}


@pytest.mark.parametrize(
    ("overrides", "phrase"),
    [
        ({"status": "done"}, "status must be one of"),
        ({"status": "failed"}, "failed record needs a non-empty 'error'"),
        ({"error": "line one\nline two"}, "error must be one line"),
        ({"seed": True}, "seed must be int"),
        ({"seed": "1"}, "seed must be int"),
        ({"scale": "huge"}, "scale must be one of"),
        ({"config_hash": "not hex!"}, "config_hash must be a lowercase hex digest"),
        ({"created": "yesterday"}, "created must be an ISO 8601 time"),
        ({"metrics.final": {"test/seq_acc": "high"}}, "metrics.final.test/seq_acc must be a number or null"),
        ({"metrics.final": {"test/seq_acc": float("nan")}}, "store non-finite values as null"),
        ({"model": {"name": "x", "attention": "vanilla"}}, "missing key model.recurrence"),
        ({"git.dirty": "yes"}, "git.dirty must be bool or null"),
        ({"params.total": None}, "a completed record needs params.total"),
        ({"schema_version": 0}, "schema_version must be 1"),
        ({"ponder": 3}, "unknown key(s) ponder"),
    ],
)
def test_bad_records_are_named(record_factory, overrides, phrase):
    problems = validate_record(record_factory(**overrides))
    assert any(phrase in p for p in problems), problems


def test_missing_key_and_newer_schema(record_factory):
    rec = record_factory()
    del rec["metrics"]
    assert "missing key metrics" in validate_record(rec)
    assert validate_record([]) == ["a record must be a JSON object, got list"]
    newer = validate_record(record_factory(schema_version=2))
    assert len(newer) == 1 and "newer than this attnlab reads" in newer[0]


def test_nan_is_stored_as_null(tmp_path, record_factory):
    rec = record_factory(
        **{"metrics.final": {"test/seq_acc": float("nan"), "train/loss": float("inf"), "x/y": 2}}
    )
    write_record(tmp_path / "results.json", rec)
    text = (tmp_path / "results.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    data = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    assert data["metrics"]["final"] == {"test/seq_acc": None, "train/loss": None, "x/y": 2}
    assert math.isnan(rec["metrics"]["final"]["test/seq_acc"])  # the caller's dict is not mutated


def test_write_is_atomic_and_leaves_no_temp_files(tmp_path, record_factory, monkeypatch):
    path = tmp_path / "run" / "results.json"
    write_record(path, record_factory(seed=1))
    assert sorted(p.name for p in path.parent.iterdir()) == ["results.json"]

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(rec_mod.os, "replace", broken_replace)
    with pytest.raises(OSError):
        write_record(path, record_factory(seed=2))
    monkeypatch.undo()
    assert sorted(p.name for p in path.parent.iterdir()) == ["results.json"]
    assert read_record(path)["seed"] == 1  # the old record survives whole
    assert oct(path.stat().st_mode & 0o777) != oct(0o600)  # readable like any other file


def test_invalid_record_is_not_written(tmp_path, record_factory):
    with pytest.raises(RecordError, match="refusing to write an invalid run record: status must be"):
        write_record(tmp_path, record_factory(status="weird"))
    assert list(tmp_path.iterdir()) == []


def test_read_errors_are_one_line_naming_the_file(tmp_path, record_factory):
    broken = tmp_path / "a" / "results.json"
    broken.parent.mkdir()
    broken.write_text('{"status": "completed",')
    with pytest.raises(RecordError) as err:
        read_record(broken)
    msg = str(err.value)
    assert str(broken) in msg and "not valid JSON" in msg and "\n" not in msg

    wrong = tmp_path / "b.json"
    wrong.write_text(json.dumps(record_factory(status="done")))
    with pytest.raises(
        RecordError, match=r"b\.json: not a valid run record \(schema 1\): status must be one of"
    ):
        read_record(wrong)

    empty = tmp_path / "c.json"
    empty.write_text("")
    with pytest.raises(RecordError, match="empty file"):
        read_record(empty)


def test_find_records(tmp_path, record_factory):
    for name in ("x/1", "x/2", "y/1"):
        write_record(tmp_path / name, record_factory())
    (tmp_path / "x" / "1" / "other.json").write_text("{}")
    assert [p.parent.name for p in find_records(tmp_path)] == ["1", "2", "1"]
    assert len(find_records(str(tmp_path / "x" / "*"))) == 2
    assert find_records([tmp_path / "y" / "1" / "results.json", tmp_path / "y"]) == [
        tmp_path / "y" / "1" / "results.json"
    ]
    assert find_records(tmp_path / "nope") == []


CONFIG = {
    "seed": 1,
    "model": {"d_model": 128, "attention": {"name": "vanilla"}},
    "trainer": {
        "max_steps": 100,
        "enable_progress_bar": True,
        "default_root_dir": "/a",
        "precision": "32-true",
    },
    "paths": {"data_dir": "/data", "output_dir": "/out"},
    "logger": {"wandb": {"project": "p"}},
    "callbacks": {"model_checkpoint": {"dirpath": "/ckpt", "monitor": "val/loss"}},
    "hydra": {"run": {"dir": "/x"}},
}


def _with(path: str, value):
    cfg = json.loads(json.dumps(CONFIG))
    node = cfg
    *parents, last = path.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = value
    return cfg


def test_config_hash_is_stable_and_ignores_only_non_result_keys():
    h = config_hash(CONFIG)
    assert len(h) == 64 and h == config_hash(json.loads(json.dumps(CONFIG)))
    reordered = dict(reversed(list(CONFIG.items())))
    assert config_hash(reordered) == h
    # Keys that do not change what the run computes.
    for path, value in [
        ("paths.data_dir", "/elsewhere"),
        ("trainer.enable_progress_bar", False),
        ("trainer.default_root_dir", "/b"),
        ("logger.wandb.project", "q"),
        ("callbacks.model_checkpoint.dirpath", "/other"),
        ("hydra.run.dir", "/y"),
        ("wandb", {"mode": "offline"}),
        ("data.num_workers", 8),
    ]:
        assert config_hash(_with(path, value)) == config_hash(_with(path, None)), path
    assert config_hash(_with("trainer.log_every_n_steps", 7)) == config_hash(
        _with("trainer.log_every_n_steps", 50)
    )
    # Keys that do.
    for path, value in [
        ("seed", 2),
        ("model.d_model", 256),
        ("model.attention.name", "qknorm"),
        ("trainer.precision", "bf16-mixed"),
        ("callbacks.model_checkpoint.monitor", "val/bleu"),
    ]:
        assert config_hash(_with(path, value)) != h, path
    # An explicit exclude list replaces the default.
    assert config_hash(_with("seed", 2), exclude=("seed", "hydra")) == config_hash(
        CONFIG, exclude=("seed", "hydra")
    )
    assert config_hash(_with("paths.data_dir", "/z"), exclude=()) != config_hash(CONFIG, exclude=())
    assert "paths" in rec_mod.DEFAULT_HASH_EXCLUDE


def test_results_floor_imports_no_torch_lightning_hydra_or_wandb():
    code = (
        "import sys, attnlab.results, attnlab.results.build, attnlab.results.render;"
        "bad = [m for m in ('torch', 'lightning', 'hydra', 'wandb') if m in sys.modules];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ.copy())
    assert out.returncode == 0, out.stdout + out.stderr


def test_failed_record_may_leave_unknowns_null(record_factory):
    # What training writes when a run dies before its config is valid: only the failure is known.
    early = record_factory(
        status="failed",
        error="ConfigError: model.d_model must be divisible by model.heads",
        seed=None,
        task=None,
        scale=None,
        config_hash=None,
        model={"name": None, "attention": None, "recurrence": None},
        hardware={"name": None},
        params={},
        cost={},
        **{"metrics.final": {}, "metrics.best": {}},
    )
    assert validate_record(early) == []
    early["error"] = None
    assert "a failed record needs a non-empty 'error'" in validate_record(early)
    assert "config_hash must be string, got NoneType" in validate_record(record_factory(config_hash=None))


def test_strftime_offset_and_extra_nested_keys_are_accepted(record_factory):
    rec = record_factory(created="2025-01-01T12:00:00+0000", **{"cost.steps": 100})
    assert validate_record(rec) == []

"""Published records must be found by their own command at HEAD (issue 52.1): the hash covers the config that
runs (not the blocks of scales not applied), ``record_hashes check`` fails on a record whose hash its command no
longer composes, and ``migrate`` rewrites a hash only where every saved key resolves the same today."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from attnlab.cli import record_hashes
from attnlab.results.record import config_hash
from attnlab.training.record_hashes import RecordHashError, recorded_overrides
from tests.conftest import REPO, compose

# One published laptop record (UT Table 5, a few kB with its saved config).
PUBLISHED = REPO / "results" / "runs" / "ut" / "table5" / "transformer_reverse" / "s1-ea23d0084091"


def test_the_hash_leaves_out_the_scale_blocks_but_keeps_what_they_applied():
    from attnlab.training.config_hash import asked_config_hash

    cfg = compose(["experiment=ut/table5/transformer_reverse", "scale=cpu"])
    base = asked_config_hash(cfg)
    grown = cfg.copy()
    grown.at_scale.gpu = {"trainer.max_steps": 99999}  # a new one-GPU block: never applied at scale=cpu
    grown.model.at_scale = {"gpu": {"d_model": 4096}}
    assert asked_config_hash(grown) == base
    changed = cfg.copy()
    changed.trainer.max_steps = cfg.trainer.max_steps + 1  # what the applied cpu block set: it runs
    assert asked_config_hash(changed) != base
    # independent reference: the canonical hash of the same plain dict without any at_scale key
    plain = {"a": 1, "at_scale": {"gpu": {}}, "model": {"d": 2, "at_scale": {"cpu": {"d": 3}}}}
    assert config_hash(plain) == config_hash({"a": 1, "model": {"d": 2}})


def _hash_today(record_dir: Path) -> str:
    """What the record's command composes at HEAD, composed as the test suite composes (not by the tool)."""
    from attnlab.training.config_hash import asked_config_hash

    command = json.loads((record_dir / "results.json").read_text())["command"]
    return asked_config_hash(compose(command.split()[1:]))


def _copy_published(tmp_path: Path) -> Path:
    """A copy of the published record, its hash set to what its command composes today."""
    runs = tmp_path / "runs"
    dest = runs / "ut" / "table5" / "transformer_reverse" / PUBLISHED.name
    shutil.copytree(PUBLISHED, dest)
    _set_hash(dest, _hash_today(dest))
    return runs


def _set_hash(record_dir: Path, value: str) -> None:
    path = record_dir / "results.json"
    data = json.loads(path.read_text())
    data["config_hash"] = value
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def test_check_passes_on_a_matching_record_and_fails_on_a_stale_hash(tmp_path, capsys):
    runs = _copy_published(tmp_path)
    assert record_hashes.main(["check", "--runs", str(runs)]) == 0
    record_dir = next(runs.rglob("results.json")).parent
    _set_hash(record_dir, "b6725e85" + "0" * 56)
    assert record_hashes.main(["check", "--runs", str(runs)]) == 1
    out = capsys.readouterr()
    assert "recorded hash b6725e850000, its command composes" in out.out
    assert "make migrate-records" in out.err


def test_migrate_rewrites_a_provably_unchanged_record_and_its_baselines(tmp_path, capsys):
    runs = _copy_published(tmp_path)
    record_dir = next(runs.rglob("results.json")).parent
    right = _hash_today(record_dir)
    stale = "b6725e85" + "0" * 56
    _set_hash(record_dir, stale)
    baselines = tmp_path / "baselines" / "ut"
    baselines.mkdir(parents=True)
    doc = {"table": "ut/table5_reverse", "made_by": "test", "baselines": {"k": {"values": {}}},
           "runs": {stale: "k", "f" * 64: "k"}}
    (baselines / "table5_reverse.json").write_text(json.dumps(doc))
    assert record_hashes.main(["migrate", "--runs", str(runs), "--baselines", str(tmp_path / "baselines")]) == 0
    assert json.loads((record_dir / "results.json").read_text())["config_hash"] == right
    assert json.loads((baselines / "table5_reverse.json").read_text())["runs"] == {right: "k", "f" * 64: "k"}
    assert "1 of 1 records migrated" in capsys.readouterr().out
    assert record_hashes.main(["check", "--runs", str(runs)]) == 0


def test_migrate_refuses_a_record_whose_saved_values_differ_from_today(tmp_path, capsys):
    runs = _copy_published(tmp_path)
    record_dir = next(runs.rglob("results.json")).parent
    _set_hash(record_dir, "b6725e85" + "0" * 56)
    saved = record_dir / ".hydra" / "config.yaml"
    config = yaml.safe_load(saved.read_text())
    config["trainer"]["max_steps"] = 123  # the run trained 123 steps; today's command trains another number
    saved.write_text(yaml.safe_dump(config))
    assert record_hashes.main(["migrate", "--runs", str(runs)]) == 1
    assert "b6725e85" in (record_dir / "results.json").read_text()  # left alone
    out = capsys.readouterr().out
    assert "not migrated, train again" in out and "trainer.max_steps: 123 ->" in out


@pytest.mark.parametrize("command, overrides", [
    ("attnlab-train experiment=a seed=1", ["experiment=a", "seed=1"]),
    ("/x/.venv/bin/attnlab-train 'init_from=my runs/c.ckpt'", ["init_from=my runs/c.ckpt"]),
    ("python3.11 -m attnlab.train seed=2", ["seed=2"]),
])
def test_recorded_overrides(command, overrides):
    assert recorded_overrides(command) == overrides


def test_a_foreign_command_is_refused():
    with pytest.raises(RecordHashError, match="not an attnlab-train command"):
        recorded_overrides("rm -rf /")

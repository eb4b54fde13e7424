"""find_completed: the skip-existing check behind ``make reproduce-*``."""

from __future__ import annotations

import json

from omegaconf import OmegaConf

from attnlab.results.lookup import find_completed, skip_existing_requested
from attnlab.results.record import config_hash, write_record
from tests.results.conftest import make_record

A, B = "aa" * 32, "bb" * 32


def _put(root, name, **overrides):
    path = root / name / "results.json"
    write_record(path, make_record(**{"run_dir": str(root / name), **overrides}))
    return path


def test_finds_the_newest_completed_record_with_the_hash(tmp_path):
    runs = tmp_path / "runs"
    old = _put(runs, "multirun/2025-01-01/0-a", config_hash=A, created="2025-01-01T00:00:00+00:00")
    new = _put(runs, "task/x/2025-02-01-s1", config_hash=A, created="2025-02-01T00:00:00+00:00")
    _put(runs, "failed", config_hash=A, status="failed", error="boom", created="2025-03-01T00:00:00+00:00")
    _put(runs, "running", config_hash=A, status="running", created="2025-03-02T00:00:00+00:00")
    other = _put(runs, "other", config_hash=B)
    (runs / "corrupt").mkdir()
    (runs / "corrupt" / "results.json").write_text("{not json")
    (runs / "invalid").mkdir()
    (runs / "invalid" / "results.json").write_text(json.dumps({"status": "completed", "config_hash": A}))
    assert old.exists()
    assert find_completed(runs, A) == new
    assert find_completed(runs, B) == other


def test_nothing_to_skip(tmp_path):
    runs = tmp_path / "runs"
    assert find_completed(runs, A) is None  # no folder yet
    _put(runs, "failed", config_hash=A, status="failed", error="boom")
    assert find_completed(runs, A) is None  # a failed run is trained again
    assert find_completed(runs, "") is None


def test_skip_switch_reads_the_environment():
    assert skip_existing_requested({"ATTNLAB_SKIP_EXISTING": "1"})
    assert skip_existing_requested({"ATTNLAB_SKIP_EXISTING": "True"})
    assert not skip_existing_requested({"ATTNLAB_SKIP_EXISTING": "0"})
    assert not skip_existing_requested({})


def test_the_hash_of_a_preset_does_not_depend_on_its_run_folder(tmp_path):
    """What training hashes before a run must equal what the record stores after it (same config)."""

    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from attnlab.training.scale import apply_scale

    def hashed(run_dir, *extra):
        overrides = ["experiment=ut/table4/ut_copy", "seed=2", f"paths.run_dir={run_dir}", *extra]
        cfg = hydra_compose(config_name="train", overrides=overrides)
        apply_scale(cfg, overrides)  # as training does before it hashes
        return config_hash(OmegaConf.to_container(cfg, resolve=True))

    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="attnlab.conf", version_base="1.3"):
        first = hashed(tmp_path / "a")
        assert first == hashed(tmp_path / "b", "logger=none", "trainer.enable_progress_bar=false")
        assert first != hashed(tmp_path / "a", "seed=3")

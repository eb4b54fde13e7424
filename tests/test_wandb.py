"""wandb carries what a reviewer needs (issue 15.6), checked on offline runs' files (no network here):
distinct names per seed, the record as summary and file, flavours, one copy of the config, the gradient norm,
``attnlab-table source=wandb`` reading the runs back, and ``wandb=true`` sending the tables as an artifact."""

from __future__ import annotations

import json
import time

import pytest

from attnlab.cli.table import build_tables
from attnlab.cli.wandb_source import offline_run_files, offline_wandb_records, read_offline_run
from attnlab.errors import TableError
from attnlab.training.config import validate
from attnlab.training.run import run
from tests.conftest import REPO, TINY, TINY_ALGO, compose


def _train(tmp_path, seed: int) -> dict:
    run_dir = tmp_path / "runs" / f"s{seed}"
    cfg = compose([*TINY, *TINY_ALGO, "task=algo/copy", "logger=wandb", "row=tiny", f"seed={seed}",
                   "logger.wandb.notes=round trip", "callbacks=none"], run_dir=run_dir)
    validate(cfg)  # logger.wandb.name / job_type / notes are schema keys
    record = run(cfg, run_dir=run_dir, command="pytest")
    assert record["status"] == "completed" and record["wandb_run_id"]
    return record


def _finished_runs(root, count: int) -> list:
    """The offline runs under ``root`` once ``count`` of them are complete on disk: wandb's service process
    may still be flushing a run's log for a moment after ``wandb.finish`` returns."""
    deadline = time.monotonic() + 60
    while True:
        runs = [(p, read_offline_run(p)) for p in offline_run_files([str(root)])]
        if sum(r["run_id"] is not None and r["state"] == "finished" for _, r in runs) >= count:
            return runs
        assert time.monotonic() < deadline, f"offline runs not complete: {[r['state'] for _, r in runs]}"
        time.sleep(0.5)


def test_offline_wandb_runs_carry_the_record_and_attnlab_table_reads_them_back(tmp_path, capfd, monkeypatch):
    monkeypatch.delenv("WANDB_SILENT", raising=False)
    records = {seed: _train(tmp_path, seed) for seed in (1, 2)}
    # wandb's console notes on saving the record ("Symlinked 1 file into the W&B run directory") are not shown
    assert "Symlinked" not in capfd.readouterr().err
    runs = {wb["run_id"]: (p, wb) for p, wb in _finished_runs(tmp_path, 2)}
    assert set(runs) == {r["wandb_run_id"] for r in records.values()}
    names = set()
    for seed, record in records.items():
        path, wb = runs[record["wandb_run_id"]]
        names.add(wb["name"])
        assert f"seed:{seed}" in wb["tags"] and "row:tiny" in wb["tags"] and f"s{seed}" in wb["name"]
        assert wb["summary"]["attnlab/record"] == json.loads(json.dumps(record))  # the record as summary
        assert (path.parent / "files" / "results.json").is_file()  # ... and as a file
        assert (path.parent / "files" / "outputs" / "test.hyp").is_file()
        assert wb["config"]["metric_flavours"] == record["metric_flavours"]
        hydra_keys = set(compose([*TINY, *TINY_ALGO, "task=algo/copy", "logger=wandb"]).keys())
        assert set(wb["config"]) - {"_wandb"} == hydra_keys | {"metric_flavours"}  # no model_cfg/optim_cfg copies
        assert wb["summary"]["train/grad_norm"] > 0
    assert len(names) == 2  # the seeds of one row are told apart

    loaded, corrupt = offline_wandb_records([str(tmp_path / "runs")])
    assert not corrupt and len(loaded) == 2
    by_seed = {entry.data["seed"]: entry.data for entry in loaded}
    for seed in records:
        expected = json.loads((tmp_path / "runs" / f"s{seed}" / "results.json").read_text())
        assert by_seed[seed] == expected
    build_tables({"table": "summary", "source": "wandb", "runs": str(tmp_path / "runs")})
    assert capfd.readouterr().out.count("algo/copy") >= 2

    # attnlab-table ... wandb=true: the built table (markdown, PNG) goes to wandb as an artifact
    out = tmp_path / "results"
    build_tables({"table": "demo/copy", "source": "wandb", "runs": str(tmp_path / "runs"), "out": str(out),
                  "experiments_dir": str(REPO / "experiments"), "logger": "wandb"})  # = wandb=true
    artifacts = [a for _, r in _finished_runs(tmp_path, 3) for a in r["artifacts"] if a["type"] == "table"]
    assert len(artifacts) == 1
    assert {"demo/copy.md", "demo/copy.png"} <= set(artifacts[0]["files"])
    with pytest.raises(TableError, match="logger must be wandb"):
        build_tables({"table": "summary", "runs": str(tmp_path / "runs"), "logger": "csv"})

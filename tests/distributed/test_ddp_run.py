"""A real two-process DDP run (``hardware=ddp_sim``, gloo on CPU) in the default tier: Lightning's child must
start in rank 0's run folder (issue 42: every multi-process run died at launch on the folder lock, and the
test sat in the slow tier that CI does not run). About 15 seconds."""

from __future__ import annotations

from attnlab.results.record import read_record, validate_record
from tests.test_slow import SMALL, _train


def test_ddp_sim_two_cpu_processes(tmp_path):
    """hardware=ddp_sim really starts two gloo processes; rank 0 alone writes one run folder and record."""
    run_dir = tmp_path / "run"
    proc = _train([*SMALL, "hardware=ddp_sim", "hardware.max_batch_per_device=8", f"hydra.run.dir={run_dir}"],
                  tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = read_record(run_dir / "results.json")
    assert validate_record(record) == []
    assert record["hardware"]["devices"] == 2 and record["status"] == "completed"
    assert record["cost"]["steps"] == 6
    assert record["metrics"]["final"]["test/seq_acc"] is not None
    # one run folder only: the second process reuses the first one's folder (no duplicate outputs)
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == ["run"]
    # one writer per log file: rank 0's train.log holds the run's lines once, the child logs beside it
    assert sorted(p.name for p in run_dir.glob("*.log")) == ["train.log", "train.node0-local1.log"]
    assert (run_dir / "train.log").read_text().count("run folder: ") == 1

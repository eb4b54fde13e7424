"""`make rerun`: one published record rerun with its recorded command, compared with its cell's spread.

The trainer is replaced by a fake that writes the record a real rerun would write, so these tests check the
plumbing and the verdicts: the command that would run, which records form the cell, and the rule.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from attnlab.results.rerun import (
    IDENTICAL,
    OUTSIDE,
    WITHIN_RANGE,
    WITHIN_STD,
    RerunError,
    main,
    rerun_command,
    rerun_record,
)
from tests.results.conftest import make_record

COMMAND = (
    "attnlab-train experiment=demo/copy/vanilla seed={seed} scale=cpu hardware=cpu paths.runs_dir=runs "
    "hardware.torch_threads=1"
)


def _publish(root: Path, seed: int, seq_acc: float, config_hash: str = "ab" * 32, **overrides) -> Path:
    """A published record of the demo cell (seed ``seed``) with its resolved config beside it."""
    run = root / "demo" / "copy" / "vanilla" / f"s{seed}-{config_hash[:12]}"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text(f"seed: {seed}\ntrainer:\n  max_steps: {overrides.pop('steps', 800)}\n")
    record = make_record(
        **{
            "seed": seed,
            "config_hash": config_hash,
            "command": COMMAND.format(seed=seed),
            "metrics.final": {"test/seq_acc": seq_acc, "test/char_acc": 0.9},
            **overrides,
        }
    )
    (run / "results.json").write_text(json.dumps(record))
    return run


class FakeTrainer:
    """Stands in for attnlab-train: records the argv and writes a completed record into paths.runs_dir."""

    def __init__(self, seq_acc: float, config_hash: str = "ab" * 32, code: int = 0):
        self.seq_acc, self.config_hash, self.code, self.argv = seq_acc, config_hash, code, None

    def __call__(self, argv: list[str]) -> int:
        self.argv = argv
        runs = Path(next(a.split("=", 1)[1] for a in argv if a.startswith("paths.runs_dir=")))
        if self.code == 0:
            out = runs / "2026-12-02" / "0-run"
            out.mkdir(parents=True)
            record = make_record(
                **{
                    "config_hash": self.config_hash,
                    "metrics.final": {"test/seq_acc": self.seq_acc, "test/char_acc": 0.9},
                }
            )
            (out / "results.json").write_text(json.dumps(record))
        return self.code


@pytest.fixture
def cell(tmp_path):
    """Three seeds of one cell (seq acc 0.40 / 0.50 / 0.60: mean 0.5, std 0.1) and a run of another config."""
    root = tmp_path / "results" / "runs"
    runs = [_publish(root, s, v) for s, v in ((1, 0.4), (2, 0.5), (3, 0.6))]
    _publish(root, 4, 0.99, config_hash="cd" * 32, steps=5000)  # same experiment, another configuration
    return root, runs


def test_the_recorded_command_runs_with_a_fresh_runs_folder_and_this_environments_trainer(tmp_path):
    argv = rerun_command(COMMAND.format(seed=2), tmp_path / "out", train_executable="/venv/bin/attnlab-train")
    assert argv[0] == "/venv/bin/attnlab-train"
    assert "paths.runs_dir=runs" not in argv and argv[-1] == f"paths.runs_dir={tmp_path / 'out'}"
    assert argv[1:-1] == shlex.split(COMMAND.format(seed=2))[1:-2] + ["hardware.torch_threads=1"]


@pytest.mark.parametrize(
    "command",
    ["python train.py seed=1", "attnlab-train -m experiment=a,b seed=1,2", ""],
)
def test_a_command_that_is_not_one_attnlab_train_run_is_refused(command, tmp_path):
    with pytest.raises(RerunError):
        rerun_command(command, tmp_path)


@pytest.mark.parametrize(
    ("rerun_value", "verdict", "ok"),
    [
        (0.5, IDENTICAL, True),
        (0.45, WITHIN_STD, True),
        (0.58, WITHIN_STD, True),
        (0.39, OUTSIDE, False),
        (0.7, OUTSIDE, False),
    ],
)
def test_the_verdict_compares_with_the_same_seed_then_the_cells_mean_and_std(cell, tmp_path, rerun_value, verdict, ok):
    root, runs = cell
    fake = FakeTrainer(rerun_value)
    lines, inside = rerun_record(runs[1], root, tmp_path / "out", runner=fake)
    assert inside is ok
    seq = next(line for line in lines if line.startswith("test/seq_acc"))
    # the other configuration's seed (0.99, 5000 steps) is not part of the cell: n=3, mean 0.5, std 0.1
    assert "n=3" in seq and "0.5 +- 0.1 " in seq and seq.endswith(verdict)
    assert "config: the same resolved configuration" in "\n".join(lines)


def test_a_value_outside_mean_std_but_inside_the_seeds_range_is_reported_but_not_ok(tmp_path):
    root = tmp_path / "runs"
    runs = [_publish(root, s, v) for s, v in ((1, 0.1), (2, 0.5), (3, 0.52), (4, 0.9))]  # mean 0.505, std ~0.33
    lines, inside = rerun_record(runs[1], root, tmp_path / "out", runner=FakeTrainer(0.86))
    assert not inside and next(x for x in lines if x.startswith("test/seq_acc")).endswith(WITHIN_RANGE)


def test_a_rerun_that_resolves_another_configuration_says_so(cell, tmp_path):
    root, runs = cell
    lines, _ = rerun_record(runs[0], root, tmp_path / "out", runner=FakeTrainer(0.4, config_hash="ef" * 32))
    assert any(line.startswith("config: DIFFERENT resolved configuration") for line in lines)


def test_a_failed_rerun_is_one_line_with_a_nonzero_exit(cell, tmp_path, monkeypatch, capsys):
    root, runs = cell
    monkeypatch.setattr("attnlab.results.rerun._run", FakeTrainer(0.5, code=1))
    assert main([str(runs[0]), "--published", str(root), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "the rerun failed (exit 1)" in err


def test_main_exits_1_when_the_rerun_lands_outside(cell, tmp_path, monkeypatch, capsys):
    root, runs = cell
    monkeypatch.setattr("attnlab.results.rerun._run", FakeTrainer(0.2))
    assert main([str(runs[0]), "--published", str(root), "--out", str(tmp_path / "out")]) == 1
    assert "OUTSIDE the reported spread" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("status", "needle"),
    [("failed", "not completed"), ("running", "not completed")],
)
def test_a_record_that_did_not_complete_is_refused(tmp_path, status, needle):
    run = _publish(tmp_path / "runs", 1, 0.5, status=status, error="boom" if status == "failed" else None)
    with pytest.raises(RerunError, match=needle):
        rerun_record(run, tmp_path / "runs", tmp_path / "out", runner=FakeTrainer(0.5))


def test_a_missing_record_and_a_missing_metric_are_refused(cell, tmp_path):
    root, runs = cell
    with pytest.raises(RerunError, match="no run record"):
        rerun_record(tmp_path / "nowhere", root, tmp_path / "out", runner=FakeTrainer(0.5))
    with pytest.raises(RerunError, match="no numeric final metric test/bleu"):
        rerun_record(runs[0], root, tmp_path / "out", metrics=["test/bleu"], runner=FakeTrainer(0.5))


def test_an_out_folder_that_already_holds_records_is_refused(cell, tmp_path):
    root, runs = cell
    with pytest.raises(RerunError, match="already holds run records"):
        rerun_record(runs[0], root, root, runner=FakeTrainer(0.5))

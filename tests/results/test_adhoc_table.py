"""``attnlab-table runs=<folder> by=<keys> claim="A > B on M"`` (issue 52.4): a sweep compared without a spec."""

from __future__ import annotations

import statistics

import pytest
import yaml

from attnlab.cli.table import build_tables
from attnlab.errors import TableError

# seq_acc per (attention, seed): well apart for qknorm vs vanilla, overlapping for synth_dense vs vanilla
VALUES = {("vanilla", 1): 0.50, ("vanilla", 2): 0.54, ("vanilla", 3): 0.52,
          ("qknorm", 1): 0.90, ("qknorm", 2): 0.92, ("qknorm", 3): 0.91,
          ("synth_dense", 1): 0.49, ("synth_dense", 2): 0.55, ("synth_dense", 3): 0.53}


@pytest.fixture
def sweep(workspace, put_record):
    for (attention, seed), value in VALUES.items():
        put_record(f"{attention}-s{seed}", seed=seed, **{"model.attention": attention,
                                                        "metrics.final": {"test/seq_acc": value}})
    return workspace


def _table(capsys, runs, **cfg) -> str:
    build_tables({"runs": str(runs), "by": "model.attention", **cfg})
    return capsys.readouterr().out


def _row(md: str, label: str) -> list[str]:
    line = next(x for x in md.splitlines() if x.startswith(f"| {label} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_rows_are_the_values_of_the_by_key_with_mean_and_std_over_seeds(sweep, capsys):
    md = _table(capsys, sweep / "runs")
    for attention in ("qknorm", "synth_dense", "vanilla"):
        values = [VALUES[(attention, s)] for s in (1, 2, 3)]
        cell = _row(md, f"model.attention={attention}")[1]
        assert cell == f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f} (n=3)"
    assert not (sweep / "results").exists()  # printed, nothing written


def test_a_claim_on_the_command_line_is_decided_over_the_seeds(sweep, capsys):
    md = _table(capsys, sweep / "runs", claim="qknorm > vanilla on test/seq_acc")
    assert "qknorm > vanilla on test/seq_acc" in md and "**held**" in md
    md = _table(capsys, sweep / "runs", claim="vanilla > qknorm on test/seq_acc")
    assert "**not held**" in md
    md = _table(capsys, sweep / "runs", claim="synth_dense > vanilla on test/seq_acc")
    assert "**inconclusive**" in md
    with pytest.raises(TableError, match="claim names row 'lstm'"):
        _table(capsys, sweep / "runs", claim="lstm > vanilla on test/seq_acc")
    with pytest.raises(TableError, match='write it as "A > B on METRIC"'):
        _table(capsys, sweep / "runs", claim="qknorm beats vanilla")


def test_runs_of_two_configurations_in_one_row_are_refused(sweep, put_record, capsys):
    other = put_record("vanilla-longer", seed=4, **{"model.attention": "vanilla",
                                                     "metrics.final": {"test/seq_acc": 0.6}})
    hydra = other.parent / ".hydra"
    hydra.mkdir()
    for seed in (1, 2, 3):
        (sweep / "runs" / f"vanilla-s{seed}" / ".hydra").mkdir()
        (sweep / "runs" / f"vanilla-s{seed}" / ".hydra" / "config.yaml").write_text(yaml.safe_dump(
            {"seed": seed, "trainer": {"max_steps": 800}}))
    (hydra / "config.yaml").write_text(yaml.safe_dump({"seed": 4, "trainer": {"max_steps": 1600}}))
    with pytest.raises(TableError, match="trainer.max_steps"):
        _table(capsys, sweep / "runs")


def test_a_key_the_runs_do_not_have_is_one_line(sweep, capsys):
    with pytest.raises(TableError, match="by=optim.lr: .* has no value for optim.lr"):
        build_tables({"runs": str(sweep / "runs"), "by": "optim.lr"})


def test_a_claim_typed_as_in_the_shell_reaches_the_table():
    """`attnlab-table ... claim="qknorm > vanilla on test/seq_acc"`: the shell drops the quotes, Hydra's grammar
    refuses the bare spaces and ">"; the command line quotes the value for it."""
    from attnlab.cli.table import _quoted_claim
    from attnlab.training.compose import compose

    typed = "claim=qknorm's > vanilla on test/seq_acc"
    assert compose("table", [_quoted_claim(typed), "by=model.attention"]).claim == typed.split("=", 1)[1]
    assert _quoted_claim("claim='already quoted'") == "claim='already quoted'"
    assert _quoted_claim("runs=a b") == "runs=a b"


def test_a_metric_the_runs_keep_only_as_best_is_read_from_there(workspace, put_record, capsys):
    """A run record keeps its validation metrics under metrics.best only (final holds the test splits), so the
    val/loss of a search's trials (the value their sweeper got) was shown missing. The column reads it there and
    says so; a claim can name it."""
    for lr, losses in (("0.001", (2.8, 2.9)), ("0.003", (2.40, 2.42))):
        for seed, loss in enumerate(losses, 1):
            put_record(f"lr{lr}-s{seed}", seed=seed, **{"model.attention": lr, "metrics.final": {"test/seq_acc": 0.1},
                                                        "metrics.best": {"val/loss": loss}})
    md = _table(capsys, workspace / "runs", metrics=["val/loss", "test/seq_acc"], claim="0.003 < 0.001 on val/loss")
    assert "val/loss (best)" in md and "missing" not in md
    assert _row(md, "model.attention=0.003")[1] == "2.4100 ± 0.0141 (n=2)"
    assert _row(md, "model.attention=0.001")[2].startswith("0.1000")  # test/seq_acc stays the final value
    assert "0.003 < 0.001 on val/loss" in md

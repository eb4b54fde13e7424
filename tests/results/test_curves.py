"""Learning curves from the runs' CSV logs (issue 52.3): grouped by config keys, mean and band over seeds,
resumed segments joined, a log axis for losses, PNG and SVG."""

from __future__ import annotations

import pytest

from attnlab.results import curves
from attnlab.results.loading import load_records

HEADER = "epoch,step,train/loss,val/loss,val/seq_acc\n"


def _log(run_dir, rows: list[tuple[int, float]]) -> None:
    (run_dir / "csv").mkdir(parents=True)
    text = HEADER + "".join(f"0,{step},,{loss},\n" for step, loss in rows)
    (run_dir / "csv" / "metrics.csv").write_text(text)


@pytest.fixture
def runs(workspace, put_record):
    for attention, seed, losses in (("vanilla", 1, (4.0, 2.0, 1.0)), ("vanilla", 2, (6.0, 3.0, 2.0)),
                                    ("qknorm", 1, (3.0, 1.5, 0.5))):
        record = put_record(f"{attention}-s{seed}", seed=seed, **{"model.attention": attention})
        _log(record.parent, [(10, losses[0]), (20, losses[1]), (30, losses[2])])
    # a resumed run: killed after step 20 (checkpoint at 10), its second segment logged 20 again and went on
    resumed = put_record("synth-s1", seed=1, **{"model.attention": "synth_dense"})
    _log(resumed.parent, [(10, 5.0), (20, 9.9), (20, 4.0), (30, 3.0)])
    return workspace / "runs"


def test_curves_are_the_mean_and_range_over_seeds_per_group(runs):
    records, _ = load_records([runs])
    built = {c.label: c for c in curves.build_curves(records, "val/loss", ["model.attention"])}
    vanilla = built["model.attention=vanilla"]
    assert vanilla.steps == [10, 20, 30] and vanilla.seeds == 2
    assert vanilla.mean == [5.0, 2.5, 1.5] and vanilla.low == [4.0, 2.0, 1.0] and vanilla.high == [6.0, 3.0, 2.0]
    assert built["model.attention=qknorm"].mean == [3.0, 1.5, 0.5]
    # the resumed run's segments join: step 20 keeps the value of the segment that went on
    assert built["model.attention=synth_dense"].mean == [5.0, 4.0, 3.0]


def test_png_and_svg_are_written_with_a_log_axis_for_losses(runs, tmp_path):
    written = curves.write_curves([str(runs)], "val/loss", ["model.attention"], tmp_path / "out" / "val_loss")
    png, svg = written
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "<svg" in svg.read_text()
    assert "val/loss (log scale)" in svg.read_text() or "log scale" in svg.read_text()
    assert curves.log_axis("val/loss") and curves.log_axis("train/nll") and not curves.log_axis("val/seq_acc")


def test_a_metric_no_run_logged_is_one_line(runs, capsys):
    assert curves.main([str(runs), "--metric", "val/bleu", "--out", str(runs.parent / "c")]) == 2
    assert "no run under the given folders logged val/bleu" in capsys.readouterr().err

"""Figures a reader can read: panels wrap, one legend outside the panels, zero differs from missing,
perplexity on a log axis, no figure for a table without runs."""

from __future__ import annotations

import json
import struct

import yaml

from attnlab.cli.table import build_tables
from attnlab.results.build import build_table
from attnlab.results.loading import load_records
from attnlab.results.paper import load_paper_tables
from attnlab.results.render import render_all
from attnlab.results.render.png import _log_axis, bar_labels, render_png
from attnlab.results.spec import load_spec
from tests.conftest import REPO
from tests.results.conftest import SPEC

WIDE = {**SPEC, "metrics": [{"ours": f"test/m{i}", "label": f"Metric {i}"} for i in range(12)]
        + [{"ours": "test/ppl", "label": "Test ppl", "direction": "lower"}]}  # fmt: skip


def _png_size(data: bytes) -> tuple[int, int]:
    return struct.unpack(">II", data[16:24])


def _built(ws, spec):
    (ws / "experiments" / "toy" / "t1.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    records, corrupt = load_records([ws / "runs"])
    return build_table(load_spec("toy/t1", ws / "experiments"), records, load_paper_tables(), corrupt)


def test_a_wide_table_wraps_and_zero_is_not_missing(workspace, put_record, tmp_path):
    metrics = {f"test/m{i}": 0.1 * i for i in range(12)} | {"test/ppl": 350.0}
    put_record("t", seed=1, **{"metrics.final": metrics})  # Transformer; the UT rows have no runs
    built = _built(workspace, WIDE)
    png = render_png(built)
    width, height = _png_size(png)
    assert width <= 1400 and height > width / 2, (width, height)  # 14 panels in a 3-wide grid, not a strip
    assert bar_labels(built, 0) == ["0.00", "missing", "missing"]  # a zero bar is labelled 0, no bar is "missing"
    assert _log_axis(built.spec.metrics[-1]) and not _log_axis(built.spec.metrics[0])
    (tmp_path / "look.png").write_bytes(png)  # opened and looked at while writing this test


def test_no_runs_no_figure_and_a_stale_one_is_removed(workspace, put_record):
    built = _built(workspace, SPEC)
    assert not any(p.suffix == ".png" for p in render_all(built, workspace / "out"))
    stale = workspace / "out" / "toy" / "t1.png"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"\x89PNG old")
    cfg = {"table": "toy/t1", "experiments_dir": str(workspace / "experiments"), "runs": str(workspace / "runs"),
           "out": str(workspace / "out")}  # fmt: skip
    build_tables(cfg)
    assert not stale.exists() and (workspace / "out" / "toy" / "t1.md").exists()


def test_ponder_notebook_never_trains_and_shows_figures_inline():
    nb = json.loads((REPO / "notebooks" / "ponder_heatmaps.ipynb").read_text())
    code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    assert "%matplotlib inline" in code and "plt.show()" in code and 'use("Agg")' not in code
    for training in ("subprocess", "attnlab.train", "attnlab-train", ".fit("):
        assert training not in code, f"the notebook must only read runs, found {training!r}"

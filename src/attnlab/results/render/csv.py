"""The tidy CSV (one line per row and metric, numbers unformatted) for notebooks and diffs."""

from __future__ import annotations

import csv
import io

from attnlab.results.build import BuiltTable, diff_value
from attnlab.results.render.common import rel


def render_csv(built: BuiltTable) -> str:
    """Tidy CSV: one line per (row, metric), numbers unformatted, for notebooks and diffs."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(
        [
            "row", "metric", "label", "direction", "paper", "paper_confidence", "paper_status",
            "ours_mean", "ours_std", "n", "diff", "status", "note",
            "params_total", "tokens_per_s", "peak_mem_mb", "wall_s", "run_dirs",
        ]
    )  # fmt: skip
    for row in built.rows:
        for m, cell, paper in zip(built.spec.metrics, row.cells, row.paper):
            d = diff_value(cell, paper)
            w.writerow(
                [
                    row.spec.label,
                    m.ours,
                    m.label,
                    m.direction,
                    "" if paper.kind != "value" else paper.value,
                    paper.confidence or "",
                    {"value": "ok", "null": "n/a", "not_in_paper": "not_in_paper", "not_found": "not_found"}[
                        paper.kind
                    ],
                    "" if cell.stat is None else repr(cell.stat.mean),
                    "" if cell.stat is None or cell.stat.std is None else repr(cell.stat.std),
                    0 if cell.stat is None else cell.stat.n,
                    "" if d is None else repr(d),
                    cell.kind,
                    cell.note,
                    "" if row.params is None else repr(row.params.mean),
                    "" if row.tokens_per_s is None else repr(row.tokens_per_s.mean),
                    "" if row.peak_mem_mb is None else repr(row.peak_mem_mb.mean),
                    "" if row.wall_s is None else repr(row.wall_s.mean),
                    ";".join(rel(r.path) for r in row.used),
                ]
            )
    return buf.getvalue()

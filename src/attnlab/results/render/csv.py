"""The tidy CSV (one line per row and metric, numbers unformatted) for notebooks and diffs."""

from __future__ import annotations

import csv
import io

from attnlab.results.build import BuiltTable, diff_value
from attnlab.results.render.common import rel, visible_controls

# A spreadsheet evaluates a cell that starts with one of these as a formula (OWASP "CSV injection"); a
# leading tab or carriage return hides such a start from a naive check, so it is quoted too.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_text(text: object) -> str:
    """A text cell from a spec or record, inert in a spreadsheet: on one line, and prefixed with ``'`` when it
    would start a formula (numbers are written with repr, never through this)."""
    text = visible_controls(text)
    return "'" + text if text.startswith(_FORMULA_START) else text


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
                    csv_text(row.spec.label),
                    csv_text(m.ours),
                    csv_text(m.label),
                    m.direction,
                    "" if paper.kind != "value" else _paper_value(paper.value),
                    paper.confidence or "",
                    {"value": "ok", "null": "n/a", "not_in_paper": "not_in_paper", "not_found": "not_found"}[
                        paper.kind
                    ],
                    "" if cell.stat is None else repr(cell.stat.mean),
                    "" if cell.stat is None or cell.stat.std is None else repr(cell.stat.std),
                    0 if cell.stat is None else cell.stat.n,
                    "" if d is None else repr(d),
                    cell.kind,
                    csv_text(cell.note),
                    "" if row.params is None else repr(row.params.mean),
                    "" if row.tokens_per_s is None else repr(row.tokens_per_s.mean),
                    "" if row.peak_mem_mb is None else repr(row.peak_mem_mb.mean),
                    "" if row.wall_s is None else repr(row.wall_s.mean),
                    csv_text(";".join(rel(r.path) for r in row.used)),
                ]
            )
    return buf.getvalue()


def _paper_value(value: object) -> object:
    """A published number as it is (a negative one stays a number); a text value is a text cell."""
    return value if isinstance(value, (int, float)) else csv_text(value)

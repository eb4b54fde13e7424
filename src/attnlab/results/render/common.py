"""Formatting shared by the renderers: numbers, cells, the header and body of a table, its sources."""

from __future__ import annotations

import math
import re
from pathlib import Path

from attnlab.results.build import NOT_IN_PAPER, BuiltTable, Cell, PaperCell, diff_value
from attnlab.results.paper import NOT_FOUND
from attnlab.results.stats import Stat

CONFIDENCE_MARK = {"double-checked": "(d)", "single-source": "(s)", "uncertain": "(u)"}
MISSING = "missing"


def total_wall_s(records) -> float:
    """The summed wall seconds of run records (a record without one counts 0): the compute behind a table."""
    walls = (float((rec.data.get("cost") or {}).get("wall_s") or 0.0) for rec in records)
    return sum(w for w in walls if math.isfinite(w))  # a NaN or Infinity is no time spent (build._cost_stat)


def fmt_num(x: float, digits: int) -> str:
    return f"{x:.{digits}f}"


def fmt_count(n: float) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.2f}B"
    if n >= 1e6:
        return f"{n / 1e6:.2f}M"
    if n >= 1e3:
        return f"{n / 1e3:.1f}K"
    return f"{n:.0f}"


def fmt_stat(stat: Stat | None, digits: int, with_n: bool = True) -> str:
    if stat is None:
        return MISSING
    text = fmt_num(stat.mean, digits)
    if stat.std is not None:
        text += f" ± {fmt_num(stat.std, digits)}"
    return text + (f" (n={stat.n})" if with_n else "")


def fmt_cell(cell: Cell, digits: int) -> str:
    if cell.kind == "ok":
        return fmt_stat(cell.stat, digits) + (f" [{cell.note}]" if cell.note else "")
    if cell.kind == "failed":
        return f"failed ({cell.note})"
    if cell.kind == "missing":
        return MISSING + (f" ({cell.note})" if cell.note else "")
    return cell.kind


def fmt_paper(cell: PaperCell, digits: int) -> str:
    mark = CONFIDENCE_MARK.get(cell.confidence or "", "")
    if cell.kind == "not_found":
        return NOT_FOUND
    if cell.kind == "not_in_paper":
        return NOT_IN_PAPER
    if cell.kind == "null":
        return "n/a"
    v = cell.value
    if isinstance(v, float):
        # Keep the published precision when it is finer than ours (27.675 stays 27.675, 27.3 -> 27.30).
        text = repr(v) if len(repr(v).rsplit(".", 1)[-1]) > digits else fmt_num(v, digits)
    else:
        text = str(v)
    return f"{text} {mark}".strip()


def fmt_diff(d: float | None, digits: int) -> str:
    return "" if d is None else f"{d:+.{digits}f}"


def header_and_rows(built: BuiltTable) -> tuple[list[str], list[list[str]]]:
    """The table as display strings (shared by the md and tex writers)."""
    header = ["Row"]
    for m in built.spec.metrics:
        arrow = "↑" if m.direction == "higher" else "↓"
        if built.has_paper and m.paper_key:
            header += [f"{m.label} {arrow} paper", f"{m.label} ours", *(["Δ"] if built.show_diff else [])]
        else:  # ours alone: a table without a paper, or a column the paper has no number for
            header += [f"{m.label} {arrow}" + (" ours" if built.has_paper else "")]
    header += ["Params", "Tokens/s", "Peak mem (MB)", "Wall (s)"]
    body = []
    for row in built.rows:
        cells = [row.spec.label]
        for m, cell, paper in zip(built.spec.metrics, row.cells, row.paper):
            if built.has_paper and m.paper_key:  # a column the paper has no number for is ours alone
                cells += [fmt_paper(paper, m.digits), fmt_cell(cell, m.digits)]
                if built.show_diff:
                    cells.append(fmt_diff(diff_value(cell, paper), m.digits))
            else:
                cells.append(fmt_cell(cell, m.digits))
        have = bool(row.used)
        cells += [
            fmt_count(row.params.mean) if row.params else (MISSING if not have else "n/a"),
            fmt_num(row.tokens_per_s.mean, 0) if row.tokens_per_s else (MISSING if not have else "n/a"),
            fmt_num(row.peak_mem_mb.mean, 0) if row.peak_mem_mb else (MISSING if not have else "n/a"),
            fmt_num(row.wall_s.mean, 1) if row.wall_s else (MISSING if not have else "n/a"),
        ]
        body.append(cells)
    return header, body


def source_lines(built: BuiltTable) -> list[tuple[str, list[str]]]:
    out = []
    for row in built.rows:
        lines = []
        for tag, recs in (
            ("", row.used),
            ("failed", row.failed),
            ("unfinished", row.unfinished),
            ("superseded", row.superseded),
        ):
            for r in recs:
                d = r.data
                what = f"seed {d.get('seed')}, {d.get('status')}, config {str(d.get('config_hash'))[:12]}"
                if tag == "superseded":
                    what += ", superseded by a newer or better record of the same seed"
                lines.append(f"{md_code(rel(r.path))} ({md_escape(what)}): {md_code(d.get('command'))}")
        for c in row.corrupt:
            lines.append(f"{md_code(c.path)} (corrupt): {md_escape(c.message)}")
        out.append((row.spec.label, lines))
    return out


# Characters that end a line, or that a terminal or renderer acts on, in some format a table lands in
# (Markdown, TeX, CSV, a plot label): a text from a record shows them as escapes and stays on its line.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


# CommonMark starts raw HTML (tags, comments, declarations, processing instructions) and autolinks only at a
# "<" followed by a letter, "/", "!" or "?".
_TAG_OPEN = re.compile(r"<(?=[A-Za-z/!?])")


def visible_controls(text: object) -> str:
    """``text`` on one line: each control or line-separator character shown as its escape (``\\n``, ``\\x00``),
    so a newline or carriage return in a record can neither split a table row nor end a TeX comment."""
    return _CONTROL.sub(lambda m: ascii(m.group())[1:-1], str(text))


def md_escape(text: object) -> str:
    """A record's or spec's text as literal Markdown inline text: on one line, no cell split (``|``), and no
    raw HTML or autolink (a ``<`` that could open a tag, comment or link becomes ``&lt;``, so ``<script>`` or
    ``<img onerror=...>`` is shown, never run; ``<= 5`` stays as it is)."""
    return _TAG_OPEN.sub("&lt;", visible_controls(text).replace("|", "\\|"))


def md_code(text: object) -> str:
    """``text`` as one Markdown code span: fenced by more backticks than its longest run of them (CommonMark),
    so a backtick inside cannot close the span and leave what follows live."""
    text = visible_controls(text)
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def rel(path: Path) -> str:
    try:
        return str(path.parent.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path.parent)

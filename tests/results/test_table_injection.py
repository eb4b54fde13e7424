"""Issue 54 C: a hostile record or spec cannot inject into a generated table, in any format it lands in.

Each check reads the rendered file the way its consumer would, with the consumer's rules written here
independently of the renderers: CommonMark's line endings, code spans and raw-HTML starts for Markdown; TeX's
line ends and comments; a spreadsheet's formula starts for CSV; matplotlib's mathtext for the PNG labels.
"""

from __future__ import annotations

import csv
import io
import re

import yaml

from attnlab.cli.table import build_tables
from attnlab.results.loading import load_records
from attnlab.results.render import render_summary
from tests.results.conftest import SPEC

# A newline and a carriage return (end a Markdown row / a TeX comment), raw HTML, a backtick that would
# close a code span, TeX commands, a pipe, and a formula start.
EVIL_COMMAND = (
    "attnlab-train x=`</code><img src=x onerror=alert(1)>` y=1|2\r\\input{/etc/passwd}\n<script>alert(2)</script>"
)
# An experiment name with a control character is no valid record (refused by name, test_hostile_files.py).
EVIL_NAME = "demo <script>alert(3)</script>|x `\\input{/etc/shadow}`"
EVIL_ERROR = "=HYPERLINK(\"http://evil\",\"click\") <img src=x onerror=alert(4)>"
EVIL_LABEL = "@SUM(A1)$\\notacommand{$\n<b>bold</b>"

# CommonMark: raw HTML (tags, comments, declarations, instructions) and autolinks open at these.
HTML_START = re.compile(r"<[A-Za-z/!?]")


def _hostile_workspace(workspace, put_record, plot=False):
    spec = {**SPEC, "title": "Toy $\\badmath{ table", "rows": [dict(r) for r in SPEC["rows"]]}
    spec["rows"][0]["label"] = EVIL_LABEL
    spec["metrics"] = [dict(m) for m in SPEC["metrics"]]
    spec["metrics"][0]["label"] = "-Seq $\\frac{ acc"
    (workspace / "experiments" / "toy" / "t1.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    put_record("evil", experiment=EVIL_NAME, command=EVIL_COMMAND,
               **{"hardware.name": "cpu\n<iframe src=x>",
                  "metric_flavours": {"accuracy": "`<img src=x onerror=alert(5)>`\r\\input{x}"}})
    put_record("evil_failed", status="failed", error=EVIL_ERROR, seed=2, command=EVIL_COMMAND,
               **{"model.recurrence": "ut"})
    out = workspace / "out"
    build_tables({"table": "toy/t1", "experiments_dir": str(workspace / "experiments"), "runs": str(workspace / "runs"),
                  "out": str(out), "plot": plot})
    return out / "toy"


def _commonmark_lines(text: str) -> list[str]:
    return re.split(r"\r\n|\r|\n", text)


def _outside_code_spans(line: str) -> str:
    """``line`` with its code spans removed (CommonMark 6.1: a run of n backticks opens a span that only a run of
    exactly n backticks closes; an unmatched run is literal)."""
    out, i = [], 0
    while i < len(line):
        if line[i] != "`":
            out.append(line[i])
            i += 1
            continue
        n = len(re.match(r"`+", line[i:]).group())
        closing = re.compile(rf"(?<!`)`{{{n}}}(?!`)").search(line, i + n)
        if closing is None:
            out.append("`" * n)
            i += n
        else:
            i = closing.end()
    return "".join(out)


def _table_cells(line: str) -> list[str]:
    """A GFM table row split at its pipes that are neither backslash-escaped nor inside a code span."""
    return re.split(r"(?<!\\)\|", _outside_code_spans(line).strip().strip("|"))


def test_markdown_table_keeps_its_shape_and_runs_no_html(workspace, put_record):
    md = (_hostile_workspace(workspace, put_record) / "t1.md").read_text()
    lines = _commonmark_lines(md)
    for line in lines:  # no raw HTML anywhere a Markdown renderer would act on it
        assert not HTML_START.search(_outside_code_spans(line)), line
    table = [ln for ln in lines if ln.startswith("|")]
    assert len(table) == 2 + len(SPEC["rows"])  # header, rule, one line per row: nothing split a row
    widths = {len(_table_cells(ln)) for ln in table}
    assert len(widths) == 1, table
    sources = [ln for ln in lines if "onerror" in ln and ln.lstrip().startswith("- `")]
    assert sources, md  # the command is shown, as text inside one code span
    for line in sources:
        assert "onerror" not in _outside_code_spans(line)


def test_summary_of_a_hostile_record_is_one_row_per_record(workspace, put_record):
    put_record("evil", experiment=EVIL_NAME, command=EVIL_COMMAND,
               **{"metrics.final": {"test/<img src=x onerror=alert(6)>": 1.0}})
    put_record("plain")
    records, corrupt = load_records([workspace / "runs"])
    lines = _commonmark_lines(render_summary(records, corrupt).rstrip("\n"))
    assert len(lines) == 2 + 2
    assert len({len(_table_cells(ln)) for ln in lines}) == 1
    assert not any(HTML_START.search(_outside_code_spans(ln)) for ln in lines), lines


def _tex_uncommented(line: str) -> str:
    """The part of one TeX input line that TeX reads: up to the first ``%`` not escaped by a backslash."""
    m = re.search(r"(?<!\\)(?:\\\\)*%", line)
    return line if m is None else line[: m.start()]


def test_tex_runs_no_command_from_a_record(workspace, put_record):
    tex = (_hostile_workspace(workspace, put_record) / "t1.tex").read_text()
    lines = re.split(r"\r\n|\r|\n", tex)  # TeX ends an input line at any of these
    read = "\n".join(_tex_uncommented(ln) for ln in lines)
    for command in ("\\input", "\\notacommand", "\\badmath", "\\frac"):
        assert command not in read.replace("\\textbackslash{}", ""), command
    assert read.count("\\begin{tabular}") == 1 and read.count("\\end{tabular}") == 1
    assert all(ln.startswith("%") for ln in lines if "etc/passwd" in ln)  # the command stays in its comment
    assert not any(ln.strip() == "" for ln in lines[:-1])  # no blank line: a \par inside the tabular


def test_csv_cells_are_inert_in_a_spreadsheet(workspace, put_record):
    text = (_hostile_workspace(workspace, put_record) / "t1.csv").read_text()
    rows = list(csv.reader(io.StringIO(text)))
    assert len(rows) == 1 + len(SPEC["rows"]) * len(SPEC["metrics"])
    for row in rows:
        for cell in row:
            try:
                float(cell)  # a number is a number to a spreadsheet, negative ones included
            except ValueError:
                assert not cell.startswith(("=", "+", "-", "@", "\t", "\r")), cell
    labels = {row[0] for row in rows[1:]}
    assert any(label.startswith("'@SUM(A1)") for label in labels), labels  # shown, quoted, not dropped


def test_png_is_drawn_with_hostile_labels(workspace, put_record):
    # "$\notacommand{$" is mathtext that matplotlib cannot parse: read as math, it fails the whole figure.
    png = _hostile_workspace(workspace, put_record, plot=True) / "t1.png"
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")

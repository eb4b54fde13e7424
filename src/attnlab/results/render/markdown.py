"""The markdown table (results/<paper>/<table>.md): caption, table, footnotes, claims, the runs behind each row."""

from __future__ import annotations

from attnlab.results.build import BuiltTable
from attnlab.results.render.claims import claims_section
from attnlab.results.render.common import header_and_rows, md_code, md_escape, source_lines


def render_markdown(built: BuiltTable) -> str:
    header, body = header_and_rows(built)
    lines = [f"# {md_escape(built.spec.title)}", "", f"Table {md_code(built.spec.name)}.", ""]
    lines += [f"- **{md_escape(label)}**: {md_escape(text).rstrip('.')}." for label, text in built.caption_lines] + [""]
    lines.append("| " + " | ".join(md_escape(h) for h in header) + " |")
    lines.append("|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|")
    for cells in body:
        lines.append("| " + " | ".join(md_escape(c) for c in cells) + " |")
    lines.append("")
    if built.footnotes:
        lines += [f"- {md_escape(n)}" for n in built.footnotes] + [""]
    lines += claims_section(built)
    lines += ["## Sources", ""]
    for label, srcs in source_lines(built):
        lines.append(f"- **{md_escape(label)}**" + (": no run records" if not srcs else ""))
        lines += [f"  - {s}" for s in srcs]
    if built.corrupt_unplaced:
        lines += ["", "## Corrupt run records (not placed in any row)", ""]
        lines += [f"- {md_escape(c.message)}" for c in built.corrupt_unplaced]
    return "\n".join(lines) + "\n"

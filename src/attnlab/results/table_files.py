"""The files of a table build beyond the tables themselves: README blocks filled with generated tables and claims,
the check that committed table files match the run records, and the refusal to overwrite published tables with
tables of scratch runs. ``attnlab-table`` (``cli/table.py``) builds, then calls these.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attnlab.errors import TableError
from attnlab.results.render import render_markdown
from attnlab.results.render.claims import render_paper_claims

TABLE_SUFFIXES = (".md", ".csv", ".tex", ".png")
CLAIMS_FILENAME = "CLAIMS.md"  # under out/: every claim of every table
PUBLISHED_RUNS = "runs"  # under out/: results/runs holds the records the committed tables are built from


def refuse_overwrite_from_scratch_runs(files: Mapping[Path, bytes], roots: list[str], out: Path) -> None:
    """TableError when tables built from anything but ``<out>/runs`` would change files that already exist.

    The committed tables under results/ are built from results/runs; a bare ``attnlab-table`` reads the
    scratch runs/ folder and would otherwise replace them with "missing" cells. ``force=true`` allows it.
    """
    published = (out / PUBLISHED_RUNS).resolve()
    if all(published == Path(r).resolve() or published in Path(r).resolve().parents for r in roots):
        return
    changed = sorted(str(p) for p, content in files.items() if p.is_file() and p.read_bytes() != content)
    if changed:
        raise TableError(
            f"refusing to overwrite {len(changed)} existing table file(s) ({changed[0]}"
            f"{', ...' if len(changed) > 1 else ''}) with tables built from runs={','.join(roots)}, which is not "
            f"{out / PUBLISHED_RUNS}; pass out=<another folder> to look at them, or force=true to overwrite"
        )
README_BLOCK = re.compile(r"(<!-- attnlab-table: (\S+) -->\n)(.*?)(<!-- /attnlab-table -->)", re.S)


def readme_block(built) -> str:
    """A generated table as it appears inside a page (README.md, docs/*.md): title, caption, table and footnotes
    (the Sources list, with its long paths, stays in results/<paper>/<table>.md, which the block names)."""
    md = render_markdown(built).split("\n## Sources")[0].rstrip("\n").splitlines()
    title = md[0].removeprefix("# ")
    return "\n".join([f"**{title}**", *md[1:], "", f"Sources (run record and command of every number): "
                      f"`results/{built.spec.name}.md`.", ""])


def fill_readme_tables(text: str, built: Mapping[str, Any], where: str = "README.md") -> str:
    """Replace every ``<!-- attnlab-table: <spec> -->`` ... ``<!-- /attnlab-table -->`` block of ``text``
    with that spec's generated table; blocks of specs not built in this call stay as they are."""
    def fill(m: re.Match) -> str:
        name = m.group(2)
        if name not in built:
            return m.group(0)
        return m.group(1) + readme_block(built[name]) + m.group(4)

    for m in README_BLOCK.finditer(text):
        if m.group(2) not in built and "/" not in m.group(2):
            raise TableError(f"{where}: table block names {m.group(2)!r}, not a <paper>/<table> spec")
    return README_BLOCK.sub(fill, text)


README_CLAIMS_BLOCK = re.compile(r"(<!-- attnlab-claims: (\S+) -->\n)(.*?)(<!-- /attnlab-claims -->)", re.S)


def fill_readme_claims(text: str, built_all: Sequence[Any], where: str = "README.md") -> str:
    """Replace every ``<!-- attnlab-claims: <paper> -->`` ... ``<!-- /attnlab-claims -->`` block of ``text``
    with that paper's claims over all its tables ("what held at laptop scale"), from the run records."""
    papers = {b.spec.claims_group for b in built_all}
    papers -= {None}
    for m in README_CLAIMS_BLOCK.finditer(text):
        if m.group(2) not in papers:
            raise TableError(
                f"{where}: claims block names paper {m.group(2)!r}; the specs' papers are {', '.join(sorted(papers))}"
            )
    return README_CLAIMS_BLOCK.sub(lambda m: m.group(1) + render_paper_claims(built_all, m.group(2)) + m.group(4),
                                   text)


def check_tables(files: Mapping[Path, bytes], out: Path, find_orphans: bool) -> list[str]:
    """Paths whose bytes on disk differ from ``files`` (or are missing); with ``find_orphans``, also table
    files under ``out`` that no spec generates any more (left behind by a renamed or deleted spec)."""
    differ = sorted(str(p) for p, content in files.items() if not p.is_file() or p.read_bytes() != content)
    if find_orphans:
        expected = {p.resolve() for p in files}
        # Only the folders tables go to: results/bench, results/runs and README.md's folder hold other files.
        paper_dirs = sorted({p.parent for p in files if out.resolve() in p.resolve().parent.parents})  # not out/ itself
        for path in sorted(q for d in paper_dirs for q in d.glob("*")):
            if path.suffix in TABLE_SUFFIXES and path.resolve() not in expected:
                differ.append(f"{path} (no spec generates it)")
    return differ

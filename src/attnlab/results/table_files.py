"""Every file of a table build, in memory first and then written together: the tables of the specs
(``<out>/<paper>/<table>.{md,csv,tex,png}``), the overviews results/CLAIMS.md and results/README.md, README blocks
filled with generated tables and claims; the check that the committed files match the run records; the refusal to
overwrite published tables with tables of scratch runs. ``attnlab-table`` loads the records, hands them to
:func:`table_files`, then checks or writes what it returns.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnlab.errors import TableError
from attnlab.results.baselines import load_table_baselines
from attnlab.results.build import BuiltTable, build_table
from attnlab.results.loading import Corrupt, Loaded
from attnlab.results.paper import PaperTables
from attnlab.results.record import write_files_atomically
from attnlab.results.render import render_all, render_markdown
from attnlab.results.render.claims import render_claims_overview, render_paper_claims
from attnlab.results.render.index import INDEX_FILENAME, render_results_index
from attnlab.results.render.png import has_figure
from attnlab.results.spec import TableSpec, list_specs, load_spec

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


def specs_named(table: str, experiments_dir: Path) -> list[TableSpec]:
    """The specs ``table=`` names: one ``<paper>/<table>``, or every spec under ``experiments_dir`` for ``all``."""
    if table != "all":
        return [load_spec(table, experiments_dir)]
    specs = [load_spec(name, experiments_dir) for name in list_specs(experiments_dir)]
    if not specs:
        raise TableError(f"no table specs under {experiments_dir} (expected experiments/<paper>/<table>.yaml)")
    return specs


@dataclass
class TableFiles:
    """What a build gives: the built tables (in spec order) and every file path -> content, nothing written yet."""

    built: list[BuiltTable]
    files: dict[Path, bytes] = field(default_factory=dict)


def table_files(specs: Sequence[TableSpec], records: list[Loaded], corrupt: list[Corrupt], papers: PaperTables, *,
                out: Path, baselines_root: Path, plot: bool = True, readmes: Sequence[Path] = (),
                every_table: bool = False) -> TableFiles:
    """Build every spec from ``records`` and render its files under ``out``; with ``every_table`` (``table=all``)
    also the overviews, which cover every spec. ``readmes``: pages whose table blocks (and, with ``every_table``,
    claims blocks: a paper's claims need every table of the paper) are filled."""
    result = TableFiles([])
    for spec in specs:
        built = build_table(spec, records, papers, corrupt, load_table_baselines(baselines_root, spec.name))
        result.built.append(built)
        result.files.update(render_all(built, out, plot=plot))
    if every_table:
        result.files[out / CLAIMS_FILENAME] = render_claims_overview(result.built).encode()
        result.files[out / INDEX_FILENAME] = render_results_index(result.built).encode()
    for readme in readmes:
        if not readme.is_file():
            raise TableError(f"readme={readme}: no such file (it names the file whose table blocks to fill)")
        text = fill_readme_tables(readme.read_text(encoding="utf-8"), {b.spec.name: b for b in result.built},
                                  where=str(readme))
        if every_table:
            text = fill_readme_claims(text, result.built, where=str(readme))
        result.files[readme] = text.encode()
    return result


def refuse_stale_tables(tables: TableFiles, out: Path, find_orphans: bool) -> None:
    """TableError naming the committed files that differ from ``tables`` (:func:`check_tables`)."""
    stale = check_tables(tables.files, out, find_orphans)
    if stale:
        raise TableError(
            f"{len(stale)} committed table file(s) differ from what the run records give: "
            f"{', '.join(stale[:5])}{' ...' if len(stale) > 5 else ''}; run `make tables` and commit the result"
        )


def write_table_files(tables: TableFiles, out: Path, plot: bool = True) -> tuple[list[Path], list[Path]]:
    """Write every file at once (all renamed into place together, so an error leaves ``out`` as it was), then
    remove the figure of a table that no longer has one (its runs are gone). Returns (written, removed)."""
    try:
        written = write_files_atomically(tables.files)
    except OSError as exc:
        raise TableError(f"cannot write the tables ({exc.strerror or exc}: {exc.filename or out}); choose a "
                         "writable folder with out=<dir>") from exc
    removed = []
    for built in tables.built:
        figure = out / f"{built.spec.name}.png"
        if plot and not has_figure(built) and figure.is_file():
            figure.unlink()
            removed.append(figure)
    return written, removed

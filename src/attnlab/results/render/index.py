"""results/README.md: the front page of results/ - every table, what has run, what held, and why a table is empty.

A visitor opening ``results/`` should see, per paper, which tables have numbers, how many rows and seeds stand
behind them, how their claims came out, and, for a table without a laptop protocol, that this is by design and
where the reason is written. Everything here is read from the built tables (the run records in ``results/runs``
and the specs), like the tables themselves; ``make check-tables`` holds it equal to them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from attnlab.results.build import BuiltTable
from attnlab.results.claims import HELD, INCONCLUSIVE, NOT_HELD, NOT_RUN, ClaimResult, claims_of, counted
from attnlab.results.render.claims import multiplicity
from attnlab.results.render.common import md_escape, total_wall_s

INDEX_FILENAME = "README.md"  # under out/
HEADER = ["Table", "Rows with runs", "Seeds per row", "Claims: held / not held / inconclusive / not run",
          "Run time (h)", "Laptop protocol"]  # fmt: skip
_STATUSES = (HELD, NOT_HELD, INCONCLUSIVE, NOT_RUN)


def _seeds(built: BuiltTable) -> str:
    counts = sorted({len(row.used) for row in built.rows if row.used})
    if not counts:
        return "—"
    return str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"


def _laptop(built: BuiltTable, results: Sequence[ClaimResult]) -> str:
    lap = built.spec.laptop
    if lap is None:
        return "—"
    if lap.protocol.startswith("None"):
        return "none (the table says why)"
    cost = "not measured" if lap.per_run_s is None else f"~{lap.per_run_s:.0f} s per run"
    # A protocol whose runs all sit at the task's trivial baseline exists but tests none of the table's claims.
    floored = [r for r in results if built.spec.metric(r.spec.metric).trivial is not None and r.status != NOT_RUN]
    if floored and all(r.at_trivial_baseline for r in floored):
        return f"runs at the trivial baseline ({cost})"
    ran = [r for r in results if r.status != NOT_RUN]
    if ran and all(r.p_value is None for r in ran):  # every claim stopped by a floor, a precondition or constants
        return f"runs, but test none of its claims (floor or precondition missed; {cost})"
    return f"yes ({cost})"


def _claims(results: Sequence[ClaimResult]) -> tuple[str, Counter]:
    counts = Counter(r.status for r in counted(results))
    elsewhere = sorted({r.spec.counted_in for r in results if r.spec.counted_in})
    if not counts:
        return (f"counted under {', '.join(f'`{t}`' for t in elsewhere)}" if elsewhere else "no claims"), counts
    text = " / ".join(str(counts.get(s, 0)) for s in _STATUSES)
    return text + (f" (+ claims counted under {', '.join(f'`{t}`' for t in elsewhere)})" if elsewhere else ""), counts


def _wall_hours(built: BuiltTable) -> float:
    return total_wall_s(rec for row in built.rows for rec in row.used) / 3600


def _notes(folder: str, tables: Sequence[BuiltTable]) -> str:
    """The folder's README and dated LOG, where they exist beside its specs."""
    spec_dir = next((b.spec.path.parent for b in tables if b.spec.path is not None), None)
    if spec_dir is None:
        return ""
    found = [f"`experiments/{folder}/{name}`" for name in ("README.md", "LOG.md") if (spec_dir / name).is_file()]
    return " and its dated log ".join(found) if len(found) == 2 else "".join(found)


def render_results_index(built_tables: Sequence[BuiltTable]) -> str:
    """The front page of results/: one section per experiments folder (paper), one line per table."""
    groups: dict[str, list[BuiltTable]] = {}
    for built in built_tables:
        groups.setdefault(built.spec.name.split("/", 1)[0], []).append(built)
    total_claims: Counter = Counter()
    probe_claims: Counter = Counter()
    sections: list[str] = []
    tables_with_runs = 0
    distinct_runs: set = set()  # a run read by two tables (the demo re-reads UT Table 4) counts once
    every_result: list[ClaimResult] = []
    for folder, tables in groups.items():
        probes = all(b.spec.kind == "probe" for b in tables)
        lines = [f"## {'Mechanism probes' if probes else folder}", ""]
        if probes:
            lines += ["Generated tasks on which one paper's mechanism decides the outcome; never mixed into a paper "
                      "table, no paper numbers.", ""]
        citation = next((b.paper_table.citation for b in tables if b.paper_table and b.paper_table.citation), None)
        if citation:
            lines += [md_escape(citation), ""]
        notes = _notes(folder, tables)
        if notes:
            lines += [f"What the runs mean, protocol by protocol: {notes}.", ""]
        lines += ["| " + " | ".join(HEADER) + " |", "|" + "|".join(["---"] * len(HEADER)) + "|"]
        for built in tables:
            with_runs = sum(1 for row in built.rows if row.used)
            tables_with_runs += bool(with_runs)
            distinct_runs.update(rec.path for row in built.rows for rec in row.used)
            results = claims_of(built)
            every_result += counted(results)
            claims, counts = _claims(results)
            if built.spec.kind == "probe":
                probe_claims += counts
            else:
                total_claims += counts
            link = f"[`{built.spec.name}`]({built.spec.name}.md): {md_escape(built.spec.title)}"
            hours = f"{_wall_hours(built):.1f}" if with_runs else "—"
            cells = [link, f"{with_runs} of {len(built.rows)}", _seeds(built), claims, hours, _laptop(built, results)]
            lines.append("| " + " | ".join(cells) + " |")
        sections += [*lines, ""]
    claims_total = sum(total_claims.values())
    head = [
        "# Results",
        "",
        "Generated by `make tables` from the run records in `results/runs` and the table specs in `experiments/`; "
        "`make check-tables` holds it equal to them. Do not edit by hand.",
        "",
        f"{len(built_tables)} tables, {tables_with_runs} with completed runs ({len(distinct_runs)} distinct runs, one "
        "record per seed in "
        f"`results/runs/<experiment>/s<seed>-<config hash>/`). {claims_total} claims of the papers: "
        + ", ".join(f"{total_claims.get(s, 0)} {s}" for s in _STATUSES)
        + f"; {sum(probe_claims.values())} claims of the mechanism probes: "
        + ", ".join(f"{probe_claims.get(s, 0)} {s}" for s in _STATUSES)
        + " (every claim with its numbers and rule: [CLAIMS.md](CLAIMS.md)).",
        "",
        multiplicity(every_result),
        "",
        "Each table puts our numbers beside the paper's. At laptop scale (2 CPU cores, minutes per run) the rows "
        "are compared with each other, never with the paper's absolute numbers; a table whose laptop protocol is "
        "\"none\" could not test its claims within that budget, and its caption says why. Seeds per row: the "
        "completed seeds behind each mean (a range when rows differ). Run time: the summed wall time of those runs. "
        "Laptop protocol \"runs at the trivial baseline\": the protocol ran, but on every claimed column the better "
        "row does no better than an output that ignores the input (computed from the data, `make baselines`), so "
        "it tests none of the table's claims; \"runs, but test none of its claims\": every claim that ran missed its "
        "floor or its precondition (e.g. rows that use word order), so none was read with an interval.",
        "",
    ]
    return "\n".join(head + sections)

"""``make reproduce-list``: every reproduce target with its rows, seeds, tables and estimated wall time.

A target trains every preset of one folder ``conf/experiment/<paper>/<table>/`` and builds every spec
``experiments/<paper>/<table>[_<task>].yaml``; the T5 path of Synthesizer Tables 4-5 trains the
``synthesizer/t5`` pre-training and multitask presets and builds ``experiments/synthesizer/t5_table<N>.yaml``.
The estimate is read from each spec's ``laptop`` block (``protocol``: the table's laptop protocol in words;
``per_run_s``: the wall seconds of one run of it, measured on the 2-core CPU; ``runs``: the runs the protocol
trains, rows x seeds) as ``per_run_s`` x the spec's rows x the seeds asked for; a spec without a measured
``per_run_s`` says "not measured" rather than guessing.

    python -m attnlab.results.listing --seeds 1,2,3 [--conf src/attnlab/conf/experiment] [--experiments experiments]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from attnlab.results.errors import SpecError
from attnlab.results.spec import TableSpec, list_specs, load_spec

# Folders that hold a pipeline, not one table's rows: listed through T5_TARGETS instead.
PIPELINE_DIRS = {"synthesizer/t5"}
# target -> (preset name prefixes under synthesizer/t5, spec name)
T5_TARGETS = {
    "reproduce-synthesizer-table4-t5": (("pretrain_", "multitask_glue_"), "synthesizer/t5_table4"),
    "reproduce-synthesizer-table5-t5": (("pretrain_", "multitask_superglue_"), "synthesizer/t5_table5"),
}


@dataclass
class Target:
    name: str
    rows: list[str]  # experiment names of the presets it trains
    specs: list[TableSpec]


def table_targets(conf_dir: Path, experiments_dir: Path) -> list[Target]:
    """Every reproduce target: one per preset folder ``<paper>/<table>``, then the T5 ones."""
    specs = list_specs(experiments_dir)
    # A table has a target once it has presets or a spec (a spec ahead of its presets lists "rows none yet").
    folders = {f"{p.parent.name}/{p.name}" for p in conf_dir.glob("*/*") if p.is_dir()}
    folders |= {name.split("_", 1)[0] for name in specs if not name.startswith("synthesizer/t5_")}
    targets = []
    for table_dir in sorted(folders):
        if table_dir in PIPELINE_DIRS or table_dir.startswith("demo/"):
            continue
        rows = sorted(f"{table_dir}/{p.stem}" for p in (conf_dir / table_dir).glob("*.yaml"))
        names = sorted(n for n in specs if n == table_dir or n.startswith(table_dir + "_"))
        targets.append(
            Target(f"reproduce-{table_dir.replace('/', '-')}", rows, [load_spec(n, experiments_dir) for n in names])
        )
    t5 = conf_dir / "synthesizer" / "t5"
    for name, (prefixes, spec_name) in T5_TARGETS.items():
        rows = sorted(f"synthesizer/t5/{p.stem}" for p in t5.glob("*.yaml") if p.stem.startswith(prefixes))
        found = [load_spec(spec_name, experiments_dir)] if spec_name in specs else []
        targets.append(Target(name, rows, found))
    return targets


def fmt_duration(seconds: float) -> str:
    minutes = seconds / 60
    return f"{minutes:.0f} min" if minutes < 120 else f"{minutes / 60:.1f} h"


def estimate(target: Target, seeds: int, jobs: int = 1) -> str:
    """The estimated wall time of the target on this CPU with ``jobs`` single-threaded runs at once (the
    reproduce targets' joblib launcher), or what is not measured. ``per_run_s`` is one run alone."""
    parts, total, unmeasured = [], 0.0, []
    for spec in target.specs:
        lap = spec.laptop
        if lap is None or lap.per_run_s is None:
            unmeasured.append(spec.name)
            continue
        runs = len(spec.rows) * seeds
        total += lap.per_run_s * runs
        parts.append(f"{spec.name}: {runs} runs x {lap.per_run_s:.0f} s")
    if not target.specs:
        return "not measured (no table spec)"
    at_once = f" with {jobs} runs at once" if jobs > 1 else ""
    text = f"~{fmt_duration(total / max(jobs, 1))}{at_once} ({'; '.join(parts)})" if parts else ""
    if unmeasured:
        text += ("; " if text else "") + f"not measured: {', '.join(unmeasured)}"
    return text


def render_listing(targets: list[Target], seeds: str, jobs: int = 1) -> str:
    n_seeds = len([s for s in seeds.split(",") if s.strip()])
    lines = []
    for t in targets:
        rows = ",".join(t.rows) or "none yet"
        tables = " ".join(s.name for s in t.specs) or "none yet"
        time = estimate(t, n_seeds, jobs)
        lines.append(f"{t.name}: rows {rows}; seeds {seeds}; tables {tables}; estimated time {time}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnlab.results.listing", description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--conf", default="src/attnlab/conf/experiment", type=Path)
    parser.add_argument("--experiments", default="experiments", type=Path)
    parser.add_argument("--jobs", default=1, type=int, help="runs at once (make's JOBS)")
    args = parser.parse_args(argv)
    try:
        sys.stdout.write(render_listing(table_targets(args.conf, args.experiments), args.seeds, args.jobs))
    except SpecError as exc:
        print(f"reproduce-list: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

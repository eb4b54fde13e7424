"""``make reproduce-list``: every reproduce target with its rows, seeds, tables and estimated wall time.

A target trains every preset of one folder ``conf/experiment/<paper>/<table>/`` and builds every spec
``experiments/<paper>/<table>[_<task>].yaml``; the T5 path of Synthesizer Tables 4-5 trains the
``synthesizer/t5`` pre-training and multitask presets and builds ``experiments/synthesizer/t5_table<N>.yaml``.
The estimate is read from each spec's ``laptop`` block (``protocol``: the table's laptop protocol in words;
``per_run_s``: the wall seconds of one run of it, measured on the 2-core CPU; ``runs``: the runs the protocol
trains, rows x seeds) as ``per_run_s`` x the spec's rows x the seeds asked for; a spec without a measured
``per_run_s`` says "not measured" rather than guessing.

With ``--scale gpu`` the estimate is each table's one-GPU protocol in GPU-hours: a spec's ``gpu.per_run_s`` where a run
was measured on a GPU, else the FLOP estimate of each preset in ``--gpu-estimates`` (results/gpu/estimates.json,
written by ``make gpu-estimates``), summed over the rows x seeds the target trains.

With ``--published results/runs`` the committed records count too: the runs of the asked seeds already
published are done (the targets skip them), and the runs still to train are timed row by row: a row with
records by their median cost per run, a row without by the spec's estimate, else by the table's median (rows of
one table can differ 4x: a UT applies its layer 8 times). A run's cost is a single-threaded run's CPU seconds
(what it costs alone, which a loaded machine does not inflate), else its wall seconds as the sweep measured them.

    python -m attnlab.results.listing --seeds 1,2,3 [--conf src/attnlab/conf/experiment] [--experiments experiments]
        [--published results/runs] [--scale gpu --gpu-estimates results/gpu/estimates.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from attnlab.errors import SpecError
from attnlab.results.spec import TableSpec, list_specs, load_spec

# Folders that hold a pipeline, not one table's rows: listed through T5_TARGETS instead.
PIPELINE_DIRS = {"synthesizer/t5"}
# target -> (preset name prefixes under synthesizer/t5, spec name)
T5_TARGETS = {
    "reproduce-synthesizer-table4-t5": (("pretrain_", "multitask_glue_"), "synthesizer/t5_table4"),
    "reproduce-synthesizer-table5-t5": (("pretrain_", "multitask_superglue_"), "synthesizer/t5_table5"),
}


@dataclass
class Published:
    """What the committed records already hold of one spec: the (row, seed) pairs done, what each run cost."""

    done: set[tuple[str, int]] = field(default_factory=set)
    # one per completed run: its CPU seconds where it ran on one torch thread (what it costs alone, however loaded
    # the machine was), else its wall seconds; records older than the cpu_s field give their wall seconds
    alone_s: list[float] = field(default_factory=list)
    from_cpu_time: int = 0  # how many of alone_s are CPU times
    by_row: dict[str, list[float]] = field(default_factory=dict)  # row label -> its runs' entries of alone_s
    # (row label, seed) -> why its published record does not stand for the run the target would train
    stale: dict[tuple[str, int], str] = field(default_factory=dict)


class HashTest(Protocol):
    """The test ``make reproduce-*`` itself applies before training a row (``results/lookup.py``): a published
    record stands for a run only if it has the config hash that the target's command composes today. Composing
    needs Hydra and the training floor, so the command (``attnlab.cli.reproduce_list``) supplies it."""

    def target_hash(self, experiment: str, seed: int) -> str:
        """The config hash ``attnlab-train experiment=<experiment> seed=<seed> ...`` composes at HEAD."""

    def why_differs(self, record: Path, experiment: str, seed: int) -> str:
        """In a few words, what differs between the record's saved config and today's."""


@dataclass
class Target:
    name: str
    rows: list[str]  # experiment names of the presets it trains
    specs: list[TableSpec]


def published_runs(specs: list[TableSpec], published_dir: Path, experiments_dir: Path,
                   hash_test: HashTest | None = None) -> dict[str, Published]:
    """Per spec name, the completed runs among the records under ``published_dir`` (grouped as the table
    builder groups them). With ``hash_test``, a record counts as done only if its config hash is the one the
    target composes today (else the target would train the run again); the others are listed in ``stale``."""
    from attnlab.results.build import build_table
    from attnlab.results.loading import load_records
    from attnlab.results.paper import load_paper_tables

    if not published_dir.is_dir():
        return {}
    records, _ = load_records([published_dir], skip_corrupt=True)
    papers = load_paper_tables(None, experiments_dir=experiments_dir)
    found = {}
    for spec in specs:
        built = build_table(spec, records, papers)
        pub = Published()
        for row in built.rows:
            for rec in row.used:
                seed = int(rec.data.get("seed", -1))
                experiment = str(rec.data.get("experiment", ""))
                if hash_test is not None and rec.data.get("config_hash") != hash_test.target_hash(experiment, seed):
                    pub.stale[(row.spec.label, seed)] = hash_test.why_differs(rec.path, experiment, seed)
                    continue
                pub.done.add((row.spec.label, seed))
                cost = rec.data.get("cost") or {}
                wall, cpu = cost.get("wall_s"), cost.get("cpu_s")
                if cpu and cost.get("torch_threads") == 1:
                    alone = float(cpu)
                    pub.from_cpu_time += 1
                elif wall:
                    alone = float(wall)
                else:
                    continue
                pub.alone_s.append(alone)
                pub.by_row.setdefault(row.spec.label, []).append(alone)
        found[spec.name] = pub
    return found


def table_targets(conf_dir: Path, experiments_dir: Path) -> list[Target]:
    """Every reproduce target: one per preset folder ``<paper>/<table>``, then the T5 ones."""
    specs = list_specs(experiments_dir)
    # A table has a target once it has presets or a spec (a spec ahead of its presets lists "rows none yet").
    preset_folders = {f"{p.parent.name}/{p.name}" for p in conf_dir.glob("*/*") if p.is_dir()}
    # a spec <folder>[_<task>] belongs to the longest preset folder it names (ut/fixed_table5_reverse is
    # ut/fixed_table5's, not a folder "ut/fixed"); a spec ahead of its presets gives the part before its "_"
    folders = set(preset_folders)
    for name in specs:
        if name.startswith("synthesizer/t5_"):
            continue
        owners = [f for f in preset_folders if name == f or name.startswith(f + "_")]
        folders.add(max(owners, key=len) if owners else name.split("_", 1)[0])
    targets = []
    for table_dir in sorted(folders):
        if table_dir in PIPELINE_DIRS or table_dir.startswith("demo/"):
            continue
        rows = sorted(f"{table_dir}/{p.stem}" for p in (conf_dir / table_dir).glob("*.yaml"))
        names = sorted(n for n in specs if _owner(n, folders) == table_dir)
        targets.append(
            Target(f"reproduce-{table_dir.replace('/', '-')}", rows, [load_spec(n, experiments_dir) for n in names])
        )
    t5 = conf_dir / "synthesizer" / "t5"
    for name, (prefixes, spec_name) in T5_TARGETS.items():
        rows = sorted(f"synthesizer/t5/{p.stem}" for p in t5.glob("*.yaml") if p.stem.startswith(prefixes))
        found = [load_spec(spec_name, experiments_dir)] if spec_name in specs else []
        targets.append(Target(name, rows, found))
    return targets


def _owner(spec_name: str, folders: set[str]) -> str | None:
    """The longest folder that ``spec_name`` is ``<folder>`` or ``<folder>_<task>`` of."""
    owners = [f for f in folders if spec_name == f or spec_name.startswith(f + "_")]
    return max(owners, key=len) if owners else None


def target_seeds(target: Target, asked: list[int]) -> list[int]:
    """The seeds a target trains: a pre-registered protocol's own (its make target fixes them), else ``asked``."""
    fixed = [spec.preregistered.seeds for spec in target.specs
             if spec.preregistered is not None and spec.preregistered.seeds]
    return sorted({int(s) for seeds in fixed for s in seeds}) if fixed else asked


def fmt_duration(seconds: float) -> str:
    minutes = seconds / 60
    return f"{minutes:.0f} min" if minutes < 120 else f"{minutes / 60:.1f} h"


def estimate(
    target: Target, seeds: int | list[int], jobs: int = 1, published: dict[str, Published] | None = None
) -> str:
    """The estimated wall time of the target on this CPU with ``jobs`` single-threaded runs at once (the
    reproduce targets' joblib launcher), or what is not measured. ``per_run_s`` is one run alone; with
    ``published`` (see ``published_runs``), runs already published are left out and each row still to train
    is timed by its own records' median, else the spec's estimate, else the table's median."""
    seed_list = list(range(seeds)) if isinstance(seeds, int) else list(seeds)
    parts, total, unmeasured, no_laptop = [], 0.0, [], []
    for spec in target.specs:
        pub = (published or {}).get(spec.name, Published())
        runs = len(spec.rows) * len(seed_list)
        done = sum((row.label, s) in pub.done for row in spec.rows for s in seed_list)
        todo = runs - done
        lap = spec.laptop
        if lap is not None and lap.protocol.startswith("None"):  # no laptop version of this spec, even where
            no_laptop.append(spec.name)  # runs of an earlier protocol are published (the spec says why)
            continue
        todo_by_row = {row.label: sum((row.label, s) not in pub.done for s in seed_list) for row in spec.rows}
        to_train = [label for label, n in todo_by_row.items() if n]
        own = [label for label in to_train if pub.by_row.get(label)]
        estimate_s = lap.per_run_s if lap is not None else None
        fallback = estimate_s if estimate_s is not None else (statistics.median(pub.alone_s) if pub.alone_s else None)
        if fallback is None and len(own) < len(to_train):
            unmeasured.append(spec.name + (f" ({done}/{runs} published)" if done else ""))
            continue
        seconds = sum(n * (statistics.median(pub.by_row[label]) if label in own else fallback)
                      for label, n in todo_by_row.items())  # fmt: skip
        # nothing left to train: show what a run cost (records without a cost leave nothing to show)
        per_run = seconds / todo if todo else (statistics.median(pub.alone_s) if pub.alone_s else 0.0)
        cpu_note = "" if not pub.from_cpu_time else (
            ", CPU time" if pub.from_cpu_time == len(pub.alone_s)
            else f", CPU time for {pub.from_cpu_time} of {len(pub.alone_s)}")
        rest = "the spec's estimate" if estimate_s is not None else "the table's median"
        if not pub.alone_s:
            how = ""
        elif len(own) == len(to_train):
            how = "measured" + cpu_note
        elif not own:
            how = "" if estimate_s is not None else f"measured on other rows{cpu_note}"
        else:
            how = f"on average: measured for {len(own)} of {len(to_train)} rows{cpu_note}, {rest} for the rest"
        total += seconds
        runs_text = f"{todo} of {runs} runs to train" if done else f"{runs} runs"
        parts.append(f"{spec.name}: {runs_text} x {per_run:.0f} s" + (f" {how}" if how else "")
                     + _stale_note(pub, spec, seed_list))
    if not target.specs:
        return "not measured (no table spec)"
    at_once = f" with {jobs} runs at once" if jobs > 1 else ""
    text = f"~{fmt_duration(total / max(jobs, 1))}{at_once} ({'; '.join(parts)})" if parts else ""
    return _with_notes(text, ("not measured", unmeasured), ("no laptop protocol (see the spec)", no_laptop))


def _stale_note(pub: Published, spec: TableSpec, seeds: list[int]) -> str:
    """Why runs with published records are due anyway: "(3 published records are of an older config: ...)"."""
    stale = [pub.stale[(row.label, s)] for row in spec.rows for s in seeds if (row.label, s) in pub.stale]
    if not stale:
        return ""
    reasons = "; ".join(dict.fromkeys(stale))
    many = f"{len(stale)} published records are" if len(stale) > 1 else "1 published record is"
    return f" ({many} of an older config, so trained again: {reasons})"


def _with_notes(text: str, *notes: tuple[str, list[str]]) -> str:
    """``text``, then "; <label>: a, b" for each note that lists something."""
    return "; ".join([text] * bool(text) + [f"{label}: {', '.join(items)}" for label, items in notes if items])


def _spec_experiments(spec: TableSpec) -> set[str]:
    """The presets a spec's rows read (a row's ``match.experiment`` may list several)."""
    out: set[str] = set()
    for row in spec.rows:
        names = row.match.get("experiment", [])
        out |= {names} if isinstance(names, str) else {str(n) for n in names}
    return out


def estimate_gpu(target: Target, seeds: list[int], estimates: dict[str, Any]) -> str:
    """The target's one-GPU protocol on one GPU, in GPU-hours: measured per run where a spec has ``gpu.per_run_s``,
    else each preset's FLOP estimate (``estimates``: the ``rows`` of results/gpu/estimates.json)."""
    if not target.specs:
        return "not estimated (no table spec)"
    parts, total, missing, none = [], [0.0, 0.0], [], []
    if all(spec.kind == "probe" for spec in target.specs):
        return "none: a mechanism probe is a laptop protocol (experiments/probes/README.md)"
    for spec in target.specs:
        gpu = spec.gpu
        if gpu is None or gpu.protocol.startswith("None"):
            none.append(spec.name)
            continue
        rows = sorted(_spec_experiments(spec) & set(target.rows)) or sorted(target.rows)
        if target.name in T5_TARGETS:  # the pre-training runs are part of the protocol too
            rows = sorted(target.rows)
        runs = len(rows) * len(seeds)
        if gpu.per_run_s is not None:
            seconds = (gpu.per_run_s * runs,) * 2
            parts.append(f"{spec.name}: {runs} runs x {gpu.per_run_s / 60:.0f} min measured on {gpu.device}")
        else:
            absent = [r for r in rows if r not in estimates]
            if absent:
                missing.append(f"{spec.name} ({len(absent)} of {len(rows)} presets; make gpu-estimates)")
                continue
            seconds = tuple(sum(_run_range(estimates[r])[end] for r in rows) * len(seeds) for end in (0, 1))
            floor = sum(estimates[r]["bound"] == "step floor" for r in rows)
            bound = "" if not floor else (", step-floor bound" if floor == len(rows)
                                          else f", step-floor bound for {floor} of {len(rows)} presets")
            per_run = "-".join(dict.fromkeys(f"{s / runs / 60:.0f}" for s in seconds))
            parts.append(f"{spec.name}: {runs} runs x {per_run} min estimated{bound}")
        total = [total[0] + seconds[0], total[1] + seconds[1]]
    hours = "-".join(dict.fromkeys(f"{t / 3600:.1f}" for t in total))
    text = f"~{hours} GPU-h ({'; '.join(parts)})" if parts else ""
    return _with_notes(text, ("not estimated", missing), ("no one-GPU protocol (see the spec)", none))


def _run_range(row: dict[str, Any]) -> tuple[float, float]:
    """(low, high) seconds of one run from an estimates.json row; an older file's single number is both ends."""
    run_s = row["run_s"]
    return (float(run_s[0]), float(run_s[1])) if isinstance(run_s, list) else (float(run_s), float(run_s))


# Lines of the listing fit a terminal of this width: a target's rows and estimate wrap, indented below its name.
WIDTH = 100


def _block(name: str, fields: list[tuple[str, str]]) -> list[str]:
    """``name:`` then one indented, wrapped line per field (``label: text``)."""
    lines = [f"{name}:"]
    for label, text in fields:
        lines += textwrap.wrap(f"{label}: {text}", width=WIDTH, initial_indent="    ", subsequent_indent="      ",
                               break_on_hyphens=False)
    return lines


def render_listing(targets: list[Target], seeds: str, jobs: int = 1,
                   published: dict[str, Published] | None = None, gpu_estimates: dict[str, Any] | None = None) -> str:
    """One block per target (its name, then its estimate, rows, seeds and tables on indented lines that fit a
    terminal); with ``gpu_estimates`` (scale=gpu) the time is GPU-hours on one GPU."""
    seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    lines = []
    for t in targets:
        rows = ", ".join(r.split("/")[-1] for r in t.rows) or "none yet"
        tables = " ".join(s.name for s in t.specs) or "none yet"
        own_seeds = target_seeds(t, seed_list)
        if gpu_estimates is not None:
            time = ("scale=gpu, one GPU", estimate_gpu(t, own_seeds, gpu_estimates))
        else:
            time = ("estimated time", estimate(t, own_seeds, jobs, published))
        folder = "/".join(t.rows[0].split("/")[:-1]) if t.rows else ""
        seeds_text = seeds if own_seeds == seed_list else \
            f"{','.join(map(str, own_seeds))} (pre-registered; SEEDS does not apply)"
        lines += _block(t.name, [time, (f"rows ({folder}/)" if folder else "rows", rows), ("seeds", seeds_text),
                                 ("tables", tables)])
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None, hash_test: HashTest | None = None) -> int:
    """``hash_test`` (see :class:`HashTest`): count published records as done only where the target would skip
    them; ``python -m attnlab.cli.reproduce_list`` (``make reproduce-list``) supplies it."""
    parser = argparse.ArgumentParser(prog="python -m attnlab.results.listing", description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--conf", default="src/attnlab/conf/experiment", type=Path)
    parser.add_argument("--experiments", default="experiments", type=Path)
    parser.add_argument("--jobs", default=1, type=int, help="runs at once (make's JOBS)")
    parser.add_argument("--published", type=Path, default=None, help="committed records (make's PUBLISHED)")
    parser.add_argument("--scale", choices=("cpu", "gpu"), default="cpu", help="the protocols to time (make's SCALE)")
    parser.add_argument("--gpu-estimates", type=Path, default=Path("results/gpu/estimates.json"))
    args = parser.parse_args(argv)
    try:
        targets = table_targets(args.conf, args.experiments)
        if args.scale == "gpu":
            if not args.gpu_estimates.is_file():
                print(f"reproduce-list: error: no {args.gpu_estimates}; run `make gpu-estimates` first",
                      file=sys.stderr)
                return 2
            rows = json.loads(args.gpu_estimates.read_text()).get("rows", {})
            sys.stdout.write(render_listing(targets, args.seeds, gpu_estimates=rows))
            return 0
        published = (
            published_runs([s for t in targets for s in t.specs], args.published, args.experiments, hash_test)
            if args.published else None
        )
        sys.stdout.write(render_listing(targets, args.seeds, args.jobs, published))
    except SpecError as exc:
        print(f"reproduce-list: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

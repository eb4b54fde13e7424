"""Learning curves: any logged metric against the step, grouped by config keys, mean and band over seeds.

    python -m attnlab.results.curves runs/ --metric val/loss --by model.attention --out curves/val_loss
    make curves RUNS=multirun/2026-12-06/10-00-00 METRIC=val/loss BY=model.attention

Every run folder under the given roots that holds a run record (``results.json``) and its CSV log
(``csv/metrics.csv``) is one curve. Runs are grouped by the ``--by`` keys (record fields such as
``model.attention``, or keys of the config saved beside the record such as ``optim.lr``); each group is drawn as
the mean over its seeds with a band from the lowest to the highest seed, at the steps every seed of the group
logged. A resumed run appends its later segments to the same CSV (``training/resumable_csv.py``); a step logged twice
(the segment after a kill repeats the steps after its checkpoint) keeps its last value, so the segments join into
one curve. Losses, perplexities and NLLs get a log axis. Writes ``<out>.png`` and ``<out>.svg``.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from attnlab.errors import TableError
from attnlab.results.configs import get_field
from attnlab.results.loading import Loaded, load_records
from attnlab.results.record import atomic_write_text

CSV_LOG = Path("csv") / "metrics.csv"
_LOG_AXIS = ("loss", "ppl", "nll", "bpc", "perplexity")


@dataclass
class Curve:
    label: str  # the group's "key=value, ..."
    steps: list[int]
    mean: list[float]
    low: list[float]
    high: list[float]
    seeds: int


def read_metric(csv_path: Path, metric: str) -> dict[int, float]:
    """step -> value of ``metric`` in one run's CSV log; a step logged again (a resumed segment) keeps its last
    value."""
    values: dict[int, float] = {}
    with csv_path.open(encoding="utf-8", newline="") as fh:
        for row in csv.DictReader(fh):
            text, step = row.get(metric), row.get("step")
            if not text or not step:
                continue
            try:
                value, at = float(text), int(float(step))
            except ValueError:
                continue
            if math.isfinite(value):
                values[at] = value
    return values


def _group_value(record: Loaded, key: str) -> str:
    missing = object()
    found = get_field(record.data, key, missing)
    if found is missing or isinstance(found, dict):
        config = record.config
        found = next((config[k] for k in (key, f"{key}.name", f"override:{key}") if k in config), missing)
    if found is missing:
        raise TableError(f"--by {key}: {record.path} has no value for {key} (a record field or a saved config key)")
    return str(found)


def build_curves(records: list[Loaded], metric: str, by: list[str]) -> list[Curve]:
    groups: dict[str, list[dict[int, float]]] = {}
    for record in records:
        log = record.path.parent / CSV_LOG
        if not log.is_file():
            continue
        series = read_metric(log, metric)
        if not series:
            continue
        label = ", ".join(f"{k}={_group_value(record, k)}" for k in by) or "all runs"
        groups.setdefault(label, []).append(series)
    if not groups:
        raise TableError(f"no run under the given folders logged {metric} in {CSV_LOG}")
    curves = []
    for label, runs in sorted(groups.items()):
        steps = sorted(set.intersection(*(set(r) for r in runs)))
        curves.append(Curve(label, steps, [statistics.fmean(r[s] for r in runs) for s in steps],
                            [min(r[s] for r in runs) for s in steps], [max(r[s] for r in runs) for s in steps],
                            len(runs)))
    return curves


def log_axis(metric: str) -> bool:
    return any(word in metric.split("/")[-1] for word in _LOG_AXIS)


def render(curves: list[Curve], metric: str, title: str) -> tuple[bytes, str]:
    """(PNG bytes, SVG text) of the curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for curve in curves:
        (line,) = ax.plot(curve.steps, curve.mean, label=f"{curve.label} (n={curve.seeds})", linewidth=1.6)
        if curve.seeds > 1:
            ax.fill_between(curve.steps, curve.low, curve.high, color=line.get_color(), alpha=0.2, linewidth=0)
    positive = all(v > 0 for c in curves for v in c.low)
    if log_axis(metric) and positive:
        from matplotlib.ticker import ScalarFormatter

        ax.set_yscale("log")
        for set_formatter in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
            set_formatter(ScalarFormatter())  # 2.5, not 2.5 x 10^0: a loss spans less than a decade here
    ax.set_xlabel("step (optimizer updates)")
    ax.set_ylabel(metric + (" (log scale)" if log_axis(metric) and positive else ""))
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, title="mean over seeds; band: lowest to highest seed", title_fontsize=8)
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100, metadata={"Software": None}, bbox_inches="tight")
    svg = io.StringIO()
    fig.savefig(svg, format="svg", metadata={"Date": None, "Creator": None}, bbox_inches="tight")
    plt.close(fig)
    return png.getvalue(), svg.getvalue()


def write_curves(roots: list[str], metric: str, by: list[str], out: Path) -> list[Path]:
    records, _ = load_records(roots, skip_corrupt=True)
    curves = build_curves(records, metric, by)
    png, svg = render(curves, metric, f"{metric} by {', '.join(by) or 'run'} ({', '.join(roots)})")
    out.parent.mkdir(parents=True, exist_ok=True)
    png_path, svg_path = out.with_suffix(".png"), out.with_suffix(".svg")
    tmp = png_path.with_name(f".{png_path.name}.tmp")
    tmp.write_bytes(png)
    tmp.replace(png_path)
    atomic_write_text(svg_path, svg)
    return [png_path, svg_path]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnlab.results.curves", description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="run folders, sweep folders or runs/ (searched for results.json)")
    parser.add_argument("--metric", default="val/loss", help="any column of csv/metrics.csv (default val/loss)")
    parser.add_argument("--by", default="", help="comma-separated keys that group runs into curves")
    parser.add_argument("--out", type=Path, default=None, help="output path without suffix (default curves/<metric>)")
    args = parser.parse_args(argv)
    by = [k for k in args.by.split(",") if k.strip()]
    out = args.out or Path("curves") / args.metric.replace("/", "_")
    try:
        written = write_curves(args.runs, args.metric, by, out)
    except (TableError, OSError) as exc:
        print(f"curves: error: {exc}", file=sys.stderr)
        return 2
    print("wrote " + " and ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``attnlab-table table=summary``: every record found, with its key metrics (``make demo``)."""

from __future__ import annotations

from collections.abc import Sequence

from attnlab.results.build import get_field, one_line
from attnlab.results.loading import Corrupt, Loaded
from attnlab.results.render.common import MISSING, fmt_count, md_escape, rel


def render_summary(records: list[Loaded], corrupt: Sequence[Corrupt] = ()) -> str:
    """A markdown table of every record found with its key metrics (test/* if any, else val/*).

    Debug runs (``extra.debug`` set) are listed, marked "not a result": their metrics come from a few batches.
    """
    finals = [r.data["metrics"]["final"] for r in records]
    # every test split (test/..., test_train_len/..., ...): a length-generalisation test alone hides how the
    # model does in distribution
    names = sorted({k for f in finals for k in f if _is_test_metric(k)}) or sorted(
        {k for f in finals for k in f if k.startswith("val/")}
    )
    header = ["run", "status", "experiment", "task", "attention", "recurrence", "seed", "scale", *names,
              "params", "tokens/s", "wall (s)"]  # fmt: skip
    lines = ["| " + " | ".join(md_escape(h) for h in header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in sorted(records, key=lambda r: str(r.path)):
        d = r.data
        final = d["metrics"]["final"]
        status = d["status"] + (f" ({one_line(d.get('error') or '', 60)})" if d["status"] == "failed" else "")
        debug = get_field(d, "extra.debug")
        if debug:  # debug=fdr/limit/overfit runs stop early by design: their numbers are not results
            status += f" (debug={debug}: not a result)"
        params, tps, wall = (get_field(d, k) for k in ("params.total", "cost.tokens_per_s", "cost.wall_s"))
        cells = [
            rel(r.path), status, d.get("experiment"), d.get("task"), get_field(d, "model.attention"),
            get_field(d, "model.recurrence"), d.get("seed"), d.get("scale"),
            *[MISSING if final.get(n) is None else f"{final[n]:.4g}" for n in names],
            "n/a" if params is None else fmt_count(params),
            "n/a" if tps is None else f"{tps:.0f}",
            "n/a" if wall is None else f"{wall:.1f}",
        ]  # fmt: skip
        cells = ["" if c is None else str(c) for c in cells]
        lines.append("| " + " | ".join(md_escape(c) for c in cells) + " |")
    splits = sorted({str(s) for r in records if (s := get_field(r.data, "metric_flavours.splits"))})
    lines.extend(f"\ntest splits: {text}" for text in splits)
    for c in corrupt:
        lines.append(f"\ncorrupt: {md_escape(c.message)}")
    if not records and not corrupt:
        return "no run records found\n"
    return "\n".join(lines) + "\n"


def _is_test_metric(name: str) -> bool:
    split = name.split("/", 1)[0]
    return "/" in name and (split == "test" or split.startswith("test_"))

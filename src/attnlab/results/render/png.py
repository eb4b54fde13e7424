"""The figure: ours vs paper per row (one panel per metric), and quality vs cost; deterministic bytes.

Readable by construction: panels wrap at :data:`PANELS_PER_ROW` (a 13-column GLUE table is a grid, not a
3000-pixel strip); one legend above the panels, never over a bar; every bar carries its value, so a zero
bar reads "0.0" while a missing or failed run reads "missing"/"failed" in red with no bar; perplexities are
drawn on a log axis (as points: a bar from 0 has no meaning there); the figure is cropped to what is drawn,
so no label is cut. A table without any completed run has no figure (:func:`has_figure`).
"""

from __future__ import annotations

import io
import math

from attnlab.results.build import BuiltTable, MetricSpec
from attnlab.results.render.common import visible_controls

PANELS_PER_ROW = 3
PANEL_WIDTH_IN = 4.4


def plot_text(text: object) -> str:
    """A spec's or record's text as a literal plot label: matplotlib reads ``$...$`` as mathtext (an unbalanced
    or unknown command there fails the whole figure), and a newline would stack lines over the panels."""
    return visible_controls(text).replace("$", r"\$")


def has_figure(built: BuiltTable) -> bool:
    """Whether any cell has a number: an empty table commits no empty panels."""
    return any(c.kind == "ok" for r in built.rows for c in r.cells)


def _log_axis(m: MetricSpec) -> bool:
    text = f"{m.ours} {m.label}".lower()
    return "ppl" in text or "perplexity" in text


def bar_labels(built: BuiltTable, mi: int) -> list[str]:
    """What each row's bar of metric ``mi`` is labelled: its value, or why there is no bar."""
    m = built.spec.metrics[mi]
    return [
        f"{r.cells[mi].stat.mean:.{m.digits}f}" if r.cells[mi].kind == "ok" else r.cells[mi].kind for r in built.rows
    ]


def _metric_panel(ax, built: BuiltTable, mi: int, m: MetricSpec, show_labels: bool) -> None:
    ys = list(range(len(built.rows)))
    cells = [r.cells[mi] for r in built.rows]
    means = [c.stat.mean if c.kind == "ok" else math.nan for c in cells]
    stds = [(c.stat.std or 0.0) if c.kind == "ok" else 0.0 for c in cells]
    paper = [
        float(p.value) if p.kind == "value" and isinstance(p.value, (int, float)) else math.nan
        for p in (r.paper[mi] for r in built.rows)
    ]
    log = _log_axis(m)
    have = [(y, v, s) for y, v, s in zip(ys, means, stds) if not math.isnan(v)]
    if log:
        from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(ScalarFormatter())  # 200, 500, 1000: not overlapping 3x10^2 labels
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.errorbar([v for _, v, _ in have], [y for y, _, _ in have], xerr=[s for *_, s in have], fmt="o",
                    color="tab:blue", capsize=3)  # fmt: skip
    else:
        ax.barh([y for y, _, _ in have], [v for _, v, _ in have], xerr=[s for *_, s in have], color="tab:blue",
                alpha=0.8, capsize=3)  # fmt: skip
    if any(not math.isnan(v) for v in paper):
        ax.plot(paper, ys, "D", color="black", markersize=6, zorder=3)
    finite = [v for v in means + paper if not math.isnan(v)]
    top = max(finite + [v + s for v, s in zip(means, stds) if not math.isnan(v)], default=1.0)
    if log:
        low = min([v for v in finite if v > 0], default=1.0)
        ax.set_xlim(low / 2, max(top, low) * 4)  # room on the right for the value labels
    else:
        ax.set_xlim(min(0.0, min(finite, default=0.0)), (top if top > 0 else 1.0) * 1.3)
    for y, v, s, label in zip(ys, means, stds, bar_labels(built, mi)):
        if math.isnan(v):  # no bar: say why, in red, where the bar would start
            x0 = ax.get_xlim()[0] if not log else ax.get_xlim()[0] * 1.1
            ax.text(x0, y, f" {label}", va="center", fontsize=8, color="tab:red", style="italic")
        else:  # the value beside the bar (after its error bar), so a zero bar reads "0.0", not blank
            x = v + s if not log else (v + s) * 1.15
            ax.text(x, y, f"  {label}", va="center", ha="left", fontsize=7)
    ax.set_yticks(ys)
    ax.set_yticklabels([plot_text(r.spec.label) for r in built.rows] if show_labels else [""] * len(ys), fontsize=8)
    ax.set_ylim(len(ys) - 0.5, -0.5)
    better = "higher" if m.direction == "higher" else "lower"
    ax.set_title(f"{plot_text(m.label)}\n({better} is better{', log scale' if log else ''})", fontsize=9)
    ax.tick_params(axis="x", labelsize=8)


def _cost_panel(ax, built: BuiltTable) -> None:
    m0 = built.spec.metrics[0]
    use_tps = any(r.tokens_per_s for r in built.rows)
    plotted = False
    for r in built.rows:
        cost = r.tokens_per_s if use_tps else r.wall_s
        if r.cells[0].kind == "ok" and cost is not None:
            ax.plot([cost.mean], [r.cells[0].stat.mean], "o", color="tab:blue")
            ax.annotate(plot_text(r.spec.label), (cost.mean, r.cells[0].stat.mean), fontsize=7, xytext=(4, 4),
                        textcoords="offset points", annotation_clip=False)  # fmt: skip
            plotted = True
    if not plotted:
        ax.text(0.5, 0.5, "no completed runs\nwith cost data", ha="center", va="center", transform=ax.transAxes,
                fontsize=8)  # fmt: skip
    ax.set_xlabel("tokens/s (higher is cheaper)" if use_tps else "wall time (s)", fontsize=8)
    ax.set_ylabel(plot_text(m0.label), fontsize=8)
    ax.set_title(f"quality vs cost\n({plot_text(m0.label)})", fontsize=9)
    ax.tick_params(labelsize=8)
    ax.margins(0.3)


def render_png(built: BuiltTable) -> bytes:
    """The figure as PNG bytes, identical for identical tables (no date or software metadata)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    metrics = built.spec.metrics
    panels = len(metrics) + 1
    ncols = min(PANELS_PER_ROW, panels)
    nrows = math.ceil(panels / ncols)
    row_h = 0.42 * len(built.rows) + 1.4
    fig, axes = plt.subplots(nrows, ncols, figsize=(PANEL_WIDTH_IN * ncols, row_h * nrows + 0.9), squeeze=False)
    flat = [ax for line in axes for ax in line]
    for i, m in enumerate(metrics):
        _metric_panel(flat[i], built, i, m, show_labels=i % ncols == 0)
    _cost_panel(flat[len(metrics)], built)
    for ax in flat[panels:]:
        ax.set_visible(False)
    handles = [Patch(color="tab:blue", alpha=0.8, label="ours (mean ± std over seeds)")]
    if any(p.kind == "value" for r in built.rows for p in r.paper):
        handles.append(Line2D([], [], marker="D", color="black", linestyle="", label="paper"))
    height = fig.get_figheight()  # title, then the legend, then the panels, at fixed inches from the top
    fig.suptitle(plot_text(built.spec.title), fontsize=10, y=1 - 0.12 / height, va="top")
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.75 / height))
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, 1 - 0.38 / height))  # fmt: skip
    buf = io.BytesIO()
    # No Software/date metadata so `make tables` regenerates the file byte for byte; cropped to the drawing.
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None}, bbox_inches="tight", pad_inches=0.15)
    plt.close(fig)
    return buf.getvalue()

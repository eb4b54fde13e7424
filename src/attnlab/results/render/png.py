"""The figure: ours vs paper per row (one panel per metric), and quality vs cost; deterministic bytes."""

from __future__ import annotations

import io
import math

from attnlab.results.build import BuiltTable


def render_png(built: BuiltTable) -> bytes:
    """Ours vs paper per row (one panel per metric), and quality vs cost; deterministic bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = built.spec.metrics[:6]
    labels = [r.spec.label for r in built.rows]
    ncols = len(metrics) + 1
    fig, axes = plt.subplots(1, ncols, figsize=(4.2 * ncols, 0.45 * len(labels) + 2.2), squeeze=False)
    axes = axes[0]
    ys = list(range(len(labels)))
    for ax, (mi, m) in zip(axes, enumerate(metrics)):
        means = [r.cells[mi].stat.mean if r.cells[mi].kind == "ok" else math.nan for r in built.rows]
        stds = [(r.cells[mi].stat.std or 0.0) if r.cells[mi].kind == "ok" else 0.0 for r in built.rows]
        ax.barh(ys, [0 if math.isnan(v) else v for v in means], xerr=stds, color="tab:blue", alpha=0.8,
                label="ours (mean ± std)")  # fmt: skip
        for y, v, r in zip(ys, means, built.rows):
            if math.isnan(v):
                ax.text(0, y, f" {r.cells[mi].kind}", va="center", fontsize=7, color="tab:red")
        paper_x = [
            float(p.value) if p.kind == "value" and isinstance(p.value, (int, float)) else math.nan
            for p in (r.paper[mi] for r in built.rows)
        ]
        if any(not math.isnan(v) for v in paper_x):
            ax.plot(paper_x, ys, "D", color="black", label="paper")
        ax.set_yticks(ys)
        ax.set_yticklabels(labels if mi == 0 else [""] * len(labels), fontsize=8)
        ax.invert_yaxis()
        ax.set_title(f"{m.label} ({'higher' if m.direction == 'higher' else 'lower'} is better)", fontsize=9)
        ax.legend(fontsize=7, loc="best")
    ax = axes[-1]
    m0 = built.spec.metrics[0]
    use_tps = any(r.tokens_per_s for r in built.rows)
    plotted = False
    for r in built.rows:
        cost = r.tokens_per_s if use_tps else r.wall_s
        if r.cells[0].kind == "ok" and cost is not None:
            ax.plot([cost.mean], [r.cells[0].stat.mean], "o", color="tab:blue")
            ax.annotate(r.spec.label, (cost.mean, r.cells[0].stat.mean), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")  # fmt: skip
            plotted = True
    if not plotted:
        ax.text(0.5, 0.5, "no completed runs with cost data", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("tokens/s (higher is cheaper)" if use_tps else "wall time (s)", fontsize=8)
    ax.set_ylabel(m0.label, fontsize=8)
    ax.set_title("quality vs cost", fontsize=9)
    ax.margins(0.25)  # room for the row labels beside the points
    fig.suptitle(built.spec.title, fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    # No Software/date metadata so `make tables` regenerates the file byte for byte.
    fig.savefig(buf, format="png", dpi=110, metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()

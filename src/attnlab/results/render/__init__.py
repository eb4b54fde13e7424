"""Renderers of a built table, one file each: markdown, csv, tex, png; and the run summary."""

from __future__ import annotations

import os
from pathlib import Path

from attnlab.results.build import BuiltTable
from attnlab.results.render.csv import render_csv
from attnlab.results.render.markdown import render_markdown
from attnlab.results.render.png import has_figure, render_png
from attnlab.results.render.summary import render_summary
from attnlab.results.render.tex import render_tex

__all__ = ["render_all", "render_csv", "render_markdown", "render_png", "render_summary", "render_tex"]


def render_all(built: BuiltTable, out_dir: str | os.PathLike, plot: bool = True) -> dict[Path, bytes]:
    """File path -> content for one table: ``<out>/<paper>/<table>.{md,csv,tex,png}`` (no png without runs)."""
    base = Path(out_dir) / built.spec.name
    files = {
        base.with_suffix(".md"): render_markdown(built).encode("utf-8"),
        base.with_suffix(".csv"): render_csv(built).encode("utf-8"),
        base.with_suffix(".tex"): render_tex(built).encode("utf-8"),
    }
    if plot and has_figure(built):
        files[base.with_suffix(".png")] = render_png(built)
    return files

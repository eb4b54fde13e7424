"""``attnlab-table``: build paper-vs-ours tables from run records (or wandb runs).

    attnlab-table table=demo/copy runs=runs/ out=results/
    attnlab-table table=all                       # every experiments/<paper>/<table>.yaml
    attnlab-table table=summary runs=runs/demo    # print every record found
    attnlab-table table=synthesizer/table2 source=wandb entity=me project=attnlab
    attnlab-table table=synthesizer/table2 source=wandb runs=runs/   # offline wandb runs' files, not synced
    attnlab-table table=synthesizer/table2 wandb=true                # also send the tables as a wandb artifact

``@hydra.main`` over :func:`build_tables` (which tests call directly): it loads the run records and hands them to
``results.table_files``, which builds, checks and writes the files. Errors the user can fix
(corrupt record, unknown spec, unreachable wandb) are one line on stderr, exit code 2, nothing written.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import hydra
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from attnlab.cli.common import HYDRA_FLAGS, fail, failures_reported, one_line
from attnlab.cli.wandb_source import offline_wandb_records, wandb_records
from attnlab.cli.wandb_upload import upload_tables
from attnlab.errors import TableError
from attnlab.results.adhoc import adhoc_records, build_adhoc_table
from attnlab.results.baselines import BASELINES_FOLDER
from attnlab.results.loading import load_records
from attnlab.results.paper import default_experiments_dir, load_paper_tables
from attnlab.results.render import render_markdown, render_summary
from attnlab.results.table_files import (
    refuse_overwrite_from_scratch_runs,
    refuse_stale_tables,
    specs_named,
    table_files,
    write_table_files,
)
from attnlab.training.compose import compose


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return [str(value)]


def build_tables(cfg: Mapping[str, Any] | DictConfig) -> list[Path]:
    """Build the tables ``cfg`` asks for and return the files written (none for ``table=summary``, ``by=`` or
    ``check=true``): load the records, hand them to ``results.table_files``, report what it gives."""
    if isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_container(cfg, resolve=True)
    cfg = dict(cfg)
    source = cfg.get("source", "local")
    if source not in ("local", "wandb"):
        raise TableError(f"source must be local or wandb, got {source!r}")
    if cfg.get("logger") not in (None, "wandb"):  # as attnlab-train's logger=wandb: send the tables there
        raise TableError(f"logger must be wandb (the same as wandb=true) or unset, got {cfg.get('logger')!r}")
    exp_dir = Path(cfg.get("experiments_dir") or default_experiments_dir())
    table = str(cfg.get("table", "all"))
    out = Path(cfg.get("out") or "results/")
    plot = bool(cfg.get("plot", True))
    specs = [] if table == "summary" or cfg.get("by") else specs_named(table, exp_dir)

    skip = bool(cfg.get("skip_corrupt", False))
    roots = _as_list(cfg.get("runs", "runs/"))
    if source == "local":
        records, corrupt = load_records(roots, skip_corrupt=skip)
        if not records and not corrupt:
            print(f"attnlab-table: no results.json under {', '.join(roots)}; every cell will be missing",
                  file=sys.stderr)
    elif not cfg.get("entity") and not cfg.get("project"):  # offline runs' files under runs=
        records, corrupt = offline_wandb_records(roots, skip_corrupt=skip)
    else:
        records, corrupt = wandb_records(cfg.get("entity"), cfg.get("project"), skip_corrupt=skip)

    if table == "summary":
        sys.stdout.write(render_summary(records, corrupt))
        return []
    if cfg.get("by"):  # an ad-hoc table of these runs, printed; nothing written
        from attnlab.training.trivial_baselines import adhoc_baseline  # tasks/ (torch) only for by=

        completed = adhoc_records(records, roots)
        built = build_adhoc_table(completed, roots, _as_list(cfg["by"]), _as_list(cfg.get("metrics")),
                                  cfg.get("claim"), adhoc_baseline(completed, cfg.get("data_root")))
        sys.stdout.write(render_markdown(built))
        return []

    papers = load_paper_tables(cfg.get("paper_tables"), experiments_dir=exp_dir)
    if not papers.found:
        print("attnlab-table: paper_tables.yaml not found; paper cells show n/a", file=sys.stderr)
    tables = table_files(specs, records, corrupt, papers, out=out, plot=plot, every_table=table == "all",
                         baselines_root=Path(cfg.get("baselines") or out / BASELINES_FOLDER),
                         readmes=[Path(r) for r in _as_list(cfg.get("readme"))])
    if cfg.get("check"):
        refuse_stale_tables(tables, out, find_orphans=table == "all")
        print(f"attnlab-table: {len(tables.files)} table file(s) match the run records")
        return []
    if not cfg.get("force") and source == "local":
        refuse_overwrite_from_scratch_runs(tables.files, roots, out)
    written, removed = write_table_files(tables, out, plot=plot)
    for figure in removed:
        print(f"removed {figure} (no completed runs to plot)")
    for built in tables.built if cfg.get("print") else ():
        sys.stdout.write(render_markdown(built) + "\n")
    for path in written:
        print(f"wrote {path}")
    if cfg.get("wandb") or cfg.get("logger") == "wandb":
        run_id = upload_tables(written, entity=cfg.get("entity"), project=cfg.get("project"), name=table, folder=out)
        print(f"wandb: tables sent as an artifact of run {run_id}" if run_id else "wandb: no table files to send")
    return written


@hydra.main(config_path="pkg://attnlab.conf", config_name="table", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> None:
    with failures_reported(prog="attnlab-table"):
        build_tables(cfg)


def _quoted_claim(arg: str) -> str:
    """``claim=qknorm > vanilla on test/seq_acc`` (the shell's quotes already gone) as Hydra needs it: quoted, or
    its grammar refuses the spaces and ``>``."""
    key, sep, value = arg.partition("=")
    if key.lstrip("+") != "claim" or not sep or value[:1] in ("'", '"'):
        return arg
    return f"{key}='" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def main(argv: list[str] | None = None) -> None:
    """Console script ``attnlab-table``."""
    argv = [_quoted_claim(a) for a in (sys.argv[1:] if argv is None else argv)]
    # Compose once up front so a misspelled key is one line and exit 2, as in attnlab-train.
    if not any(a in HYDRA_FLAGS or a.startswith(tuple(f + "=" for f in HYDRA_FLAGS)) for a in argv):
        try:
            compose("table", argv)
        except (HydraException, OmegaConfBaseException) as exc:
            # Hydra puts "Key 'x' is not in struct" in the cause; one_line needs both to name the key.
            full = Exception(f"{exc}\n{exc.__cause__ or ''}")
            fail(one_line(full).replace("attnlab-train --cfg job", "attnlab-table --cfg job"), prog="attnlab-table")
    sys.argv = [sys.argv[0], *argv]
    _hydra_main()


if __name__ == "__main__":
    main()

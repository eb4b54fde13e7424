"""``attnlab-table``: build paper-vs-ours tables from run records (or wandb runs).

    attnlab-table table=demo/copy runs=runs/ out=results/
    attnlab-table table=all                       # every experiments/<paper>/<table>.yaml
    attnlab-table table=summary runs=runs/demo    # print every record found
    attnlab-table table=synthesizer/table2 source=wandb entity=me project=attnlab
    attnlab-table table=synthesizer/table2 source=wandb runs=runs/   # offline wandb runs' files, not synced
    attnlab-table table=synthesizer/table2 wandb=true                # also send the tables as a wandb artifact

A thin ``@hydra.main`` over :func:`build_tables`, which tests call directly. Errors the user can fix
(corrupt record, unknown spec, unreachable wandb) are one line on stderr, exit code 2, nothing written.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from attnlab.cli.common import HYDRA_FLAGS, fail, failures_reported, one_line
from attnlab.cli.wandb_source import offline_wandb_records, wandb_records
from attnlab.cli.wandb_upload import upload_tables
from attnlab.errors import TableError
from attnlab.results.baselines import BASELINES_FOLDER, load_table_baselines
from attnlab.results.build import build_table
from attnlab.results.loading import load_records
from attnlab.results.paper import default_experiments_dir, load_paper_tables
from attnlab.results.record import write_files_atomically
from attnlab.results.render import render_all, render_markdown, render_summary
from attnlab.results.render.claims import render_claims_overview
from attnlab.results.render.index import INDEX_FILENAME, render_results_index
from attnlab.results.render.png import has_figure
from attnlab.results.spec import list_specs, load_spec
from attnlab.results.table_files import (
    CLAIMS_FILENAME,
    check_tables,
    fill_readme_claims,
    fill_readme_tables,
    refuse_overwrite_from_scratch_runs,
)
from attnlab.training.compose import compose

EXIT_USER_ERROR = 2


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return [str(value)]


def build_tables(cfg: Mapping[str, Any] | DictConfig) -> list[Path]:
    """Build the tables ``cfg`` asks for and return the files written (none for ``table=summary``).

    Everything is read and rendered in memory first and written only at the end, all files of a call
    renamed into place together, so an error leaves ``out`` as it was.
    """
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

    if table == "summary" or cfg.get("by"):
        specs = []
    elif table == "all":
        specs = [load_spec(name, exp_dir) for name in list_specs(exp_dir)]
        if not specs:
            raise TableError(f"no table specs under {exp_dir} (expected experiments/<paper>/<table>.yaml)")
    else:
        specs = [load_spec(table, exp_dir)]

    skip = bool(cfg.get("skip_corrupt", False))
    if source == "local":
        roots = _as_list(cfg.get("runs", "runs/"))
        records, corrupt = load_records(roots, skip_corrupt=skip)
        if not records and not corrupt:
            print(
                f"attnlab-table: no results.json under {', '.join(roots)}; every cell will be missing",
                file=sys.stderr,
            )
    elif not cfg.get("entity") and not cfg.get("project"):  # offline runs' files under runs=
        records, corrupt = offline_wandb_records(_as_list(cfg.get("runs", "runs/")), skip_corrupt=skip)
    else:
        records, corrupt = wandb_records(cfg.get("entity"), cfg.get("project"), skip_corrupt=skip)

    if table == "summary":
        sys.stdout.write(render_summary(records, corrupt))
        return []
    if cfg.get("by"):  # an ad-hoc table of these runs, printed; nothing written
        from attnlab.results.adhoc import adhoc_records, build_adhoc_table
        from attnlab.training.trivial_baselines import adhoc_baseline

        runs = _as_list(cfg.get("runs", "runs/"))
        completed = adhoc_records(records, runs)
        built = build_adhoc_table(completed, runs, _as_list(cfg["by"]), _as_list(cfg.get("metrics")),
                                  cfg.get("claim"), adhoc_baseline(completed, cfg.get("data_root")))
        sys.stdout.write(render_markdown(built))
        return []

    papers = load_paper_tables(cfg.get("paper_tables"), experiments_dir=exp_dir)
    if not papers.found:
        print("attnlab-table: paper_tables.yaml not found; paper cells show n/a", file=sys.stderr)
    files: dict[Path, bytes] = {}
    built_all = []
    baselines_root = Path(cfg.get("baselines") or Path(cfg.get("out") or "results/") / BASELINES_FOLDER)
    for spec in specs:
        baselines = load_table_baselines(baselines_root, spec.name)
        built = build_table(spec, records, papers, corrupt, baselines)
        built_all.append(built)
        files.update(render_all(built, cfg.get("out") or "results/", plot=bool(cfg.get("plot", True))))
    if table == "all":  # the overview covers every spec, so only a build of all of them writes it
        files[Path(cfg.get("out") or "results/") / CLAIMS_FILENAME] = render_claims_overview(built_all).encode()
        files[Path(cfg.get("out") or "results/") / INDEX_FILENAME] = render_results_index(built_all).encode()
    for readme in map(Path, _as_list(cfg.get("readme"))):
        if not readme.is_file():
            raise TableError(f"readme={readme}: no such file (it names the file whose table blocks to fill)")
        text = readme.read_text(encoding="utf-8")
        text = fill_readme_tables(text, {b.spec.name: b for b in built_all}, where=str(readme))
        if table == "all":  # a paper's claims need every table of the paper
            text = fill_readme_claims(text, built_all, where=str(readme))
        files[readme] = text.encode()
    if cfg.get("check"):
        stale = check_tables(files, Path(cfg.get("out") or "results/"), find_orphans=table == "all")
        if stale:
            raise TableError(
                f"{len(stale)} committed table file(s) differ from what the run records give: "
                f"{', '.join(stale[:5])}{' ...' if len(stale) > 5 else ''}; run `make tables` and commit the result"
            )
        print(f"attnlab-table: {len(files)} table file(s) match the run records")
        return []
    if not cfg.get("force") and source == "local":
        refuse_overwrite_from_scratch_runs(files, roots, Path(cfg.get("out") or "results/"))
    try:
        written = write_files_atomically(files)
    except OSError as exc:
        where = exc.filename or cfg.get("out") or "results/"
        raise TableError(
            f"cannot write the tables ({exc.strerror or exc}: {where}); choose a writable folder with out=<dir>"
        ) from exc
    for built in built_all:
        stale = Path(cfg.get("out") or "results/") / f"{built.spec.name}.png"
        if cfg.get("plot", True) and not has_figure(built) and stale.is_file():
            stale.unlink()  # a figure of runs that are no longer there; a table without runs has none
            print(f"removed {stale} (no completed runs to plot)")
        if cfg.get("print"):
            sys.stdout.write(render_markdown(built) + "\n")
    for path in written:
        print(f"wrote {path}")
    if cfg.get("wandb") or cfg.get("logger") == "wandb":
        run_id = upload_tables(written, entity=cfg.get("entity"), project=cfg.get("project"), name=table,
                               folder=Path(cfg.get("out") or "results/"))
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
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException


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

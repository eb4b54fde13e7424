"""attnlab-baselines: the trivial baseline behind every run of every table (``make baselines``).

For each table spec with a ``trivial:`` column, every run behind that column has its task configuration read
from its folder (``.hydra/config.yaml``, the config that ran), the named baseline computed from the local data
(:mod:`attnlab.tasks.trivial`), and ``<out>/<paper>/<table>.json`` written (:mod:`attnlab.results.baselines`).
Runs sharing a task configuration and seed share one computation. ``make tables`` then reads these files.

    attnlab-baselines                                   every table; runs in results/runs, files in results/baselines
    attnlab-baselines --table ut/table1_joint1k         one table
    attnlab-baselines --check                           exit 1 unless the files are what the runs and data give
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from attnlab.errors import SpecError, TableError
from attnlab.results.baselines import BASELINES_FOLDER
from attnlab.training.trivial_baselines import write_baselines


def main(argv: list[str] | None = None) -> None:
    from attnlab.results.paper import default_experiments_dir
    from attnlab.tasks.base import DataError

    parser = argparse.ArgumentParser(prog="attnlab-baselines", description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", action="append", help="a spec name (<paper>/<table>); default: every table")
    parser.add_argument("--runs", default="results/runs", help="the published run folders (default results/runs)")
    parser.add_argument("--out", default=f"results/{BASELINES_FOLDER}", help="where the files go")
    parser.add_argument("--experiments-dir", default=None, help="the table specs (default: experiments/)")
    parser.add_argument("--data-root", default=os.environ.get("ATTNLAB_DATA_ROOT", "data"),
                        help="the local datasets (default $ATTNLAB_DATA_ROOT)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a file would change")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        changed = write_baselines(Path(args.experiments_dir or default_experiments_dir()), Path(args.runs),
                                  Path(args.out), str(Path(args.data_root).resolve()), args.table, check=args.check)
    except (TableError, SpecError, DataError) as exc:
        print(f"attnlab-baselines: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if args.check:
        if changed:
            print(f"attnlab-baselines: {len(changed)} file(s) differ from what the runs and data give: "
                  f"{', '.join(changed)}; run make baselines and commit", file=sys.stderr)
            raise SystemExit(1)
        print("attnlab-baselines: every baselines file matches the runs and the data")
        return
    for path in changed:
        print(f"wrote {path}")
    if not changed:
        print("attnlab-baselines: every baselines file already matches the runs and the data")


if __name__ == "__main__":
    main()

"""``attnlab-train``: a thin Hydra entry point over ``attnlab.training.run``.

Before Hydra starts a single run, the config is composed and checked once (``preflight``), so bad input
gets one line, exit code 2, and no run folder. In a multirun each job is checked on its own; a failing
job writes a failed run record and the sweep goes on.
"""

from __future__ import annotations

import logging
import os
import sys

import hydra
from omegaconf import DictConfig

from attnlab.cli.common import HYDRA_FLAGS, compose_checked, fail, one_line, user_errors

log = logging.getLogger("attnlab")


@hydra.main(config_path="pkg://attnlab.conf", config_name="train", version_base="1.3")
def hydra_main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    from attnlab.training.run import run, write_failed_record

    hc = HydraConfig.get()
    overrides = list(hc.overrides.task)
    command = " ".join(["attnlab-train", *overrides])
    multirun = hc.mode.name == "MULTIRUN"
    try:
        record = run(cfg, run_dir=hc.runtime.output_dir, command=command, cli_overrides=overrides)
    except user_errors() as exc:
        write_failed_record(cfg, hc.runtime.output_dir, command, one_line(exc))
        if multirun:
            log.error("job failed: %s", one_line(exc))
            return
        fail(one_line(exc))
    metrics = record["metrics"]["final"]
    shown = {k: v for k, v in metrics.items() if k.startswith(("test", "val/"))}
    log.info("run record: %s/results.json", record["run_dir"])
    for key, value in shown.items():
        log.info("  %-28s %s", key, "n/a" if value is None else f"{value:.4f}")


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not any(a in HYDRA_FLAGS or a.startswith(tuple(f + "=" for f in HYDRA_FLAGS)) for a in argv):
        try:
            compose_checked("train", argv)
        except user_errors() as exc:
            fail(one_line(exc))
    os.environ.setdefault("HYDRA_FULL_ERROR", "0")
    sys.argv = [sys.argv[0], *argv]
    hydra_main()


if __name__ == "__main__":
    main()

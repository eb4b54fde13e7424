"""``attnlab-table wandb=true``: the built tables sent to wandb as an artifact."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def upload_tables(written: list[Path], *, entity: Any, project: Any, name: str, folder: Path) -> str | None:
    """Send the built tables (markdown and PNG; CSV and LaTeX too) to wandb as one ``table`` artifact, the
    PNGs also as images; offline unless ``WANDB_MODE`` says otherwise. The run's files go under ``folder``
    (the tables' output folder), named explicitly: wandb otherwise reuses the directory its process-wide
    settings took from the first run of the process. Returns the wandb run id."""
    import wandb

    files = [p for p in written if p.suffix in (".md", ".png", ".csv", ".tex") and p.is_file()]
    if not files:
        return None
    os.environ.setdefault("WANDB_MODE", "offline")
    run = wandb.init(project=project or "attnlab", entity=entity, job_type="table", name=f"table-{name}",
                     dir=str(folder),
                     settings=wandb.Settings(silent=True, console="off", x_disable_stats=True))
    try:
        artifact = wandb.Artifact(f"tables-{name}".replace("/", "-"), type="table")
        for path in files:
            artifact.add_file(str(path), name=f"{path.parent.name}/{path.name}")
        run.log_artifact(artifact)
        images = {f"tables/{p.stem}": wandb.Image(str(p)) for p in files if p.suffix == ".png"}
        if images:
            run.log(images)
        return run.id
    finally:
        run.finish()

"""docs/reviewing_runs.md says what a reviewer groups by in TensorBoard and wandb and what the table artifact is
called: those names are held to what the code logs, and the page (with every docs page) is on README's index."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

from omegaconf import OmegaConf

from tests.conftest import REPO, compose

PAGE = REPO / "docs" / "reviewing_runs.md"


def test_every_docs_page_is_on_the_readme_index():
    readme = (REPO / "README.md").read_text()
    index = readme[readme.index("## Where to read more"):]
    listed = set(re.findall(r"\]\(docs/([\w.-]+\.md)\)", index))
    assert {p.name for p in (REPO / "docs").glob("*.md")} == listed


def _group_by_keys() -> list[str]:
    """The config keys in the 'group by' column of the page's table (examples in parentheses left out)."""
    text = PAGE.read_text()
    table = text[text.index("| question |"):text.index("The keys are")]
    rows = [line.split("|")[2] for line in table.splitlines()[2:] if line.startswith("|")]
    return [k for row in rows for k in re.findall(r"`([a-z_][\w.]*)`", re.sub(r"\([^)]*\)", "", row))]


def test_the_group_by_keys_are_keys_of_the_logged_config():
    keys = _group_by_keys()
    assert {"experiment_name", "row", "model.attention.name", "model.recurrence.name", "task.name", "scale.name",
            "seed", "optim.lr", "model.d_model"} <= set(keys)
    cfg = OmegaConf.to_container(compose(["experiment=demo/copy", "logger=wandb"]))  # the tree wandb gets, resolved
    for key in keys:
        node = cfg
        for part in key.split("."):
            assert isinstance(node, dict) and part in node, f"docs/reviewing_runs.md groups by {key}: not in the config"
            node = node[part]


def test_the_wandb_name_group_and_tags_are_what_the_page_says(tmp_path, monkeypatch):
    from attnlab.training.wandb_run import build_wandb_logger

    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = compose(["experiment=ut/table4/transformer_copy", "logger=wandb", "seed=3"], run_dir=tmp_path)
    init = build_wandb_logger(cfg, tmp_path)._wandb_init  # what wandb.init will get; no wandb run is started
    assert init["name"] == f"{cfg.row}-s3" and init["group"] == cfg.experiment_name == "ut/table4/transformer_copy"
    assert {cfg.task.name, cfg.model.attention.name, cfg.model.recurrence.name, cfg.scale.name, "seed:3",
            f"row:{cfg.row}"} <= set(init["tags"])
    assert init["config"]["model"]["attention"]["name"] == cfg.model.attention.name
    assert "Its group is `experiment_name`" in " ".join(PAGE.read_text().split())


def test_the_table_artifact_is_named_as_the_page_says(tmp_path, monkeypatch):
    """upload_tables against a recording stand-in for wandb: the run, the artifact's name and type, the images."""
    from attnlab.cli.wandb_upload import upload_tables

    seen: dict = {}

    class Run:
        id = "abc123"

        def log_artifact(self, artifact):
            seen["artifact"] = artifact

        def log(self, data):
            seen["logged"] = sorted(data)

        def finish(self):
            seen["finished"] = True

    class Artifact:
        def __init__(self, name, type):
            self.name, self.type, self.files = name, type, []

        def add_file(self, path, name):
            self.files.append(name)

    def init(**kwargs):
        seen["init"] = kwargs
        return Run()

    fake = types.SimpleNamespace(init=init, Artifact=Artifact, Image=lambda path: path, Settings=lambda **k: k)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.setenv("WANDB_MODE", "offline")
    folder = tmp_path / "ut"
    folder.mkdir()
    written = [folder / "table4_copy.md", folder / "table4_copy.png"]
    for path in written:
        path.write_text("x")
    upload_tables(written, entity=None, project=None, name="ut/table4_copy", folder=tmp_path)
    page = PAGE.read_text()
    artifact = seen["artifact"]
    assert (artifact.name, artifact.type) == ("tables-ut-table4_copy", "table")
    assert f"`{artifact.name}`" in page and "of type `table`" in page
    assert seen["init"]["name"] == "table-ut/table4_copy" and seen["init"]["job_type"] == "table"
    assert "`table-<table>` with job type `table`" in " ".join(page.split())
    assert artifact.files == ["ut/table4_copy.md", "ut/table4_copy.png"] and seen["logged"] == ["tables/table4_copy"]
    assert Path(PAGE).name in (REPO / "docs" / "runs.md").read_text()

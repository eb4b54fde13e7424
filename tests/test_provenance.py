"""The run record's git provenance: which edits make a record "dirty" (built from a throwaway repository)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from attnlab.training.record_writers import git_state


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture()
def checkout(tmp_path: Path) -> Path:
    """A committed tree shaped like ours: a package under src/, a config, and a generated table under results/."""
    for rel, text in {"src/attnlab/__init__.py": "", "conf/train.yaml": "lr: 1\n",
                      "results/table.md": "| a |\n"}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    return tmp_path


def _state(repo: Path) -> dict:
    return git_state(repo / "src/attnlab/__init__.py")


def test_a_clean_checkout_names_its_commit(checkout: Path) -> None:
    assert _state(checkout) == {"commit": _git(checkout, "rev-parse", "HEAD"), "dirty": False}


def test_regenerated_tables_do_not_make_a_run_dirty(checkout: Path) -> None:
    # the reproduce targets rewrite results/ after every sweep; the next sweep in that worktree is still clean
    (checkout / "results/table.md").write_text("| b |\n")
    (checkout / "runs").mkdir()
    (checkout / "runs/untracked.json").write_text("{}")
    assert _state(checkout)["dirty"] is False


@pytest.mark.parametrize("edited", ["src/attnlab/__init__.py", "conf/train.yaml"])
def test_an_edit_to_code_or_config_makes_a_run_dirty(checkout: Path, edited: str) -> None:
    (checkout / edited).write_text("changed = 1\n")
    assert _state(checkout)["dirty"] is True


def test_outside_a_checkout_provenance_is_unknown(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg/__init__.py").write_text("")
    assert git_state(tmp_path / "pkg/__init__.py") == {"commit": None, "dirty": None}

"""Issue 54 A: writes stay inside the folders the user gave. A run folder whose config parts leave
paths.runs_dir is refused before any folder exists; nothing attnlab or Hydra writes in a run folder follows a
symbolic link planted there."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from attnlab.cli.train import main as train_main
from attnlab.training.storage import LOCK_FILE, RunFolderLock, RunLogFileHandler, StorageError, check_inside
from tests.conftest import TINY, TINY_ALGO
from tests.reliability.helpers import one_clear_line, run_cli

SECRET = "the victim's own bytes\n"


def _in(root: Path, monkeypatch) -> None:
    monkeypatch.chdir(root)
    monkeypatch.delenv("ATTNLAB_RUNS_DIR", raising=False)


def _everything_under(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


@pytest.mark.parametrize(
    "override",
    ["run_name=../../../../escaped", "paths.run_id=../../../../../escaped", "run_name=${oc.env:HOSTILE_NAME}"],
)
def test_a_run_folder_outside_runs_dir_is_refused_before_any_folder_exists(tmp_path, monkeypatch, capsys, override):
    work = tmp_path / "work"
    work.mkdir()
    _in(work, monkeypatch)
    monkeypatch.setenv("HOSTILE_NAME", "../../../../escaped")
    code, err = run_cli(train_main, [*TINY, *TINY_ALGO, "paths.runs_dir=runs", override], capsys)
    line = one_clear_line(err)
    assert code == 2 and "is not inside paths.runs_dir" in line, line
    assert _everything_under(tmp_path) == {"work"}  # no runs/, no escaped/, nothing anywhere


def test_a_sweep_job_outside_its_sweep_folder_is_refused_before_any_job(tmp_path, monkeypatch, capsys):
    _in(tmp_path, monkeypatch)
    code, err = run_cli(train_main, ["-m", *TINY, *TINY_ALGO, "paths.runs_dir=runs", "run_name=../../../x",
                                     "seed=1,2"], capsys)
    line = one_clear_line(err)
    assert code == 2 and "is not inside hydra.sweep.dir" in line and "no job was started" in line
    assert _everything_under(tmp_path) == set()


def test_an_explicit_hydra_run_dir_is_the_users_choice(tmp_path):
    check_inside(tmp_path / "runs" / "a" / "b", tmp_path / "runs", "x")  # inside: fine
    with pytest.raises(StorageError, match="not inside paths.runs_dir"):
        check_inside(tmp_path / "runs" / ".." / "b", tmp_path / "runs", "x")
    with pytest.raises(StorageError):
        check_inside(tmp_path / "runs", tmp_path / "runs", "x")  # the runs folder itself is no run folder


@pytest.mark.parametrize("planted", [LOCK_FILE, "train.log", ".hydra/config.yaml", ".hydra/hydra.yaml",
                                     ".hydra", "csv", "checkpoints/last.ckpt"])
def test_a_link_planted_in_a_run_folder_is_refused_and_its_target_untouched(tmp_path, monkeypatch, capsys, planted):
    _in(tmp_path, monkeypatch)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "file").write_text(SECRET)
    run_dir = tmp_path / "run"
    link = run_dir / planted
    link.parent.mkdir(parents=True)
    link.symlink_to(victim if planted in (".hydra", "csv") else victim / "file")
    code, err = run_cli(train_main, [*TINY, *TINY_ALGO, f"hydra.run.dir={run_dir}"], capsys)
    line = one_clear_line(err)
    assert code == 2 and "is a symbolic link" in line and planted in line
    assert (victim / "file").read_text() == SECRET and _everything_under(victim) == {"file"}
    assert link.is_symlink()


def test_the_lock_and_the_log_never_open_a_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text(SECRET)
    (tmp_path / LOCK_FILE).symlink_to(victim)
    with pytest.raises(StorageError, match="symbolic link"):
        RunFolderLock(tmp_path).acquire()
    (tmp_path / "train.log").symlink_to(victim)
    handler = RunLogFileHandler(str(tmp_path / "train.log"), delay=True)
    with pytest.raises(StorageError, match="symbolic link"):
        handler.emit(logging.makeLogRecord({"msg": "appended"}))
    assert victim.read_text() == SECRET


def test_the_log_appends_to_its_own_file(tmp_path):
    handler = RunLogFileHandler(str(tmp_path / "train.log"))
    handler.emit(logging.makeLogRecord({"msg": "one"}))
    handler.close()
    handler = RunLogFileHandler(str(tmp_path / "train.log"))
    handler.emit(logging.makeLogRecord({"msg": "two"}))
    handler.close()
    assert (tmp_path / "train.log").read_text() == "one\ntwo\n"
    assert not os.path.islink(tmp_path / "train.log")


def test_a_file_where_a_run_folder_goes_is_refused(tmp_path, monkeypatch, capsys):
    _in(tmp_path, monkeypatch)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "checkpoints").write_text(SECRET)
    code, err = run_cli(train_main, [*TINY, *TINY_ALGO, f"hydra.run.dir={tmp_path / 'run'}"], capsys)
    assert code == 2 and "checkpoints is a file where the run keeps its checkpoints folder" in one_clear_line(err)
    assert _everything_under(tmp_path / "run") == {"checkpoints"}

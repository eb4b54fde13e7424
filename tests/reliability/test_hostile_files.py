"""Issue 54 D: one line, a non-zero exit and never a traceback for every hostile file — records, baselines
files, config files, data files, task settings that cannot produce data, a vocabulary of specials only — and
attnlab-eval on a full disk or stopped by a signal."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attnlab.cli.evaluate import main as eval_main
from attnlab.cli.train import main as train_main
from attnlab.results.publish import main as publish_main
from attnlab.tasks.base import DataError
from attnlab.tasks.sources import find_file, read_lines
from attnlab.tasks.tokenization import build_tokenizer
from tests.conftest import TINY, TINY_ALGO
from tests.reliability.helpers import one_clear_line, run_cli
from tests.results.conftest import make_record

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _root_logging_as_found():
    """attnlab-eval's main calls ``logging.basicConfig`` on the captured stdout of the test that runs it; a handler
    left on a stream pytest has since closed prints "Logging error" into a later test's stderr, which the
    one-line checks here read. Drop such handlers before each test and the ones a test added after it."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(getattr(handler, "stream", None), "closed", False):
            root.removeHandler(handler)
    before = list(root.handlers)
    yield
    for handler in list(root.handlers):
        if handler not in before:
            root.removeHandler(handler)
TOO_MANY_DIGITS = '{"schema_version": 1, "seed": ' + "9" * 5000 + "}"


def _table_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "attnlab.cli.table", *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO / "src")})


@pytest.mark.parametrize("content", [json.dumps(make_record(experiment="ut/x\x00y")), TOO_MANY_DIGITS])
def test_a_hostile_record_is_one_line_naming_it_in_publish_and_tables(tmp_path, capsys, content):
    record = tmp_path / "runs" / "bad" / "results.json"
    record.parent.mkdir(parents=True)
    record.write_text(content)
    assert publish_main([str(tmp_path / "runs"), str(tmp_path / "published")]) == 2
    assert str(record) in one_clear_line(capsys.readouterr().err)
    assert not (tmp_path / "published").exists()
    done = _table_cli(tmp_path, "table=summary", "runs=runs")
    assert done.returncode == 2 and "runs/bad/results.json" in one_clear_line(done.stderr)


def test_baselines_replace_a_cut_file_in_their_output_folder(tmp_path):
    from attnlab.results.baselines import baselines_file
    from attnlab.training.trivial_baselines import write_baselines

    (tmp_path / "runs").mkdir()
    cut = baselines_file(tmp_path / "out", "ut/table4_copy")
    cut.parent.mkdir(parents=True)
    cut.write_text('{"table": "ut/table4_copy", "baseli')  # a kill -9 in an older, non-atomic writer
    written = write_baselines(REPO / "experiments", tmp_path / "runs", tmp_path / "out", str(tmp_path / "data"),
                              ["ut/table4_copy"])
    assert written == [str(cut)]
    assert json.loads(cut.read_text())["table"] == "ut/table4_copy"


@pytest.mark.parametrize("body", ['seed: !!python/object/apply:os.system ["touch {marker}"]\n',
                                  "seed: !!python/name:os.system\n"])
def test_a_config_file_with_a_python_tag_is_one_line_and_runs_nothing(tmp_path, monkeypatch, capsys, body):
    marker = tmp_path / "ran"
    (tmp_path / "extra" / "experiment").mkdir(parents=True)
    (tmp_path / "extra" / "experiment" / "evil.yaml").write_text("# @package _global_\n" + body.format(marker=marker))
    monkeypatch.chdir(tmp_path)
    code, err = run_cli(train_main, [*TINY, f"hydra.searchpath=[file://{tmp_path / 'extra'}]", "experiment=evil"],
                        capsys)
    line = one_clear_line(err)
    assert code == 2 and "evil.yaml, line 2" in line and "python" in line and "never run" in line
    assert not marker.exists() and not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ([*TINY_ALGO, "task.test_min_len=500"], "task.test_min_len=500 is above"),
        ([*TINY_ALGO, "task.at_scale.cpu.test_max_len=3"], "below task.train_max_len"),
        ([*TINY_ALGO, "task.base=1"], "task.base=1 must be between 2 and 10"),
        (["task=lra/listops", "task.at_scale.cpu.min_len=600"], "task.min_len=600 and task.max_len"),
    ],
)
def test_task_settings_that_cannot_produce_data_are_refused_before_any_folder(tmp_path, monkeypatch, capsys,
                                                                              overrides, needle):
    monkeypatch.chdir(tmp_path)
    code, err = run_cli(train_main, [*TINY, *overrides, "paths.runs_dir=runs"], capsys)
    assert code == 2 and needle in one_clear_line(err)
    assert not (tmp_path / "runs").exists()


def test_a_vocabulary_of_special_tokens_only_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, err = run_cli(train_main, [*TINY, "task=mt/multi30k_en_de", "task.tokenizer.vocab_size=4",
                                     "paths.runs_dir=runs"], capsys)
    assert code == 2 and "task.tokenizer.vocab_size=4 leaves no room" in one_clear_line(err)
    assert not (tmp_path / "runs").exists()
    with pytest.raises(DataError, match="learned no token beyond the 4 special ones"):
        build_tokenizer("word", ["a b c", "d e f"], vocab_size=0, min_frequency=5, cache_dir=tmp_path / "cache")


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_data_file_that_is_not_a_regular_file_says_so(tmp_path, kind):
    path = tmp_path / "train.txt"
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    with pytest.raises(DataError, match=r"train\.txt is not a regular file \(a (FIFO|folder)\)"):
        find_file(tmp_path, "train.txt")
    if kind == "fifo":  # opening it would wait for a writer for ever
        with pytest.raises(DataError, match="not a regular file"):
            read_lines(path)


def _own_copy(trained_run: Path, tmp_path: Path) -> Path:
    """The session's trained run copied: other tests evaluate it too, and write their eval.json there."""
    run = tmp_path / "run"
    shutil.copytree(trained_run, run, ignore=shutil.ignore_patterns("*eval*"))
    return run


def test_eval_on_a_full_disk_is_one_line_and_writes_nothing(trained_run, tmp_path, monkeypatch, capsys):
    import attnlab.results.record as record

    trained_run = _own_copy(trained_run, tmp_path)

    def full(path, text):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(record, "atomic_write_text", full)
    code, err = run_cli(eval_main, [str(trained_run), "which=best"], capsys)
    line = one_clear_line(err)
    assert code == 1 and "No space left on device" in line
    assert not list((trained_run / "checkpoints").glob("*.eval.json"))


STOP_DURING_TEST = """
import os, signal, sys
import lightning as L
original = L.Trainer.test
def test(self, model, *args, **kwargs):
    step = model.test_step
    def stopping(*a, **k):
        os.kill(os.getpid(), signal.SIGTERM)  # as a scheduler would, while decoding
        return step(*a, **k)
    model.test_step = stopping
    return original(self, model, *args, **kwargs)
L.Trainer.test = test
from attnlab.cli.evaluate import main
main(sys.argv[1:])
"""


def test_sigterm_while_evaluating_exits_143_without_eval_json(trained_run, tmp_path):
    trained_run = _own_copy(trained_run, tmp_path)
    done = subprocess.run([sys.executable, "-c", STOP_DURING_TEST, str(trained_run), "which=best"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert done.returncode == 143, done.stderr
    assert "stopped by SIGTERM while evaluating; no eval.json was written" in one_clear_line(done.stderr)
    assert not list((trained_run / "checkpoints").glob("*.eval.json"))


def test_eval_in_a_folder_it_cannot_write_is_one_line_before_testing(trained_run, monkeypatch, capsys):
    import attnlab.training.evaluation as evaluate

    tested = []
    monkeypatch.setattr(evaluate, "_test", lambda *a: tested.append(a))
    real_access = os.access
    # As a read-only file system answers (root ignores permission bits, so chmod cannot stand in for it).
    monkeypatch.setattr(evaluate.os, "access", lambda p, mode: False if Path(p).name == "checkpoints"
                        else real_access(p, mode))
    code, err = run_cli(eval_main, [str(trained_run), "which=best"], capsys)
    assert code == 1 and "is not writable" in one_clear_line(err)
    assert tested == []  # refused before minutes of decoding

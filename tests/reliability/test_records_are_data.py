"""Issue 54 B: a record is data. Rerunning it executes nothing and reads no environment it names; publishing it
copies only the run folder's own regular files; a later failed attempt never replaces a published result."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from attnlab.results.publish import PublishError, publish_runs
from attnlab.results.publish import main as publish_main
from attnlab.results.rerun import RerunError, rerun_command, rerun_record
from attnlab.results.rerun import main as rerun_main
from tests.reliability.helpers import one_clear_line
from tests.results.conftest import make_record

REPO = Path(__file__).resolve().parents[2]
PLAIN = "attnlab-train experiment=demo/copy/vanilla seed=1 scale=cpu hardware=cpu paths.runs_dir=runs"


def _record(root: Path, command: str, **overrides) -> Path:
    run = root / "s1-abababababab"
    run.mkdir(parents=True, exist_ok=True)
    record = make_record(**{"command": command, "metrics.final": {"test/seq_acc": 0.5}, **overrides})
    (run / "results.json").write_text(json.dumps(record))
    return run


class Recorder:
    """A stand-in trainer: keeps the argv and writes the completed record a real run would write."""

    def __init__(self):
        self.argv = None

    def __call__(self, argv):
        self.argv = argv
        runs = Path(next(a.split("=", 1)[1] for a in reversed(argv) if a.startswith("paths.runs_dir=")))
        (runs / "x").mkdir(parents=True)
        (runs / "x" / "results.json").write_text(json.dumps(make_record(**{"metrics.final": {"test/seq_acc": 0.5}})))
        return 0


@pytest.mark.parametrize(
    "hostile",
    [
        "+plugins=[{plugin}]",
        "hydra.searchpath=[file://{folder}]",
        "hydra/launcher=submitit_slurm",
        "hydra.callbacks.x._target_=os.system",
        "callbacks.evil._target_=builtins.exec",
        "paths.run_id=${{oc.env:HOME}}",
        "model.d_model=${{oc.decode:${{oc.env:SECRET}}}}",
        "--config-dir={folder}",
        "paths.run_dir=/tmp/elsewhere",
    ],
)
def test_rerun_refuses_what_a_record_cannot_be_trusted_with_before_anything_runs(tmp_path, hostile, capsys):
    plugin = tmp_path / "evil.py"
    marker = tmp_path / "plugin_ran"
    plugin.write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    token = hostile.format(plugin=plugin, folder=tmp_path)
    run = _record(tmp_path / "published", f"{PLAIN} {shlex.quote(token)}")
    out = tmp_path / "out"
    code = rerun_main([str(run), "--published", str(tmp_path / "published"), "--out", str(out)])
    line = one_clear_line(capsys.readouterr().err)
    assert code == 2 and "not trusted" in line and token in line
    assert not marker.exists() and not out.exists()  # nothing ran, no folder was made


def test_rerun_runs_an_untrusted_override_the_user_passes_again(tmp_path):
    token = f"+plugins=[{tmp_path / 'mine.py'}]"
    run = _record(tmp_path / "published", f"{PLAIN} {token} optim.lr=0.1")
    recorder = Recorder()
    rerun_record(run, tmp_path / "published", tmp_path / "out", runner=recorder, overrides=[token, "optim.lr=0.2"])
    assert recorder.argv.count(token) == 1
    assert "optim.lr=0.1" not in recorder.argv and recorder.argv[-1] == "optim.lr=0.2"  # the user's value wins


def test_rerun_trains_in_out_whatever_folder_the_record_names(tmp_path):
    command = f"{PLAIN} hydra.run.dir=/somewhere/else hydra.sweep.dir=/x paths.runs_dir=/y"
    argv = rerun_command(command, tmp_path / "out", train_executable="attnlab-train")
    folders = [a for a in argv if a.split("=", 1)[0] in ("hydra.run.dir", "hydra.sweep.dir", "paths.runs_dir")]
    assert folders == [f"paths.runs_dir={tmp_path / 'out'}"]


def test_rerun_with_no_refused_override_keeps_the_recorded_command(tmp_path):
    argv = rerun_command(PLAIN + " optim.lr=0.1", tmp_path, train_executable="attnlab-train")
    assert argv == ["attnlab-train", *shlex.split(PLAIN)[1:-1], "optim.lr=0.1", f"paths.runs_dir={tmp_path}"]
    with pytest.raises(RerunError, match="not trusted"):
        rerun_command(PLAIN + " +plugins=[x.py]", tmp_path)


def test_make_rerun_quotes_a_record_path_with_a_space_and_a_quote(tmp_path):
    record = tmp_path / "my runs" / "it's here"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run(["make", "-s", "-o", ".venv/.installed", "rerun", f"RECORD={record}"], cwd=REPO,
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2, done.stderr
    ours = "\n".join(ln for ln in done.stderr.splitlines() if not ln.startswith(("make:", "make[")))
    assert f"no run record at {record}:" in one_clear_line(ours)  # the whole path, as one argument


def _published_run(runs: Path, name: str, **overrides) -> Path:
    run = runs / name
    (run / "ponder").mkdir(parents=True)
    record = make_record(**{"experiment": "ut/table4/ut_copy", "run_dir": str(run), **overrides})
    (run / "results.json").write_text(json.dumps(record))
    (run / "ponder" / "steps.jsonl").write_text('{"step": 1}\n')
    return run


@pytest.mark.parametrize("where", ["ponder/key.jsonl", "ponder", ".hydra/config.yaml"])
def test_publish_refuses_a_link_out_of_the_run_folder_and_writes_nothing(tmp_path, where, capsys):
    secret = tmp_path / "home" / "id_rsa"
    secret.parent.mkdir()
    secret.write_text("-----BEGIN PRIVATE KEY-----\n")
    run = _published_run(tmp_path / "runs", "a")
    link = run / where
    if link.is_dir():
        (link / "steps.jsonl").unlink()
        link.rmdir()
    link.parent.mkdir(exist_ok=True)
    link.symlink_to(secret.parent if where == "ponder" else secret)
    dest = tmp_path / "results" / "runs"
    assert publish_main([str(tmp_path / "runs"), str(dest)]) == 2
    assert "a link out of the run folder" in one_clear_line(capsys.readouterr().err)
    assert not dest.exists() or not any(dest.rglob("*"))
    assert not any(b"PRIVATE" in p.read_bytes() for p in tmp_path.joinpath("results").rglob("*") if p.is_file())


def test_publish_copies_a_link_inside_the_run_folder_and_skips_a_fifo(tmp_path):
    run = _published_run(tmp_path / "runs", "a")
    (run / "ponder" / "again.jsonl").symlink_to(run / "ponder" / "steps.jsonl")
    os.mkfifo(run / "ponder" / "pipe")  # reading it would block for ever
    (published,) = publish_runs([tmp_path / "runs"], tmp_path / "results")
    files = {p.name for p in published.destination.rglob("*")}
    assert {"again.jsonl", "steps.jsonl", "results.json"} <= files and "pipe" not in files
    assert not (published.destination / "ponder" / "again.jsonl").is_symlink()


def test_a_later_failed_attempt_never_replaces_a_published_completed_record(tmp_path):
    dest = tmp_path / "results"
    _published_run(tmp_path / "first", "a", created="2025-01-01T00:00:00+00:00")
    (published,) = publish_runs([tmp_path / "first"], dest)
    kept = (published.destination / "results.json").read_bytes()
    _published_run(tmp_path / "second", "a", status="failed", error="oom", created="2025-02-01T00:00:00+00:00")
    publish_runs([tmp_path / "second"], dest)
    assert (published.destination / "results.json").read_bytes() == kept
    _published_run(tmp_path / "third", "a", created="2025-03-01T00:00:00+00:00")  # a newer completed one does
    publish_runs([tmp_path / "third"], dest)
    assert json.loads((published.destination / "results.json").read_text())["created"].startswith("2025-03")


def test_publish_error_names_the_link(tmp_path):
    run = _published_run(tmp_path / "runs", "a")
    (run / "ponder" / "x").symlink_to("/etc/hostname")
    with pytest.raises(PublishError, match=r"ponder/x: a link out of the run folder \(to /etc/hostname\)"):
        publish_runs([tmp_path / "runs"], tmp_path / "results")

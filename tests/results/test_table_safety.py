"""attnlab-table never destroys or misleads: no overwrite of committed tables from scratch runs, debug runs
marked, hostile inputs (YAML bomb, deeply nested JSON, read-only out=) refused with one line."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from attnlab.cli.table import build_tables
from attnlab.errors import SpecError, TableError
from attnlab.results.loading import load_records
from attnlab.results.render import render_summary
from attnlab.results.safe_yaml import UnsafeYamlError, load_yaml
from attnlab.results.spec import load_spec

BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8)
)


def _cfg(ws: Path, **kw) -> dict:
    return {"table": "toy/t1", "experiments_dir": str(ws / "experiments"), "plot": False, **kw}


def test_bare_table_build_from_scratch_runs_refuses_to_overwrite_published_tables(workspace, put_record):
    out = workspace / "results"
    published = out / "runs"
    published.mkdir(parents=True)
    put_record("pub", seed=1)
    (workspace / "runs" / "pub").rename(published / "pub")
    build_tables(_cfg(workspace, runs=str(published), out=str(out)))  # the committed table
    committed = (out / "toy" / "t1.md").read_bytes()
    assert b"50.00 (n=1)" in committed

    put_record("scratch", seed=1, **{"metrics.final": {"test/seq_acc": 0.0}})  # e.g. a debug run in runs/
    with pytest.raises(TableError, match=r"refusing to overwrite 3 existing .*toy/t1\..*force=true"):
        build_tables(_cfg(workspace, runs=str(workspace / "runs"), out=str(out)))
    assert (out / "toy" / "t1.md").read_bytes() == committed

    build_tables(_cfg(workspace, runs=str(workspace / "runs"), out=str(workspace / "elsewhere")))  # new folder: fine
    build_tables(_cfg(workspace, runs=str(workspace / "runs"), out=str(out), force=True))  # asked explicitly
    assert (out / "toy" / "t1.md").read_bytes() != committed


def test_summary_marks_debug_runs_as_not_results(workspace, put_record):
    put_record("dbg", **{"extra": {"debug": "fdr"}, "metrics.final": {"test/seq_acc": 0.0}})
    put_record("real")
    records, corrupt = load_records([workspace / "runs"])
    lines = {line.split("|")[1].strip(): line for line in render_summary(records, corrupt).splitlines()[2:]}
    dbg = next(v for k, v in lines.items() if k.endswith("dbg"))
    real = next(v for k, v in lines.items() if k.endswith("real"))
    assert "completed (debug=fdr: not a result)" in dbg
    assert "| completed |" in real and "not a result" not in real


def test_yaml_alias_bomb_is_refused_before_it_expands():
    with pytest.raises(UnsafeYamlError, match="alias bomb"):
        load_yaml(BOMB)  # 10^9 leaves once expanded
    assert load_yaml("a: &x [1, 2]\nb: *x\n") == {"a": [1, 2], "b": [1, 2]}  # ordinary aliases still load


def test_yaml_bomb_spec_is_a_spec_error(workspace):
    (workspace / "experiments" / "toy" / "bomb.yaml").write_text(BOMB)
    with pytest.raises(SpecError, match=r"bomb\.yaml: its aliases expand"):
        load_spec("toy/bomb", workspace / "experiments")


def _cli(ws: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ATTNLAB_PAPER_TABLES": str(ws / "experiments" / "paper_tables.yaml")}
    cmd = [sys.executable, "-m", "attnlab.cli.table", f"experiments_dir={ws / 'experiments'}", "plot=false", *args]
    return subprocess.run(cmd, cwd=ws, env=env, capture_output=True, text=True, timeout=120)


def test_hostile_inputs_are_one_line_exit_2(workspace, put_record):
    (workspace / "experiments" / "toy" / "bomb.yaml").write_text(BOMB)
    deep = workspace / "deep" / "r" / "results.json"
    deep.parent.mkdir(parents=True)
    deep.write_text("[" * 200_000 + "]" * 200_000)
    put_record("good")
    # An unwritable out=: a read-only folder (for a non-root user), or a file where the folder should be.
    readonly = workspace / "ro"
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        readonly.write_text("a file, not a folder")
    else:
        readonly.mkdir()
        readonly.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        cases = {
            "bomb": _cli(workspace, "table=toy/bomb", f"runs={workspace / 'runs'}", f"out={workspace / 'o1'}"),
            "deep": _cli(workspace, "table=toy/t1", f"runs={workspace / 'deep'}", f"out={workspace / 'o2'}"),
            "readonly": _cli(workspace, "table=toy/t1", f"runs={workspace / 'runs'}", f"out={readonly}"),
        }
    finally:
        if readonly.is_dir():
            readonly.chmod(stat.S_IRWXU)
    for name, out in cases.items():
        assert out.returncode == 2, (name, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr, (name, out.stderr)
    assert "alias bomb" in cases["bomb"].stderr
    assert "nested too deeply" in cases["deep"].stderr
    assert "writable" in cases["readonly"].stderr
    assert not (workspace / "o1").exists() and not (workspace / "o2").exists()
    assert readonly.is_file() or not any(readonly.iterdir())

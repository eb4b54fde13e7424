"""Issue 54 E and G: a kill -9 inside any atomic writer leaves nothing that the writer's next run keeps; a
compressed data file is read in bounded memory; damaged-but-checksummed cache entries and non-finite costs
are no tracebacks."""

from __future__ import annotations

import gzip
import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from attnlab.cli.table import build_tables
from attnlab.results.publish import publish_runs
from attnlab.results.record import atomic_write_text, temp_prefix
from attnlab.tasks.disk_cache import write_entry
from attnlab.tasks.tokenization import build_tokenizer, encode_all
from tests.results.conftest import make_record, put_record, workspace  # noqa: F401 - fixtures used below

REPO = Path(__file__).resolve().parents[2]

# Runs ``CALL`` in a child process whose ``os.replace`` kills it (SIGKILL) at the ``KILL_AT``-th rename: the
# writer dies with its temporary files written and not yet renamed, as under the OOM killer.
KILLED_WRITER = """
import os, signal, sys
calls = [0]
def replace(src, dst):
    calls[0] += 1
    if calls[0] >= {kill_at}:
        os.kill(os.getpid(), signal.SIGKILL)
    return original(src, dst)
original, os.replace = os.replace, replace
{call}
"""


def _killed(call: str, kill_at: int = 1, env: dict | None = None) -> None:
    done = subprocess.run([sys.executable, "-c", KILLED_WRITER.format(kill_at=kill_at, call=call)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": f"{REPO / 'src'}:{REPO}", **(env or {})})
    assert done.returncode == -signal.SIGKILL, done.stderr


def _temps(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.tmp"))


def test_a_killed_atomic_write_leaves_a_temp_that_the_next_write_removes(tmp_path):
    target = tmp_path / "baselines" / "t.json"
    _killed("from attnlab.results.record import atomic_write_text\n"
            f"atomic_write_text({str(target)!r}, 'cut')")
    assert len(_temps(tmp_path)) == 1 and not target.exists()
    live = target.with_name(temp_prefix(target) + "abcdefgh.tmp")  # this process's: a live writer's
    live.write_text("being written")
    elsewhere = target.with_name(".t.json.otherhost-1.abcdefgh.tmp")  # another machine's: cannot tell
    elsewhere.write_text("being written")
    atomic_write_text(target, "whole\n")
    assert target.read_text() == "whole\n"
    left = {p.name for p in _temps(tmp_path)}
    assert left == {elsewhere.name, live.name}


def test_a_publish_killed_between_renames_leaves_nothing_after_the_next_publish(tmp_path):
    for seed in (1, 2, 3):
        run = tmp_path / "runs" / f"r{seed}"
        (run / "ponder").mkdir(parents=True)
        (run / "results.json").write_text(json.dumps(make_record(experiment="ut/table4/ut_copy", seed=seed)))
        for i in range(5):
            (run / "ponder" / f"p{i}.jsonl").write_text(f'{{"seed": {seed}, "i": {i}}}\n')
    dest = tmp_path / "published"
    _killed(f"from attnlab.results.publish import main\nmain([{str(tmp_path / 'runs')!r}, {str(dest)!r}])",
            kill_at=7)
    assert _temps(dest)
    for folder in dest.glob("ut/table4/ut_copy/*"):  # no record is in place before its artifacts
        if (folder / "results.json").exists():
            assert len(list((folder / "ponder").glob("*.jsonl"))) == 5
    publish_runs([tmp_path / "runs"], dest)
    assert _temps(dest) == []
    assert len(list(dest.rglob("results.json"))) == 3


def test_a_table_build_killed_while_writing_leaves_nothing_after_the_next_build(workspace, put_record):  # noqa: F811
    put_record("a")
    cfg = {"table": "toy/t1", "experiments_dir": str(workspace / "experiments"), "runs": str(workspace / "runs"),
           "out": str(workspace / "out"), "plot": False}
    _killed(f"from attnlab.cli.table import build_tables\nbuild_tables({cfg!r})", kill_at=2,
            env={"ATTNLAB_PAPER_TABLES": os.environ["ATTNLAB_PAPER_TABLES"]})
    assert _temps(workspace / "out")
    build_tables(cfg)
    assert _temps(workspace / "out") == []
    assert (workspace / "out" / "toy" / "t1.md").is_file()


def test_a_killed_cache_write_leaves_nothing_after_the_next_write(tmp_path):
    entry = tmp_path / "x.ids"
    _killed(f"from pathlib import Path\nfrom attnlab.tasks.disk_cache import write_entry\n"
            f"write_entry(Path({str(entry)!r}), b'payload')")
    assert _temps(tmp_path)
    assert write_entry(entry, b"payload")
    assert _temps(tmp_path) == []


GZIP_BOMB_READER = """
import resource, sys
from pathlib import Path
from attnlab.tasks.base import DataError
from attnlab.tasks.sources import read_lines
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
used = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (used + 256 * 2**20, hard))  # far less than the file inflates to
try:
    read_lines(Path(sys.argv[1]))
except DataError as exc:
    print(exc)
"""


def test_a_compressed_file_is_read_in_bounded_memory(tmp_path):
    bomb = tmp_path / "train.txt.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as fh:
        block = b"a" * 2**20
        for _ in range(512):  # 512 MiB without a line end, about 0.5 MB on disk
            fh.write(block)
    assert bomb.stat().st_size < 2**20
    done = subprocess.run([sys.executable, "-c", GZIP_BOMB_READER, str(bomb)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert done.returncode == 0, done.stderr
    assert f"{bomb}:1: line longer than the 100000 characters" in done.stdout


def test_an_encoded_entry_with_ids_past_the_vocabulary_is_encoded_again(tmp_path):
    texts = ["the cat sat on the mat", "a dog sat on a log"] * 3
    tok = build_tokenizer("word", texts, vocab_size=0, cache_dir=tmp_path)
    ids = encode_all(tok, texts, cache_dir=tmp_path)
    (entry,) = (tmp_path / "encoded").glob("*.ids")
    buffer = io.BytesIO()
    np.savez(buffer, ids=np.full(sum(map(len, ids)), 10_000, dtype=np.int32),
             offsets=np.cumsum([0] + [len(x) for x in ids]))
    write_entry(entry, buffer.getvalue())  # a whole entry (its checksum holds) of another vocabulary
    assert encode_all(tok, texts, cache_dir=tmp_path) == ids


@pytest.mark.parametrize("cost", [{"wall_s": float("nan")}, {"tokens_per_s": float("inf"), "wall_s": 5.0}])
def test_a_record_with_a_non_finite_cost_builds_its_table(workspace, put_record, cost):  # noqa: F811
    put_record("a", cost={"wall_s": 10.0, "tokens_per_s": 1000.0, "peak_mem_mb": 200.0, **cost})
    build_tables({"table": "toy/t1", "experiments_dir": str(workspace / "experiments"),
                  "runs": str(workspace / "runs"), "out": str(workspace / "out"), "plot": False})
    row = next(ln for ln in (workspace / "out" / "toy" / "t1.md").read_text().splitlines()
               if ln.startswith("| Transformer"))
    assert "50.00 (n=1)" in row and "nan" not in row.lower() and "inf" not in row.lower()

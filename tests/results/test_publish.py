"""Publishing run records into results/runs, and `attnlab-table check=true` (what CI runs as check-tables)."""

from __future__ import annotations

import json

import pytest
import yaml

from attnlab.cli.table import build_tables
from attnlab.errors import TableError
from attnlab.results.publish import MAX_ARTIFACT_BYTES, main, publish_runs


def _with_artifacts(record_path, ponder: str = '{"step": 1}\n'):
    run = record_path.parent
    seed = json.loads(record_path.read_text())["seed"]
    (run / ".hydra").mkdir()
    (run / ".hydra" / "config.yaml").write_text(f"seed: {seed}\n")  # the config of the record's run
    (run / ".hydra" / "overrides.yaml").write_text(f"- seed={seed}\n")
    (run / "ponder").mkdir()
    (run / "ponder" / "steps.jsonl").write_text(ponder)
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "last.ckpt").write_bytes(b"\0" * 1000)
    return run


def test_publish_copies_record_config_and_artifacts_but_no_checkpoints(workspace, put_record):
    run = _with_artifacts(put_record("a", experiment="ut/table4/ut_copy", seed=2))
    published = publish_runs([workspace / "runs"], workspace / "results" / "runs")
    assert len(published) == 1 and published[0].changed
    dest = workspace / "results" / "runs" / "ut" / "table4" / "ut_copy" / f"s2-{'ab' * 6}"
    assert published[0].destination == dest
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()) == [
        ".hydra/config.yaml", ".hydra/overrides.yaml", "ponder/steps.jsonl", "results.json",
    ]  # fmt: skip
    assert (dest / "results.json").read_bytes() == (run / "results.json").read_bytes()
    again = publish_runs([workspace / "runs"], workspace / "results" / "runs")
    assert not again[0].changed  # the same run publishes the same bytes


def test_publish_skips_debug_ad_hoc_running_and_other_tables(workspace, put_record):
    put_record("debug", experiment="ut/table4/ut_copy", extra={"debug": "fdr"})
    put_record("adhoc", experiment=None)
    put_record("running", experiment="ut/table4/ut_copy", status="running", seed=3)
    put_record("other", experiment="lra/table1/transformer_listops")
    put_record("wanted", experiment="ut/table4/ut_copy", seed=1)
    put_record("failed", experiment="ut/table4/ut_copy", status="failed", error="hub only: offline", seed=2)
    published = publish_runs([workspace / "runs"], workspace / "results" / "runs", only=["ut/table4"])
    assert sorted(p.source.parent.name for p in published) == ["failed", "wanted"]  # a table shows why it failed


def test_publish_prefers_the_completed_run_of_a_config_and_seed(workspace, put_record):
    put_record("done", experiment="demo/copy", created="2025-01-01T00:00:00+00:00")
    put_record("crashed", experiment="demo/copy", status="failed", error="boom", created="2025-02-01T00:00:00+00:00")
    (published,) = publish_runs([workspace / "runs"], workspace / "results" / "runs")
    assert published.source.parent.name == "done"


def test_publish_keeps_the_newer_of_two_runs_of_one_config_and_seed(workspace, put_record):
    put_record("old", experiment="demo/copy", created="2025-01-01T00:00:00+00:00")
    put_record("new", experiment="demo/copy", created="2025-02-01T00:00:00+00:00")
    (published,) = publish_runs([workspace / "runs"], workspace / "results" / "runs")
    assert json.loads((published.destination / "results.json").read_text())["run_dir"] == "runs/new"


def test_publish_refuses_oversized_artifacts_and_writes_nothing(workspace, put_record, capsys):
    _with_artifacts(put_record("big", experiment="demo/copy"), ponder="x" * (MAX_ARTIFACT_BYTES + 1))
    put_record("fine", experiment="demo/copy", seed=5)
    assert main([str(workspace / "runs"), str(workspace / "results" / "runs")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "cap for results/" in err
    assert not (workspace / "results").exists()


def test_publish_only_that_matches_no_finished_run_names_the_experiments_there(workspace, put_record, capsys):
    # a table's name is not an experiment prefix: this once printed "0 record(s)" and exited 0, publishing nothing
    put_record("t", experiment="ut/table5/transformer_reverse", seed=4)
    put_record("u", experiment="ut/table5/ut_reverse", seed=4)
    args = [str(workspace / "runs"), str(workspace / "results" / "runs"), "--only", "ut/table5_reverse"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "ut/table5/transformer_reverse, ut/table5/ut_reverse" in err and "such as ut/table5" in err
    assert not (workspace / "results").exists()
    assert main([*args[:3], "ut/table5"]) == 0 and "2 record(s)" in capsys.readouterr().out
    # nothing finished to publish at all is not an error (a sweep whose runs were all skipped)
    assert publish_runs([workspace / "runs"], workspace / "results" / "runs", only=["ut/table5/ut_reverse"])
    assert publish_runs([workspace / "empty"], workspace / "results" / "runs", only=["ut/table5"]) == []


def test_publish_names_a_missing_runs_folder(workspace, capsys):
    assert main([str(workspace / "nowhere"), str(workspace / "results" / "runs")]) == 2
    assert "no such runs folder" in capsys.readouterr().err


def _cfg(workspace, **extra):
    return {
        "table": "all", "runs": str(workspace / "results" / "runs"), "out": str(workspace / "results"),
        "experiments_dir": str(workspace / "experiments"), "source": "local", **extra,
    }  # fmt: skip


def test_check_passes_on_fresh_tables_and_catches_edits_and_orphans(workspace, put_record):
    put_record("a", experiment="demo/copy")
    publish_runs([workspace / "runs"], workspace / "results" / "runs")
    written = build_tables(_cfg(workspace))
    assert build_tables(_cfg(workspace, check=True)) == []  # nothing written, nothing differs

    md = next(p for p in written if p.suffix == ".md")
    md.write_text(md.read_text().replace("Transformer", "Transformer (hand-edited)"))
    with pytest.raises(TableError, match=r"1 committed table file\(s\) differ.*t1\.md.*make tables"):
        build_tables(_cfg(workspace, check=True))
    build_tables(_cfg(workspace))

    (md.parent / "t0.md").write_text("a table from a deleted spec\n")
    with pytest.raises(TableError, match="no spec generates it"):
        build_tables(_cfg(workspace, check=True))


def test_check_catches_a_record_added_without_rebuilding(workspace, put_record):
    put_record("a", experiment="demo/copy")
    publish_runs([workspace / "runs"], workspace / "results" / "runs")
    build_tables(_cfg(workspace))
    put_record("b", experiment="demo/copy", seed=3)
    publish_runs([workspace / "runs"], workspace / "results" / "runs")
    with pytest.raises(TableError, match="differ"):
        build_tables(_cfg(workspace, check=True))


def test_table_sources_name_the_record_where_it_was_read(workspace, put_record, monkeypatch):
    put_record("a", experiment="demo/copy", run_dir="/elsewhere/runs/a")
    publish_runs([workspace / "runs"], workspace / "results" / "runs")
    monkeypatch.chdir(workspace)
    cfg = _cfg(workspace, runs="results/runs", out="results")
    md = next(p for p in build_tables(cfg) if p.suffix == ".md").read_text()
    assert f"`results/runs/demo/copy/s0-{'ab' * 6}`" in md and "/elsewhere" not in md


def test_readme_blocks_are_filled_by_make_tables_and_held_by_check(workspace, put_record):
    put_record("a", experiment="demo/copy", seed=1)
    publish_runs([workspace / "runs"], workspace / "results" / "runs")
    readme = workspace / "README.md"
    readme.write_text("intro\n<!-- attnlab-table: toy/t1 -->\nstale text\n<!-- /attnlab-table -->\nend\n")
    build_tables(_cfg(workspace, readme=str(readme)))
    text = readme.read_text()
    assert text.startswith("intro\n<!-- attnlab-table: toy/t1 -->\n**Toy copy table**\n") and text.endswith("end\n")
    assert "| Transformer |" in text and "stale text" not in text and "## Sources" not in text
    assert "`results/toy/t1.md`" in text  # the block names the file with the sources
    assert build_tables(_cfg(workspace, readme=str(readme), check=True)) == []

    readme.write_text(text.replace("| Transformer |", "| Transformer (edited) |"))
    with pytest.raises(TableError, match="README.md"):
        build_tables(_cfg(workspace, readme=str(readme), check=True))
    with pytest.raises(TableError, match="no such file"):
        build_tables(_cfg(workspace, readme=str(workspace / "nope.md")))


def test_paper_claims_blocks_say_what_held_with_the_numbers_and_compute_behind_them(workspace, put_record):
    """`make tables` fills each paper README's claims block: the claims of every table of that paper, their
    results from the records (held / not held / not run), the counts, and the runs' total wall time."""
    spec = yaml.safe_load((workspace / "experiments" / "toy" / "t1.yaml").read_text())
    spec["claims"] = [
        {"claim": "UT above the Transformer", "source": "toy", "metric": "Seq. acc.", "a": "UT", "b": "Transformer",
         "test": "greater"},
        {"claim": "ACT above the Transformer", "source": "toy", "metric": "Seq. acc.", "a": "UT + ACT",
         "b": "Transformer", "test": "greater"},
    ]  # fmt: skip
    (workspace / "experiments" / "toy" / "t1.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    for seed, (transformer, ut) in enumerate([(0.20, 0.61), (0.22, 0.63), (0.21, 0.60)]):
        put_record(f"t{seed}", experiment="demo/copy", seed=seed, **{"metrics.final.test/seq_acc": transformer,
                   "cost.wall_s": 600.0})  # fmt: skip
        put_record(f"u{seed}", experiment="demo/copy", seed=seed, **{"model.recurrence": "ut", "config_hash": "cd" * 32,
                   "metrics.final.test/seq_acc": ut, "cost.wall_s": 1200.0})  # fmt: skip
    publish_runs([workspace / "runs"], workspace / "results" / "runs")
    readme = workspace / "README.md"
    readme.write_text("# Toy\n<!-- attnlab-claims: toy -->\nold\n<!-- /attnlab-claims -->\nend\n")
    build_tables(_cfg(workspace, readme=[str(readme)]))
    text = readme.read_text()
    assert "old" not in text and text.endswith("<!-- /attnlab-claims -->\nend\n")
    assert "2 claims: 1 held, 0 not held, 0 inconclusive, 1 not run." in text
    assert "6 completed runs, 1.5 h of run wall time" in text  # 3 x 600 s + 3 x 1200 s
    held = next(line for line in text.splitlines() if "UT above the Transformer" in line)
    assert "+40.3" in held and "**held**" in held  # 61.3 - 21.0 points
    assert "**not run** (UT + ACT: missing" in next(line for line in text.splitlines() if "ACT above" in line)
    assert build_tables(_cfg(workspace, readme=[str(readme)], check=True)) == []

    readme.write_text("<!-- attnlab-claims: nosuchpaper -->\n<!-- /attnlab-claims -->\n")
    with pytest.raises(TableError, match="nosuchpaper"):
        build_tables(_cfg(workspace, readme=[str(readme)]))


def test_results_index_lists_every_table_with_its_runs_claims_and_why_it_is_empty(workspace, put_record):
    """results/README.md, the front page of results/: per experiments folder, one line per table with the rows
    that have runs, the seeds behind them, the claims' results and the laptop protocol (a table without one says
    so); `make check-tables` holds it like the tables."""
    toy = workspace / "experiments" / "toy"
    spec = yaml.safe_load((toy / "t1.yaml").read_text())
    spec["claims"] = [{"claim": "UT above the Transformer", "source": "toy", "metric": "Seq. acc.", "a": "UT",
                       "b": "Transformer", "test": "greater"}]  # fmt: skip
    spec["laptop"] = {"protocol": "copy, 500 updates", "per_run_s": 120, "runs": 9}
    (toy / "t1.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    empty = {**spec, "title": "Toy table nobody can run", "table": "t1", "match": {"task": "algo/elsewhere"},
             "laptop": {"protocol": "None: no local data for it"}}  # fmt: skip
    (toy / "t2.yaml").write_text(yaml.safe_dump(empty, sort_keys=False))
    # a second table over the same runs (as the demo table re-reads UT Table 4): its runs are not counted twice
    rereader = {k: v for k, v in spec.items() if k not in ("claims", "paper", "table")}
    (toy / "t3.yaml").write_text(yaml.safe_dump({**rereader, "title": "The same runs again"}, sort_keys=False))
    (toy / "LOG.md").write_text("# log\n")
    for seed, (transformer, ut) in enumerate([(0.20, 0.61), (0.22, 0.63)]):
        put_record(f"t{seed}", experiment="demo/copy", seed=seed, **{"metrics.final.test/seq_acc": transformer,
                   "cost.wall_s": 1800.0})  # fmt: skip
        put_record(f"u{seed}", experiment="demo/copy", seed=seed, **{"model.recurrence": "ut", "config_hash": "cd" * 32,
                   "metrics.final.test/seq_acc": ut, "cost.wall_s": 1800.0})  # fmt: skip
    publish_runs([workspace / "runs"], workspace / "results" / "runs")
    build_tables(_cfg(workspace))
    index = (workspace / "results" / "README.md").read_text()
    assert "3 tables, 2 with completed runs (4 distinct runs" in index
    assert "2 claims of the papers: 1 held, 0 not held, 0 inconclusive, 1 not run" in index
    assert "## toy" in index and "Toy et al. A toy paper." in index
    assert "`experiments/toy/LOG.md`" in index and "experiments/toy/README.md" not in index  # only what exists
    t1 = next(line for line in index.splitlines() if line.startswith("| [`toy/t1`](toy/t1.md)"))
    # Transformer and UT have 2 seeds each, UT + ACT none; 4 runs x 1800 s = 2.0 h; the claim held
    assert "| 2 of 3 | 2 | 1 / 0 / 0 / 0 | 2.0 | yes (~120 s per run) |" in t1
    t2 = next(line for line in index.splitlines() if line.startswith("| [`toy/t2`]"))
    assert "| 0 of 3 | — | 0 / 0 / 0 / 1 | — | none (the table says why) |" in t2
    assert build_tables(_cfg(workspace, check=True)) == []
    (workspace / "results" / "README.md").write_text(index.replace("1 held", "2 held"))
    with pytest.raises(TableError, match="README.md"):
        build_tables(_cfg(workspace, check=True))

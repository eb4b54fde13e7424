"""Table builder: seeds, paper numbers, missing / failed cells, writers, CLI behaviour."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from attnlab.cli.table import build_tables
from attnlab.errors import SpecError, TableError
from attnlab.results.build import build_table
from attnlab.results.loading import load_records
from attnlab.results.paper import NOT_FOUND, load_paper_tables
from attnlab.results.record import validate_record
from attnlab.results.render import render_csv, render_markdown, render_summary
from attnlab.results.spec import load_spec, spec_from_dict
from attnlab.results.wandb_records import record_from_wandb

REPO = Path(__file__).resolve().parents[2]


def _build(ws: Path, skip_corrupt: bool = False):
    spec = load_spec("toy/t1", ws / "experiments")
    records, corrupt = load_records([ws / "runs"], skip_corrupt=skip_corrupt)
    return build_table(spec, records, load_paper_tables(), corrupt)


def _md_row(md: str, label: str) -> list[str]:
    line = next(line for line in md.splitlines() if line.startswith(f"| {label} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_mean_std_over_three_seeds_and_paper_diff(workspace, put_record, monkeypatch):
    monkeypatch.chdir(workspace)  # sources name records relative to where the table is built
    for seed, acc in enumerate([0.25, 0.5, 0.75]):
        metrics = {"test/seq_acc": acc, "test/char_acc": 0.9}
        put_record(f"t{seed}", seed=seed, scale="paper", **{"metrics.final": metrics})
    built = _build(workspace)  # at the paper's scale, so the table has its Δ column
    row = built.rows[0]
    stat = row.cells[0].stat
    assert (stat.mean, stat.std, stat.n) == (50.0, 25.0, 3)
    assert row.cells[1].stat.mean == pytest.approx(90.0) and row.cells[1].stat.n == 3
    md = render_markdown(built)
    cells = _md_row(md, "Transformer")
    # paper, ours, diff for seq acc; the seq cell has a double-checked override, the table is single-source
    assert cells[1:4] == ["55.00 (d)", "50.00 ± 25.00 (n=3)", "-5.00"]
    assert cells[4] == "91.25 (s)"
    assert cells[7:] == ["123.5K", "1000", "200", "10.0"]
    assert "- **Metric flavour**: accuracy: exact match of the whole target sequence.\n" in md
    # the caption: short labelled lines, not one paragraph (issue 52.9)
    assert "\n- **Scale**: paper.\n" in md and "\n- **Provenance**: git 0123456789ab; hardware" in md
    for seed in range(3):
        assert f"`runs/t{seed}` (seed {seed}, completed" in md and f"attnlab-train paths.run_dir=runs/t{seed}" in md

    rows = list(csv.DictReader(io.StringIO(render_csv(built))))
    first = rows[0]
    assert first["row"] == "Transformer" and first["metric"] == "test/seq_acc"
    assert float(first["ours_mean"]) == 50.0 and float(first["ours_std"]) == 25.0 and first["n"] == "3"
    assert float(first["diff"]) == -5.0 and first["paper_confidence"] == "double-checked"


def test_missing_failed_null_and_not_in_paper_cells(workspace, put_record):
    put_record(
        "ut_fail",
        seed=0,
        status="failed",
        error="RuntimeError: loss is NaN at step 12",
        **{"model.recurrence": "ut", "metrics.final": {}},
    )
    built = _build(workspace)
    md = render_markdown(built)
    t, ut, act = (_md_row(md, label) for label in ("Transformer", "UT", "UT + ACT"))
    # No runs at the paper's scale: no Δ columns (Row, seq paper, seq ours, char paper, char ours, costs).
    assert t[2] == "missing" and t[4] == "missing" and t[5:] == ["missing"] * 4
    assert "0.00" not in t[2]
    assert ut[1] == "n/a"  # null in paper_tables.yaml
    assert ut[2] == "failed (RuntimeError: loss is NaN at step 12)"
    assert ut[3] == "96.00 (s)"
    assert act[1] == "—" and act[2] == "missing"  # no paper_row: not in the paper
    assert "Paper conflict, Universal Transformer.seq_acc: two sources disagree - left null" in md
    assert "- **Ours**: no completed runs yet." in md


def test_failed_seed_beside_completed_ones_and_superseded_duplicates(workspace, put_record):
    put_record("a", seed=0)
    put_record("b", seed=1, status="failed", error="OOM", **{"metrics.final": {}})
    put_record("c_old", seed=0, created="2024-01-01T00:00:00", **{"metrics.final": {"test/seq_acc": 0.0}})
    row = _build(workspace).rows[0]
    assert row.cells[0].stat.n == 1 and row.cells[0].stat.mean == 50.0 and row.cells[0].stat.std is None
    assert row.cells[0].note == "+1 failed"
    assert [r.data["run_dir"] for r in row.superseded] == ["runs/c_old"]
    md = render_markdown(_build(workspace))
    assert _md_row(md, "Transformer")[2] == "50.00 (n=1) [+1 failed]"
    assert "superseded by a newer or better record" in md


def test_unfinished_seeds_are_named_by_their_status(workspace, put_record):
    put_record("a", seed=0)
    put_record("b", seed=1, status="interrupted", **{"metrics.final": {}})
    put_record("c", seed=2, status="running", **{"metrics.final": {}})
    put_record("d", seed=0, status="interrupted", **{"model.recurrence": "ut", "metrics.final": {}})
    md = render_markdown(_build(workspace))
    assert _md_row(md, "Transformer")[2] == "50.00 (n=1) [+1 running, +1 interrupted]"
    assert _md_row(md, "UT")[2] == "interrupted"  # stopped on a signal, resumable: not "running"


def test_null_metric_in_record_is_not_a_number(workspace, put_record):
    put_record("a", seed=0, **{"metrics.final": {"test/seq_acc": None, "test/char_acc": 0.5}})
    put_record("b", seed=1, **{"metrics.final": {"test/seq_acc": 0.75, "test/char_acc": 0.5}})
    row = _build(workspace).rows[0]
    assert row.cells[0].stat.n == 1 and row.cells[0].stat.mean == 75.0
    assert row.cells[0].note == "1 without test/seq_acc"


def test_paper_tables_not_found(workspace, put_record, monkeypatch):
    monkeypatch.setenv("ATTNLAB_PAPER_TABLES", str(workspace / "nowhere.yaml"))
    put_record("a", scale="paper")  # at the paper's scale, so the Δ column is there
    md = render_markdown(_build(workspace))
    assert _md_row(md, "Transformer")[1] == NOT_FOUND
    assert _md_row(md, "Transformer")[3] == ""  # no difference without a paper number


def test_spec_errors_are_one_line(workspace):
    with pytest.raises(SpecError, match=r"unknown table 'toy/t9'; valid: toy/t1, all, summary"):
        load_spec("toy/t9", workspace / "experiments")
    bad = [
        (
            {
                "title": "x",
                "metrics": [{"ours": "a"}],
                "rows": [{"label": "r", "match": {"a": 1}}],
                "colour": 1,
            },
            "unknown key(s) colour",
        ),
        (
            {
                "title": "x",
                "metrics": [{"ours": "a", "direction": "up"}],
                "rows": [{"label": "r", "match": {"a": 1}}],
            },
            "direction must be higher or lower",
        ),
        ({"title": "x", "metrics": [{"ours": "a"}], "rows": [{"label": "r"}]}, "needs a non-empty 'match'"),
        (
            {
                "title": "x",
                "paper": "toy",
                "metrics": [{"ours": "a"}],
                "rows": [{"label": "r", "match": {"a": 1}}],
            },
            "'paper' and 'table' go together",
        ),
    ]
    for data, phrase in bad:
        with pytest.raises(SpecError, match=phrase.replace("(", r"\(").replace(")", r"\)")):
            spec_from_dict(data, "x/y")


def test_spec_naming_a_row_the_paper_lacks_is_an_error(workspace):
    spec = spec_from_dict(
        {
            "title": "x",
            "paper": "toy",
            "table": "t1",
            "metrics": [{"ours": "a", "paper_key": "seq_acc"}],
            "rows": [{"label": "r", "paper_row": "Transfomer", "match": {"a": 1}}],
        },
        "x/y",
    )
    with pytest.raises(TableError, match="no row 'Transfomer'"):
        build_table(spec, [], load_paper_tables())


def test_build_tables_writes_all_formats_deterministically(workspace, put_record):
    for seed in range(2):
        put_record(f"s{seed}", seed=seed)
    cfg = {
        "table": "all",
        "runs": str(workspace / "runs"),
        "out": str(workspace / "out"),
        "experiments_dir": str(workspace / "experiments"),
        "source": "local",
    }
    written = build_tables(cfg)
    names = sorted(p.name for p in written)
    assert names == ["CLAIMS.md", "README.md", "t1.csv", "t1.md", "t1.png", "t1.tex"]
    first = {p: p.read_bytes() for p in written}
    assert first[workspace / "out" / "toy" / "t1.png"].startswith(b"\x89PNG")
    tex = first[workspace / "out" / "toy" / "t1.tex"].decode()
    assert "\\begin{tabular}" in tex and "$\\pm$" in tex and "Seq. acc. $\\uparrow$ paper" in tex
    assert not [p for p in (workspace / "out" / "toy").iterdir() if p.name.startswith(".")]  # no temp files
    build_tables(cfg)
    assert {p: p.read_bytes() for p in written} == first  # `make tables` regenerates byte for byte


def test_skip_corrupt_shows_corrupt_cell(workspace, put_record, record_factory):
    bad = put_record("bad", **{"model.recurrence": "ut"})
    data = json.loads(bad.read_text())
    data["status"] = "exploded"
    bad.write_text(json.dumps(data))
    trunc = workspace / "runs" / "trunc" / "results.json"
    trunc.parent.mkdir()
    trunc.write_text('{"status": "compl')
    with pytest.raises(TableError, match="corrupt run record"):
        _build(workspace)
    md = render_markdown(_build(workspace, skip_corrupt=True))
    assert _md_row(md, "UT")[2] == "corrupt"
    assert "## Corrupt run records (not placed in any row)" in md and "trunc/results.json" in md


def _cli(ws: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ATTNLAB_PAPER_TABLES": str(ws / "experiments" / "paper_tables.yaml")}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "attnlab.cli.table",
            f"experiments_dir={ws / 'experiments'}",
            f"runs={ws / 'runs'}",
            f"out={ws / 'out'}",
            *args,
        ],
        cwd=ws,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_corrupt_record_exits_2_with_one_line_and_writes_nothing(workspace, put_record):
    put_record("good")
    broken = workspace / "runs" / "broken" / "results.json"
    broken.parent.mkdir()
    broken.write_text("{not json")
    out = _cli(workspace, "table=toy/t1")
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert str(broken) in lines[0] and "re-run" in lines[0] and "skip_corrupt=true" in lines[0]
    assert not (workspace / "out").exists()
    assert not (workspace / "outputs").exists() and not (workspace / ".hydra").exists()


def test_cli_writes_tables_and_reports_unknown_spec(workspace, put_record):
    put_record("good")
    out = _cli(workspace, "table=toy/t1")
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in (workspace / "out" / "toy").iterdir()) == [
        "t1.csv",
        "t1.md",
        "t1.png",
        "t1.tex",
    ]
    assert not (workspace / "outputs").exists()  # Hydra writes no run folder
    bad = _cli(workspace, "table=toy/nope")
    assert bad.returncode == 2
    assert bad.stderr.strip() == "attnlab-table: error: unknown table 'toy/nope'; valid: toy/t1, all, summary"


def test_summary_lists_every_record(workspace, put_record, capsys):
    put_record("a", seed=3, **{"model.attention": "qknorm"})
    put_record("b", status="failed", error="boom", **{"metrics.final": {}})
    records, corrupt = load_records([workspace / "runs"])
    text = render_summary(records, corrupt)
    assert "test/char_acc" in text and "qknorm" in text and "failed (boom)" in text
    build_tables({"table": "summary", "runs": str(workspace / "runs"), "experiments_dir": str(workspace)})
    assert "| run | status |" in capsys.readouterr().out


def test_summary_reads_no_logger_copy_and_shows_every_test_split(workspace, put_record, capsys):
    """make demo's summary (issue 52.2): wandb keeps a copy of results.json in the run folder, which once listed the
    run twice; and a length-generalisation test alone (test/) hid that the in-distribution accuracy was 1.0."""
    final = {"test/seq_acc": 0.09, "test_train_len/seq_acc": 1.0}
    flavours = {"splits": "test: lengths 1-200 (10x the longest training length); test_train_len: lengths 1-20"}
    record = put_record("demo", **{"metrics.final": final, "metric_flavours": flavours})
    copy = record.parent / "wandb" / "offline-run-1" / "files" / "results.json"
    copy.parent.mkdir(parents=True)
    copy.write_bytes(record.read_bytes())
    records, corrupt = load_records([workspace / "runs"])
    assert [r.path for r in records] == [record] and not corrupt
    text = render_summary(records, corrupt)
    header = next(line for line in text.splitlines() if line.startswith("| run |"))
    assert "test/seq_acc" in header and "test_train_len/seq_acc" in header
    assert "| 0.09 | 1 |" in text
    assert "test splits: test: lengths 1-200 (10x the longest training length)" in text
    # a record file named directly is read, wherever it lies
    assert len(load_records([copy])[0]) == 1


def test_demo_spec_builds_against_records(tmp_path, put_record, monkeypatch):
    put_record("v", **{"model.attention": "vanilla", "model.recurrence": "stacked"})
    put_record("u", **{"model.attention": "vanilla", "model.recurrence": "ut", "metrics.final": {}})
    spec = load_spec("demo/copy", REPO / "experiments")
    records, _ = load_records([tmp_path / "runs"])
    md = render_markdown(build_table(spec, records, load_paper_tables()))
    assert _md_row(md, "Transformer (vanilla)")[1:3] == ["50.0 (n=1)", "90.0 (n=1)"]
    assert _md_row(md, "Universal Transformer")[1].startswith("missing")
    assert _md_row(md, "Universal Transformer + ACT")[1] == "missing"


def test_wandb_run_maps_to_a_valid_record():
    summary = {"test/seq_acc": 0.5, "_runtime": 12.5, "model/params/total": 1000, "_step": 9}
    config = {
        "seed": 3,
        "task": {"name": "algo/copy"},
        "model": {"name": "t", "attention": {"name": "vanilla"}, "recurrence": {"name": "stacked"}},
        "scale": {"name": "cpu"},
    }
    rec = record_from_wandb(summary, config, "finished", "abc123", "https://wandb.ai/e/p/runs/abc123")
    assert validate_record(rec) == []
    assert (
        rec["metrics"]["final"] == {"test/seq_acc": 0.5}
        and rec["seed"] == 3
        and rec["cost"]["wall_s"] == 12.5
    )


def test_repo_paper_tables_is_a_verbatim_copy_of_shared():
    shared = REPO.parent / "shared" / "paper_tables.yaml"
    if not shared.is_file():
        pytest.skip(f"{shared} not present (only the project's shared workspace has it)")
    assert (REPO / "experiments" / "paper_tables.yaml").read_bytes() == shared.read_bytes()


def test_repo_paper_tables_loads():
    data = yaml.safe_load((REPO / "experiments" / "paper_tables.yaml").read_text())
    assert {"synthesizer", "universal_transformer", "qknorm", "bigbird"} <= set(data)


def test_cli_misspelled_key_is_one_line(workspace):
    out = _cli(workspace, "tabel=toy/t1")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "attnlab-table: error: unknown key 'tabel' (misspelled?); see the keys of the root config with: "
        "attnlab-table --cfg job"
    ]


GLUE_LIKE = {
    "title": "Toy GLUE",
    "metrics": [
        {"ours": "test/mcc", "label": "CoLA", "match": {"task": "glue/cola"}},
        {"ours": "test/f1", "label": "MRPC F1", "match": {"task": "glue/mrpc"}},
        {"ours": "test/acc", "label": "MRPC acc", "match": {"task": "glue/mrpc"}},
        {"label": "Average", "mean_of": ["CoLA", ["MRPC F1", "MRPC acc"]]},
    ],
    "rows": [
        {"label": "Dense", "match": {"experiment": ["t/dense_cola", "t/dense_mrpc"]}},
        {"label": "Random", "match": {"experiment": ["t/random_cola", "t/random_mrpc"]}},
    ],
}


def _glue_run(put_record, variant: str, task: str, seed: int, **metrics) -> None:
    put_record(f"{variant}-{task}-{seed}", seed=seed, task=f"glue/{task}", experiment=f"t/{variant}_{task}",
               **{"metrics.final": metrics})  # fmt: skip


def test_columns_from_different_runs_and_a_per_seed_mean_column(put_record, tmp_path):
    for seed, (mcc, f1, acc) in enumerate([(40.0, 80.0, 70.0), (50.0, 90.0, 80.0)]):
        _glue_run(put_record, "dense", "cola", seed, **{"test/mcc": mcc})
        _glue_run(put_record, "dense", "mrpc", seed, **{"test/f1": f1, "test/acc": acc})
    _glue_run(put_record, "random", "cola", 0, **{"test/mcc": 10.0})
    _glue_run(put_record, "random", "mrpc", 1, **{"test/f1": 60.0, "test/acc": 50.0})  # no common seed
    records, _ = load_records([tmp_path / "runs"])
    built = build_table(spec_from_dict(GLUE_LIKE, "toy/glue"), records, load_paper_tables())
    dense, random = built.rows
    assert [c.stat.mean for c in dense.cells] == [45.0, 85.0, 75.0, pytest.approx((57.5 + 67.5) / 2)]
    # per seed: mean(CoLA, mean(F1, acc)) = (40 + 75) / 2 and (50 + 85) / 2; the std is over those
    assert dense.cells[3].stat.n == 2 and dense.cells[3].stat.std == pytest.approx(7.0710678)
    assert len(dense.used) == 4 and not dense.superseded  # four runs, none hides another of the same seed
    assert random.cells[0].stat.mean == 10.0 and random.cells[1].stat.mean == 60.0
    assert random.cells[3].kind == "missing" and "no seed common" in random.cells[3].note


def test_mean_of_must_name_ours_columns():
    bad = {**GLUE_LIKE, "metrics": [*GLUE_LIKE["metrics"][:3], {"label": "Avg", "mean_of": ["CoLA", "SST-2"]}]}
    with pytest.raises(SpecError, match="mean_of names 'SST-2'.*labels: CoLA, MRPC F1, MRPC acc"):
        spec_from_dict(bad, "toy/glue")
    with pytest.raises(SpecError, match="needs 'ours'.*or 'mean_of'"):
        spec_from_dict({**GLUE_LIKE, "metrics": [{"label": "x"}]}, "toy/glue")


def test_caption_names_overrides_beyond_the_presets(workspace, put_record):
    command = ("/x/attnlab-train -m experiment=ut/table4/a,ut/table4/b seed=1,2 scale=cpu hardware=cpu "
               "paths.runs_dir=runs trainer.max_steps=800 ++task.at_scale.cpu.train_size=64")
    put_record("a", command=command)
    md = render_markdown(_build(workspace))
    assert "overrides beyond the presets: ++task.at_scale.cpu.train_size=64 trainer.max_steps=800." in md


def test_scaled_paper_numbers_keep_their_published_precision():
    from attnlab.results.build import PaperCell
    from attnlab.results.render.common import fmt_paper

    assert fmt_paper(PaperCell(value=float(f"{0.07 * 100:.12g}")), 1) == "7.0"
    assert fmt_paper(PaperCell(value=27.675), 2) == "27.675"  # finer than ours: kept

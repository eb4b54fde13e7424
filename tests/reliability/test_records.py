"""Damaged run records and mistyped specs (issue 38.2): ``attnlab-table`` and ``publish`` refuse them in one
line naming the file (a table may show them as corrupt cells instead, with skip_corrupt=true), and write
nothing. The records are copies of committed ones (UT Table 4, copy), damaged the ways they get damaged."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from attnlab.cli.table import main as table_main
from attnlab.results import publish
from tests.reliability.helpers import one_clear_line, run_cli

REPO = Path(__file__).resolve().parents[2]
PUBLISHED = REPO / "results" / "runs" / "ut" / "table4"


@pytest.fixture
def runs(tmp_path):
    """A runs folder with the committed records of UT Table 4 (copy), and one of them to damage."""
    root = tmp_path / "runs"
    for row in ("transformer_copy", "ut_copy"):
        shutil.copytree(PUBLISHED / row, root / "ut" / "table4" / row)
    victim = sorted((root / "ut" / "table4" / "transformer_copy").glob("s1-*"))[0] / "results.json"
    return root, victim


def _damage(record: Path, how: str) -> None:
    text = record.read_text()
    if how == "truncated":
        record.write_text(text[: len(text) // 2])
    elif how in ("NaN", "Infinity"):
        data = json.loads(text)
        data["metrics"]["final"]["test/seq_acc"] = float("nan") if how == "NaN" else float("inf")
        record.write_text(json.dumps(data))  # json writes NaN / Infinity, which attnlab never does
    elif how == "another run's config":
        data = json.loads(text)
        data["task"] = "algo/reverse"  # e.g. a record copied into the folder of another task's run
        record.write_text(json.dumps(data))


DAMAGES = {"truncated": "not valid JSON", "NaN": "is nan", "Infinity": "is inf",
           "another run's config": "the record says task 'algo/reverse' but the config beside it"}


@pytest.mark.parametrize("how", list(DAMAGES))
def test_the_table_refuses_a_damaged_record_in_one_line_and_writes_nothing(how, runs, tmp_path, capsys):
    root, victim = runs
    _damage(victim, how)
    out = tmp_path / "out"
    code, err = run_cli(table_main, ["table=ut/table4_copy", f"runs={root}", f"out={out}"], capsys)
    line = one_clear_line(err)
    assert code == 2 and str(victim) in line and DAMAGES[how] in line, line
    assert not out.exists() or not any(out.rglob("*"))


def test_skip_corrupt_shows_the_record_as_a_corrupt_cell_beside_the_others(runs, tmp_path, capsys):
    root, victim = runs
    _damage(victim, "NaN")
    out = tmp_path / "out"
    table_main(["table=ut/table4_copy", f"runs={root}", f"out={out}", "skip_corrupt=true", "plot=false"])
    text = (out / "ut" / "table4_copy.md").read_text()
    transformer = next(line for line in text.splitlines() if line.startswith("| Transformer |"))
    assert "(n=4)" in transformer and "+1 corrupt" in transformer, transformer


@pytest.mark.parametrize("how", list(DAMAGES))
def test_publish_refuses_a_damaged_record_in_one_line_and_writes_nothing(how, runs, tmp_path, capsys):
    root, victim = runs
    _damage(victim, how)
    dest = tmp_path / "published"
    code = publish.main([str(root), str(dest)])
    line = one_clear_line(capsys.readouterr().err)
    assert code == 2 and str(victim) in line and DAMAGES[how] in line and "fix or delete it" in line, line
    assert not dest.exists()


def test_publish_outside_only_leaves_a_damaged_record_of_another_table_alone(runs, tmp_path, capsys):
    root, victim = runs
    _damage(victim, "NaN")  # a Transformer record; --only asks for the UT rows
    code = publish.main([str(root), str(tmp_path / "published"), "--only", "ut/table4/ut_copy"])
    assert code == 0, capsys.readouterr().err
    assert len(list((tmp_path / "published").rglob("results.json"))) == len(list((PUBLISHED / "ut_copy").iterdir()))


def test_a_spec_row_naming_no_preset_and_no_record_is_a_typo_not_a_missing_row(runs, tmp_path, capsys):
    root, _ = runs
    experiments = tmp_path / "experiments"
    shutil.copytree(REPO / "experiments", experiments)
    spec = experiments / "ut" / "table4_copy.yaml"
    spec.write_text(spec.read_text().replace("experiment: ut/table4/ut_copy}", "experiment: ut/table4/ut_cpoy}"))
    code, err = run_cli(table_main, ["table=ut/table4_copy", f"runs={root}", f"out={tmp_path / 'out'}",
                                     f"experiments_dir={experiments}"], capsys)
    line = one_clear_line(err)
    assert code == 2 and "'ut/table4/ut_cpoy', which is no preset" in line, line
    assert "did you mean 'ut/table4/ut_copy'?" in line, line

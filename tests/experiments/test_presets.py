"""Paper presets and table specs agree with each other, with paper_tables.yaml and with the make targets.

Reads files only (fast): composing and building the presets is test_rules.py's job.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from attnlab.results.spec import load_spec
from tests.conftest import REPO
from tests.experiments.paper_presets import (
    EXPERIMENT_CONF,
    SPECS,
    paper_table_key,
    paper_tables,
    preset_yaml,
    presets,
    spec_files,
    table_dirs,
)

TABLE_DIRS = table_dirs()
PRESETS = [p for t in TABLE_DIRS for p in presets(t)]


def test_the_priority_tables_have_presets():
    for table in ("ut/table4", "lra/table1"):
        assert table in TABLE_DIRS, f"no presets under conf/experiment/{table}"


@pytest.mark.parametrize("experiment", PRESETS)
def test_preset_names_itself_and_a_published_row(experiment):
    text = (EXPERIMENT_CONF / f"{experiment}.yaml").read_text(encoding="utf-8")
    assert text.startswith("# @package _global_"), f"{experiment}: presets must be '# @package _global_'"
    data = yaml.safe_load(text)
    assert data["experiment_name"] == experiment, "experiment_name must be the preset's path (tables match on it)"
    paper, table = paper_table_key(experiment.rsplit("/", 1)[0])
    rows = paper_tables()[paper]["tables"][table]["rows"]
    assert data.get("row") in rows, f"{experiment}: row {data.get('row')!r} is not a row of {paper}.{table}"
    assert data.get("defaults"), f"{experiment}: a preset names its groups with override /group: option"


@pytest.mark.parametrize("table_dir", TABLE_DIRS)
def test_every_preset_is_a_row_of_one_spec_and_every_spec_row_has_a_preset(table_dir):
    """A preset is a row of exactly one spec, except a control row that a pre-registered spec reads again
    (synthesizer/fixed_table2_lm1b_rv reads fixed_table2_lm1b's Transformer seeds); the spec that trains it comes
    first by name."""
    files = spec_files(table_dir)
    assert files, f"no table spec experiments/{table_dir}.yaml (or {table_dir}_<task>.yaml)"
    paper, table = paper_table_key(table_dir)
    mine = set(presets(table_dir))
    used: list[str] = []
    for path in files:
        spec = load_spec(f"{path.parent.name}/{path.stem}", SPECS)
        assert (spec.paper, spec.table) == (paper, table), f"{path.name}: paper/table must be {paper}/{table}"
        assert spec.match.get("extra.debug", "absent") is None, f"{path.name}: keep debug runs out (extra.debug: null)"
        for row in spec.rows:
            experiments = row.match.get("experiment")  # one preset, or one per column (GLUE: one per task)
            for experiment in experiments if isinstance(experiments, list) else [experiments]:
                assert experiment in mine, f"{path.name}: row {row.label!r} names {experiment!r}, not a preset"
                assert row.paper_row == preset_yaml(experiment)["row"], f"{path.name}: {row.label!r}: paper_row != row"
                if experiment in used and spec.preregistered is not None:
                    continue  # a pre-registered spec may share a control row another spec of the folder trains
                used.append(experiment)
        for m in spec.metrics:  # a column of a multi-run row must say which of the row's runs it reads
            many = any(isinstance(r.match.get("experiment"), list) for r in spec.rows)
            assert m.mean_of is not None or not many or m.match, f"{path.name}: column {m.label!r} needs a match"
    assert sorted(used) == sorted(mine), f"presets without a spec row (or used twice): {sorted(set(mine) ^ set(used))}"


def listing_blocks(text: str) -> dict[str, str]:
    """``make reproduce-list``'s output as target -> its block joined into one line (the block wraps to fit a
    terminal: every line at most 100 characters)."""
    assert all(len(line) <= 100 for line in text.splitlines()), "a reproduce-list line does not fit a terminal"
    blocks: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("reproduce-"):
            name = line.split(":", 1)[0]
            blocks[name] = ""
        else:
            blocks[name] += " " + line.strip()
    return {k: v.strip() for k, v in blocks.items()}


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_reproduce_targets_run_every_preset_as_one_multirun_and_build_every_spec():
    # The listing composes every preset (about 40 CPU-s); the limit only guards against a hang, on a loaded machine too.
    out = subprocess.run(["make", "-s", "reproduce-list"], cwd=REPO, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    listing = listing_blocks(out.stdout)
    for table_dir in TABLE_DIRS:
        target = "reproduce-" + table_dir.replace("/", "-")
        assert target in listing, f"no make target {target} (make/reproduce.mk)"
        rows = ", ".join(p.split("/")[-1] for p in presets(table_dir))
        assert f"rows ({table_dir}/): {rows}" in listing[target]
        for path in spec_files(table_dir):
            assert f"{path.parent.name}/{path.stem}" in listing[target]
    dry = subprocess.run(
        ["make", "-n", "reproduce-ut-table4", "SEEDS=4,5", "SCALE=paper", "HARDWARE=gpu8",
         "LAUNCHER=submitit_slurm_attnlab", "ARGS=trainer.max_steps=7", "STAMP="],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert dry.returncode == 0, dry.stderr
    train = next(line for line in dry.stdout.splitlines() if "attnlab-train -m" in line)
    assert train.startswith("ATTNLAB_SKIP_EXISTING=1 ")
    for piece in (f"experiment={','.join(presets('ut/table4'))}", "seed=4,5", "scale=paper", "hardware=gpu8",
                  "hydra/launcher=submitit_slurm_attnlab", "trainer.max_steps=7"):
        assert piece in train
    assert "attnlab.results.publish runs results/runs --only ut/table4" in dry.stdout
    assert "attnlab-table table=ut/table4_copy runs=results/runs out=results/" in dry.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_reproduce_rows_filter_runs_only_the_matching_rows_and_refuses_a_pattern_matching_none():
    def dry(*make_args):
        return subprocess.run(["make", "-n", "reproduce-qknorm-table1", "STAMP=", *make_args],
                              cwd=REPO, capture_output=True, text=True, timeout=60)

    out = dry("ROWS=%gl_en")
    assert out.returncode == 0, out.stderr
    train = next(line for line in out.stdout.splitlines() if "attnlab-train -m" in line)
    assert "experiment=qknorm/table1/baseline_gl_en,qknorm/table1/qknorm_gl_en " in train
    # every spec of the table is still built: the rows not run show as missing
    assert "attnlab-table table=qknorm/table1_ar_en" in out.stdout
    refused = subprocess.run(["make", "reproduce-qknorm-table1", "STAMP=", "ROWS=%no_such_pair"],
                             cwd=REPO, capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0
    assert "match ROWS=%no_such_pair" in refused.stderr

"""Tables that cannot mislead: one configuration per cell, Δ only at the paper's scale, the paper's metric
flavour, pair cells in two columns, committed records found by the skip lookup, the reproduce listing."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import yaml

from attnlab.errors import TableError
from attnlab.results.build import build_table
from attnlab.results.claims import evaluate_claims
from attnlab.results.listing import Target, estimate, published_runs, table_targets
from attnlab.results.loading import load_records
from attnlab.results.lookup import find_completed, search_roots
from attnlab.results.paper import load_paper_tables
from attnlab.results.render import render_markdown
from attnlab.results.spec import list_specs, load_spec, spec_from_dict
from tests.conftest import REPO
from tests.results.conftest import SPEC

EXPERIMENTS = REPO / "experiments"


def _build(ws):
    records, corrupt = load_records([ws / "runs"])
    return build_table(load_spec("toy/t1", ws / "experiments"), records, load_paper_tables(), corrupt)


def _with_config(put_record, name: str, config: dict, **overrides):
    path = put_record(name, **overrides)
    (path.parent / ".hydra").mkdir()
    (path.parent / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    return path


def test_a_cell_never_pools_two_configurations(workspace, put_record):
    base = {"seed": 1, "scale": {"name": "cpu"}, "trainer": {"max_steps": 800}, "paths": {"run_dir": "/a"}}
    _with_config(put_record, "s1", base, seed=1, **{"metrics.final": {"test/seq_acc": 0.5}})
    # Same configuration, other seed and run folder: pooled.
    _with_config(put_record, "s2", {**base, "seed": 2, "paths": {"run_dir": "/b"}}, seed=2)
    built = _build(workspace)
    assert built.rows[0].cells[0].stat.n == 2
    # A paper-scale run of the same row is another experiment, not a third seed: refused, naming the key.
    _with_config(put_record, "p3", {**base, "seed": 3, "scale": {"name": "paper"}}, seed=3, scale="paper",
                 **{"metrics.final": {"test/seq_acc": 0.99}})  # fmt: skip
    refused = r"row 'Transformer'.*2 different configurations.*scale\.name: 'cpu' vs 'paper'"
    with pytest.raises(TableError, match=refused):
        _build(workspace)


def test_old_and_new_records_compare_the_config_before_the_scale_blocks(workspace, put_record):
    before = {"seed": 1, "scale": {"name": "cpu"}, "model": {"d_model": 512}}  # the preset as composed
    _with_config(put_record, "old", before, seed=1)  # written before config.yaml held the scaled config
    new = _with_config(put_record, "new", {**before, "seed": 2, "model": {"d_model": 128}}, seed=2)  # scaled
    (new.parent / ".hydra" / "config_before_scale.yaml").write_text(yaml.safe_dump({**before, "seed": 2}))
    assert _build(workspace).rows[0].cells[0].stat.n == 2


def test_records_without_a_config_file_are_told_apart_by_their_command(workspace, put_record):
    put_record("a", seed=1, command="attnlab-train experiment=x seed=1 trainer.max_steps=800")
    put_record("b", seed=2, command="attnlab-train experiment=x seed=2 trainer.max_steps=100000")
    with pytest.raises(TableError, match=r"override:trainer\.max_steps: '800' vs '100000'"):
        _build(workspace)


def test_command_keys_the_config_hash_leaves_out_do_not_split_a_cell(workspace, put_record):
    # One exclusion list (results.record.DEFAULT_HASH_EXCLUDE) for the hash, the saved config and the command.
    put_record("a", seed=1, command="attnlab-train experiment=x seed=1 trainer.log_every_n_steps=10 "
                                    "hardware.num_workers=0 paths.data_root=/d hydra.run.dir=/r")
    put_record("b", seed=2, command="attnlab-train experiment=x seed=2 callbacks.record_attention=true "
                                    "logger=wandb resume=never")
    assert _build(workspace).rows[0].cells[0].stat.n == 2



def test_config_group_overrides_of_excluded_groups_do_not_split_a_cell(workspace, put_record):
    # make reproduce picks the launcher per machine (make/reproduce.mk): hydra/launcher=... is Hydra's runtime,
    # as hydra.launcher.n_jobs is; logger/... is where metrics go.
    put_record("a", seed=1, command="attnlab-train -m experiment=x seed=1 hydra/launcher=joblib_attnlab logger/wandb=a")
    put_record("b", seed=2, command="attnlab-train -m experiment=x seed=2 hydra/launcher=basic logger/wandb=b")
    assert _build(workspace).rows[0].cells[0].stat.n == 2

def test_init_from_is_compared_inside_its_runs_dir(workspace, put_record):
    # Two seeds of a T5-path row, each swept into its own RUNS dir: the same pre-training step, one cell.
    ckpt = "t5_pretrain/${pretrain_experiment}-s${seed}/checkpoints/last.ckpt"
    for seed in (1, 2):
        config = {"seed": seed, "init_from": f"runs_t{seed}/{ckpt}", "paths": {"runs_dir": f"runs_t{seed}"}}
        _with_config(put_record, f"s{seed}", config, seed=seed)
    assert _build(workspace).rows[0].cells[0].stat.n == 2
    # Another checkpoint inside the same kind of folder is another experiment, and a path outside the runs
    # dir is compared as written.
    config = {"seed": 3, "init_from": "runs_t3/other/last.ckpt", "paths": {"runs_dir": "runs_t3"}}
    _with_config(put_record, "s3", config, seed=3)
    other = r"init_from: '\$\{paths.runs_dir\}/t5_pretrain.* vs '\$\{paths.runs_dir\}/other"
    with pytest.raises(TableError, match=other):
        _build(workspace)


def test_init_from_in_a_command_is_compared_inside_its_runs_dir(workspace, put_record):
    for seed in (1, 2):
        put_record(f"s{seed}", seed=seed, command=f"attnlab-train experiment=x seed={seed} paths.runs_dir=r{seed} "
                                                  f"init_from=r{seed}/pre/last.ckpt")
    assert _build(workspace).rows[0].cells[0].stat.n == 2
    put_record("s3", seed=3, command="attnlab-train experiment=x seed=3 init_from=/elsewhere/last.ckpt")
    with pytest.raises(TableError, match=r"override:init_from"):
        _build(workspace)


def test_a_key_added_to_a_preset_later_does_not_split_a_cell(workspace, put_record):
    base = {"seed": 1, "model": {"d_model": 128}}
    _with_config(put_record, "old", base, seed=1)
    _with_config(put_record, "new", {"seed": 2, "model": {"d_model": 128, "new_knob": "old behaviour"}}, seed=2)
    assert _build(workspace).rows[0].cells[0].stat.n == 2


def test_delta_only_at_the_papers_scale(workspace, put_record, monkeypatch):
    monkeypatch.chdir(workspace)
    put_record("cpu", seed=1)
    md = render_markdown(_build(workspace))
    header = next(line for line in md.splitlines() if line.startswith("| Row |"))
    assert "Δ" not in header and "no Δ column: our runs are at laptop scale" in md
    (workspace / "runs" / "cpu" / "results.json").unlink()
    put_record("paper", seed=1, scale="paper")
    md = render_markdown(_build(workspace))
    row = next(line for line in md.splitlines() if line.startswith("| Transformer |"))
    assert "| -5.00 |" in row and "no Δ column" not in md  # 50.00 ours vs 55.0 paper
    put_record("ut-cpu", seed=1, **{"model.recurrence": "ut"})  # another row, at laptop scale
    cells = [c.strip() for c in next(line for line in render_markdown(_build(workspace)).splitlines()
                                     if line.startswith("| UT |")).strip("|").split("|")]  # fmt: skip
    assert cells[4:7] == ["96.00 (s)", "90.00 (n=1)", ""]  # its char. acc.: paper and ours, no difference


def test_pair_cells_need_a_part_and_split_into_two_columns(workspace, put_record):
    paper = yaml.safe_load((workspace / "experiments" / "paper_tables.yaml").read_text())
    paper["toy"]["tables"]["t1"]["rows"]["Transformer"]["char_acc"] = "72.1/83.9"
    (workspace / "experiments" / "paper_tables.yaml").write_text(yaml.safe_dump(paper))
    with pytest.raises(TableError, match=r"Transformer\.char_acc holds two numbers \(72\.1/83\.9\); give the column"):
        _build(workspace)
    spec = {**SPEC, "metrics": [
        {"ours": "test/char_acc", "label": "F1", "paper_key": "char_acc", "paper_part": 1},
        {"ours": "test/seq_acc", "label": "Acc", "paper_key": "char_acc", "paper_part": 2},
    ]}  # fmt: skip
    (workspace / "experiments" / "toy" / "t1.yaml").write_text(yaml.safe_dump(spec))
    cells = _build(workspace).rows[0].paper
    assert [c.value for c in cells] == [72.1, 83.9]


def test_ut_table7_compares_the_papers_tokenized_bleu_with_ours():
    spec = load_spec("ut/table7", EXPERIMENTS)
    with_paper = [m for m in spec.metrics if m.paper_key]
    assert [m.ours for m in with_paper] == ["test/tok_bleu"]


@pytest.mark.parametrize("name", sorted(list_specs(EXPERIMENTS)))
def test_every_spec_has_sourced_claims_the_papers_own_numbers_satisfy(name):
    spec = load_spec(name, EXPERIMENTS)
    # a paper table states the paper's claims; the demo (no paper) re-reads UT Table 4's runs and draws none
    assert spec.claims or not spec.paper, f"{name}: no claims"
    assert all(c.source.strip() for c in spec.claims)
    built = build_table(spec, [], load_paper_tables(experiments_dir=EXPERIMENTS))
    for result in evaluate_claims(built):
        assert result.status == "not run"  # no records: never a silent pass
        assert result.paper_agrees is not False, f"{name}: {result.spec.claim!r} contradicts the paper's own numbers"


def test_bigbird_specs_name_the_presets_of_their_rows():
    t1 = load_spec("bigbird/table1_building_blocks", EXPERIMENTS)
    assert [r.match["experiment"] for r in t1.rows] == [
        f"bigbird/table1/{r}" for r in ("full", "random_only", "window_only", "random_window")
    ]
    assert [m.ours for m in t1.metrics][0] == "test/mlm_acc"
    t10 = load_spec("bigbird/table10_mlm_bpc", EXPERIMENTS)
    assert [r.match["experiment"] for r in t10.rows] == [
        f"bigbird/table10/{r}" for r in ("full_512", "bigbird_itc_2048", "bigbird_itc_4096")
    ]
    assert [m.ours for m in t10.metrics][:2] == ["test/bits_per_token", "test/bpc"]


def test_published_records_are_found_by_the_skip_lookup(tmp_path, record_factory, monkeypatch):
    monkeypatch.chdir(tmp_path)
    published = tmp_path / "results" / "runs" / "ut" / "table4" / "ut_copy" / "s1"
    published.mkdir(parents=True)
    (published / "results.json").write_text(json.dumps(record_factory(config_hash="cd" * 32)))
    (tmp_path / "runs").mkdir()
    roots = search_roots("runs", environ={})
    assert [str(r) for r in roots] == ["runs", "results/runs"]
    assert find_completed(roots, "cd" * 32) == published.relative_to(tmp_path) / "results.json"
    assert find_completed("runs", "cd" * 32) is None  # what the lookup saw before: a clean clone retrained it
    assert search_roots("runs", environ={"ATTNLAB_PUBLISHED_RUNS": "runs"}) == [search_roots("runs", {})[0]]


def test_listing_estimates_from_the_laptop_block_or_says_not_measured():
    spec = spec_from_dict({**SPEC, "laptop": {"protocol": "p", "per_run_s": 300, "runs": 6}}, "toy/t1")
    bare = spec_from_dict(SPEC, "toy/t2")
    assert estimate(Target("t", [], [spec]), seeds=3) == "~45 min (toy/t1: 9 runs x 300 s)"
    assert estimate(Target("t", [], [spec, bare]), seeds=1).endswith("; not measured: toy/t2")
    none = spec_from_dict({**SPEC, "laptop": {"protocol": "None: no local data"}}, "toy/t3")
    assert estimate(Target("t", [], [spec, none]), seeds=1).endswith("; no laptop protocol (see the spec): toy/t3")
    # make runs JOBS single-threaded runs at once: two at a time halve the wall time
    assert estimate(Target("t", [], [spec]), seeds=3, jobs=2) == "~22 min with 2 runs at once (toy/t1: 9 runs x 300 s)"
    names = [t.name for t in table_targets(REPO / "src/attnlab/conf/experiment", EXPERIMENTS)]
    for target in ("reproduce-ut-table4", "reproduce-bigbird-table1", "reproduce-bigbird-table10",
                   "reproduce-synthesizer-table4-t5", "reproduce-synthesizer-table5-t5"):  # fmt: skip
        assert target in names


def test_listing_leaves_out_published_runs_and_uses_their_measured_wall_time(workspace, put_record):
    """make reproduce-list with committed records: runs of the asked seeds already published are done (the
    targets skip them) and the rest is timed by the median wall time the table's runs really took here."""
    spec_path = workspace / "experiments" / "toy" / "t1.yaml"
    spec_path.write_text(yaml.safe_dump({**SPEC, "laptop": {"protocol": "p", "per_run_s": 300, "runs": 9}}))
    spec = load_spec("toy/t1", workspace / "experiments")
    for seed, wall in ((1, 100.0), (2, 200.0), (7, 900.0)):  # seed 7 is not asked for: not done, still timed
        put_record(f"t{seed}", experiment="demo/copy", seed=seed, **{"cost.wall_s": wall})
    put_record("failed", experiment="demo/copy", seed=3, status="failed", error="boom", **{"cost.wall_s": 5.0})
    published = published_runs([spec], workspace / "runs", workspace / "experiments")
    assert published["toy/t1"].done == {("Transformer", 1), ("Transformer", 2), ("Transformer", 7)}
    # 3 rows x seeds 1-3 = 9 runs, 2 published (both Transformer). The Transformer's seed 3 is timed by its own
    # records, median(100, 200, 900) = 200 s; the UT rows have none: the spec's 300 s. 200 + 6 x 300 = 2000 s.
    assert estimate(Target("t", [], [spec]), [1, 2, 3], 1, published) == (
        "~33 min (toy/t1: 7 of 9 runs to train x 286 s on average: measured for 1 of 3 rows, the spec's estimate "
        "for the rest)"
    )
    # Rows of one table differ (a UT applies its layer 8 times: UT Table 1's UT runs took 4x the Transformer's):
    # a row with records is timed by its own, never by another row's. UT: 2 x 1000 s; Transformer 200; ACT 3 x 300.
    put_record("ut1", experiment="demo/copy", seed=1, **{"model.recurrence": "ut", "cost.wall_s": 1000.0})
    published = published_runs([spec], workspace / "runs", workspace / "experiments")
    assert published["toy/t1"].by_row == {"Transformer": [100.0, 200.0, 900.0], "UT": [1000.0]}
    assert estimate(Target("t", [], [spec]), [1, 2, 3], 1, published) == (
        "~52 min (toy/t1: 6 of 9 runs to train x 517 s on average: measured for 2 of 3 rows, the spec's estimate "
        "for the rest)"
    )
    # Without an estimate in the spec, a row with no records takes the table's median: 550 s of 100/200/900/1000;
    # 2 x 1000 + 200 + 3 x 550 = 3850 s.
    spec_path.write_text(yaml.safe_dump({**SPEC, "laptop": {"protocol": "p", "runs": 9}}))
    bare = load_spec("toy/t1", workspace / "experiments")
    bare_published = published_runs([bare], workspace / "runs", workspace / "experiments")
    assert estimate(Target("t", [], [bare]), [1, 2, 3], 1, bare_published) == (
        "~64 min (toy/t1: 6 of 9 runs to train x 642 s on average: measured for 2 of 3 rows, the table's median "
        "for the rest)"
    )
    assert estimate(Target("t", [], [spec]), [1, 2, 3], 1, {}) == "~45 min (toy/t1: 9 runs x 300 s)"
    assert published_runs([spec], workspace / "nowhere", workspace / "experiments") == {}
    # A spec found unable to test its claims (protocol "None ...", BigBird Table 1) keeps the runs of its earlier
    # protocol published; the listing still says there is no laptop protocol rather than timing a rerun.
    spec_path.write_text(yaml.safe_dump({**SPEC, "laptop": {"protocol": "None at this budget: pilots failed"}}))
    dropped = load_spec("toy/t1", workspace / "experiments")
    published = published_runs([dropped], workspace / "runs", workspace / "experiments")
    assert published["toy/t1"].alone_s
    assert estimate(Target("t", [], [dropped]), [1, 2, 3], 1, published) == (
        "no laptop protocol (see the spec): toy/t1"
    )


def test_listing_times_single_threaded_runs_by_their_cpu_time(workspace, put_record):
    """A run measured beside other jobs has an inflated wall time (Synthesizer En-De: 1249 s beside three
    processes, ~630 s alone); at one torch thread its CPU time is what it costs alone, so that is what the
    estimate uses. A multi-threaded run's CPU time overstates its wall time, and old records have none: wall.
    (No estimate in the spec: the rows without records take the table's median.)"""
    spec_path = workspace / "experiments" / "toy" / "t1.yaml"
    spec_path.write_text(yaml.safe_dump({**SPEC, "laptop": {"protocol": "p", "runs": 9}}))
    spec = load_spec("toy/t1", workspace / "experiments")
    put_record("contended", experiment="demo/copy", seed=1,
               **{"cost.wall_s": 1249.0, "cost.cpu_s": 630.0, "cost.torch_threads": 1})  # fmt: skip
    put_record("alone", experiment="demo/copy", seed=2,
               **{"cost.wall_s": 650.0, "cost.cpu_s": 640.0, "cost.torch_threads": 1})  # fmt: skip
    published = published_runs([spec], workspace / "runs", workspace / "experiments")
    # 9 runs, 2 done: 7 x median(630, 640) = 4445 s = ~74 min, not 7 x median(1249, 650) = ~110 min
    assert estimate(Target("t", [], [spec]), [1, 2, 3], 1, published) == (
        "~74 min (toy/t1: 7 of 9 runs to train x 635 s on average: measured for 1 of 3 rows, CPU time, the table's "
        "median for the rest)"
    )
    put_record("two_threads", experiment="demo/copy", seed=3,
               **{"cost.wall_s": 400.0, "cost.cpu_s": 780.0, "cost.torch_threads": 2})  # fmt: skip
    put_record("old", experiment="demo/copy", seed=4, **{"cost.wall_s": 500.0})
    published = published_runs([spec], workspace / "runs", workspace / "experiments")
    # per run: 630, 640 (CPU), 400 (2 threads: wall), 500 (no CPU time: wall) -> median 565
    assert estimate(Target("t", [], [spec]), [1, 2, 3], 1, published) == (
        "~56 min (toy/t1: 6 of 9 runs to train x 565 s measured on other rows, CPU time for 2 of 4)"
    )


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_reproduce_table_n_names_the_matching_targets():
    out = subprocess.run(["make", "-s", "reproduce-table4", "STAMP="], cwd=REPO, capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert out.returncode == 2 and "No rule" not in out.stderr
    for target in ("reproduce-ut-table4", "reproduce-synthesizer-table4", "reproduce-synthesizer-table4-t5"):
        assert f"make {target}\n" in out.stderr
    # no published records (PUBLISHED=none): the hash test composes nothing; it has its own test below
    listing = subprocess.run(["make", "-s", "reproduce-list", "SEEDS=1,2", "STAMP=", "PUBLISHED=none"], cwd=REPO,
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert listing.returncode == 0, listing.stderr
    from tests.experiments.test_presets import listing_blocks

    blocks = listing_blocks(listing.stdout)
    block = blocks["reproduce-lra-table1"]
    assert "seeds: 1,2 " in block and block.startswith("estimated time: ")  # arithmetic: test_listing_estimates_...
    assert "rows (synthesizer/t5/): multitask_superglue_" in blocks["reproduce-synthesizer-table5-t5"]


def test_a_column_the_paper_has_no_number_for_has_no_paper_column(workspace, put_record):
    spec = {**SPEC, "metrics": [*SPEC["metrics"], {"ours": "test/char_acc", "label": "In distribution"}]}
    (workspace / "experiments" / "toy" / "t1.yaml").write_text(yaml.safe_dump(spec))
    put_record("a")
    header = next(line for line in render_markdown(_build(workspace)).splitlines() if line.startswith("| Row |"))
    assert "| In distribution ↑ ours |" in header and "In distribution ↑ paper" not in header
    assert "| Seq. acc. ↑ paper | Seq. acc. ours |" in header


def test_a_note_that_yaml_reads_as_a_mapping_is_refused():
    from attnlab.errors import SpecError

    with pytest.raises(SpecError, match="quote a note that holds ': '"):
        spec_from_dict({**SPEC, "notes": [{"in-distribution": "a row that never learned"}]}, "toy/t1")


def test_reproduce_list_counts_a_published_record_only_where_the_target_would_skip_it(tmp_path, capsys):
    """Issue 52.1: the listing said "0 runs to train" for records of an older config that the target then
    trained again; it applies the target's own hash test and says which keys differ."""
    from attnlab.cli.reproduce_list import main as reproduce_list

    record = next((REPO / "results/runs/ut/fixed_table5/ut_reverse").glob("s21-*"))
    published = tmp_path / "published" / "ut/fixed_table5/ut_reverse" / record.name
    shutil.copytree(record, published)
    argv = ["--seeds", "1", "--conf", str(REPO / "src/attnlab/conf/experiment"),
            "--experiments", str(REPO / "experiments"), "--published", str(tmp_path / "published")]
    assert reproduce_list(argv) == 0
    block = capsys.readouterr().out.split("reproduce-ut-fixed_table5:")[1].split("\n", 3)[:3]
    assert "15 of 16 runs to train" in " ".join(block) and "older config" not in " ".join(block)
    data = json.loads((published / "results.json").read_text())
    (published / "results.json").write_text(json.dumps({**data, "config_hash": "0" * 64}))
    saved = published / ".hydra" / "config.yaml"
    assert "\n  max_steps: 500\n" in saved.read_text()
    saved.write_text(saved.read_text().replace("\n  max_steps: 500\n", "\n  max_steps: 7\n"))
    assert reproduce_list(argv) == 0
    text = " ".join(capsys.readouterr().out.split("reproduce-ut-fixed_table5:")[1].split("seeds:")[0].split())
    assert "16 runs" in text and "1 published record is of an older config" in text and "trainer.max_steps" in text

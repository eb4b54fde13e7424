"""No verdict between rows that learned nothing: a claim on a column with a trivial baseline (``trivial:``) is
decided only when the better compared row beats its task's baseline by the margin in every run (issue 37).

Each case builds records once and evaluates the same claim with and without the column's ``trivial:``: the old rule
decides, the new one reads inconclusive at the baseline (and keeps the verdict above it)."""

from __future__ import annotations

import hashlib
import json

import pytest
import yaml

from attnlab.errors import SpecError, TableError
from attnlab.results.baselines import baselines_document, load_table_baselines
from attnlab.results.build import build_table
from attnlab.results.claims import HELD, INCONCLUSIVE, NOT_HELD, evaluate_claims
from attnlab.results.loading import load_records
from attnlab.results.paper import load_paper_tables
from attnlab.results.render.markdown import render_markdown
from attnlab.results.spec import load_spec, spec_from_dict
from tests.results.conftest import SPEC

BASELINE = 0.2  # the trivial baseline of the toy task's test/seq_acc, in record units (20 shown)


def _h(name: str) -> str:
    """A run's config hash (records hold a hex digest) named after the run."""
    return hashlib.sha256(name.encode()).hexdigest()


def _seeds(put_record, recurrence: str, accs: list[float], task_hash: str = "t") -> None:
    for seed, acc in enumerate(accs):
        put_record(f"{recurrence}-{seed}", seed=seed, config_hash=_h(f"{recurrence}{seed}"),
                   **{"model.recurrence": recurrence, "metrics.final": {"test/seq_acc": acc}})  # fmt: skip


def _baselines(ws, runs: dict[str, float], table: str = "toy/t1"):
    """The baselines file of the toy table: each run (config hash) -> its task's test/seq_acc baseline."""
    entries = {f"k{v}": {"name": "constant_output", "what": "one constant output", "task": "algo/copy", "seed": 0,
                         "values": {"test/seq_acc": v}, "inputs": []} for v in set(runs.values())}
    doc = baselines_document(table, entries, {_h(name): f"k{v}" for name, v in runs.items()}, "test")
    path = ws / "baselines" / f"{table}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(doc)
    return load_table_baselines(ws / "baselines", table)


def _evaluate(ws, claim: dict, trivial: dict | None, baselines) -> dict:
    metrics = [dict(m) for m in SPEC["metrics"]]
    if trivial is not None:
        metrics[0]["trivial"] = trivial
    spec = {**SPEC, "metrics": metrics, "claims": [claim]}
    (ws / "experiments" / "toy" / "t1.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    records, corrupt = load_records([ws / "runs"])
    built = build_table(load_spec("toy/t1", ws / "experiments"), records, load_paper_tables(), corrupt, baselines)
    return built, evaluate_claims(built)[0]


def _claim(test: str, margin: float = 0.0) -> dict:
    return {"claim": "c", "source": "Table 1 rows", "metric": "Seq. acc.", "a": "UT", "b": "Transformer",
            "test": test, "margin": margin}


def _all_runs(value: float) -> dict[str, float]:
    return {f"{r}{s}": value for r in ("stacked", "ut") for s in range(3)}


def test_rows_at_the_baseline_decide_nothing_that_the_old_rule_decided(workspace, put_record):
    # Both rows at or below the input-blind output (20%): the UT clearly worse than the Transformer. The old
    # rule reads "UT above the Transformer" as not held; it says nothing about the claim.
    _seeds(put_record, "stacked", [0.19, 0.20, 0.21])
    _seeds(put_record, "ut", [0.10, 0.11, 0.12])
    baselines = _baselines(workspace, _all_runs(BASELINE))
    assert _evaluate(workspace, _claim("greater"), None, baselines)[1].status == NOT_HELD
    _, result = _evaluate(workspace, _claim("greater"), {"baseline": "constant_output", "margin": 5}, baselines)
    assert result.status == INCONCLUSIVE and result.at_trivial_baseline
    assert result.reason == ("the runs do not test the claim: Transformer, the better row, at 19.00 in a run, trivial "
                             "baseline 20.00 (it must beat it by more than 5 in every run)")
    assert result.interval is None and "seeds per row would decide" not in result.reason  # no seeds advice


def test_the_better_row_above_the_baseline_keeps_the_verdict_even_when_the_other_fails_the_task(workspace,
                                                                                                 put_record):
    # The UT learned (50%), the Transformer is at the baseline: "UT above" is the paper's own finding (UT Table 4),
    # decided; and "UT within 1 of the Transformer" is decided not held for the same reason.
    _seeds(put_record, "stacked", [0.19, 0.20, 0.21])
    _seeds(put_record, "ut", [0.50, 0.51, 0.52])
    baselines = _baselines(workspace, _all_runs(BASELINE))
    trivial = {"baseline": "constant_output", "margin": 5}
    assert _evaluate(workspace, _claim("greater"), trivial, baselines)[1].status == HELD
    assert _evaluate(workspace, _claim("within", margin=1), trivial, baselines)[1].status == NOT_HELD


def test_the_margin_and_every_run_count(workspace, put_record):
    # The UT beats 20% on average by 8 points but one seed by only 4: with margin 5 the claim is not decided;
    # with margin 3 it is.
    _seeds(put_record, "stacked", [0.05, 0.06, 0.07])
    _seeds(put_record, "ut", [0.24, 0.30, 0.30])
    baselines = _baselines(workspace, _all_runs(BASELINE))
    _, strict = _evaluate(workspace, _claim("greater"), {"baseline": "constant_output", "margin": 5}, baselines)
    assert strict.status == INCONCLUSIVE and "UT, the better row, at 24.00 in a run" in strict.reason
    assert _evaluate(workspace, _claim("greater"), {"baseline": "constant_output", "margin": 3}, baselines)[1].status \
        == HELD


def test_each_run_is_held_to_its_own_tasks_baseline(workspace, put_record):
    # Seed-dependent data: the UT's seed 2 has a task whose constant output scores 40%; its 41% does not beat it.
    _seeds(put_record, "stacked", [0.05, 0.06, 0.07])
    _seeds(put_record, "ut", [0.50, 0.51, 0.41])
    runs = {**_all_runs(BASELINE), "ut2": 0.40}
    baselines = _baselines(workspace, runs)
    _, result = _evaluate(workspace, _claim("greater"), {"baseline": "constant_output", "margin": 5}, baselines)
    assert result.status == INCONCLUSIVE and "at 41.00 in a run, trivial baseline 40.00" in result.reason


def test_a_lower_is_better_column_is_beaten_from_below(workspace, put_record):
    # bAbI-like: error (%) where the story-free answer makes 65.7% error. UT 74% vs Transformer 72%: the old rule
    # reads "UT below the Transformer" not held (UT Table 1 before issue 37); neither row beats 65.7.
    for name, errors in (("stacked", [71.0, 71.5, 72.0]), ("ut", [73.5, 74.0, 74.5])):
        for seed, err in enumerate(errors):
            put_record(f"{name}-{seed}", seed=seed, config_hash=_h(f"{name}{seed}"),
                       **{"model.recurrence": name, "metrics.final": {"test/seq_acc": err}})  # fmt: skip
    baselines = _baselines(workspace, _all_runs(65.7))
    spec_metrics = [{**SPEC["metrics"][0], "direction": "lower", "scale": 1}]
    claim = {**_claim("less")}
    spec = {**SPEC, "metrics": spec_metrics, "claims": [claim]}
    (workspace / "experiments" / "toy" / "t1.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    records, _ = load_records([workspace / "runs"])
    old = evaluate_claims(build_table(load_spec("toy/t1", workspace / "experiments"), records, load_paper_tables(),
                                      (), baselines))[0]
    assert old.status == NOT_HELD
    spec["metrics"][0]["trivial"] = {"baseline": "story_free_answer", "margin": 5}
    (workspace / "experiments" / "toy" / "t1.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    new = evaluate_claims(build_table(load_spec("toy/t1", workspace / "experiments"), records, load_paper_tables(),
                                      (), baselines))[0]
    assert new.status == INCONCLUSIVE and "Transformer, the better row, at 72.00 in a run, trivial baseline 65.70" \
        in new.reason
    # ... and a row at 55% error in every run (10.7 below the baseline) decides it again
    for seed in range(3):
        put_record(f"stacked-{seed}", seed=seed, config_hash=_h(f"stacked{seed}"),
                   **{"model.recurrence": "stacked", "metrics.final": {"test/seq_acc": 55.0 + seed}})  # fmt: skip
    records, _ = load_records([workspace / "runs"])
    again = evaluate_claims(build_table(load_spec("toy/t1", workspace / "experiments"), records,
                                        load_paper_tables(), (), baselines))[0]
    assert again.status == NOT_HELD


def test_without_computed_baselines_the_claim_is_not_decided(workspace, put_record):
    _seeds(put_record, "stacked", [0.05, 0.06, 0.07])
    _seeds(put_record, "ut", [0.50, 0.51, 0.52])
    trivial = {"baseline": "constant_output", "margin": 5}
    built, result = _evaluate(workspace, _claim("greater"), trivial, None)
    assert result.status == INCONCLUSIVE and "not computed for its runs (make baselines)" in result.reason
    assert "Seq. acc. not computed (make baselines)" in built.caption
    # a file that knows only some runs: the others are not computed either (never another run's number)
    partial = _baselines(workspace, {"ut0": BASELINE, "ut1": BASELINE})
    assert _evaluate(workspace, _claim("greater"), trivial, partial)[1].status == INCONCLUSIVE


def test_the_table_header_shows_the_baseline_beside_ours(workspace, put_record):
    _seeds(put_record, "stacked", [0.05, 0.06, 0.07])
    _seeds(put_record, "ut", [0.50, 0.51, 0.52])
    baselines = _baselines(workspace, _all_runs(BASELINE))
    built, _ = _evaluate(workspace, _claim("greater"), {"baseline": "constant_output", "margin": 5}, baselines)
    md = render_markdown(built)
    assert "- **Trivial baseline**: Seq. acc. 20.00 (one constant output; computed from the data by make baselines)" \
        in md
    assert "by more than Seq. acc. 5" in md


def test_a_mean_column_takes_the_mean_of_its_columns_baselines(workspace, put_record):
    # Two task columns (GLUE-like): majority class 50% on one, 80% on the other -> 65% on their average.
    for row in ("stacked", "ut"):
        for seed in range(2):
            # UT's seeds differ on A (90 and 91): constant rows would decide no claim (a zero-width interval)
            for task, acc in (("a", 0.9 + seed / 100 if row == "ut" else 0.5), ("b", 0.9 if row == "ut" else 0.8)):
                put_record(f"{row}-{task}-{seed}", seed=seed, task=task, config_hash=_h(f"{row}{task}{seed}"),
                           **{"model.recurrence": row, "metrics.final": {"test/seq_acc": acc}})  # fmt: skip
    runs = {f"{r}{t}{s}": (0.5 if t == "a" else 0.8) for r in ("stacked", "ut") for t in "ab" for s in range(2)}
    baselines = _baselines(workspace, runs)
    metrics = [
        {"ours": "test/seq_acc", "label": "A", "scale": 100, "match": {"task": "a"},
         "trivial": {"baseline": "majority_class", "margin": 5}},
        {"ours": "test/seq_acc", "label": "B", "scale": 100, "match": {"task": "b"},
         "trivial": {"baseline": "majority_class", "margin": 5}},
        {"label": "Avg", "mean_of": ["A", "B"], "trivial": {"margin": 5}},
    ]  # fmt: skip
    rows = [{"label": "Transformer", "match": {"model.recurrence": "stacked"}},
            {"label": "UT", "match": {"model.recurrence": "ut"}}]
    claim = {"claim": "c", "source": "s", "metric": "Avg", "a": "UT", "b": "Transformer", "test": "greater"}
    spec = spec_from_dict({"title": "t", "metrics": metrics, "rows": rows, "claims": [claim]}, "toy/t1")
    records, _ = load_records([workspace / "runs"])
    built = build_table(spec, records, load_paper_tables(), (), baselines)
    assert "Avg 65.00" in built.caption
    assert evaluate_claims(built)[0].status == HELD  # UT at 90 beats 65 by more than 5
    claim_b = {**claim, "a": "Transformer", "b": 10.0}  # the Transformer at 65 = the majority class: no verdict
    spec = spec_from_dict({"title": "t", "metrics": metrics, "rows": rows, "claims": [claim_b]}, "toy/t1")
    result = evaluate_claims(build_table(spec, records, load_paper_tables(), (), baselines))[0]
    assert result.status == INCONCLUSIVE and "trivial baseline 65.00" in result.reason


def test_trivial_spec_and_file_errors_are_one_line(workspace):
    bad = [({"baseline": "x"}, "margin must be a number"), ({"margin": 1}, "needs baseline"),
           ({"baseline": "x", "margin": 1, "extra": 2}, "unknown key")]
    for trivial, message in bad:
        metrics = [{**SPEC["metrics"][0], "trivial": trivial}]
        with pytest.raises(SpecError, match=message):
            spec_from_dict({**SPEC, "metrics": metrics}, "toy/t1")
    mean = [{**SPEC["metrics"][0]}, {"label": "Avg", "mean_of": [SPEC["metrics"][0]["label"]],
                                      "trivial": {"margin": 1}}]
    with pytest.raises(SpecError, match="needs a trivial baseline on each of its columns"):
        spec_from_dict({**SPEC, "metrics": mean}, "toy/t1")
    path = workspace / "baselines" / "toy" / "t1.json"
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    with pytest.raises(TableError, match=r"t1.json: not a readable baselines file .*make baselines"):
        load_table_baselines(workspace / "baselines", "toy/t1")
    path.write_text(json.dumps({"table": "other/t", "baselines": {}, "runs": {}}))
    with pytest.raises(TableError, match="not a baselines file of table toy/t1"):
        load_table_baselines(workspace / "baselines", "toy/t1")
    assert load_table_baselines(workspace / "baselines", "toy/none") is None


def test_the_index_says_runs_at_the_trivial_baseline_instead_of_yes(workspace, put_record):
    from attnlab.results.render.index import render_results_index
    from attnlab.results.spec import LaptopSpec

    _seeds(put_record, "stacked", [0.19, 0.20, 0.21])
    _seeds(put_record, "ut", [0.10, 0.11, 0.12])
    baselines = _baselines(workspace, _all_runs(BASELINE))
    trivial = {"baseline": "constant_output", "margin": 5}
    built, _ = _evaluate(workspace, _claim("greater"), trivial, baselines)
    built.spec.laptop = LaptopSpec(protocol="copy, 500 updates", per_run_s=120)
    assert "| runs at the trivial baseline (~120 s per run) |" in render_results_index([built])
    _seeds(put_record, "ut", [0.50, 0.51, 0.52])  # the UT learns: the protocol tests the claim
    built, _ = _evaluate(workspace, _claim("greater"), trivial, baselines)
    built.spec.laptop = LaptopSpec(protocol="copy, 500 updates", per_run_s=120)
    assert "| yes (~120 s per run) |" in render_results_index([built])

"""The rules of issue 53 held over the committed records and specs: no held / not held verdict rests on a
zero-width interval, on order-blind rows of a context-length claim, on a constant mechanism, or on items at the
training lengths of a length-generalisation claim; no claim asks for a third look; decided intervals agree with
scipy's Welch test; a claim shown in two tables counts once. One build of every table (about 25 s), shared."""

from __future__ import annotations

import pytest
from scipy import stats as scipy_stats

from attnlab.results.build import get_field
from attnlab.results.claims import HELD, NOT_HELD
from attnlab.results.stats import CONFIDENCE, LOOKS
from tests.committed import ROOT, committed_tables

DECIDED = (HELD, NOT_HELD)


@pytest.fixture(scope="module")
def tables():
    """(built table, its claim results) for every committed spec, from the committed records."""
    return committed_tables()


def _decided(tables):
    return [(b, r) for b, results in tables for r in results if r.status in DECIDED]


def _runs(built, label):
    return next(row for row in built.rows if row.spec.label == label).used


def test_no_verdict_rests_on_a_zero_width_interval(tables):
    for built, r in _decided(tables):
        assert r.interval.low < r.interval.high, (built.spec.name, r.spec.claim)
        if r.interval.df is None:  # the only zero-spread verdicts: every item right, bounded over the items
            assert r.spec.items and "pooled test items right" in r.reason, (built.spec.name, r.spec.claim)


def test_decided_welch_intervals_agree_with_scipy(tables):
    for built, r in _decided(tables):
        if r.interval.df is None or built.spec.preregistered is not None:
            continue
        mi = next(i for i, m in enumerate(built.spec.metrics) if m.label == r.spec.metric)
        a = next(row for row in built.rows if row.spec.label == r.spec.a).cells[mi].values
        if isinstance(r.spec.b, float):
            ref = scipy_stats.ttest_1samp(a, r.spec.b).confidence_interval(CONFIDENCE)
            low, high = ref.low - r.spec.b, ref.high - r.spec.b
        else:
            b = next(row for row in built.rows if row.spec.label == r.spec.b).cells[mi].values
            ref = scipy_stats.ttest_ind(a, b, equal_var=False).confidence_interval(CONFIDENCE)
            low, high = ref.low, ref.high
        assert (r.interval.low, r.interval.high) == pytest.approx((low, high), rel=1e-6, abs=1e-9)


def test_context_length_claims_need_rows_that_use_word_order(tables):
    # BigBird Table 10: every compared row must score below its own order-free floor (shuffled blocks)
    (built, results), = [(b, rs) for b, rs in tables if b.spec.name == "bigbird/table10_mlm_bpc"]
    for r in results:
        guarded = {label for req in r.spec.requires for label in req.rows
                   if req.field.endswith("bits_per_token_shuffled") and req.minus
                   and req.minus.endswith("test/bits_per_token") and (req.at_least or 0) > 0}
        assert guarded >= {r.spec.a, r.spec.b}, r.spec.claim
        if r.status in DECIDED:
            for label in (r.spec.a, r.spec.b):
                for rec in _runs(built, label):
                    final = rec.data["metrics"]["final"]
                    assert final["test/bits_per_token_shuffled"] - final["test/bits_per_token"] >= 0.05


def test_claims_about_act_need_halting_that_varied(tables):
    (built, results), = [(b, rs) for b, rs in tables if b.spec.name == "probes/ut_depth"]
    for r in results:
        if r.spec.a != "UT + ACT" or "step" not in r.spec.metric.lower():
            continue
        assert any(req.field.endswith("test/steps_std") and (req.at_least or 0) > 0 for req in r.spec.requires)
        if r.status in DECIDED:
            assert all(get_field(rec.data, "metrics.final.test/steps_std") > 0 for rec in _runs(built, "UT + ACT"))


def test_no_claim_asks_for_a_third_look(tables):
    for built, results in tables:
        for r in results:
            if max(r.n_a, r.n_b or 0) >= LOOKS[-1] and "would decide it" in r.reason:
                assert "a new fixed-n experiment of" in r.reason, (built.spec.name, r.spec.claim)


def test_a_claim_shown_in_two_tables_counts_once(tables):
    by_name = {b.spec.name: b for b, _ in tables}
    for built, _ in tables:
        for claim in built.spec.claims:
            if claim.counted_in is None:
                continue
            target = by_name[claim.counted_in]  # a table that exists
            same = [c for c in target.spec.claims if c.claim == claim.claim]
            assert len(same) == 1 and same[0].counted_in is None, (built.spec.name, claim.claim)


def test_claims_md_and_the_results_index_state_multiplicity():
    for path in ("results/CLAIMS.md", "results/README.md"):
        text = (ROOT / path).read_text(encoding="utf-8")
        assert "Multiplicity: " in text and "survive Holm's correction" in text, path


def test_length_generalisation_is_decided_beyond_the_training_lengths(tables):
    # UT Table 4: the paper-comparable "10x" sets draw lengths from 1; claims read only the items past training
    lengths = [(b, rs) for b, rs in tables if b.spec.name.startswith("ut/table4_")]
    assert len(lengths) == 3
    for built, results in lengths:
        for r in results:
            column = built.spec.metric(r.spec.metric)
            assert column.ours.startswith("test_ood/") and column.trivial is not None, (built.spec.name, r.spec.claim)


def test_the_results_index_says_yes_only_for_protocols_that_test_a_claim(tables):
    lines = {line.split("`")[1]: line for line in (ROOT / "results" / "README.md").read_text().splitlines()
             if line.startswith("| [`")}
    for built, results in tables:
        ran = [r for r in results if r.status != "not run"]
        if ran and all(r.p_value is None for r in ran):  # floors, preconditions or constants stopped every claim
            assert "| yes (" not in lines[built.spec.name], built.spec.name

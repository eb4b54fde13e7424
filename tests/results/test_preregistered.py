"""Pre-registered tables (spec ``preregistered:``): the block is validated, the table is read once at its fixed n
(the listed seeds, or each row's n lowest) at the plain 95% level, and an inconclusive claim points to a new
fixed-n experiment, never to more seeds. Intervals are checked against scipy's own Welch test."""

from __future__ import annotations

import pytest
import yaml
from scipy import stats as scipy_stats

from attnlab.errors import SpecError
from attnlab.results.build import build_table
from attnlab.results.claims import HELD, INCONCLUSIVE, NOT_RUN, evaluate_claims
from attnlab.results.loading import load_records
from attnlab.results.paper import load_paper_tables
from attnlab.results.render.claims import claims_section, render_claims_overview, render_paper_claims
from attnlab.results.spec import load_spec, spec_from_dict
from tests.results.conftest import SPEC

PREREG = {"date": "2025-01-01", "seeds": [0, 1, 2], "sizing": "two pilot seeds (10, 11), never published"}
UT_ABOVE = {"claim": "ut above", "source": "Table 1 rows", "metric": "Seq. acc.", "a": "UT", "b": "Transformer",
            "test": "greater"}  # fmt: skip


def _spec(prereg) -> dict:
    return {**SPEC, "claims": [UT_ABOVE], "preregistered": prereg}


def _build(ws, prereg=PREREG):
    (ws / "experiments" / "toy" / "t1.yaml").write_text(yaml.safe_dump(_spec(prereg), sort_keys=False))
    records, corrupt = load_records([ws / "runs"])
    return build_table(load_spec("toy/t1", ws / "experiments"), records, load_paper_tables(), corrupt)


def _seeds(put_record, recurrence: str, accs: list[float], **extra) -> None:
    for seed, acc in enumerate(accs):
        put_record(f"{recurrence}-{seed}", seed=seed, **{"model.recurrence": recurrence,
                   "metrics.final": {"test/seq_acc": acc}}, **extra)  # fmt: skip


@pytest.mark.parametrize("prereg, n, seeds", [
    (PREREG, 3, (0, 1, 2)),
    ({**PREREG, "seeds": [5, 3, 4, 9]}, 4, (3, 4, 5, 9)),
    ({**PREREG, "seeds": 8}, 8, None),
])  # fmt: skip
def test_valid_blocks(prereg, n, seeds):
    spec = spec_from_dict(_spec(prereg), "toy/t1")
    assert (spec.preregistered.n, spec.preregistered.seeds, spec.preregistered.date) == (n, seeds, "2025-01-01")


def test_an_unquoted_yaml_date_reads_as_the_same_day():
    data = yaml.safe_load("date: 2026-12-06\nseeds: 8\nsizing: pilot seeds 101-102, never published\n")
    assert spec_from_dict(_spec(data), "toy/t1").preregistered.date == "2026-12-06"


@pytest.mark.parametrize("prereg, says", [
    ("yes", "needs a mapping"),
    ({**PREREG, "when": "today"}, "unknown key(s) when"),
    ({**PREREG, "date": "2026-13-01"}, "date must be"),
    ({**PREREG, "date": "06/12/2026"}, "date must be"),
    ({**PREREG, "date": "2026-12-6"}, "date must be"),
    ({k: v for k, v in PREREG.items() if k != "date"}, "date must be"),
    ({**PREREG, "seeds": [1, 1, 2]}, "lists a seed twice"),
    ({**PREREG, "seeds": 1}, "at least 2 seeds"),
    ({**PREREG, "seeds": [4]}, "at least 2 seeds"),
    ({**PREREG, "seeds": "five"}, "seeds must be"),
    ({**PREREG, "seeds": [1, 2.5]}, "seeds must be"),
    ({**PREREG, "seeds": True}, "seeds must be"),
    ({**PREREG, "sizing": " "}, "sizing must say"),
    ({k: v for k, v in PREREG.items() if k != "sizing"}, "sizing must say"),
])  # fmt: skip
def test_bad_blocks_are_refused_in_one_line(prereg, says):
    with pytest.raises(SpecError, match="preregistered") as err:
        spec_from_dict(_spec(prereg), "toy/t1")
    assert says in str(err.value) and "\n" not in str(err.value)


def test_read_once_at_the_listed_seeds_and_95_percent(workspace, put_record):
    # Seeds 3-5 would reverse the verdict; a pre-registered table never reads them.
    transformer, ut = [30.0, 31.0, 33.0, 90.0, 91.0, 92.0], [40.0, 42.0, 41.5, 0.0, 1.0, 2.0]
    _seeds(put_record, "stacked", [v / 100 for v in transformer])
    _seeds(put_record, "ut", [v / 100 for v in ut])
    built = _build(workspace)
    (result,) = evaluate_claims(built)
    assert (result.n_a, result.n_b, result.confidence) == (3, 3, 0.95)
    ref = scipy_stats.ttest_ind(ut[:3], transformer[:3], equal_var=False).confidence_interval(0.95)
    assert (result.interval.low, result.interval.high) == pytest.approx((ref.low, ref.high), rel=1e-9)
    assert result.status == HELD
    row = next(r for r in built.rows if r.spec.label == "UT")
    assert sorted(r.data["seed"] for r in row.not_read) == [3, 4, 5]
    assert row.cells[0].stat.n == 3  # the table shows what the claims read


def test_one_look_at_95_decides_what_the_two_look_level_would_not(workspace, put_record):
    # a - b = 2.5 with both sds 1 at n = 3: Welch df 4, t(0.975; 4) = 2.776 x sqrt(2/3) = 2.267 < 2.5, held at
    # 95%; at the two-look 97.06% t(0.9853; 4) = 3.319 x 0.8165 = 2.710 > 2.5, inconclusive.
    _seeds(put_record, "stacked", [0.09, 0.10, 0.11])
    _seeds(put_record, "ut", [0.115, 0.125, 0.135])
    (prereg_result,) = evaluate_claims(_build(workspace))
    assert prereg_result.status == HELD and prereg_result.interval.low == pytest.approx(2.5 - 2.267, abs=2e-3)
    (two_look,) = evaluate_claims(_build(workspace, prereg=None))
    assert two_look.status == INCONCLUSIVE


def test_the_n_lowest_seeds_whatever_their_status(workspace, put_record):
    # seeds: 3 reads seeds 0-2 of each row; UT's seed 1 failed, so the claim waits and seed 3 never stands in.
    _seeds(put_record, "stacked", [0.30, 0.31, 0.32, 0.33])
    _seeds(put_record, "ut", [0.50, 0.51, 0.52, 0.53])
    put_record("ut-1", seed=1, status="failed", error="NaN loss", **{"model.recurrence": "ut", "metrics.final": {}})
    (result,) = evaluate_claims(_build(workspace, {**PREREG, "seeds": 3}))
    assert result.status == NOT_RUN
    assert "pre-registered at 3 completed seeds per row" in result.reason and "UT has 2" in result.reason
    assert "+1 failed" in result.reason and "Transformer" not in result.reason


def test_a_row_short_of_n_is_not_read(workspace, put_record):
    _seeds(put_record, "stacked", [0.30, 0.31, 0.32])
    _seeds(put_record, "ut", [0.90, 0.91])
    (result,) = evaluate_claims(_build(workspace))
    assert result.status == NOT_RUN and result.interval is None and "UT has 2" in result.reason


def test_inconclusive_points_to_a_new_fixed_n_experiment(workspace, put_record):
    # a - b = 1 with both sds 1: a fresh experiment needs 9 seeds per row at 95% (n = 8: t(0.975; 14) x 0.5 =
    # 1.072 > 1; n = 9: t(0.975; 16) x 0.4714 = 0.9993 < 1), the same arithmetic as test_seeds_to_decide_by_hand.
    _seeds(put_record, "stacked", [0.00, 0.01, 0.02])
    _seeds(put_record, "ut", [0.01, 0.02, 0.03])
    (result,) = evaluate_claims(_build(workspace))
    assert result.status == INCONCLUSIVE
    assert "a new fixed-n experiment of about 9 seeds per row" in result.reason
    assert "seeds per row would decide it" not in result.reason.replace("experiment of about 9 seeds per row", "")


def test_a_run_created_before_the_date_is_no_part_of_it(workspace, put_record):
    _seeds(put_record, "stacked", [0.30, 0.31, 0.32])
    _seeds(put_record, "ut", [0.50, 0.51, 0.52])
    put_record("ut-2", seed=2, created="2024-12-31T23:00:00+00:00",
               **{"model.recurrence": "ut", "metrics.final": {"test/seq_acc": 0.52}})  # fmt: skip
    (result,) = evaluate_claims(_build(workspace))
    assert result.status == INCONCLUSIVE
    assert "UT has a run created 2024-12-31, before the pre-registration date 2025-01-01" in result.reason


def test_the_rendered_claims_say_how_they_were_read(workspace, put_record):
    _seeds(put_record, "stacked", [0.30, 0.31, 0.32])
    _seeds(put_record, "ut", [0.50, 0.51, 0.52])
    built = _build(workspace)
    section = "\n".join(claims_section(built))
    assert "| 95% interval |" in section and "97.06%" not in section
    assert "Pre-registered 2025-01-01: 3 seeds per row (seeds 0, 1, 2), read once" in section
    assert "only a new fixed-n experiment" in section
    overview = render_claims_overview([built])
    assert "Pre-registered table:" in overview and "Pre-registered 2025-01-01" in overview
    assert "at 95%)" in render_paper_claims([built], "toy")
    plain = _build(workspace, prereg=None)
    assert "Pre-registered" not in render_claims_overview([plain]) + "\n".join(claims_section(plain))

"""Probe tables (``kind: probe``) and paper tables never share runs, and a probe spec says what it probes."""

from __future__ import annotations

import pytest

from attnlab.errors import SpecError, TableError
from attnlab.results.build import build_table, metric_value
from attnlab.results.loading import load_records
from attnlab.results.paper import PaperTables
from attnlab.results.spec import spec_from_dict
from tests.results.conftest import attention_coverage

PROBE = {
    "kind": "probe", "probe_of": "synthesizer", "title": "probe",
    "metrics": [{"ours": "test/mlm_acc", "label": "Acc."}],
    "rows": [{"label": "Vanilla", "match": {"model.attention": "vanilla"}}],
}


def _build(spec: dict, tmp_path):
    records, corrupt = load_records([tmp_path / "runs"])
    return build_table(spec_from_dict(spec, "probes/p"), records, PaperTables(None, {}), corrupt)


def test_a_probe_table_reads_probe_runs(put_record, tmp_path):
    put_record("a", experiment="probes/synthesizer/vanilla_recall", **{"metrics.final": {"test/mlm_acc": 0.75}})
    built = _build(PROBE, tmp_path)
    assert built.rows[0].cells[0].values == [0.75]


def test_a_probe_table_refuses_a_paper_run_its_row_matches(put_record, tmp_path):
    put_record("a", experiment="synthesizer/table2/vanilla_ende", **{"metrics.final": {"test/mlm_acc": 0.75}})
    with pytest.raises(TableError, match="probe tables read experiments under probes/ only"):
        _build(PROBE, tmp_path)


def test_a_paper_table_refuses_a_probe_run_its_row_matches(put_record, tmp_path):
    put_record("a", experiment="probes/synthesizer/vanilla_recall", **{"metrics.final": {"test/mlm_acc": 0.75}})
    paper = {k: v for k, v in PROBE.items() if k not in ("kind", "probe_of")}
    with pytest.raises(TableError, match="a probe's run"):
        _build(paper, tmp_path)


@pytest.mark.parametrize(("change", "says"), [
    ({"probe_of": None}, "probe_of"),
    ({"paper": "synthesizer", "table": "table2"}, "no paper/table keys"),
    ({"kind": "toy"}, "valid: paper, probe"),
    ({"kind": "paper"}, "probe_of belongs to a probe"),
])
def test_probe_specs_name_what_they_probe_and_carry_no_paper_numbers(change, says):
    spec = {k: v for k, v in {**PROBE, **change}.items() if v is not None}
    with pytest.raises(SpecError, match=says):
        spec_from_dict(spec, "probes/p")


def test_a_column_can_read_a_record_field_under_extra(put_record, tmp_path, record_factory):
    put_record("a", experiment="probes/bigbird/itc_512",
               extra={"attention_coverage": attention_coverage(0.25)})
    spec = {**PROBE, "metrics": [{"ours": "extra.attention_coverage.attended_fraction_mean", "label": "Attended",
                                  "scale": 100}]}
    built = _build(spec, tmp_path)
    assert built.rows[0].cells[0].values == [25.0]
    records, _ = load_records([tmp_path / "runs"])
    assert metric_value(records[0], spec_from_dict(spec, "p").metrics[0]) == 25.0


def test_probe_claims_are_counted_apart_and_show_no_paper_number(put_record, tmp_path):
    from attnlab.results.render.claims import claims_section, render_claims_overview

    for seed, (a, b) in enumerate([(0.9, 0.1), (0.92, 0.12), (0.91, 0.11)]):
        put_record(f"v{seed}", seed=seed, config_hash=f"{seed}" * 64, experiment="probes/synthesizer/vanilla_recall",
                   **{"metrics.final": {"test/mlm_acc": a}})
        put_record(f"r{seed}", seed=seed, config_hash=f"{seed + 5}" * 64, experiment="probes/synthesizer/random_recall",
                   **{"model.attention": "synth_random", "metrics.final": {"test/mlm_acc": b}})
    spec = {**PROBE, "rows": [{"label": "Vanilla", "match": {"model.attention": "vanilla"}},
                              {"label": "Random", "match": {"model.attention": "synth_random"}}],
            "claims": [{"claim": "Random below Vanilla", "source": "the probe", "metric": "Acc.", "a": "Vanilla",
                        "b": "Random", "test": "greater"}]}
    built = _build(spec, tmp_path)
    assert "a probe (no paper number)" in "\n".join(claims_section(built))
    overview = render_claims_overview([built])
    assert "Paper tables: 0 claims" in overview and "not its tables): 1 claims: 1 held" in overview
    assert built.spec.claims_group == "probes"

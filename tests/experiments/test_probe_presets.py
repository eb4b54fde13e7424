"""Probe presets and probe specs agree with each other and with the make targets (files only, fast)."""

from __future__ import annotations

import re

import pytest

from attnlab.results.spec import load_spec
from tests.conftest import REPO
from tests.experiments.paper_presets import SPECS, preset_yaml, presets, probe_dirs, probe_paper, spec_files

PROBE_DIRS = probe_dirs()
# Redesigned probes (issue 53) under new names, beside the published ones they replace: <paper><version>.
# new folder -> (the published folder, its spec).
REDESIGNED = {"probes/bigbird2": ("probes/bigbird", "bigbird_recall"), "probes/ut2": ("probes/ut", "ut_depth")}


def test_every_paper_has_a_probe():
    assert PROBE_DIRS == ["probes/bigbird", "probes/bigbird2", "probes/qknorm", "probes/synthesizer", "probes/ut",
                          "probes/ut2"]


@pytest.mark.parametrize("probe_dir", PROBE_DIRS)
def test_every_probe_preset_is_a_row_of_its_probe_spec_and_every_row_has_a_preset(probe_dir):
    files = spec_files(probe_dir)
    assert len(files) == 1, f"one spec experiments/{probe_dir}_<what>.yaml per probe, got {files}"
    spec = load_spec(f"probes/{files[0].stem}", SPECS)
    paper = probe_paper(probe_dir)
    assert (spec.kind, spec.probe_of, spec.paper) == ("probe", paper, None)
    assert (SPECS / paper).is_dir(), f"probe_of names experiments/{paper}/, the paper it probes"
    used = []
    for row in spec.rows:
        experiments = row.match["experiment"]
        for experiment in experiments if isinstance(experiments, list) else [experiments]:
            data = preset_yaml(experiment)
            assert data["experiment_name"] == experiment and data["row"] == row.label
            protocol = probe_dir.split("/")[1]
            assert {"/probe": protocol} in data["defaults"], (
                f"{experiment}: a probe row takes its protocol from conf/probe/{protocol}.yaml")
            used.append(experiment)
    assert sorted(used) == presets(probe_dir)
    assert spec.laptop is not None and spec.laptop.runs == len(used) * 5, "5 seeds of every preset"
    if spec.preregistered is not None:  # a redesigned probe reads fresh seeds, fixed before it ran
        assert spec.preregistered.seeds == (21, 22, 23, 24, 25)


@pytest.mark.parametrize("probe_dir", sorted(REDESIGNED))
def test_a_redesigned_probe_leaves_the_published_one_readable(probe_dir):
    """The published spec and presets stay where they were, each folder with its own one spec (the new spec's name
    must not fall under the old folder's ``<paper>_*.yaml``, which ``make reproduce-probes-<paper>`` builds)."""
    old_dir, old_spec = REDESIGNED[probe_dir]
    assert [f.stem for f in spec_files(old_dir)] == [old_spec]
    assert len(spec_files(probe_dir)) == 1 and spec_files(probe_dir)[0].stem != old_spec
    assert presets(old_dir) and all(preset_yaml(e)["experiment_name"] == e for e in presets(old_dir))


@pytest.mark.parametrize("probe_dir", PROBE_DIRS)
def test_probe_rows_read_generated_data_from_a_fixed_seed_or_a_local_corpus(probe_dir):
    from tests.conftest import compose

    for experiment in presets(probe_dir):
        task = compose([f"experiment={experiment}", "scale=cpu"]).task
        if probe_dir == "probes/qknorm":  # a real corpus, read the same way by every row
            assert (task.loader, task.source) == ("text_lm", "local")
            continue
        assert (task.loader, task.data_seed) == ("probe", 0), f"{experiment}: every row reads the same examples"


def test_each_probe_has_a_make_target_with_five_seeds():
    text = (REPO / "make" / "reproduce.mk").read_text()
    for probe_dir in PROBE_DIRS:
        target = f"reproduce-{probe_dir.replace('/', '-')}"
        assert re.search(rf"^{target}: \$\(STAMP\) ## ", text, re.M), target
        assert f"$(call reproduce,{probe_dir})" in text
    assert "$(PROBE_TARGETS): SEEDS = 1,2,3,4,5" in text
    for probe_dir in REDESIGNED:  # fresh seeds, forced whatever SEEDS= says
        target = f"reproduce-{probe_dir.replace('/', '-')}"
        assert f"{target}: override SEEDS = 21,22,23,24,25" in text


def test_the_redesigned_depth_probe_has_hops_beyond_the_transformer_within_the_ut_and_no_backward_shortcut():
    """issue 53: probes/ut's 4-layer Transformer answered every 3-hop query, so the UT could not beat it. In
    probes/ut2 the Transformer has one layer (no lookup keyed by another's result), the UT the same layer applied
    more times than the deepest query's hops, with no more parameters than the Transformer; on a cycle of n nodes,
    h ahead is n - h behind, so n > 2 x max_hops keeps every answer h lookups deep. The deep-start ACT row follows
    its spec's rule: W = 0 and b0 = logit((1 - eps) / (M/2 - 1/2)), a constant p that halts at exactly M/2 steps,
    with M = 2 x the UT's steps, held for the first half of training."""
    import math

    from tests.conftest import compose

    cfgs = {e.rsplit("/", 1)[1]: compose([f"experiment={e}", "scale=cpu"]) for e in presets("probes/ut2")}
    task = cfgs["transformer"].task
    assert (task.op, task.max_hops) == ("hops", 3) and task.num_keys > 2 * task.max_hops
    assert cfgs["transformer"].model.encoder_layers == 1 and cfgs["transformer"].model.recurrence.name == "stacked"
    assert cfgs["ut"].model.recurrence.num_steps > task.max_hops
    steps = cfgs["ut"].model.recurrence.num_steps
    for row in ("ut_act", "ut_act_deep"):
        assert cfgs[row].model.recurrence.act_max_steps == 2 * steps
    deep = cfgs["ut_act_deep"].model.recurrence
    m, eps = deep.act_max_steps, deep.act_epsilon
    p0 = (1 - eps) / (m / 2 - 0.5)
    assert deep.halting_weight_init == "zeros"
    assert deep.halting_bias_init == pytest.approx(math.log(p0 / (1 - p0)), abs=1e-3)
    assert (m / 2 - 1) * p0 <= 1 - eps < (m / 2) * p0
    assert deep.halting_hold_updates == cfgs["ut_act_deep"].trainer.max_steps // 2
    assert deep.act_loss_weight in (0.001, 0.01, 0.0)  # the paper's ablation value, or the pilot's fallback (notes)
    assert cfgs["ut_act"].model.recurrence.halting_bias_init == 1.0  # T2T's, as probes/ut's ACT row
    assert "halting_hold_updates" not in cfgs["ut_act"].model.recurrence

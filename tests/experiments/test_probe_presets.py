"""Probe presets and probe specs agree with each other and with the make targets (files only, fast)."""

from __future__ import annotations

import re

import pytest

from attnlab.results.spec import load_spec
from tests.conftest import REPO
from tests.experiments.paper_presets import SPECS, preset_yaml, presets, probe_dirs, spec_files

PROBE_DIRS = probe_dirs()


def test_every_paper_has_a_probe():
    assert PROBE_DIRS == ["probes/bigbird", "probes/qknorm", "probes/synthesizer", "probes/ut"]


@pytest.mark.parametrize("probe_dir", PROBE_DIRS)
def test_every_probe_preset_is_a_row_of_its_probe_spec_and_every_row_has_a_preset(probe_dir):
    files = spec_files(probe_dir)
    assert len(files) == 1, f"one spec experiments/{probe_dir}_<what>.yaml per probe, got {files}"
    spec = load_spec(f"probes/{files[0].stem}", SPECS)
    paper = probe_dir.split("/")[1]
    assert (spec.kind, spec.probe_of, spec.paper) == ("probe", paper, None)
    assert (SPECS / paper).is_dir(), f"probe_of names experiments/{paper}/, the paper it probes"
    used = []
    for row in spec.rows:
        experiments = row.match["experiment"]
        for experiment in experiments if isinstance(experiments, list) else [experiments]:
            data = preset_yaml(experiment)
            assert data["experiment_name"] == experiment and data["row"] == row.label
            assert {"/probe": paper} in data["defaults"], (
                f"{experiment}: a probe row takes its protocol from conf/probe/{paper}.yaml")
            used.append(experiment)
    assert sorted(used) == presets(probe_dir)
    assert spec.laptop is not None and spec.laptop.runs == len(used) * 5, "5 seeds of every preset"


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

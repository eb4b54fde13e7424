"""The run artifact ``<run>/attention/weights_hist.json`` (``callbacks.record_attention=true``)."""

from __future__ import annotations

import json

import pytest

from attnlab.errors import ConfigError
from attnlab.training.attention_capture import FILENAME, LINEAR_BINS, LOG10_BINS, check_weights_hist
from attnlab.training.run import run
from tests.conftest import TINY, TINY_ALGO, compose

FDR = [*TINY, *TINY_ALGO, "debug=fdr"]  # one batch of everything, no loggers


@pytest.mark.parametrize(
    "overrides, stacks",
    [
        (["model/attention=synth_dense", "model.encoder_layers=2", "model.decoder_layers=2"],
         {"encoder": 2, "decoder": 2}),
        (["model/recurrence=ut", "model.recurrence.num_steps=3"], {"encoder": 3, "decoder": 3}),
    ],
    ids=["synth_dense-stacked", "vanilla-ut"],
)
def test_record_attention_writes_a_small_valid_histogram_file(tmp_path, overrides, stacks):
    cfg = compose([*FDR, *overrides, "callbacks.record_attention=true", "callbacks.record_attention_sample_size=3"],
                  run_dir=tmp_path)
    record = run(cfg, run_dir=tmp_path, command="pytest")
    path = tmp_path / FILENAME
    assert record["status"] == "completed" and path.is_file()
    assert path.stat().st_size < 64_000  # kilobytes, publishable into results/runs
    data = json.loads(path.read_text())
    assert check_weights_hist(data) == []
    assert data["sample"]["sequences"] == 3
    counted = {s: [entry["layer"] for entry in data["layers"] if entry["stack"] == s] for s in stacks}
    assert counted == {s: list(range(n)) for s, n in stacks.items()}  # per layer (UT: per step), in order
    for entry in data["layers"]:
        assert entry["available"] and entry["causal"] == (entry["stack"] == "decoder")
        assert len(entry["linear_counts"]) == LINEAR_BINS and len(entry["log10_counts"]) == LOG10_BINS
        # A row over k allowed keys has entropy <= log k and a largest weight >= 1/k.
        assert 0 <= entry["mean_row_entropy"] <= entry["mean_uniform_entropy"] + 1e-5
        assert entry["mean_row_max"] >= 1 / entry["mean_keys_per_row"] - 1e-6


def test_capture_is_off_by_default_and_leaves_the_config_hash_alone(tmp_path):
    off = run(compose(FDR, run_dir=tmp_path / "off"), run_dir=tmp_path / "off", command="pytest")
    assert not (tmp_path / "off" / "attention").exists()
    on = run(compose([*FDR, "callbacks.record_attention=true"], run_dir=tmp_path / "on"), run_dir=tmp_path / "on",
             command="pytest")
    assert (tmp_path / "on" / FILENAME).is_file()
    assert on["config_hash"] == off["config_hash"]
    assert on["metrics"]["final"] == off["metrics"]["final"]  # the capture changes no number


def test_bad_record_attention_settings_are_refused(tmp_path):
    from attnlab.training.config import validate

    cfg = compose(FDR, run_dir=tmp_path)
    cfg.callbacks.record_attention = "sometimes"
    with pytest.raises(ConfigError, match="callbacks.record_attention"):
        validate(cfg)
    cfg = compose([*FDR, "callbacks.record_attention_sample_size=0"], run_dir=tmp_path)
    with pytest.raises(ConfigError, match="record_attention_sample_size"):
        validate(cfg)
    with pytest.raises(Exception, match="record_attenton"):
        compose([*FDR, "callbacks.record_attenton=true"], run_dir=tmp_path)


def test_check_weights_hist_reports_broken_files():
    assert check_weights_hist([]) == ["not a JSON object"]
    problems = check_weights_hist({"format": "other", "bins": {}, "layers": [
        {"stack": "encoder", "layer": 0, "available": True, "linear_counts": [1] * LINEAR_BINS,
         "log10_counts": [0] * LOG10_BINS, "log10_below": 0, "entries": 3, "mean_row_entropy": 0.1,
         "mean_row_max": 0.5, "mean_keys_per_row": 4.0}]})
    assert any("format" in p for p in problems) and any("bin edges" in p for p in problems)
    assert any("add up" in p for p in problems)

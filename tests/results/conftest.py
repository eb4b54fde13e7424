"""Fixture run records and specs for the results floor; everything is written under tmp_path."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

BASE_RECORD = {
    "schema_version": 1,
    "status": "completed",
    "error": None,
    "experiment": "demo/copy/vanilla",
    "row": None,
    "task": "algo/copy",
    "model": {"name": "transformer_small", "attention": "vanilla", "recurrence": "stacked"},
    "seed": 0,
    "scale": "cpu",
    "config_hash": "ab" * 32,
    "git": {"commit": "0123456789abcdef0123", "dirty": False},
    "hardware": {"name": "cpu", "accelerator": "cpu", "devices": 1, "num_nodes": 1, "precision": "32-true"},
    "metrics": {"final": {"test/seq_acc": 0.5, "test/char_acc": 0.9}, "best": {"val/seq_acc": 0.6}},
    "params": {"total": 123456, "trainable": 123456},
    "cost": {"wall_s": 10.0, "tokens_per_s": 1000.0, "peak_mem_mb": 200.0},
    "metric_flavours": {"accuracy": "exact match of the whole target sequence"},
    "wandb_run_id": None,
    "run_dir": "runs/x",
    "command": "attnlab-train task=algo/copy",
    "created": "2025-01-01T00:00:00+00:00",
    "versions": {"python": "3.11", "torch": "2.13.0", "attnlab": "0.1.0"},
}


def make_record(**overrides) -> dict:
    """BASE_RECORD with dotted-key overrides: make_record(**{"model.attention": "qknorm", "seed": 2})."""
    rec = copy.deepcopy(BASE_RECORD)
    for dotted, value in overrides.items():
        node = rec
        *parents, last = dotted.split(".")
        for p in parents:
            node = node[p]
        node[last] = value
    return rec


@pytest.fixture
def record_factory():
    return make_record


@pytest.fixture
def put_record(tmp_path):
    """put_record("a", **overrides) writes tmp_path/runs/a/results.json and returns its path."""

    def put(name: str, **overrides) -> Path:
        command = f"attnlab-train paths.run_dir=runs/{name}"  # names the run without making it another config
        rec = make_record(**{"run_dir": f"runs/{name}", "command": command, **overrides})
        path = tmp_path / "runs" / name / "results.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(rec))
        return path

    return put


PAPER_YAML = {
    "meta": {"purpose": "fixture"},
    "toy": {
        "source": {"citation": "Toy et al. A toy paper."},
        "tables": {
            "t1": {
                "title": "Toy table",
                "metrics": {"seq_acc": {"direction": "higher"}, "char_acc": {"direction": "higher"}},
                "rows": {
                    "Transformer": {"seq_acc": 55.0, "char_acc": 91.25},
                    "Universal Transformer": {"seq_acc": None, "char_acc": 96.0},
                },
                "confidence": "single-source",
                "cell_confidence": {"Transformer.seq_acc=55.0": "double-checked (two PDFs)"},
                "conflicts": {"Universal Transformer.seq_acc": "two sources disagree - left null"},
            }
        },
    },
}

SPEC = {
    "title": "Toy copy table",
    "paper": "toy",
    "table": "t1",
    "data": "generated copy task",
    "match": {"task": "algo/copy"},
    "metrics": [
        {"ours": "test/seq_acc", "label": "Seq. acc.", "paper_key": "seq_acc", "scale": 100},
        {"ours": "test/char_acc", "label": "Char. acc.", "paper_key": "char_acc", "scale": 100},
    ],
    "rows": [
        {"label": "Transformer", "paper_row": "Transformer", "match": {"model.recurrence": "stacked"}},
        {"label": "UT", "paper_row": "Universal Transformer", "match": {"model.recurrence": "ut"}},
        {"label": "UT + ACT", "match": {"model.recurrence": "ut_act"}},
    ],
}


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """tmp_path with experiments/toy/t1.yaml, a fixture paper_tables.yaml (via the env var) and runs/."""
    exp = tmp_path / "experiments"
    (exp / "toy").mkdir(parents=True)
    (exp / "toy" / "t1.yaml").write_text(yaml.safe_dump(SPEC, sort_keys=False))
    paper = exp / "paper_tables.yaml"
    paper.write_text(yaml.safe_dump(PAPER_YAML, sort_keys=False))
    monkeypatch.setenv("ATTNLAB_PAPER_TABLES", str(paper))
    (tmp_path / "runs").mkdir()
    return tmp_path


def attention_coverage(mean: float) -> dict:
    """An ``extra.attention_coverage`` as training/sparsity.py writes it (the schema declares every field)."""
    return {"attended_fraction_mean": mean, "attended_fraction_max": mean, "attended_fraction_min": mean,
            "dense_fallback_share": 0.0, "lengths": {"min": 8, "max": 8, "mean": 8.0, "examples": 1}, "block_size": 2}

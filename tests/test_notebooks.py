"""Slow tier: the analysis notebooks run end to end on run records (they never train).

Each notebook takes its parameters from the environment (``ATTNLAB_RUNS_ROOT``, ...), as the ponder
notebook does (tests/test_slow.py), and is executed with nbclient in a fresh kernel, offline.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from attnlab.results.record import Cost, GitInfo, HardwareInfo, Metrics, ModelInfo, ParamCount, RunRecord, write_record
from tests.conftest import REPO, TINY, TINY_ALGO, compose

pytestmark = pytest.mark.slow

NOTEBOOKS = REPO / "notebooks"
HISTOGRAMS = "synthesizer_attention_histograms.ipynb"
QUALITY_VS_COST = "quality_vs_cost.ipynb"
RECORDED_VARIANTS = ("vanilla", "synth_dense", "synth_random")


def _execute(name: str, cwd: Path, monkeypatch, **env: str):
    nbformat = pytest.importorskip("nbformat", reason="notebooks need the dev extras (nbformat, nbclient)")
    from nbclient import NotebookClient

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}).execute()
    return nb


def _outputs(nb) -> list[dict]:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]


def _images(nb) -> int:
    return sum("image/png" in o.get("data", {}) for o in _outputs(nb))


def _text(nb) -> str:
    return "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in _outputs(nb))


@pytest.fixture(scope="module")
def recorded_runs(tmp_path_factory) -> Path:
    """Tiny real training runs with callbacks.record_attention=true, one per variant of Figure 2."""
    from attnlab.training.run import run

    root = tmp_path_factory.mktemp("runs")
    for attention in RECORDED_VARIANTS:
        overrides = [*TINY, *TINY_ALGO, f"model/attention={attention}", "callbacks.record_attention=true",
                     "logger=none"]
        run(compose(overrides, run_dir=root / attention), run_dir=root / attention,
            command="attnlab-train " + " ".join(overrides))
        assert (root / attention / "attention" / "weights_hist.json").is_file()
    return root


def test_attention_histogram_notebook_draws_every_recorded_variant(recorded_runs, tmp_path, monkeypatch):
    nb = _execute(HISTOGRAMS, tmp_path, monkeypatch, ATTNLAB_RUNS_ROOT=str(recorded_runs))
    text = _text(nb)
    assert _images(nb) >= 2, text  # linear and log10 histograms
    assert f"{len(RECORDED_VARIANTS)} run(s) with attention histograms" in text
    for attention in RECORDED_VARIANTS:  # which runs it used: record path and command
        assert str(recorded_runs / attention / "results.json") in text
        assert f"command: attnlab-train {' '.join(TINY)}" in text and attention in text


def test_attention_histogram_notebook_without_runs_says_so_and_stops(tmp_path, monkeypatch):
    empty = tmp_path / "no_runs_here"
    empty.mkdir()
    nb = _execute(HISTOGRAMS, tmp_path, monkeypatch, ATTNLAB_RUNS_ROOT=str(empty))
    lines = [line for line in _text(nb).splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"No attention/weights_hist.json under {empty}")
    assert _images(nb) == 0


def _record(root: Path, experiment: str, task: str, attention: str, seed: int, quality: dict[str, float],
            tokens_per_s: float, params: int) -> None:
    """A completed run record written by the real writer (attnlab.results.record)."""
    name = f"{experiment.replace('/', '_')}-{attention}-s{seed}"
    record = RunRecord(
        status="completed", task=task, model=ModelInfo("transformer_tiny", attention, "stacked"), seed=seed,
        scale="cpu", config_hash=hashlib.sha256(name.encode()).hexdigest(), git=GitInfo(None, None),
        hardware=HardwareInfo("cpu", "cpu", 1, 1, "32-true"), run_dir=str(root / name),
        command=f"attnlab-train experiment={experiment} seed={seed}", created="2025-01-01T00:00:00+00:00",
        metrics=Metrics(final=quality), params=ParamCount(params, params),
        cost=Cost(wall_s=100.0 + seed, tokens_per_s=tokens_per_s + 10 * seed, peak_mem_mb=300.0 + seed),
        experiment=experiment, extra={"debug": None},
    )
    write_record(root / name / "results.json", record)


def test_quality_vs_cost_notebook_plots_each_table_with_records(tmp_path, monkeypatch):
    root = tmp_path / "runs"
    for seed in (1, 2):
        for attention, acc, speed in (("vanilla", 0.9, 5000.0), ("synth_dense", 0.8, 7000.0)):
            _record(root, f"demo/copy/{attention}", "algo/copy", attention, seed,
                    {"test/seq_acc": acc + 0.01 * seed, "test/char_acc": 0.95}, speed, 20_000)
        _record(root, "lra/table1/transformer_listops", "lra/listops", "vanilla", seed,
                {"test/acc": 0.36 + 0.01 * seed}, 3000.0, 50_000)
    _record(root, "demo/copy/vanilla", "algo/other", "vanilla", 3, {"test/seq_acc": 0.1}, 1.0, 1)  # in no table
    nb = _execute(QUALITY_VS_COST, tmp_path, monkeypatch, ATTNLAB_RUNS_ROOT=str(root))
    text = _text(nb)
    assert _images(nb) == 2, text  # demo/copy and lra/table1_listops; tables without records are not drawn
    assert "demo/copy: Transformer (vanilla): 2 seed(s); Transformer (Synthesizer dense): 2 seed(s)" in text
    assert "lra/table1_listops: Transformer: 2 seed(s)" in text
    assert "2 table(s) drawn; 1 record(s) in no table row" in text


@pytest.mark.parametrize("notebook", [HISTOGRAMS, QUALITY_VS_COST])
def test_notebooks_run_on_the_committed_run_records(notebook, tmp_path, monkeypatch):
    committed = REPO / "results" / "runs"
    if not committed.is_dir():
        pytest.skip(f"{committed} does not exist yet (make publish-runs fills it from finished preset runs)")
    nb = _execute(notebook, tmp_path, monkeypatch, ATTNLAB_RUNS_ROOT=str(committed))
    text = _text(nb)
    if notebook == HISTOGRAMS:
        assert _images(nb) >= 2 or text.startswith("No attention/weights_hist.json under"), text
    else:
        assert "table(s) drawn" in text

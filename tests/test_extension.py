"""Extension by config (docs/extending.md): the example in examples/extension adds an attention variant,
a task, callbacks, a logger, an optimizer and a schedule without editing attnlab, and runs end to end."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from attnlab.cli.train import main as train_main
from tests.conftest import REPO, train_cli

EXAMPLE = ["hydra.searchpath=[file://examples/extension/conf]", "experiment=sort_tempered"]
SHORT = ["trainer.max_steps=12", "trainer.val_check_interval=6", "trainer.log_every_n_steps=1",
         "task.at_scale.cpu.train_size=96", "task.val_size=8", "task.test_size=8", "batch.sentences_per_update=16",
         "trainer.enable_progress_bar=false", "optim.schedule.step_size=4"]


@pytest.fixture(scope="module")
def example_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("extension") / "run"
    train_cli(REPO, [*EXAMPLE, *SHORT, "logger=extra_csv", f"hydra.run.dir={run_dir}"])  # paths as in the README
    return run_dir


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_the_example_trains_its_own_variant_and_task(example_run):
    record = json.loads((example_run / "results.json").read_text())
    assert record["status"] == "completed"
    assert record["model"]["attention"] == "tempered" and record["task"] == "sort"
    assert record["experiment"] == "extension/sort_tempered"
    assert record["metrics"]["final"]["test/seq_acc"] is not None


def test_the_callback_and_logger_named_by_target_ran(example_run):
    rows = _rows(example_run / "csv" / "metrics.csv")
    assert [float(r["train/grad_norm"]) for r in rows if r.get("train/grad_norm")], "GradientNorm logged nothing"
    assert (example_run / "extra_csv" / "metrics.csv").is_file()  # the logger added by logger/extra_csv.yaml


def test_the_optimizer_and_schedule_named_by_target_drive_the_updates(example_run):
    """SGD (the LR monitor names the optimizer) with StepLR(step_size=4, gamma=0.5) from lr=0.1."""
    rows = [r for r in _rows(example_run / "csv" / "metrics.csv") if r.get("lr-SGD/pg1")]
    assert rows, "no SGD learning rate logged"
    for row in rows:
        assert float(row["lr-SGD/pg1"]) == pytest.approx(0.1 * 0.5 ** (int(row["step"]) // 4))


def test_the_variant_is_dot_product_attention_at_a_temperature():
    """Against a reference from the definition: softmax(q k^T / (T sqrt(d_head))) v, per head."""
    from attnlab.attention import build_attention
    from attnlab.plugins import load_plugins

    load_plugins({"plugins": [str(REPO / "examples/extension/my_extension.py")]})
    torch.manual_seed(0)
    attn = build_attention("tempered", d_model=8, num_heads=2, temperature=3.0).eval()
    x = torch.randn(2, 5, 8)
    heads = lambda t: t.view(2, 5, 2, 4).transpose(1, 2)  # noqa: E731
    q, k, v = heads(attn.q_proj(x)), heads(attn.k_proj(x)), heads(attn.v_proj(x))
    weights = torch.softmax(q @ k.transpose(-1, -2) / (3.0 * 4**0.5), dim=-1)
    expected = attn.out_proj((weights @ v).transpose(1, 2).reshape(2, 5, 8))
    torch.testing.assert_close(attn(x), expected)


@pytest.mark.parametrize(("argv", "fragment"), [
    (["+plugins=[no_such_module]"], "plugins: cannot import 'no_such_module'"),
    ([*EXAMPLE, "+model.attention.temprature=3"], "model.attention.temprature for attention tempered"),
    (["optim.optimizer={momentum: 0.9}"], "optim.optimizer must be one of adam, adamw or a mapping"),
])
def test_bad_extension_input_is_one_line_exit_2(argv, fragment, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    with pytest.raises(SystemExit) as info:
        train_main([*argv, f"paths.runs_dir={tmp_path / 'runs'}"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and fragment in err, err
    assert not (tmp_path / "runs").exists()

"""QKNorm's training recipe: x0.8 learning-rate decay on a dev-BLEU plateau, stop below stop_lr, and the
test splits scored with the best-dev checkpoint (CyndxAI/QKNorm controller.py)."""

from __future__ import annotations

import csv
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from attnlab.results.record import read_record
from attnlab.training.plateau import PlateauDecay, PlateauOptions
from attnlab.training.run import build_module, load_test_weights, run
from tests.conftest import TINY, TINY_ALGO, compose


def _fake_trainer(lr: float):
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.Adam([param], lr=lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    return SimpleNamespace(sanity_checking=False, callback_metrics={}, global_step=0, should_stop=False,
                           optimizers=[optimizer], lr_scheduler_configs=[SimpleNamespace(scheduler=scheduler)])


def test_decay_follows_the_official_controller():
    # Dev BLEUs after each evaluation, and by hand (controller.eval_and_decay): decay when the newest BLEU is
    # below each of the 3 before it, never during warmup; stop once past warmup with lr < stop_lr.
    bleus = [10.0, 12.0, 11.0, 11.5, 11.9, 11.0, 10.9, 13.0, 10.0, 9.0, 8.0]
    # e6: 11.0 vs min(11, 11.5, 11.9) = 11 -> not strictly below: no decay. e7: 10.9 < 11.0: decay.
    # e9: 10.0 < min(11.0, 10.9, 13) -> decay; e10: 9 < 10 -> decay; e11: 8 < 9 -> decay.
    expected_decays_after = {7: 1, 9: 2, 10: 3, 11: 4}
    peak = 512**-0.5 * 8000**-0.5
    trainer = _fake_trainer(peak)
    cb = PlateauDecay(PlateauOptions(monitor="val/bleu", stop_lr=peak * 0.8**4 * 1.01), warmup_steps=300)
    decays = 0
    for i, bleu in enumerate(bleus, start=1):
        trainer.global_step = 100 * i  # an evaluation every 100 updates (gl-en's epoch_size)
        trainer.callback_metrics["val/bleu"] = torch.tensor(bleu)
        cb.on_validation_end(trainer, None)
        decays = expected_decays_after.get(i, decays)
        lr = trainer.optimizers[0].param_groups[0]["lr"]
        assert lr == pytest.approx(peak * 0.8**decays), i
        assert trainer.lr_scheduler_configs[0].scheduler.base_lrs[0] == pytest.approx(peak * 0.8**decays)
        assert trainer.should_stop == (i == 11)  # 0.8^4 x peak is the first rate below stop_lr
    restored = PlateauDecay(PlateauOptions(), warmup_steps=300)
    restored.load_state_dict(cb.state_dict())
    assert restored.history == pytest.approx(bleus) and restored.decays == 4


def test_no_decay_during_warmup():
    trainer = _fake_trainer(1e-3)
    cb = PlateauDecay(PlateauOptions(monitor="val/bleu"), warmup_steps=10_000)
    for i, bleu in enumerate([5.0, 4.0, 3.0, 2.0, 1.0, 0.5], start=1):
        trainer.global_step = 100 * i
        trainer.callback_metrics["val/bleu"] = torch.tensor(bleu)
        cb.on_validation_end(trainer, None)
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(1e-3)


def test_best_checkpoint_is_tested_and_named_in_the_record(tmp_path):
    # test_weights=best: the test splits are scored with the checkpoint best by the monitored validation
    # metric, and the record says so (step, score, flavour); last is the default.
    # Checkpoints ranked by the HIGHEST val/loss, so that the selected one is not the last (losses fall).
    cfg = compose([*TINY, *TINY_ALGO, "logger=csv", "trainer.max_steps=6", "test_weights=best",
                   "callbacks.checkpoint.mode=max",
                   "optim.plateau={monitor: val/loss, mode: min, patience: 1, factor: 0.5}"], run_dir=tmp_path)
    record = run(cfg, run_dir=tmp_path, command="test")
    tested = record["extra"]["test_checkpoint"]
    with open(tmp_path / "csv" / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("val/loss")]
    losses = {int(r["step"]) + 1: float(r["val/loss"]) for r in rows}  # the CSV step is global_step - 1
    best_step = max(losses, key=losses.get)
    assert best_step < 6  # not the final weights
    assert tested["weights"] == "best" and tested["monitor"] == "val/loss"
    assert tested["step"] == best_step and tested["score"] == pytest.approx(losses[best_step], rel=1e-5)
    assert record["metric_flavours"]["test_weights"] == "best checkpoint by val/loss (max)"
    assert read_record(tmp_path / "results.json")["extra"]["test_checkpoint"]["step"] == best_step
    # The module tested holds exactly the selected checkpoint's weights.
    module = build_module(cfg)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(1.0)
    best_cb = ModelCheckpoint()  # the selection reads a ModelCheckpoint's best path and score
    best_cb.best_model_path, best_cb.best_model_score = tested["path"], torch.tensor(tested["score"])
    load_test_weights(cfg, module, [best_cb], final_step=6)
    saved = torch.load(tested["path"], weights_only=True)["state_dict"]
    for key, value in module.state_dict().items():
        torch.testing.assert_close(value, saved[key], rtol=0, atol=0)

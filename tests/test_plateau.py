"""QKNorm's training recipe: x0.8 learning-rate decay on a dev-BLEU plateau, stop below stop_lr, and the
test splits scored with the best-dev checkpoint (CyndxAI/QKNorm controller.py)."""

from __future__ import annotations

import csv
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from attnlab.results.record import read_record
from attnlab.training.build import build_module
from attnlab.training.checkpoint_choice import load_test_weights
from attnlab.training.plateau import PlateauDecay, PlateauOptions
from attnlab.training.run import run
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
                   "callbacks.checkpoint.mode=max", "optim.schedule=constant",
                   "optim.plateau={monitor: val/loss, mode: max, patience: 1, factor: 0.5}"], run_dir=tmp_path)
    record = run(cfg, run_dir=tmp_path, command="test")
    tested = record["extra"]["test_checkpoint"]
    with open(tmp_path / "csv" / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("val/loss")]
    losses = {int(r["step"]) + 1: float(r["val/loss"]) for r in rows}  # the CSV step is global_step - 1
    best_step = max(losses, key=losses.get)
    assert best_step < 6  # not the final weights
    # The plateau rule (here "a loss below the previous one is worse", to force it) halved the rate in the
    # trainer after each such validation: the logged rate after the last decay is the peak x 0.5^decays.
    with open(tmp_path / "csv" / "metrics.csv") as f:
        rates = [(int(r["step"]), float(r["lr-Adam/pg1"])) for r in csv.DictReader(f) if r.get("lr-Adam/pg1")]
    steps = sorted(losses)
    # a decay at a validation before the last update shows in the rates logged after it
    decays = sum(1 for a, b in zip(steps, steps[1:]) if losses[b] < losses[a] and b < 6)
    assert decays >= 1 and rates[-1][1] == pytest.approx(cfg.optim.lr * 0.5**decays)
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


def test_validation_scores_the_dev_split_for_selection(tmp_path):
    # With decoding in validation, the task's text scores of the dev split (QKNorm: dev BLEU) are logged as
    # val/<score>, computed over the whole split from the decoded outputs in reference order.
    from attnlab.training.build import build_datamodule

    cfg = compose([*TINY, *TINY_ALGO, "task.decoding.decode_in_validation=true"], run_dir=tmp_path)
    module = build_module(cfg)
    loader = build_datamodule(cfg).val_dataloader()
    batches = list(loader)
    n = sum(len(b["src"]) for b in batches)
    module.references = {"val": [("ref", i) for i in range(n)]}
    module.detokenize = lambda row: tuple(row)
    seen: list = []

    def scorer(hypotheses, references):
        seen.append((hypotheses, references))
        return {"bleu": 100.0 * sum(len(h) for h in hypotheses) / len(hypotheses)}

    module.text_scorer = scorer
    logged: dict = {}
    module.log = lambda name, value, **kw: logged.__setitem__(name, float(value))
    module.eval()
    module.on_validation_epoch_start()
    start = 0
    decoded = []
    with torch.no_grad():
        for batch in batches:
            size = len(batch["src"])
            batch["ref_index"] = torch.arange(start, start + size)
            start += size
            module.validation_step(batch, 0)
            decoded += [tuple(r) for r in module.decode(batch["src"]).tolist()]
        module.on_validation_epoch_end()
    hypotheses, references = seen[-1]
    assert references == module.references["val"] and hypotheses == decoded
    assert logged["val/bleu"] == pytest.approx(100.0 * sum(map(len, decoded)) / n)


@pytest.mark.parametrize("override, message", [
    ("optim.plateau={factor: 1.5}", "optim.plateau.factor=1.5"),
    ("optim.plateau={patience: 0}", "optim.plateau.patience=0"),
    ("optim.plateau={monitr: val/bleu}", "unknown key optim.plateau.monitr"),
    ("test_weights=first", "test_weights='first' is not valid"),
])
def test_bad_recipe_options_are_one_line(override, message):
    from attnlab.errors import ConfigError
    from attnlab.training.config import validate

    with pytest.raises(ConfigError, match=message) as err:
        validate(compose([*TINY, *TINY_ALGO, override]))
    assert "\n" not in str(err.value)


def test_best_weights_need_a_best_checkpoint():
    from attnlab.errors import ConfigError
    from attnlab.training.config import validate

    with pytest.raises(ConfigError, match="save_top_k"):
        validate(compose([*TINY, *TINY_ALGO, "test_weights=best", "callbacks.checkpoint.save_top_k=0"]))


@pytest.mark.parametrize("pair, every, stop_lr", [("gl_en", 100, 5e-5), ("en_vi", 1500, 1e-5), ("sk_en", 600, 1e-5)])
def test_qknorm_presets_follow_the_official_recipe(pair, every, stop_lr):
    # CyndxAI/QKNorm configurations.py + controller.py, at paper scale, for both rows of a pair.
    for row in ("qknorm", "baseline"):
        cfg = compose([f"experiment=qknorm/table1/{row}_{pair}", "scale=paper"])
        o = cfg.optim
        assert o.lr == pytest.approx(512**-0.5 * 8000**-0.5, rel=1e-3) and o.warmup_steps == 8000
        assert o.schedule == "constant" and list(o.betas) == [0.9, 0.999] and o.eps == 1e-8
        assert dict(o.plateau) == {"monitor": "val/bleu", "mode": "max", "factor": 0.8, "patience": 3,
                                   "stop_lr": stop_lr}
        assert cfg.trainer.val_check_interval == every and cfg.batch.tokens_per_update == 4096
        assert cfg.test_weights == "best" and cfg.callbacks.checkpoint.monitor == "val/bleu"
        assert cfg.callbacks.checkpoint.mode == "max" and cfg.task.decoding.decode_in_validation
        assert (cfg.task.decoding.max_len_a, cfg.task.decoding.max_len_b) == (1.0, 50)
    assert compose(["experiment=qknorm/table1/qknorm_gl_en", "scale=paper"]).task.tokenizer.vocab_size == 3000

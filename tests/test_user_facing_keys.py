"""Keys and lines a Lightning user meets (issue 52.6): Trainer arguments refused pointing to where attnlab keeps
them, a warmup longer than the run said once at start, and the metric line reading loss, validation, lr first."""

from __future__ import annotations

import logging

import pytest

from attnlab.errors import ConfigError
from attnlab.training.callbacks import _format
from attnlab.training.compose import compose_checked
from attnlab.training.describe import describe_config
from tests.conftest import compose


@pytest.mark.parametrize("override, pointer", [
    ("+trainer.gradient_clip_val=1.0", "use optim.grad_clip"),
    ("+trainer.gradient_clip_algorithm=norm", "use optim.grad_clip"),
    ("+trainer.accumulate_grad_batches=4", "use batch.sentences_per_update or batch.tokens_per_update"),
    ("+trainer.max_epochs=3", "use trainer.max_steps"),
    ("+trainer.precision=bf16-mixed", "use hardware.precision"),
])
def test_lightning_trainer_arguments_point_to_attnlabs_keys(override, pointer):
    key = override.split("=")[0].lstrip("+")
    with pytest.raises(ConfigError, match=rf"^{key} is a Lightning Trainer argument .*{pointer}"):
        compose_checked("train", ["task=algo/copy", override])


def test_an_unknown_trainer_key_still_lists_the_valid_ones():
    with pytest.raises(ConfigError, match="unknown key trainer.max_stpes; valid keys of trainer: max_steps"):
        compose_checked("train", ["task=algo/copy", "+trainer.max_stpes=3"])


def test_a_warmup_at_or_beyond_the_run_is_said_once_at_start(tmp_path, caplog):
    short = compose(["task=algo/copy", "trainer.max_steps=20", "optim.warmup_steps=200", "optim.lr=0.003"])
    with caplog.at_level(logging.INFO, logger="attnlab"):
        describe_config(short, tmp_path)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1
    # peak = lr x max_steps / warmup = 0.003 x 20 / 200
    assert "optim.warmup_steps=200 >= trainer.max_steps=20" in warned[0] and "peaks at 0.0003 (10%" in warned[0]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="attnlab"):
        describe_config(compose(["task=algo/copy", "trainer.max_steps=400", "optim.warmup_steps=200"]), tmp_path)
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


def test_building_a_table_in_process_leaves_attnlabs_loggers_on(tmp_path, capsys):
    """Hydra's ``disabled`` logging config (once used by the table command) switched off every logger that
    existed, so a table built in a notebook or a test worker silenced the warnings of every later run in that
    process: the warmup warning above went missing whenever a table test ran first on the same worker."""
    from attnlab.cli.table import main as table_main
    from attnlab.training import describe

    assert describe.log.name.startswith("attnlab")
    table_main(["table=ut/table4_copy", f"runs={tmp_path / 'none'}", f"out={tmp_path / 'out'}", "plot=false"])
    assert not logging.getLogger("attnlab").disabled and not describe.log.disabled


def test_the_metric_line_reads_loss_validation_and_lr_first():
    line = _format({"perf/tokens_per_s": 230.7, "train/grad_norm": 1.3, "lr": 0.0004, "val/seq_acc": 0.5,
                    "train/loss": 2.7, "train/nll": 2.7, "val/loss": 2.5})
    keys = line.split()[::2]
    assert keys == ["train/loss", "val/loss", "val/seq_acc", "lr", "train/grad_norm", "train/nll",
                    "perf/tokens_per_s"]


def test_a_stopped_sweep_says_which_sweep_folder_resumes_it():
    """Issue 52.8: inside ``-m`` "rerun the same command" starts a new timestamped sweep folder; the stop message
    names the hydra.sweep.dir= that resumes the stopped one (shell-quoted: it is pasted back)."""
    from types import SimpleNamespace

    from attnlab.training.sweeps import sweep_resume_hint

    hc = SimpleNamespace(sweep=SimpleNamespace(dir="multirun/2026-12-06/10-00-00 my sweep"))
    assert "'hydra.sweep.dir=multirun/2026-12-06/10-00-00 my sweep' added to resume it" in sweep_resume_hint(hc, True)
    assert sweep_resume_hint(hc, False) == ""

"""What a run says about itself at the top of ``train.log``: the effective config in brief, then what the data
decided (batching, tokenizer, parameter count).
"""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig

from attnlab.tasks import TaskData
from attnlab.training.build import derive_batching
from attnlab.training.modules import TaskModule, count_parameters

log = logging.getLogger("attnlab")


def describe_config(cfg: DictConfig, run_dir: Path) -> None:
    """The first lines of ``train.log``: where the run writes and the effective config in brief."""
    m, o, t, hw = cfg.model, cfg.optim, cfg.trainer, cfg.hardware
    per_update = (f"{cfg.batch.tokens_per_update} tokens" if cfg.batch.get("tokens_per_update")
                  else f"{cfg.batch.sentences_per_update} sentences")
    log.info("run folder: %s", run_dir.resolve())
    log.info("config: %stask %s, model %s, attention %s, recurrence %s, seed %s, scale %s%s",
             f"experiment {cfg.experiment_name}, " if cfg.get("experiment_name") else "", cfg.task.name, m.name,
             m.attention.name, m.recurrence.name, cfg.seed, cfg.scale.name,
             f", debug {cfg.debug_mode}" if cfg.get("debug_mode") else "")
    log.info("model: d_model %d, %d heads, d_ff %d, %d encoder + %d decoder layers, dropout %g", m.d_model,
             m.num_heads, m.d_ff, m.encoder_layers, m.decoder_layers, m.dropout)
    optimizer = o.optimizer._target_ if isinstance(o.optimizer, DictConfig) else o.optimizer
    schedule = (o.schedule._target_ if isinstance(o.schedule, DictConfig)
                else f"{o.schedule}, warmup {o.warmup_steps}")
    log.info("training: %d steps, %s per update, %s lr %g (%s), validation every %d steps; hardware %s "
             "(%d x %s, precision %s)", t.max_steps, per_update, optimizer, o.lr, schedule, t.val_check_interval,
             hw.name, hw.devices * hw.num_nodes, hw.accelerator, hw.precision)
    if not isinstance(o.schedule, DictConfig) and 0 < t.max_steps <= o.warmup_steps:
        # a short ablation of a preset (trainer.max_steps=200) keeps the preset's warmup: said once, here
        log.warning("optim.warmup_steps=%d >= trainer.max_steps=%d: the run ends inside the warmup, and the "
                    "learning rate peaks at %.3g (%.0f%% of optim.lr=%g); shorten the warmup with the steps if "
                    "that is not what you want", o.warmup_steps, t.max_steps, o.lr * t.max_steps / o.warmup_steps,
                    100 * t.max_steps / o.warmup_steps, o.lr)


def describe_build(cfg: DictConfig, task: TaskData, module: TaskModule) -> None:
    """What the data decided: batching, tokenizer and parameter count."""
    micro, accumulate = derive_batching(cfg, max_len=task.max_len)
    log.info("batching: micro-batch %d x %d accumulation x %d device(s)", micro, accumulate,
             cfg.hardware.devices * cfg.hardware.num_nodes)
    tokenizer = cfg.task.get("tokenizer")
    kind = f"{tokenizer.kind} (asked vocabulary {tokenizer.get('vocab_size')}), " if tokenizer else ""
    source = f", source {task.src_vocab_size}" if task.src_vocab_size and task.src_vocab_size != task.vocab_size else ""
    log.info("tokenizer: %svocabulary %d%s", kind, task.vocab_size, source)
    params = count_parameters(module.model)
    log.info("parameters: %s total, %s trainable", f"{params['total']:,}", f"{params['trainable']:,}")


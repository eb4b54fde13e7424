"""Build a run's parts from its composed config: the task's data, the module (model + optimiser settings + what
only the data knows) and the data module, with the batching that makes one update the size the config asks.

``run.py`` calls these in order; tests and tools (``training/evaluation.py``) call ``build_module`` and
``build_datamodule`` directly, from here.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import Any

from omegaconf import DictConfig, OmegaConf

from attnlab.attention.registry import get_entry
from attnlab.decoding.options import DecodingOptions
from attnlab.errors import ConfigError
from attnlab.tasks import DataError, TaskData, build_task
from attnlab.training.acceleration import apply_to_module, switch
from attnlab.training.data import derive_token_batching, example_length
from attnlab.training.modules import MODULES, TaskModule
from attnlab.training.resumable_data import ResumableDataModule

log = logging.getLogger("attnlab")


def derive_batching(cfg: DictConfig, *, max_len: int | None = None) -> tuple[int, int]:
    """(micro-batch per device in sentences, gradient accumulation) so that one update sees
    ``batch.sentences_per_update`` sentences, or about ``batch.tokens_per_update`` tokens, whatever the
    hardware. In token mode the micro-batch is a cap on sentences and ``max_len`` (the task's longest
    sequence) sizes the token budget of a micro-batch (see ``token_budget``)."""
    world = cfg.hardware.devices * cfg.hardware.num_nodes
    if cfg.batch.get("tokens_per_update"):
        _, accumulate = token_budget(cfg, max_len)
        return micro_batch_ceiling(cfg, max_len), accumulate
    per_update = cfg.batch.sentences_per_update
    ceiling = micro_batch_ceiling(cfg, max_len)
    accumulate = math.ceil(per_update / (ceiling * world))
    micro, rest = divmod(per_update, world * accumulate)
    if rest or micro == 0:
        raise ConfigError(
            f"batch.sentences_per_update={per_update} cannot be split evenly over {world} device(s) with "
            f"micro-batches <= {ceiling} sentences (hardware.max_batch_per_device="
            f"{cfg.hardware.max_batch_per_device}, max_tokens_per_device="
            f"{cfg.hardware.get('max_tokens_per_device')}); use a multiple of {world * accumulate}"
        )
    return micro, accumulate


def micro_batch_ceiling(cfg: DictConfig, max_len: int | None) -> int:
    """Sentences a micro-batch may hold on one device: ``hardware.max_batch_per_device``, lowered so that
    that many sequences of ``max_len`` stay within ``hardware.max_tokens_per_device`` when it is set (a
    sentence count alone would ask BigBird Table 10 at paper size for 256 x 4096 = 1M tokens a micro-batch)."""
    ceiling = int(cfg.hardware.max_batch_per_device)
    tokens = cfg.hardware.get("max_tokens_per_device")
    if tokens and max_len:
        ceiling = max(1, min(ceiling, int(tokens) // int(max_len)))
    return ceiling


def token_budget(cfg: DictConfig, max_len: int | None) -> tuple[int, int]:
    """(padded tokens per micro-batch, gradient accumulation) for ``batch.tokens_per_update``: a
    micro-batch holds at most ``hardware.max_batch_per_device`` sequences of up to ``max_len`` tokens."""
    if not max_len:
        raise ConfigError("batch.tokens_per_update needs the task's max length; build the task first")
    world = cfg.hardware.devices * cfg.hardware.num_nodes
    return derive_token_batching(int(cfg.batch.tokens_per_update), world=world,
                                 max_tokens_per_micro=micro_batch_ceiling(cfg, max_len) * int(max_len))


def build_task_data(cfg: DictConfig) -> TaskData:
    task_cfg = OmegaConf.to_container(cfg.task, resolve=True)
    task_cfg.setdefault("data_root", cfg.paths.data_root)
    log.info("loading data: task %s (%s)", cfg.task.name, task_cfg.get("source") or "local/generated")
    started = time.monotonic()
    task = build_task(task_cfg, int(cfg.seed))
    log.info("data: %s; max length %d (%.1f s)", data_sizes(task), task.max_len, time.monotonic() - started)
    return task


def data_sizes(task: TaskData) -> str:
    """``train 20000, val 256, test 128 examples`` (a streamed split without a length is shown as such)."""
    sizes = []
    for split, dataset in task.datasets.items():
        try:
            sizes.append(f"{split} {len(dataset)}")
        except TypeError:
            sizes.append(f"{split} (streamed)")
    return ", ".join(sizes) + " examples"


def check_splits_not_empty(task: TaskData) -> None:
    """An empty training, validation or test split is bad data, found before any training."""
    for split in dict.fromkeys(("train", "val", *task.eval_splits.values())):
        dataset = task.datasets.get(split)
        if dataset is not None and hasattr(dataset, "__len__") and len(dataset) == 0:
            purpose = "train on" if split == "train" else "score"
            raise DataError(f"split {split} of the task is empty: nothing to {purpose}; check the task's data "
                            f"files and size keys")


def model_config(cfg: DictConfig, task: TaskData) -> dict[str, Any]:
    """The model section as a plain dict, with what only the data knows filled in."""
    model = OmegaConf.to_container(cfg.model, resolve=True)
    model.pop("at_scale", None)
    if model.get("max_len") is None:
        model["max_len"] = task.max_len
    elif task.max_len > model["max_len"] and longest_example(task) > model["max_len"]:
        # A seq2seq task's max_len includes room to decode (max_len_a x source + max_len_b); an explicit
        # model.max_len (the synthesizers' l_max) only has to hold the data: decoding stops at it.
        raise ConfigError(
            f"the task needs sequences of length {longest_example(task)} but model.max_len={model['max_len']}; "
            f"raise model.max_len or shorten the task"
        )
    attention = model["attention"]
    model["attention"] = get_entry(attention["name"]).cls.resolve_options(
        attention, run_seed=int(cfg.seed), train_lengths=list(task.train_lengths))
    return model


def longest_example(task: TaskData) -> int:
    """The longest sequence a model must hold over every split (BOS/EOS included), without decoding room."""
    if task.kind != "seq2seq" or not task.datasets:
        return task.max_len
    return max(max(example_length(ds[i]) for i in range(len(ds))) + 1 for ds in task.datasets.values() if len(ds))


def task_info(task: TaskData) -> dict[str, Any]:
    return {
        "kind": task.kind,
        "vocab_size": task.vocab_size,
        "src_vocab_size": task.src_vocab_size or task.vocab_size,
        "pad_id": task.pad_id,
        "bos_id": task.bos_id,
        "eos_id": task.eos_id,
        "num_classes": task.num_classes,
        "eval_splits": dict(task.eval_splits),
    }


def decoding_config(cfg: DictConfig) -> dict[str, Any]:
    """``task.decoding`` with every key, as the plain dict the module keeps in its checkpoint."""
    dec = cfg.task.get("decoding")
    return dataclasses.asdict(DecodingOptions.of(OmegaConf.to_container(dec, resolve=True) if dec else None))


def run_flavours(cfg: DictConfig, task: TaskData) -> dict[str, Any]:
    """The task's metric flavours; a seq2seq task that does not describe its decoding gets the decoding the
    module actually used (strategy, beam, which length penalty)."""
    flavours = dict(task.metric_flavours)
    if task.kind == "seq2seq":
        flavours.setdefault("decoding", DecodingOptions.of(decoding_config(cfg)).describe())
    return flavours


def build_module(cfg: DictConfig, task: TaskData | None = None, *, nonfinite_guard: Any = None) -> TaskModule:
    """The task family's module for ``cfg``, with the task's scorer and references, the config's optimizer
    choice and ``nonfinite_guard`` (``run`` passes the trainer's; tools that only evaluate pass none)."""
    task = task or build_task_data(cfg)
    module_cls = MODULES[task.kind]
    scored = task.score_text is not None
    module = module_cls(model_config(cfg, task), OmegaConf.to_container(cfg.optim, resolve=True), task_info(task),
                        decoding_config(cfg), run_seed=int(cfg.seed),
                        text_scorer=task.score_text, references=task.references if scored else None,
                        # decoded test outputs are kept for the outputs files (training/outputs.py)
                        detokenize=task.detokenize if task.kind == "seq2seq" else None,
                        fused_optimizer=switch(cfg, "fused_optimizer"), nonfinite_guard=nonfinite_guard)
    apply_to_module(cfg, module)
    return module


def build_datamodule(cfg: DictConfig, task: TaskData | None = None) -> ResumableDataModule:
    task = task or build_task_data(cfg)
    micro, _ = derive_batching(cfg, max_len=task.max_len)
    micro_tokens = token_budget(cfg, task.max_len)[0] if cfg.batch.get("tokens_per_update") else None
    return ResumableDataModule(task, micro_batch=micro, eval_batch=cfg.batch.eval_batch_size,
                               num_workers=cfg.hardware.num_workers, shuffle_seed=int(cfg.seed),
                               micro_tokens=micro_tokens, pin_memory=switch(cfg, "pin_memory"))


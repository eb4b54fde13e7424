"""Evaluation under DDP: every metric and every decoded output equals the one-process value for 2 and 3 gloo
processes, on splits that do not divide evenly over the ranks (one with fewer batches than ranks).

Each world size runs the same untrained, seeded modules through ``Trainer.validate`` and ``Trainer.test`` in
processes started here (torchrun's variables, so Lightning spawns none): no training, a few seconds each.
Before issue 42 the ranks were padded with repeated examples that the count-based metrics counted, and
classification/regression losses came from rank 0's shard alone.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch

from tests.conftest import TINY, TINY_ALGO

# Uneven on purpose: 13 test examples in batches of 4 are 4 batches (2 ranks: 2 + 2, 3 ranks: 2 + 1 + 1 with
# repeats); 3 validation examples are one batch, so ranks 1 and 2 score nothing at all.
SIZES = ["batch.eval_batch_size=4"]
CASES = {
    "seq2seq": [*TINY, *TINY_ALGO, *SIZES, "task.at_scale.cpu.val_size=3", "task.at_scale.cpu.test_size=13"],
    "classification": [*TINY, *SIZES, "task=lra/listops", "task.at_scale.cpu.train_size=16",
                       "task.at_scale.cpu.val_size=3", "task.at_scale.cpu.test_size=13",
                       "task.at_scale.cpu.min_len=8", "task.at_scale.cpu.max_len=24", "model.max_len=32"],
    "mlm": [*TINY, *SIZES, "task=lm/mlm_wikitext2", "task.block_len=8", "task.masks_per_block=1"],
}


def _mlm_corpus(root: Path) -> None:
    folder = root / "wikitext2"
    folder.mkdir(parents=True, exist_ok=True)
    words = [f"w{i % 37} the cat sat on mat {i % 5} ." for i in range(60)]
    for split, n in (("train", 40), ("valid", 3), ("test", 13)):  # blocks of 8 tokens: 3 and 13 per split
        (folder / f"wiki.{split}.tokens").write_text("\n".join(words[:n]) + "\n", encoding="utf-8")


def _evaluate(case: str, data_root: Path, world: int) -> dict:
    """Validate and test one case in this process (rank ``RANK`` of ``world``); what rank 0 saw."""
    import lightning as L
    from lightning.pytorch.strategies import DDPStrategy

    from attnlab.training.build import build_datamodule, build_module, build_task_data
    from tests.conftest import compose

    cfg = compose([*CASES[case], f"paths.data_root={data_root}"])
    task = build_task_data(cfg)
    torch.manual_seed(0)
    module = build_module(cfg, task)
    strategy = DDPStrategy(process_group_backend="gloo") if world > 1 else "auto"
    trainer = L.Trainer(accelerator="cpu", devices=world, strategy=strategy, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    datamodule = build_datamodule(cfg, task)
    trainer.validate(module, datamodule=datamodule, verbose=False)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    trainer.test(module, datamodule=datamodule, verbose=False)
    metrics.update({k: float(v) for k, v in trainer.callback_metrics.items()})
    outputs = {prefix: {str(i): out for i, out in by_index.items()} for prefix, by_index in module.test_outputs.items()}
    return {"metrics": metrics, "outputs": outputs}


def _worker(rank: int, world: int, port: int, data_root: str, out: str) -> None:
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world), "GROUP_RANK": "0",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "TORCHELASTIC_RUN_ID": "attnlab-test"})
    torch.set_num_threads(1)
    results = {case: _evaluate(case, Path(data_root), world) for case in CASES}
    if rank == 0:
        Path(out).write_text(json.dumps(results), encoding="utf-8")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data")
    _mlm_corpus(root)
    return root


@pytest.fixture(scope="module")
def one_process(data_root) -> dict:
    return {case: _evaluate(case, data_root, 1) for case in CASES}


@pytest.mark.timeout(300)
# three processes (uneven shards) in the slow tier: the default tier keeps two (the CI time budget)
@pytest.mark.parametrize("world", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_every_metric_and_output_equals_the_one_process_value(world, one_process, data_root, tmp_path):
    import torch.multiprocessing as mp

    out = tmp_path / "rank0.json"
    mp.spawn(_worker, args=(world, _free_port(), str(data_root), str(out)), nprocs=world, join=True)
    many = json.loads(out.read_text(encoding="utf-8"))
    for case, expected in one_process.items():
        got = many[case]
        assert sorted(got["metrics"]) == sorted(expected["metrics"]), case
        for key, value in expected["metrics"].items():
            assert got["metrics"][key] == pytest.approx(value, rel=1e-6, abs=1e-9), (case, key)
        assert got["outputs"] == expected["outputs"], case  # each test example decoded once, as alone
    # the cases test something: scores that a repeated or missing example would move
    seq2seq = one_process["seq2seq"]["metrics"]
    assert {"val/loss", "val/ppl", "test/char_acc"} <= set(seq2seq)
    assert len(one_process["seq2seq"]["outputs"]["test"]) == 13
    assert {"val/loss", "val/acc", "test/acc"} <= set(one_process["classification"]["metrics"])
    assert {"test/mlm_acc", "test/mlm_acc_shuffled", "val/loss"} <= set(one_process["mlm"]["metrics"])

"""Sizing and resuming beyond one CPU: micro-batches bounded in tokens, generator states across GPU counts."""

from __future__ import annotations

import pytest
import torch

from attnlab.training.build import derive_batching, micro_batch_ceiling
from attnlab.training.checkpointing import cuda_state_for_this_device
from tests.conftest import compose


def test_paper_size_bigbird_micro_batch_is_bounded_in_tokens():
    """A sentence ceiling alone (256 on gpu1) asked BigBird Table 10 at 4096 for 1M tokens a micro-batch."""
    cfg = compose(["experiment=bigbird/table10/bigbird_itc_4096", "scale=paper", "hardware=gpu1"])
    micro, accumulate = derive_batching(cfg, max_len=4096)
    assert micro * 4096 <= cfg.hardware.max_tokens_per_device == 65536
    assert micro * accumulate == cfg.batch.sentences_per_update  # the global batch is the preset's
    for world in (2, 8):
        cfg.hardware.devices = world
        micro, accumulate = derive_batching(cfg, max_len=4096)
        assert micro * 4096 <= 65536 and micro * accumulate * world == cfg.batch.sentences_per_update


def test_the_token_ceiling_only_lowers_the_sentence_ceiling():
    cfg = compose(["hardware=gpu1"])
    assert micro_batch_ceiling(cfg, 16) == cfg.hardware.max_batch_per_device  # short sequences: unchanged
    assert micro_batch_ceiling(cfg, 1024) == 64
    assert micro_batch_ceiling(cfg, 1_000_000) == 1  # one sequence is the least a micro-batch holds
    assert micro_batch_ceiling(cfg, None) == cfg.hardware.max_batch_per_device
    cpu = compose(["hardware=cpu"])
    assert "max_tokens_per_device" not in cpu.hardware  # CPU presets (and their config hashes) unchanged
    assert micro_batch_ceiling(cpu, 4096) == cpu.hardware.max_batch_per_device


@pytest.mark.parametrize(("saved_on", "device", "expected"), [(8, 3, 3), (8, 0, 0), (2, 3, 0)])
def test_a_checkpoint_from_more_or_fewer_gpus_restores_this_devices_generator(saved_on, device, expected):
    """Checkpoints before 2026-12-04 hold every visible GPU's state; resuming on fewer GPUs indexed past them."""
    states = [torch.full((8,), i, dtype=torch.uint8) for i in range(saved_on)]
    assert int(cuda_state_for_this_device(states, device)[0]) == expected
    one = torch.full((8,), 7, dtype=torch.uint8)  # what a checkpoint holds now: the saving process's device
    assert cuda_state_for_this_device(one, device) is one

"""Test-set decoding in batches of similar source length, with outputs still scored in reference order."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from attnlab.decoding.search import beam_search_reference, greedy_decode
from attnlab.tasks.batching import IndexedDataset, IndexedSeq2SeqCollate
from attnlab.training.build import build_module, build_task_data
from attnlab.training.data import EvalBatchSampler, TaskDataModule
from tests.conftest import TINY, TINY_ALGO, compose


def test_eval_batch_sampler_covers_every_example_once_in_length_order():
    rng = random.Random(0)
    lengths = [rng.randint(1, 30) for _ in range(23)]
    one = list(EvalBatchSampler(range(23), batch_size=4, lengths=lengths))
    assert [len(b) for b in one] == [4] * 5 + [3] and [b.number for b in one] == list(range(6))
    flat = [i for b in one for i in b]
    assert flat == sorted(range(23), key=lambda i: (lengths[i], i))
    assert [i for b in EvalBatchSampler(range(23), batch_size=4) for i in b] == list(range(23))  # split order
    # DDP: every rank runs the same number of steps; the batches that are not repeats are the one-process
    # batches, each once, with the one-process numbers (a rank's repeats are marked, never scored)
    shards = [list(EvalBatchSampler(range(23), batch_size=4, lengths=lengths, num_replicas=4, rank=r))
              for r in range(4)]
    assert {len(s) for s in shards} == {2}
    scored = sorted((b.number, list(b)) for s in shards for b in s if not b.repeat)
    assert scored == [(b.number, list(b)) for b in one]
    assert sum(b.repeat for s in shards for b in s) == 2


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_seq2seq_test_outputs_are_scored_in_reference_order(strategy, tmp_path):
    """Batches come sorted by source length; each output still meets its own reference (``ref_index``), and
    equals decoding that source alone (no cross-talk from the padding or the other beams of its batch), with
    the unbatched reference beam search for beam."""
    cfg = compose([*TINY, *TINY_ALGO, "task.at_scale.cpu.test_size=10", "batch.eval_batch_size=4"],
                  run_dir=tmp_path)
    task = build_task_data(cfg)
    pairs = [task.datasets["test"][i][:2] for i in range(len(task.datasets["test"]))]
    assert len({len(s) for s, _ in pairs}) > 2 and [len(s) for s, _ in pairs] != sorted(len(s) for s, _ in pairs)
    references = [" ".join(map(str, t)) for _, t in pairs]
    task = dataclasses.replace(task, datasets={**task.datasets, "test": IndexedDataset(pairs)},
                               collate=IndexedSeq2SeqCollate(task.pad_id, task.bos_id, task.eos_id))
    torch.manual_seed(0)
    module = build_module(cfg, task).eval()
    scored: list = []
    module.text_scorer = lambda hyps, refs: scored.extend(zip(hyps, refs)) or {}
    eos = task.eos_id
    module.detokenize = lambda ids: " ".join(map(str, ids[: ids.index(eos) if eos in ids else len(ids)]))
    # a fixed decode limit, so that a hypothesis that never emits EOS stops at the same length in any batch
    module.eval_cfg = {**module.eval_cfg, "strategy": strategy, "beam_size": 3, "max_len_a": 0.0, "max_len_b": 9}
    module.references = {"test": references}

    dm = TaskDataModule(task, micro_batch=4, eval_batch=4)
    loader = dm.test_dataloader()[list(task.eval_splits.values()).index("test")]
    widths = []
    with torch.no_grad():
        for batch in loader:
            widths.append(batch["src"].shape[1])
            module.test_step(batch, 0)  # pops the batch's place in the split
    assert widths == sorted(widths) and widths[0] < widths[-1]
    module._score_split(0)
    assert [ref for _, ref in scored] == references
    t, e = module.task_info, module.eval_cfg
    for (src, _), (hyp, _) in zip(pairs, scored):
        alone = torch.tensor([[*src, eos]])
        if strategy == "greedy":
            out = greedy_decode(module.model, alone, bos_id=t["bos_id"], eos_id=eos, max_len=9)
        else:
            out = beam_search_reference(module.model, alone, bos_id=t["bos_id"], eos_id=eos, max_len=9, beam_size=3,
                              alpha=e["length_penalty_alpha"], length_penalty=e["length_penalty"])
        assert hyp == module.detokenize(out[0].tolist())

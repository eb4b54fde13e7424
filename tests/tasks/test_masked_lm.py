"""Masked LM (tasks/masked_lm.py, MaskedLMModule): BERT's masking statistics, scoring of masked positions only,
and bits per character against hand-computed examples."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnlab.metrics import MaskedLMScore
from attnlab.tasks import build_task
from attnlab.tasks.masked_lm import bert_mask, covered_characters


def test_bert_mask_scores_15_percent_and_splits_them_80_10_10():
    vocab = np.arange(10, 1000)
    mask_id, n, blocks = 5, 512, 400
    counts = {"mask": 0, "random": 0, "kept": 0}
    for i in range(blocks):
        ids = np.random.default_rng([99, i]).choice(vocab, size=n)
        inputs, chosen = bert_mask(ids, np.random.default_rng([7, i]), mask_prob=0.15, mask_id=mask_id,
                                   random_ids=vocab)
        assert chosen.sum() == round(0.15 * n)  # BERT: exactly round(n * masked_lm_prob) positions
        assert np.array_equal(inputs[~chosen], ids[~chosen])  # unchosen positions are never touched
        at = inputs[chosen]
        counts["mask"] += int((at == mask_id).sum())
        changed = (at != mask_id) & (at != ids[chosen])
        assert np.isin(at[changed], vocab).all()
        counts["random"] += int(changed.sum())
        counts["kept"] += int((at == ids[chosen]).sum())
    total = sum(counts.values())
    assert total == blocks * round(0.15 * n)
    # A random replacement equal to the original (p = 1/990) counts as kept: expected shares 0.8 / ~0.1 / ~0.1.
    for name, share in (("mask", 0.8), ("random", 0.1 * (1 - 1 / 990)), ("kept", 0.1 + 0.1 / 990)):
        sd = math.sqrt(share * (1 - share) / total)
        assert abs(counts[name] / total - share) < 4 * sd, (name, counts[name] / total)


def test_bert_mask_is_a_function_of_the_generator_seed():
    ids = np.arange(100)
    a = bert_mask(ids, np.random.default_rng([1, 3]), mask_prob=0.15, mask_id=0, random_ids=ids)
    b = bert_mask(ids, np.random.default_rng([1, 3]), mask_prob=0.15, mask_id=0, random_ids=ids)
    c = bert_mask(ids, np.random.default_rng([1, 4]), mask_prob=0.15, mask_id=0, random_ids=ids)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(a[1], c[1])


def test_covered_characters_partition_the_line_and_its_newline():
    line = " = Big Bird = "
    offsets = [(1, 2), (3, 6), (7, 11), (12, 13)]  # "=", "Big", "Bird", "="
    # each token covers the text since the previous token's end; the line end covers the rest + newline
    assert covered_characters(line, offsets) == [2, 4, 5, 2, 2]
    assert sum(covered_characters(line, offsets)) == len(line) + 1
    assert covered_characters("", []) == [1]  # a blank line: its newline


def test_bpc_and_bits_per_token_by_hand():
    # Three masked tokens over a vocabulary of 4 with uniform logits: 2 bits each, 6 bits in all. They cover
    # 4 + 3 + 2 = 9 characters, so bpc = 6 / 9; the papers' "BPC" (bits per token) is 2.
    score = MaskedLMScore()
    score.update(torch.zeros(3, 4), torch.tensor([0, 1, 2]), torch.tensor([4, 3, 2]))
    out = score.compute()
    assert out["bpc"].item() == pytest.approx(6 / 9)
    assert out["bits_per_token"].item() == pytest.approx(2.0)
    assert out["loss"].item() == pytest.approx(math.log(4))
    # One confident right prediction (p = 0.9 on the target of a 2-way softmax): -log2 0.9 bits over 5 characters.
    score.reset()
    logits = torch.tensor([[math.log(0.9), math.log(0.1)]])
    score.update(logits, torch.tensor([0]), torch.tensor([5]))
    out = score.compute()
    assert out["bpc"].item() == pytest.approx(-math.log2(0.9) / 5)
    assert out["mlm_acc"].item() == 1.0


def _corpus(root, text: str) -> dict:
    folder = root / "c"
    folder.mkdir(parents=True, exist_ok=True)
    for split in ("train", "valid", "test"):
        (folder / f"{split}.txt").write_text(text, encoding="utf-8")
    return dict(name="lm/mlm_test", family="lm", loader="masked_lm", source="local", data_root=str(root),
                files={"train": "c/train.txt", "val": "c/valid.txt", "test": "c/test.txt"}, block_len=8,
                masks_per_block=2)


def test_loader_blocks_cover_the_file_characters_and_mask_each_copy_differently(tmp_path):
    lines = [f" = w{i} x{i % 3} = " if i % 4 == 0 else f"the cat {i} sat on the mat ." for i in range(40)] + [""]
    text = "\n".join(lines) + "\n"
    task = build_task(_corpus(tmp_path, text), seed=3)
    assert task.kind == "mlm"
    test = task.datasets["test"]
    assert len(test) == test.blocks  # evaluation: one mask per block
    items = [test[i] for i in range(test.blocks)]
    covered = sum(int(x["chars"].sum()) for x in items)
    tail = int(test.chars[test.blocks * test.block_len:].sum())
    assert covered + tail == len(text)  # the tokens partition the file's characters
    train = task.datasets["train"]
    assert len(train) == 2 * train.blocks
    copies = [(train[i], train[i + train.blocks]) for i in range(train.blocks)]  # each block, its 2 copies
    assert all(torch.equal(a["target"], b["target"]) for a, b in copies)
    assert any(not torch.equal(a["scored"], b["scored"]) for a, b in copies)
    mask_id = task.vocab_size - 1
    for item in items:
        assert int(item["scored"].sum()) == round(0.15 * 8)
        assert torch.equal(item["ids"][~item["scored"]], item["target"][~item["scored"]])
    assert any(bool((x["ids"] == mask_id).any()) for x in items)
    # evaluation masks do not depend on the run seed: every row of a table is scored on the same positions
    other = build_task(_corpus(tmp_path, text), seed=4).datasets["test"]
    assert all(torch.equal(test[i]["scored"], other[i]["scored"]) for i in range(test.blocks))


def _scored_tokens(dataset) -> dict[int, tuple[int, int]]:
    """Stream position -> (input id, target id) of every scored token of an evaluation split."""
    out = {}
    for i in range(dataset.blocks):
        item = dataset[i]
        for j in torch.nonzero(item["scored"]).flatten().tolist():
            out[i * dataset.block_len + j] = (int(item["ids"][j]), int(item["target"][j]))
    return out


def test_stream_masking_scores_the_same_tokens_at_every_block_length(tmp_path):
    # BigBird Table 10 compares rows at 4, 8 and 16 tokens a block here (512, 2048, 4096 in the paper). With
    # eval_masking=stream and the evaluation streams cut to a multiple of the longest block, every row scores
    # the same tokens of the same text with the same replacements (a paired comparison); with BERT's per-block
    # masks (the default) the scored tokens differ between block lengths.
    lines = [f"the cat {i} sat on the mat number {i % 7} ." for i in range(60)]
    text = "\n".join(lines) + "\n"
    cfg = {**_corpus(tmp_path, text), "eval_masking": "stream", "eval_tokens_multiple": 16}
    paired = [_scored_tokens(build_task({**cfg, "block_len": n}, seed=1).datasets["test"]) for n in (4, 8, 16)]
    assert paired[0] == paired[1] == paired[2] and len(paired[0]) > 20
    default = [_scored_tokens(build_task({**_corpus(tmp_path, text), "block_len": n}, seed=1).datasets["test"])
               for n in (4, 16)]  # fmt: skip
    assert set(default[0]) != set(default[1])
    stream = build_task({**cfg, "block_len": 4}, seed=1).datasets["test"]
    assert len(stream.stream) % 16 == 0 and stream.unused_tokens == 0
    from attnlab.tasks.base import DataError

    with pytest.raises(DataError, match="eval_masking='per_row'; valid: block"):
        build_task({**cfg, "eval_masking": "per_row"}, seed=1)


def _module(vocab: int = 50, positions: str = "sinusoidal"):
    from attnlab.training.modules import MaskedLMModule

    model = dict(d_model=16, num_heads=2, d_ff=32, encoder_layers=1, decoder_layers=1, dropout=0.0,
                 attention_dropout=0.0, activation_dropout=0.0, activation="relu", norm_first=True,
                 positions=positions, share_embeddings=True, tie_output=True, max_len=12,
                 cross_attention="auto", attention={"name": "vanilla"}, recurrence={"name": "stacked"})
    optim = dict(label_smoothing=0.0)
    info = dict(kind="mlm", vocab_size=vocab, pad_id=0, eval_splits={"test": "test"})
    torch.manual_seed(0)
    return MaskedLMModule(model, optim, info, {}).eval()


def test_only_masked_positions_are_scored():
    module = _module()
    g = torch.Generator().manual_seed(0)
    target = torch.randint(4, 50, (3, 12), generator=g)
    scored = torch.zeros(3, 12, dtype=torch.bool)
    scored[:, [2, 7]] = True
    ids = target.masked_fill(scored, 49)
    batch = {"ids": ids, "target": target, "scored": scored, "chars": torch.full((3, 12), 4)}
    loss, _, _ = module.compute_loss(batch)
    logits, _ = module.model(ids, scored)
    assert logits.shape == (6, 50)  # logits only where scored
    # changing the targets (and characters) of unscored positions changes nothing
    other = dict(batch, target=target.masked_fill(~scored, 5), chars=batch["chars"].masked_fill(~scored, 99))
    assert torch.equal(module.compute_loss(other)[0], loss)
    metric_a, metric_b = MaskedLMScore(), MaskedLMScore()
    for metric, b in ((metric_a, batch), (metric_b, other)):
        metric.update(module.model(b["ids"], b["scored"])[0], b["target"][b["scored"]], b["chars"][b["scored"]])
    assert {k: v.item() for k, v in metric_a.compute().items()} == {k: v.item() for k, v in metric_b.compute().items()}
    # ... while the target of a scored position does
    flipped = target.clone()
    flipped[0, 2] = 6 if int(target[0, 2]) != 6 else 7
    assert not torch.equal(module.compute_loss(dict(batch, target=flipped))[0], loss)


def _blocks(rows: int = 4, n: int = 12, vocab: int = 50):
    g = torch.Generator().manual_seed(1)
    target = torch.randint(4, vocab, (rows, n), generator=g)
    scored = torch.rand(rows, n, generator=g) < 0.3
    scored[:, 0] = True
    return {"ids": target.masked_fill(scored, vocab - 1), "target": target, "scored": scored,
            "chars": torch.randint(1, 9, (rows, n), generator=g)}


def test_shuffled_blocks_keep_each_positions_input_target_mask_and_characters_together():
    from attnlab.training.modules import shuffle_blocks

    batch = _blocks()
    shuffled = shuffle_blocks(batch, seed=3)
    assert not torch.equal(shuffled["ids"], batch["ids"])
    def positions(b, row):
        return sorted(zip(*(b[k][row].tolist() for k in ("ids", "target", "scored", "chars"))))

    for row in range(batch["ids"].shape[0]):
        assert positions(shuffled, row) == positions(batch, row)  # the same (input, target, mask, chars) positions
    assert all(torch.equal(shuffled[k], shuffle_blocks(batch, seed=3)[k]) for k in batch)  # fixed by the seed


def _test_scores(module, batch):
    module.test_step(batch, 0)
    logged = {}
    module.log = lambda key, value, **kw: logged.__setitem__(key, float(value))
    module.on_test_epoch_end()
    return logged


def test_shuffled_accuracy_equals_accuracy_for_a_model_blind_to_order_and_not_for_one_with_positions():
    # Without positions a full-attention encoder is permutation-equivariant: every masked token gets the same
    # prediction in any order, so the shuffled scores equal the scores (a bug that moved targets or masks
    # apart from their inputs would break this). With positions the order changes the predictions.
    batch = _blocks()
    blind = _test_scores(_module(positions="none"), batch)
    assert set(blind) >= {"test/mlm_acc", "test/mlm_acc_shuffled", "test/bits_per_token_shuffled"}
    assert blind["test/bits_per_token_shuffled"] == pytest.approx(blind["test/bits_per_token"], rel=1e-5)
    assert blind["test/mlm_acc_shuffled"] == blind["test/mlm_acc"]
    assert blind["test/mlm_acc_from_order"] == 0.0
    ordered = _test_scores(_module(positions="sinusoidal"), batch)
    assert ordered["test/bits_per_token_shuffled"] != pytest.approx(ordered["test/bits_per_token"], rel=1e-5)
    assert ordered["test/mlm_acc_from_order"] == pytest.approx(
        ordered["test/mlm_acc"] - ordered["test/mlm_acc_shuffled"], abs=1e-6)

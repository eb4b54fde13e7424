"""Networks built from the shared blocks: caches, parameter sharing, randomized position offsets."""

from __future__ import annotations

import pytest
import torch

from attnlab.models import DecoderLM, EncoderClassifier, EncoderDecoder
from attnlab.models.networks import Embedding

CFG = dict(d_model=32, num_heads=4, d_ff=64, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
           activation="relu", norm_first=False, attention={"name": "vanilla"}, cross_attention="auto",
           recurrence={"name": "stacked"}, encoder_layers=2, decoder_layers=2, positions="sinusoidal",
           share_embeddings=True, tie_output=True)


@pytest.mark.parametrize("recurrence", [{"name": "stacked"}, {"name": "ut"}, {"name": "ut_act", "act_max_steps": 4}])
def test_random_position_offset_only_in_training(recurrence):
    torch.manual_seed(0)
    model = EncoderDecoder({**CFG, "recurrence": recurrence, "random_position_offset": 50},
                           src_vocab=10, tgt_vocab=10, pad_id=0, max_len=16)
    src, tgt = torch.randint(3, 10, (2, 12)), torch.randint(3, 10, (2, 9))
    model.eval()
    a, _ = model(src, tgt)
    b, _ = model(src, tgt)
    assert torch.equal(a, b)  # evaluation starts at position 0, always
    model.train()
    shifted = [model(src, tgt)[0] for _ in range(4)]
    assert any(not torch.allclose(s, a, atol=1e-5) for s in shifted)  # training positions moved
    assert all(m.position_shift == 0 for m in model.modules() if hasattr(m, "position_shift"))


def test_shifted_positions_fit_the_table():
    emb = Embedding(10, 16, pad_id=0, max_len=8, positions="sinusoidal", dropout=0.0, max_shift=100)
    emb.position_shift = 100
    assert emb(torch.ones(1, 8, dtype=torch.long)).shape == (1, 8, 16)
    with pytest.raises(ValueError, match="model.max_len"):
        emb(torch.ones(1, 9, dtype=torch.long))


def test_lm_and_classifier_run_and_tie_weights():
    lm = DecoderLM(CFG, vocab=20, pad_id=0, max_len=16)
    assert lm.output.weight is lm.embed.tokens.weight
    logits, _ = lm(torch.randint(1, 20, (2, 10)))
    assert logits.shape == (2, 10, 20)
    clf = EncoderClassifier(CFG, vocab=20, pad_id=0, max_len=16, num_classes=3)
    out, _ = clf(torch.randint(1, 20, (2, 10)))
    assert out.shape == (2, 3)


def test_lm_cached_decoding_equals_full_forward():
    torch.manual_seed(1)
    lm = DecoderLM(CFG, vocab=20, pad_id=0, max_len=16).eval()
    ids = torch.randint(1, 20, (3, 10))
    full, _ = lm(ids)
    cache: dict = {}
    steps = [lm(ids[:, i : i + 1], cache=cache)[0] for i in range(10)]
    assert torch.allclose(torch.cat(steps, 1), full, atol=1e-5)


def test_padding_does_not_change_real_positions():
    torch.manual_seed(2)
    model = EncoderDecoder(CFG, src_vocab=12, tgt_vocab=12, pad_id=0, max_len=32).eval()
    src, tgt = torch.randint(3, 12, (1, 7)), torch.randint(3, 12, (1, 5))
    base, _ = model(src, tgt)
    padded, _ = model(torch.cat([src, torch.zeros(1, 4, dtype=torch.long)], 1),
                      torch.cat([tgt, torch.zeros(1, 3, dtype=torch.long)], 1))
    assert torch.allclose(padded[:, :5], base, atol=1e-5)


def _every_network():
    """(name, builder) for every network class ``attnlab.models`` exports, at a size with 3 attention layers
    per stack and a BigBird self-attention that draws random blocks."""
    import attnlab.models as models

    cfg = {**CFG, "encoder_layers": 3, "decoder_layers": 3,
           "attention": {"name": "bigbird", "block_size": 4, "num_random_blocks": 2, "dense_fallback_len": 0}}
    builders = {
        "EncoderDecoder": lambda: models.EncoderDecoder(cfg, src_vocab=10, tgt_vocab=10, pad_id=0, max_len=64),
        "DecoderLM": lambda: models.DecoderLM(cfg, vocab=10, pad_id=0, max_len=64),
        "EncoderClassifier": lambda: models.EncoderClassifier(cfg, vocab=10, pad_id=0, max_len=64, num_classes=2),
        "EncoderMLM": lambda: models.EncoderMLM(cfg, vocab=10, pad_id=0, max_len=64),
    }
    exported = {n for n in models.__all__ if isinstance(getattr(models, n), type)
                and issubclass(getattr(models, n), torch.nn.Module) and n != "Embedding"}
    assert exported == set(builders), f"a network without a case here: {sorted(exported - set(builders))}"
    return sorted(builders.items())


@pytest.mark.parametrize(("name", "build"), _every_network())
def test_every_network_numbers_its_attention_layers_so_each_draws_its_own_plan(name, build):
    """Fails when a network forgets ``number_attention_layers``: every layer then keeps layer 0's BigBird plan
    (the masked LM did so until 2026-12-04, issue 42)."""
    from attnlab.attention.bigbird import BigBirdAttention

    torch.manual_seed(3)
    sparse = [m for m in build().modules() if isinstance(m, BigBirdAttention)]
    assert len(sparse) >= 3
    indices = [m.layer_index for m in sparse]  # cross-attention modules are numbered too, between them
    assert indices == sorted(set(indices)) and indices[0] == 0
    plans = [m.random_blocks for m in sparse]
    assert all(not torch.equal(a, b) for i, a in enumerate(plans) for b in plans[i + 1:])


@pytest.mark.parametrize("attention", ["vanilla", "qknorm", "synth_dense", "bigbird"])
@pytest.mark.parametrize("network", ["encoder_decoder", "decoder_lm", "classifier", "mlm"])
def test_a_batch_said_to_hold_no_padding_gives_what_the_masked_network_gives(network, attention):
    """``padded=False`` (read from the batch on the host) builds no attention mask, and a causal layer takes
    SDPA's ``is_causal`` instead: on a batch without padding the outputs must equal the masked ones (a
    misaligned causal flag, or the classifier's pooling without a mask, would differ)."""
    from attnlab.models import EncoderMLM

    torch.manual_seed(0)
    cfg = {**CFG, "attention": {"name": attention, **({"block_size": 2} if attention == "bigbird" else {})}}
    ids, other = torch.randint(3, 10, (2, 8)), torch.randint(3, 10, (2, 8))
    if network == "encoder_decoder":
        model = EncoderDecoder(cfg, src_vocab=10, tgt_vocab=10, pad_id=0, max_len=16).eval()
        run = lambda flags: model(ids, other, padded=flags)[0]  # noqa: E731
        flags = {"src": False, "tgt_in": False}
    elif network == "decoder_lm":
        model = DecoderLM(cfg, vocab=10, pad_id=0, max_len=16).eval()
        run = lambda flags: model(ids, padded=flags)[0]  # noqa: E731
        flags = {"ids": False}
    elif network == "classifier":
        model = EncoderClassifier(cfg, vocab=10, pad_id=0, max_len=16, num_classes=3).eval()
        run = lambda flags: model(ids, padded=flags)[0]  # noqa: E731
        flags = {"ids": False}
    else:
        model = EncoderMLM(cfg, vocab=10, pad_id=0, max_len=16).eval()
        scored = torch.rand(2, 8) < 0.5
        run = lambda flags: model(ids, scored, padded=flags)[0]  # noqa: E731
        flags = {"ids": False}
    with torch.no_grad():
        torch.testing.assert_close(run(flags), run(None), rtol=1e-5, atol=1e-5)

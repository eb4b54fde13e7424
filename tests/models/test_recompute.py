"""Activation checkpointing (``hardware.activation_checkpointing``) recomputes layers in the backward pass and
must change nothing else: the same loss and gradients (dropout on, so the random state must be replayed),
the same parameter names (checkpoints interchangeable) and the same cached decoding."""

from __future__ import annotations

import copy

import pytest
import torch

from attnlab.decoding.search import greedy_decode
from attnlab.models.networks import DecoderLM, EncoderDecoder
from attnlab.models.recompute import recompute_layer_activations
from tests.models.test_universal import PAD, VOCAB, model_cfg, tokens

DROPOUT = {"dropout": 0.2, "attention_dropout": 0.1, "activation_dropout": 0.1}
# Positions halt after differing numbers of steps (p ~ 0.27 at init), in at most 3 steps.
ACT = {"name": "ut_act", "act_max_steps": 3, "halting_bias_init": -1.0}


def _loss_and_grads(model, src, tgt):
    torch.manual_seed(5)
    logits, aux = model(src, tgt) if isinstance(model, EncoderDecoder) else model(tgt)
    loss = logits.float().logsumexp(-1).mean() + sum(v for k, v in aux.items() if k.startswith("loss/"))
    loss.backward()
    # named_parameters() of the whole network shows the wrapper's prefix (state_dict() does not)
    return loss.detach(), {name.replace("._checkpoint_wrapped_module", ""): p.grad.clone()
                           for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("network", ["encoder_decoder", "decoder_lm"])
@pytest.mark.parametrize("recurrence", [{"name": "stacked"}, {"name": "ut"}, ACT], ids=["stacked", "ut", "act"])
def test_recomputed_layers_give_the_same_loss_and_gradients(network, recurrence):
    torch.manual_seed(0)
    cfg = model_cfg(recurrence, encoder_layers=2, decoder_layers=2, **DROPOUT)
    if network == "encoder_decoder":
        plain = EncoderDecoder(cfg, src_vocab=VOCAB, tgt_vocab=VOCAB, pad_id=PAD, max_len=64)
    else:
        plain = DecoderLM(cfg, vocab=VOCAB, pad_id=PAD, max_len=64)
    wrapped = copy.deepcopy(plain)
    assert recompute_layer_activations(wrapped) >= (1 if recurrence["name"] != "stacked" else 2)
    src, tgt = tokens(3, 9, seed=1), tokens(3, 7, seed=2)
    src[0, 6:] = PAD
    tgt[1, 5:] = PAD
    plain_loss, plain_grads = _loss_and_grads(plain.train(), src, tgt)
    wrapped_loss, wrapped_grads = _loss_and_grads(wrapped.train(), src, tgt)
    # Same checkpoint names: a checkpoint of either loads into the other.
    assert list(wrapped.state_dict()) == list(plain.state_dict())
    assert wrapped_grads.keys() == plain_grads.keys()
    torch.testing.assert_close(wrapped_loss, plain_loss, rtol=0, atol=0)
    for name, grad in plain_grads.items():
        torch.testing.assert_close(wrapped_grads[name], grad, rtol=1e-5, atol=1e-6, msg=name)


def test_a_recomputed_network_decodes_with_its_cache_as_the_plain_one():
    torch.manual_seed(0)
    plain = EncoderDecoder(model_cfg({"name": "stacked"}, encoder_layers=2, decoder_layers=2), src_vocab=VOCAB,
                           tgt_vocab=VOCAB, pad_id=PAD, max_len=64).eval()
    wrapped = copy.deepcopy(plain)
    recompute_layer_activations(wrapped)
    wrapped.load_state_dict(plain.state_dict())  # the plain network's checkpoint loads into the wrapped one
    src = tokens(2, 8, seed=3)
    with torch.no_grad():
        expected = greedy_decode(plain, src, bos_id=1, eos_id=2, max_len=10)
        got = greedy_decode(wrapped, src, bos_id=1, eos_id=2, max_len=10)
    assert torch.equal(got, expected)

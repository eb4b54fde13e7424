"""Fine-tuning with the embedding and softmax layers kept fixed (Synthesizer T5 path, optim.freeze_embeddings)."""

from __future__ import annotations

import torch

from attnlab.models import EncoderDecoder
from attnlab.training.modules import freeze_embeddings

CFG = dict(d_model=16, num_heads=2, d_ff=32, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
           activation="relu", norm_first=True, attention={"name": "vanilla"}, cross_attention="auto",
           recurrence={"name": "stacked"}, encoder_layers=1, decoder_layers=1, positions="sinusoidal")


def test_embeddings_and_softmax_stay_fixed_while_the_rest_trains():
    for share, tie in [(True, True), (False, False)]:
        torch.manual_seed(0)
        model = EncoderDecoder({**CFG, "share_embeddings": share, "tie_output": tie}, src_vocab=11, tgt_vocab=11,
                               pad_id=0, max_len=16)
        frozen = set(freeze_embeddings(model))
        assert frozen == {"src_embed.tokens.weight", "tgt_embed.tokens.weight", "output.weight"}
        before = {k: v.clone() for k, v in model.state_dict().items()}
        opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.1)
        logits, _ = model(torch.randint(1, 11, (2, 5)), torch.randint(1, 11, (2, 4)))
        logits.sum().backward()
        opt.step()
        after = model.state_dict()
        for name in frozen:
            assert torch.equal(after[name], before[name]), name
        assert not torch.equal(after["encoder.layers.0.self_attn.q_proj.weight"],
                               before["encoder.layers.0.self_attn.q_proj.weight"])


def test_t5_fine_tuning_presets_keep_embeddings_fixed_and_pre_training_does_not():
    from tests.conftest import compose

    for name in ("multitask_glue_random", "multitask_superglue_dense_vanilla"):
        preset = [f"experiment=synthesizer/t5/{name}"]
        # The paper's T5 fine-tuning keeps them fixed (scale=paper, and the preset's own value) ...
        assert compose([*preset, "scale=paper"]).optim.freeze_embeddings is True
        assert compose(preset, scale=False).optim.freeze_embeddings is True
        # ... laptop protocol v2 trains them: a 1200-update WikiText-2 table frozen cost 9 points of SST-2 (LOG).
        assert compose([*preset, "scale=cpu"]).optim.freeze_embeddings is False
    assert compose(["experiment=synthesizer/t5/pretrain_random"]).optim.freeze_embeddings is False

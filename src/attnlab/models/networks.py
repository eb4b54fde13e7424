"""Encoder-decoder, decoder-only LM, encoder classifier and encoder with a masked-LM head, built from the same
blocks."""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from attnlab.attention import number_attention_layers
from attnlab.models.blocks import LayerSpec, sinusoid_table
from attnlab.models.recurrence import build_decoder_stack, build_encoder_stack


class Embedding(nn.Module):
    """Token embedding scaled by sqrt(d_model), plus positions unless the stack adds its own.

    ``positions``: ``sinusoidal`` (Vaswani et al.), ``learned`` or ``none``.
    """

    # Added to every position during training when model.random_position_offset > 0 (set by the network).
    position_shift = 0

    def __init__(self, vocab_size: int, d_model: int, *, pad_id: int, max_len: int, positions: str, dropout: float,
                 max_shift: int = 0):
        super().__init__()
        self.tokens = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
        nn.init.normal_(self.tokens.weight, mean=0.0, std=d_model**-0.5)
        with torch.no_grad():
            self.tokens.weight[pad_id].zero_()
        self.scale = math.sqrt(d_model)
        self.positions = positions
        if positions == "learned":
            self.pos = nn.Embedding(max_len + max_shift, d_model)
        elif positions == "sinusoidal":
            self.register_buffer("pos_table", sinusoid_table(max_len + max_shift, d_model), persistent=False)
        elif positions != "none":
            raise ValueError(f"model.positions={positions!r}; valid: sinusoidal, learned, none")
        self.dropout = nn.Dropout(dropout)
        self.max_len = max_len

    def forward(self, ids: torch.Tensor, *, offset: int = 0, add_positions: bool = True) -> torch.Tensor:
        x = self.tokens(ids) * self.scale
        n = ids.shape[1]
        if add_positions and self.positions != "none":
            if offset + n > self.max_len:
                raise ValueError(
                    f"sequence length {offset + n} exceeds model.max_len={self.max_len}; raise model.max_len"
                )
            start = offset + self.position_shift
            if self.positions == "learned":
                x = x + self.pos(torch.arange(start, start + n, device=ids.device))
            else:
                x = x + self.pos_table[start : start + n].to(x.dtype)
        return self.dropout(x)


def _spec(cfg: dict[str, Any], max_len: int) -> LayerSpec:
    return LayerSpec(
        d_model=cfg["d_model"],
        num_heads=cfg["num_heads"],
        d_ff=cfg["d_ff"],
        dropout=cfg["dropout"],
        attention_dropout=cfg["attention_dropout"],
        activation_dropout=cfg["activation_dropout"],
        activation=cfg["activation"],
        norm_first=cfg["norm_first"],
        max_len=max_len,
        self_attention=dict(cfg["attention"]),
        cross_attention=(
            cfg["cross_attention"] if isinstance(cfg["cross_attention"], str) else dict(cfg["cross_attention"])
        ),
    )


@contextmanager
def random_position_shift(model: nn.Module, max_shift: int):
    """During training, start every position at a random offset in [0, max_shift] for this batch.

    The UT paper trains its algorithmic tasks "using positions starting with randomized offsets to further
    encourage the model to learn position-relative transformations" (Sec. 3.3); evaluation uses offset 0.
    """
    if not (model.training and max_shift > 0):
        yield
        return
    shift = int(torch.randint(0, max_shift + 1, ()).item())
    targets = [m for m in model.modules() if hasattr(m, "position_shift")]
    for m in targets:
        m.position_shift = shift
    try:
        yield
    finally:
        for m in targets:
            m.position_shift = 0


def _merge_aux(*auxes: dict[str, Any]) -> dict[str, Any]:
    """Sum losses and logged scalars of several stacks (encoder + decoder ponder terms add up)."""
    out: dict[str, Any] = {}
    for prefix, aux in zip(("encoder", "decoder"), auxes):
        for key, value in aux.items():
            if key.startswith(("loss/", "log/")):
                out[key] = out[key] + value if key in out else value
            out[f"{prefix}/{key}"] = value
    return out


class EncoderDecoder(nn.Module):
    """Encoder-decoder Transformer for sequence-to-sequence tasks (MT, summarization, algorithmic)."""

    def __init__(self, cfg: dict[str, Any], *, src_vocab: int, tgt_vocab: int, pad_id: int, max_len: int,
                 run_seed: int | None = None):
        super().__init__()
        spec = _spec(cfg, max_len)
        self.pad_id = pad_id
        self.encoder = build_encoder_stack(dict(cfg["recurrence"]), spec, cfg["encoder_layers"])
        self.decoder = build_decoder_stack(dict(cfg["recurrence"]), spec, cfg["decoder_layers"], cross=True)
        # per-layer random state (BigBird plans, fixed random R) from (run seed, layer)
        number_attention_layers(self, run_seed)
        self.max_shift = int(cfg.get("random_position_offset", 0) or 0)
        emb = dict(pad_id=pad_id, max_len=max_len, positions=cfg["positions"], dropout=cfg["dropout"],
                   max_shift=self.max_shift)
        self.src_embed = Embedding(src_vocab, cfg["d_model"], **emb)
        if cfg["share_embeddings"]:
            if src_vocab != tgt_vocab:
                raise ValueError("model.share_embeddings=true needs one joint vocabulary for source and target")
            self.tgt_embed = self.src_embed
        else:
            self.tgt_embed = Embedding(tgt_vocab, cfg["d_model"], **emb)
        self.output = nn.Linear(cfg["d_model"], tgt_vocab, bias=False)
        if cfg["tie_output"]:
            self.output.weight = self.tgt_embed.tokens.weight

    def encode(self, src: torch.Tensor, *, padded: bool = True):
        padding = src.eq(self.pad_id) if padded else None
        x = self.src_embed(src, add_positions=not self.encoder.adds_positions)
        memory, aux = self.encoder(x, padding)
        return memory, padding, aux

    def decode(self, tgt_in, memory, memory_padding, *, cache: dict | None = None, padded: bool = True):
        offset = 0 if cache is None else int(cache.get("length", 0))
        padding = tgt_in.eq(self.pad_id) if cache is None and padded else None
        x = self.tgt_embed(tgt_in, offset=offset, add_positions=not self.decoder.adds_positions)
        h, aux = self.decoder(x, memory, memory_padding, padding, cache=cache)
        if cache is not None:
            cache["length"] = offset + tgt_in.shape[1]
        return self.output(h), aux

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor, *, padded: dict[str, bool] | None = None):
        """``padded``: which of ``src``/``tgt_in`` hold padding, as read from the batch on the host (a missing
        entry: assume padding; ``training.modules.TaskModule.on_before_batch_transfer``)."""
        padded = padded or {}
        with random_position_shift(self, self.max_shift):
            memory, memory_padding, enc_aux = self.encode(src, padded=padded.get("src", True))
            logits, dec_aux = self.decode(tgt_in, memory, memory_padding, padded=padded.get("tgt_in", True))
        return logits, _merge_aux(enc_aux, dec_aux)


class DecoderLM(nn.Module):
    """Decoder-only language model (causal self-attention, no cross-attention)."""

    def __init__(self, cfg: dict[str, Any], *, vocab: int, pad_id: int, max_len: int,
                 run_seed: int | None = None):
        super().__init__()
        spec = _spec(cfg, max_len)
        self.pad_id = pad_id
        self.decoder = build_decoder_stack(dict(cfg["recurrence"]), spec, cfg["decoder_layers"], cross=False)
        number_attention_layers(self, run_seed)
        self.max_shift = int(cfg.get("random_position_offset", 0) or 0)
        self.embed = Embedding(vocab, cfg["d_model"], pad_id=pad_id, max_len=max_len,
                               positions=cfg["positions"], dropout=cfg["dropout"], max_shift=self.max_shift)
        self.output = nn.Linear(cfg["d_model"], vocab, bias=False)
        if cfg["tie_output"]:
            self.output.weight = self.embed.tokens.weight

    def forward(self, ids: torch.Tensor, *, cache: dict | None = None, padded: dict[str, bool] | None = None):
        offset = 0 if cache is None else int(cache.get("length", 0))
        padding = ids.eq(self.pad_id) if cache is None and (padded or {}).get("ids", True) else None
        with random_position_shift(self, self.max_shift if cache is None else 0):
            x = self.embed(ids, offset=offset, add_positions=not self.decoder.adds_positions)
            h, aux = self.decoder(x, None, None, padding, cache=cache)
        if cache is not None:
            cache["length"] = offset + ids.shape[1]
        return self.output(h), _merge_aux({}, aux)


class EncoderClassifier(nn.Module):
    """Encoder with a classification (or regression, ``num_classes=1``) head over mean-pooled states."""

    def __init__(self, cfg: dict[str, Any], *, vocab: int, pad_id: int, max_len: int, num_classes: int,
                 run_seed: int | None = None):
        super().__init__()
        spec = _spec(cfg, max_len)
        self.pad_id = pad_id
        self.encoder = build_encoder_stack(dict(cfg["recurrence"]), spec, cfg["encoder_layers"])
        number_attention_layers(self, run_seed)
        self.max_shift = int(cfg.get("random_position_offset", 0) or 0)
        self.embed = Embedding(vocab, cfg["d_model"], pad_id=pad_id, max_len=max_len,
                               positions=cfg["positions"], dropout=cfg["dropout"], max_shift=self.max_shift)
        self.head = nn.Sequential(
            nn.Linear(cfg["d_model"], cfg["d_model"]), nn.Tanh(), nn.Dropout(cfg["dropout"]),
            nn.Linear(cfg["d_model"], num_classes),
        )

    def forward(self, ids: torch.Tensor, *, padded: dict[str, bool] | None = None):
        padding = ids.eq(self.pad_id) if (padded or {}).get("ids", True) else None
        with random_position_shift(self, self.max_shift):
            x = self.embed(ids, add_positions=not self.encoder.adds_positions)
            h, aux = self.encoder(x, padding)
        if padding is None:
            pooled = h.mean(1)
        else:
            keep = (~padding).unsqueeze(-1).to(h.dtype)
            pooled = (h * keep).sum(1) / keep.sum(1).clamp_min(1.0)
        return self.head(pooled), _merge_aux(aux, {})


class EncoderMLM(nn.Module):
    """Encoder with BERT's masked-LM head: dense + GELU + LayerNorm, then the output projection tied to the
    token embedding plus a per-token bias (google-research/bert ``get_masked_lm_output``).

    ``forward(ids, scored)`` returns logits at the ``scored`` positions only, (number scored, vocab): the
    vocabulary projection, the largest matrix product at word level, is paid for 15% of the tokens.
    """

    def __init__(self, cfg: dict[str, Any], *, vocab: int, pad_id: int, max_len: int,
                 run_seed: int | None = None):
        super().__init__()
        spec = _spec(cfg, max_len)
        self.pad_id = pad_id
        self.encoder = build_encoder_stack(dict(cfg["recurrence"]), spec, cfg["encoder_layers"])
        # without it every layer drew layer 0's BigBird plan (before 2026-12-04)
        number_attention_layers(self, run_seed)
        self.embed = Embedding(vocab, cfg["d_model"], pad_id=pad_id, max_len=max_len,
                               positions=cfg["positions"], dropout=cfg["dropout"])
        d = cfg["d_model"]
        self.transform = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.LayerNorm(d))
        self.output = nn.Linear(d, vocab, bias=True)
        if cfg["tie_output"]:
            self.output.weight = self.embed.tokens.weight

    def forward(self, ids: torch.Tensor, scored: torch.Tensor, *, padded: dict[str, bool] | None = None):
        # Without padding no mask is built: attention may take its mask-free (flash) kernel. Asked of the
        # batch on the host (``padded``), not of the device tensor, which would wait for the accelerator.
        padding = ids.eq(self.pad_id) if (padded or {}).get("ids", True) else None
        x = self.embed(ids, add_positions=not self.encoder.adds_positions)
        h, aux = self.encoder(x, padding)
        return self.output(self.transform(h[scored])), _merge_aux(aux, {})

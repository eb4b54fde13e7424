"""Attention capture: the attention probabilities (attention maps) of every self-attention module, taken while
a model runs (Synthesizer paper, Figure 2).

    with capture_attention_weights(model) as captured:
        model(batch)
    weights, allowed = captured[0].dense()      # (B, H, Lq, Lk) post-mask softmax, (B, 1|H, Lq, Lk) bool

Outside this context manager no module computes anything extra: each variant checks one attribute
(``capturing_weights``) and otherwise keeps its fused path (SDPA, the blocked BigBird kernel). Inside
it, every self-attention forward without a decoding cache also computes its post-softmax, post-mask
weights explicitly and hands them over as one ``AttentionWeights`` capture. Cross-attention and
incremental (cached) steps are not captured: the figure is about self-attention over whole sequences.

Part of the registry contract (tests/attention/test_registry_contract.py): for every variant the
captured weights are row-stochastic over the allowed keys, zero elsewhere, and ``weights @ V`` through
the value and output projections gives the module's output. A variant that captures nothing still
yields a capture, marked unavailable with the reason, so that test fails for it instead of passing by
omission.

Captures are stored in "parts" so that a block-sparse variant can hand over exactly the weights it
computed without an L x L tensor: a part holds the probabilities of a set of query rows over their
own list of key columns (``query_index``, ``key_index``). Dense variants have one part covering every
row and column; ``dense()`` scatters the parts into the (B, H, Lq, Lk) matrix when one is wanted, and
the statistics (``allowed_entries``, ``row_statistics``) read the parts directly.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from attnlab.attention.base import Attention


@dataclass
class WeightPart:
    """Probabilities of some query rows over their own key columns.

    probs: (B, H, Q, K) post-mask softmax (float32).
    allowed: bool, broadcastable to probs: the keys each query may attend (after padding, causality and,
        for sparse variants, the sparsity pattern). Disallowed entries are zero in ``probs``.
    real_queries: (B, Q) bool, False at padding queries (their rows are excluded from every statistic).
    query_index: (Q,) long, the query position of each row in the full matrix.
    key_index: (Q or 1, K) long, the key column of each entry in the full matrix (with extra keys first).
    """

    probs: torch.Tensor
    allowed: torch.Tensor
    real_queries: torch.Tensor
    query_index: torch.Tensor
    key_index: torch.Tensor

    def _masks(self) -> tuple[torch.Tensor, torch.Tensor]:
        allowed = self.allowed.expand_as(self.probs)
        rows = self.real_queries[:, None, :].expand(self.probs.shape[:3])
        return allowed, rows


@dataclass
class AttentionWeights:
    """One captured forward of one self-attention module.

    name: the module's path in the captured model (``encoder.layers.0.self_attn``).
    call: how many earlier forwards of this module the capture saw (the step of a shared UT layer).
    num_queries, num_keys: the size of the full matrix; ``extra_keys`` of the key columns come first and
        are not sequence positions (BigBird's ETC global tokens), the rest are positions 0..num_keys-extra-1.
    note: why a capture is unavailable, or what is special about it (BigBird's sparse path).
    """

    variant: str
    causal: bool
    layout: str
    num_queries: int
    num_keys: int
    parts: list[WeightPart] = field(default_factory=list)
    extra_keys: int = 0
    note: str | None = None
    name: str = ""
    call: int = 0

    @property
    def available(self) -> bool:
        return self.layout != "unavailable"

    def dense(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights (B, H, Lq, Lk), allowed (B, 1|H, Lq, Lk) bool): the full matrix, zero where not attended.

        Materialises Lq x Lk per head: meant for tests and short sequences, not for BigBird at length 4k.
        """
        if not self.available:
            raise ValueError(f"{self.name or self.variant}: no attention weights captured ({self.note})")
        if self.layout == "dense" and len(self.parts) == 1:
            part = self.parts[0]
            return part.probs, part.allowed.expand(part.probs.shape[0], -1, -1, -1)
        first = self.parts[0].probs
        b, h = first.shape[:2]
        rows = max(int(p.query_index.max()) for p in self.parts if p.query_index.numel()) + 1
        cols = max(int(p.key_index.max()) for p in self.parts if p.key_index.numel()) + 1
        weights = first.new_zeros(max(rows, self.num_queries), max(cols, self.num_keys), b, h)
        # One allowed mask per head only where some part's mask differs by head (BigBird per-head plans).
        heads = max(p.allowed.shape[1] for p in self.parts)
        allowed = torch.zeros(weights.shape[:2] + (b, heads), dtype=torch.int32, device=first.device)
        for part in self.parts:
            q, k = part.query_index[:, None], part.key_index
            q, k = torch.broadcast_tensors(q, k)
            # accumulate=True: filler columns of a sparse row may repeat a real column; they carry 0.
            weights.index_put_((q, k), part.probs.permute(2, 3, 0, 1), accumulate=True)
            mask, _ = part._masks()
            allowed.index_put_((q, k), mask[:, :heads].permute(2, 3, 0, 1).to(torch.int32), accumulate=True)
        weights = weights[: self.num_queries, : self.num_keys].permute(2, 3, 0, 1)
        allowed = allowed[: self.num_queries, : self.num_keys].permute(2, 3, 0, 1) > 0
        return weights, allowed

    def allowed_entries(self) -> torch.Tensor:
        """1-D: every weight of a real query over an allowed key (what a histogram of the weights counts)."""
        out = []
        for part in self.parts:
            allowed, rows = part._masks()
            out.append(part.probs[allowed & rows[..., None]])
        return torch.cat(out) if out else torch.zeros(0)

    def row_statistics(self) -> dict[str, torch.Tensor]:
        """Per real query row and head (1-D each): entropy (nats), largest weight, number of allowed keys."""
        entropy, largest, keys = [], [], []
        for part in self.parts:
            allowed, rows = part._masks()
            p = part.probs.float()
            plogp = torch.where(allowed & (p > 0), p * p.clamp_min(1e-38).log(), torch.zeros_like(p))
            entropy.append(-plogp.sum(-1)[rows])
            largest.append(torch.where(allowed, p, torch.zeros_like(p)).amax(-1)[rows])
            keys.append(allowed.sum(-1)[rows])
        if not entropy:
            empty = torch.zeros(0)
            return {"entropy": empty, "max": empty, "keys": empty}
        return {"entropy": torch.cat(entropy), "max": torch.cat(largest), "keys": torch.cat(keys)}


Sink = Callable[[AttentionWeights], None]


def _real_queries(key_padding_mask: torch.Tensor | None, batch: int, length: int, device) -> torch.Tensor:
    if key_padding_mask is None:
        return torch.ones(batch, length, dtype=torch.bool, device=device)
    return ~key_padding_mask.bool()


def emit_dense(
    module: Attention,
    probs: torch.Tensor,
    allowed: torch.Tensor | None,
    key_padding_mask: torch.Tensor | None,
    *,
    extra_keys: int = 0,
    note: str | None = None,
) -> None:
    """Hand a self-attention's full (B, H, L, extra + L) probabilities to the active capture.

    ``allowed`` is the boolean mask the softmax used (None: every key), broadcastable to ``probs``;
    ``key_padding_mask`` (B, L) marks padding positions (queries and keys are the same sequence).
    """
    b, _, n, k = probs.shape
    if allowed is None:
        allowed = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=probs.device)
    part = WeightPart(
        probs=probs.detach().float(),
        allowed=allowed.detach(),
        real_queries=_real_queries(key_padding_mask, b, n, probs.device),
        query_index=torch.arange(n, device=probs.device),
        key_index=torch.arange(k, device=probs.device)[None],
    )
    module.emit_weights(AttentionWeights(
        variant=module.name, causal=module.causal, layout="dense", num_queries=n, num_keys=k, parts=[part],
        extra_keys=extra_keys, note=note,
    ))


@contextlib.contextmanager
def capture_attention_weights(model: nn.Module, sink: Sink | None = None) -> Iterator[list[AttentionWeights]]:
    """Capture the attention weights of every self-attention module of ``model`` while the block runs.

    Yields the list the captures are appended to, in call order. With ``sink``, each capture goes to
    ``sink`` instead and is not kept (so a caller can reduce one layer to a histogram before the next
    layer's weights exist). Cross-attention modules and cached (incremental) forwards are skipped.
    """
    captured: list[AttentionWeights] = []
    deliver = sink or captured.append
    modules = [(name, m) for name, m in model.named_modules() if isinstance(m, Attention) and not m.is_cross]
    if isinstance(model, Attention) and not model.is_cross and not any(m is model for _, m in modules):
        modules.insert(0, ("", model))
    calls: dict[int, int] = {}
    emitted: dict[int, bool] = {}
    handles = []

    def sink_for(name: str, module: Attention) -> Sink:
        def receive(capture: AttentionWeights) -> None:
            capture.name, capture.call = name, calls.get(id(module), 0)
            emitted[id(module)] = True
            deliver(capture)

        return receive

    def before(module, args, kwargs):
        emitted[id(module)] = False

    def after(name: str):
        def hook(module, args, kwargs, output):
            cache = kwargs.get("cache", args[2] if len(args) > 2 else None)
            if cache is None and not emitted[id(module)]:
                # The variant has no capture path: say so rather than leave a silent gap.
                deliver(AttentionWeights(
                    variant=module.name, causal=module.causal, layout="unavailable", num_queries=0, num_keys=0,
                    note=f"attention variant {module.name!r} does not capture its weights", name=name,
                    call=calls.get(id(module), 0),
                ))
            calls[id(module)] = calls.get(id(module), 0) + 1

        return hook

    try:
        for name, module in modules:
            module._weights_sink = sink_for(name, module)
            handles.append(module.register_forward_pre_hook(before, with_kwargs=True))
            handles.append(module.register_forward_hook(after(name), with_kwargs=True))
        yield captured
    finally:
        for handle in handles:
            handle.remove()
        for _, module in modules:
            module.__dict__.pop("_weights_sink", None)

"""Synthesizer attention (Tay et al. 2020): shared module, logit components and option groups.

A synthesizer replaces QK^T by synthesized logits B (Table 1); every registered synthesizer is a
``SynthesizerAttention`` over one component, or a mixture of several (eq. 9), here in one place so that
masking, slicing, caching and the value path are written once:

    Y = softmax(mask(sum_c w_c B_c)) G(X),   G = value projection, B_c in R^{H x l x l} sliced to L.

Components (``B_c``, per head h):
- ``dense``: B_i = F(X_i), F: d -> l_max (eq. 1-2; Table 7 picks F, see ``DenseLogits``).
- ``factorized_dense``: B_i = H_A(F_A(X_i)) * H_B(F_B(X_i)), a * b >= l_max (eq. 5-6).
- ``random``: B = R, a trainable l_max x l_max matrix (eq. 3).
- ``fixed_random``: B = R, seeded and never trained (a persistent buffer), its own draw per layer and head.
- ``factorized_random``: B = R1 R2^T, R1, R2 in R^{l_max x k} (eq. 7), input independent.
- ``vanilla``: B = Q K^T / sqrt(d_h), only inside mixtures (eq. 9 "+ dot product").
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.attention._cache import append_padding, append_to_cache
from attnlab.attention.base import Attention, AttentionError, Cache, Capabilities
from attnlab.attention.capture import emit_dense
from attnlab.attention.masks import build_allowed_mask, mask_logits
from attnlab.attention.seeding import layer_seed
from attnlab.registry import check_option

SYNTH_FNS = ("dense", "linear", "conv3", "conv5", "bottleneck", "glu")
COMPONENTS = ("dense", "factorized_dense", "random", "fixed_random", "factorized_random", "vanilla")


# -- option groups (each registered variant's options dataclass combines the groups it uses) --------
@dataclass
class SynthOptions:
    bias: bool = True  # biases of the value/output projections and of the synthesizing functions


@dataclass
class DenseFnOptions(SynthOptions):
    synthesizer_fn: str = "dense"
    bottleneck_dim: int | None = None


@dataclass
class FactorizedDenseOptions(SynthOptions):
    factor_a: int | None = None
    factor_b: int | None = None


@dataclass
class FixedRandomOptions(SynthOptions):
    # Base seed of the fixed R draws; each layer draws from (seed, its place in the model). None: the run's
    # seed (the trainer fills it in), 0 for a module or model built outside a run.
    seed: int | None = None


@dataclass
class FactorizedRandomOptions(SynthOptions):
    rank: int = 8


@dataclass
class MixtureWeightOptions:
    weights: list[float] | None = None
    learn_weights: bool = True


# -- logit components ---------------------------------------------------------------------------------
class PerHeadLinear(nn.Module):
    """An independent linear map per head: (B, n, H * d_in) -> (B, H, n, d_out), head h reading its own
    slice of the input; with ``whole_input`` every head reads the whole (B, n, d_in) vector instead."""

    def __init__(self, num_heads: int, d_in: int, d_out: int, bias: bool, *, whole_input: bool = False) -> None:
        super().__init__()
        bound = d_in**-0.5  # nn.Linear's default init range
        self.weight = nn.Parameter(torch.empty(num_heads, d_in, d_out).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(num_heads, d_out).uniform_(-bound, bound)) if bias else None
        self.num_heads, self.whole_input = num_heads, whole_input

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        if self.whole_input:
            y = torch.einsum("bni,hio->bhno", x, self.weight)
        else:
            y = torch.einsum("bnhi,hio->bhno", x.view(b, n, self.num_heads, -1), self.weight)
        return y if self.bias is None else y + self.bias[None, :, None, :]


class SynthComponent(nn.Module, abc.ABC):
    """Produces logits (B or 1, H, n, key_len) for the n new query positions starting at ``offset``."""

    @abc.abstractmethod
    def logits(self, x, *, offset: int, key_len: int, cache: Cache | None, pad) -> torch.Tensor:
        """Synthesized logits of the new query positions over the first ``key_len`` keys."""


class DenseLogits(SynthComponent):
    """Dense synthesizer B_i = F(X_i) in R^{l_max} per head, column j = key position j.

    F by ``synthesizer_fn`` (Table 7), all ending in a per-head map to l_max so that each head has its
    own logits (Table 1 counts d^2 + d*l for ``dense``):
    - dense: Linear(d, d) -> ReLU -> per-head Linear(d_h, l)  (eq. 2).
    - linear: per-head Linear(d, l) on the whole token X_i (the paper's F: R^d -> R^l, one per head;
      dense without the hidden layer). Reading only the head's d/H slice would be a narrower F.
    - bottleneck: Linear(d, b) -> ReLU -> per-head Linear(b/H, l), b = ``bottleneck_dim`` (d/4 default).
    - glu: GLU(Linear(d, 2d)) -> per-head Linear(d_h, l).
    - conv3 / conv5: Conv1d(d, d, k) -> ReLU -> grouped Conv1d(d, H*l, k, groups=H) along the sequence
      (``dense`` is this with k = 1). Causal modules pad on the left only, so position i never reads a
      later token; bidirectional ones pad both sides. Padding positions are zeroed before the convolution
      (and so is the hidden layer there), so padding never reaches real positions: the result equals
      zero-padding the unpadded sequence.
    """

    def __init__(self, d_model, num_heads, l_max, *, fn, bottleneck_dim, causal, bias) -> None:
        super().__init__()
        check_option("synthesizer_fn", fn, SYNTH_FNS, AttentionError)
        self.fn, self.causal, self.num_heads, self.l_max = fn, causal, num_heads, l_max
        self.kernel = int(fn[4:]) if fn.startswith("conv") else 1
        if fn.startswith("conv"):
            self.conv1 = nn.Conv1d(d_model, d_model, self.kernel, bias=bias)
            self.conv2 = nn.Conv1d(d_model, num_heads * l_max, self.kernel, groups=num_heads, bias=bias)
            return
        if fn == "dense":
            self.hidden = nn.Sequential(nn.Linear(d_model, d_model, bias=bias), nn.ReLU())
            width = d_model
        elif fn == "linear":
            self.hidden = nn.Identity()
            self.head = PerHeadLinear(num_heads, d_model, l_max, bias, whole_input=True)
            return
        elif fn == "bottleneck":
            width = bottleneck_dim or num_heads * max(1, d_model // (4 * num_heads))
            if width % num_heads:
                raise AttentionError(f"bottleneck_dim={width} must be divisible by num_heads={num_heads}")
            self.hidden = nn.Sequential(nn.Linear(d_model, width, bias=bias), nn.ReLU())
        else:  # glu
            self.hidden = nn.Sequential(nn.Linear(d_model, 2 * d_model, bias=bias), nn.GLU(dim=-1))
            width = d_model
        self.head = PerHeadLinear(num_heads, width // num_heads, l_max, bias)

    def logits(self, x, *, offset, key_len, cache, pad):
        if self.kernel == 1:
            return self.head(self.hidden(x))[..., :key_len]
        return self._conv(x, offset, cache, pad)[..., :key_len]

    def _conv(self, x, offset, cache, pad):
        k = self.kernel
        if pad is not None:
            x = x.masked_fill(pad[..., None], 0.0)
        xt = x.transpose(1, 2)  # (B, D, n)
        n = xt.shape[-1]
        if not self.causal:
            h = F.relu(self.conv1(F.pad(xt, (k // 2, k // 2))))
            if pad is not None:  # the unpadded sequence would see zeros here, not ReLU(bias + neighbours)
                h = h.masked_fill(pad[:, None, :], 0.0)
            y = self.conv2(F.pad(h, (k // 2, k // 2)))
        else:
            # The output at position p reads x at p-2(k-1)..p; decoding keeps that much history.
            start = offset
            if cache is not None:
                prev = cache.get("dense_x")
                if prev is not None:
                    xt = torch.cat([prev, xt], dim=2)
                    start = offset - prev.shape[2]
                cache["dense_x"] = xt[..., -2 * (k - 1):]
            h = F.relu(self.conv1(F.pad(xt, (k - 1, 0))))  # hidden at positions start..offset+n-1
            lo = offset - (k - 1)  # first hidden position the new outputs read
            # Positions before 0 are zero padding; positions before `start` were computed from a
            # truncated window and are dropped.
            h = h[..., lo - start:] if lo >= start else F.pad(h, (start - lo, 0))
            y = self.conv2(h)
        b = y.shape[0]
        return y.view(b, self.num_heads, self.l_max, n).transpose(2, 3)


class FactorizedDenseLogits(SynthComponent):
    """Factorized dense (eq. 5-6): A = F_A(X_i) in R^a, B = F_B(X_i) in R^b, C = H_A(A) * H_B(B).

    No official code exists. Tiling chosen: H_A tiles A b times and H_B repeats each entry of B a times,
    so C_j = A_{j mod a} * B_{j // a} (a rank-1 a x b grid read row by row), then C is sliced to l_max.
    a * b may exceed l_max (so that a prime l_max works); defaults a = ceil(sqrt(l_max)), b = ceil(l_max/a).
    F_A and F_B share the first layer Linear(d, d) + ReLU and end in per-head maps d_h -> a and d_h -> b,
    so the count is d^2 + d(a + b) as in Table 1.
    """

    def __init__(self, d_model, num_heads, l_max, *, factor_a, factor_b, bias) -> None:
        super().__init__()
        a, b = factor_a, factor_b
        if a is None and b is None:
            a = math.isqrt(l_max - 1) + 1 if l_max > 1 else 1
        if a is None:
            a = -(-l_max // b)
        if b is None:
            b = -(-l_max // a)
        if a < 1 or b < 1 or a * b < l_max:
            raise AttentionError(
                f"factorized dense needs factor_a * factor_b >= max_len={l_max}, got {a} x {b}"
            )
        self.a, self.b = a, b
        dh = d_model // num_heads
        self.hidden = nn.Sequential(nn.Linear(d_model, d_model, bias=bias), nn.ReLU())
        self.head_a = PerHeadLinear(num_heads, dh, a, bias)
        self.head_b = PerHeadLinear(num_heads, dh, b, bias)

    def logits(self, x, *, offset, key_len, cache, pad):
        h = self.hidden(x)
        ca = self.head_a(h).repeat(1, 1, 1, self.b)  # C_j uses A_{j mod a}
        cb = self.head_b(h).repeat_interleave(self.a, dim=-1)  # C_j uses B_{j // a}
        return (ca * cb)[..., :key_len]


class RandomLogits(SynthComponent):
    """Random synthesizer (eq. 3): R in R^{H x l x l}; logits for queries at absolute positions
    offset..offset+n-1 are rows R[offset:offset+n] (decoding uses the current position's row).

    Fixed R (``trainable=False``) is the paper's untrained random initialisation: a persistent buffer,
    one N(0, 1) draw per head. Built alone it is drawn from ``seed``; inside a network
    (``SynthesizerAttention.bind_layer``) each layer redraws from (``seed``, its layer index), so no two
    layers share R and the run seed changes every one of them.
    """

    def __init__(self, num_heads, l_max, *, trainable: bool, seed: int | None = 0) -> None:
        super().__init__()
        self.trainable = trainable
        if trainable:
            self.R = nn.Parameter(torch.randn(num_heads, l_max, l_max))
        else:
            self.base_seed = 0 if seed is None else int(seed)
            gen = torch.Generator().manual_seed(self.base_seed)
            self.register_buffer("R", torch.randn(num_heads, l_max, l_max, generator=gen), persistent=True)

    def draw_for_layer(self, path: str) -> None:
        if self.trainable:
            return  # a trainable R is initialised from the global generator, already distinct per layer
        gen = torch.Generator().manual_seed(layer_seed(self.base_seed, path))
        with torch.no_grad():
            self.R.copy_(torch.randn(self.R.shape, generator=gen))

    def logits(self, x, *, offset, key_len, cache, pad):
        n = x.shape[1]
        return self.R[None, :, offset:offset + n, :key_len].to(x.dtype)


class FactorizedRandomLogits(SynthComponent):
    """Factorized random (eq. 7): R1 R2^T per head, R1, R2 in R^{l x k}; input independent."""

    def __init__(self, num_heads, l_max, *, rank: int) -> None:
        super().__init__()
        if rank < 1:
            raise AttentionError(f"factorized random needs rank >= 1, got {rank}")
        std = rank**-0.25  # so that entries of R1 R2^T have unit variance, like the unfactorized R
        self.R1 = nn.Parameter(torch.randn(num_heads, l_max, rank) * std)
        self.R2 = nn.Parameter(torch.randn(num_heads, l_max, rank) * std)

    def logits(self, x, *, offset, key_len, cache, pad):
        n = x.shape[1]
        r = self.R1[:, offset:offset + n] @ self.R2[:, :key_len].transpose(1, 2)
        return r[None].to(x.dtype)


class DotProductLogits(SynthComponent):
    """Q K^T / sqrt(d_h), the dot-product term of a mixture; caches its keys under ``"k"``."""

    def __init__(self, d_model, num_heads, *, bias) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, d_model // num_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)

    def _split(self, t):
        b, n, _ = t.shape
        return t.view(b, n, self.num_heads, self.head_dim).transpose(1, 2)

    def logits(self, x, *, offset, key_len, cache, pad):
        q, k = self._split(self.q_proj(x)), self._split(self.k_proj(x))
        if cache is not None:
            k = append_to_cache(cache, "k", k, dim=2)
        return (q @ k.transpose(-1, -2)) * self.head_dim**-0.5


def build_component(name: str, module: Attention, options) -> SynthComponent:
    check_option("synthesizer component", name, COMPONENTS, AttentionError)
    d, h, l_max = module.d_model, module.num_heads, module.max_len
    bias = getattr(options, "bias", True)
    if name == "dense":
        return DenseLogits(
            d, h, l_max, fn=getattr(options, "synthesizer_fn", "dense"),
            bottleneck_dim=getattr(options, "bottleneck_dim", None), causal=module.causal, bias=bias,
        )
    if name == "factorized_dense":
        return FactorizedDenseLogits(
            d, h, l_max, factor_a=getattr(options, "factor_a", None),
            factor_b=getattr(options, "factor_b", None), bias=bias,
        )
    if name == "random":
        return RandomLogits(h, l_max, trainable=True)
    if name == "fixed_random":
        return RandomLogits(h, l_max, trainable=False, seed=getattr(options, "seed", None))
    if name == "factorized_random":
        return FactorizedRandomLogits(h, l_max, rank=getattr(options, "rank", 8))
    if name == "vanilla":
        return DotProductLogits(d, h, bias=bias)
    raise AssertionError(f"component {name!r} is listed in COMPONENTS but not built here")


class SynthesizerAttention(Attention):
    """Synthesized attention: softmax(mask(sum_c w_c B_c)) V (Tay et al. 2020, eq. 1-9).

    Design decisions 1-9 (docs/design_decisions.md#synthesizer): slicing to the actual lengths, masking the
    mixed logits, decoding rows, self-attention only, no Q/K projections, the factorized forms, convex mixture
    weights and Table 7's functions.
    """

    capabilities = Capabilities(causal=True, cross=False, incremental=True, bounded_length=True)
    component_names: ClassVar[tuple[str, ...]] = ()

    def __init__(self, d_model, num_heads, *, options, **kw) -> None:
        super().__init__(d_model, num_heads, **kw)
        names = self.component_names or tuple(getattr(options, "components", ()))
        if not names:
            raise AttentionError(
                f"{self.name}: a mixture needs at least one component among {', '.join(COMPONENTS)}"
            )
        unknown = [n for n in names if n not in COMPONENTS]
        if unknown or len(set(names)) != len(names):
            raise AttentionError(
                f"{self.name}: components must be distinct names among {', '.join(COMPONENTS)}, "
                f"got {list(names)}"
            )
        self.options = options
        self.components = nn.ModuleDict({n: build_component(n, self, options) for n in names})
        bias = getattr(options, "bias", True)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self._init_weights(names, getattr(options, "weights", None), getattr(options, "learn_weights", True))

    def bind_layer(self, layer_index: int, run_seed: int) -> None:
        """Each layer's fixed random R is its own draw (``FixedRandomLogits.draw_for_layer``)."""
        super().bind_layer(layer_index, run_seed)
        for name, component in self.components.items():
            draw = getattr(component, "draw_for_layer", None)
            if callable(draw):
                draw(f"layer{int(layer_index)}/{name}")

    def _init_weights(self, names, weights, learn: bool) -> None:
        self.mix_alpha = None
        if len(names) == 1:
            if weights is not None and list(weights) != [1.0]:
                raise AttentionError(f"{self.name}: a single component has weight 1; drop the weights option")
            return
        w = torch.full((len(names),), 1.0 / len(names)) if weights is None else torch.tensor(
            [float(x) for x in weights]
        )
        if w.numel() != len(names) or bool((w < 0).any()) or float(w.sum()) <= 0:
            raise AttentionError(
                f"{self.name}: weights must be {len(names)} non-negative numbers (one per component "
                f"{list(names)}), got {weights}"
            )
        w = w / w.sum()
        if learn:
            if bool((w == 0).any()):
                raise AttentionError(
                    f"{self.name}: learnable weights are softmax(alpha) and cannot start at 0; "
                    "use learn_weights=false for exact zeros"
                )
            self.mix_alpha = nn.Parameter(w.log())
        else:
            self.register_buffer("mix_weights", w, persistent=True)

    def mixture_weights(self) -> torch.Tensor | None:
        """Normalised component weights, or None for a single component."""
        if self.mix_alpha is not None:
            return torch.softmax(self.mix_alpha, dim=0)
        return getattr(self, "mix_weights", None)

    def forward(self, x: torch.Tensor, key_padding_mask=None, cache: Cache | None = None) -> torch.Tensor:
        b, n, _ = x.shape
        offset = 0
        if cache is not None:
            if not self.causal:
                raise AttentionError(f"{self.name}: incremental decoding needs a causal module (causal=true)")
            offset = int(cache.get("length", 0))
        total = offset + n
        self.check_length(total)
        v = self.split_heads(self.v_proj(x))
        pad_all = key_padding_mask
        if cache is not None:
            v = append_to_cache(cache, "v", v, dim=2)
            pad_all = append_padding(cache, key_padding_mask, offset, b, n, x.device)
        pad_new = None if key_padding_mask is None else key_padding_mask.bool()
        weights = self.mixture_weights()
        logits = None
        for i, comp in enumerate(self.components.values()):
            c = comp.logits(x, offset=offset, key_len=total, cache=cache, pad=pad_new)
            if weights is not None:
                c = c * weights[i].to(c.dtype)
            logits = c if logits is None else logits + c
        if cache is not None:
            cache["length"] = total
        allowed = build_allowed_mask(
            b, n, total, key_padding_mask=pad_all, causal=self.causal, query_offset=offset, device=x.device
        )
        logits = mask_logits(logits.expand(b, self.num_heads, n, total), allowed)
        probs = torch.softmax(logits, dim=-1)
        if self.capturing_weights and cache is None:
            emit_dense(self, probs, allowed, key_padding_mask)  # a mixture's weights: softmax of the mix
        probs = F.dropout(probs, p=self.dropout, training=self.training)
        return self.out_proj(self.merge_heads(probs @ v))

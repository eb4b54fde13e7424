"""Universal Transformer (Dehghani et al. 2019): one shared layer applied recurrently in depth.

Registers two recurrences (the stack contract is in ``recurrence.py``):

- ``ut``: the shared layer applied T = ``num_steps`` times; the coordinate embedding P^t (eq. 6-7)
  is added to the state before every step.
- ``ut_act``: per-position adaptive computation time with tensor2tensor's
  ``universal_transformer_act`` arithmetic, variables named as there: ``halting_probability``, ``remainders``
  (R), ``n_updates`` (N), ``still_running``, ``new_halted``, ``update_weights``.

Design decisions 10-16 (docs/design_decisions.md#universal-transformer; docs/universal_transformer.md explains
each option): the coordinate embedding, ACT's arithmetic and its two corrections to T2T, ``halted_state``, the
ponder loss, the shallow-halting trap, the loop exit (DDP, ``torch.compile``) and UT base's width.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from attnlab.models.blocks import DecoderLayer, EncoderLayer, LayerSpec, sinusoid_table
from attnlab.models.recurrence import register_recurrence

_TRANSITIONS = ("ffn", "sepconv")
_TIMESTEP_EMBEDDINGS = ("sinusoidal", "learned")
_HALTED_STATES = ("copy", "transform")
_HALTING_WEIGHT_INITS = ("default", "zeros")


def _check_choice(option: str, value: str, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise ValueError(f"model.recurrence.{option}={value!r}; valid: {', '.join(valid)}")


@dataclass
class _SharedLayerOptions:
    """Options of the shared layer common to ``ut`` and ``ut_act``."""

    transition: str = "ffn"  # ffn | sepconv (T2T transformer_ffn_type "fc" | "sepconv")
    timestep_embedding: str = "sinusoidal"  # sinusoidal (paper eq. 6-7) | learned (T2T default)
    sepconv_kernels: tuple[int, int] = (3, 5)  # T2T sepconv_relu_sepconv first/second kernel sizes

    def __post_init__(self) -> None:
        _check_choice("transition", self.transition, _TRANSITIONS)
        _check_choice("timestep_embedding", self.timestep_embedding, _TIMESTEP_EMBEDDINGS)
        kernels = tuple(int(k) for k in self.sepconv_kernels)
        if len(kernels) != 2 or min(kernels) < 1:
            raise ValueError(f"model.recurrence.sepconv_kernels={list(kernels)}; give two kernel sizes >= 1")
        self.sepconv_kernels = kernels


@dataclass
class UTOptions(_SharedLayerOptions):
    """``ut``: a fixed number of recurrent steps."""

    num_steps: int | None = None  # T; None: the model's encoder_layers / decoder_layers

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_steps is not None and self.num_steps < 1:
            raise ValueError(f"model.recurrence.num_steps={self.num_steps}; must be >= 1 (or null)")


@dataclass
class ACTOptions(_SharedLayerOptions):
    """``ut_act``: per-position adaptive computation time (T2T recurrence_type=act, act_type=basic)."""

    act_max_steps: int | None = None  # None: 2 x the model's encoder_layers / decoder_layers (T2T)
    act_epsilon: float = 0.01  # halting threshold is 1 - eps (T2T act_epsilon)
    act_loss_weight: float = 0.01  # ponder loss weight (T2T); paper ablations use 0 and 0.001
    halting_bias_init: float = 1.0  # T2T act_halting_bias_init; negative values avoid shallow halting
    # default: nn.Linear's initialisation of the halting unit's weight W (T2T: its dense layer's); zeros: W = 0, so
    # p = sigmoid(halting_bias_init) at every position at initialisation and the bias alone sets the starting depth
    # (with the default W, W s shifts the starting depth by seed: from 2 to 12 steps at one bias, probes/ut2)
    halting_weight_init: str = "default"
    # The halting unit (W, b) gets no update during the first N optimizer updates (its gradients are dropped, so
    # neither Adam nor weight decay moves it): the shared layer learns to use the starting depth before halting may
    # move it. Ours (probes/ut2): without it, a 6-step start collapsed to 1 step within the first updates, before
    # anything beyond one hop was learned, and never came back (a halted step gets no gradient to become useful).
    halting_hold_updates: int = 0
    halted_state: str = "copy"  # copy (paper) | transform (T2T)

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_choice("halted_state", self.halted_state, _HALTED_STATES)
        _check_choice("halting_weight_init", self.halting_weight_init, _HALTING_WEIGHT_INITS)
        if self.act_max_steps is not None and self.act_max_steps < 1:
            raise ValueError(f"model.recurrence.act_max_steps={self.act_max_steps}; must be >= 1 (or null)")
        if not 0.0 <= self.act_epsilon <= 1.0:
            raise ValueError(f"model.recurrence.act_epsilon={self.act_epsilon}; must lie in [0, 1]")
        if self.act_loss_weight < 0:
            raise ValueError(f"model.recurrence.act_loss_weight={self.act_loss_weight}; must be >= 0")
        if self.halting_hold_updates < 0:
            raise ValueError(
                f"model.recurrence.halting_hold_updates={self.halting_hold_updates}; must be >= 0 (0: no hold)"
            )


class CoordinateEmbedding(nn.Module):
    """P^t_i = position signal(i) + timestep signal(t), added to the state before step t (eq. 6-7)."""

    def __init__(self, d_model: int, num_steps: int, timestep_embedding: str) -> None:
        super().__init__()
        self.d_model = d_model
        self.learned = timestep_embedding == "learned"
        if self.learned:
            # T2T add_layer_timing_signal_learned_1d: N(0, d^-1/2) variable multiplied by sqrt(d).
            self.timestep_weight = nn.Parameter(torch.randn(num_steps, d_model) * d_model**-0.5)
        else:
            # Steps count from 1 as in eq. 6-7.
            self.register_buffer(
                "timestep_table", sinusoid_table(num_steps, d_model, offset=1), persistent=False
            )

    # Set by the network during training when model.random_position_offset > 0 (UT paper Sec. 3.3).
    position_shift = 0

    def positions(self, length: int, offset: int, like: torch.Tensor) -> torch.Tensor:
        """Position signal of absolute positions offset..offset+length-1, (length, d_model)."""
        start = offset + self.position_shift
        return sinusoid_table(length, self.d_model, offset=start).to(device=like.device, dtype=like.dtype)

    def timestep(self, t: int) -> torch.Tensor:
        """Timestep signal of step t (1-based), (d_model,)."""
        if self.learned:
            return self.timestep_weight[t - 1] * math.sqrt(self.d_model)
        return self.timestep_table[t - 1]


class SepConvTransition(nn.Module):
    """Depthwise-separable convolution transition (T2T ``sepconv_relu_sepconv``).

    sepconv(k1, d -> d_ff) -> activation -> dropout -> sepconv(k2, d_ff -> d); a separable
    convolution is a depthwise convolution followed by a pointwise projection with bias. Padding
    positions are zeroed before each convolution so they leak nothing into real positions. Causal
    (decoder) stacks pad on the left only and keep the last k - 1 inputs of each convolution in
    ``cache`` for incremental decoding; encoders pad both sides ("SAME").
    """

    uses_cache = True  # DecoderLayer passes its per-call cache to transitions that declare this

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        kernels: tuple[int, int],
        activation: str,
        dropout: float,
        *,
        causal: bool,
    ) -> None:
        super().__init__()
        self.kernels = kernels
        self.causal = causal
        self.depthwise1 = nn.Conv1d(d_model, d_model, kernels[0], groups=d_model, bias=False)
        self.pointwise1 = nn.Linear(d_model, d_ff)
        self.depthwise2 = nn.Conv1d(d_ff, d_ff, kernels[1], groups=d_ff, bias=False)
        self.pointwise2 = nn.Linear(d_ff, d_model)
        self.act = {"relu": F.relu, "gelu": F.gelu}[activation]
        self.dropout = nn.Dropout(dropout)

    def _depthwise(
        self, x, conv: nn.Conv1d, k: int, padding_mask, cache: dict | None, key: str
    ) -> torch.Tensor:
        if padding_mask is not None:
            x = x.masked_fill(padding_mask.unsqueeze(-1), 0.0)
        if self.causal and cache is not None:
            previous = cache.get(key)
            if previous is None:
                previous = x.new_zeros(x.shape[0], k - 1, x.shape[2])  # = the left zero padding
            x = torch.cat([previous, x], dim=1)
            cache[key] = x[:, x.shape[1] - (k - 1) :]
            left = right = 0
        elif self.causal:
            left, right = k - 1, 0
        else:
            left = (k - 1) // 2
            right = k - 1 - left
        return conv(F.pad(x.transpose(1, 2), (left, right))).transpose(1, 2)

    def forward(
        self, x: torch.Tensor, padding_mask: torch.Tensor | None = None, cache: dict | None = None
    ) -> torch.Tensor:
        h = self.pointwise1(
            self._depthwise(x, self.depthwise1, self.kernels[0], padding_mask, cache, "conv1")
        )
        h = self.dropout(self.act(h))
        return self.pointwise2(
            self._depthwise(h, self.depthwise2, self.kernels[1], padding_mask, cache, "conv2")
        )


def _transition(spec: LayerSpec, options: _SharedLayerOptions, *, causal: bool) -> nn.Module | None:
    if options.transition == "ffn":
        return None  # the layer builds its own position-wise feed-forward
    return SepConvTransition(
        spec.d_model,
        spec.d_ff,
        options.sepconv_kernels,
        spec.activation,
        spec.activation_dropout,
        causal=causal,
    )


class ACTState(NamedTuple):
    """Per-position ACT accumulators, each (batch, length)."""

    halting_probability: torch.Tensor  # sum of p so far (then + R at the halting step)
    remainders: torch.Tensor  # R
    n_updates: torch.Tensor  # N: steps taken, the halting step included
    halted: torch.Tensor  # bool; padding starts halted


def act_halting_step(p: torch.Tensor, state: ACTState, threshold: float, *, force_halt: bool):
    """One step of T2T ``universal_transformer_act`` halting arithmetic.

    Returns (new state, update_weights, running) where ``running`` marks the positions that take
    this step and ``update_weights`` (0 for halted positions) weighs this step's transformed state.
    ``force_halt`` (the last allowed step) halts every running position with its remainder.
    """
    running = ~state.halted
    still_running = running.to(p.dtype)
    halting_probability = state.halting_probability
    if force_halt:
        new_halted = still_running
        still_running = torch.zeros_like(still_running)
    else:
        reached = halting_probability + p * still_running
        new_halted = (reached > threshold).to(p.dtype) * still_running
        still_running = (reached <= threshold).to(p.dtype) * still_running
    halting_probability = halting_probability + p * still_running
    remainders = state.remainders + new_halted * (1.0 - halting_probability)
    halting_probability = halting_probability + new_halted * remainders
    n_updates = state.n_updates + still_running + new_halted
    update_weights = p * still_running + new_halted * remainders
    halted = state.halted | new_halted.bool()
    return ACTState(halting_probability, remainders, n_updates, halted), update_weights, running


class _UniversalStack(nn.Module):
    """The shared layer, the coordinate embedding and the final norm of every UT stack."""

    adds_positions = True

    def __init__(
        self, spec: LayerSpec, layer: nn.Module, num_steps: int, options: _SharedLayerOptions
    ) -> None:
        super().__init__()
        self.layer = layer
        self.num_steps = num_steps
        self.options = options
        self.coordinates = CoordinateEmbedding(spec.d_model, num_steps, options.timestep_embedding)
        self.final_norm = nn.LayerNorm(spec.d_model) if spec.norm_first else nn.Identity()

    def _fixed(
        self, x: torch.Tensor, step: Callable[[int, torch.Tensor], torch.Tensor], offset: int
    ) -> torch.Tensor:
        """h^t = layer(h^{t-1} + P^t) for t = 1..T."""
        positions = self.coordinates.positions(x.shape[1], offset, x)
        state = x
        for t in range(1, self.num_steps + 1):
            state = step(t, state + positions + self.coordinates.timestep(t))
        return self.final_norm(state)


class _ACTStack(_UniversalStack):
    """Adaptive computation time over the shared layer.

    Design decisions 11-15, docs/design_decisions.md#universal-transformer."""

    def __init__(self, spec: LayerSpec, layer: nn.Module, num_layers: int, options: ACTOptions) -> None:
        max_steps = options.act_max_steps or 2 * num_layers
        super().__init__(spec, layer, max_steps, options)
        self.threshold = 1.0 - options.act_epsilon
        self.copy_halted = options.halted_state == "copy"
        # p = sigmoid(W s + b) per position (T2T "sigmoid_activation_for_pondering").
        self.halting_unit = nn.Linear(spec.d_model, 1)
        nn.init.constant_(self.halting_unit.bias, options.halting_bias_init)
        if options.halting_weight_init == "zeros":
            nn.init.zeros_(self.halting_unit.weight)
        self.halting_hold_updates = options.halting_hold_updates

    def held_parameters(self, update: int) -> list[nn.Parameter]:
        """The parameters that must not change at optimizer update ``update`` (0-based): the halting unit's while
        ``update < halting_hold_updates`` (the training module drops their gradients), else none."""
        return list(self.halting_unit.parameters()) if update < self.halting_hold_updates else []

    def _any_running(self, halted: torch.Tensor) -> bool:
        running = (~halted).any()
        if self.training and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            # Same number of steps on every rank: identical graphs for DDP, no rank waits at a
            # collective the others skipped. Eval is not synced: generation may run on one rank.
            flag = running.to(torch.int32)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            running = flag > 0
        return bool(running)

    def _act(
        self,
        x: torch.Tensor,
        real: torch.Tensor,
        step: Callable[[int, torch.Tensor], torch.Tensor],
        offset: int,
    ) -> tuple[torch.Tensor, torch.Tensor, ACTState]:
        """Returns (ACT output, recurrent state after the last step, ACT accumulators)."""
        # Bookkeeping in float32 whatever the compute dtype: bf16's spacing near 1 (2^-8) is comparable to
        # the 1 - eps threshold's margin (eps = 0.01), so rounded p or sums would change who halts when.
        zeros = x.new_zeros(x.shape[:2], dtype=torch.float32)
        act = ACTState(zeros, zeros, zeros, ~real)
        positions = self.coordinates.positions(x.shape[1], offset, x)
        state = x  # s^{t-1}: what the layer transforms at step t
        output = torch.zeros_like(x, dtype=torch.float32)  # T2T starts its weighted state at zeros
        for t in range(1, self.num_steps + 1):
            # Step 1 always runs so every parameter joins the graph, even for an all-padding batch.
            if t > 1 and not self._any_running(act.halted):
                break
            state_in = state + positions + self.coordinates.timestep(t)
            p = self._halting_probability(state_in)
            act, update_weights, running = act_halting_step(
                p, act, self.threshold, force_halt=t == self.num_steps
            )
            transformed = step(t, state_in)
            w = update_weights.unsqueeze(-1)
            output = transformed.float() * w + output * (1.0 - w)
            if self.copy_halted:
                state = torch.where(running.unsqueeze(-1), transformed, state)
            else:
                state = transformed
        return output.to(x.dtype), state, act

    def _halting_probability(self, state_in: torch.Tensor) -> torch.Tensor:
        """p = sigmoid(W s + b) per position, in float32 even under autocast or bf16 weights."""
        with torch.autocast(device_type=state_in.device.type, enabled=False):
            unit = self.halting_unit
            bias = None if unit.bias is None else unit.bias.float()
            return torch.sigmoid(F.linear(state_in.float(), unit.weight.float(), bias)).squeeze(-1)

    def _aux(self, act: ACTState, real: torch.Tensor, stack: str) -> dict[str, torch.Tensor]:
        # Stack-prefixed step statistics: the network sums "log/*" of encoder and decoder, which
        # is right for the ponder cost (it matches the summed loss) but not for step counts.
        mask = real.to(act.n_updates.dtype)
        count = mask.sum().clamp_min(1.0)
        ponder_cost = ((act.n_updates + act.remainders) * mask).sum() / count  # R carries the gradient
        steps = act.n_updates.detach()
        return {
            "loss/ponder": self.options.act_loss_weight * ponder_cost,
            "log/ponder_cost": ponder_cost.detach(),
            f"log/{stack}_mean_steps": (steps * mask).sum() / count,
            f"log/{stack}_max_steps": steps.max(),  # padding has N = 0
            "steps": steps,
        }


def _not_padding(x: torch.Tensor, padding_mask: torch.Tensor | None) -> torch.Tensor:
    if padding_mask is None:
        return torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
    return ~padding_mask.bool()


def _encoder_layer(spec: LayerSpec, options: _SharedLayerOptions) -> EncoderLayer:
    transition = _transition(spec, options, causal=False)
    return spec.encoder_layer() if transition is None else EncoderLayer(spec, transition=transition)


def _decoder_layer(spec: LayerSpec, options: _SharedLayerOptions, cross: bool) -> DecoderLayer:
    transition = _transition(spec, options, causal=True)
    return (
        spec.decoder_layer(cross=cross)
        if transition is None
        else DecoderLayer(spec, cross=cross, transition=transition)
    )


class UniversalEncoder(_UniversalStack):
    """``ut`` encoder: T applications of one shared encoder layer."""

    def __init__(self, spec: LayerSpec, num_layers: int, options: UTOptions) -> None:
        super().__init__(spec, _encoder_layer(spec, options), options.num_steps or num_layers, options)

    def forward(self, x: torch.Tensor, padding_mask: torch.Tensor | None = None):
        return self._fixed(x, lambda t, s: self.layer(s, padding_mask), offset=0), {}


class UniversalDecoder(_UniversalStack):
    """``ut`` decoder: T applications of one shared decoder layer, one cache per step."""

    def __init__(self, spec: LayerSpec, num_layers: int, options: UTOptions, *, cross: bool) -> None:
        super().__init__(spec, _decoder_layer(spec, options, cross), options.num_steps or num_layers, options)

    def forward(self, x, memory=None, memory_padding_mask=None, padding_mask=None, cache=None):
        offset = int(cache.get("length", 0)) if cache is not None else 0
        step_caches = cache.setdefault("steps", {}) if cache is not None else None

        def step(t: int, state_in: torch.Tensor) -> torch.Tensor:
            step_cache = step_caches.setdefault(t, {}) if step_caches is not None else None
            return self.layer(state_in, memory, memory_padding_mask, padding_mask, cache=step_cache)

        return self._fixed(x, step, offset), {}


class ACTUniversalEncoder(_ACTStack):
    """``ut_act`` encoder."""

    def __init__(self, spec: LayerSpec, num_layers: int, options: ACTOptions) -> None:
        super().__init__(spec, _encoder_layer(spec, options), num_layers, options)

    def forward(self, x: torch.Tensor, padding_mask: torch.Tensor | None = None):
        real = _not_padding(x, padding_mask)
        output, _, act = self._act(x, real, lambda t, s: self.layer(s, padding_mask), offset=0)
        return self.final_norm(output), self._aux(act, real, "encoder")


class ACTUniversalDecoder(_ACTStack):
    """``ut_act`` decoder (encoder-decoder or decoder-only LM).

    Incremental decoding keeps, besides one layer cache per step (``cache["steps"][t]``), each
    earlier position's recurrent state (``cache["state"]``) and how many positions each step's cache
    holds (``cache["filled"][t]``). A new token may need more steps than earlier tokens took; at
    such a step the earlier positions are first run from their carried state (copied, or still
    being transformed under ``halted_state=transform``) so that they supply keys and values at that
    step exactly as in the full forward, where every position is computed at every step.
    """

    def __init__(self, spec: LayerSpec, num_layers: int, options: ACTOptions, *, cross: bool) -> None:
        super().__init__(spec, _decoder_layer(spec, options, cross), num_layers, options)

    def forward(self, x, memory=None, memory_padding_mask=None, padding_mask=None, cache=None):
        real = _not_padding(x, padding_mask)
        if cache is None:

            def step(t: int, state_in: torch.Tensor) -> torch.Tensor:
                return self.layer(state_in, memory, memory_padding_mask, padding_mask)

            output, _, act = self._act(x, real, step, offset=0)
            return self.final_norm(output), self._aux(act, real, "decoder")

        offset = int(cache.get("length", 0))
        step_caches = cache.setdefault("steps", {})
        filled = cache.setdefault("filled", {})
        past = cache.get("state")  # (batch, offset, d): earlier positions' state after their last step

        def step(t: int, state_in: torch.Tensor) -> torch.Tensor:
            nonlocal past
            step_cache = step_caches.setdefault(t, {})
            start = filled.get(t, 0)
            lag = offset - start
            pad = padding_mask
            if lag > 0:
                # Positions start..offset-1 stopped before step t; their state is the one after step t-1.
                lagging = past[:, start:offset]
                lagging = (
                    lagging + self.coordinates.positions(lag, start, lagging) + self.coordinates.timestep(t)
                )
                state_in = torch.cat([lagging, state_in], dim=1)
                if pad is not None:
                    pad = torch.cat([pad.new_zeros(pad.shape[0], lag), pad], dim=1)
            out = self.layer(state_in, memory, memory_padding_mask, pad, cache=step_cache)
            filled[t] = offset + x.shape[1]
            if lag > 0:
                if not self.copy_halted:
                    past = torch.cat([past[:, :start], out[:, :lag]], dim=1)
                out = out[:, lag:]
            return out

        output, state, act = self._act(x, real, step, offset)
        cache["state"] = state if past is None else torch.cat([past, state], dim=1)
        return self.final_norm(output), self._aux(act, real, "decoder")


register_recurrence("ut", options=UTOptions, encoder=UniversalEncoder, decoder=UniversalDecoder)
register_recurrence("ut_act", options=ACTOptions, encoder=ACTUniversalEncoder, decoder=ACTUniversalDecoder,
                    emits_ponder_steps=True)

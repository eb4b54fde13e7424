"""BigBird block-sparse attention (Zaheer et al. 2020; the sparse-attention patent), with a causal form."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.attention._cache import append_padding, append_to_cache
from attnlab.attention.base import Attention, AttentionError, Cache, Capabilities
from attnlab.attention.capture import AttentionWeights, WeightPart, emit_dense
from attnlab.attention.kernels.blocksparse_blocked import blocked_blocksparse_attention
from attnlab.attention.kernels.blocksparse_flex import flex_available, flex_blocksparse_attention, flex_bucket
from attnlab.attention.kernels.blocksparse_reference import (
    BlockSparsePlan,
    GatheredWeights,
    apply_gathered,
    attend_gathered,
    blocksparse_attention,
    blocksparse_attention_at,
    gathered_probs,
)
from attnlab.attention.kernels.blocksparse_triton import (
    lengths_from_padding,
    shape_unsupported,
    triton_blocksparse_attention,
    triton_unavailable,
)
from attnlab.attention.masks import build_allowed_mask
from attnlab.attention.registry import register_attention

log = logging.getLogger(__name__)


@dataclass
class BigBirdOptions:
    block_size: int = 64
    window_blocks: int = 3
    num_global_blocks: int = 2
    num_random_blocks: int = 3
    seed: int | None = None
    share_plan_across_heads: bool = False
    share_plan_across_layers: bool = False
    resample: str = "never"
    dense_fallback_len: int | None = None
    bias: bool = True
    impl: str = "auto"


IMPLS = ("auto", "reference", "blocked", "flex", "triton")

# Devices where impl=auto considers our Triton kernel, then FlexAttention (on CPU the blocked kernel is faster,
# and has a backward).
TRITON_AUTO_DEVICES = ("cuda",)
FLEX_AUTO_DEVICES = ("cuda",)
# {shape: the kernel passed its self-test} for impl=auto (BigBirdAttention.kernel_for), per process.
TRITON_SELF_TESTS: dict[tuple, bool] = {}
FLEX_SELF_TESTS: dict[tuple, bool] = {}
# Largest difference to the fp32 reference a self-test accepts, by input dtype (bf16 keeps 8 mantissa bits).
FLEX_TOLERANCE = {torch.float32: 2e-3, torch.float16: 1e-2, torch.bfloat16: 5e-2}


def _triton_with_mask(q, k, v, plan, *, key_padding_mask=None, scale=None):
    """The Triton kernel behind the reference's signature (a suffix padding mask becomes lengths)."""
    b, _, length, _ = q.shape
    lengths = lengths_from_padding(key_padding_mask, b, length, q.device)
    return triton_blocksparse_attention(q, k, v, plan, lengths=lengths, scale=scale)


def flex_self_test(plan: BlockSparsePlan, *, heads: int, head_dim: int, dtype: torch.dtype, padded: bool,
                   need_grad: bool) -> str | None:
    """``kernel_self_test`` of FlexAttention."""
    return kernel_self_test(flex_blocksparse_attention, plan, heads=heads, head_dim=head_dim, dtype=dtype,
                            padded=padded, need_grad=need_grad)


def triton_self_test(plan: BlockSparsePlan, *, heads: int, head_dim: int, dtype: torch.dtype, padded: bool,
                     need_grad: bool) -> str | None:
    """``kernel_self_test`` of our Triton kernel."""
    return kernel_self_test(_triton_with_mask, plan, heads=heads, head_dim=head_dim, dtype=dtype, padded=padded,
                            need_grad=need_grad)


def kernel_self_test(kernel, plan: BlockSparsePlan, *, heads: int, head_dim: int, dtype: torch.dtype,
                     padded: bool, need_grad: bool) -> str | None:
    """Run ``kernel`` (the reference's signature) once on random inputs of one sequence at ``plan``'s length
    (with a padding mask when ``padded``), forward and, with ``need_grad``, backward, and compare with the
    reference kernel in fp32. None when it compiled and agreed; else why not, in one line. Any exception is an
    answer here: a kernel that fails to compile (Inductor finding no valid tile for the block size, a backward
    that does not exist, a Triton compile error) must make ``impl=auto`` fall back, never crash the run inside
    ``loss.backward()``."""
    device = plan.key_blocks.device
    length = plan.num_blocks * plan.block_size
    generator = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(1, heads, length, head_dim, device=device, generator=generator) for _ in range(3))
    pad = None
    if padded:
        pad = torch.zeros(1, length, dtype=torch.bool, device=device)
        pad[:, length - max(1, plan.block_size // 2):] = True
    grad_out = torch.randn(1, heads, length, head_dim, device=device, generator=generator)
    real = slice(None) if pad is None else ~pad[0]
    if pad is not None:
        grad_out[:, :, ~real] = 0  # padded query rows are outside both kernels' contract (module doc)

    def attend(fn, cast):
        inputs = [t.to(cast).requires_grad_(need_grad) for t in (q, k, v)]
        with torch.autocast(device.type, enabled=False), torch.set_grad_enabled(need_grad):
            out = fn(*inputs, plan, key_padding_mask=pad)
            grads = torch.autograd.grad(out, inputs, grad_out.to(cast)) if need_grad else ()
        return [out[:, :, real].detach().float(), *(g.float() for g in grads)]

    try:
        got = attend(kernel, dtype)
    except Exception as exc:  # noqa: BLE001 - whatever the compiler raises, the answer is "not this kernel"
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        return f"{exc.__class__.__name__}: {lines[0] if lines else ''}"[:300]
    expected = attend(blocksparse_attention, torch.float32)
    names = ("output", "dQ", "dK", "dV")
    for name, a, b in zip(names, got, expected):
        error = float((a - b).abs().max()) if a.numel() else 0.0
        if not error <= FLEX_TOLERANCE.get(dtype, 5e-2) * max(1.0, float(b.abs().max())):
            return f"{name} differs from the reference by {error:.3g}"
    return None


_ROW_CHUNK_SCORES = 1 << 22  # random scores drawn at once when drawing a plan (bounds the transient memory)


def global_blocks(num_blocks: int, num_global_blocks: int, causal: bool) -> torch.Tensor:
    """(num_blocks,) bool: the global blocks of a ``num_blocks`` frame. Bidirectional: the first ceil(g/2)
    and the last floor(g/2) (ITC "first and last" for g = 2); causal: the first g."""
    n, g = num_blocks, num_global_blocks
    i = torch.arange(n)
    if causal:
        return i < g
    return (i < g - g // 2) | (i >= n - g // 2)


def window_of(rows: torch.Tensor, num_blocks: int, window_blocks: int, causal: bool) -> torch.Tensor:
    """(len(rows), num_blocks) bool: the window of each query block. Bidirectional: centred, (w-1)/2 blocks
    each side (w = 0: none); causal: the own block and the w-1 previous ones."""
    j = torch.arange(num_blocks)[None, :]
    i = rows[:, None]
    if causal:
        return (j <= i) & (j > i - window_blocks)
    return (j - i).abs() <= (window_blocks - 1) // 2


def draw_random_blocks(
    num_blocks: int,
    *,
    heads: int,
    window_blocks: int,
    num_global_blocks: int,
    num_random_blocks: int,
    causal: bool,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """(heads, num_blocks, r) long: for every head and query block, r distinct key blocks drawn uniformly
    among the blocks not already in its window or global (causal: strictly earlier ones); -1 where a row
    has fewer than r candidates. O(heads * num_blocks * r) to keep; drawn in chunks of rows."""
    n, r = num_blocks, num_random_blocks
    out = torch.full((heads, n, r), -1, dtype=torch.long)
    if r == 0 or n == 0:
        return out
    is_global = global_blocks(n, num_global_blocks, causal)
    step = max(1, _ROW_CHUNK_SCORES // max(1, heads * n))
    for lo in range(0, n, step):
        rows = torch.arange(lo, min(n, lo + step))
        candidates = ~(window_of(rows, n, window_blocks, causal) | is_global[None, :])
        if causal:
            candidates &= torch.arange(n)[None, :] < rows[:, None]
        scores = torch.rand(heads, rows.numel(), n, generator=generator).masked_fill(~candidates, -1.0)
        top, idx = scores.topk(min(r, n), dim=-1)
        out[:, lo : lo + rows.numel(), : idx.shape[-1]] = torch.where(top >= 0, idx, -1)
    return out


def build_bigbird_plan(
    random_blocks: torch.Tensor,
    num_blocks: int,
    *,
    block_size: int,
    window_blocks: int,
    num_global_blocks: int,
    causal: bool,
) -> BlockSparsePlan:
    """The plan of the first ``num_blocks`` blocks of the frame ``random_blocks`` (P, n_max, r) was drawn for.

    The frame is the module's maximum length (n_max blocks): a shorter input uses the top-left corner of
    the n_max-block plan, keeping only key blocks below ``num_blocks``, so appending padding never changes
    what a real query attends (as the official code, which pads every input to the maximum length).
    Global blocks are those of the n_max frame (``global_blocks``): bidirectional trailing globals exist
    only for inputs reaching the end of the frame. Bidirectional global query blocks are dense rows; causal
    plans have no dense row (global query blocks see the past only, which their window and the leading
    globals cover).
    """
    ph, n_max, r = random_blocks.shape
    n, g, w = num_blocks, num_global_blocks, window_blocks
    if n > n_max:
        raise ValueError(f"{n} blocks exceed the {n_max} blocks the random plan was drawn for")
    is_global = global_blocks(n_max, g, causal)[:n]
    if causal:
        rows = torch.arange(n)
        dense_rows = torch.zeros(0, dtype=torch.long)
    else:
        rows = torch.nonzero(~is_global).flatten()
        dense_rows = torch.nonzero(is_global).flatten()
    # The fixed part of every row: global and window blocks (disjoint from the random ones by construction).
    fixed = window_of(rows, n, w, causal) | is_global[None, :]
    if causal:
        fixed &= torch.arange(n)[None, :] <= rows[:, None]
    rand = random_blocks[:, rows] if rows.numel() else random_blocks[:, :0]
    rand_ok = (rand >= 0) & (rand < n)
    fixed_count = fixed.sum(1)
    width = int(fixed_count.max()) if rows.numel() else 0
    fixed_idx = torch.sort((~fixed).to(torch.int8), dim=1, stable=True).indices[:, :width]
    fixed_ok = torch.arange(width)[None, :] < fixed_count[:, None]
    cand = torch.cat([fixed_idx.expand(ph, -1, -1), rand.clamp(min=0)], dim=2)
    ok = torch.cat([fixed_ok.expand(ph, -1, -1), rand_ok], dim=2)
    order = torch.sort((~ok).to(torch.int8), dim=2, stable=True).indices
    cand, ok = torch.gather(cand, 2, order), torch.gather(ok, 2, order)
    k = max(1, int(ok.sum(2).max())) if rows.numel() else 0
    cand, ok = cand[:, :, :k], ok[:, :, :k]
    return BlockSparsePlan(block_size, n, causal, rows, torch.where(ok, cand, 0), ok, dense_rows)


def plan_is_dense(plan: BlockSparsePlan) -> bool:
    """True when every query block of every head lists every key block it could see (all blocks;
    causal: every block up to its own): dense attention is then exactly the sparse result."""
    counts = plan.key_valid.sum(2)  # (P, R)
    full = plan.row_blocks + 1 if plan.causal else torch.full_like(plan.row_blocks, plan.num_blocks)
    return bool((counts == full[None]).all())


def bigbird_reference_allowed(plan: BlockSparsePlan, length: int) -> torch.Tensor:
    """(P, length, length) bool element mask per plan head equivalent to the plan (block mask, then the
    causal mask), cropped to ``length``; dense attention restricted to it must equal the block-sparse path."""
    bs = plan.block_size
    m = plan.block_mask().repeat_interleave(bs, 1).repeat_interleave(bs, 2)[:, :length, :length]
    if plan.causal:
        m = m & torch.ones(length, length, dtype=torch.bool, device=m.device).tril()
    return m


@register_attention(
    "bigbird", options=BigBirdOptions, summary="BigBird block-sparse attention (global + window + random)"
)
class BigBirdAttention(Attention):
    """BigBird: each query block sees global blocks, a window of w blocks and r random blocks.

    Design decisions 17-22 (docs/design_decisions.md#bigbird): defaults and per-head, per-layer random plans,
    the dense fallback, padding to blocks, causal BigBird, no attention dropout, and the three kernels (option
    ``impl``: reference, blocked, flex) over one plan; the same section lists Table 1's building blocks.
    Cross-attention is not block-sparse (``capabilities.cross=False``): it stays dot-product.
    """

    capabilities = Capabilities(causal=True, cross=False, incremental=True, bounded_length=True)

    def __init__(self, d_model, num_heads, *, options: BigBirdOptions, **kw) -> None:
        super().__init__(d_model, num_heads, **kw)
        o = options
        self.options = o
        if o.block_size < 1 or o.window_blocks < 0 or o.num_global_blocks < 0 or o.num_random_blocks < 0:
            raise AttentionError(
                "bigbird: block_size must be >= 1, window_blocks, num_global_blocks and num_random_blocks >= 0"
            )
        if o.window_blocks + o.num_global_blocks + o.num_random_blocks == 0:
            raise AttentionError("bigbird: a query block must see something: set window_blocks, "
                                 "num_global_blocks or num_random_blocks > 0")
        if self.causal and o.window_blocks < 1:
            raise AttentionError("bigbird: a causal module needs window_blocks >= 1 (each query sees its own "
                                 f"block), got {o.window_blocks}")
        if not self.causal and o.window_blocks % 2 == 0 and o.window_blocks != 0:
            raise AttentionError(
                f"bigbird: a bidirectional window is centred: window_blocks must be 0 or odd, "
                f"got {o.window_blocks}"
            )
        if o.resample not in ("never", "every_step"):
            raise AttentionError(f"bigbird: resample must be 'never' or 'every_step', got {o.resample!r}")
        if o.impl not in IMPLS:
            raise AttentionError(f"bigbird: impl must be one of {', '.join(IMPLS)}, got {o.impl!r}")
        self.block_size = o.block_size
        self.full_blocks = o.num_global_blocks + o.window_blocks + o.num_random_blocks
        exact_limit = self.full_blocks * o.block_size
        if self.causal and o.dense_fallback_len is not None and o.dense_fallback_len > exact_limit:
            raise AttentionError(
                f"bigbird: causal dense_fallback_len={o.dense_fallback_len} exceeds (g+w+r)*block="
                f"{exact_limit}, beyond which dense and sparse outputs differ"
            )
        bias = o.bias
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.max_blocks = -(-int(self.max_len) // o.block_size)
        self.plan_heads = 1 if o.share_plan_across_heads else num_heads
        self.layer_index = 0
        self.run_seed = torch.initial_seed()  # a module built alone; its network's bind_layer gives the run seed
        self.register_buffer("random_blocks", self._draw(self._plan_generator()), persistent=True)
        self._plans: dict = {}
        self._logged_fallback: set[int] = set()
        # The kernels that served this module's forward passes (not the passes that record weights or count
        # FLOPs): "triton", "flex", "blocked", "reference", "dense" (the fallback rule). The run record names
        # them (extra.attention_kernels).
        self.kernels_used: set[str] = set()
        self._logged_kernel_refusals: set[tuple[str, str]] = set()

    # -- plan ----------------------------------------------------------------------------------------
    def plan_seed(self) -> int:
        """The seed of this layer's random plan: (option ``seed`` or the run seed, layer index)."""
        base = self.run_seed if self.options.seed is None else int(self.options.seed)
        layer = 0 if self.options.share_plan_across_layers else self.layer_index
        return (base * 1_000_003 + layer) % (1 << 63)

    def _plan_generator(self) -> torch.Generator:
        return torch.Generator().manual_seed(self.plan_seed())

    def _draw(self, generator: torch.Generator | None) -> torch.Tensor:
        o = self.options
        return draw_random_blocks(
            self.max_blocks, heads=self.plan_heads, window_blocks=o.window_blocks,
            num_global_blocks=o.num_global_blocks, num_random_blocks=o.num_random_blocks, causal=self.causal,
            generator=generator,
        )

    def bind_layer(self, layer_index: int, run_seed: int) -> None:
        """Redraw the random plan for this layer of a run (called once, after the network is built)."""
        self.layer_index, self.run_seed = int(layer_index), int(run_seed)
        with torch.no_grad():
            self.random_blocks.copy_(self._draw(self._plan_generator()))

    def num_blocks(self, length: int) -> int:
        return -(-length // self.block_size)

    def plan_for_length(self, length: int, device=None) -> BlockSparsePlan:
        """The plan used for a sequence of ``length`` positions (padded to whole blocks)."""
        return self._plan_and_density(length, device)[0]

    def _plan_and_density(self, length: int, device=None) -> tuple[BlockSparsePlan, bool]:
        n = self.num_blocks(length)
        s = self.random_blocks
        device = s.device if device is None else device
        key = (n, str(device))
        version = (s._version, s.data_ptr())
        hit = self._plans.get(key)
        if hit is not None and hit[0] == version:
            return hit[1], hit[2]
        o = self.options
        plan = build_bigbird_plan(
            s.detach().cpu(), n, block_size=o.block_size, window_blocks=o.window_blocks,
            num_global_blocks=o.num_global_blocks, causal=self.causal,
        )
        dense = plan_is_dense(plan)
        plan = plan.to(device)
        if len(self._plans) > 64:
            self._plans.clear()
        self._plans[key] = (version, plan, dense)
        return plan, dense

    def allowed_pairs(self, length: int) -> torch.Tensor | None:
        """The pairs of the block plan at ``length`` (per head where each head has its own random blocks), or None
        where the fallback attends densely."""
        if self.uses_dense(length):
            return None
        with torch.no_grad():
            return bigbird_reference_allowed(self.plan_for_length(length, torch.device("cpu")), length)

    def uses_dense(self, length: int) -> bool:
        """The fallback rule, evaluated per call (never sticky)."""
        threshold = self.options.dense_fallback_len
        if threshold is None:
            return self._plan_and_density(length)[1]
        return length <= threshold

    # -- forward -------------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, key_padding_mask=None, cache: Cache | None = None) -> torch.Tensor:
        if cache is not None:
            return self._incremental(x, key_padding_mask, cache)
        b, length, _ = x.shape
        self.check_length(length)
        if self.training and self.options.resample == "every_step":
            with torch.no_grad():
                self.random_blocks.copy_(self._draw(None))
        q, k, v = (self.split_heads(p(x)) for p in (self.q_proj, self.k_proj, self.v_proj))
        scale = self.head_dim**-0.5
        if self.uses_dense(length):
            if length not in self._logged_fallback:
                self._logged_fallback.add(length)
                log.info("bigbird: length %d (%d blocks) uses dense attention (fallback rule)",
                         length, self.num_blocks(length))
            allowed = build_allowed_mask(
                b, length, length, key_padding_mask=key_padding_mask, causal=self.causal, device=x.device
            )
            if allowed is None:
                allowed = torch.ones(1, 1, 1, 1, 1, dtype=torch.bool, device=x.device)
            else:
                allowed = allowed[:, :, None]
            if self.capturing_weights:
                probs = gathered_probs(q[:, :, None], k[:, :, None], allowed, scale)
                emit_dense(self, probs[:, :, 0], allowed[:, :, 0], key_padding_mask, note="dense fallback")
                out = apply_gathered(probs, v[:, :, None])
            else:
                out = attend_gathered(q[:, :, None], k[:, :, None], v[:, :, None], allowed, scale)
                if not self.counting_flops:
                    self.kernels_used.add("dense")
            return self.out_proj(self.merge_heads(out[:, :, 0]))
        need_grad = torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in self.parameters()))
        # Recording weights needs the plain-tensor reference; so does counting FLOPs, except through the Triton
        # kernel, whose custom op carries its own FLOP formula (only impl auto or triton can pick it).
        may_count_through_triton = self.counting_flops and self.options.impl in ("auto", "triton")
        kernel = "reference"
        if not self.capturing_weights and (not self.counting_flops or may_count_through_triton):
            kernel = self.kernel_for(x.device, need_grad, dtype=q.dtype, length=length,
                                     padded=key_padding_mask is not None)
        if self.counting_flops and kernel != "triton":
            kernel = "reference"
        if kernel == "flex":
            # Pad to a bucket of lengths so the compiled kernel sees few shapes; exact, since the plan of a
            # longer padding is the same plan restricted further (decision 19).
            blocks = flex_bucket(self.num_blocks(length), self.max_blocks)
        else:
            blocks = self.num_blocks(length)
        padded = blocks * self.block_size
        extra = padded - length
        pad = key_padding_mask.bool() if key_padding_mask is not None else None
        if extra:
            q, k, v = (F.pad(t, (0, 0, 0, extra)) for t in (q, k, v))
            if pad is None:
                pad = torch.zeros(b, length, dtype=torch.bool, device=x.device)
            pad = F.pad(pad, (0, extra), value=True)
        plan = self.plan_for_length(padded, x.device)
        lengths = None
        if kernel == "triton":
            lengths = lengths_from_padding(pad, b, padded, x.device)
            if lengths is None:
                kernel = self._non_suffix_padding(x.device)
        if not (self.capturing_weights or self.counting_flops):
            self.kernels_used.add(kernel)
        if self.capturing_weights:
            out = self._sparse_recorded(q, k, v, plan, pad, scale, length)
        elif kernel == "triton":
            out = triton_blocksparse_attention(q, k, v, plan, lengths=lengths, scale=scale)
        elif kernel == "flex":
            out = flex_blocksparse_attention(q, k, v, plan, key_padding_mask=pad, scale=scale)
        else:
            fn = blocked_blocksparse_attention if kernel == "blocked" else blocksparse_attention
            out = fn(q, k, v, plan, key_padding_mask=pad, scale=scale)
        return self.out_proj(self.merge_heads(out[:, :, :length]))

    def check_device(self, device: torch.device) -> None:
        """impl=flex or impl=triton where that kernel cannot run (flex with backward: training) is refused;
        impl=auto is decided at the run's shapes (``kernel_for``)."""
        if self.options.impl != "auto":
            self.kernel_for(device, True)

    def kernel_for(self, device: torch.device, need_grad: bool, *, dtype: torch.dtype | None = None,
                   length: int | None = None, padded: bool = True) -> str:
        """The sparse kernel a forward on ``device`` uses (option ``impl``, ``auto`` resolved).

        ``auto`` on CUDA tries, in order, our Triton kernel, FlexAttention, then the blocked kernel: each of the
        first two only where it can run there and a one-time self-test at this call's shape (length bucket,
        heads, head size, dtype, with or without a padding mask, forward and, when training, backward) ran
        and matched the reference. Off CUDA: the blocked kernel. The choice is logged once per shape, and each
        kernel passed over once, with its reason."""
        impl = self.options.impl
        if impl == "auto":
            length = length or self.max_len
            dtype = dtype or torch.get_default_dtype()
            if device.type in TRITON_AUTO_DEVICES:
                refused = triton_unavailable(device) or shape_unsupported(self.block_size, self.head_dim)
                if refused is None:
                    blocks = self.num_blocks(length)
                    padded = padded or blocks * self.block_size != length
                    shape = ("triton", device, dtype, blocks, self.num_heads, self.head_dim, self.causal, padded,
                             need_grad)
                    if self._self_test_passes(shape, TRITON_SELF_TESTS, triton_self_test):
                        return "triton"
                else:
                    self._refuse_once("triton", device, refused)
            if device.type not in FLEX_AUTO_DEVICES or not flex_available(device, need_grad):
                return "blocked"
            blocks = flex_bucket(self.num_blocks(length), self.max_blocks)
            padded = padded or blocks * self.block_size != length  # the forward masks the padding it adds
            shape = (device, dtype, blocks, self.num_heads, self.head_dim, self.causal, padded, need_grad)
            return "flex" if self._flex_passes(shape) else "blocked"
        if impl == "flex" and not flex_available(device, need_grad):
            raise AttentionError(
                f"bigbird: impl=flex cannot serve this call on {device.type} (FlexAttention has no "
                f"{'backward' if need_grad else 'kernel'} there in torch {torch.__version__}); use impl=auto"
            )
        if impl == "triton":
            refused = triton_unavailable(device) or shape_unsupported(self.block_size, self.head_dim)
            if refused is not None:
                raise AttentionError(f"bigbird: impl=triton cannot serve this module: {refused}; use impl=auto")
        return impl

    def _refuse_once(self, kernel: str, device: torch.device, reason: str) -> None:
        if (kernel, str(device)) not in self._logged_kernel_refusals:
            self._logged_kernel_refusals.add((kernel, str(device)))
            log.warning("bigbird: impl=auto does not use the %s kernel on %s: %s", kernel, device, reason)

    def _non_suffix_padding(self, device: torch.device) -> str:
        """The kernel for a call the Triton kernel cannot express (padding before a real key): blocked."""
        self._refuse_once("triton", device, "a key padding mask with padding before a real key (the kernel "
                          "takes per-sequence lengths); such calls use the blocked kernel")
        return "blocked"

    def _self_test_passes(self, shape: tuple, verdicts: dict, self_test) -> bool:
        """Whether the kernel named ``shape[0]`` serves ``shape``: ``self_test``'s verdict, run once per shape and
        process (kept in ``verdicts``), logged with its reason."""
        if shape not in verdicts:
            name, device, dtype, blocks, heads, head_dim, causal, padded, need_grad = shape
            plan = self.plan_for_length(blocks * self.block_size, device)
            failure = self_test(plan, heads=heads, head_dim=head_dim, dtype=dtype, padded=padded,
                                need_grad=need_grad)
            verdicts[shape] = failure is None
            dtype_name = str(dtype).removeprefix("torch.")
            what = (f"{blocks * self.block_size} tokens, {heads} heads of {head_dim}, {dtype_name}, "
                    f"{'causal' if causal else 'bidirectional'}{', padded' if padded else ''}, "
                    f"{'forward + backward' if need_grad else 'forward'}")
            if failure is None:
                log.info("bigbird: impl=auto uses the %s kernel on %s (%s: self-test passed)", name, device, what)
            else:
                log.warning("bigbird: impl=auto passes over the %s kernel on %s (%s): self-test failed: %s",
                            name, device, what, failure)
        return verdicts[shape]

    def _flex_passes(self, shape: tuple) -> bool:
        """Whether FlexAttention serves ``shape`` (``kernel_for``): the self-test's verdict, run once per
        shape and process (``FLEX_SELF_TESTS``)."""
        if shape not in FLEX_SELF_TESTS:
            verdicts: dict = {}
            self._self_test_passes(("FlexAttention", *shape), verdicts, flex_self_test)
            FLEX_SELF_TESTS[shape] = next(iter(verdicts.values()))
        return FLEX_SELF_TESTS[shape]

    def _sparse_recorded(self, q, k, v, plan, pad, scale, length):
        """The reference kernel, keeping the per-block softmax weights it computes (recording only).

        The record holds the weights of each query block over the union of its heads' key blocks (and
        the dense rows of global query blocks) as they were computed: no L x L matrix is formed here, and
        keys outside a head's plan are absent or carry weight 0. ``AttentionWeights.dense()`` scatters them
        on request.
        """
        gathered: list[GatheredWeights] = []
        out = blocksparse_attention(q, k, v, plan, key_padding_mask=pad, scale=scale, weights=gathered)
        b, padded = q.shape[0], q.shape[2]
        real = torch.ones(b, padded, dtype=torch.bool, device=q.device) if pad is None else ~pad
        parts = [
            WeightPart(probs=w.probs.detach().float(), allowed=w.allowed, real_queries=real[:, w.query_index],
                       query_index=w.query_index, key_index=w.key_index)
            for w in gathered
        ]
        self.emit_weights(AttentionWeights(
            variant=self.name, causal=self.causal, layout="block_sparse", num_queries=length,
            num_keys=length, parts=parts,
            note=f"sparse path: per-block weights ({plan.num_blocks} blocks of {plan.block_size})",
        ))
        return out

    def _incremental(self, x, key_padding_mask, cache: Cache) -> torch.Tensor:
        if not self.causal:
            raise AttentionError("bigbird: incremental decoding needs a causal module (causal=true)")
        b, n, _ = x.shape
        offset = int(cache.get("length", 0))
        total = offset + n
        self.check_length(total)
        q = self.split_heads(self.q_proj(x))
        k = append_to_cache(cache, "k", self.split_heads(self.k_proj(x)), dim=2)
        v = append_to_cache(cache, "v", self.split_heads(self.v_proj(x)), dim=2)
        pad = append_padding(cache, key_padding_mask, offset, b, n, x.device)
        cache["length"] = total
        # Causal plans are prefix-stable and exact under the fallback rule, so the sparse plan of the
        # blocks seen so far reproduces the full forward whichever path it took.
        padded = self.num_blocks(total) * self.block_size
        extra = padded - total
        if pad is None:
            pad = torch.zeros(b, total, dtype=torch.bool, device=x.device)
        if extra:
            k, v = (F.pad(t, (0, 0, 0, extra)) for t in (k, v))
            pad = F.pad(pad, (0, extra), value=True)
        plan = self.plan_for_length(total, x.device)
        positions = torch.arange(offset, total, device=x.device)
        out = blocksparse_attention_at(q, positions, k, v, plan, key_padding_mask=pad, scale=self.head_dim**-0.5)
        return self.out_proj(self.merge_heads(out))

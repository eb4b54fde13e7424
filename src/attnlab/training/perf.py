"""Throughput accounting: peak FLOP/s by device (or "unknown"), a measured matmul peak, model FLOPs per
token, and a Lightning callback that logs ``perf/mfu``.

Model FLOPs utilisation (MFU) = model FLOPs per token x tokens per second / peak FLOP/s.

- The peak comes from ``PEAK_FLOPS`` (vendor datasheet numbers, dense, no structured sparsity) when the
  device is listed, and is otherwise reported as unknown (``None``): never a guess. CPUs are never listed
  (the same model name spans core counts, clocks and SMT settings), so on CPU the callback measures the
  matmul peak in the same process (``measure_matmul_peak``) and logs MFU against it.
- Model FLOPs per token are counted by ``torch.utils.flop_counter.FlopCounterMode`` over a forward and
  backward of one real training batch (``count_training_flops``), divided by its tokens. That pass runs
  eagerly beside the training step, with every attention module on its reference kernel
  (``attention.countable_kernels``): the counter sees no compiled FlexAttention (and eager FlexAttention
  makes it raise), nor the blocked CPU kernel's worker threads, which it would count as zero. The pass
  leaves the run unchanged: the random state is forked, gradients are restored, no weight moves. Attention
  is counted as executed (dense SDPA counts the full L x L product even where masked; BigBird counts only
  the computed blocks, of the length padded to whole blocks). ``transformer_flops_per_token`` is the
  analytic 6N + 12 * layers * d * context estimate (Kaplan et al. 2020; PaLM appendix B) for cross-checks.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from attnlab.attention import countable_kernels
from attnlab.models.recompute import layers_kept

# Dense peak FLOP/s by (device-name substring, dtype). Datasheet numbers without sparsity; "fp32" is plain
# FP32 (no TF32). Matching is by case-insensitive substring of torch.cuda.get_device_name(); first match.
PEAK_FLOPS: list[tuple[str, dict[str, float]]] = [
    ("H200", {"fp32": 67e12, "tf32": 494.5e12, "bf16": 989.5e12, "fp16": 989.5e12}),
    ("H100 PCIe", {"fp32": 51e12, "tf32": 378e12, "bf16": 756e12, "fp16": 756e12}),
    ("H100 NVL", {"fp32": 60e12, "tf32": 417.5e12, "bf16": 835e12, "fp16": 835e12}),
    ("H100", {"fp32": 67e12, "tf32": 494.5e12, "bf16": 989.5e12, "fp16": 989.5e12}),  # SXM ("H100 80GB HBM3")
    ("A100", {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp16": 312e12}),
    ("L40S", {"fp32": 91.6e12, "tf32": 183e12, "bf16": 362e12, "fp16": 362e12}),
    ("A10G", {"fp32": 31.2e12, "tf32": 62.5e12, "bf16": 125e12, "fp16": 125e12}),
    ("V100", {"fp32": 15.7e12, "fp16": 125e12}),
    ("T4", {"fp32": 8.1e12, "fp16": 65e12}),
]

_PRECISION_DTYPE = {
    "32-true": "fp32", "32": "fp32", 32: "fp32", "bf16-mixed": "bf16", "bf16-true": "bf16", "bf16": "bf16",
    "16-mixed": "fp16", "16-true": "fp16", "16": "fp16", 16: "fp16", "64-true": "fp64",
}


def precision_dtype(precision: Any) -> str:
    """Lightning precision ("32-true", "bf16-mixed", ...) -> the matmul dtype name used for the peak."""
    return _PRECISION_DTYPE.get(precision, str(precision))


def peak_flops(device: torch.device | str, dtype: str = "fp32") -> float | None:
    """Datasheet peak FLOP/s of ``device`` for ``dtype`` ("fp32", "tf32", "bf16", "fp16"), or None when
    unknown (every CPU, unlisted GPUs, unlisted dtypes)."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    if dtype == "fp32" and torch.backends.cuda.matmul.allow_tf32:
        dtype = "tf32"
    name = torch.cuda.get_device_name(device).lower()
    for key, table in PEAK_FLOPS:
        if key.lower() in name:
            return table.get(dtype)
    return None


def measure_matmul_peak(
    dtype: torch.dtype = torch.float32, *, n: int = 1024, seconds: float = 0.5, device: str = "cpu"
) -> float:
    """Best observed FLOP/s of an n x n x n matmul on ``device`` (several repeats, the fastest kept).

    Measured in the calling process, with its thread settings, so it is the ceiling that process can
    reach; on a shared machine it is also as noisy as the workload it is compared with."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    torch.matmul(a, b)
    sync()
    best = float("inf")
    deadline = time.perf_counter() + seconds
    reps = 0
    while reps < 3 or time.perf_counter() < deadline:
        t = time.perf_counter()
        torch.matmul(a, b)
        sync()
        best = min(best, time.perf_counter() - t)
        reps += 1
        if reps >= 200:
            break
    return 2.0 * n**3 / best


def count_flops(fn, *args, **kwargs) -> tuple[int, Any]:
    """FLOPs of ``fn(*args, **kwargs)`` (run once) as counted by FlopCounterMode, and its result."""
    with FlopCounterMode(display=False) as counter:
        result = fn(*args, **kwargs)
    return int(counter.get_total_flops()), result


def count_training_flops(module, batch, forward_context=None) -> tuple[int, int]:
    """(FLOPs, tokens) of one forward and backward of ``module`` (a ``TaskModule``) on ``batch``, counted
    with the reference attention kernels and in ``forward_context`` (the run's autocast), without changing
    the run: the random state is forked (dropout, ACT, BigBird's resampling draw the same numbers after),
    and every parameter's gradient is put back as it was."""
    params = [p for p in module.parameters() if p.requires_grad]
    saved = [p.grad for p in params]
    for p in params:
        p.grad = None
    cuda = [module.device] if module.device.type == "cuda" else []
    # torch's counter has no formula for the fused CPU attention kernel and would count its L x L products as
    # zero; the math backend runs them as counted matmuls (CUDA's flash / efficient kernels have formulas)
    backend = sdpa_kernel([SDPBackend.MATH]) if module.device.type == "cpu" else contextlib.nullcontext()
    try:
        with torch.random.fork_rng(devices=cuda), countable_kernels(module), layers_kept(module), backend, \
                (forward_context or contextlib.nullcontext()), FlopCounterMode(display=False) as counter:
            total, _, _, tokens = module.total_loss(batch)
            total.backward()
    finally:
        for p, grad in zip(params, saved):
            p.grad = grad
    return int(counter.get_total_flops()), int(tokens)


def transformer_flops_per_token(
    matmul_params: int, *, layers: int, d_model: int, context: int, training: bool = True
) -> float:
    """Analytic model FLOPs per token: 2N (forward) or 6N (training) for N matmul parameters, plus
    attention scores 4 * layers * d * context forward (12 * ... for training)."""
    mult = 3 if training else 1
    return mult * (2.0 * matmul_params + 4.0 * layers * d_model * context)


def mfu(flops_per_token: float, tokens_per_s: float, peak: float | None) -> float | None:
    return None if not peak else flops_per_token * tokens_per_s / peak


try:  # the callback needs Lightning; the functions above do not
    from lightning.pytorch.callbacks import Callback
except ImportError:  # pragma: no cover
    Callback = object


class MFUCallback(Callback):
    """Logs ``perf/tokens_per_s``, ``perf/flops_per_token`` and ``perf/mfu`` every ``log_every`` steps.

    - FLOPs per token: ``count_training_flops`` on the first micro-batch of training step ``count_step``,
      before that step runs (forward and backward, an eager pass of its own; the step itself is not
      timed). A module without ``total_loss`` (not a ``TaskModule``) is counted over its real step instead,
      with its tokens from ``tokens_fn(batch)``.
    - Peak: ``peak_flops(device, precision)``; where that is unknown (CPU, unlisted GPU) the matmul peak
      is measured once at fit start in the training precision's dtype and logged as
      ``perf/peak_flops_measured``; ``perf/mfu`` is then against the measured peak and
      ``perf/peak_source`` is 0 (measured) instead of 1 (datasheet).
    - Step time: wall time from ``on_train_batch_start`` to ``on_train_batch_end`` (data loading
      excluded). On CUDA the device is waited for only at the end of a logged step: queued work of the
      window's steps is then counted in that step, and no other step waits for the accelerator.
    """

    def __init__(self, log_every: int = 50, count_step: int = 1, tokens_fn=None, measure_peak: bool = True):
        super().__init__()
        self.log_every = max(1, int(log_every))
        self.count_step = int(count_step)
        self.tokens_fn = tokens_fn
        self.measure_peak = measure_peak
        self.flops_per_token: float | None = None
        self.peak: float | None = None
        self.peak_source: str = "unknown"
        self._counter = None
        self._skip_timing = False
        self._t0 = 0.0
        self._tokens0 = 0
        self._acc_time = 0.0
        self._acc_tokens = 0
        self._run_time = 0.0  # every timed step of the run, for the run record's summary
        self._run_tokens = 0

    def summary(self) -> dict[str, float | str | None]:
        """MFU over every timed step of the run, for the run record's ``cost`` (None where unknown)."""
        tps = float(self._run_tokens) / self._run_time if self._run_time > 0 else None
        value = mfu(self.flops_per_token, tps, self.peak) if self.flops_per_token and tps else None
        return {"mfu": value, "flops_per_token": self.flops_per_token, "peak_flops": self.peak,
                "peak_source": self.peak_source}

    # -- helpers -------------------------------------------------------------------------------------
    def _tokens(self, pl_module, batch):
        """Tokens seen so far: an int, or a device tensor read on the host only at logged steps."""
        if self.tokens_fn is not None:
            return self.tokens_fn(batch)
        return getattr(pl_module, "_tokens_seen", 0)

    @staticmethod
    def _sync(pl_module) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)

    # -- hooks ---------------------------------------------------------------------------------------
    def on_fit_start(self, trainer, pl_module) -> None:
        dtype = precision_dtype(getattr(trainer, "precision", "32-true"))
        self.peak = peak_flops(pl_module.device, dtype)
        self.peak_source = "datasheet" if self.peak else "unknown"
        if self.peak is None and self.measure_peak:
            torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(dtype, torch.float32)
            self.peak = measure_matmul_peak(torch_dtype, device=str(pl_module.device))
            self.peak_source = "measured"

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._tokens0 = 0 if self.tokens_fn is not None else self._tokens(pl_module, batch)
        if trainer.global_step == self.count_step and self.flops_per_token is None:
            if hasattr(pl_module, "total_loss"):
                flops, tokens = count_training_flops(pl_module, batch, trainer.precision_plugin.forward_context())
                self._sync(pl_module)  # the counting pass's queued work is not the next step's time
                if tokens > 0:
                    self.flops_per_token = flops / tokens
                self._skip_timing = True  # the counting pass and this step's start are not one step's time
                return
            self._counter = FlopCounterMode(display=False)
            self._counter.__enter__()
            return
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        tokens = self._tokens(pl_module, batch) - self._tokens0
        if self._skip_timing:
            self._skip_timing = False
            return
        if self._counter is not None:
            counter, self._counter = self._counter, None
            counter.__exit__(None, None, None)
            tokens = int(tokens)
            if tokens > 0:
                self.flops_per_token = counter.get_total_flops() / tokens
            return
        logged = (trainer.global_step + 1) % self.log_every == 0
        if logged:
            self._sync(pl_module)
        elapsed = time.perf_counter() - self._t0
        self._acc_time += elapsed
        self._acc_tokens += tokens
        self._run_time += elapsed
        self._run_tokens += tokens
        if not logged or self._acc_time <= 0:
            return
        tps = float(self._acc_tokens) / self._acc_time
        # Logged for all ranks (as Throughput logs it, this rank's count times the ranks); MFU is per device.
        metrics = {"perf/tokens_per_s": tps * trainer.world_size}
        if self.flops_per_token is not None:
            metrics["perf/flops_per_token"] = self.flops_per_token
            value = mfu(self.flops_per_token, tps, self.peak)
            # Against a peak measured on a shared CPU the ratio means little (a loaded machine measures a low
            # peak, and the ratio went above 1): only a datasheet peak makes an MFU worth showing.
            if value is not None and self.peak_source == "datasheet":
                metrics["perf/mfu"] = value
        if self.peak is not None:
            metrics["perf/peak_flops"] = self.peak
            metrics["perf/peak_source"] = 1.0 if self.peak_source == "datasheet" else 0.0
        pl_module.log_dict(metrics, on_step=True, on_epoch=False)
        self._acc_time, self._acc_tokens = 0.0, 0

"""Lightning modules, one per task kind: sequence-to-sequence, language modelling, classification, regression and
masked language modelling (``MODULES``), over one ``TaskModule`` (optimisation, ACT terms, logging).

They hold only plain dicts as hyperparameters so checkpoints load with ``weights_only=True``.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from torchmetrics.classification import MulticlassAccuracy

from attnlab.decoding.options import DecodingOptions
from attnlab.decoding.search import beam_search, greedy_decode
from attnlab.metrics import GroupedAnswerScore, MaskedLMScore, Perplexity, Ratio, SequenceAccuracy
from attnlab.models import DecoderLM, EncoderClassifier, EncoderDecoder, EncoderMLM
from attnlab.training.data import pop_eval_slot
from attnlab.training.schedules import lr_multiplier

# Lightning warns at every fit and test that ``on_before_batch_transfer`` is defined on the LightningModule
# while a LightningDataModule is passed, and that the module's hook is used: that is the design here (the
# hook needs the task's pad id, which the module holds), so the warning, a second stderr line under every
# one-line refusal or stop, says nothing. Exactly this message is silenced; every other warning stays.
warnings.filterwarnings(
    "ignore",
    message=r"You have overridden `on_before_batch_transfer` in `LightningModule` but have passed in a "
            r"`LightningDataModule`\. It will use the implementation from `LightningModule` instance\.",
)

# The batch entry saying which token tensors hold padding (``TaskModule.on_before_batch_transfer``).
PADDED = "padded"
PADDABLE = ("src", "tgt_in", "ids")


def count_parameters(model: torch.nn.Module) -> dict[str, int]:
    params = {id(p): p for p in model.parameters()}.values()  # tied weights once
    return {
        "total": sum(p.numel() for p in params),
        "trainable": sum(p.numel() for p in params if p.requires_grad),
    }


def freeze_embeddings(model: torch.nn.Module) -> list[str]:
    """Keep the token embeddings and the output softmax fixed (no gradient, not in the optimizer): the
    Synthesizer paper's T5 fine-tuning keeps them fixed. Returns the frozen parameters' names."""
    frozen = []
    for name, p in model.named_parameters(remove_duplicate=False):
        if name.endswith("tokens.weight") or name == "output.weight":
            p.requires_grad_(False)
            frozen.append(name)
    return frozen


class TaskModule(L.LightningModule):
    """Shared optimisation, aux-loss handling (ACT ponder terms) and logging."""

    def __init__(self, model_cfg: dict[str, Any], optim_cfg: dict[str, Any], task_info: dict[str, Any],
                 eval_cfg: dict[str, Any], *, run_seed: int | None = None, text_scorer: Any = None,
                 references: dict[str, list] | None = None, detokenize: Any = None, fused_optimizer: bool = False,
                 nonfinite_guard: Any = None) -> None:
        """``run_seed`` seeds the per-layer random state of the network (BigBird plans, fixed random R; the
        network reads ``torch.initial_seed()`` where it is None). The collaborators ``build_module`` passes
        from the task and the config (plain callables and strings, not hyperparameters): ``text_scorer``
        scores whole splits of outputs (BLEU, ROUGE, MCC, bAbI failed tasks, ...) against
        ``references[split]``; ``detokenize`` turns decoded ids into the outputs files' text;
        ``fused_optimizer`` picks Adam's fused kernel; ``nonfinite_guard`` (``run`` passes the one among the
        trainer's callbacks) checks each loss before backward."""
        super().__init__()
        # Kept in checkpoints, not sent to loggers: the run's logged config is the resolved Hydra config,
        # which these dicts would repeat under other names (model_cfg.d_model beside model.d_model). The
        # collaborators are no hyperparameters: checkpoints load with ``weights_only=True``.
        self.save_hyperparameters("model_cfg", "optim_cfg", "task_info", "eval_cfg", logger=False)
        self.model_cfg, self.optim_cfg, self.task_info, self.eval_cfg = model_cfg, optim_cfg, task_info, eval_cfg
        self.run_seed = run_seed
        self.model = self.build_model()
        if optim_cfg.get("freeze_embeddings"):
            freeze_embeddings(self.model)
        # Modules that hold some parameters still at some updates (``held_parameters``), found once: the module tree
        # does not change during training.
        self._parameter_holders = [m for m in self.model.modules() if callable(getattr(m, "held_parameters", None))]
        self._tokens_seen = 0
        self._update_count: torch.Tensor | None = None  # loss count of the update so far (``loss_count``)
        self.eval_split_names: list[str] = list(task_info.get("eval_splits", {"test": "test"}))
        self.text_scorer, self.detokenize, self.references = text_scorer, detokenize, references or {}
        self.fused_optimizer, self.nonfinite_guard = fused_optimizer, nonfinite_guard
        self._hypotheses: dict[int, list[tuple[int, Any]]] = {}
        # After testing: {eval prefix: {example index: output}} of every rank, for the outputs files.
        self.test_outputs: dict[str, dict[int, Any]] = {}

    @property
    def network(self) -> torch.nn.Module:
        """The network a step calls: its compiled form while training when ``hardware.compile`` is on, else
        ``self.model``. Evaluation stays eager: decoding runs the network once per output length with a
        growing cache, which a compiled graph would recompile for."""
        compiled = self.__dict__.get("_compiled_network")
        return compiled if compiled is not None and self.training else self.model

    def compile_network(self) -> None:
        # Kept outside the module's children: the compiled wrapper shares ``self.model``'s parameters, and
        # the state dict (checkpoints) keeps the plain names.
        self.__dict__["_compiled_network"] = torch.compile(self.model)

    # -- hooks for subclasses -----------------------------------------------------------------------
    def build_model(self) -> torch.nn.Module:
        raise NotImplementedError  # abstract: each task family builds its network

    def compute_loss(self, batch) -> tuple[torch.Tensor, dict[str, Any], int | torch.Tensor]:
        """(main loss, aux dict from the network, number of target tokens: a device tensor where it is
        counted from device data, so that the step never waits for the accelerator)."""
        raise NotImplementedError  # abstract

    # -- training ----------------------------------------------------------------------------------
    def on_before_batch_transfer(self, batch, dataloader_idx: int):
        """Say which token tensors of a training batch hold padding, read here on the host before the copy to
        the device: a network told "no padding" builds no attention mask (the mask-free flash kernel, and
        no ``padding.any()`` that would wait for the accelerator). Evaluation batches build masks as always."""
        if self._trainer is not None and self.trainer.training and isinstance(batch, dict):
            pad = self.task_info["pad_id"]
            batch[PADDED] = {key: bool(batch[key].eq(pad).any()) for key in PADDABLE if key in batch}
        return batch

    def total_loss(self, batch) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any], int]:
        """(what is minimised: the main loss plus the network's ``loss/`` terms such as ACT's ponder cost,
        the main loss, the aux dict, target tokens)."""
        loss, aux, tokens = self.compute_loss(batch)
        total = loss
        for key, value in aux.items():
            if key.startswith("loss/"):
                total = total + value
        return total, loss, aux, tokens

    def training_step(self, batch, batch_idx):
        total, loss, aux, tokens = self.total_loss(batch)
        # Checked before backward so a NaN/Inf never reaches the weights (run.py passes the guard).
        guard = self.nonfinite_guard
        terms = {"nll": loss, **{k[5:]: v for k, v in aux.items() if k.startswith("loss/")}}
        if guard is not None and not guard.check(self, total, {"loss": total, **terms}):
            return None  # nan_policy=skip: no backward, no update for this batch
        for key, value in aux.items():
            if key.startswith("loss/"):
                self.log(f"train/{key[5:]}", value.detach(), on_step=True, on_epoch=False)
            elif key.startswith("log/"):
                logged = value.detach().float() if isinstance(value, torch.Tensor) else float(value)
                self.log(f"train/{key[4:]}", logged, on_step=True, on_epoch=False)
        self.log("train/nll", loss.detach(), on_step=True, on_epoch=False, prog_bar=False)
        # Lightning turns progress-bar values into Python numbers after every batch, a wait for the
        # accelerator: shown only where a bar is drawn (logged values are read every log_every_n_steps).
        self.log("train/loss", total.detach(), on_step=True, on_epoch=False, prog_bar=self._bar_drawn())
        # Out of place: once a device tensor, ``+=`` would change the very tensor the throughput callbacks
        # kept as "tokens before this batch", and every later batch would count zero tokens.
        self._tokens_seen = self._tokens_seen + tokens
        scale = self._update_scale()
        if scale is None:
            return total
        # The update's loss is the mean over all its micro-batches and ranks (module doc of ``loss_count``):
        # back-propagate the micro-batch's sum, times what Lightning (1 / accumulation) and DDP (1 / ranks)
        # divide by; ``on_before_optimizer_step`` divides by the update's count over every rank.
        count = torch.as_tensor(self.loss_count(batch), device=total.device, dtype=torch.float64)
        self._update_count = self._update_count + count if self._update_count is not None else count
        return total * count.to(total.dtype) * scale

    def _bar_drawn(self) -> bool:
        trainer = self._trainer
        return trainer is not None and trainer.progress_bar_callback is not None

    def loss_count(self, batch) -> int | torch.Tensor:
        """What the family's loss is a mean over in ``batch`` (target tokens, scored tokens, examples).

        With gradient accumulation or several ranks, an update's micro-batches hold different counts (length
        buckets, padding, masking): the mean of their means would weigh a token by its micro-batch's size, and
        the optimisation would change with ``hardware``. The update's gradient is instead that of
        sum(losses) / sum(counts) over the whole update, as one process with the whole batch computes it."""
        raise NotImplementedError  # abstract

    def _update_scale(self) -> float | None:
        """accumulation x ranks when an update spans several micro-batches or ranks, else None (the
        micro-batch's mean is the update's: the one-process, one-micro-batch path is left exactly as it is)."""
        trainer = self._trainer
        if trainer is None:
            return None
        parts = int(trainer.accumulate_grad_batches) * int(trainer.world_size)
        return float(parts) if parts > 1 else None

    def on_before_optimizer_step(self, optimizer) -> None:
        """Divide the summed gradients by the update's loss count over every rank (``loss_count``); then log
        the global gradient 2-norm (before clipping, which Lightning runs after this hook) on logged steps.
        Parameters a module holds at this update (``held_parameters``, e.g. ACT's halting unit during
        ``halting_hold_updates``) lose their gradients first: the optimizer skips a parameter without one."""
        self._drop_held_gradients()
        count, self._update_count = self._update_count, None
        if count is not None:
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                torch.distributed.all_reduce(count)
            divisor = count.clamp_min(1.0)
            for p in self.parameters():
                if p.grad is not None:
                    p.grad.div_(divisor.to(p.grad.dtype))
        trainer = self._trainer
        if trainer is None or not trainer.loggers:
            return
        every = max(int(trainer.log_every_n_steps), 1)
        if (trainer.fit_loop.epoch_loop._batches_that_stepped + 1) % every:
            return
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        if grads:
            norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
            self.log("train/grad_norm", norm.detach().float(), on_step=True, on_epoch=False)

    def _drop_held_gradients(self) -> None:
        update = int(self.global_step) if self._trainer is not None else 0
        for module in self._parameter_holders:
            for p in module.held_parameters(update):
                p.grad = None

    def configure_optimizers(self):
        o = self.optim_cfg
        decay, no_decay = [], []
        for name, p in self.named_parameters():
            if p.requires_grad:
                (no_decay if p.ndim < 2 or "norm" in name else decay).append(p)
        groups = [{"params": decay, "weight_decay": o["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}]
        if isinstance(o["optimizer"], dict):  # the user's own: {_target_: torch.optim.SGD, momentum: 0.9, ...}
            optimizer = instantiate(o["optimizer"], groups, lr=o["lr"])
        else:
            cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[o["optimizer"]]
            # fused: one kernel for every parameter (hardware.fused_optimizer; training/acceleration.py)
            fused = {"fused": True} if self.fused_optimizer else {}
            optimizer = cls(groups, lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"], **fused)
        trainer = self._trainer  # None outside a Trainer (benchmarks, tools); the property would raise
        total = trainer.max_steps if trainer is not None and trainer.max_steps > 0 else 100_000
        if isinstance(o["schedule"], dict):  # the user's own torch scheduler, stepped every update
            schedule = instantiate(o["schedule"], optimizer)
        else:
            schedule = torch.optim.lr_scheduler.LambdaLR(
                optimizer, lr_multiplier(o["schedule"], warmup_steps=o["warmup_steps"], total_steps=total,
                                         min_ratio=o["min_lr_ratio"])
            )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def on_fit_start(self) -> None:
        params = {f"model/params/{k}": float(v) for k, v in count_parameters(self.model).items()}
        if self.trainer.is_global_zero:
            for lg in self.loggers:
                lg.log_metrics(params, step=0)
        self._fit_start = time.perf_counter()

    # -- evaluation steps ------------------------------------------------------------------------------
    # Lightning calls these; the families implement ``validate_batch`` and ``test_batch``. A batch that only
    # pads this rank (``EvalSlot.repeat``: its examples are scored on another rank) is skipped, so every
    # metric sums each example once, whatever the number of ranks (training/data.py ``EvalBatchSampler``).
    def validation_step(self, batch, batch_idx):
        number, repeat = pop_eval_slot(batch, batch_idx)
        if not repeat:
            self.validate_batch(batch, number)

    def test_step(self, batch, batch_idx, dataloader_idx: int = 0):
        number, repeat = pop_eval_slot(batch, batch_idx)
        if not repeat:
            self.test_batch(batch, number, dataloader_idx)

    def validate_batch(self, batch, batch_number: int) -> None:
        raise NotImplementedError  # abstract: each task family scores its validation batches

    def test_batch(self, batch, batch_number: int, dataloader_idx: int) -> None:
        raise NotImplementedError  # abstract

    def scored_anywhere(self, count) -> bool:
        """Whether any rank scored something (``count`` > 0 on some rank): every rank must take the same
        branch, since computing a metric gathers it from all ranks, and a rank may have scored nothing."""
        flag = torch.tensor(int(count) > 0, dtype=torch.int32, device=self.device)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return bool(flag)

    def eval_prefix(self, dataloader_idx: int) -> str:
        return self.eval_split_names[dataloader_idx] if dataloader_idx < len(self.eval_split_names) else "test"

    # -- whole-split scoring -----------------------------------------------------------------------------
    def on_test_epoch_start(self):
        self._hypotheses = {}
        self.test_outputs = {}

    def collect_outputs(self, batch, outputs: list, dataloader_idx: int) -> None:
        """Keep (example index, output) pairs for ``text_scorer`` and the outputs files; needs ``ref_index``."""
        if (self.text_scorer is not None or self.detokenize is not None) and "ref_index" in batch:
            self._hypotheses.setdefault(dataloader_idx, []).extend(zip(batch["ref_index"].tolist(), outputs))

    def log_split_scores(self, idx: int) -> None:
        for key, value in self._score_split(idx).items():
            self.log(f"{self.eval_prefix(idx)}/{key}", float(value), add_dataloader_idx=False, sync_dist=False)

    @staticmethod
    def _gather(pairs: list[tuple[int, Any]]) -> dict[int, Any]:
        """{example index: output} from every rank; a DistributedSampler may repeat an example to even out ranks."""
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            gathered: list = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(gathered, pairs)
            pairs = [p for part in gathered for p in part]
        return dict(pairs)

    def gather_outputs(self, idx: int) -> dict[int, Any]:
        """{example index: output} of one evaluation split from every rank (kept in ``test_outputs``)."""
        by_index = self._gather(self._hypotheses.get(idx, []))
        if by_index:
            self.test_outputs[self.eval_prefix(idx)] = by_index
        return by_index

    def _score_split(self, idx: int) -> dict[str, float]:
        split = list(self.task_info["eval_splits"].values())[idx]
        return self._score_by_index(self.gather_outputs(idx), split)

    def _score_outputs(self, pairs: list[tuple[int, Any]], split: str) -> dict[str, float]:
        """Scores over the whole split: outputs are gathered from every rank, then scored once."""
        return self._score_by_index(self._gather(pairs), split)

    def _score_by_index(self, by_index: dict[int, Any], split: str) -> dict[str, float]:
        if not by_index or self.text_scorer is None:
            return {}
        refs = self.references[split]
        order = sorted(by_index)
        return self.text_scorer([by_index[i] for i in order], [refs[i] for i in order])


def _label_smoothed_nll(logits, target, pad_id: int, smoothing: float):
    """(label-smoothed CE summed over tokens, plain NLL summed, token count as a tensor on the logits' device:
    an ``int`` would wait for the accelerator at every step). Padding is ignored."""
    flat_logits = logits.reshape(-1, logits.shape[-1]).float()
    flat_target = target.reshape(-1)
    ce = F.cross_entropy(flat_logits, flat_target, ignore_index=pad_id, label_smoothing=smoothing,
                         reduction="sum")
    if smoothing:
        nll = F.cross_entropy(flat_logits.detach(), flat_target, ignore_index=pad_id, reduction="sum")
    else:
        nll = ce.detach()
    tokens = flat_target.ne(pad_id).sum()
    return ce, nll, tokens


class Seq2SeqModule(TaskModule):
    """Encoder-decoder training with teacher forcing; evaluation decodes (greedy or beam) and scores."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        eos, pad = self.task_info["eos_id"], self.task_info["pad_id"]
        self.val_acc = SequenceAccuracy(eos, pad)
        self.test_acc = torch.nn.ModuleList(SequenceAccuracy(eos, pad) for _ in self.eval_split_names)
        self.val_ppl = Perplexity()
        self._val_outputs: list[tuple[int, Any]] = []  # (reference index, decoded text) of this validation

    def build_model(self):
        t = self.task_info
        return EncoderDecoder(self.model_cfg, src_vocab=t["src_vocab_size"], tgt_vocab=t["vocab_size"],
                              pad_id=t["pad_id"], max_len=self.model_cfg["max_len"], run_seed=self.run_seed)

    def compute_loss(self, batch):
        logits, aux = self.network(batch["src"], batch["tgt_in"], padded=batch.get(PADDED))
        ce, _, tokens = _label_smoothed_nll(logits, batch["tgt_out"], self.task_info["pad_id"],
                                            self.optim_cfg["label_smoothing"])
        return ce / tokens.clamp_min(1), aux, tokens

    def loss_count(self, batch):
        return batch["tgt_out"].ne(self.task_info["pad_id"]).sum()

    def decode(self, src: torch.Tensor) -> torch.Tensor:
        # Read at each call: eval_cfg stays a plain dict (checkpoints load with weights_only) that evaluation may
        # replace; a checkpoint written before a key existed (length_penalty) gets that key's default.
        e, t = DecodingOptions.of(self.eval_cfg), self.task_info
        max_len = min(e.max_length(src.shape[1]), self.model_cfg["max_len"] - 1)
        if e.strategy == "beam":
            return beam_search(self.model, src, bos_id=t["bos_id"], eos_id=t["eos_id"], max_len=max_len,
                               beam_size=e.beam_size, alpha=e.length_penalty_alpha, length_penalty=e.length_penalty)
        return greedy_decode(self.model, src, bos_id=t["bos_id"], eos_id=t["eos_id"], max_len=max_len)

    def validate_batch(self, batch, batch_number):
        logits, _ = self.network(batch["src"], batch["tgt_in"])
        _, nll, tokens = _label_smoothed_nll(logits, batch["tgt_out"], self.task_info["pad_id"], 0.0)
        self.val_ppl.update(nll, tokens)
        if self.eval_cfg["decode_in_validation"]:
            predictions = self.decode(batch["src"])
            self.val_acc.update(predictions, batch["tgt_out"])
            if self.text_scorer is not None and "ref_index" in batch and "val" in self.references:
                # Dev BLEU (and the task's other text scores) for checkpoint selection and plateau decay.
                self._val_outputs.extend(zip(batch["ref_index"].tolist(),
                                             [self.detokenize(row) for row in predictions.tolist()]))

    def on_validation_epoch_start(self):
        self._val_outputs = []

    def on_validation_epoch_end(self):
        ppl = self.val_ppl.compute()
        self.log("val/loss", ppl["nll"].float(), prog_bar=True)
        self.log("val/ppl", ppl["ppl"].float())
        self.val_ppl.reset()
        if self.eval_cfg["decode_in_validation"]:
            for key, value in self.val_acc.compute().items():
                self.log(f"val/{key}", value.float(), prog_bar=key == "seq_acc")
            self.val_acc.reset()
            outputs, self._val_outputs = self._val_outputs, []
            if self.text_scorer is not None and "val" in self.references:  # every rank: scoring gathers
                for key, value in self._score_outputs(outputs, "val").items():
                    self.log(f"val/{key}", float(value), sync_dist=False, prog_bar=key == "bleu")

    def test_batch(self, batch, batch_number, dataloader_idx):
        predictions = self.decode(batch["src"])
        self.test_acc[dataloader_idx].update(predictions, batch["tgt_out"])
        if self.detokenize is not None:
            self.collect_outputs(batch, [self.detokenize(row) for row in predictions.tolist()], dataloader_idx)

    def on_test_epoch_end(self):
        for idx, metric in enumerate(self.test_acc):
            if not self.scored_anywhere(metric.total_seqs):
                continue
            prefix = self.eval_prefix(idx)
            for key, value in metric.compute().items():
                self.log(f"{prefix}/{key}", value.float(), add_dataloader_idx=False)
            metric.reset()
            self.log_split_scores(idx)


class LMModule(TaskModule):
    """Decoder-only language model; reports perplexity (natural log, per the task's token unit).

    Optional batch keys, set by the task: ``word_starts`` (target positions that begin a word: a subword
    task then also reports word-level perplexity ``word_ppl`` = exp(total NLL / words)) and ``target_mask``
    (LAMBADA: the last word's positions; reports ``last_word_acc`` and ``last_word_ppl``).
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.val_ppl = Perplexity()
        n = len(self.eval_split_names)
        self.test_ppl = torch.nn.ModuleList(Perplexity() for _ in range(n))
        self.test_word_ppl = torch.nn.ModuleList(Perplexity() for _ in range(n))
        self.test_last_ppl = torch.nn.ModuleList(Perplexity() for _ in range(n))
        self.test_last_acc = torch.nn.ModuleList(Ratio() for _ in range(n))

    def build_model(self):
        t = self.task_info
        return DecoderLM(self.model_cfg, vocab=t["vocab_size"], pad_id=t["pad_id"], max_len=self.model_cfg["max_len"],
                         run_seed=self.run_seed)

    def compute_loss(self, batch):
        logits, aux = self.network(batch["ids"], padded=batch.get(PADDED))
        target = batch["target"]
        if "target_mask" in batch:  # LAMBADA-style: train only on the scored words
            target = target.masked_fill(~batch["target_mask"], self.task_info["pad_id"])
        ce, _, tokens = _label_smoothed_nll(logits, target, self.task_info["pad_id"],
                                            self.optim_cfg["label_smoothing"])
        return ce / tokens.clamp_min(1), aux, tokens

    def loss_count(self, batch):
        real = batch["target"].ne(self.task_info["pad_id"])
        return (real & batch["target_mask"]).sum() if "target_mask" in batch else real.sum()

    def _nll(self, batch):
        logits, _ = self.network(batch["ids"])
        _, nll, tokens = _label_smoothed_nll(logits, batch["target"], self.task_info["pad_id"], 0.0)
        return nll, tokens

    def validate_batch(self, batch, batch_number):
        self.val_ppl.update(*self._nll(batch))

    def on_validation_epoch_end(self):
        out = self.val_ppl.compute()
        self.log("val/loss", out["nll"].float(), prog_bar=True)
        self.log("val/ppl", out["ppl"].float(), prog_bar=True)
        self.val_ppl.reset()

    def test_batch(self, batch, batch_number, dataloader_idx):
        logits, _ = self.network(batch["ids"])
        target, pad = batch["target"], self.task_info["pad_id"]
        token_nll = F.cross_entropy(logits.float().transpose(1, 2), target, ignore_index=pad, reduction="none")
        real = target.ne(pad)
        self.test_ppl[dataloader_idx].update(token_nll.sum(), int(real.sum()))
        if "word_starts" in batch:
            self.test_word_ppl[dataloader_idx].update(token_nll.sum(), int((batch["word_starts"] & real).sum()))
        if "target_mask" in batch:
            mask = batch["target_mask"] & real
            self.test_last_ppl[dataloader_idx].update(token_nll[mask].sum(), int(mask.any(1).sum()))
            right = (logits.argmax(-1).eq(target) | ~mask).all(1) & mask.any(1)
            self.test_last_acc[dataloader_idx].update(right.sum(), mask.any(1).sum())

    def on_test_epoch_end(self):
        for idx, metric in enumerate(self.test_ppl):
            if not self.scored_anywhere(metric.tokens):
                continue
            out = metric.compute()
            prefix = self.eval_prefix(idx)
            self.log(f"{prefix}/loss", out["nll"].float(), add_dataloader_idx=False)
            self.log(f"{prefix}/ppl", out["ppl"].float(), add_dataloader_idx=False)
            metric.reset()
            words = self.test_word_ppl[idx]
            if self.scored_anywhere(words.tokens):
                self.log(f"{prefix}/word_ppl", words.compute()["ppl"].float(), add_dataloader_idx=False)
                words.reset()
            last = self.test_last_ppl[idx]
            if self.scored_anywhere(last.tokens):
                self.log(f"{prefix}/last_word_ppl", last.compute()["ppl"].float(), add_dataloader_idx=False)
                self.log(f"{prefix}/last_word_acc", 100.0 * self.test_last_acc[idx].compute().float(),
                         add_dataloader_idx=False)
                last.reset()
                self.test_last_acc[idx].reset()


class ClassificationModule(TaskModule):
    """Encoder classifier; reports accuracy, plus the task's official metrics (MCC, F1, bAbI failed tasks,
    ...) through ``text_scorer`` over the whole split when the task sets one."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        n = self.task_info["num_classes"]
        self.val_acc = MulticlassAccuracy(num_classes=n, average="micro")
        self.test_acc = torch.nn.ModuleList(MulticlassAccuracy(num_classes=n, average="micro")
                                            for _ in self.eval_split_names)
        self.val_loss = Ratio()  # summed cross-entropy / examples, over every rank

    def build_model(self):
        t = self.task_info
        return EncoderClassifier(self.model_cfg, vocab=t["vocab_size"], pad_id=t["pad_id"],
                                 max_len=self.model_cfg["max_len"], num_classes=t["num_classes"],
                                 run_seed=self.run_seed)

    def compute_loss(self, batch):
        logits, aux = self.network(batch["ids"], padded=batch.get(PADDED))
        loss = F.cross_entropy(logits.float(), batch["label"], label_smoothing=self.optim_cfg["label_smoothing"])
        return loss, aux, batch["ids"].ne(self.task_info["pad_id"]).sum()

    def loss_count(self, batch):
        return len(batch["label"])

    def validate_batch(self, batch, batch_number):
        logits, _ = self.network(batch["ids"])
        self.val_acc.update(logits.argmax(-1), batch["label"])
        self.val_loss.update(F.cross_entropy(logits.float(), batch["label"], reduction="sum"), len(batch["label"]))

    def on_validation_epoch_end(self):
        self.log("val/acc", self.val_acc.compute().float(), prog_bar=True)
        self.log("val/loss", self.val_loss.compute().float(), prog_bar=True)  # mean over the split's examples
        self.val_acc.reset()
        self.val_loss.reset()

    def test_batch(self, batch, batch_number, dataloader_idx):
        logits, _ = self.network(batch["ids"])
        predictions = logits.argmax(-1)
        self.test_acc[dataloader_idx].update(predictions, batch["label"])
        outputs = predictions.tolist()
        if getattr(self.text_scorer, "needs_scores", False):
            # Ranking inputs against each other (ReCoRD candidates): log p(positive class). A raw logit is not
            # comparable across inputs, since adding a constant to both logits leaves the prediction unchanged.
            positive = logits.float().log_softmax(-1)[:, 1]
            outputs = list(zip(outputs, positive.tolist()))
        self.collect_outputs(batch, outputs, dataloader_idx)

    def on_test_epoch_end(self):
        for idx, metric in enumerate(self.test_acc):
            if not self.scored_anywhere(metric.update_count):
                continue
            scores = self._score_split(idx) if self.text_scorer is not None else {}
            if "acc" not in scores:  # a task's own accuracy (GLUE, 0-100) replaces the plain fraction
                self.log(f"{self.eval_prefix(idx)}/acc", metric.compute().float(), add_dataloader_idx=False)
            metric.reset()
            for key, value in scores.items():
                self.log(f"{self.eval_prefix(idx)}/{key}", float(value), add_dataloader_idx=False, sync_dist=False)


class RegressionModule(TaskModule):
    """Encoder with one output (STS-B): MSE loss; Pearson/Spearman through the task's ``text_scorer``."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # Summed squared error / examples over every rank: the split's mean, not a mean of batch means.
        self.val_loss = Ratio()
        self.test_mse = torch.nn.ModuleList(Ratio() for _ in self.eval_split_names)

    def build_model(self):
        t = self.task_info
        return EncoderClassifier(self.model_cfg, vocab=t["vocab_size"], pad_id=t["pad_id"],
                                 max_len=self.model_cfg["max_len"], num_classes=1, run_seed=self.run_seed)

    def _predict(self, batch):
        out, aux = self.network(batch["ids"], padded=batch.get(PADDED))
        return out.float().squeeze(-1), aux

    def compute_loss(self, batch):
        pred, aux = self._predict(batch)
        return F.mse_loss(pred, batch["label"].float()), aux, batch["ids"].ne(self.task_info["pad_id"]).sum()

    def loss_count(self, batch):
        return len(batch["label"])

    def validate_batch(self, batch, batch_number):
        pred, _ = self._predict(batch)
        self.val_loss.update(F.mse_loss(pred, batch["label"].float(), reduction="sum"), len(pred))

    def on_validation_epoch_end(self):
        self.log("val/loss", self.val_loss.compute().float(), prog_bar=True)
        self.val_loss.reset()

    def test_batch(self, batch, batch_number, dataloader_idx):
        pred, _ = self._predict(batch)
        self.test_mse[dataloader_idx].update(F.mse_loss(pred, batch["label"].float(), reduction="sum"), len(pred))
        self.collect_outputs(batch, pred.tolist(), dataloader_idx)

    def on_test_epoch_end(self):
        for idx, mse in enumerate(self.test_mse):
            if self.scored_anywhere(mse.den):
                self.log(f"{self.eval_prefix(idx)}/mse", mse.compute().float(), add_dataloader_idx=False)
            mse.reset()
            self.log_split_scores(idx)


class MaskedLMModule(TaskModule):
    """Encoder with a masked-LM head (tasks/masked_lm.py): the loss and every metric read the masked
    positions only (``batch["scored"]``); ``mlm_acc``, ``bpc`` (bits per character), ``bits_per_token``
    (the papers' "BPC") and ``loss`` (nats per masked token) per split."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.val_score = MaskedLMScore()
        self.test_score = torch.nn.ModuleList(MaskedLMScore() for _ in self.eval_split_names)
        # The same test blocks with each block's tokens in a random order: a model that ignores word order
        # scores there what it scores in order, so the gap says how much of a row's accuracy comes from order
        # (the premise of BigBird's Table 1: its building blocks differ in which neighbours a token sees).
        self.test_shuffled_score = torch.nn.ModuleList(MaskedLMScore() for _ in self.eval_split_names)
        # Probes whose answers need different depths (tasks/probes.py, op hops) carry a per-position ``group``:
        # accuracy and layer applications per group say whether computation follows the depth each answer needs.
        self.test_group_score = torch.nn.ModuleList(GroupedAnswerScore() for _ in self.eval_split_names)

    def build_model(self):
        t = self.task_info
        return EncoderMLM(self.model_cfg, vocab=t["vocab_size"], pad_id=t["pad_id"], max_len=self.model_cfg["max_len"],
                         run_seed=self.run_seed)

    def _logits(self, batch):
        logits, aux = self.network(batch["ids"], batch["scored"], padded=batch.get(PADDED))
        return logits, batch["target"][batch["scored"]], aux

    def _fixed_depth(self) -> int:
        """Layer applications per position of a model without adaptive halting, read from the built encoder:
        a UT stack's steps, else its number of distinct layers."""
        encoder = self.model.encoder
        return int(getattr(encoder, "num_steps", None) or len(encoder.layers))

    def _score_groups(self, batch, logits, target, aux, dataloader_idx) -> None:
        scored = batch["scored"]
        steps = aux.get("encoder/steps")
        steps = steps[scored] if isinstance(steps, torch.Tensor) else torch.full_like(target, self._fixed_depth())
        self.test_group_score[dataloader_idx].update(batch["group"][scored], logits.argmax(-1).eq(target), steps)

    def compute_loss(self, batch):
        logits, target, aux = self._logits(batch)
        loss = F.cross_entropy(logits.float(), target, label_smoothing=self.optim_cfg["label_smoothing"])
        return loss, aux, int(batch["ids"].numel())

    def loss_count(self, batch):
        return batch["scored"].sum()

    def validate_batch(self, batch, batch_number):
        logits, target, _ = self._logits(batch)
        self.val_score.update(logits, target, batch["chars"][batch["scored"]])

    def on_validation_epoch_end(self):
        for key, value in self.val_score.compute().items():
            self.log(f"val/{key}", value.float(), prog_bar=key in ("loss", "mlm_acc"))
        self.val_score.reset()

    def test_batch(self, batch, batch_number, dataloader_idx):
        logits, target, aux = self._logits(batch)
        self.test_score[dataloader_idx].update(logits, target, batch["chars"][batch["scored"]])
        if "group" in batch:
            self._score_groups(batch, logits, target, aux, dataloader_idx)
        shuffled = shuffle_blocks(batch, seed=batch_number)  # the batch's number in the split: rank-independent
        logits, target, _ = self._logits(shuffled)
        self.test_shuffled_score[dataloader_idx].update(logits, target, shuffled["chars"][shuffled["scored"]])

    def on_test_epoch_end(self):
        for idx, (metric, shuffled) in enumerate(zip(self.test_score, self.test_shuffled_score)):
            if not self.scored_anywhere(metric.tokens):
                continue
            prefix, in_order, out_of_order = self.eval_prefix(idx), metric.compute(), shuffled.compute()
            for key, value in in_order.items():
                self.log(f"{prefix}/{key}", value.float(), add_dataloader_idx=False)
            for key in ("mlm_acc", "bits_per_token"):
                self.log(f"{prefix}/{key}_shuffled", out_of_order[key].float(), add_dataloader_idx=False)
            # What the row gets from word order (a claim about attention patterns can require it: a model
            # that has not learned to use order cannot tell its building blocks apart).
            gain = in_order["mlm_acc"] - out_of_order["mlm_acc"]
            self.log(f"{prefix}/mlm_acc_from_order", gain.float(), add_dataloader_idx=False)
            if self.test_group_score[idx].update_called:
                for key, value in self.test_group_score[idx].compute().items():
                    self.log(f"{prefix}/{key}", value.float(), add_dataloader_idx=False)
                self.test_group_score[idx].reset()
            metric.reset()
            shuffled.reset()


def shuffle_blocks(batch: dict[str, torch.Tensor], *, seed: int) -> dict[str, torch.Tensor]:
    """``batch`` with each block's positions in a random order (a fixed generator seeded by ``seed``, so every
    row of a table sees the same order): inputs, targets, masks and characters move together, so the same
    tokens are masked and scored, only their neighbours change."""
    rows, n = batch["ids"].shape
    generator = torch.Generator().manual_seed(seed)
    order = torch.stack([torch.randperm(n, generator=generator) for _ in range(rows)]).to(batch["ids"].device)
    return {key: batch[key].gather(1, order) for key in ("ids", "target", "scored", "chars")}


MODULES = {"seq2seq": Seq2SeqModule, "lm": LMModule, "classification": ClassificationModule,
           "regression": RegressionModule, "mlm": MaskedLMModule}

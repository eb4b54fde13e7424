"""Multi-task machine translation: several language pairs trained together as one model, T5-style.

Synthesizer Table 6 trains "multi-task MT without pre-training" (En-De, En-Fr, En-Ro together, in the T5 /
Mesh TensorFlow framework) and reports each pair's dev BLEU. Each member of ``task.members`` is an ordinary
``translation`` task config (its split specs, languages, caps); members set to null are left out. The source
of every pair gets T5's task prefix (``t5.data.preprocessors.translate``: ``"translate English to German: "``)
so one model knows which language to produce; one joint BPE vocabulary is trained on the text of every
member. Mixing is examples-proportional without a size limit (T5 Sec. 3.5.2 with K = infinity): the members'
training pairs are pooled and shuffled together; a member's ``max_train_pairs`` caps what it contributes.

Evaluation: every member's ``eval_split`` (``val`` for Table 6's dev-set numbers, or ``test``) is decoded in
one pass; each hypothesis is scored with its own member's references, giving ``test/<member>/bleu`` (and
``tok_bleu``, ``chrf``) and ``test/bleu_average`` (the mean of the members' BLEU). Validation during training
is the loss on the pooled dev splits.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from attnlab.metrics.text import bleu_signature, chrf_signature
from attnlab.tasks.base import DataError, TaskData
from attnlab.tasks.registry import register_task_family
from attnlab.tasks.tokenization import UNK_ESCAPE
from attnlab.tasks.translation import MTScorer, load_pairs, text_seq2seq_task

log = logging.getLogger("attnlab")

# t5.data.preprocessors.translate writes the language names of its ISO codes (babel); the codes our pairs use:
LANGUAGE_NAMES = {"en": "English", "de": "German", "fr": "French", "ro": "Romanian", "gl": "Galician",
                  "vi": "Vietnamese", "ar": "Arabic", "he": "Hebrew", "sk": "Slovak", "cs": "Czech"}


def language_name(code: str) -> str:
    if code not in LANGUAGE_NAMES:
        raise DataError(f"language code {code!r} has no name for the T5 prefix; known: {', '.join(LANGUAGE_NAMES)}")
    return LANGUAGE_NAMES[code]


def t5_prefix(src_lang: str, tgt_lang: str) -> str:
    """T5's translation prefix: ``"translate English to German: "``."""
    return f"translate {language_name(src_lang)} to {language_name(tgt_lang)}: "


@dataclass
class MixtureMTScorer:
    """BLEU (and its companions) per member: ``references`` are (member, reference text) pairs."""

    members: tuple[str, ...]
    scorer: MTScorer

    def __call__(self, hypotheses: list[str], references: list[tuple[str, str]]) -> dict[str, float]:
        grouped: dict[str, tuple[list[str], list[str]]] = {m: ([], []) for m in self.members}
        for hypothesis, (member, reference) in zip(hypotheses, references):
            grouped[member][0].append(hypothesis)
            grouped[member][1].append(reference)
        out: dict[str, float] = {}
        for member, (hyps, refs) in grouped.items():
            if hyps:
                out.update({f"{member}/{k}": v for k, v in self.scorer(hyps, refs).items()})
        bleus = [out[f"{m}/bleu"] for m in self.members if f"{m}/bleu" in out]
        if bleus:
            out["bleu_average"] = sum(bleus) / len(bleus)
        return out


def active_members(cfg: dict[str, Any]) -> dict[str, dict[str, Any]]:
    members = {k: v for k, v in (cfg.get("members") or {}).items() if v is not None}
    if not members:
        raise DataError(f"{cfg['name']}: task.members is empty; name at least one translation task config")
    for key, member in members.items():
        if "/" in key:
            raise DataError(f"task.members.{key}: a member key names metrics (test/<key>/bleu); no '/' in it")
        for field_name in ("src_lang", "tgt_lang", "train", "val", "test"):
            if field_name not in member:
                raise DataError(f"task.members.{key} has no {field_name}; a member is a translation task config")
    return members


@register_task_family("translation_mixture")
def load_translation_mixture(cfg: dict[str, Any], seed: int) -> TaskData:
    members = active_members(cfg)
    eval_split = cfg.get("eval_split", "val")
    if eval_split not in ("val", "test"):
        raise DataError(f"task.eval_split={eval_split!r}; valid: val (dev-set numbers, as Table 6), test")
    train, val, evaluation, eval_refs, val_refs, counts = [], [], [], [], [], []
    for key, member in members.items():
        member = {**member, "data_root": member.get("data_root") or cfg.get("data_root")}
        prefix = t5_prefix(member["src_lang"], member["tgt_lang"])
        pairs = {split: load_pairs(member, split) for split in dict.fromkeys(("train", "val", eval_split))}
        cap = member.get("max_train_pairs")
        member_train = [(s, t) for s, t in pairs["train"] if s and t]
        member_train = member_train[: int(cap)] if cap else member_train
        cap_eval = cfg.get("max_eval_pairs")
        member_eval = pairs[eval_split][: int(cap_eval)] if cap_eval else pairs[eval_split]
        train += [(prefix + s, t) for s, t in member_train]
        val += [(prefix + s, t) for s, t in pairs["val"]]
        val_refs += [(key, t) for _, t in pairs["val"]]
        evaluation += [(prefix + s, t) for s, t in member_eval]
        eval_refs += [(key, t) for _, t in member_eval]
        counts.append(f"{key} {member['src_lang']}->{member['tgt_lang']}: train {len(member_train)}, "
                      f"{eval_split} {len(member_eval)}")
    tokenize = cfg.get("sacrebleu_tokenize", "13a")
    scorer = MixtureMTScorer(tuple(members), MTScorer(tokenize=tokenize, tokenized=bool(cfg.get("tokenized_bleu"))))
    flavours = {
        "bleu": f"per member <member>/bleu: sacreBLEU corpus BLEU of that member's hypotheses against its raw "
                f"reference text; signature {bleu_signature(tokenize=tokenize)}; <unk> in hypotheses written "
                f"{UNK_ESCAPE}; bleu_average: the mean over members",
        "chrf": f"sacreBLEU chrF per member, signature {chrf_signature()}",
        "mixture": "multi-task MT (T5-style, no pre-training): sources prefixed 'translate <Source> to <Target>: ', "
                   "training pairs pooled (examples-proportional, no size limit); " + "; ".join(counts),
        "split": f"test/<member>/* metrics are on each member's {eval_split} split"
                 + (" (dev-set numbers, as the paper's Table 6)" if eval_split == "val" else ""),
    }
    if scorer.scorer.tokenized:
        flavours["tok_bleu"] = ("tokenized BLEU per member (multi-bleu.perl equivalent: sacreBLEU tokenize=none) "
                                f"on the tokenized text; signature {bleu_signature(tokenize='none')}")
    notes = [f"{k}: {m['stand_in']}" for k, m in members.items() if m.get("stand_in")]
    if notes:
        cfg = {**cfg, "stand_in": "; ".join(notes)}
    log.info("%s: %s", cfg["name"], flavours["mixture"])
    task = text_seq2seq_task({**cfg, "max_train_pairs": None, "max_eval_pairs": None},
                             {"train": train, "val": val, "test": evaluation}, scorer, flavours,
                             " + ".join(f"{m['src_lang']}->{m['tgt_lang']}" for m in members.values()))
    # Scoring needs each hypothesis' member: the references carry it (outputs files show the text).
    task.references = {"val": val_refs, "test": eval_refs}
    return task

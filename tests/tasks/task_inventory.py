"""Every task config, discovered from the files, with where its data comes from at scale=cpu.

Shared by the slow every-task training file and the default-tier check that hub-only tasks have fixture tests:
a new task config is picked up by both without anyone listing it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from tests.conftest import compose, group_options

TASK_OPTIONS = group_options("task")


@dataclass
class DataNeeds:
    """``kind``: generated | local | hub. ``files``: paths under the data root a local task reads; ``hub``: the
    hub ids a hub task needs."""

    kind: str
    files: list[str] = field(default_factory=list)
    hub: list[str] = field(default_factory=list)


def task_config(option: str, *extra: str) -> dict[str, Any]:
    """The task section at scale=cpu, as a plain dict (composed as tests/test_config.py does: one cache entry)."""
    cfg = compose([f"task={option}", *extra])
    return OmegaConf.to_container(cfg.task, resolve=True)


def _is_split_spec(value: Any) -> bool:
    return isinstance(value, dict) and ("src" in value or "hub_schema" in value or "hub_split" in value)


def data_needs(task: dict[str, Any]) -> DataNeeds:
    """Where one task config's data comes from: generated (no data root), local files, or the hub."""
    if "data_root" not in task:
        return DataNeeds("generated")
    if "members" in task:  # a text-to-text mixture: the members it uses decide, hub ones are skipped offline
        chosen = task.get("tasks") or [k for k, v in task["members"].items() if v is not None]
        needs = [data_needs(task["members"][name]) for name in chosen]
        corpus = (task.get("vocabulary") or {}).get("corpus") or {}
        files = [f for n in needs if n.kind == "local" for f in n.files] + _corpus_files(corpus)
        if all(n.kind == "hub" for n in needs):
            return DataNeeds("hub", hub=[h for n in needs for h in n.hub])
        return DataNeeds("local", files=files)
    specs = {name: spec for name, spec in task.items() if _is_split_spec(spec)}
    specs.update({name: spec for name, spec in (task.get("extra_tests") or {}).items() if _is_split_spec(spec)})
    if specs:  # translation: one source per split
        hub = [f"{s.get('hub_id')} ({name})" for name, s in specs.items() if s.get("source", "local") == "hub"]
        if hub:
            return DataNeeds("hub", hub=hub)
        return DataNeeds("local", files=[s[side] for s in specs.values() for side in ("src", "tgt")])
    if task.get("source", "local") == "hub":
        return DataNeeds("hub", hub=[str(task.get("hub_id") or "no public hub id")])
    files = [v for key in ("files", "lm_files", "eval_files") for v in (task.get(key) or {}).values() if v]
    if task.get("format") == "wic":  # files name the release's prefixes: <prefix>.data.txt / .gold.txt
        files = [f"{f}.data.txt" for f in files]
    if task.get("loader") == "babi":
        files.append(f"babi/tasks_1-20_v1-2/{task.get('variant', 'en')}")
    files += _corpus_files((task.get("vocabulary") or {}).get("corpus") or {})
    return DataNeeds("local", files=files)


def _corpus_files(corpus: dict[str, Any]) -> list[str]:
    return [v for v in (corpus.get("files") or {}).values() if v] if corpus.get("source") == "local" else []


def declared_metrics(task: dict[str, Any]) -> list[str]:
    """What a task config says it reports: ``metrics`` (GLUE family), else its ``paper_metric``; [] if neither."""
    if task.get("metrics"):
        return list(task["metrics"])
    return [str(task["paper_metric"])] if task.get("paper_metric") else []


# -- shrinking any task to a few seconds -------------------------------------------------------------------
# Caps by key name, wherever they occur in the task (members of a mixture included), so a new task that uses
# the same names is shrunk without being listed. A cap is set where the key exists or the loader's schema
# has it; vocabulary sizes only shrink.
CAPS = {
    "max_train_pairs": 48, "max_eval_pairs": 8, "max_train_examples": 48, "max_eval_examples": 16,
    "max_val_examples": 16, "max_train_tokens": 3000, "max_val_tokens": 600, "max_test_tokens": 600,
    "max_eval_passages": 8, "max_questions_per_task": 24, "max_story_sentences": 8, "max_examples": 60,
    "max_train_chunks": 32, "max_eval_chunks": 8, "max_train_documents": 300, "max_eval_documents": 60,
    "max_documents": 400, "train_size": 64, "val_size": 8, "test_size": 8,
}
LENGTHS = {"block_len": 16, "max_src_len": 48, "max_tgt_len": 24, "max_seq_len": 64, "input_length": 32,
           "train_max_len": 6, "test_max_len": 12}
VOCABULARY_SIZE = 300


def _schema_fields(loader: str | None) -> set[str]:
    import dataclasses

    from attnlab.tasks.schemas import TASK_SCHEMAS

    return {f.name for f in dataclasses.fields(TASK_SCHEMAS.get(loader))} if loader in TASK_SCHEMAS else set()


def shrink(node: DictConfig) -> None:
    """Cap example counts, lengths and vocabularies of a task config (in place), recursively."""
    fields = _schema_fields(node.get("loader")) if "loader" in node else set()
    with open_dict(node):
        for key, cap in CAPS.items():
            if key in node or key in fields:
                node[key] = cap
        for key, cap in LENGTHS.items():
            if key in node and isinstance(node[key], int) and node[key] > cap:
                node[key] = cap
        if node.get("loader") == "lte":  # digits of the numbers: the generator's own length knob
            node["length"] = min(int(node.get("length", 5)), 4)
        if node.get("loader") == "listops":
            node["max_len"], node["min_len"] = min(int(node.get("max_len", 64)), 64), 1
        if node.get("loader") in ("lra_text", "lra_retrieval"):
            node["max_len"] = min(int(node.get("max_len", 64)), 64)
        for key in ("tokenizer", "vocabulary"):
            vocab = node.get(key)
            if isinstance(vocab, DictConfig) and vocab.get("kind") in ("bpe", "wordpiece") \
                    and int(vocab.get("vocab_size") or 0) > VOCABULARY_SIZE:
                vocab.vocab_size = VOCABULARY_SIZE
        decoding = node.get("decoding")
        if isinstance(decoding, DictConfig) and float(decoding.get("max_len_a", 1.0)) > 0:
            # decode a few tokens: a pipeline check, not a score (a fixed max_len_b, with max_len_a 0, is the
            # loader's bound for its longest target and stays)
            decoding.max_len_a = min(float(decoding.get("max_len_a", 1.0)), 0.5)
            decoding.max_len_b = min(int(decoding.get("max_len_b", 10)), 4)
        for key, child in list(node.items()):
            if isinstance(child, DictConfig) and key not in ("at_scale", "tokenizer", "vocabulary", "decoding"):
                shrink(child)
        if "at_scale" in node:
            node["at_scale"] = {}  # already applied by compose; run() must not apply it again over the caps

"""Hub-only tasks (no local copy at scale=cpu) load from small fixtures in the hub's row schema, and none is left
without such a test: the slow every-task file skips them ("hub only"), so this is where they are covered.

Tasks are discovered from the config files (tests/tasks/task_inventory.py). A hub-only task whose loader has a
row builder below is fixture-tested here automatically; the others must name their dedicated test in
``DEDICATED`` (checked to exist) or stand in ``NOT_FIXTURE_TESTED`` with the reason.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from attnlab.tasks import build_task
from tests.conftest import compose
from tests.tasks.fake_hub import serve_hub
from tests.tasks.task_inventory import TASK_OPTIONS, data_needs, task_config

# Hub-only tasks with a test of their own (module::function), in the hub's row schema unless said otherwise.
DEDICATED = {
    "superglue/multirc": "tests.tasks.test_superglue_reading::test_multirc_on_hub_schema_fixture",
    "superglue/record": "tests.tasks.test_superglue_reading::test_record_on_hub_schema_fixture",
    "sum/cnn_dailymail": "tests.tasks.test_loaders::test_cnn_dailymail_loader_on_hub_schema_fixture",
    # no public hub copy exists: the local Linzen TSV layout is what users supply
    "sva/agreement": "tests.tasks.test_hub_only::test_sva_local_task_splits_and_reports_attractor_accuracy",
}
# Hub-only tasks without a fixture test yet, and why. Keep this empty where possible.
NOT_FIXTURE_TESTED: dict[str, str] = {}


def _hub_only() -> dict[str, dict[str, Any]]:
    out = {}
    for option in TASK_OPTIONS:
        task = task_config(option)
        if data_needs(task).kind == "hub":
            out[option] = task
    return out


HUB_ONLY = _hub_only()



# -- rows in each hub schema, built from the task config ---------------------------------------------------
WORDS = "the cat sat on a mat and the dog ran to the park in the rain".split()


def words(i: int, n: int = 6) -> str:
    return " ".join(WORDS[(i + j) % len(WORDS)] for j in range(n))


def glue_rows(task: dict[str, Any], root: Path) -> dict[str, list[dict]]:
    classes = len(task["label_values"]) if task.get("label_values") is not None else 0
    rows = [{**{f: f"{f} {words(i)}" for f in task["hub_text_fields"]},
             task.get("hub_label_field", "label"): (i % classes) if classes else float(i % 5)} for i in range(24)]
    return {name: rows for name in task["hub_splits"].values()}


def text_lm_rows(task: dict[str, Any], root: Path) -> dict[str, list[dict]]:
    field = task.get("hub_text_field", "text")
    rows = [{field: words(i, 8) + "\n"} for i in range(80)]
    return {name: rows for name in task["hub_splits"].values()}


def imdb_rows(task: dict[str, Any], root: Path) -> dict[str, list[dict]]:
    rows = [{task["hub_text_field"]: words(i, 20), task["hub_label_field"]: i % 2} for i in range(16)]
    return {name: rows for name in task["hub_splits"].values()}


def translation_rows(task: dict[str, Any], root: Path) -> dict[str, list[dict]]:
    """Hub splits in the schema each spec names; local splits (dev / test of IWSLT) written under ``root``."""
    src, tgt = task["src_lang"], task["tgt_lang"]
    pairs = [(f"{src} {words(i)}", f"{tgt} {words(i + 3)}") for i in range(24)]
    schemas = {
        "translation": lambda s, t: {"translation": {src: s, tgt: t}},
        "flat": lambda s, t: {src: s, tgt: t},
        "ted_multi": lambda s, t: {"translations": {"language": [src, tgt], "translation": [s, t]}},
    }
    splits: dict[str, list[dict]] = {}
    specs = [task[name] for name in ("train", "val", "test")] + list((task.get("extra_tests") or {}).values())
    for spec in specs:
        if spec.get("source", "local") == "hub":
            splits[spec.get("hub_split", "train")] = [schemas[spec.get("hub_schema", "translation")](s, t)
                                                      for s, t in pairs]
        else:
            for side, index in (("src", 0), ("tgt", 1)):
                path = root / spec[side]
                path.parent.mkdir(parents=True, exist_ok=True)
                lines = [p[index] for p in pairs[:6]]
                if spec.get("format") in ("sgm", "xml"):  # WMT newstest SGML / IWSLT XML: one <seg> per line
                    segs = "".join(f'<seg id="{i + 1}">{line}</seg>\n' for i, line in enumerate(lines))
                    path.write_text(f'<refset>\n<doc docid="fixture">\n{segs}</doc>\n</refset>\n')
                else:
                    path.write_text("\n".join(lines) + "\n")
    return splits


def text_to_text_rows(task: dict[str, Any], root: Path) -> dict[str, list[dict]]:
    """The hub rows of the members the task uses, plus a local vocabulary corpus under ``root``."""
    corpus = (task.get("vocabulary") or {}).get("corpus") or {}
    for relative in (corpus.get("files") or {}).values():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(words(i, 10) for i in range(200)) + "\n")
    splits: dict[str, list[dict]] = {}
    for name in task.get("tasks") or list(task["members"]):
        splits.update(glue_rows(task["members"][name], root))
    return splits


BUILDERS = {"glue": glue_rows, "text_lm": text_lm_rows, "lra_text": imdb_rows, "translation": translation_rows,
            "text_to_text": text_to_text_rows}
GENERIC = sorted(o for o, t in HUB_ONLY.items() if o not in DEDICATED and o not in NOT_FIXTURE_TESTED
                 and t["loader"] in BUILDERS and t.get("scheme", "classify") == "classify")




@pytest.mark.parametrize("option", GENERIC)
def test_hub_only_task_loads_from_hub_schema_fixture(option, tmp_path, monkeypatch):
    root = tmp_path / "data"
    root.mkdir()
    task = HUB_ONLY[option]
    asked = serve_hub(monkeypatch, BUILDERS[task["loader"]](task, root))
    cfg = OmegaConf.to_container(compose([f"task={option}", f"paths.data_root={root}"]).task, resolve=True)
    for node in (cfg, *(cfg.get("members") or {}).values()):  # small vocabularies: fixtures have few words
        for key in ("tokenizer", "vocabulary"):
            if isinstance(node.get(key), dict) and node[key].get("kind") in ("bpe", "wordpiece"):
                node[key].update(vocab_size=120, min_frequency=1)
        if node.get("loader") == "text_lm":
            node["block_len"] = 8
    data = build_task(cfg, 0)
    assert asked, f"{option} never asked the hub"
    assert all(len(data.datasets[split]) > 0 for split in ("train", *data.eval_splits.values()))
    if data.score_text is not None and data.kind == "classification" and task["loader"] == "glue":
        split = next(iter(data.eval_splits.values()))
        refs = data.references[split]
        assert data.score_text(refs, refs).get("acc", 100.0) == pytest.approx(100.0)


# -- no hub-only task without a fixture test ----------------------------------------------------------------
def test_every_hub_only_task_has_a_fixture_test():
    uncovered = sorted(set(HUB_ONLY) - set(GENERIC) - set(DEDICATED) - set(NOT_FIXTURE_TESTED))
    assert not uncovered, (f"hub-only tasks without a fixture test: {uncovered}; add a row builder for their loader "
                           f"here, or a dedicated test named in DEDICATED")
    stale = sorted((set(DEDICATED) | set(NOT_FIXTURE_TESTED)) - set(HUB_ONLY))
    assert not stale, f"no longer hub-only (or gone): {stale}; drop them from DEDICATED / NOT_FIXTURE_TESTED"
    for option, target in DEDICATED.items():
        module, function = target.split("::")
        assert callable(getattr(importlib.import_module(module), function, None)), f"{option}: no test {target}"


def test_the_inventory_sees_the_known_hub_only_tasks():
    # a sanity check of the classifier itself: these have no local copy on our machines
    assert {"glue/qqp", "glue/mnli", "lm/wikitext103", "mt/ted_sk_en", "sum/cnn_dailymail", "superglue/multirc",
            "superglue/record"} <= set(HUB_ONLY)
    assert not {"glue/cola", "mt/multi30k_en_de", "lm/wikitext2", "superglue/cb", "algo/copy"} & set(HUB_ONLY)

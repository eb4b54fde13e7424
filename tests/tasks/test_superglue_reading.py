"""SuperGLUE MultiRC and ReCoRD: official metrics on hand-computed values, loaders on hub-schema fixtures and on
the SuperGLUE release layout (local JSON Lines), bad input naming file and line, and a fast_dev_run each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnlab.metrics.reading import (
    exact_match,
    multirc_scores,
    pick_candidates,
    squad_normalise,
    superglue_record_scores,
    token_f1,
)
from attnlab.tasks import DataError, build_task
from tests.conftest import TINY, compose, task_cfg
from tests.tasks.fake_hub import serve_hub

SMALL = ["task.tokenizer.vocab_size=120", "task.tokenizer.min_frequency=1"]


# -- metrics: hand-computed values ------------------------------------------------------------------------
def test_multirc_em_groups_options_by_question_and_f1a_is_over_all_options():
    # question A: 3 options all right; B: 2 options, one wrong; C: 1 option right
    questions = [("p0", 0)] * 3 + [("p0", 1)] * 2 + [("p1", 0)]
    labels = [1, 0, 1, 1, 0, 0]
    preds = [1, 0, 1, 1, 1, 0]
    got = multirc_scores(preds, labels, questions)
    assert got["em"] == pytest.approx(100 * 2 / 3)
    tp, fp, fn = 3, 1, 0
    assert got["f1a"] == pytest.approx(100 * 2 * tp / (2 * tp + fp + fn))
    # the same question index under another paragraph is another question
    assert multirc_scores([1, 0], [1, 1], [("p0", 0), ("p1", 0)])["em"] == pytest.approx(50.0)


def test_multirc_f1a_matches_sklearn():
    sklearn_metrics = pytest.importorskip("sklearn.metrics", reason="scikit-learn is not installed")
    import random

    rng = random.Random(0)
    labels = [rng.randint(0, 1) for _ in range(200)]
    preds = [y if rng.random() < 0.7 else 1 - y for y in labels]
    questions = [i // 4 for i in range(200)]
    expected = 100 * sklearn_metrics.f1_score(labels, preds)
    assert multirc_scores(preds, labels, questions)["f1a"] == pytest.approx(expected)


def test_squad_normalisation_and_token_f1():
    assert squad_normalise("The  U.S. Army!") == "us army"
    assert squad_normalise("an apple a day") == "apple day"
    assert exact_match("the U.S.", "US") == 1.0
    assert token_f1("Barack Obama", "Obama") == pytest.approx(2 * 0.5 * 1 / 1.5)  # precision 1/2, recall 1
    assert token_f1("Barack Obama", "President Obama") == pytest.approx(0.5)
    assert token_f1("the", "a") == 0.0  # both normalise to nothing


def test_record_takes_the_best_gold_answer_per_query_then_the_mean():
    got = superglue_record_scores(["Barack Obama", "London", "Paris"],
                        [["Obama", "President Obama"], ["London"], ["Berlin"]])
    assert got["f1"] == pytest.approx(100 * (2 / 3 + 1 + 0) / 3)
    assert got["em"] == pytest.approx(100 * 1 / 3)
    assert superglue_record_scores(["x"], [[]]) == {"f1": 0.0, "em": 0.0}  # no gold answer: cannot be right


def test_pick_candidates_is_argmax_per_query_first_on_ties():
    picked = pick_candidates([-2.0, -0.5, -0.5, -1.0, -3.0], ["q1", "q1", "q1", "q2", "q2"],
                             ["a", "b", "c", "d", "e"])
    assert picked == {"q1": "b", "q2": "d"}


# -- fixtures in the hub's row schema and in the SuperGLUE release layout ----------------------------------
def multirc_release(n_paragraphs: int) -> list[dict]:
    out = []
    for p in range(n_paragraphs):
        questions = [{"question": f"what did person {p} see in town {q} ?", "idx": q,
                      "answers": [{"text": f"a {word} {p}", "idx": a, "label": int(a == q % 3)}
                                  for a, word in enumerate(("cat", "dog", "bird"))]}
                     for q in range(2)]
        text = f"person {p} walked to town and saw a cat and a dog ."
        out.append({"idx": p, "version": 1.1, "passage": {"text": text, "questions": questions}})
    return out


def multirc_hub_rows(release: list[dict]) -> list[dict]:
    return [{"paragraph": r["passage"]["text"], "question": q["question"], "answer": a["text"],
             "idx": {"paragraph": r["idx"], "question": q["idx"], "answer": a["idx"]}, "label": a["label"]}
            for r in release for q in r["passage"]["questions"] for a in q["answers"]]


NAMES = ["Alice Smith", "Bob Jones", "Carol", "Dave", "Paris", "London"]


def record_release(n_passages: int) -> list[dict]:
    out = []
    for p in range(n_passages):
        names = [NAMES[(p + k) % len(NAMES)] for k in range(3)]
        text = f"{names[0]} met {names[1]} in {names[2]} on day {p} .\n@highlight\n{names[0]} travelled"
        spans = []
        for name in names:
            start = text.index(name)
            spans.append({"start": start, "end": start + len(name) - 1})  # inclusive ends, as the release
        spans.append({"start": text.rindex(names[0]), "end": text.rindex(names[0]) + len(names[0]) - 1})
        qas = [{"idx": q, "query": f"@placeholder was met by {names[0]} on day {p} .",
                "answers": [{"start": spans[1]["start"], "end": spans[1]["end"], "text": names[1]}]}
               for q in range(2)]
        out.append({"idx": p, "source": "Daily mail", "passage": {"text": text, "entities": spans}, "qas": qas})
    return out


def record_hub_rows(release: list[dict]) -> list[dict]:
    rows = []
    for r in release:
        text = r["passage"]["text"]
        entities = sorted({text[s["start"]:s["end"] + 1] for s in r["passage"]["entities"]})
        for qa in r["qas"]:
            rows.append({"passage": text, "query": qa["query"], "entities": entities,
                         "entity_spans": {"text": entities, "start": [0] * len(entities), "end": [0] * len(entities)},
                         "answers": sorted({a["text"] for a in qa["answers"]}),
                         "idx": {"passage": r["idx"], "query": qa["idx"]}})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_multirc_on_hub_schema_fixture(monkeypatch, tmp_path):
    release = multirc_release(12)
    asked = serve_hub(monkeypatch, {"train": multirc_hub_rows(release), "validation": multirc_hub_rows(release[:3])})
    data = build_task(task_cfg("superglue/multirc", tmp_path, *SMALL), 0)
    assert asked[0] == ("aps/super_glue", "multirc")
    assert data.kind == "classification" and data.num_classes == 2
    assert len(data.datasets["train"]) == 12 * 2 * 3 and len(data.datasets["val"]) == 3 * 2 * 3
    refs = data.references["val"]
    assert refs[:3] == [(1, (0, 0)), (0, (0, 0)), (0, (0, 0))]
    perfect = data.score_text([y for y, _ in refs], refs)
    assert perfect == {"em": pytest.approx(100.0), "f1a": pytest.approx(100.0)}
    one_wrong = [1 - refs[0][0]] + [y for y, _ in refs[1:]]
    assert data.score_text(one_wrong, refs)["em"] == pytest.approx(100 * 5 / 6)  # 6 questions, one broken
    assert "non-generative" in data.metric_flavours["head"] and "em" in data.metric_flavours["metrics"]
    assert "truncation" in data.metric_flavours


@pytest.mark.parametrize(("task", "folder", "make_release", "hub_rows", "size", "val_size"), [
    ("superglue/multirc", "MultiRC", multirc_release, multirc_hub_rows, 12, 3),
    ("superglue/record", "ReCoRD", record_release, record_hub_rows, 10, 2),
])  # fmt: skip
def test_local_release_layout_equals_the_hub_rows(task, folder, make_release, hub_rows, size, val_size,
                                                  monkeypatch, tmp_path):
    release = make_release(size)
    write_jsonl(tmp_path / "superglue" / folder / "train.jsonl", release)
    write_jsonl(tmp_path / "superglue" / folder / "val.jsonl", release[:val_size])
    local = build_task(task_cfg(task, tmp_path, "task.source=local", *SMALL), 0)
    serve_hub(monkeypatch, {"train": hub_rows(release), "validation": hub_rows(release[:val_size])})
    hub = build_task(task_cfg(task, tmp_path, *SMALL), 0)
    assert local.references == hub.references
    for split in ("train", "val"):
        assert local.datasets[split].examples == hub.datasets[split].examples


def test_record_on_hub_schema_fixture(monkeypatch, tmp_path):
    release = record_release(10)
    serve_hub(monkeypatch, {"train": record_hub_rows(release), "validation": record_hub_rows(release[:2])})
    data = build_task(task_cfg("superglue/record", tmp_path, *SMALL), 0)
    refs = data.references["val"]
    # 2 passages x 2 queries x 3 distinct entities (the repeated mention is one candidate)
    assert len(refs) == 12 and len(data.datasets["train"]) == 10 * 2 * 3
    assert [r[2] for r in refs[:3]] == sorted(NAMES[:3]) and refs[0][3] == ("Bob Jones",)
    assert [r[0] for r in refs[:3]] == [0, 1, 0]  # the label marks the gold entity
    # outputs are (predicted label, log p(positive)); the best-scoring candidate is the prediction
    right = [(y, -0.1 if y else -3.0) for y, *_ in refs]
    assert data.score_text(right, refs) == {"f1": pytest.approx(100.0), "em": pytest.approx(100.0)}
    wrong = [(y, -3.0 if y else -0.1) for y, *_ in refs]
    assert data.score_text(wrong, refs) == {"f1": pytest.approx(0.0), "em": pytest.approx(0.0)}
    assert "@placeholder" in data.metric_flavours["head"] and "log-probability" in data.metric_flavours["head"]
    assert "Bob Jones met" not in data.metric_flavours["head"]


def test_record_candidate_text_fills_the_placeholder_and_drops_highlight_markers(monkeypatch, tmp_path):
    from attnlab.tasks.glue import superglue_record_candidates

    row = record_hub_rows(record_release(1))[0]
    candidates = superglue_record_candidates(row, "x:1")
    assert [c.entity for c in candidates] == sorted(NAMES[:3])
    bob = next(c for c in candidates if c.entity == "Bob Jones")
    assert bob.label == 1 and bob.text.startswith("Bob Jones was met by Alice Smith on day 0 . [SEP] ")
    assert "@highlight" not in bob.text and "- Alice Smith travelled" in bob.text


def test_record_caps_cut_at_whole_queries(monkeypatch, tmp_path):
    release = record_release(10)
    serve_hub(monkeypatch, {"train": record_hub_rows(release), "validation": record_hub_rows(release)})
    data = build_task(task_cfg("superglue/record", tmp_path, *SMALL, "task.max_train_examples=10",
                               "task.max_eval_examples=7"), 0)
    assert len(data.datasets["train"]) == 9 and len(data.datasets["val"]) == 6  # 3 candidates per query


def test_hub_requests_fail_fast_offline_naming_the_release_layout(tmp_path):
    for option, folder in (("superglue/multirc", "MultiRC"), ("superglue/record", "ReCoRD")):
        with pytest.raises(DataError, match=r"aps/super_glue/\w+ is unreachable \(offline\)") as err:
            build_task(task_cfg(option, tmp_path), 0)
        assert f"superglue/{folder}/{{train,val}}.jsonl" in str(err.value) and "\n" not in str(err.value)


# -- bad input: one line naming the file and line ------------------------------------------------------------
def test_multirc_label_outside_the_label_set_names_file_and_line(tmp_path):
    release = multirc_release(3)
    release[1]["passage"]["questions"][0]["answers"][2]["label"] = 2
    write_jsonl(tmp_path / "superglue" / "MultiRC" / "train.jsonl", release)
    write_jsonl(tmp_path / "superglue" / "MultiRC" / "val.jsonl", release[:1])
    with pytest.raises(DataError, match=r"MultiRC/train.jsonl:2: label 2 is not one of \['0', '1'\]"):
        build_task(task_cfg("superglue/multirc", tmp_path, "task.source=local", *SMALL), 0)


def test_record_bad_release_lines_name_file_and_line(tmp_path):
    folder = tmp_path / "superglue" / "ReCoRD"
    release = record_release(3)
    write_jsonl(folder / "val.jsonl", release[:1])
    broken = json.loads(json.dumps(release))
    broken[2]["qas"][1]["query"] = "no placeholder here"
    write_jsonl(folder / "train.jsonl", broken)
    cfg = task_cfg("superglue/record", tmp_path, "task.source=local", *SMALL)
    with pytest.raises(DataError, match=r"ReCoRD/train.jsonl:3: the query has no @placeholder"):
        build_task(cfg, 0)
    broken = json.loads(json.dumps(release))
    broken[1]["passage"]["entities"][0]["end"] = 10_000
    write_jsonl(folder / "train.jsonl", broken)
    with pytest.raises(DataError, match=r"ReCoRD/train.jsonl:2: entity span .* outside the passage"):
        build_task(cfg, 0)
    del broken[0]["passage"]
    write_jsonl(folder / "train.jsonl", broken)
    with pytest.raises(DataError, match=r"ReCoRD/train.jsonl:1: no field 'passage.text'"):
        build_task(cfg, 0)


def test_unknown_scheme_metric_is_refused(monkeypatch, tmp_path):
    serve_hub(monkeypatch, {"train": multirc_hub_rows(multirc_release(2)), "validation": []})
    with pytest.raises(DataError, match="task.metrics has 'mcc' for scheme multirc; valid: em, f1a"):
        build_task(task_cfg("superglue/multirc", tmp_path, "task.metrics=[mcc]"), 0)


# -- a fast_dev_run each: the official metrics land in the run record ----------------------------------------
@pytest.mark.parametrize("option", ["superglue/multirc", "superglue/record"])
def test_reading_tasks_train_and_report_official_metrics(option, monkeypatch, tmp_path):
    from attnlab.training.run import run

    if option == "superglue/multirc":
        release = multirc_release(12)
        serve_hub(monkeypatch, {"train": multirc_hub_rows(release), "validation": multirc_hub_rows(release[:3])})
        expected = {"test/em", "test/f1a", "test/acc"}
    else:
        release = record_release(10)
        serve_hub(monkeypatch, {"train": record_hub_rows(release), "validation": record_hub_rows(release[:2])})
        expected = {"test/f1", "test/em", "test/acc"}
    cfg = compose([*TINY, "debug=fdr", f"task={option}", f"paths.data_root={tmp_path}", *SMALL],
                  run_dir=tmp_path / "run")
    record = run(cfg, run_dir=tmp_path / "run", command="pytest")
    assert record["status"] == "completed"
    assert expected <= set(record["metrics"]["final"])
    assert "non-generative" in record["metric_flavours"]["head"]

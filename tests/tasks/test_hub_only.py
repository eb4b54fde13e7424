"""Tasks without a local copy: subject-verb agreement, LRA text and retrieval. Their local formats load from
small fixtures the tests write; hub requests fail fast offline with what to do."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from attnlab.tasks import DataError, build_task
from attnlab.tasks.lra_bytes import BYTE_OFFSET, SEP_ID, read_aan_pairs
from attnlab.tasks.sva import AttractorScorer, read_agreement_tsv
from tests.conftest import compose, task_cfg


@pytest.fixture(autouse=True)
def _offline_and_private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("ATTNLAB_TOKENIZER_CACHE", str(tmp_path / "tokenizers"))



# -- subject-verb agreement -------------------------------------------------------------------------------
COLUMNS = ["sentence", "orig_sentence", "pos_sentence", "subj", "verb", "subj_pos", "has_rel", "has_nsubj",
           "verb_pos", "subj_index", "verb_index", "n_intervening", "last_intervening", "n_diff_intervening",
           "distance", "max_depth", "all_nouns", "nouns_up_to_verb"]
SENTENCES = [  # (sentence, verb_pos, verb_index (1-based), n_intervening, n_diff_intervening)
    ("the dog runs fast", "VBZ", 3, 0, 0),
    ("the dogs run fast", "VBP", 3, 0, 0),
    ("the key to the cabinets is lost", "VBZ", 6, 1, 1),
    ("the keys to the cabinet are lost", "VBP", 6, 1, 1),
    ("the boy near the cars and the trees is here", "VBZ", 9, 2, 2),
    ("the boy near the car and the trees is here", "VBZ", 9, 2, 1),
]


def _write_agreement(path: Path, repeat: int = 20) -> None:
    lines = ["\t".join(COLUMNS)]
    for _ in range(repeat):
        for sentence, pos, vi, n_int, n_diff in SENTENCES:
            row = dict.fromkeys(COLUMNS, "x")
            row.update(sentence=sentence, orig_sentence=sentence, verb_pos=pos, verb_index=str(vi),
                       n_intervening=str(n_int), n_diff_intervening=str(n_diff), distance=str(vi - 2))
            lines.append("\t".join(row[c] for c in COLUMNS))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def test_sva_reads_linzen_format_prefix_up_to_the_verb(tmp_path):
    path = tmp_path / "agr.tsv"
    _write_agreement(path, repeat=1)
    rows = read_agreement_tsv(path)
    assert [r.words for r in rows[:3]] == [["the", "dog"], ["the", "dogs"], ["the", "key", "to", "the", "cabinets"]]
    assert [r.label for r in rows] == [0, 1, 0, 1, 0, 0]
    assert [(r.n_intervening, r.n_diff) for r in rows][-2:] == [(2, 2), (2, 1)]


def test_sva_local_task_splits_and_reports_attractor_accuracy(tmp_path):
    _write_agreement(tmp_path / "sva" / "agr_50_mostcommon_10K.tsv")
    cfg = task_cfg("sva/agreement", tmp_path, "task.source=local",
                   "task.files.all=sva/agr_50_mostcommon_10K.tsv",
                   "task.split_fractions={train: 0.5, val: 0.1, test: 0.4}")
    task = build_task(cfg, seed=0)
    sizes = {s: len(d) for s, d in task.datasets.items()}
    assert sizes == {"train": 60, "val": 12, "test": 48} and task.num_classes == 2
    refs = task.references["test"]
    scores = task.score_text([label for label, _, _ in refs], refs)  # a perfect predictor
    assert scores and all(v == 1.0 for v in scores.values())
    assert set(scores) <= {f"acc_attractors_{k}" for k in range(6)}
    assert task.datasets["train"].examples == build_task(cfg, seed=0).datasets["train"].examples


def test_sva_attractor_scorer_counts_only_all_attractor_sentences():
    refs = [(0, 0, 0), (1, 0, 0), (0, 1, 1), (1, 2, 2), (0, 2, 1), (1, 7, 7)]
    preds = [0, 0, 0, 0, 1, 1]
    strict = AttractorScorer(max_attractors=5, only_attractors=True)(preds, refs)
    assert strict == {"acc_attractors_0": 0.5, "acc_attractors_1": 1.0, "acc_attractors_2": 0.0}
    loose = AttractorScorer(max_attractors=5, only_attractors=False)(preds, refs)
    assert loose["acc_attractors_1"] == 0.5  # (0,1,1) right, (0,2,1) wrong


def test_sva_default_hub_source_says_how_to_supply_the_data(tmp_path):
    start = time.monotonic()
    with pytest.raises(DataError, match=r"no public hub id.*task.source=local task.files.all=") as err:
        build_task(task_cfg("sva/agreement", tmp_path), seed=0)
    assert "\n" not in str(err.value) and "agr_50_mostcommon_10K.tsv" in str(err.value)
    assert time.monotonic() - start < 5


def test_sva_bad_rows_name_file_and_line(tmp_path):
    path = tmp_path / "agr.tsv"
    _write_agreement(path, repeat=1)
    lines = path.read_text().splitlines()
    lines[3] = lines[3].replace("VBZ", "VBD")
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"agr.tsv:4: verb_pos 'VBD'"):
        read_agreement_tsv(path)


# -- LRA text (IMDb bytes) --------------------------------------------------------------------------------
def _write_aclimdb(root: Path) -> None:
    for split, n in (("train", 6), ("test", 4)):
        for label in ("neg", "pos"):
            folder = root / "aclImdb" / split / label
            folder.mkdir(parents=True)
            for i in range(n):
                text = f"{label} review {i} of {split}. " * (3 + i) + "caf\u00e9 <br />"
                (folder / f"{i}_{7 + i}.txt").write_text(text, encoding="utf-8")


def test_lra_text_local_aclimdb_is_byte_level(tmp_path):
    _write_aclimdb(tmp_path)
    cfg = task_cfg("lra/text", tmp_path, "task.source=local", "task.max_len=64")
    task = build_task(cfg, seed=0)
    assert {s: len(d) for s, d in task.datasets.items()} == {"train": 12, "val": 8, "test": 8}
    ids, label = task.datasets["train"][0]
    first = sorted((tmp_path / "aclImdb" / "train" / "neg").glob("*.txt"))[0].read_bytes()
    assert label == 0 and ids == [b + BYTE_OFFSET for b in first[:64]]
    assert task.vocab_size == 260 and max(i for ids, _ in task.datasets["train"].examples for i in ids) < 260
    assert "cut at 64 bytes" in task.metric_flavours["data"] and "test set" in task.metric_flavours["data"]
    assert sorted({y for _, y in task.datasets["test"].examples}) == [0, 1]
    capped = build_task({**cfg, "max_train_examples": 5}, seed=0)
    assert len(capped.datasets["train"]) == 5


def test_lra_text_hub_offline_fails_fast_naming_the_local_layout(tmp_path):
    start = time.monotonic()
    with pytest.raises(DataError, match=r"stanfordnlp/imdb is unreachable.*aclImdb"):
        build_task(task_cfg("lra/text", tmp_path), seed=0)
    assert time.monotonic() - start < 5


# -- LRA retrieval (AAN byte pairs) ------------------------------------------------------------------------
def _write_aan(folder: Path, *, header: bool) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", 8), ("eval", 4), ("test", 4)):
        lines = ["label\tid1\tid2\ttext1\ttext2"] if header else []
        for i in range(n):
            lines.append(f"{float(i % 2)}\tP{i}\tQ{i}\tb'paper {i} cites \\xc3\\xa9 things'\tplain text {i}")
        (folder / f"new_aan_pairs.{split}.tsv").write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("header", [True, False])
def test_lra_retrieval_local_pairs_with_separator(tmp_path, header):
    _write_aan(tmp_path / "lra_release" / "tsv_data", header=header)
    task = build_task(task_cfg("lra/retrieval", tmp_path, "task.max_len=12"), seed=0)
    assert {s: len(d) for s, d in task.datasets.items()} == {"train": 8, "val": 4, "test": 4}
    ids, label = task.datasets["train"][1]
    assert label == 1 and ids.count(SEP_ID) == 1 and task.vocab_size == SEP_ID + 1
    left, right = ids[: ids.index(SEP_ID)], ids[ids.index(SEP_ID) + 1:]
    assert bytes(i - BYTE_OFFSET for i in left) == b"paper 1 cite"  # bytes literal decoded, cut at 12
    assert bytes(i - BYTE_OFFSET for i in right) == b"plain text 1"
    assert "ONE encoder" in task.metric_flavours["data"]


def test_lra_retrieval_decodes_bytes_literals_and_rejects_bad_labels(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("1\ta\tb\tb'caf\\xc3\\xa9'\tx\n")
    assert read_aan_pairs(path)[0] == ("café".encode(), b"x", 1)
    path.write_text("1\ta\tb\tx\ty\n2\ta\tb\tx\ty\n")
    with pytest.raises(DataError, match=r"pairs.tsv:2: label '2' is not 0 or 1"):
        read_aan_pairs(path)
    path.write_text("1\ta\tb\tx\n")
    with pytest.raises(DataError, match=r"pairs.tsv:1: 4 tab-separated columns"):
        read_aan_pairs(path)


def test_lra_retrieval_missing_files_say_where_to_get_them(tmp_path):
    with pytest.raises(DataError, match=r"new_aan_pairs.train.tsv not found; download lra_release.gz"):
        build_task(task_cfg("lra/retrieval", tmp_path), seed=0)
    with pytest.raises(DataError, match="no public hub id"):
        build_task(task_cfg("lra/retrieval", tmp_path, "task.source=hub"), seed=0)


@pytest.mark.slow  # real (tiny) training runs on the fixtures
@pytest.mark.parametrize("option", ["sva/agreement", "lra/retrieval"])
def test_fixture_tasks_train_a_few_steps_and_report(tmp_path, option):
    from attnlab.training.run import run
    from tests.conftest import TINY

    _write_agreement(tmp_path / "data" / "sva" / "agr.tsv")
    _write_aan(tmp_path / "data" / "lra_release" / "tsv_data", header=False)
    sva = ["task.source=local", "task.files.all=sva/agr.tsv", "task.split_fractions={train: 0.5, val: 0.1, test: 0.4}"]
    extra = sva if option == "sva/agreement" else ["task.at_scale.cpu.max_len=32"]
    cfg = compose([*TINY, "debug=fdr", f"task={option}", f"paths.data_root={tmp_path / 'data'}", *extra],
                  run_dir=tmp_path / "run")
    record = run(cfg, run_dir=tmp_path / "run", command="pytest")
    assert record["status"] == "completed"
    final = record["metrics"]["final"]
    assert "test/acc" in final
    if option == "sva/agreement":
        assert "test/acc_attractors_0" in final

"""The T5 path of Synthesizer Tables 4-5: span-corruption pre-training, GLUE / SuperGLUE in text-to-text form
as a mixture, one shared vocabulary, the presets that chain them and the make targets that run them.

Default tier: the mask arithmetic against T5's, formats and label words (round trip over every task with local
data), invalid generations, the benchmark average, mixing rates, the shared vocabulary, presets and make.
Slow tier: a tiny pre-training, then a tiny multitask run initialised from its checkpoint.
"""

from __future__ import annotations

import functools
import math
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from omegaconf import OmegaConf

from attnlab.tasks import DataError, TaskData, build_task
from attnlab.tasks import span_corruption as sc
from attnlab.tasks.span_corruption import (
    SpanCorruptionDataset,
    random_spans_helper,
    random_spans_noise_mask,
    shared_vocabulary,
    span_corrupt,
)
from attnlab.tasks.t5_formats import T5_FORMATS, stsb_target
from attnlab.tasks.text_to_text import (
    INVALID,
    EvalGroup,
    MixtureDataset,
    TextToTextScorer,
    benchmark_average,
    mixing_rates,
    mixture_slots,
    parse_label,
    parse_score,
    t5_scores,
)
from tests.conftest import CONF, REPO, compose, require_shared_data

T5_CONF = CONF / "experiment" / "synthesizer" / "t5"
VARIANTS = ("transformer", "random", "dense", "dense_vanilla", "random_vanilla")


@pytest.fixture(autouse=True)
def _offline_and_private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("ATTNLAB_TOKENIZER_CACHE", str(tmp_path / "tokenizers"))


# -- span corruption: T5's arithmetic ------------------------------------------------------------------------
@pytest.mark.parametrize("length", [1, 2, 3, 10, 29, 141, 568, 1000])
def test_noise_mask_has_t5s_noise_count_span_count_and_layout(length):
    for seed in range(5):
        mask = random_spans_noise_mask(length, 0.15, 3.0, np.random.default_rng(seed))
        assert mask.shape == (length,) and mask.dtype == bool
        padded = max(length, 2)
        noise = min(max(round(padded * 0.15), 1), padded - 1)
        spans = max(round(noise / 3.0), 1)
        if length >= 2:
            assert mask.sum() == noise
            starts = np.flatnonzero(mask & ~np.concatenate([[False], mask[:-1]]))
            assert len(starts) == spans
            assert not mask[0] and mask[-1]  # non-noise first, T5's interleaving ends on noise
        else:
            assert not mask.any()  # T5 pads to 2 tokens and cuts back: one non-noise token


def test_noise_fraction_and_mean_span_length_match_the_settings():
    masks = [random_spans_noise_mask(568, 0.15, 3.0, np.random.default_rng(s)) for s in range(50)]
    assert all(m.sum() == 85 for m in masks)  # round(568 * 0.15)
    runs = [int(r) for m in masks for r in np.diff(np.flatnonzero(np.diff(np.r_[0, m.astype(int), 0])))[::2]]
    assert len(runs) == 50 * 28 and sum(runs) / len(runs) == pytest.approx(85 / 28)
    assert len({m.tobytes() for m in masks}) == 50  # every partition is drawn, not one fixed pattern


def test_random_spans_helper_gives_t5s_lengths():
    assert random_spans_helper(512, 0.15, 3.0) == (568, 114)  # T5's inputs 512 / targets 114
    assert random_spans_helper(128, 0.15, 3.0) == (141, 29)
    tokens = np.arange(10, 578)
    mask = random_spans_noise_mask(568, 0.15, 3.0, np.random.default_rng(0))
    inputs, targets = span_corrupt(tokens, mask, np.arange(1000, 1100))
    assert (len(inputs) + 1, len(targets) + 1) == (512, 114)  # + EOS, added by the collate


def _reconstruct(inputs: np.ndarray, targets: np.ndarray, sentinels: np.ndarray) -> list[int]:
    spans: dict[int, list[int]] = {}
    current = None
    for t in targets.tolist():
        if t in sentinels:
            current = t
            spans[current] = []
        else:
            spans[current].append(t)
    out: list[int] = []
    for t in inputs.tolist():
        out.extend(spans[t] if t in sentinels else [t])
    return out


@pytest.mark.parametrize("seed", range(6))
def test_sentinels_come_in_order_and_inputs_plus_targets_give_back_the_text(seed):
    rng = np.random.default_rng(100 + seed)
    length = int(rng.integers(2, 400))
    tokens = rng.integers(10, 500, size=length)
    sentinels = np.arange(1000, 1100)
    mask = random_spans_noise_mask(length, 0.15, 3.0, np.random.default_rng(seed))
    inputs, targets = span_corrupt(tokens, mask, sentinels)
    in_sentinels = [t for t in inputs.tolist() if t >= 1000]
    spans = int((mask & ~np.concatenate([[False], mask[:-1]])).sum())
    assert in_sentinels == list(range(1000, 1000 + spans))  # <extra_id_0>, <extra_id_1>, ... in order
    assert [t for t in targets.tolist() if t >= 1000] == in_sentinels
    assert targets[0] == 1000  # the target opens with the first sentinel, then the tokens it replaced
    assert _reconstruct(inputs, targets, sentinels) == tokens.tolist()
    assert len(inputs) == length - mask.sum() + spans and len(targets) == mask.sum() + spans


def test_more_spans_than_sentinels_is_one_clear_error():
    mask = random_spans_noise_mask(568, 0.15, 3.0, np.random.default_rng(0))
    with pytest.raises(DataError, match="sentinels"):
        span_corrupt(np.arange(568), mask, np.arange(1000, 1010))


def test_corrupted_chunks_are_deterministic_per_index_and_copies_differ():
    stream = np.arange(10, 10 + 1000, dtype=np.int32)
    kw = dict(noise_density=0.15, mean_noise_span_length=3.0, sentinel_ids=np.arange(2000, 2100))
    ds = SpanCorruptionDataset(stream, 141, copies=3, seed=7, **kw)
    assert len(ds) == 3 * 8  # 1000 tokens -> 7 full chunks + one of 13
    assert ds[5] == ds[5] == SpanCorruptionDataset(stream, 141, copies=3, seed=7, **kw)[5]
    first, again = ds[2], ds[2 + 8]  # the same chunk, its second copy
    assert first[0] != again[0]
    assert _reconstruct(np.array(first[0]), np.array(first[1]), kw["sentinel_ids"]) == stream[282:423].tolist()
    short = SpanCorruptionDataset(np.arange(10, 10 + 142, dtype=np.int32), 141, copies=1, seed=0, **kw)
    assert len(short) == 1  # a last chunk of 1 token holds no noise: dropped


# -- text-to-text formats and label words ---------------------------------------------------------------------
def test_inputs_and_targets_follow_t5s_preprocessors():
    assert T5_FORMATS["glue/cola"].inputs(["Meat fell in price."]) == "cola sentence: Meat fell in price."
    assert T5_FORMATS["glue/mnli"].inputs(["P.", "H."]) == "mnli hypothesis: H. premise: P."  # sorted names
    assert T5_FORMATS["glue/qqp"].inputs(["Q1?", "Q2?"]) == "qqp question1: Q1? question2: Q2?"
    assert T5_FORMATS["glue/stsb"].inputs(["A.", "B."]) == "stsb sentence1: A. sentence2: B."
    assert T5_FORMATS["superglue/boolq"].inputs(["is it?", "Text."]) == "boolq passage: Text. question: is it?"
    assert T5_FORMATS["superglue/wic"].inputs(["bank", "S1 .", "S2 ."]) == \
        "wic sentence1: S1 . sentence2: S2 . word: bank"
    assert T5_FORMATS["superglue/copa"].inputs(["P.", "cause", "C1.", "C2."]) == \
        "copa choice1: C1. choice2: C2. premise: P. question: cause"
    # T5's own docstring example of preprocessors.wsc
    wsc = T5_FORMATS["superglue/wsc"].inputs(["This is a test sentence .", "test", 3, "This", 0])
    assert wsc == "wsc text: # This # is a * test * sentence ."
    assert T5_FORMATS["superglue/wsc"].inputs(["A dog saw it .", "dog", 1, "it", 3]) == \
        "wsc text: A * dog * saw # it # ."
    assert [T5_FORMATS["glue/cola"].target(i) for i in (0, 1)] == ["unacceptable", "acceptable"]
    assert T5_FORMATS["glue/mnli"].target(2) == T5_FORMATS["superglue/cb"].target(1) == "contradiction"


def test_stsb_targets_round_to_a_fifth_with_halves_to_even():
    assert [stsb_target(x) for x in (3.8, 2.5, 3.5, 0.1, 0.0, 5.0)] == ["3.8", "2.4", "3.6", "0.0", "0.0", "5.0"]
    assert parse_score(" 3.8") == 3.8 and parse_score("three") == -1.0 and parse_score("nan") == -1.0


def _vocabulary_override(corpus: str, size: int = 400) -> list[str]:
    return [f"task.at_scale.cpu.vocabulary.corpus.files.train={corpus}",
            f"task.at_scale.cpu.vocabulary.vocab_size={size}"]


def _t2t_task(option: str, data_root: Path, *extra: str) -> TaskData:
    cfg = compose([f"task={option}", f"paths.data_root={data_root}", *extra])
    return build_task(OmegaConf.to_container(cfg.task, resolve=True), seed=1)


@pytest.mark.parametrize("mixture", ["glue", "superglue"])
def test_every_local_task_round_trips_its_label_words(mixture, caplog):
    root = require_shared_data("glue", "superglue")
    members = list(compose([f"task=t2t/{mixture}_mixture"]).task.members)
    caps = [f"task.members.{m}.max_train_examples=40" for m in members]
    with caplog.at_level("WARNING", logger="attnlab"):
        task = _t2t_task(f"t2t/{mixture}_mixture", root, *caps, "task.at_scale.cpu.max_eval_examples=30",
                         *_vocabulary_override("glue/RTE/dev.tsv"))
    test = task.datasets["test"]
    refs = task.references["test"]
    hypotheses = [task.detokenize(test[i][1]) for i in range(len(test))]  # a model that writes every target
    scorer = task.score_text
    for text, (group, gold) in zip(hypotheses, refs):
        spec = scorer.groups[group]
        if spec.label_texts is None:
            assert parse_score(text) == float(stsb_target(gold))
        else:
            assert parse_label(text, spec.label_texts) == gold, (group, text)
    scores = scorer(hypotheses, refs)
    local = {"glue": ["cola", "sst2", "mrpc", "stsb", "rte"], "superglue": ["boolq", "cb", "copa", "rte", "wic", "wsc"]}
    assert sorted(g.member for g in scorer.groups.values()) == sorted(local[mixture])
    for key, value in scores.items():
        if key.endswith("/invalid"):
            assert value == 0.0
        elif key.startswith("stsb/"):
            assert value > 98.0  # targets are rounded to 0.2, the gold scores are not
        elif not key.endswith("_average"):
            assert value == pytest.approx(100.0), key
    assert f"{mixture}_average" in scores
    if mixture == "glue":  # hub-only tasks: skipped with a logged line and listed, never silently
        assert all(f"glue/{t}" in task.metric_flavours["skipped"] for t in ("qqp", "mnli", "qnli"))
        assert sum("skipping glue/" in r.message for r in caplog.records) == 3
        assert "5 task(s)" in task.metric_flavours["glue_average"]
    else:
        assert "MultiRC" in task.metric_flavours["coverage"] and "STAND-IN" in task.metric_flavours["data"]


def test_hub_member_in_the_hub_row_schema_gives_matched_and_mismatched_groups(tmp_path, monkeypatch):
    """MNLI is hub-only: rows in nyu-mll/glue's schema (integer labels) go through the same path as local ones."""
    from attnlab.tasks import glue

    rows = [{"premise": f"a {w} sat .", "hypothesis": f"the {w} sat .", "label": i % 3, "idx": i}
            for i, w in enumerate(WORDS * 2)]
    splits = {"train": rows, "validation_matched": rows[:9], "validation_mismatched": rows[9:15]}
    monkeypatch.setattr(glue, "load_hub_dataset", lambda hub_id, config, local_hint: splits)
    task = _t2t_task("t2t/mnli", _fixture_data(tmp_path / "data"), *SMALL_VOCAB)
    test, refs = task.datasets["test"], task.references["test"]
    assert [g for g, _ in refs] == ["mnli"] * 9 + ["mnli_mismatched"] * 6
    assert task.detokenize(test[0][0]) == "mnli hypothesis: the the sat . premise: a the sat ."
    assert [task.detokenize(test[i][1]) for i in range(3)] == ["entailment", "neutral", "contradiction"]
    hypotheses = [task.detokenize(test[i][1]) for i in range(9)] + ["neutral"] * 6  # mismatched: 2 of 6 right
    scores = task.score_text(hypotheses, refs)
    assert scores["mnli/acc"] == 100.0 and scores["mnli_mismatched/acc"] == pytest.approx(100 / 3)
    assert scores["glue_average"] == pytest.approx((100 + 100 / 3) / 2)

# -- invalid generations and the average ----------------------------------------------------------------------
def test_invalid_generations_count_wrong_as_t5_scores_them():
    preds, golds = [1, 0, INVALID, 1], [1, 0, 1, 0]
    scores = t5_scores(preds, golds, ("acc", "f1", "mcc"), 2)
    assert scores["acc"] == pytest.approx(50.0)
    assert scores["f1"] == pytest.approx(50.0)  # invalid -> the other class (0): TP 1, FP 1, FN 1
    assert scores["mcc"] == pytest.approx(100 * 2 / math.sqrt(80))  # sklearn's MCC with the invalid class
    macro = t5_scores([0, 1, INVALID, 2], [0, 1, 2, 2], ("macro_f1",), 3)["macro_f1"]
    assert macro == pytest.approx(100 * (1 + 1 + 2 / 3) / 3)  # a miss for class 2, no false positive
    assert parse_label("maybe", ("False", "True")) == INVALID and parse_label(" True ", ("False", "True")) == 1
    assert t5_scores([-1.0, -1.0, -1.0], [1.0, 2.0, 3.0], ("pearson",), 1) == {"pearson": 0.0}


def test_benchmark_average_is_the_mean_of_task_means():
    assert benchmark_average({"cola": [50.0], "mrpc": [80.0, 70.0], "stsb": [60.0, 62.0], "mnli": [84.0, 86.0]}) == \
        pytest.approx((50 + 75 + 61 + 85) / 4)


def test_scorer_reports_prefixed_metrics_invalid_rates_and_the_average():
    groups = {
        "cola": EvalGroup("cola", ("mcc",), 2, ("unacceptable", "acceptable")),
        "mrpc": EvalGroup("mrpc", ("f1", "acc"), 2, ("not_equivalent", "equivalent")),
        "mnli": EvalGroup("mnli", ("acc",), 3, ("entailment", "neutral", "contradiction")),
        "mnli_mismatched": EvalGroup("mnli", ("acc",), 3, ("entailment", "neutral", "contradiction")),
    }
    rows = [("cola", 1, "acceptable"), ("cola", 0, "unacceptable"), ("cola", 1, "acceptable"),
            ("cola", 0, "unacceptable"),
            ("mrpc", 1, "equivalent"), ("mrpc", 1, "garbage"), ("mrpc", 0, "not_equivalent"), ("mrpc", 0, "equivalent"),
            ("mnli", 0, "entailment"), ("mnli", 2, "contradiction"),
            ("mnli_mismatched", 1, "entailment"), ("mnli_mismatched", 0, "neutral")]
    scores = TextToTextScorer(groups, "glue")([h for _, _, h in rows], [(g, y) for g, y, _ in rows])
    assert scores["cola/mcc"] == pytest.approx(100.0)
    assert scores["mrpc/f1"] == pytest.approx(50.0) and scores["mrpc/acc"] == pytest.approx(50.0)
    assert scores["mrpc/invalid"] == pytest.approx(25.0)
    assert scores["mnli/acc"] == 100.0 and scores["mnli_mismatched/acc"] == 0.0
    assert scores["glue_average"] == pytest.approx((100 + 50 + 50) / 3)  # MNLI m/mm count once, by their mean


# -- mixing ---------------------------------------------------------------------------------------------------
def test_examples_proportional_rates_with_a_size_limit():
    sizes = {"a": 100, "b": 1000, "c": 10000}
    rates = mixing_rates(sizes, cap=1000)
    assert rates == pytest.approx({"a": 100 / 2100, "b": 1000 / 2100, "c": 1000 / 2100})
    assert mixing_rates(sizes, cap=None) == pytest.approx({k: n / 11100 for k, n in sizes.items()})
    hot = mixing_rates(sizes, cap=1000, temperature=2.0)
    assert hot["a"] / hot["b"] == pytest.approx(math.sqrt(100 / 1000))
    assert mixture_slots(rates, 2100) == {"a": 100, "b": 1000, "c": 1000}
    assert sum(mixture_slots({"a": 1 / 3, "b": 1 / 3, "c": 1 / 3}, 10).values()) == 10
    with pytest.raises(DataError, match="cap"):
        mixing_rates(sizes, cap=0)


def test_mixture_epoch_follows_the_slots_and_is_seeded():
    members = {k: [([ord(k), j], [j]) for j in range(n)] for k, n in {"a": 100, "b": 1000, "c": 10000}.items()}
    slots = mixture_slots(mixing_rates({k: len(v) for k, v in members.items()}, cap=1000), 4200)
    ds = MixtureDataset(members, slots, seed=3)
    assert len(ds) == 4200
    seen: dict[str, list[int]] = {}
    for i in range(len(ds)):
        src, tgt, index = ds[i]
        assert index == i and src[1] == tgt[0]
        seen.setdefault(chr(src[0]), []).append(tgt[0])
    assert {k: len(v) for k, v in seen.items()} == {"a": 200, "b": 2000, "c": 2000}
    assert sorted(seen["a"]) == sorted(list(range(100)) * 2)  # two laps over the small member
    assert len(set(seen["c"])) == 2000  # the capped member shows distinct examples
    again = MixtureDataset(members, slots, seed=3)
    other = MixtureDataset(members, slots, seed=4)
    assert [again[i] for i in range(2200, 2300)] == [ds[i] for i in range(2200, 2300)]
    assert {other[i][1][0] for i in range(2200, 4200)} != set(seen["c"])


# -- one vocabulary for both tasks ----------------------------------------------------------------------------
WORDS = "the cat sat on a mat and the dog ran to the park while birds sang in old green trees".split()


def _fixture_data(root: Path) -> Path:
    wiki = root / "wikitext2"
    wiki.mkdir(parents=True)
    for split, n in (("train", 400), ("valid", 60), ("test", 60)):
        lines = [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(8 + i % 13)) for i in range(n)]
        (wiki / f"wiki.{split}.tokens").write_text("\n".join(lines) + "\n")
    cola = root / "glue" / "CoLA"
    cola.mkdir(parents=True)
    for split, n in (("train", 60), ("dev", 20)):
        rows = [f"src\t{i % 2}\t\t{' '.join(WORDS[i % 5 : i % 5 + 6])} ." for i in range(n)]
        (cola / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    return root


SMALL_VOCAB = ["task.at_scale.cpu.vocabulary.vocab_size=120"]


def test_pretraining_and_text_to_text_share_one_cached_vocabulary(tmp_path, monkeypatch):
    root = _fixture_data(tmp_path / "data")
    pre = compose(["task=pretrain/span_corruption", f"paths.data_root={root}", *SMALL_VOCAB,
                   "task.at_scale.cpu.input_length=32"])
    pretrain = build_task(OmegaConf.to_container(pre.task, resolve=True), seed=1)

    def no_training(*args, **kwargs):
        raise AssertionError("the text-to-text task retrained the vocabulary instead of loading it")

    monkeypatch.setattr(sc, "build_tokenizer", no_training)
    t2t = _t2t_task("t2t/cola", root, *SMALL_VOCAB)
    assert pretrain.vocab_size == t2t.vocab_size == pretrain.src_vocab_size
    assert pretrain.metric_flavours["vocabulary"] == t2t.metric_flavours["vocabulary"]
    vocab = shared_vocabulary(OmegaConf.to_container(pre.task.vocabulary), data_root=root)
    assert vocab.tokenizer.token_to_id("<extra_id_0>") == vocab.sentinel_ids[0] == vocab.size - 100
    assert vocab.tokenizer.token_to_id("<extra_id_99>") == vocab.size - 1
    example = pretrain.datasets["train"][0]
    assert max(example[0]) >= vocab.sentinel_ids[0] and example[1][0] == vocab.sentinel_ids[0]
    assert pretrain.max_len == 32 and "STAND-IN" in pretrain.metric_flavours["data"]
    monkeypatch.undo()
    other = dict(OmegaConf.to_container(pre.task.vocabulary), vocab_size=130)
    assert shared_vocabulary(other, data_root=root).key != vocab.key


def test_bad_vocabulary_and_task_settings_are_one_line_errors(tmp_path):
    root = _fixture_data(tmp_path / "data")
    with pytest.raises(DataError, match="vocabulary.size_of is not a vocabulary setting"):
        _t2t_task("t2t/cola", root, "+task.at_scale.cpu.vocabulary.size_of=3")
    with pytest.raises(DataError, match="task.tasks=.*qqq"):
        _t2t_task("t2t/glue_mixture", root, "task.tasks=[qqq]", *SMALL_VOCAB)
    cfg = compose(["task=pretrain/span_corruption", f"paths.data_root={root}", "task.noise_density=1.5"])
    with pytest.raises(DataError, match="noise_density"):
        build_task(OmegaConf.to_container(cfg.task, resolve=True), seed=1)


def test_c4_fails_fast_offline_and_names_the_local_stand_in(tmp_path):
    root = _fixture_data(tmp_path / "data")
    cfg = compose(["task=pretrain/span_corruption", "scale=paper", f"paths.data_root={root}"])
    task_cfg = OmegaConf.to_container(cfg.task, resolve=True)
    started = time.time()
    with pytest.raises(DataError, match=r"allenai/c4/en is unreachable \(offline\)"):
        build_task(task_cfg, seed=1)  # the vocabulary's corpus is C4 too
    task_cfg["vocabulary"]["corpus"] = {"source": "local", "files": {"train": "wikitext2/wiki.train.tokens"}}
    task_cfg["vocabulary"]["vocab_size"] = 120
    with pytest.raises(DataError, match=r"allenai/c4/en is unreachable \(offline\).*WikiText-2"):
        build_task(task_cfg, seed=1)
    assert time.time() - started < 10


def test_init_from_a_model_of_another_vocabulary_is_one_clear_line(tmp_path):
    from attnlab.training.build import build_module
    from attnlab.training.checkpointing import CheckpointError, init_weights_from

    tiny = ["model.at_scale.cpu.d_model=32", "model.at_scale.cpu.d_ff=64", "model.at_scale.cpu.encoder_layers=1",
            "model.at_scale.cpu.decoder_layers=1"]
    pre = compose(["experiment=synthesizer/t5/pretrain_random", *tiny])
    multi = compose(["experiment=synthesizer/t5/multitask_glue_random", *tiny])

    def stub(vocab: int) -> TaskData:
        return TaskData(kind="seq2seq", datasets={}, collate=lambda b: b, vocab_size=vocab, pad_id=0, max_len=64)

    source = build_module(pre, stub(300))
    path = tmp_path / "pre.ckpt"
    torch.save({"state_dict": source.state_dict()}, path)
    target = build_module(multi, stub(300))
    init_weights_from(target, path)  # same vocabulary and model: every weight fits
    assert torch.equal(target.model.src_embed.tokens.weight, source.model.src_embed.tokens.weight)
    with pytest.raises(CheckpointError, match=r"has shape \(300, 32\), the model needs \(400, 32\)") as err:
        init_weights_from(build_module(multi, stub(400)), path)
    assert "\n" not in str(err.value)


# -- presets and the make targets -----------------------------------------------------------------------------
@functools.cache
def _paper_rows(table: str) -> dict:
    data = yaml.safe_load((REPO / "experiments" / "paper_tables.yaml").read_text(encoding="utf-8"))
    return data["synthesizer"]["tables"][table]["rows"]


def test_presets_name_themselves_a_published_row_and_their_pre_training():
    files = sorted(T5_CONF.glob("*.yaml"))
    expected = {f"{kind}_{v}" for v in VARIANTS for kind in ("pretrain", "multitask_glue", "multitask_superglue")}
    assert {p.stem for p in files} == expected
    for path in files:
        text = path.read_text(encoding="utf-8")
        assert text.startswith("# @package _global_"), path.name
        data = yaml.safe_load(text)
        assert data["experiment_name"] == f"synthesizer/t5/{path.stem}"
        table = "table5" if "superglue" in path.stem else "table4"
        assert data["row"] in _paper_rows(table), path.name
        if path.stem.startswith("multitask"):
            pretrain = T5_CONF / f"{data['pretrain_experiment'].rsplit('/', 1)[1]}.yaml"
            assert pretrain.is_file() and yaml.safe_load(pretrain.read_text())["row"] == data["row"]


def _preset(name: str, scale: str):
    # The same override list as tests/test_config.py, so a session composes each preset once.
    return compose([f"experiment=synthesizer/t5/{name}", f"scale={scale}"], run_dir=Path("/tmp/attnlab-t5-presets"))


def _flat(node, prefix="") -> dict:
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: node}


def _plain(cfg) -> dict:
    plain = OmegaConf.to_container(cfg, resolve=True)
    plain.pop("paths", None)
    for section in ("model", "task"):
        plain[section].pop("at_scale", None)
    return _flat(plain)


STUDIED = ("model.attention", "experiment_name", "row", "run_name", "pretrain_experiment")


@pytest.mark.parametrize("scale", ["cpu", "paper"])
@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "transformer"])
def test_rows_differ_only_in_attention_and_each_pipeline_shares_model_and_vocabulary(variant, scale):
    for kind in ("pretrain", "multitask_glue", "multitask_superglue"):
        mine, reference = _plain(_preset(f"{kind}_{variant}", scale)), _plain(_preset(f"{kind}_transformer", scale))
        differing = sorted(k for k in mine.keys() | reference.keys()
                           if mine.get(k, "<absent>") != reference.get(k, "<absent>"))
        bad = [k for k in differing if not k.startswith(STUDIED)]
        assert not bad, f"{kind}_{variant} vs the T5 (Base) row at scale={scale}: {bad}"
    pretrain = _preset(f"pretrain_{variant}", scale)
    for bench in ("glue", "superglue"):
        multi = _preset(f"multitask_{bench}_{variant}", scale)
        assert multi.model == pretrain.model, "init_from needs the same model"
        assert multi.task.vocabulary == pretrain.task.vocabulary, "init_from needs the same vocabulary"
        assert multi.task.input_length == pretrain.task.input_length == multi.model.max_len
        assert multi.get("init_from") is None  # the make target passes it; alone a preset trains from scratch


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize(("target", "bench"), [("reproduce-synthesizer-table4-t5", "glue"),
                                               ("reproduce-synthesizer-table5-t5", "superglue")])
def test_make_target_pretrains_then_trains_the_mixture_from_that_checkpoint(target, bench):
    dry = subprocess.run(["make", "-n", target, "SEEDS=4,5", "SCALE=paper", "HARDWARE=gpu8", "RUNS=/r",
                          "LAUNCHER=submitit_slurm_attnlab", "ARGS=trainer.max_steps=7", "STAMP="],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    trains = [line for line in dry.stdout.splitlines() if "attnlab-train -m" in line]
    assert len(trains) == 2, dry.stdout
    pretrain, multitask = trains
    rows = ",".join(f"synthesizer/t5/pretrain_{v}" for v in sorted(VARIANTS))
    for line in trains:
        assert line.startswith("ATTNLAB_SKIP_EXISTING=1 ")
        for piece in ("seed=4,5", "scale=paper", "hardware=gpu8", "paths.runs_dir=/r",
                      "hydra/launcher=submitit_slurm_attnlab", "trainer.max_steps=7"):
            assert piece in line, (piece, line)
    assert f"experiment={rows} " in pretrain
    assert "hydra.sweep.dir=/r/t5_pretrain" in pretrain
    assert "'hydra.sweep.subdir=${experiment_name}-s${seed}'" in pretrain
    assert f"experiment={rows.replace('pretrain_', f'multitask_{bench}_')} " in multitask
    assert "'init_from=/r/t5_pretrain/${pretrain_experiment}-s${seed}/checkpoints/last.ckpt'" in multitask
    assert "--only synthesizer/t5" in dry.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_target_rows_select_the_same_rows_in_pretraining_and_mixture():
    # ROWS patterns match the row part of both preset names; a pattern that only matched "pretrain_..." names
    # would pre-train rows whose mixture never runs, or train a mixture with no checkpoint to start from.
    dry = subprocess.run(["make", "-n", "reproduce-synthesizer-table5-t5", "ROWS=transformer %_vanilla", "STAMP="],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    pretrain, multitask = [line for line in dry.stdout.splitlines() if "attnlab-train -m" in line]
    rows = ["dense_vanilla", "random_vanilla", "transformer"]
    assert "experiment=" + ",".join(f"synthesizer/t5/pretrain_{r}" for r in rows) + " " in pretrain
    assert "experiment=" + ",".join(f"synthesizer/t5/multitask_superglue_{r}" for r in rows) + " " in multitask
    refused = subprocess.run(["make", "reproduce-synthesizer-table4-t5", "ROWS=no_such_row", "STAMP="],
                             cwd=REPO, capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "match ROWS=no_such_row" in refused.stderr
    assert "attnlab-train" not in refused.stdout


# -- slow: the whole path, tiny ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_tiny_pretraining_then_multitask_from_its_checkpoint(tmp_path, caplog):
    from attnlab.training.run import run

    root = require_shared_data("wikitext2", "glue/CoLA", "glue/SST-2", "glue/MRPC", "glue/STS-B", "glue/RTE")
    shared = ["model.at_scale.cpu.d_model=64", "model.at_scale.cpu.d_ff=128", "model.at_scale.cpu.encoder_layers=1",
              "model.at_scale.cpu.decoder_layers=1", "trainer.max_steps=12", "trainer.val_check_interval=6",
              "trainer.enable_progress_bar=false", "batch.sentences_per_update=16", "batch.eval_batch_size=64",
              "logger=csv", f"paths.data_root={root}", "task.at_scale.cpu.vocabulary.corpus.max_documents=3000",
              "task.at_scale.cpu.vocabulary.vocab_size=2000"]
    pre_overrides = ["experiment=synthesizer/t5/pretrain_random", *shared, "task.at_scale.cpu.max_train_documents=2000",
                     "task.at_scale.cpu.max_eval_chunks=16"]
    started = time.time()
    pre = run(compose(pre_overrides, run_dir=tmp_path / "pre"), run_dir=tmp_path / "pre", command="pytest",
              cli_overrides=pre_overrides)
    assert pre["status"] == "completed" and pre["cost"]["steps"] == 12
    assert {"test/char_acc", "test/seq_acc"} <= set(pre["metrics"]["final"])
    assert {"val/ppl", "val/loss"} <= set(pre["metrics"]["best"])  # the lowest held-out perplexity seen
    assert "STAND-IN" in pre["metric_flavours"]["data"]
    checkpoint = tmp_path / "pre" / "checkpoints" / "last.ckpt"
    multi_overrides = ["experiment=synthesizer/t5/multitask_glue_random", *shared, f"init_from={checkpoint}",
                       "task.at_scale.cpu.max_eval_examples=40", "task.at_scale.cpu.max_val_examples=8"]
    with caplog.at_level("INFO", logger="attnlab"):
        multi = run(compose(multi_overrides, run_dir=tmp_path / "multi"), run_dir=tmp_path / "multi",
                    command="pytest", cli_overrides=multi_overrides)
    assert any(f"initialised weights from {checkpoint}" in r.getMessage() for r in caplog.records)
    assert multi["status"] == "completed"
    final = multi["metrics"]["final"]
    expected = ["test/cola/mcc", "test/sst2/acc", "test/mrpc/f1", "test/mrpc/acc", "test/stsb/pearson",
                "test/stsb/spearman", "test/rte/acc", "test/glue_average"]
    assert all(final.get(k) is not None and math.isfinite(final[k]) for k in expected), final
    assert "test/qqp/f1" not in final and "glue/qqp" in multi["metric_flavours"]["skipped"]
    per_task = [final["test/cola/mcc"], (final["test/mrpc/f1"] + final["test/mrpc/acc"]) / 2, final["test/sst2/acc"],
                (final["test/stsb/pearson"] + final["test/stsb/spearman"]) / 2, final["test/rte/acc"]]
    assert final["test/glue_average"] == pytest.approx(sum(per_task) / 5, abs=1e-4)
    print(f"\nT5 path, tiny: pretrain {pre['cost']['wall_s']} s, multitask {multi['cost']['wall_s']} s, "
          f"total {time.time() - started:.1f} s; pretrain {pre['metrics']['final']}; multitask "
          f"{ {k: round(v, 2) for k, v in final.items() if k.startswith('test/')} }")

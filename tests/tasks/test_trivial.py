"""Trivial baselines (attnlab.tasks.trivial) against references written by hand or with the scoring libraries
directly, on tiny data written here: no shared data needed."""

from __future__ import annotations

from collections import Counter

import pytest
import sacrebleu

from attnlab.tasks.base import DataError
from attnlab.tasks.trivial import BASELINES, _constant_output_scores, compute_baseline, lead_sentences


def test_constant_output_by_hand():
    # position 0: "1" in 4 of 4; position 1: "2" in 3 of 4; position 2: "4" in 1 of 1 -> 8 of 9 target symbols.
    # The most frequent whole target is (1, 2), twice in 4.
    char, seq = _constant_output_scores([[1, 2], [1, 3], [1, 2], [1, 2, 4]])
    assert char == pytest.approx(8 / 9) and seq == pytest.approx(2 / 4)
    # A longer constant only costs where no target reaches: the best length is the one that stops adding wrongs;
    # here every position adds a right symbol, so the whole length counts. Distinct targets: 1 / n.
    assert _constant_output_scores([[5], [6], [7], [8]]) == (0.25, 0.25)


def test_lead_sentences_by_hand():
    text = "Anna: hi!\nBob: are you there? I am.\nAnna: yes. Good.\nBob: bye"
    assert lead_sentences(text) == "Anna: hi!\nBob: are you there?\nI am."
    assert lead_sentences("One. Two. Three. Four.", 2) == "One.\nTwo."


def test_every_baseline_is_registered_for_loaders_that_exist():
    import attnlab.tasks.families  # noqa: F401 - registers the built-in families
    from attnlab.tasks.registry import TASK_FAMILIES

    for name, entry in BASELINES.items():
        assert entry.loaders and set(entry.loaders) <= set(TASK_FAMILIES.names()), name


def test_a_baseline_for_another_loader_is_refused_in_one_line():
    with pytest.raises(DataError, match="'lead_3' applies to task loaders summarization, not 'algorithmic'"):
        compute_baseline("lead_3", {"name": "algo/copy", "loader": "algorithmic"}, 0)
    with pytest.raises(DataError, match="unknown trivial baseline 'nope'"):
        compute_baseline("nope", {"loader": "algorithmic"}, 0)


def _babi_file(path, stories):
    lines = []
    for story, qas in stories:
        n = 0
        for sentence in story:
            n += 1
            lines.append(f"{n} {sentence}")
        for question, answer in qas:
            n += 1
            lines.append(f"{n} {question}\t{answer}\t1")
    path.write_text("\n".join(lines) + "\n")


def test_story_free_answer_by_hand(tmp_path):
    folder = tmp_path / "babi" / "tasks_1-20_v1-2" / "en"
    folder.mkdir(parents=True)
    # Task 1: "Where is Mary?" answered office twice, kitchen once in training -> office; "Where is Bob?" never
    # seen -> the task's most frequent answer (office). Test: Mary->office (right), Mary->garden (wrong),
    # Bob->office (right): error 1/3. The last training story is the validation part (val_fraction 0.25 of 4
    # questions = 1): its "Where is Mary? garden" must not count, or the guess would tie.
    _babi_file(folder / "qa1_single_train.txt", [
        (["Mary went to the office."], [("Where is Mary?", "office")]),
        (["Mary went to the office."], [("Where is Mary?", "office")]),
        (["Mary went to the kitchen."], [("Where is Mary?", "kitchen")]),
        (["Mary went to the garden."], [("Where is Mary?", "garden")]),
    ])  # fmt: skip
    _babi_file(folder / "qa1_single_test.txt", [
        (["Mary went to the office."], [("Where is Mary?", "office"), ("Where is Mary?", "garden")]),
        (["Bob went to the office."], [("Where is Bob?", "office")]),
    ])  # fmt: skip
    # Task 2: a yes/no task answered "no" 2 to 1 -> every test answer "no"; test has 1 no, 3 yes: error 75%.
    _babi_file(folder / "qa2_yes_train.txt", [
        (["x"], [("Is it?", "no"), ("Is it?", "no"), ("Is it?", "yes")]),
    ])  # fmt: skip
    _babi_file(folder / "qa2_yes_test.txt", [(["x"], [("Is it?", "no"), ("Is it?", "yes"), ("Is it?", "yes"),
                                                       ("Is it?", "yes")])])  # fmt: skip
    cfg = {"name": "qa/babi", "loader": "babi", "variant": "en", "tasks": [1, 2], "data_root": str(tmp_path),
           "val_fraction": 0.0}
    got = compute_baseline("story_free_answer", cfg, 1).values
    assert got["test/error_qa1"] == pytest.approx(100 / 3) and got["test/error_qa2"] == pytest.approx(75.0)
    assert got["test/mean_error"] == pytest.approx((100 / 3 + 75) / 2) and got["test/failed_tasks"] == 2
    # with the last quarter of each train file held out for validation, task 1's training answers are
    # office, office, kitchen (garden held out) and task 2's "no, no" (the "yes" held out): same guesses
    held_out = compute_baseline("story_free_answer", {**cfg, "val_fraction": 0.25}, 1).values
    assert held_out["test/mean_error"] == pytest.approx(got["test/mean_error"])


def test_source_copy_is_scored_as_sacrebleu_scores_the_copied_source(tmp_path):
    src = ["A man in a blue shirt .", "Two dogs play in Paris .", "Hello 2019 world"]
    tgt = ["Ein Mann in einem blauen Hemd .", "Zwei Hunde spielen in Paris .", "Hallo 2019 Welt"]
    (tmp_path / "t.en").write_text("\n".join(src) + "\n")
    (tmp_path / "t.de").write_text("\n".join(tgt) + "\n")
    spec = {"source": "local", "format": "lines", "src": "t.en", "tgt": "t.de"}
    cfg = {"name": "mt/x", "loader": "translation", "src_lang": "en", "tgt_lang": "de", "data_root": str(tmp_path),
           "train": spec, "val": spec, "test": spec, "sacrebleu_tokenize": "13a", "tokenized_bleu": True}
    got = compute_baseline("source_copy", cfg, 1).values
    assert got["test/bleu"] == pytest.approx(sacrebleu.corpus_bleu(src, [tgt], tokenize="13a").score, abs=1e-6)
    assert got["test/tok_bleu"] == pytest.approx(sacrebleu.corpus_bleu(src, [tgt], tokenize="none").score, abs=1e-6)
    assert 0 < got["test/bleu"] < 30  # names, numbers and punctuation match; the words do not


def test_majority_class_on_listops_counts_the_training_labels():
    from attnlab.tasks.listops import generate

    cfg = {"name": "lra/listops", "loader": "listops", "train_size": 300, "val_size": 50, "test_size": 200,
           "min_len": 10, "max_len": 60, "max_depth": 3, "max_args": 4, "data_seed": 7}
    got = compute_baseline("majority_class", cfg, 1).values
    train = [v for _, v in generate(300, min_len=10, max_len=60, max_depth=3, max_args=4, seed=7000)]
    test = [v for _, v in generate(200, min_len=10, max_len=60, max_depth=3, max_args=4, seed=7002)]
    majority = Counter(train).most_common(1)[0][0]
    assert got == {"test/acc": pytest.approx(sum(v == majority for v in test) / len(test))}


def test_constant_output_on_the_copy_task_uses_the_test_streams():
    from attnlab.tasks.algorithmic import generate

    cfg = {"name": "algo/copy", "loader": "algorithmic", "op": "copy", "base": 10, "train_size": 20, "val_size": 5,
           "test_size": 60, "train_max_len": 4, "test_min_len": 1, "test_max_len": 40, "data_seed": 3}
    got = compute_baseline("constant_output", cfg, 1).values
    for prefix, (stream, lo, hi) in {"test": (2, 1, 40), "test_train_len": (3, 1, 4), "test_ood": (4, 5, 40)}.items():
        targets = [y for _, y in generate("copy", size=60, min_len=lo, max_len=hi, base=10, seed=3000 + stream)]
        total, right, best = sum(map(len, targets)), 0, 0
        for i in range(max(map(len, targets))):  # the best constant string: the majority digit per position
            right += Counter(t[i] for t in targets if len(t) > i).most_common(1)[0][1]
            best = max(best, right)
        assert got[f"{prefix}/char_acc"] == pytest.approx(best / total)
        assert got[f"{prefix}/seq_acc"] == pytest.approx(Counter(map(tuple, targets)).most_common(1)[0][1] / 60)
    assert got["test/char_acc"] < 0.3  # random digits: about 1 in 10 at long lengths


def test_unigram_perplexity_of_a_tiny_word_corpus_by_hand(tmp_path):
    import math

    (tmp_path / "train.txt").write_text("a a b\n")
    (tmp_path / "test.txt").write_text("a b\n")
    cfg = {"name": "lm/tiny", "loader": "text_lm", "source": "local", "data_root": str(tmp_path),
           "files": {"train": "train.txt", "val": "test.txt", "test": "test.txt"}, "tokenizer": {"kind": "word"},
           "block_len": 2}
    got = compute_baseline("unigram", cfg, 1).values
    # training stream a a b <eos> (4 tokens); vocabulary: the specials, <eos>, a, b. Add-one unigram:
    # p(x) = (count + 1) / (4 + V). Test stream a b <eos>: one block of 2 targets, b and <eos>.
    from attnlab.tasks.vocab import SPECIALS

    vocab = len(SPECIALS) + 3
    p_b, p_eos = (1 + 1) / (4 + vocab), (1 + 1) / (4 + vocab)
    nats = -(math.log(p_b) + math.log(p_eos)) / 2
    assert got == {"test/loss": pytest.approx(nats), "test/ppl": pytest.approx(math.exp(nats))}

"""Multi-task MT (Synthesizer Table 6): pairs trained together with T5 prefixes, scored per member."""

from __future__ import annotations

import pytest
import sacrebleu

from attnlab.tasks import DataError, build_task
from attnlab.tasks.translation_mixture import t5_prefix
from tests.conftest import task_cfg

GERMAN = ["ein hund rennt über die wiese", "zwei kinder spielen im park", "eine frau liest ein buch",
          "der mann kocht das essen", "ein vogel singt am morgen"]
GALICIAN = ["un can corre polo prado", "dous nenos xogan no parque", "unha muller le un libro",
            "o home cociña a comida", "un paxaro canta pola mañá"]
ENGLISH = ["a dog runs over the meadow", "two kids play in the park", "a woman reads a book",
           "the man cooks the food", "a bird sings in the morning"]


def _write(root, rel, lines):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


@pytest.fixture
def laptop_data(tmp_path):
    """The files the laptop mixture reads (Multi30k En-De, TED gl-en), tiny: 40 training pairs each."""
    for split, n in (("train", 8), ("val", 1), ("test_2016_flickr", 1)):
        _write(tmp_path, f"multi30k/{split}.en", ENGLISH * n)
        _write(tmp_path, f"multi30k/{split}.de", GERMAN * n)
    for split, n in (("train", 8), ("dev", 1), ("test", 1)):
        _write(tmp_path, f"ted_gl_en/{split}.en-gl.en.txt", [e + " ." for e in ENGLISH] * n)
        _write(tmp_path, f"ted_gl_en/{split}.en-gl.gl.txt", [g + " &apos;" for g in GALICIAN] * n)
    return tmp_path


def test_laptop_mixture_pools_both_pairs_with_t5_prefixes_and_one_vocabulary(laptop_data):
    cfg = task_cfg("mt/multitask_en_de_fr_ro", laptop_data, "task.tokenizer.vocab_size=200")
    assert cfg["members"]["en_fr"] is None and cfg["members"]["en_ro"] is None  # no local French/Romanian text
    task = build_task(cfg, 0)
    assert len(task.datasets["train"]) == 80 and len(task.datasets["test"]) == 10  # dev splits, 5 + 5
    # sources carry the target language; the reverse-read TED corpus has English sources, Galician targets
    assert task.sources["test"][0] == "translate English to German: a dog runs over the meadow"
    assert task.sources["test"][5] == "translate English to Galician: a dog runs over the meadow ."
    assert task.references["test"][5] == ("en_gl", "un can corre polo prado '")  # entities unescaped
    src, tgt = task.datasets["test"].examples[5]
    assert task.detokenize(tgt) == "un can corre polo prado '"  # one vocabulary spells both languages
    assert "en_de en->de: train 40, val 5" in task.metric_flavours["mixture"]


def test_each_member_is_scored_against_its_own_references():
    task_refs = [("en_de", g) for g in GERMAN] + [("en_gl", g) for g in GALICIAN]
    from attnlab.tasks.translation import MTScorer
    from attnlab.tasks.translation_mixture import MixtureMTScorer

    scorer = MixtureMTScorer(("en_de", "en_gl"), MTScorer())
    hypotheses = GERMAN + ["un can corre polo parque", "dous nenos", "unha muller le un libro", "o home come",
                           "un paxaro canta pola mañá"]
    scores = scorer(hypotheses, task_refs)
    assert scores["en_de/bleu"] == pytest.approx(100.0)
    expected_gl = sacrebleu.corpus_bleu(hypotheses[5:], [GALICIAN]).score
    assert scores["en_gl/bleu"] == pytest.approx(expected_gl)  # not the BLEU of the pooled corpus
    assert scores["en_gl/bleu"] != pytest.approx(sacrebleu.corpus_bleu(hypotheses, [GERMAN + GALICIAN]).score)
    assert scores["bleu_average"] == pytest.approx((100.0 + expected_gl) / 2)


def test_t5_prefix_and_bad_members_are_refused_in_one_line(laptop_data):
    assert t5_prefix("en", "ro") == "translate English to Romanian: "
    with pytest.raises(DataError, match="language code 'xx'"):
        t5_prefix("en", "xx")
    cfg = task_cfg("mt/multitask_en_de_fr_ro", laptop_data)
    with pytest.raises(DataError, match="task.members is empty"):
        build_task({**cfg, "members": {"en_de": None}}, 0)
    with pytest.raises(DataError, match="task.eval_split='dev'"):
        build_task({**cfg, "eval_split": "dev"}, 0)

"""Typed schemas of ``task`` configs, one per loader (checked by ``training.config.validate``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from attnlab.registry import Registry
from attnlab.tasks.base import DataError


@dataclass
class CommonTask:
    # The model a task family trains: "decoder" (a causal LM), "encoder" (a classifier or masked LM, bidirectional)
    # or "encoder_decoder"; the config check builds one attention layer per role of it. None: not checked.
    model_layout: ClassVar[str | None] = None

    name: str
    family: str
    loader: str
    description: str = ""
    paper_metric: Any = None
    decoding: Any = None
    data_seed: Any = None
    at_scale: dict = field(default_factory=dict)

    @classmethod
    def why_no_data(cls, task: Any) -> str | None:
        """Why the task's settings (``task``: the scaled, resolved section) cannot produce its data, checked with
        the config before any folder exists; None when they can."""
        return None


@dataclass
class GeneratedSplits(CommonTask):
    """A task whose examples are generated: how many of each split (the scale presets set them)."""

    train_size: int = 0
    val_size: int = 0
    test_size: int = 0


@dataclass
class AlgorithmicTask(GeneratedSplits):
    model_layout: ClassVar[str | None] = "encoder_decoder"

    op: str = "copy"
    base: int = 10
    train_max_len: int = 40
    test_min_len: int = 1
    test_max_len: int = 400

    @classmethod
    def why_no_data(cls, task: Any) -> str | None:
        base, train_max, test_min, test_max = (task.get(k, getattr(cls, k)) for k in
                                               ("base", "train_max_len", "test_min_len", "test_max_len"))
        if not 2 <= base <= 10:
            return f"task.base={base} must be between 2 and 10 (decimal symbols)"
        if train_max < 1 or test_min < 1:
            return f"task.train_max_len={train_max} and task.test_min_len={test_min} must be at least 1"
        if test_min > test_max:
            return f"task.test_min_len={test_min} is above task.test_max_len={test_max}: no test length exists"
        if test_max < train_max:
            return (f"task.test_max_len={test_max} is below task.train_max_len={train_max}: the test would not "
                    "reach the training lengths")
        return None


@dataclass
class ListOpsTask(GeneratedSplits):
    model_layout: ClassVar[str | None] = "encoder"

    min_len: int = 1
    max_len: int = 2000
    max_depth: int = 10
    max_args: int = 10

    @classmethod
    def why_no_data(cls, task: Any) -> str | None:
        min_len, max_len = task.get("min_len", cls.min_len), task.get("max_len", cls.max_len)
        if not 1 <= min_len <= max_len:
            return f"task.min_len={min_len} and task.max_len={max_len} must satisfy 1 <= min_len <= max_len"
        if task.get("max_depth", cls.max_depth) < 1 or task.get("max_args", cls.max_args) < 2:
            return "task.max_depth must be at least 1 and task.max_args at least 2 (an operator takes two or more)"
        return None


@dataclass
class TextLMTask(CommonTask):
    model_layout: ClassVar[str | None] = "decoder"

    source: str = "local"
    data_root: str = "data"
    files: dict = field(default_factory=dict)
    hub_id: Any = None
    hub_config: Any = None
    hub_text_field: str = "text"
    block_len: int = 128
    max_train_tokens: Any = None
    max_val_tokens: Any = None
    max_test_tokens: Any = None
    # Subword option: tokenizer.kind word (default: the corpus' own words) | bpe; with bpe, ppl is per
    # subword and word_ppl = exp(total NLL / words) is reported too.
    tokenizer: dict = field(default_factory=lambda: {"kind": "word"})
    tokenizer_cache: Any = None
    hub_splits: dict = field(default_factory=lambda: {"train": "train", "val": "validation", "test": "test"})
    stand_in: Any = None


@dataclass
class MaskedLMTask(TextLMTask):
    model_layout: ClassVar[str | None] = "encoder"

    # BERT masking (tasks/masked_lm.py): mask_prob of each block's tokens scored, 80/10/10 <mask>/random/kept.
    block_len: int = 512
    mask_prob: float = 0.15
    masks_per_block: int = 10    # training copies of each block, each with its own mask (RoBERTa: 10)
    eval_seed: int = 0           # evaluation masks: the same for every run and row
    # block: each evaluation block masked on its own from (eval_seed, block index), as BERT; stream: one mask
    # over the whole split's token stream, so rows with different block lengths score the same tokens
    eval_masking: str = "block"
    eval_tokens_multiple: Any = None  # cut evaluation streams to a multiple of this many tokens (e.g. 4096)


@dataclass
class TranslationTask(CommonTask):
    model_layout: ClassVar[str | None] = "encoder_decoder"

    src_lang: str = "en"
    tgt_lang: str = "de"
    data_root: str = "data"
    train: dict = field(default_factory=dict)   # split specs: see tasks/translation.py
    val: dict = field(default_factory=dict)
    test: dict = field(default_factory=dict)
    extra_tests: dict = field(default_factory=dict)
    stand_in: Any = None
    tokenizer: dict = field(default_factory=lambda: {"kind": "bpe", "vocab_size": 8000})
    tokenizer_cache: Any = None
    max_train_pairs: Any = None
    max_eval_pairs: Any = None
    max_src_len: int = 256
    max_tgt_len: int = 256
    sacrebleu_tokenize: str = "13a"
    tokenized_bleu: bool = False
    reference_note: Any = None


@dataclass
class Seq2SeqTextCommon(CommonTask):
    model_layout: ClassVar[str | None] = "encoder_decoder"

    data_root: str = "data"
    source: str = "local"
    files: dict = field(default_factory=dict)
    hub_id: Any = None
    hub_config: Any = None
    hub_splits: dict = field(default_factory=lambda: {"train": "train", "val": "validation", "test": "test"})
    stand_in: Any = None
    tokenizer: dict = field(default_factory=lambda: {"kind": "bpe", "vocab_size": 8000})
    tokenizer_cache: Any = None
    max_train_pairs: Any = None
    max_eval_pairs: Any = None
    max_src_len: int = 512
    max_tgt_len: int = 128


@dataclass
class SummarizationTask(Seq2SeqTextCommon):
    source_field: str = "article"
    target_field: str = "highlights"


@dataclass
class DialogueTask(Seq2SeqTextCommon):
    history_turns: int = 3         # previous utterances kept in the source
    use_persona: bool = True
    split_fractions: dict = field(default_factory=dict)   # {train, val, test} by dialogue id, local copy
    seed_split: int = 0


@dataclass
class BabiTask(CommonTask):
    model_layout: ClassVar[str | None] = "encoder"

    data_root: str = "data"
    variant: str = "en"               # en (1k) | en-10k
    tasks: Any = "all"                # "all" or a list of task ids 1..20
    joint: bool = True                # one model on all listed tasks; false: exactly one task per run
    val_fraction: float = 0.1
    max_story_sentences: Any = None
    max_questions_per_task: Any = None
    tokenizer_cache: Any = None


@dataclass
class GlueTask(CommonTask):
    model_layout: ClassVar[str | None] = "encoder"

    data_root: str = "data"
    source: str = "local"
    files: dict = field(default_factory=dict)       # {train, val, ...}: relative paths
    format: str = "tsv"                             # tsv | jsonl | wic
    header: bool = True
    text_fields: list = field(default_factory=list)  # column names / indices, or (dotted) JSON keys
    label_field: Any = "label"
    label_values: Any = None                        # class labels in order; null: regression (STS-B)
    hub_id: Any = None
    hub_config: Any = None
    hub_splits: dict = field(default_factory=lambda: {"train": "train", "val": "validation"})
    hub_text_fields: list = field(default_factory=list)
    hub_label_field: str = "label"
    metrics: list = field(default_factory=lambda: ["acc"])
    eval_splits: dict = field(default_factory=lambda: {"test": "val"})
    holdout_fraction: Any = None
    seed_split: int = 0
    stand_in: Any = None
    tokenizer: dict = field(default_factory=lambda: {"kind": "wordpiece", "vocab_size": 8000, "lowercase": True})
    tokenizer_cache: Any = None
    max_seq_len: int = 128
    max_train_examples: Any = None
    max_eval_examples: Any = None                   # cap per evaluation split (multirc/record: whole groups)
    # classify: one label per example | multirc: binary per answer option, EM per question + F1a |
    # record: candidate-entity scoring, argmax per query, max-over-gold F1 / EM
    scheme: str = "classify"


@dataclass
class LambadaTask(CommonTask):
    model_layout: ClassVar[str | None] = "decoder"

    data_root: str = "data"
    lm_files: dict = field(default_factory=dict)      # {train, val}: the LM corpus
    lm_corpus_name: str = ""
    eval_files: dict = field(default_factory=dict)    # {metric prefix: passages file}
    tokenizer: dict = field(default_factory=lambda: {"kind": "bpe", "vocab_size": 8000})
    tokenizer_cache: Any = None
    block_len: int = 256
    max_train_tokens: Any = None
    max_eval_passages: Any = None


@dataclass
class LteTask(GeneratedSplits):
    model_layout: ClassVar[str | None] = "encoder_decoder"

    variant: str = "program"          # program | control | addition | copy | double | reverse
    operations: Any = None            # program operations to draw from; null: the variant's own set
    length: int = 5                   # digits of the numbers (memorization: of the number to copy)
    nesting: int = 2                  # operations composed per program
    strategy: str = "mix"             # mix (UT: no curriculum) | baseline (always length/nesting)

    @classmethod
    def why_no_data(cls, task: Any) -> str | None:
        length, nesting = task.get("length", cls.length), task.get("nesting", cls.nesting)
        if length < 1 or nesting < 1:
            return f"task.length={length} and task.nesting={nesting} must be at least 1"
        return None


@dataclass
class SvaTask(CommonTask):
    model_layout: ClassVar[str | None] = "encoder"

    data_root: str = "data"
    source: str = "hub"               # hub | local
    files: dict = field(default_factory=dict)   # {all: tsv} (split by split_fractions) or {train, val, test}
    hub_id: Any = None                # no public hub copy is known: null, and the loader says what to do
    hub_config: Any = None
    hub_split: str = "train"
    text_field: str = "sentence"      # Linzen's columns: sentence (10K-word vocabulary) | orig_sentence
    split_fractions: dict = field(default_factory=lambda: {"train": 0.09, "val": 0.01, "test": 0.9})
    seed_split: int = 0
    max_examples: Any = None          # cap per split after splitting (cpu scale)
    max_attractors: int = 5           # acc_attractors_0..max_attractors are reported
    only_attractors: bool = True      # per-attractor accuracy on sentences whose intervening nouns are all attractors
    tokenizer: dict = field(default_factory=lambda: {"kind": "word", "vocab_size": 0, "min_frequency": 1})
    tokenizer_cache: Any = None


@dataclass
class LraBytesTask(CommonTask):
    model_layout: ClassVar[str | None] = "encoder"

    data_root: str = "data"
    source: str = "local"             # local | hub (lra_text only)
    format: str = "aclimdb"           # lra_text: aclimdb (Stanford release folders); lra_retrieval: aan_tsv
    files: dict = field(default_factory=dict)
    hub_id: Any = None
    hub_config: Any = None
    hub_splits: dict = field(default_factory=lambda: {"train": "train", "val": "test", "test": "test"})
    hub_text_field: str = "text"
    hub_label_field: str = "label"
    max_len: int = 4000               # bytes per document (retrieval: per side)
    max_train_examples: Any = None
    max_eval_examples: Any = None
    seed_split: int = 0



@dataclass
class SpanCorruptionTask(CommonTask):
    model_layout: ClassVar[str | None] = "encoder_decoder"

    """T5 span-corruption pre-training (tasks/span_corruption.py)."""

    data_root: str = "data"
    source: str = "hub"               # hub (C4, streamed) | local (one document per line)
    files: dict = field(default_factory=dict)       # {train, val, test}: local text files
    hub_id: Any = None
    hub_config: Any = None
    hub_splits: dict = field(default_factory=lambda: {"train": "train", "val": "validation", "test": "validation"})
    hub_text_field: str = "text"
    max_train_documents: Any = None   # documents read (a streamed hub corpus needs a number)
    max_eval_documents: Any = None    # per evaluation split
    noise_density: float = 0.15       # T5: 15% of the tokens are noise
    mean_noise_span_length: float = 3.0
    input_length: int = 512           # inputs after corruption, EOS included (T5: 512 -> chunks of 568, targets 114)
    masks_per_chunk: int = 1          # differently corrupted copies of each training chunk per epoch
    max_train_chunks: Any = None
    max_eval_chunks: Any = None
    eval_seed: int = 0                # masks of the evaluation splits (the same for every run)
    vocabulary: dict = field(default_factory=dict)  # shared with the text-to-text tasks (see text_to_text.py)
    tokenizer_cache: Any = None
    stand_in: Any = None


@dataclass
class TextToTextTask(CommonTask):
    model_layout: ClassVar[str | None] = "encoder_decoder"

    """GLUE / SuperGLUE tasks in T5's text-to-text form, one task or a mixture (tasks/text_to_text.py)."""

    data_root: str = "data"
    benchmark: str = "glue"           # names the average: test/<benchmark>_average
    members: dict = field(default_factory=dict)     # {short name: a glue/superglue task config}
    tasks: Any = None                 # the members to use (null: all)
    skip_unavailable: bool = True     # hub-only members are skipped (and listed) when the hub is unreachable
    mixing: dict = field(default_factory=lambda: {"temperature": 1.0, "cap": None, "epoch_examples": None,
                                                  "seed": None})
    vocabulary: dict = field(default_factory=dict)
    tokenizer_cache: Any = None
    input_length: int = 512           # inputs cut to input_length - 1 tokens + EOS (T5: 512)
    target_length: int = 16           # label words are a few tokens; longer targets are an error
    max_val_examples: Any = None      # per member, for validation during training
    max_eval_examples: Any = None     # per member evaluation split (test/*)
    note: Any = None                  # what the mixture leaves out of the paper's benchmark (metric_flavours.coverage)


@dataclass
class TranslationMixtureTask(CommonTask):
    model_layout: ClassVar[str | None] = "encoder_decoder"

    """Several translation pairs trained together, T5-style prefixes (tasks/translation_mixture.py)."""

    data_root: str = "data"
    members: dict = field(default_factory=dict)       # key -> a translation task config (null: left out)
    eval_split: str = "val"                           # val (dev-set numbers, as Synthesizer Table 6) | test
    tokenizer: dict = field(default_factory=lambda: {"kind": "bpe", "vocab_size": 32000})
    tokenizer_cache: Any = None
    max_eval_pairs: Any = None                        # per member
    max_src_len: int = 256
    max_tgt_len: int = 256
    sacrebleu_tokenize: str = "13a"
    tokenized_bleu: bool = False
    stand_in: Any = None


@dataclass
class ProbeTask(CommonTask):
    model_layout: ClassVar[str | None] = "encoder"

    """Mechanism probes (tasks/probes.py): one generated token-tagging task per op."""

    op: str = "recall"                 # recall | copy | reverse | hops
    length: int = 512                  # tokens per example
    train_size: int = 1_000_000        # examples are drawn on access, so size costs no memory
    val_size: int = 256
    test_size: int = 1000
    num_fillers: int = 4               # filler symbols between facts and queries
    num_keys: int = 32                 # recall: keys; hops: nodes on the cycle
    num_values: int = 16               # recall: values
    num_pairs: int = 16                # recall: facts per example
    num_queries: int = 16              # recall, hops: queries per example
    context_fraction: float = 0.25     # recall: facts in the first, queries in the last fraction of the sequence
    end_fillers: int = 0               # recall: positions at either end holding filler only (facts, queries inward)
    num_symbols: int = 16              # copy, reverse: symbols
    max_hops: int = 4                  # hops: a query asks for 1..max_hops edges


# What each task family declares to the floors above: its config keys, their defaults and ``model_layout``.
TASK_SCHEMAS: Registry[type] = Registry("task loader", DataError)
for _loader, _schema in {
    "algorithmic": AlgorithmicTask, "probe": ProbeTask, "listops": ListOpsTask, "text_lm": TextLMTask,
    "masked_lm": MaskedLMTask, "translation": TranslationTask, "summarization": SummarizationTask,
    "dialogue": DialogueTask, "babi": BabiTask, "glue": GlueTask, "lambada": LambadaTask, "lte": LteTask,
    "sva": SvaTask, "lra_text": LraBytesTask, "lra_retrieval": LraBytesTask, "span_corruption": SpanCorruptionTask,
    "text_to_text": TextToTextTask, "translation_mixture": TranslationMixtureTask,
}.items():
    TASK_SCHEMAS.register(_loader, _schema)


def register_schema(loader: str, schema: type) -> None:
    import dataclasses

    if not (dataclasses.is_dataclass(schema) and issubclass(schema, CommonTask)):
        raise TypeError(f"the schema of task loader {loader!r} must be a dataclass subclassing CommonTask")
    TASK_SCHEMAS.register(loader, schema)


def task_schema(loader: str) -> type:
    return TASK_SCHEMAS.get(loader)


def with_defaults(cfg: dict[str, Any]) -> dict[str, Any]:
    """``cfg`` with the schema's default for every key it leaves out (loaders then index keys directly)."""
    import dataclasses

    if cfg.get("loader") not in TASK_SCHEMAS:
        return cfg
    schema = TASK_SCHEMAS.get(cfg["loader"])
    out = dict(cfg)
    for f in dataclasses.fields(schema):
        if f.name not in out:
            if f.default is not dataclasses.MISSING:
                out[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                out[f.name] = f.default_factory()
    return out

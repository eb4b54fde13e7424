"""The comparison rules of every reproduced table (experiments/<paper>/README.md), checked on the presets.

1. Same hyperparameters across rows: two rows of one table (within one comparison group, e.g. one task)
   may differ only in the config keys the table's rule lists (the variable under study), at every scale
   (cpu, paper, and gpu where the table has a one-GPU protocol).
2. Equal size where the paper compares at equal size: every row's parameter count is within the stated
   tolerance of the reference row, counted on the model actually built (``build_module``) at scale=cpu
   and, where the data builds offline, at scale=paper. Exemptions carry their reason, and a test checks
   that each exemption is still needed.
"""

from __future__ import annotations

import copy
import fnmatch
import functools
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from omegaconf import OmegaConf, open_dict

from attnlab.training.config import validate
from tests.experiments.paper_presets import gpu_tables, presets, probe_dirs, table_dirs

ALWAYS_DIFFER = ("experiment_name", "row", "run_name")


@dataclass(frozen=True)
class Rule:
    group_by: str | None  # config key splitting the rows into groups compared among themselves
    may_differ: tuple[str, ...]  # fnmatch patterns over dotted config keys: the variable under study
    params_within: float | None = None  # max |params - reference| / reference; None: sizes differ by design
    reference: str | None = None  # preset stem (or suffix) of the reference row of each group
    exempt: dict[str, str] = field(default_factory=dict)  # preset -> why the size rule does not apply
    size_scales: tuple[str, ...] = ("cpu", "paper")  # where the size rule holds (cpu sizes may not keep it)


# QKNorm: per language pair, baseline and QKNorm share every hyperparameter; QKNorm adds one scalar g per
# attention module, so the sizes match. That difference does not depend on the model's size, so the (cheap)
# cpu-scale models check it.
QKNORM_PAIR_RULE = Rule(
    group_by="task.name",
    may_differ=("model.attention", "model.attention.*"),
    params_within=0.10,
    reference="baseline",
    size_scales=("cpu",),
)

# UT rows (Transformer, UT, UT + ACT of one size): only the recurrence and the model preset's name change; the
# UT shares one layer, so it is smaller by design. Per task (Table 4, the probes) or per task variant (bAbI's
# columns, Learning to Execute); a pre-registered fixed-n table keeps the rule of the table it reruns.
UT_RECURRENCE_ONLY = ("model.name", "model.recurrence", "model.recurrence.*")
UT_PER_TASK_RULE = Rule(group_by="task.name", may_differ=UT_RECURRENCE_ONLY)
UT_PER_VARIANT_RULE = Rule(group_by="task.variant", may_differ=UT_RECURRENCE_ONLY)

RULES: dict[str, Rule] = {
    # The UT paper compares a Transformer and a UT of the same layer size on each task (T2T transformer_tiny
    # vs universal_transformer_tiny); the UT shares one layer, so its parameter count is smaller by design.
    "ut/table4": UT_PER_TASK_RULE,
    # LRA apples-to-apples: same hyperparameters, only the attention changes; parameters within 10%.
    "lra/table1": Rule(
        group_by="task.name",
        may_differ=("model.attention", "model.attention.*"),
        params_within=0.10,
        reference="transformer_listops",
        exempt={
            "lra/table1/synthesizer_listops": "the random synthesizer's per-head l x l matrix R (H l^2 per layer) "
            "is the mechanism itself; LRA's own Synthesizer has it too",
        },
    ),
    # UT Table 7: "all base models have the same number of parameters" (Transformer base vs UT base, whose
    # shared layer is widened for that); T2T's learning rate scales with d_model^-0.5, so optim.lr follows
    # the width. The laptop protocol widens UT base too (d 160 against the Transformer's d 128), so the size
    # rule holds at both scales: without it the laptop table would compare a smaller UT with a larger
    # Transformer and could not test the paper's equal-size claim.
    "ut/table7": Rule(
        group_by="task.name",
        may_differ=(*UT_RECURRENCE_ONLY, "model.d_model", "model.num_heads",
                    "model.d_ff", "model.dropout", "model.encoder_layers", "model.decoder_layers", "optim.lr"),
        params_within=0.10,
        reference="transformer_base",
        exempt={"ut/table7/ut_small": "UT small is transformer_base-sized with one shared layer: smaller by design"},
    ),
    # Synthesizer Tables 2/6/7: one setup, only the attention (Table 2), the head count (Table 6) or the
    # synthesizing function (Table 7) changes; parameter counts differ by design (Table 2 prints them).
    "synthesizer/table2": Rule(group_by="task.name", may_differ=("model.attention", "model.attention.*")),
    "synthesizer/fixed_table2": Rule(group_by="task.name", may_differ=("model.attention", "model.attention.*")),
    "synthesizer/table6": Rule(group_by="task.name", may_differ=("model.num_heads",)),
    "synthesizer/table7": Rule(group_by="task.name", may_differ=("model.attention.synthesizer_fn",)),
    # Synthesizer Tables 3-5 (summarization/dialogue; GLUE and SuperGLUE dev, trained from scratch here): per
    # task, one setup and only the attention changes; parameter counts differ by design, as in Table 2.
    "synthesizer/table3": Rule(group_by="task.name", may_differ=("model.attention", "model.attention.*")),
    "synthesizer/table4": Rule(group_by="task.name", may_differ=("model.attention", "model.attention.*")),
    "synthesizer/table5": Rule(group_by="task.name", may_differ=("model.attention", "model.attention.*")),
    # UT Table 1 (bAbI, per column 10k / 1k joint): Transformer, UT and UT+ACT of T2T's tiny size share everything
    # but the recurrence (and the model preset's name); the UT shares one layer, so it is smaller by design. The
    # columns train on different data (en-10k / en) at every scale.
    "ut/table1": UT_PER_VARIANT_RULE,
    # UT Tables 5-6 (Learning to Execute, per task variant): Table 4's tiny Transformer vs UT, only the recurrence.
    "ut/table5": UT_PER_VARIANT_RULE,
    "ut/fixed_table5": UT_PER_VARIANT_RULE,
    "ut/fixed_table4": UT_PER_TASK_RULE,
    "ut/fixed_table6": UT_PER_VARIANT_RULE,
    "ut/fixed2_table6": UT_PER_VARIANT_RULE,
    "ut/table6": UT_PER_VARIANT_RULE,
    # UT Table 3 (LAMBADA): T2T transformer_base vs universal_transformer_base (fixed 6/8/9 steps, ACT): sizes,
    # dropout and T2T's width-scaled learning rate follow the model; no equal-size claim in the paper.
    "ut/table3": Rule(
        group_by="task.name",
        may_differ=(*UT_RECURRENCE_ONLY, "model.d_model", "model.num_heads",
                    "model.d_ff", "model.dropout", "model.encoder_layers", "model.decoder_layers", "optim.lr"),
    ),
    "qknorm/table1": QKNORM_PAIR_RULE,
    "qknorm/fixed_table1": QKNORM_PAIR_RULE,  # the gl-en presets of qknorm/table1 under the pre-registered names
    # BigBird Table 1: one masked-LM setup at length 512, only the attention pattern changes (full, random,
    # window, random + window); the sparse patterns reuse the dense projections, so sizes are equal by design.
    "bigbird/table1": Rule(group_by="task.name", may_differ=("model.attention", "model.attention.*")),
    # BigBird Table 10: full attention at 512 vs BigBird-ITC at 2048 / 4096. The sequence length and the
    # sequences per update change together (equal tokens per update, tests/experiments/test_sparse_protocols.py);
    # learned position tables grow with the length.
    "bigbird/table10": Rule(
        group_by="task.name",
        may_differ=("model.attention", "model.attention.*", "task.block_len", "batch.sentences_per_update",
                    "batch.eval_batch_size", "at_scale.cpu.batch.sentences_per_update",
                    "at_scale.cpu.batch.eval_batch_size"),
    ),
    # Mechanism probes (experiments/probes/README.md): per task, one protocol and only the mechanism changes.
    "probes/synthesizer": Rule(group_by="task.name", may_differ=("model.attention", "model.attention.*")),
    "probes/bigbird": Rule(group_by="task.name", may_differ=("model.attention", "model.attention.*")),
    # QKNorm: a learning-rate sweep, so the rate differs too; QKNorm adds one scalar g per attention module.
    "probes/qknorm": Rule(group_by="task.name", may_differ=("model.attention", "model.attention.*", "optim.lr")),
    # The UT shares one layer (smaller by design) and adds its own coordinate embedding; ACT adds a halting unit.
    "probes/ut": UT_PER_TASK_RULE,
    # The redesigned probes (issue 53): BigBird's rows at 2 and at 4 layers; UT's rows as probes/ut.
    "probes/bigbird2": Rule(group_by="task.name",
                            may_differ=("model.attention", "model.attention.*", "model.encoder_layers")),
    "probes/ut2": UT_PER_TASK_RULE,
}


def _flat(node, prefix="") -> dict:
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out or {prefix[:-1]: {}}
    return {prefix[:-1]: node}


@functools.cache
def _table_configs(table: str, scale: str) -> dict:
    """Every preset of ``table`` composed as the CLI does (scale applied, validated), under ONE Hydra
    initialisation: re-initialising per preset costs about 1 s each, which adds up over ~60 presets."""
    from tests.conftest import compose

    out = {}
    for experiment in presets(table):
        # The same override list as tests/test_config.py, so the session cache composes each preset once.
        cfg = compose([f"experiment={experiment}", f"scale={scale}"], run_dir=Path("/tmp/attnlab-rules"))
        validate(cfg)
        out[experiment] = cfg
    return out


def _config(experiment: str, scale: str):
    return _table_configs(experiment.rsplit("/", 1)[0], scale)[experiment]


def _plain(experiment: str, scale: str) -> dict:
    plain = OmegaConf.to_container(_config(experiment, scale), resolve=True)
    plain.pop("paths", None)
    # at_scale blocks are inputs: at scale=cpu they are already merged into the effective values compared
    # here, at scale=paper they are unused. Comparing them too would only repeat those differences.
    plain.pop("at_scale", None)  # the root block (laptop protocols), likewise
    for section in ("model", "task"):
        plain[section].pop("at_scale", None)
    return _flat(plain)


def _groups(table: str, rule: Rule, scale: str) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for experiment in presets(table):
        key = str(OmegaConf.select(_config(experiment, scale), rule.group_by)) if rule.group_by else "all"
        groups.setdefault(key, []).append(experiment)
    return groups


def test_every_table_with_presets_states_its_rules():
    missing = [t for t in [*table_dirs(), *probe_dirs()] if t not in RULES]
    assert not missing, f"add the comparison rules of {missing} to RULES (and to experiments/<paper>/README.md)"


CASES = [(t, s) for t in RULES if t in [*table_dirs(), *probe_dirs()] for s in ("cpu", "paper")]
CASES += [(t, "gpu") for t in RULES if t in gpu_tables()]  # the one-GPU protocols keep the rules too


@pytest.mark.parametrize(("table", "scale"), CASES, ids=[f"{t}-{s}" for t, s in CASES])
def test_rows_share_every_hyperparameter_but_the_one_under_study(table, scale):
    rule = RULES[table]
    allowed = (*ALWAYS_DIFFER, *rule.may_differ)
    for group, members in _groups(table, rule, scale).items():
        assert len(members) >= 2, f"{table} [{group}]: a comparison needs at least two rows, got {members}"
        first = _plain(members[0], scale)
        for other in members[1:]:
            second = _plain(other, scale)
            keys = first.keys() | second.keys()
            differing = sorted(k for k in keys if first.get(k, "<absent>") != second.get(k, "<absent>"))
            bad = [k for k in differing if not any(fnmatch.fnmatchcase(k, p) for p in allowed)]
            studied = [k for k in differing if k not in ALWAYS_DIFFER]
            assert studied, f"{table} at scale={scale}: {members[0]} and {other} are the same config"
            assert not bad, (
                f"{table} at scale={scale}: {members[0]} and {other} differ in {bad} "
                f"(e.g. {bad[0]}: {first.get(bad[0])!r} vs {second.get(bad[0])!r}); only {rule.may_differ} may"
            )


@functools.cache
def _params(experiment: str, scale: str) -> int:
    from attnlab.tasks import DataError
    from attnlab.training.build import build_module, build_task_data
    from attnlab.training.modules import count_parameters

    cfg = _config(experiment, scale)
    if cfg.task.get("loader") == "translation":
        task = _translation_stub(cfg)  # vocabulary from the tokenizer config: no corpus, no hub
    else:
        # Tiny splits: the parameter count depends on the vocabulary and max_len, which the config fixes.
        cfg = copy.deepcopy(cfg)
        with open_dict(cfg):
            cfg.task.update(train_size=4, val_size=2, test_size=2)
        try:
            task = build_task_data(cfg)
        except (DataError, FileNotFoundError) as exc:
            pytest.skip(f"{experiment} at scale={scale}: data not available offline ({str(exc).splitlines()[0][:120]})")
    return int(count_parameters(build_module(cfg, task).model)["total"])


def _translation_stub(cfg):
    """A seq2seq TaskData without data: the configured joint vocabulary and the configured length bound.

    Only unbounded attentions (vanilla, qknorm, UT) are size-checked this way; their parameter count does
    not depend on max_len (sinusoidal positions are a buffer), only on the vocabulary.
    """
    from attnlab.tasks import TaskData

    tok = cfg.task.tokenizer
    assert tok.joint, "the stub assumes one joint vocabulary (share_embeddings)"
    length = max(int(cfg.task.max_src_len), int(cfg.task.max_tgt_len)) + 2
    return TaskData(kind="seq2seq", datasets={}, collate=lambda batch: batch, vocab_size=int(tok.vocab_size),
                    pad_id=0, max_len=length)


# At scale=gpu the size rule holds where it holds at the paper's scale (the one-GPU protocols keep the paper's sizes),
# and the local data lets it be counted where the paper's hub data cannot be built offline (UT Table 7).
SIZE_CASES = [(t, s) for t, s in CASES if RULES[t].params_within is not None
              and (s in RULES[t].size_scales or (s == "gpu" and "paper" in RULES[t].size_scales))]


@pytest.mark.parametrize(("table", "scale"), SIZE_CASES, ids=[f"{t}-{s}" for t, s in SIZE_CASES])
def test_parameter_counts_are_within_the_tolerance_of_the_reference_row(table, scale):
    rule = RULES[table]
    for group, members in _groups(table, rule, scale).items():
        ref = next((m for m in members if m.rsplit("/", 1)[1].startswith(rule.reference)), None)
        assert ref, f"{table} [{group}]: no reference row {rule.reference!r} among {members}"
        base = _params(ref, scale)
        for other in members:
            if other == ref or other in rule.exempt:
                continue
            n = _params(other, scale)
            assert abs(n - base) <= rule.params_within * base, (
                f"{table} at scale={scale}: {other} has {n:,} parameters, {ref} {base:,} "
                f"({(n - base) / base:+.1%}; the rule allows +-{rule.params_within:.0%})"
            )


EXEMPT_CASES = [(t, e) for t, r in RULES.items() if t in table_dirs() for e in r.exempt]


@pytest.mark.parametrize(("table", "experiment"), EXEMPT_CASES, ids=[e for _, e in EXEMPT_CASES])
def test_size_exemptions_are_still_needed(table, experiment):
    rule = RULES[table]
    assert experiment in presets(table), f"stale exemption: no preset {experiment}"
    group = next(m for m in _groups(table, rule, rule.size_scales[0]).values() if experiment in m)
    scale = rule.size_scales[0]
    ref = next(m for m in group if m.rsplit("/", 1)[1].startswith(rule.reference))
    n, base = _params(experiment, scale), _params(ref, scale)
    assert abs(n - base) > rule.params_within * base, f"{experiment} now meets the size rule: drop its exemption"

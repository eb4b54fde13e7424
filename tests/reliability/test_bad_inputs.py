"""The bad-input corpus: every case exits non-zero with one clear line on stderr, no traceback, and
nothing under results/. Most run in-process (fast); a few go through real subprocesses so the console
entry points themselves are covered."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnlab.cli.evaluate import main as eval_main
from attnlab.cli.table import main as table_main
from attnlab.cli.train import main as train_main
from tests.conftest import TINY, TINY_ALGO
from tests.reliability.helpers import one_clear_line, run_cli

MAINS = {"train": train_main, "eval": eval_main, "table": table_main}
MODULES = {"train": "attnlab.train", "eval": "attnlab.cli.evaluate", "table": "attnlab.cli.table"}
FAST = [*TINY, *TINY_ALGO]

# (tool, arguments, fragment of the one line, run as a subprocess)
CASES = [
    # unknown options and misspelled keys
    ("train", ["model/attention=nonexistent"], "valid options of model/attention", True),
    ("train", ["trainer.max_stpes=3"], "trainer.max_stpes", False),
    ("train", ["resum=auto"], "resum", False),
    ("train", ["task=algo/nope"], "valid options of task: algo/addition, algo/copy, algo/reverse", False),
    ("train", ["task=nope"], "valid options of task: algo/addition, algo/copy", False),
    ("train", ["task=superglue/multirx"], "valid options of task: superglue/boolq, superglue/cb", False),
    # wrong types and values
    ("train", ["model.d_model=wide"], "model.d_model", False),
    ("train", ["trainer.max_steps=1.5"], "trainer.max_steps", False),
    ("train", ["optim.lr=-1"], "optim.lr=-1 must be positive", False),
    ("train", ["hardware.precision=17"], "hardware.precision", False),
    ("train", ["resume=sometimes"], "valid: auto, never", False),
    ("train", ["task.decoding.length_penalty=wu"], "task.decoding.length_penalty='wu' is not valid; valid: gnmt, "
                                                    "fairseq", False),
    ("train", ["nan_policy=ignore"], "valid: stop, skip", False),
    ("train", ["max_skipped_batches=-1"], "non-negative integer", False),
    ("train", ["callbacks.checkpoint.every_n_steps=0"], "positive integer or null", False),
    # impossible combinations
    ("train", ["model/attention=synth_dense", "model.cross_attention={name:synth_dense}"],
     "cannot be used for cross-attention", False),
    ("train", ["model.max_len=8"], "model.max_len=8", False),
    ("train", ["model.d_model=64", "model.num_heads=3"], "not divisible by model.num_heads=3", False),
    ("train", ["init_from={garbage}", "ckpt_path={garbage}"], "exclusive", False),
    ("train", ["resume=never", "ckpt_path={garbage}"], "resume=never", False),
    # missing or corrupt data files, unreachable hub data
    ("train", ["task=lm/wikitext2", "paths.data_root={empty}"], "not found under", False),
    ("train", ["task=lm/wikitext2", "paths.data_root={notgz}"], "cannot read data file", False),
    ("train", ["task=lm/wikitext2", "paths.data_root={badgz}"], "cannot read data file", False),
    ("train", ["task=lm/wikitext2", "task.source=hub"], "unreachable (offline)", False),
    # missing, corrupt and unsafe checkpoints
    ("train", ["ckpt_path={tmp}/missing.ckpt"], "no such file", False),
    ("train", ["ckpt_path={garbage}"], "is corrupt", False),
    ("train", ["ckpt_path={trunc}"], "corrupt or truncated", False),
    ("train", ["init_from={unsafe}"], "needs arbitrary unpickling", False),
    ("train", ["init_from={tensor}"], "not a checkpoint dict", False),
    ("train", ["init_from={run}/checkpoints/last.ckpt", "model.d_ff=96"], "does not match this model", False),
    # a checkpoint of another model to resume from: said before training, not as Lightning's traceback
    ("train", ["ckpt_path={run}/checkpoints/last.ckpt", "model.d_ff=96"], "does not match this model: model.", False),
    ("train", ["ckpt_path={run}/checkpoints/last.ckpt", "task=lm/wikitext2", "paths.data_root={lm_data}"],
     "does not match this model (missing", False),
    ("train", ["hydra.run.dir={afile}/run"], "is a file", False),
    ("eval", ["{garbage}"], "is corrupt", True),
    ("eval", ["{broken}"], "corrupt or truncated", False),
    ("eval", ["{empty}"], "has no checkpoints/last.ckpt", False),
    ("eval", [], "give a run folder or a checkpoint", False),
    ("eval", ["{run}", "which=worst"], "which='worst'", False),
    # the run's weights under another model: a subprocess, so the progress lines are seen to stay off stderr
    ("eval", ["{run}", "model.d_ff=96"], "checkpoints/last.ckpt does not match this model: ", True),
    ("eval", ["{run}", "model=transformer_small"], "not a whole config group", False),
    # run records that do not parse
    ("table", ["table=summary", "runs={corrupt_runs}"], "corrupt run record", True),
]


class Opaque:
    """Anything but tensors and plain containers needs arbitrary unpickling."""


@pytest.fixture(scope="module")
def files(trained_run, tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    (root / "empty").mkdir()
    (root / "badgz" / "wikitext2").mkdir(parents=True)
    (root / "notgz" / "wikitext2").mkdir(parents=True)
    for split in ("train", "valid", "test"):
        # a gzip header over a damaged stream, and a file that is not gzip at all
        (root / "badgz" / "wikitext2" / f"wiki.{split}.tokens.gz").write_bytes(b"\x1f\x8b\x08 not gzip after all")
        (root / "notgz" / "wikitext2" / f"wiki.{split}.tokens.gz").write_bytes(b"plain text, not gzip")
    (root / "lm_data" / "wikitext2").mkdir(parents=True)
    for split in ("train", "valid", "test"):  # a small but sound language-modelling corpus
        text = "".join(f" the cat number {i} sat on the mat .\n" for i in range(40))
        (root / "lm_data" / "wikitext2" / f"wiki.{split}.tokens.gz").write_bytes(gzip.compress(text.encode()))
    (root / "garbage.ckpt").write_bytes(os.urandom(512))
    last = trained_run / "checkpoints" / "last.ckpt"
    (root / "trunc.ckpt").write_bytes(last.read_bytes()[: last.stat().st_size // 3])
    torch.save({"state_dict": {}, "callback": Opaque()}, root / "unsafe.ckpt")
    torch.save(torch.zeros(3), root / "tensor.ckpt")
    shutil.copytree(trained_run, root / "broken")
    (root / "broken" / "checkpoints" / "last.ckpt").write_bytes(last.read_bytes()[:1000])
    (root / "afile").write_text("not a folder")
    (root / "corrupt_runs" / "job").mkdir(parents=True)
    (root / "corrupt_runs" / "job" / "results.json").write_text('{"status": "compl')
    names = ("empty", "lm_data", "badgz", "notgz", "garbage.ckpt", "trunc.ckpt", "unsafe.ckpt", "tensor.ckpt",
             "broken", "afile", "corrupt_runs")
    return {"run": str(trained_run), **{n.split(".")[0]: str(root / n) for n in names}}


def _argv(tool: str, args: list[str], files: dict[str, str], tmp_path: Path) -> list[str]:
    def fill(arg: str) -> str:
        for key, value in {"tmp": str(tmp_path), **files}.items():
            arg = arg.replace("{" + key + "}", value)
        return arg

    args = [fill(a) for a in args]
    if tool == "train":
        run_dir = [] if any(a.startswith("hydra.run.dir=") for a in args) else [f"hydra.run.dir={tmp_path / 'run'}"]
        base = TINY if any(a.startswith("task=") for a in args) else FAST  # FAST sizes the algorithmic task
        return [*base, *args, *run_dir]
    return args


def _case_id(case) -> str:
    tool, args = (case.values if hasattr(case, "values") else case)[:2]
    return f"{tool}:{' '.join(args) or '(none)'}"


def test_the_corpus_is_big_enough():
    assert len(CASES) >= 25


@pytest.mark.parametrize(("tool", "args", "fragment", "subprocess_"), CASES,
                         ids=[_case_id(c) for c in CASES])
def test_bad_input_is_refused_with_one_clear_line(tool, args, fragment, subprocess_, files, tmp_path, monkeypatch,
                                                  capsys):
    monkeypatch.chdir(tmp_path)
    argv = _argv(tool, args, files, tmp_path)
    if subprocess_:
        env = {**os.environ, "HYDRA_FULL_ERROR": "0", "WANDB_MODE": "offline", "HF_DATASETS_OFFLINE": "1"}
        proc = subprocess.run([sys.executable, "-m", MODULES[tool], *argv], capture_output=True, text=True,
                              timeout=300, cwd=tmp_path, env=env)
        code, err = proc.returncode, proc.stderr
    else:
        code, err = run_cli(MAINS[tool], argv, capsys)
    assert code not in (0, None), err
    line = one_clear_line(err)
    assert fragment in line, line
    results = tmp_path / "results"
    assert not results.exists() or not any(results.rglob("*")), "nothing may be written under results/"
    for partial in tmp_path.rglob("*.tmp*"):
        pytest.fail(f"partial file left behind: {partial}")


# -- bad data files through the CLI: one line naming the file (and line), exit 2, and the run folder holds at
# most a complete failed record (data is read after Hydra made the folder; nothing half-written, no checkpoint)
GOOD_CB = '{"premise": "p", "hypothesis": "h", "label": "neutral"}\n'
MT_EVAL = {f"multi30k/{name}.{lang}": "ein satz\n" if lang == "de" else "a sentence\n"
           for name in ("val", "test_2016_flickr") for lang in ("en", "de")}
DATA_CASES = {
    "missing local file": ("lm/wikitext2", {}, ["wikitext2/wiki.train.tokens[.gz] not found under",
                                                "set paths.data_root (or ATTNLAB_DATA_ROOT)"]),
    "parallel line counts differ": ("mt/multi30k_en_de", {**MT_EVAL, "multi30k/train.en": "a\nb\nc\n",
                                                          "multi30k/train.de": "x\ny\n"},
                                    ["train.en has 3 segments", "train.de has 2",
                                     "multi30k/train.en:3 is the first line"]),
    "empty split": ("mt/multi30k_en_de", {**MT_EVAL, "multi30k/train.en": "", "multi30k/train.de": ""},
                    ["multi30k/train.en is empty (zero bytes); fill it"]),
    "blank lines only": ("lm/wikitext2", {f"wikitext2/wiki.{split}.tokens": "\n \n\n"
                                          for split in ("train", "valid", "test")},
                         ["wikitext2/wiki.train.tokens holds 3 blank line(s) and no text"]),
    "undecodable bytes": ("mt/multi30k_en_de", {**MT_EVAL, "multi30k/train.en": b"good\nbad \xff byte\n",
                                                "multi30k/train.de": "gut\nschlecht\n"},
                          ["multi30k/train.en:2: not UTF-8"]),
    "jsonl line that is not JSON": ("superglue/cb", {"superglue/CB/train.jsonl": GOOD_CB + "{not json\n",
                                                     "superglue/CB/val.jsonl": GOOD_CB},
                                    ["superglue/CB/train.jsonl:2: not JSON"]),
    "label outside the label set": ("superglue/cb", {"superglue/CB/train.jsonl": GOOD_CB + GOOD_CB.replace(
        "neutral", "maybe"), "superglue/CB/val.jsonl": GOOD_CB},
        ["superglue/CB/train.jsonl:2: label 'maybe' is not one of ['entailment', 'contradiction', 'neutral']"]),
}


@pytest.mark.parametrize("case", list(DATA_CASES))
def test_bad_data_file_is_one_line_naming_file_and_line(case, tmp_path, monkeypatch, capsys):
    from attnlab.results.record import read_record

    task, files, fragments = DATA_CASES[case]
    root = tmp_path / "data"
    root.mkdir()
    for relative, content in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ATTNLAB_TOKENIZER_CACHE", str(tmp_path / "tok"))
    run_dir = tmp_path / "run"
    code, err = run_cli(train_main, [*TINY, f"task={task}", f"paths.data_root={root}", "logger=csv",
                                     f"hydra.run.dir={run_dir}"], capsys)
    assert code == 2, err
    line = one_clear_line(err)
    for fragment in fragments:
        assert fragment in line, line
    if run_dir.exists():
        assert not (run_dir / "checkpoints").exists() and not (run_dir / "csv" / "metrics.csv").exists()
        record = read_record(run_dir / "results.json")  # complete and valid, or this raises
        assert record["status"] == "failed" and record["error"] in line
    assert not list(tmp_path.rglob("*.tmp*")), "partial files left behind"

"""Shared test helpers: composing configs as the CLI does, the shared data folder, and tiny overrides."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest

# Without CUDA, Triton kernels run in Triton's interpreter (tests/attention/test_bigbird_triton.py). Triton
# reads this when a kernel is defined, so it is set before any test imports triton.
if "TRITON_INTERPRET" not in os.environ:
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "src" / "attnlab" / "conf"
SHARED_DATA = Path(os.environ.get("ATTNLAB_SHARED_DATA", REPO.parent / "shared" / "data"))

# A run small enough for the default tier: tiny model, a few steps, tiny generated splits.
TINY = [
    "model=transformer_tiny",
    "trainer.max_steps=4",
    "trainer.val_check_interval=2",
    "trainer.log_every_n_steps=1",
    "trainer.enable_progress_bar=false",
    "batch.sentences_per_update=8",
    "batch.eval_batch_size=8",
    "optim.warmup_steps=2",
]
TINY_ALGO = ["task.at_scale.cpu.train_size=64", "task.at_scale.cpu.val_size=8", "task.at_scale.cpu.test_size=8",
             "task.at_scale.cpu.train_max_len=6", "task.at_scale.cpu.test_max_len=12"]


_COMPOSED: dict[tuple, object] = {}


def compose(overrides: list[str] | None = None, *, run_dir: Path | None = None, scale: bool = True):
    """Compose ``train.yaml`` with overrides as the CLI does, apply the scale, point the run folder at ``run_dir``.

    Composition costs about half a second and the suite composes hundreds of presets several times, so each
    distinct override list is composed once per session and handed out as a deep copy.
    """
    from attnlab.training.compose import compose as compose_raw
    from attnlab.training.scale import apply_scale

    key = (tuple(overrides or ()), scale)
    if key not in _COMPOSED:
        cfg = compose_raw("train", list(key[0]))
        if scale:
            apply_scale(cfg, list(key[0]))
        _COMPOSED[key] = cfg
    cfg = copy.deepcopy(_COMPOSED[key])
    if run_dir is not None:
        cfg.paths.run_dir = str(run_dir)
    return cfg


def train_cli(root: Path, argv: list[str]) -> None:
    """``attnlab-train argv`` in this process, started from ``root`` (where relative paths land)."""
    from attnlab.cli.train import main as train_main

    cwd = os.getcwd()
    os.chdir(root)
    try:
        train_main(argv)
    finally:
        os.chdir(cwd)


def task_cfg(option: str, data_root: Path | str, *extra: str) -> dict:
    """The ``task`` section of ``task=<option>`` as a plain dict, reading data under ``data_root``."""
    from omegaconf import OmegaConf

    cfg = compose([f"task={option}", f"paths.data_root={data_root}", *extra])
    return OmegaConf.to_container(cfg.task, resolve=True)


def group_options(group: str) -> list[str]:
    """Every option of a config group, from the files (``task`` options include their family folder)."""
    root = CONF / group
    nested_groups = {"model": ("attention", "recurrence")}
    out = []
    for path in sorted(root.rglob("*.yaml")):
        rel = path.relative_to(root)
        if rel.parts[0] in nested_groups.get(group, ()):
            continue
        out.append(str(rel.with_suffix("")))
    return out


def require_shared_data(*relative: str) -> Path:
    """The shared data folder, or skip with the reason (a user's clone has no ../shared/data)."""
    for rel in relative:
        if not (SHARED_DATA / rel).exists() and not (SHARED_DATA / f"{rel}.gz").exists():
            pytest.skip(f"needs {SHARED_DATA / rel}: the shared data folder is present in CI, absent in a clone "
                        f"(set ATTNLAB_SHARED_DATA to its location)")
    return SHARED_DATA


@pytest.fixture
def tiny_wikitext(tmp_path) -> Path:
    """A data root (``tmp_path/data``) holding a tiny word-level corpus in WikiText-2's layout
    (``wikitext2/wiki.{train,valid,test}.tokens``: 300, 40 and 40 lines of a 16-word vocabulary with ``<unk>`` and
    headings), for the LM tasks that read local files (``task=lm/wikitext2``, ``lm/lm1b``'s stand-in, ...)."""
    words = "the cat sat on a mat and the dog ran to the park <unk> = heading =".split()
    folder = tmp_path / "data" / "wikitext2"
    folder.mkdir(parents=True)
    for split, n in (("train", 300), ("valid", 40), ("test", 40)):
        lines = [" ".join(words[(i * 7 + j) % len(words)] for j in range(5 + i % 9)) for i in range(n)]
        (folder / f"wiki.{split}.tokens").write_text("\n".join(lines) + "\n")
    return tmp_path / "data"


@pytest.fixture(autouse=True)
def _quiet_wandb(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _exact_fp32_matmuls_on_gpu(request):
    """GPU tests compare fp32 results with tolerances that assume full fp32 matmuls. Whether TF32 is on by
    default differs between torch versions, and one test that turns it on would leak it into the next in the
    same worker, so every ``gpu`` test starts with TF32 off and leaves the setting as it found it."""
    if request.node.get_closest_marker("gpu") is None:
        yield
        return
    import torch

    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.get_float32_matmul_precision())
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
        torch.set_float32_matmul_precision(saved[2])

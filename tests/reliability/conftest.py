"""A small trained run folder (made once per session through the real CLI) for evaluation and bad-input tests."""

from __future__ import annotations

import pytest

from tests.conftest import TINY, TINY_ALGO, train_cli


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("trained")
    run_dir = root / "run"
    train_cli(root, [*TINY, *TINY_ALGO, "logger=csv", "seed=3", f"hydra.run.dir={run_dir}"])
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    return run_dir

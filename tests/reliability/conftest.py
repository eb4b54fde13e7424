"""A small trained run folder (made once per session through the real CLI) for evaluation and bad-input tests."""

from __future__ import annotations

import os

import pytest

from tests.conftest import TINY, TINY_ALGO


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory):
    from attnlab.cli.train import main as train_main

    root = tmp_path_factory.mktemp("trained")
    run_dir = root / "run"
    cwd = os.getcwd()
    os.chdir(root)
    try:
        train_main([*TINY, *TINY_ALGO, "logger=csv", "seed=3", f"hydra.run.dir={run_dir}"])
    finally:
        os.chdir(cwd)
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    return run_dir

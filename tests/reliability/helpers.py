"""Shared pieces of the reliability tests: a tiny deterministic run, weight comparison, CLI capture."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import TINY, TINY_ALGO

# Tiny, deterministic, with dropout on (so the RNG restore is exercised), 8 batches per epoch (so runs cross
# epoch boundaries), validation every 3 updates and a periodic last.ckpt every 2.
DETERMINISTIC = [*TINY, *TINY_ALGO, "trainer.max_steps=8", "trainer.val_check_interval=3",
                 "trainer.deterministic=true", "model.dropout=0.1", "model.attention_dropout=0.1",
                 "callbacks.checkpoint.every_n_steps=2", "logger=csv", "seed=7"]


def run_with_callbacks(run_dir: Path, extra=(), callbacks=()):
    """``training.run`` of the DETERMINISTIC config (plus ``extra``) in ``run_dir``, with test-only Lightning
    callbacks placed before the run's own (e.g. one that sends a signal at a chosen step)."""
    import importlib

    from tests.conftest import compose

    run_module = importlib.import_module("attnlab.training.run")
    cfg = compose([*DETERMINISTIC, *extra], run_dir=run_dir)
    original = run_module.build_callbacks
    run_module.build_callbacks = lambda c, d, **kw: [*callbacks, *original(c, d, **kw)]
    try:
        return run_module.run(cfg, run_dir=run_dir, command="pytest")
    finally:
        run_module.build_callbacks = original


def weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)["state_dict"]


def same_weights(a: Path, b: Path) -> bool:
    wa, wb = weights(a), weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def run_cli(main, argv: list[str], capsys) -> tuple[int, str]:
    """Call a CLI ``main`` in-process; (exit code, stderr)."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    return info.value.code, capsys.readouterr().err


def one_clear_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err, err
    assert len(lines) == 1, err
    return lines[0]

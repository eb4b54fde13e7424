"""``attnlab-eval``: evaluate a trained run (its folder or one checkpoint) on the task's test splits.

    attnlab-eval runs/algo_copy/.../2025-01-01_12-00-00-s1            # checkpoints/last.ckpt of the run
    attnlab-eval runs/.../checkpoints/step0001000.ckpt                 # one checkpoint
    attnlab-eval RUN_DIR which=best paths.data_root=/data              # the best checkpoint; config overrides

The run's own config (``.hydra/config.yaml`` and the overrides it was started with) rebuilds the task and
the model; ``key=value`` arguments override it. Weights are loaded with ``weights_only=True``. The metrics
go to ``eval.json`` beside the checkpoint (``<name>.eval.json`` for a checkpoint other than last.ckpt),
written atomically; a sequence-to-sequence task's decoded outputs (``<split>.hyp/.ref/.src/.jsonl``, see
training/outputs.py) go to ``eval_outputs/`` (``<name>.eval_outputs/``) beside it. Bad input gets one line
on stderr and exit code 2.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path

from attnlab.cli.common import fail, failures_reported, quiet_lightning
from attnlab.training.evaluation import WHICH, EvalError, evaluate

log = logging.getLogger("attnlab")


def parse_args(argv: list[str]) -> tuple[Path, str, list[str]]:
    path: str | None = None
    which = "last"
    overrides: list[str] = []
    for arg in argv:
        if arg in ("-h", "--help"):
            print(__doc__.strip())
            raise SystemExit(0)
        if "=" not in arg:
            if path is not None:
                raise EvalError(f"one run folder or checkpoint, got a second path {arg!r}")
            path = arg
        elif arg.startswith("path="):
            path = arg.split("=", 1)[1]
        elif arg.startswith("which="):
            which = arg.split("=", 1)[1]
            if which not in WHICH:
                raise EvalError(f"which={which!r} is not valid; valid: {', '.join(WHICH)}")
        else:
            overrides.append(arg)
    if not path:
        raise EvalError("give a run folder or a checkpoint: attnlab-eval RUN_DIR_OR_CKPT [which=best] [key=value ...]")
    return Path(path), which, overrides


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Progress goes to stdout, so that a refusal is the one line on stderr (as attnlab-train's console).
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    os.environ.setdefault("HYDRA_FULL_ERROR", "0")
    from attnlab.training.stop_signals import StoppedBySignal

    try:
        with failures_reported():
            path, which, overrides = parse_args(argv)
            quiet_lightning()
            result = evaluate(path, which, overrides)
    except StoppedBySignal as exc:
        fail(f"stopped by {signal.Signals(exc.signum).name} while evaluating; no eval.json was written; rerun the "
             "same command", code=128 + int(exc.signum))
    print(f"evaluated {result['checkpoint']} (step {result['step']})")
    for key, value in result["metrics"].items():
        print(f"  {key:<28} {'n/a' if value is None else f'{value:.4f}'}")
    print(f"written: {result['written']}")
    if "outputs" in result:
        print(f"decoded outputs: {result['outputs']}")


if __name__ == "__main__":
    main()

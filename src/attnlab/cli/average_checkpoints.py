"""Average the weights of checkpoints, as fairseq's ``scripts/average_checkpoints.py``; then ``attnlab-eval`` it.

    python -m attnlab.cli.average_checkpoints RUN_DIR --last 5                # -> RUN_DIR/averaged_last5.ckpt
    python -m attnlab.cli.average_checkpoints A.ckpt B.ckpt --out avg.ckpt    # these files
    attnlab-eval RUN_DIR/averaged_last5.ckpt                                   # BLEU of the average

``--last N`` takes the N checkpoints of the highest steps (a run keeps one per validation with
``callbacks.checkpoint.save_top_k=-1``). The work is ``training/checkpoint_averaging.py``; bad input is one
line on stderr and exit code 2, and nothing is written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnlab.cli.common import failures_reported
from attnlab.training.checkpoint_averaging import (
    AveragingError,
    average_checkpoints,
    default_output,
    last_checkpoints,
)

PROG = "python -m attnlab.cli.average_checkpoints"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line through failures_reported, not argparse's usage block
        raise AveragingError(f"{message} (see --help)")


def main(argv: list[str] | None = None) -> None:
    parser = _Parser(prog=PROG, description=__doc__.splitlines()[0],
                     formatter_class=argparse.RawDescriptionHelpFormatter,
                     epilog="\n".join(__doc__.splitlines()[1:]))
    parser.add_argument("inputs", nargs="+", type=Path, help="checkpoint files, or one run folder with --last N")
    parser.add_argument("--last", type=int, metavar="N", help="the N newest checkpoints of the run folder given")
    parser.add_argument("--out", type=Path, help="the averaged checkpoint (default with --last: "
                                                 "RUN_DIR/averaged_last<N>.ckpt)")
    with failures_reported(PROG.rsplit(".", 1)[-1]):
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
        if args.last is not None:
            if len(args.inputs) != 1:
                raise AveragingError(f"--last takes one run folder, got {len(args.inputs)} paths")
            inputs = last_checkpoints(args.inputs[0], args.last)
            output = args.out or default_output(args.inputs[0], args.last)
        else:
            if args.out is None:
                raise AveragingError("give --out FILE for the averaged checkpoint (or a run folder with --last N)")
            inputs, output = args.inputs, args.out
        result = average_checkpoints(inputs, output)
    steps = ", ".join(str(s) for s in result["steps"])
    print(f"averaged {len(result['inputs'])} checkpoints (steps {steps}; {result['tensors']} tensors) -> "
          f"{result['output']}")
    print(f"evaluate it: attnlab-eval {result['output']}")


if __name__ == "__main__":
    main()

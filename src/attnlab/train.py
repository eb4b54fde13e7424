"""``python -m attnlab.train``: the training CLI, and the builders tests and tools use."""

from attnlab.cli.train import main
from attnlab.training.run import build_datamodule, build_module, run

__all__ = ["build_datamodule", "build_module", "main", "run"]

if __name__ == "__main__":
    main()

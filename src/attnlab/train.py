"""``python -m attnlab.train``: the training CLI (what torchrun launches; ``attnlab-train`` is the same ``main``)."""

from attnlab.cli.train import main

if __name__ == "__main__":
    main()

"""``python -m attnlab.evaluate``: the evaluation CLI (``attnlab-eval``)."""

from attnlab.cli.evaluate import main

if __name__ == "__main__":
    main()

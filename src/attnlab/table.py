"""``python -m attnlab.table``: the table CLI (``attnlab-table``)."""

from attnlab.cli.table import main

if __name__ == "__main__":
    main()

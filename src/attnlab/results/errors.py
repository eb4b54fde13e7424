"""The two errors of the table layer; both carry one line meant for the user."""


class SpecError(Exception):
    """A table spec that cannot be used; the message is one line naming the file."""


class TableError(Exception):
    """Anything that stops a table from being built; one line, meant for the user."""

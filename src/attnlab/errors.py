"""The roots of every error attnlab reports in one line, on the lowest floor so that raising one imports nothing
above it (every floor may import this module).

- ``UserError``: something the user can fix (a config, a data folder, a checkpoint, a record, a table spec). Every
  command turns it into one line on stderr and exit code 2 (``cli.common.failures_reported``). A new error a user
  can cause subclasses it (or one of its subclasses here or beside the code that raises it), and the commands
  report it without being told: ``tests/test_user_errors.py`` walks the package for exception classes and fails
  on one that is neither a ``UserError`` nor listed there as something else.
- ``RunFault``: a run that went wrong through no fault of its input (a NaN loss, a full disk): one line, exit 1.
"""


class UserError(Exception):
    """Bad input a user can fix; the message is one line that says what and, where it can, how."""


class RunFault(Exception):
    """A run stopped by a fault that is not bad input (a NaN/Inf loss, a folder that cannot take the files); the
    message is one line."""


class ConfigError(UserError, ValueError):
    """A bad configuration; the message is one line."""


class SpecError(UserError):
    """A table spec that cannot be used; the message is one line naming the file."""


class TableError(UserError):
    """Anything that stops a table from being built; one line, meant for the user."""

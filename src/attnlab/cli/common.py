"""What every CLI shares: quiet libraries, Hydra's flags and one-line failures (``failures_reported``); composing
and checking a config is ``training.compose``."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

from attnlab.errors import RunFault
from attnlab.training.compose import USER_ERRORS, one_line  # the import registers the configs' resolvers


def _matplotlib_config_dir_usable() -> None:
    """Matplotlib (imported by the loggers and the table figures) prints two lines on stderr when its config
    folder under HOME cannot be made (a read-only or missing HOME on a cluster node), then works from a
    temporary folder anyway; give it that temporary folder up front, quietly."""
    import os
    import tempfile
    from pathlib import Path

    if os.environ.get("MPLCONFIGDIR"):
        return
    try:
        (Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "matplotlib").mkdir(parents=True,
                                                                                                 exist_ok=True)
    except (OSError, RuntimeError):  # RuntimeError: no HOME at all
        os.environ["MPLCONFIGDIR"] = tempfile.mkdtemp(prefix="attnlab-matplotlib-")


_matplotlib_config_dir_usable()

# Arguments that make Hydra do something other than one plain run (help, info, multirun, shell
# completion): preflight leaves those to Hydra.
HYDRA_FLAGS = ("--help", "-h", "--hydra-help", "--info", "-i", "--cfg", "-c", "--resolve", "--package", "-p",
               "--multirun", "-m", "--shell-completion", "-sc", "--config-path", "-cp", "--config-name", "-cn",
               "--config-dir", "-cd", "--version", "--run", "-r")


def quiet_lightning() -> None:
    """Lightning's messages through the application's handlers only, at WARNING: importing Lightning gives
    its loggers a handler of their own (every line printed twice under ours) and INFO chatter (start-up
    tips, "GPU available: False"). The pytree deprecation Lightning 2.6 triggers in torch 2.13 at every fit
    is not ours to fix."""
    import logging
    import warnings

    import lightning.pytorch  # noqa: F401 - the import adds the handlers removed below

    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")
    for name in ("lightning.pytorch", "lightning.fabric"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.WARNING)
        logger.propagate = True
        for handler in list(logger.handlers):
            logger.removeHandler(handler)


REPORTED: tuple[type[BaseException], ...] = (*USER_ERRORS, RunFault)


def exit_code(exc: BaseException) -> int:
    """2 for bad input, 1 for a fault of the run (``RunFault``: a NaN loss, a full disk)."""
    return 1 if isinstance(exc, RunFault) else 2


@contextmanager
def failures_reported(prog: str | None = None, *, before_run: bool = False) -> Iterator[None]:
    """The one failure wrapper of the commands (as lightning-hydra-template's ``task_wrapper``), as a ``with``
    block or a decorator: a ``UserError`` (or a config parse error) ends the command with one line on stderr
    and exit code 2, a ``RunFault`` with one line and exit code 1; anything else is a bug and keeps its
    traceback. Classes are matched by their root, never by name, so a renamed or new error is reported too.
    ``before_run``: checks before anything ran, where a folder that cannot take the run is the user's to fix
    too (exit 2)."""
    try:
        yield
    except REPORTED as exc:
        fail(one_line(exc), code=2 if before_run else exit_code(exc), prog=prog)


def fail(message: str, code: int = 2, prog: str | None = None) -> NoReturn:
    """``<prog>: error: <message>`` on stderr and exit ``code``; ``prog`` defaults to the command as invoked."""
    if prog is None:
        prog = sys.argv[0].rsplit("/", 1)[-1] if sys.argv and sys.argv[0] else "attnlab"
        if prog.endswith(".py") or prog in ("-m", "-c", "__main__.py"):
            prog = "attnlab"
    print(f"{prog}: error: {message}", file=sys.stderr)
    raise SystemExit(code)

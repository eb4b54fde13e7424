"""Stop signals (SIGTERM, SIGUSR1, SIGUSR2) over a whole run, and records that a further signal cannot cut.

Inside training the ``LastCheckpoint`` callback serves the stop signals (save after the current update, then
stop). Outside it nothing would: their default action ends the process at once, with no line and no record.
``RunSignals`` holds one handler for the whole run:
- in a ``raising`` stretch (preparing data and model, testing) a signal raises ``StoppedBySignal`` at once,
  so the run writes an ``interrupted`` record and the CLI exits with one line;
- elsewhere (Lightning setting up training, between training and testing) it is noted, and served where the
  run can act on it: ``LastCheckpoint`` takes it as if it had arrived in training, and the next ``raising``
  stretch raises it on entry.
The handlers that were there before (submitit's requeue) are restored at the end and handed to the CLI with
the exception, which calls them once the record is on disk. ``signals_deferred`` holds the stop signals and
Ctrl-C back while a record is written (milliseconds), so a second Ctrl-C cannot cut the record that says the
first one happened. ``StoppedBySignal`` (a stop signal outside training) and ``Interrupted`` (Ctrl-C, in training or
out) are what a stopped run raises once its ``interrupted`` record is written.
"""

from __future__ import annotations

import contextlib
import logging
import signal
from collections.abc import Iterator
from typing import Any

from attnlab.training.checkpointing import Preempted, in_main_thread, stop_signals

log = logging.getLogger("attnlab")


class StoppedBySignal(Preempted):
    """A stop signal outside training; ``where`` says what the run was doing."""

    def __init__(self, signum: int, step: int, checkpoint: str | None, where: str,
                 previous_handler: Any = None) -> None:
        super().__init__(signum, step, checkpoint, previous_handler)
        self.where = where
        resume = (f"rerun the same command to resume from {checkpoint}" if checkpoint else
                  "rerun the same command to start again (no checkpoint was written yet)")
        self.args = (f"stopped by {signal.Signals(signum).name} at step {step} {where}; {resume}",)


class Interrupted(Preempted):
    """Ctrl-C stopped training; a rerun of the same command resumes from the newest checkpoint on disk."""

    def __init__(self, step: int, checkpoint: str | None) -> None:
        super().__init__(signal.SIGINT, step, checkpoint)
        where = f"the newest checkpoint, {checkpoint}" if checkpoint else "the start (no checkpoint was written yet)"
        self.args = (f"interrupted (Ctrl-C) at step {step}; rerun the same command to resume from {where}",)


class RunSignals:
    """The stop-signal handler of one run (a context manager; see the module docstring)."""

    def __init__(self) -> None:
        self.previous: dict[int, Any] = {}
        self.pending: int | None = None
        self._raising: tuple[str, int, str | None] | None = None  # (where, step, checkpoint) while raising

    def __enter__(self) -> RunSignals:
        if in_main_thread():  # handlers can only be set from the main thread; elsewhere leave them as they are
            for s in stop_signals():
                self.previous[s] = signal.getsignal(s)
                signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc_info) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)

    def previous_handler(self, signum: int) -> Any:
        """What handled ``signum`` before this run (submitit's requeue), for ``LastCheckpoint`` to call."""
        return self.previous.get(signum)

    def take_pending(self) -> int | None:
        signum, self.pending = self.pending, None
        return signum

    @contextlib.contextmanager
    def raising(self, where: str, *, step: int = 0, checkpoint: str | None = None) -> Iterator[None]:
        """Within: a stop signal (or one noted before) raises ``StoppedBySignal``."""
        if self.pending is not None:
            self._raise(self.take_pending(), where, step, checkpoint)
        self._raising = (where, step, checkpoint)
        try:
            yield
        finally:
            self._raising = None

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self._raising is None:
            if self.pending is None:
                log.warning("received %s: the run stops at the next point where it can save or record", name)
            self.pending = signum
            return
        log.warning("received %s %s: stopping", name, self._raising[0])
        self._raise(signum, *self._raising)

    def _raise(self, signum: int, where: str, step: int, checkpoint: str | None) -> None:
        raise StoppedBySignal(signum, step, checkpoint, where, previous_handler=self.previous_handler(signum))


@contextlib.contextmanager
def signals_deferred() -> Iterator[list[int]]:
    """Within: stop signals and Ctrl-C are noted (in the yielded list), not acted on; said in the log after."""
    if not in_main_thread():
        yield []
        return
    held = [*stop_signals(), signal.SIGINT]
    previous = {s: signal.getsignal(s) for s in held}
    noted: list[int] = []

    def note(signum, frame) -> None:
        noted.append(signum)

    for s in held:
        signal.signal(s, note)
    try:
        yield noted
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        if noted:
            log.warning("received %s while writing the run record; the record was written whole",
                        ", ".join(signal.Signals(s).name for s in noted))

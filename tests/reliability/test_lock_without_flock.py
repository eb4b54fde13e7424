"""The run-folder lock where the file system has no flock (Lustre without ``-o flock``; issue 50.3): the lock
is the lock file's existence, a dead owner on this host is taken over, a live one refused."""

from __future__ import annotations

import errno
import json
import socket
import subprocess
import sys

import pytest

from attnlab.training import storage
from attnlab.training.storage import LOCK_FILE, RunFolderBusy, RunFolderLock


@pytest.fixture
def no_flock(monkeypatch):
    import fcntl

    def refuse(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", refuse)


def test_one_owner_at_a_time_without_flock(no_flock, tmp_path):
    lock = RunFolderLock(tmp_path).acquire()
    owner = json.loads((tmp_path / LOCK_FILE).read_text())
    assert owner["host"] == socket.gethostname() and RunFolderLock.owner(tmp_path)["pid"] == owner["pid"]
    with pytest.raises(RunFolderBusy, match="no flock: if that run is dead, delete"):
        RunFolderLock(tmp_path).acquire()
    lock.release()
    assert not (tmp_path / LOCK_FILE).exists() and RunFolderLock.owner(tmp_path) is None
    RunFolderLock(tmp_path).acquire().release()


def test_a_dead_owner_on_this_host_is_taken_over_and_another_hosts_is_not(no_flock, tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    record = {"pid": int(dead.stdout), "host": socket.gethostname(), "started": "earlier"}
    (tmp_path / LOCK_FILE).write_text(json.dumps(record) + "\n")
    assert RunFolderLock.owner(tmp_path) is None
    lock = RunFolderLock(tmp_path).acquire()
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] != record["pid"]
    lock.release()
    (tmp_path / LOCK_FILE).write_text(json.dumps({**record, "host": "another-node"}) + "\n")
    with pytest.raises(RunFolderBusy, match="another-node"):
        RunFolderLock(tmp_path).acquire()


def test_other_flock_errors_are_not_taken_for_a_missing_flock(monkeypatch, tmp_path):
    import fcntl

    def broken(fd, operation):
        raise OSError(errno.EBADF, "Bad file descriptor")

    monkeypatch.setattr(fcntl, "flock", broken)
    with pytest.raises(OSError) as err:
        RunFolderLock(tmp_path).acquire()
    assert err.value.errno == errno.EBADF and not isinstance(err.value, RunFolderBusy)
    assert errno.ENOLCK in storage.NO_FLOCK_ERRNOS

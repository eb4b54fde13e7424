"""The run folder on disk: checks before anything is written, one owner at a time, and a full disk mid-run.

Imports neither torch nor Lightning, so the command-line preflight can use it before a run starts.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

from attnlab.errors import RunFault

log = logging.getLogger("attnlab")

# errno values that mean "this folder cannot take the run's files" rather than a bug.
STORAGE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG)
# What torch's zip writer raises (a RuntimeError, not OSError) when a write to the file fails.
TORCH_WRITE_FAILURES = ("PytorchStreamWriter failed", "file write failed", "unexpected pos", "iostream error")
LOCK_FILE = ".attnlab.lock"
# flock's answers on a file system without it (Lustre mounted without -o flock, some NFS set-ups).
NO_FLOCK_ERRNOS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EINVAL)


class StorageError(RunFault, OSError):
    """The run folder cannot take the run's files; the message is one line."""


class RunFolderBusy(StorageError):
    """Another live attnlab-train owns the run folder; nothing in the folder was touched."""


def check_writable(run_dir: Path) -> None:
    """Fail with one line when the run folder cannot be created or written."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=run_dir)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise StorageError(f"cannot write to the run folder {run_dir}: {exc.strerror or exc}") from None


def nearest_existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_can_create(run_dir: Path) -> None:
    """Before anything is created: every name in the path fits the file system, and the nearest existing
    ancestor of ``run_dir`` is a writable folder."""
    base = nearest_existing(Path(run_dir))
    try:
        name_max = os.pathconf(base, "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    for part in Path(run_dir).parts:
        if len(os.fsencode(part)) > name_max:
            raise StorageError(f"cannot create the run folder: the name {part[:40]}... is {len(os.fsencode(part))} "
                               f"bytes, the file system allows {name_max}; shorten paths.run_id (or hydra.run.dir)")
    if not base.is_dir():
        raise StorageError(f"cannot create the run folder {run_dir}: {base} is a file")
    if not os.access(base, os.W_OK | os.X_OK):
        raise StorageError(f"cannot create the run folder {run_dir}: {base} is not writable")


def check_free_space(run_dir: Path, need_bytes: int) -> None:
    """Fail before training when the disk of the run folder cannot take ``need_bytes``."""
    free = shutil.disk_usage(run_dir).free
    if free < need_bytes:
        raise StorageError(f"not enough free disk space in {run_dir}: {_mb(free)} free, the run needs about "
                           f"{_mb(need_bytes)} for its checkpoints")


def _mb(n: int) -> str:
    return f"{n / 2**20:.0f} MiB" if n < 2**30 else f"{n / 2**30:.1f} GiB"


def storage_failure(exc: BaseException, run_dir: Path) -> StorageError | None:
    """The one-line StorageError behind ``exc`` when it is a write that the disk refused (torch's writer
    reports a full disk as a RuntimeError), else None."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in STORAGE_ERRNOS:
            return StorageError(f"cannot write to {seen.filename or run_dir}: {seen.strerror}; checkpoints and "
                                f"records already on disk are intact (written atomically)")
        if isinstance(seen, RuntimeError) and any(m in str(seen) for m in TORCH_WRITE_FAILURES):
            try:
                free = _mb(shutil.disk_usage(run_dir).free)
            except OSError:
                free = "unknown"
            return StorageError(f"cannot write a checkpoint in {run_dir} (disk full? {free} free); the last "
                                f"complete checkpoint and records on disk are intact (written atomically)")
        seen = seen.__cause__ or seen.__context__
    return None


# -- what a run folder may hold ----------------------------------------------------------------------------
# wandb keeps its own links (latest-run, debug.log) in its folder and writes nothing through ours.
_LINKS_OF_OTHERS = ("wandb",)


def check_inside(run_dir: str | os.PathLike, runs_dir: str | os.PathLike, given_as: str,
                 root_name: str = "paths.runs_dir") -> None:
    """Refuse a run folder that its config parts (``run_name``, ``paths.run_id``, the task name, an
    interpolation) place outside ``runs_dir``: a ``../`` or an absolute part would put checkpoints, records and
    logs (and the folder ``resume=auto`` reads) anywhere. Compared by path, before anything exists."""
    folder = Path(os.path.normpath(os.path.abspath(run_dir)))
    root = Path(os.path.normpath(os.path.abspath(runs_dir)))
    if folder == root or not folder.is_relative_to(root):
        raise StorageError(f"the run folder {folder} is not inside {root_name} ({root}): a part of its name "
                           f"({given_as}) leaves it; remove the '..' or '/' from it, or give hydra.run.dir "
                           "explicitly")


# The folders attnlab and Hydra make in a run folder: a file in one's place would end the run with a traceback.
RUN_SUBFOLDERS = (".hydra", "checkpoints", "csv", "outputs", "ponder", "attention")


def check_run_folder_entries(run_dir: str | os.PathLike) -> None:
    """Refuse a run folder that holds a symbolic link where attnlab or Hydra write (the lock, ``train.log``,
    ``.hydra/*.yaml``, metrics, checkpoints, outputs): writing through it would truncate or append to whatever
    it names; or a file where one of its folders goes (``checkpoints`` as a file). One line naming it;
    nothing is written."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return
    for name in RUN_SUBFOLDERS:
        entry = run_dir / name
        if entry.exists() and not entry.is_symlink() and not entry.is_dir():
            raise StorageError(f"{entry} is a file where the run keeps its {name} folder; move it away, or start "
                               "a new run (another paths.run_id)")
    for root, dirs, files in os.walk(run_dir):  # does not descend into linked folders; lists them in dirs
        if Path(root) == run_dir:
            dirs[:] = [d for d in dirs if d not in _LINKS_OF_OTHERS]
        for name in (*dirs, *files):
            path = Path(root) / name
            if path.is_symlink():
                raise StorageError(f"{path} is a symbolic link (to {os.readlink(path)}): attnlab never writes "
                                   "through a link in a run folder; remove it, or start a new run (another "
                                   "paths.run_id)")


def open_no_follow(path: str | os.PathLike, flags: int, mode: int = 0o666) -> int:
    """``os.open`` that refuses (StorageError, one line) to open a symbolic link: a link planted between the
    preflight's look and this open is not written through either."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StorageError(f"{path} is a symbolic link: attnlab never writes through a link in a run folder; "
                               "remove it") from None
        raise


class RunLogFileHandler(logging.FileHandler):
    """The run folder's ``train.log`` (hydra/job_logging/attnlab.yaml): appended to, never through a link."""

    def _open(self):
        fd = open_no_follow(self.baseFilename, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        return os.fdopen(fd, "a", encoding=self.encoding, errors=self.errors)


# -- one run per folder ---------------------------------------------------------------------------------
class RunFolderLock:
    """``<run>/.attnlab.lock``: held (``flock``) by the one attnlab-train working in the folder, and naming its
    pid, host and start time. The kernel drops the lock when its owner dies however it dies, so a lock left
    by a killed run is stale and taken over; a live owner makes ``acquire`` raise ``RunFolderBusy``.

    Where the file system has no ``flock`` (Lustre without ``-o flock``), the lock is the file's existence
    instead (created with ``O_EXCL``, atomic there too) and its owner is judged from what it names: on this
    host a dead pid makes it stale and it is taken over; from another host it cannot be checked, so it is
    refused with a line that says which file to delete if that run is dead."""

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self._fd: int | None = None

    @staticmethod
    def owner(run_dir: str | os.PathLike) -> dict | None:
        """Who holds the lock of ``run_dir`` now (None when no live process does); creates nothing."""
        path = Path(run_dir) / LOCK_FILE
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return None
        try:
            import fcntl

            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return _read_owner(fd)
            except OSError as exc:
                if exc.errno not in NO_FLOCK_ERRNOS:
                    raise
                owner = _read_owner(fd)
                return None if _owner_dead(owner) else owner
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            os.close(fd)

    def acquire(self) -> RunFolderLock:
        import fcntl

        self.run_dir.mkdir(parents=True, exist_ok=True)
        while True:
            created = not self.path.exists()
            fd = open_no_follow(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = _read_owner(fd)
                os.close(fd)
                raise RunFolderBusy(busy_message(self.run_dir, owner)) from None
            except OSError as exc:
                os.close(fd)
                if exc.errno not in NO_FLOCK_ERRNOS:
                    raise
                if created:  # the empty file this call just made would look like another run's
                    with contextlib.suppress(FileNotFoundError):
                        self.path.unlink()
                return self._acquire_without_flock()
            # The previous owner may have removed the file between our open and our lock: lock the file
            # that is at the path now.
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        stale = _read_owner(fd)
        if stale:
            log.warning("taking over the run folder lock left by a dead run (pid %s on %s)", stale.get("pid"),
                        stale.get("host"))
        self._write_owner(fd)
        return self

    def _write_owner(self, fd: int) -> None:
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
        self._fd = fd

    def _acquire_without_flock(self) -> RunFolderLock:
        """The lock as the file's existence (no ``flock`` here). The file ``acquire`` just opened is this lock
        file: it is ours only if we create it now, exclusively."""
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                owner = self._existing_owner()
                if owner is None or not _owner_dead(owner):
                    raise RunFolderBusy(
                        f"{busy_message(self.run_dir, owner)} (this file system has no flock: if that run is dead, "
                        f"delete {self.path})") from None
                log.warning("taking over the run folder lock left by a dead run (pid %s on %s; no flock here)",
                            owner.get("pid"), owner.get("host"))
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()
                continue
            self._write_owner(fd)
            return self

    def _existing_owner(self) -> dict | None:
        """The owner named in the lock file; an empty file (a run that died between creating and writing it,
        or one writing it now) counts as its creator's for a minute, then as dead."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return {}
        try:
            owner = _read_owner(fd)
            if not owner and time.time() - os.fstat(fd).st_mtime < 60:
                return None
            return owner
        finally:
            os.close(fd)

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            self.path.unlink()
        os.close(self._fd)  # closing drops the flock
        self._fd = None


def _read_owner(fd: int) -> dict:
    try:
        return json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        return {}


def _owner_dead(owner: dict | None) -> bool:
    """True when the lock's owner is known dead: an empty record, or a pid on this host that no longer runs.
    An owner on another host cannot be checked from here and counts as alive."""
    if not owner:
        return True
    if owner.get("host") != socket.gethostname():
        return False
    try:
        os.kill(int(owner.get("pid")), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, TypeError, ValueError):
        return False
    return False


def busy_message(run_dir: Path, owner: dict | None) -> str:
    who = f"pid {owner.get('pid')} on {owner.get('host')}, since {owner.get('started')}" if owner else "another process"
    return (f"the run folder {run_dir} is in use by another attnlab-train ({who}); wait for it to end, or "
            f"start a separate run with another paths.run_id")

"""Entries of the on-disk caches (tokenizers, encoded splits, the T5 vocabulary): whole or not used at all.

An entry is one file: a header line with the SHA-256 of the payload, then the payload. It is written to a
temporary name in the same folder, flushed to disk and renamed over the entry, so a kill at any moment, or two
runs writing the same entry at once, leaves the old entry, the new one or none, never a part; a leftover
temporary file is removed on the way out of the failed write. Reading checks the checksum: a truncated,
corrupted or foreign file is said once in the log, removed, and its content rebuilt by the caller. A cache
folder that cannot be written (read-only, full disk, a file where the folder should be) costs only the
rebuild next time: said once per folder in the log, never an error.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
from pathlib import Path

from attnlab.results.record import file_mode, sweep_stale_temps, temp_prefix

log = logging.getLogger("attnlab")
MAGIC = b"attnlab-cache v1 sha256="
_UNWRITABLE: set[str] = set()  # folders said once to be unwritable in this process


def read_entry(path: Path) -> bytes | None:
    """The payload of ``path`` when it exists and its checksum holds; None (the caller rebuilds) otherwise."""
    try:
        data = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):  # no entry (or no cache folder): nothing to say
        return None
    except OSError as exc:
        log.warning("cache: cannot read %s (%s); rebuilding it", path, exc.strerror or exc)
        return None
    header, newline, payload = data.partition(b"\n")
    if newline and header.startswith(MAGIC) and header[len(MAGIC):].decode("ascii", "replace") == _digest(payload):
        return payload
    log.warning("cache: %s is damaged (truncated, corrupted or not an attnlab cache entry); rebuilding it", path)
    # A read-only folder keeps the file; the rebuilt entry cannot replace it either (said on write).
    with contextlib.suppress(OSError):
        path.unlink()
    return None


def write_entry(path: Path, payload: bytes) -> bool:
    """Write ``payload`` as the entry ``path`` atomically; False (said once per folder) if the folder cannot
    take it."""
    folder = path.parent
    tmp: str | None = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        sweep_stale_temps(path)  # what a writer of this entry killed mid-write left
        fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path), suffix=".tmp", dir=folder)
        with os.fdopen(fd, "wb") as fh:
            fh.write(MAGIC + _digest(payload).encode("ascii") + b"\n")
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, file_mode())  # mkstemp's 0o600 would hide a shared cache from the group
        os.replace(tmp, path)
        return True
    except OSError as exc:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        if str(folder) not in _UNWRITABLE:
            _UNWRITABLE.add(str(folder))
            log.warning("cache: cannot write to %s (%s); continuing without caching, so the next run rebuilds "
                        "(set ATTNLAB_TOKENIZER_CACHE to a writable folder)", folder, exc.strerror or exc)
        return False
    except BaseException:  # a signal or Ctrl-C mid-write: no temporary file is left behind
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise


def _digest(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()

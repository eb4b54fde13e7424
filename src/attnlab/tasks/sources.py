"""Where task data comes from: local files under a data root, or the Hugging Face hub by id.

Hub data goes through ``datasets.load_dataset`` with the Hugging Face ecosystem's own semantics: it honours
``HF_ENDPOINT`` mirrors, proxies and the cache (``HF_HOME`` / ``HF_DATASETS_CACHE``); with
``HF_DATASETS_OFFLINE=1`` a dataset downloaded earlier (say on a cluster's login node) loads from the cache,
and one that is not cached fails at once with one line naming the local alternative.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import re
import stat
import sys
import zlib
from pathlib import Path

from attnlab.tasks.base import DataError

log = logging.getLogger("attnlab")
# Files whose byte-order mark or CRLF line ends were removed in this process (said once per file).
_CLEANED: set[tuple[str, str]] = set()


def _say_once(path: Path, what: str) -> None:
    if (str(path), what) not in _CLEANED:
        _CLEANED.add((str(path), what))
        log.info("data: %s: %s", path, what)


def resolve_data_root(root: str | os.PathLike) -> Path:
    path = Path(os.path.expanduser(str(root)))
    return path if path.is_absolute() else Path.cwd() / path


def find_file(root: Path, relative: str, *, hub_override: str | None = None) -> Path:
    """``relative`` or its ``.gz`` twin under ``root``; a clear error when neither exists.

    ``hub_override``: the override that loads the same data from the hub for this task family (MT names
    it per split: ``task.train.source=hub``), or None where the family has no hub source.
    """
    for candidate in (root / relative, root / f"{relative}.gz"):
        if candidate.is_file():
            return candidate
        if candidate.exists():  # a FIFO, a device, a folder: there, but nothing a task can read as data
            raise DataError(f"data file {candidate} is not a regular file ({_kind(candidate)}); replace it with the "
                            "file itself")
    hub = f", or load it from the Hugging Face hub with {hub_override}" if hub_override else ""
    raise DataError(
        f"data file {relative}[.gz] not found under {root}; set paths.data_root (or ATTNLAB_DATA_ROOT) "
        f"to the folder that holds it{hub}"
    )


def _kind(path: Path) -> str:
    mode = path.stat().st_mode
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a plain file"


def _read_bounded(fh, path: Path) -> bytes:
    """All of ``fh``, read in chunks, refusing a line past the cap as soon as it is (a gzip file of 1.5 MB can
    inflate to 1.5 GiB without a line end: refused at 400 kB, not after filling the memory)."""
    limit = MAX_LINE_CHARS * 4  # UTF-8 takes at most 4 bytes per character
    chunks, line_bytes, line_no = [], 0, 1
    while chunk := fh.read(1 << 20):
        chunks.append(chunk)
        first, last = chunk.find(b"\n"), chunk.rfind(b"\n")
        if first >= 0 and line_bytes + first <= limit:  # the line in progress ended within the cap
            line_no += chunk.count(b"\n")
            line_bytes = len(chunk) - last - 1
        elif first < 0:
            line_bytes += len(chunk)
        else:
            line_bytes += first
        if line_bytes > limit:
            raise DataError(f"{path}:{line_no}: line longer than the {MAX_LINE_CHARS} characters a data line may "
                            f"have ({line_bytes} bytes without a line end so far); split or remove it")
    return b"".join(chunks)


def read_text(path: Path) -> str:
    """The whole file as UTF-8 (gzip when it ends in .gz); undecodable bytes are reported with their line."""
    try:
        if not stat.S_ISREG(path.stat().st_mode):  # opening a FIFO would wait for a writer for ever
            raise DataError(f"data file {path} is not a regular file ({_kind(path)}); replace it with the file itself")
        with (gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")) as f:
            raw = _read_bounded(f, path)
    except (OSError, EOFError, zlib.error) as exc:  # zlib.error: a damaged gzip stream
        raise DataError(f"cannot read data file {path}: {exc.__class__.__name__}: {exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise DataError(f"{path}:{line}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    if text.startswith("\ufeff"):  # a byte-order mark is not text: it would become a token of the vocabulary
        _say_once(path, "removed the UTF-8 byte-order mark at its start")
        text = text[1:]
    return text


# A longer line is refused: tokenizer training is quadratic in the length of a word, and a 1 MiB line
# without spaces runs for many minutes in silence (the longest line of our datasets is under 10k characters).
MAX_LINE_CHARS = 100_000


def read_lines(path: Path) -> list[str]:
    """The lines of a data file, split at ``\\n`` only (``str.splitlines`` would also split inside a sentence at
    U+2028, U+0085, form feeds, ..., misaligning parallel files); a trailing ``\\r`` (CRLF files) is dropped.
    A file without text (zero bytes, or blank lines only) is refused: no task reads a data file to get nothing."""
    lines = read_text(path).split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not any(line.strip() for line in lines):
        what = "is empty (zero bytes)" if not lines else f"holds {len(lines)} blank line(s) and no text"
        raise DataError(f"{path} {what}; fill it, or point the task at another file (paths.data_root, task.files)")
    for number, line in enumerate(lines, 1):
        if len(line) > MAX_LINE_CHARS:
            raise DataError(f"{path}:{number}: line of {len(line)} characters, longer than the {MAX_LINE_CHARS} a "
                            f"data line may have; split or remove it")
    if any(line.endswith("\r") for line in lines):
        _say_once(path, "removed the \\r of its CRLF line ends")
    return [line[:-1] if line.endswith("\r") else line for line in lines]


_SEG = re.compile(r"<seg[^>]*>(.*?)</seg>", re.DOTALL)


def read_segments(path: Path) -> list[str]:
    """The ``<seg>`` texts of a WMT SGML or IWSLT/mteval XML file, in document order, stripped.

    Entities are left as written (sacreBLEU reads WMT SGML the same way); the loader unescapes when asked.
    """
    segs = [m.group(1).strip() for m in _SEG.finditer(read_text(path))]
    if not segs:
        raise DataError(f"{path}: no <seg> elements found (expected WMT SGML or IWSLT XML)")
    return segs


def read_jsonl(path: Path) -> list[dict]:
    """One JSON object per line; a line that is not a JSON object is reported with its number."""
    return [row for _, row in read_jsonl_numbered(path)]


def read_jsonl_numbered(path: Path) -> list[tuple[int, dict]]:
    """(line number, object) per non-blank line, so later checks can name the line of a bad record."""
    rows = []
    for number, line in enumerate(read_lines(path), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{number}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise DataError(f"{path}:{number}: expected a JSON object, got {type(row).__name__}")
        rows.append((number, row))
    return rows


def read_tsv(path: Path, *, header: bool, min_columns: int = 1) -> tuple[list[str], list[list[str]]]:
    """(header fields, rows) of a tab-separated file (``read_text`` drops a UTF-8 BOM; quotes are kept as text)."""
    lines = read_lines(path)
    head = lines[0].split("\t") if header and lines else []
    rows = []
    for number, line in enumerate(lines[1:] if header else lines, 2 if header else 1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) < min_columns:
            raise DataError(f"{path}:{number}: {len(fields)} tab-separated columns, expected at least {min_columns}")
        rows.append(fields)
    return head, rows


class HubUnavailable(DataError):
    """A hub dataset that is neither in the local Hugging Face cache nor reachable."""


def hub_error(name: str, exc: BaseException, local_hint: str, *, streamed: bool = False) -> HubUnavailable:
    """The one-line error for a hub dataset that could not be loaded (offline and not cached, unreachable
    endpoint, unknown id), naming what to do about it."""
    why = "offline" if hf_offline() else (str(exc).strip().splitlines() or [exc.__class__.__name__])[0][:200]
    where = ("streamed, so it needs network access" if streamed else
             "not in the local Hugging Face cache (HF_HOME / HF_DATASETS_CACHE; load it once with network "
             "access and offline runs, HF_DATASETS_OFFLINE=1, read it from there)")
    return HubUnavailable(f"hub dataset {name} is unreachable ({why}) and {where}; {local_hint}")


# What ``datasets`` raises when the hub cannot serve a dataset: ConnectionError (offline mode, network),
# FileNotFoundError / DatasetNotFoundError (unknown id, or a cache that lacks it), and the HTTP errors of
# huggingface_hub (gated, 5xx) which are OSError subclasses.
HUB_ERRORS = (ConnectionError, FileNotFoundError, OSError)


def hf_offline() -> bool:
    return any(os.environ.get(k, "").lower() in ("1", "true", "yes", "on")
               for k in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"))


HUB_PROBE_TIMEOUT_S = 3.0
_HUB_REACHABLE: dict[str, bool] = {}


def hub_reachable(timeout: float = HUB_PROBE_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the hub endpoint (``HF_ENDPOINT``, default huggingface.co:443) opens within
    ``timeout`` seconds. Without network, ``datasets`` retries each request with back-off for about 30 s and
    prints a dozen lines before it fails; this answers in at most ``timeout``. Proxied machines (HTTPS_PROXY)
    are not probed: the proxy, not a direct connection, decides there."""
    import threading
    from urllib.parse import urlparse

    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    if host in _HUB_REACHABLE:
        return _HUB_REACHABLE[host]
    answer: list[bool] = []

    def connect() -> None:  # in a thread: name resolution itself can hang, and no socket timeout bounds it
        import socket

        try:
            socket.create_connection((host, port), timeout=timeout).close()
            answer.append(True)
        except OSError:
            answer.append(False)

    probe = threading.Thread(target=connect, daemon=True)
    probe.start()
    probe.join(timeout)
    _HUB_REACHABLE[host] = bool(answer and answer[0])
    return _HUB_REACHABLE[host]


def go_offline_if_unreachable(hub_id: str, name: str, local_hint: str, *, streamed: bool = False) -> None:
    """Before ``datasets`` touches the network: refuse at once (one line) when the hub cannot be reached and
    nothing can come from the cache; when the cache may hold the dataset, switch ``datasets`` to its offline
    mode so that it reads the cache without a round of retries (said once in the log)."""
    if hf_offline() or hub_reachable():
        return
    why = ConnectionError(f"no connection to {os.environ.get('HF_ENDPOINT') or 'https://huggingface.co'} "
                          f"within {HUB_PROBE_TIMEOUT_S:g} s")
    if streamed or not maybe_cached(hub_id):
        raise hub_error(name, why, local_hint, streamed=streamed)
    log.info("data: the hub is unreachable (%s); reading %s from the local Hugging Face cache only", why, name)
    os.environ["HF_DATASETS_OFFLINE"] = os.environ["HF_HUB_OFFLINE"] = "1"
    if "datasets" in sys.modules:  # imported already: its configuration read the environment at import
        import datasets
        import huggingface_hub

        datasets.config.HF_DATASETS_OFFLINE = True
        datasets.config.HF_HUB_OFFLINE = True
        huggingface_hub.constants.HF_HUB_OFFLINE = True


def _cache_folders() -> list[Path]:
    """The Arrow cache of ``datasets`` and the hub's file cache, resolved as the two libraries do."""
    if "datasets" in sys.modules:  # already imported: ask it (its config may differ from the environment)
        import datasets
        import huggingface_hub

        return [Path(datasets.config.HF_DATASETS_CACHE), Path(huggingface_hub.constants.HF_HUB_CACHE)]
    home = Path(os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                / "huggingface").expanduser()
    hub = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE") or home / "hub"
    return [Path(os.environ.get("HF_DATASETS_CACHE") or home / "datasets").expanduser(), Path(hub).expanduser()]


def maybe_cached(hub_id: str) -> bool:
    """False only when no cache folder can hold ``hub_id`` (checked without importing ``datasets``, whose
    import takes seconds); True means ``load_dataset`` decides."""
    namespace, _, name = hub_id.rpartition("/")
    arrow, hub = _cache_folders()
    if (hub / f"datasets--{hub_id.replace('/', '--')}").exists():
        return True
    if not arrow.is_dir():
        return False
    # datasets names the folder <namespace>___<snake_case name>; any folder of the namespace may be it
    prefix = f"{namespace}___" if namespace else ""
    return any(p.name.startswith(prefix) if namespace else p.name.replace("_", "") == name.lower().replace("_", "")
               for p in arrow.iterdir())


def load_hub_dataset(hub_id: str, config: str | None, *, local_hint: str):
    """``datasets.load_dataset(hub_id, config)``: from the local cache when offline or already downloaded;
    a ``HubUnavailable`` one-liner when it can be neither read from the cache nor downloaded."""
    name = f"{hub_id}{'/' + config if config else ''}"
    if hf_offline() and not maybe_cached(hub_id):
        raise hub_error(name, ConnectionError("offline"), local_hint)
    go_offline_if_unreachable(hub_id, name, local_hint)
    import datasets

    try:
        return datasets.load_dataset(hub_id, config)
    except HUB_ERRORS as exc:
        raise hub_error(name, exc, local_hint) from None
    except ValueError as exc:  # datasets' own "couldn't find cache for <config>" and friends
        if "cache" not in str(exc).lower():
            raise
        raise hub_error(name, exc, local_hint) from None

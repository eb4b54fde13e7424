"""Where task data comes from: local files under a data root, or the Hugging Face hub by id.

Our machines (and many clusters) have no internet: hub loading is attempted only when asked for, fails
within seconds offline, and its error names the local alternative.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import socket
import zlib
from pathlib import Path

from attnlab.tasks.base import DataError


def resolve_data_root(root: str | os.PathLike) -> Path:
    path = Path(os.path.expanduser(str(root)))
    return path if path.is_absolute() else Path.cwd() / path


def find_file(root: Path, relative: str) -> Path:
    """``relative`` or its ``.gz`` twin under ``root``; a clear error when neither exists."""
    for candidate in (root / relative, root / f"{relative}.gz"):
        if candidate.is_file():
            return candidate
    raise DataError(
        f"data file {relative}[.gz] not found under {root}; set paths.data_root (or ATTNLAB_DATA_ROOT) "
        f"to the folder that holds it, or use task.source=hub with network access"
    )


def read_text(path: Path) -> str:
    """The whole file as UTF-8 (gzip when it ends in .gz); undecodable bytes are reported with their line."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                raw = f.read()
        else:
            raw = path.read_bytes()
    except (OSError, EOFError, zlib.error) as exc:  # zlib.error: a damaged gzip stream
        raise DataError(f"cannot read data file {path}: {exc.__class__.__name__}: {exc}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise DataError(f"{path}:{line}: not UTF-8 ({exc.reason} at byte {exc.start})") from None


# A longer line is refused: tokenizer training is quadratic in the length of a word, and a 1 MiB line
# without spaces runs for many minutes in silence (the longest line of our datasets is under 10k characters).
MAX_LINE_CHARS = 100_000


def read_lines(path: Path) -> list[str]:
    """The lines of a data file, split at ``\\n`` only (``str.splitlines`` would also split inside a sentence at
    U+2028, U+0085, form feeds, ..., misaligning parallel files); a trailing ``\\r`` (CRLF files) is dropped."""
    lines = read_text(path).split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for number, line in enumerate(lines, 1):
        if len(line) > MAX_LINE_CHARS:
            raise DataError(f"{path}:{number}: line of {len(line)} characters, longer than the {MAX_LINE_CHARS} a "
                            f"data line may have; split or remove it")
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
    """(header fields, rows) of a tab-separated file (a UTF-8 BOM is dropped; quotes are kept as text)."""
    lines = read_lines(path)
    if lines and lines[0].startswith("\ufeff"):
        lines[0] = lines[0][1:]
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


def hub_reachable(timeout: float = 3.0) -> bool:
    """True when huggingface.co answers; respects the offline switches users already set."""
    if os.environ.get("HF_DATASETS_OFFLINE") == "1" or os.environ.get("HF_HUB_OFFLINE") == "1":
        return False
    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def load_hub_dataset(hub_id: str, config: str | None, *, local_hint: str):
    """``datasets.load_dataset(hub_id, config)``, failing fast and clearly when the hub is unreachable."""
    if not hub_reachable():
        raise DataError(
            f"hub dataset {hub_id}{'/' + config if config else ''} is unreachable (offline); {local_hint}"
        )
    import datasets

    return datasets.load_dataset(hub_id, config)

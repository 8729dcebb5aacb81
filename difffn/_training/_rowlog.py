"""A checkpointed run's history rows, in one append-only log next to its checkpoints.

Checkpoints hold a run's state, not its history: the rows go to one log per run
(``net_history__<run>.difffnlog`` in the checkpoint folder); each checkpoint appends only the
rows since the previous one and records how many rows it covers. A checkpoint's size therefore
does not grow with the run, and writing all of them costs time linear in the run's length
(with the whole history in every checkpoint, size grew linearly and total I/O quadratically).

The file starts with `MAGIC`; then records of ``length (8 bytes, little endian) |
sha256 of the body (32 bytes) | body`` where the body is msgpack (data only, never pickle) of
``{"training": [start, rows], "validation": [start, rows]}``. Rows land at their index, so a run
resumed from an older checkpoint overwrites the rows it repeats. Reading stops at the first
torn or damaged record; a process's first append cuts such a tail off (`repair`: a
process killed mid-append), so the records after it stay readable. The file is opened like
any file (its mode follows the umask) and each append is flushed and fsync'ed before the
checkpoint that counts on it is written. The log is opened and read through ``_core.files``: a
symbolic link, FIFO or device planted under its name is refused, never followed (its target is
never truncated or overwritten), and a read is bounded by `LIMIT`.
"""

from __future__ import annotations

import hashlib
import os
import re
import struct
from pathlib import Path

from .._core import SerializationError, files
from .._persistence import msgpack_codec
from . import _logfile

MAGIC = b"DIFFFNLOG\x00\x01\x00"
_RECORD = struct.Struct("<Q32s")
NAME = re.compile(r"net_history__[0-9a-f]{16}\.difffnlog")  # what file_name gives
LIMIT = 1 << 34  # bytes read of a log at most (16 GiB: some 10^8 rows)
_WHAT = _logfile.WHAT


def file_name(run_id: str) -> str:
    """The log's name in the checkpoint folder."""
    return f"net_history__{run_id}.difffnlog"


def run_id(run_key: dict, fingerprint: dict[str, str]) -> str:
    """A run's identity: its starting key and what its numbers depend on (a resumed run's is the
    same; another run in the same folder gets its own log)."""
    digest = hashlib.sha256(repr(run_key["impl"]).encode())
    digest.update(bytes(run_key["data"].tobytes()))
    for name, value in sorted(fingerprint.items()):
        digest.update(f"{name}={value}\n".encode())
    return digest.hexdigest()[:16]


def _records(blob: bytes):
    """``(end offset, body)`` of each intact record, in order; stops at the first bad one."""
    offset = len(MAGIC)
    while offset + _RECORD.size <= len(blob):
        length, digest = _RECORD.unpack_from(blob, offset)
        start, end = offset + _RECORD.size, offset + _RECORD.size + length
        body = blob[start:end]
        if end > len(blob) or hashlib.sha256(body).digest() != digest:
            return
        yield end, body
        offset = end


def repair(path: Path) -> None:
    """Before a process first appends: start the file, or cut a torn tail off it (a process
    killed mid-append), so the records appended after it stay readable.

    Raises:
      SerializationError: the log cannot be read or written.
    """
    folder = _logfile.folder_of(path)
    try:
        fd = files.open_regular(path, os.O_RDWR | os.O_CREAT, what=_WHAT)
        with os.fdopen(fd, "rb+") as handle:
            size = os.fstat(fd).st_size
            if size > LIMIT:
                raise SerializationError(
                    f"{_WHAT} {str(path)!r} has {size} bytes, more than the {LIMIT} difffn reads."
                )
            blob = handle.read(size)
            if not blob.startswith(MAGIC):
                handle.seek(0)
                handle.truncate(0)
                handle.write(MAGIC)
                return
            end = max((end for end, _ in _records(blob)), default=len(MAGIC))
            if end < len(blob):
                handle.truncate(end)
    except OSError as error:
        raise SerializationError(
            f"could not write {str(path)!r}: cannot create a file in {str(folder)!r} "
            f"({error.strerror or error})."
        ) from None


def append(path: Path, training: tuple[int, list], validation: tuple[int, list]) -> None:
    """Append rows (``(start index, rows)`` of each history) to the log at ``path``.

    Raises:
      SerializationError: the log cannot be written (the disk, the folder).
    """
    body = msgpack_codec().msgpack_serialize(
        {"training": [training[0], training[1]], "validation": [validation[0], validation[1]]}
    )
    _logfile.append(path, _RECORD.pack(len(body), hashlib.sha256(body).digest()) + body)


def read(path: Path, training: int, validation: int) -> tuple[list, list, str | None]:
    """The first ``training`` and ``validation`` rows in the log at ``path``.

    Returns ``(training rows, validation rows, problem)``: ``problem`` says what is missing
    (a missing or damaged log), None when every row was found.
    """
    blob, problem = _logfile.read(path, LIMIT)
    if problem is not None:
        return [], [], problem
    if not blob.startswith(MAGIC):
        return [], [], f"{str(path)!r} is not a difffn history log"
    rows: dict[str, list] = {"training": [], "validation": []}
    for _, body in _records(blob):
        try:
            record = msgpack_codec().msgpack_restore(body)
            for kind in rows:
                start, new = record[kind]
                kept = rows[kind]
                del kept[start:]
                if len(kept) == start:
                    kept.extend(dict(r) for r in new)
        except (KeyError, TypeError, ValueError):
            break
    found_t, found_v = rows["training"][:training], rows["validation"][:validation]
    if len(found_t) < training or len(found_v) < validation:
        return (
            found_t,
            found_v,
            f"the history log {str(path)!r} holds {len(found_t)} of {training} training rows and "
            f"{len(found_v)} of {validation} validation rows",
        )
    return found_t, found_v, None

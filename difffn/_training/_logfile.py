"""The file frame both history-log formats share: the folder check, a durable append and a
bounded read (the JSON-lines log, `_history_log.py`, and the older sha256-framed records,
`_rowlog.py`). Every open goes through `_core.files`: no link planted in the folder is
followed, no FIFO or device is read."""

from __future__ import annotations

import os
from pathlib import Path

from .._core import SerializationError, files

WHAT = "the history log"


def folder_of(path: Path) -> Path:
    """The log's folder, which must exist.

    Raises:
      SerializationError: it does not.
    """
    folder = Path(path).parent
    if not folder.is_dir():
        raise SerializationError(
            f"cannot write {str(path)!r}: the folder {str(folder)!r} does not exist. Fix: create "
            "it first."
        )
    return folder


def append(path: Path, data: bytes) -> None:
    """Append ``data`` to the log at ``path`` and sync it to disk.

    Raises:
      SerializationError: the log cannot be written (the disk, the folder).
    """
    folder_of(path)
    try:
        fd = files.open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, what=WHAT)
        with os.fdopen(fd, "ab") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as error:
        raise SerializationError(
            f"could not write {str(path)!r}: {error.strerror or error}."
        ) from error


def read(path: Path, limit: int) -> tuple[bytes, str | None]:
    """``(the log's bytes, None)``, or ``(b"", what went wrong)`` when it cannot be read."""
    try:
        return files.read_regular(path, limit=limit, what=WHAT), None
    except SerializationError as error:
        return b"", str(error)
    except OSError as error:
        return b"", f"the history log {str(path)!r} cannot be read ({error.strerror or error})"

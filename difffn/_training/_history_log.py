"""A checkpointed run's history rows as JSON lines: an open format, next to its checkpoints.

``net_history__<run>.jsonl`` in the checkpoint folder holds one JSON object per line, one line
per history row: ``{"kind": "training" | "validation", "row": <index in its history>,
"iteration": ..., "epoch": ..., "time_elapsed": ..., "learn_rate": ..., "loss": ..., <metric>:
...}``. Any JSON reader reads it; with pandas::

    frame = pandas.read_json(path, lines=True, precise_float=True)  # exact float64
    frame = frame.drop_duplicates(["kind", "row"], keep="last")  # a resume's repeated rows
    training = frame[frame["kind"] == "training"]

Numbers are written as Python's ``json`` writes floats (the shortest text that reads back to the
same float64, so a resume restores the history bit for bit); a NaN loss is ``NaN``, which
Python's ``json`` and pandas read (strict JSON has no NaN).

Writing (`append`) is the checkpoint's: each checkpoint appends the rows since the previous
one as whole lines in one write, flushed and fsync'ed before the checkpoint that counts on them
is written; the checkpoint records how many rows of each history it covers. A process's first
append cuts a torn last line off (`repair`: a process killed mid-append). Reading
(`read`) stops at the first line that is not a whole row; a row lands at its index, so a
run resumed from an older checkpoint overwrites the rows it repeats.

Runs whose checkpoints name a ``*.difffnlog`` (the earlier binary format, ``_rowlog``) still
read through ``_rowlog``; new runs write this format.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

from .._core import SerializationError, files
from . import _logfile

SUFFIX = ".jsonl"
NAME = re.compile(r"net_history__[0-9a-f]{16}\.jsonl")  # what file_name gives
LIMIT = 1 << 34  # bytes read of a log at most (16 GiB: some 10^8 rows)
_WHAT = _logfile.WHAT
KINDS = ("training", "validation")


def file_name(run_id: str) -> str:
    """The log's name in the checkpoint folder (``run_id`` as ``_rowlog.run_id``)."""
    return f"net_history__{run_id}{SUFFIX}"


def _parse(line: bytes) -> dict | None:
    """The row of one line (without its newline), or None when it is not a whole row."""
    try:
        record = json.loads(line)
    except (UnicodeDecodeError, ValueError):
        return None
    if (
        not isinstance(record, dict)
        or record.get("kind") not in KINDS
        or not isinstance(record.get("row"), int)
    ):
        return None
    return record


def _whole_lines(blob: bytes):
    """``(end offset, row)`` of each whole row, in order; stops at the first bad line."""
    offset = 0
    while True:
        newline = blob.find(b"\n", offset)
        if newline < 0:
            return
        record = _parse(blob[offset:newline])
        if record is None:
            return
        offset = newline + 1
        yield offset, record


def repair(path: Path) -> None:
    """Before a process first appends: cut a torn or damaged tail off the log (a process killed
    mid-append), so the rows appended after it stay readable.

    Raises:
      SerializationError: the log cannot be read or written.
    """
    folder = _logfile.folder_of(path)
    try:
        # never through a link planted in the folder, never a FIFO or device (_core.files)
        fd = files.open_regular(path, os.O_RDWR | os.O_CREAT, what=_WHAT)
        with os.fdopen(fd, "rb+") as handle:
            size = os.fstat(fd).st_size
            if size > LIMIT:
                raise SerializationError(
                    f"{_WHAT} {str(path)!r} has {size} bytes, more than the {LIMIT} difffn reads."
                )
            blob = handle.read(size)
            end = max((end for end, _ in _whole_lines(blob)), default=0)
            if end < len(blob):
                handle.truncate(end)
    except OSError as error:
        raise SerializationError(
            f"could not write {str(path)!r}: cannot create a file in {str(folder)!r} "
            f"({error.strerror or error})."
        ) from None


def _line(kind: str, index: int, row: dict) -> str:
    values = {}
    for name, value in row.items():
        if isinstance(value, float) and math.isnan(value):
            value = float("nan")  # one spelling of NaN, whatever its bits
        values[name] = value
    return json.dumps({"kind": kind, "row": index, **values}, allow_nan=True) + "\n"


def append(path: Path, training: tuple[int, list], validation: tuple[int, list]) -> None:
    """Append rows (``(start index, rows)`` of each history, host numbers) to the log.

    Raises:
      SerializationError: the log cannot be written (the disk, the folder).
    """
    text = "".join(
        _line(kind, start + k, row)
        for kind, (start, rows) in zip(KINDS, (training, validation), strict=True)
        for k, row in enumerate(rows)
    )
    _logfile.append(path, text.encode())


def read(path: Path, training: int, validation: int) -> tuple[list, list, str | None]:
    """The first ``training`` and ``validation`` rows in the log at ``path``.

    Returns ``(training rows, validation rows, problem)``: ``problem`` says what is missing
    (a missing or damaged log), None when every row was found.
    """
    blob, problem = _logfile.read(path, LIMIT)
    if problem is not None:
        return [], [], problem
    rows: dict[str, list] = {kind: [] for kind in KINDS}
    for _, record in _whole_lines(blob):
        kind, index = record.pop("kind"), record.pop("row")
        kept = rows[kind]
        del kept[index:]
        if len(kept) == index:
            kept.append(record)
    found_t, found_v = rows["training"][:training], rows["validation"][:validation]
    if len(found_t) < training or len(found_v) < validation:
        return (
            found_t,
            found_v,
            f"the history log {str(path)!r} holds {len(found_t)} of {training} training rows and "
            f"{len(found_v)} of {validation} validation rows",
        )
    return found_t, found_v, None

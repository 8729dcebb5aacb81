"""Opening files on the user's behalf without leaving the place the user named.

Every file difffn reads or writes that the user did not name one by one (a checkpoint's history
log, the checkpoints found in a folder, an ONNX model's external data) goes through here:

- a name read from a file is a bare name of the expected form (`bare_name`): never a path,
  never ``..``, never absolute;
- it is opened without following a symbolic link (``O_NOFOLLOW``) and without blocking
  (``O_NONBLOCK``: a planted FIFO does not hang the process), then required to be a regular file
  (a device such as ``/dev/zero``, a FIFO or a folder is refused before a byte is read);
- it is read with a size bound (`read_regular`): exactly the size the file has when it is
  opened, refused beyond ``limit``;
- writes open the file the same way (`open_regular`), so a symbolic link planted under the
  name is refused instead of followed (its target is never truncated or overwritten), and so is
  a file with more than one hard link.

A path the user names directly may be a link they made: ``follow=True`` follows it, and the file
it reaches must still be a regular file read with a bound. A folder the user names for difffn to
write in (a cache, a log folder) is checked by `writable_folder`.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

from ._errors import Error, SerializationError

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def bare_name(name: object, pattern: re.Pattern[str], *, source: str, what: str) -> str:
    """``name`` if it is a string matching ``pattern`` (a bare file name), else a named error.

    Args:
      name: the name as read from a file.
      pattern: the form it must have (anchored; it should not admit ``/``).
      source: the file the name was read from (named in the error).
      what: what the name is (``"the history log's name"``).

    Raises:
      SerializationError: not a string, or not of the form (a path, ``..``, another name).
    """
    if (
        not isinstance(name, str)
        or any(c in name for c in "/\\\0")
        or name in (".", "..")
        or pattern.fullmatch(name) is None
    ):
        raise SerializationError(
            f"{source!r} is malformed: {what} is {name!r}; expected a bare file name of the "
            f"form {pattern.pattern!r} in the same folder. difffn never opens a path read from a "
            "file outside that folder. Fix: use a file written by difffn, or another copy."
        )
    return name


def open_regular(
    path: str | os.PathLike,
    flags: int,
    *,
    what: str,
    follow: bool = False,
    error: type[Error] = SerializationError,
    mode: int = 0o666,
) -> int:
    """A descriptor of the regular file at ``path`` opened with ``flags`` (``os.O_*``).

    The last component is not followed when it is a symbolic link (unless ``follow``), a FIFO
    does not block the open, and anything but a regular file is refused.

    Raises:
      error: a symbolic link (not followed), a folder, or not a regular file.
      OSError: the system's other reasons (no such file, permissions), for the caller to word.
    """
    path = os.fspath(path)
    extra = _NONBLOCK | _CLOEXEC | (0 if follow else _NOFOLLOW)
    try:
        fd = os.open(path, flags | extra, mode)
    except OSError as failure:
        if failure.errno == errno.ELOOP or (not follow and os.path.islink(path)):
            raise error(
                f"{what} {path!r} is a symbolic link; difffn does not follow links it did not "
                "make (one planted there could point anywhere). Fix: replace the link by the "
                "file itself, or remove it."
            ) from None
        if failure.errno == errno.EISDIR:
            raise error(
                f"{what} {path!r} is a folder, not a file. Fix: pass the path of a file."
            ) from None
        raise  # the system's reason (permissions, a full disk): the caller words it
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise error(
                f"{what} {path!r} is not a regular file (it is a {_kind(info.st_mode)}); "
                "difffn reads and writes only regular files. Fix: remove it, or pass the path "
                "of a file."
            )
        writes = flags & (os.O_WRONLY | os.O_RDWR)
        if writes and info.st_nlink > 1:  # a hard link planted to a file elsewhere
            raise error(
                f"{what} {path!r} has {info.st_nlink} hard links; difffn writes only to a file "
                "that is nowhere else (writing would change the other names too). Fix: remove "
                "it; difffn makes a new one."
            )
        if _NONBLOCK:
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(
    path: str | os.PathLike,
    *,
    limit: int,
    what: str,
    follow: bool = False,
    error: type[Error] = SerializationError,
) -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit`` of them (see the module).

    Raises:
      error: as `open_regular`, or the file is larger than ``limit`` bytes.
      OSError: as `open_regular`.
    """
    fd = open_regular(path, os.O_RDONLY, what=what, follow=follow, error=error)
    with os.fdopen(fd, "rb") as handle:
        size = os.fstat(fd).st_size
        if size > limit:
            raise error(
                f"{what} {os.fspath(path)!r} has {size} bytes, more than the {limit} bytes "
                "difffn reads for it. Fix: check that it is the right file."
            )
        data = handle.read(size)
    return data


def regular_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a regular file itself (not a link to one), without opening it."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def inside(folder: Path, relative: str) -> bool:
    """Whether ``folder / relative`` stays in ``folder`` through no link (every component is a
    real folder, the last a regular file)."""
    parts = Path(relative).parts
    if not parts or Path(relative).is_absolute() or any(p in ("..", ".", "") for p in parts):
        return False
    current = Path(folder)
    for part in parts[:-1]:
        current = current / part
        try:
            if not stat.S_ISDIR(os.lstat(current).st_mode):
                return False
        except OSError:
            return False
    return regular_file(current / parts[-1])


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISDIR, "folder"),
    ):
        if test(mode):
            return name
    return "special file"


def writable_folder(value, error: Callable[[str], Exception]) -> str:
    """``value`` as an absolute folder path that exists or can be made, and that this user can
    write to; else ``error(problem)`` is raised, ``problem`` naming the path and the fix."""
    path = os.path.abspath(os.path.expanduser(os.fspath(value)))
    if os.path.exists(path) and not os.path.isdir(path):
        raise error(
            f"{path!r}, which is a file; it must be a folder. Fix: name a folder "
            "(it is created if missing), e.g. ~/.cache/difffn/xla."
        )
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    try:
        if not os.path.isdir(existing):
            raise NotADirectoryError(existing)
        with tempfile.TemporaryFile(dir=existing):  # the real test: can this user write there?
            pass
    except OSError as problem:
        raise error(
            f"{path!r}, which is not writable ({existing!r}: {type(problem).__name__}). "
            "Fix: name a folder you can write to."
        ) from None
    return path

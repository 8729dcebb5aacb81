"""The difffn file container: atomic writes and verified reads of a msgpack payload.

Layout of a file::

    b"DIFFFN\\x00\\x01"   8 bytes  magic (a difffn file, byte order marker)
    version            4 bytes  little-endian container version
    kind               16 bytes ASCII, zero padded ("network", "checkpoint", ...)
    length             8 bytes  little-endian payload length
    sha256             32 bytes checksum of the payload
    payload            msgpack (flax.serialization): dicts, lists, numbers, strings, arrays

Nothing in a file can run code on load: msgpack holds data only (never pickle). Writes go to a
temporary file in the same folder, which is flushed and fsync'ed, then renamed over the target,
then the folder is fsync'ed: after a crash at any point the target holds either the old file or
the new one, never a torn one; the file's mode follows the umask, as ``open`` would make it.
Reads check the header (magic, version, kind, and the length against the file's size) before
reading the payload, so a large foreign file fails at once, then the checksum before decoding
anything.
"""

from __future__ import annotations

import hashlib
import os
import struct
import tempfile
from pathlib import Path
from typing import Any, NoReturn

from .._core import SerializationError, files

MAGIC = b"DIFFFN\x00\x01"
VERSION = 1
_HEADER = struct.Struct("<8sI16sQ32s")


_READERS = {
    "network": "df.load(path, like=net)",
    "checkpoint": "df.load(path, like=net) or df.trainnet(..., resume_from=path)",
    "exported": "df.load_exported(path)",
}


def _as_path(path) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise SerializationError(
            f"the path must be a str or os.PathLike; got {type(path).__name__} {path!r}. Fix: "
            "pass a file name such as 'model.difffn'."
        )
    return Path(path)


def write(path: str | os.PathLike[str], kind: str, payload: dict[str, Any]) -> Path:
    """Serialize ``payload`` and write it atomically to ``path``; returns the path."""
    path = _as_path(path)
    data = msgpack_codec().msgpack_serialize(payload)
    header = _HEADER.pack(
        MAGIC,
        VERSION,
        kind.encode("ascii").ljust(16, b"\0"),
        len(data),
        hashlib.sha256(data).digest(),
    )
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise SerializationError(
            f"cannot write {str(path)!r}: the folder {str(folder)!r} does not exist. Fix: create "
            "it first (e.g. Path(folder).mkdir(parents=True))."
        )
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as error:  # a read-only folder, or one that holds no files (/proc)
        raise SerializationError(
            f"could not write {str(path)!r}: cannot create a file in {str(folder)!r} "
            f"({error.strerror or error}). The previous file, if any, is unchanged. Fix: write "
            "to a folder you can write to."
        ) from None
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # as open() would; mkstemp makes the file 0600
        with os.fdopen(fd, "wb") as handle:
            handle.write(header)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as error:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(error, FileNotFoundError) and not os.path.exists(tmp):
            raise SerializationError(
                f"could not write {str(path)!r}: its temporary file {os.path.basename(tmp)!r} "
                "was removed while it was being written, by another process: two runs (or two "
                f"programs) are writing to one folder, {str(folder)!r}. The previous file, if "
                "any, is unchanged. Fix: give each run its own folder (checkpoint_path)."
            ) from None
        if isinstance(error, OSError):
            raise SerializationError(
                f"could not write {str(path)!r}: {error.strerror or error}. The previous file, "
                "if any, is unchanged. Fix: pass the path of a file (not a folder) in a folder "
                "you can write to."
            ) from error
        raise
    _fsync_folder(folder)
    return path


def _umask() -> int:
    """The process's umask, read without changing it where the system says it."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # elsewhere: the only portable way, briefly set and restored
    os.umask(mask)
    return mask


def _fsync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # pragma: no cover - some platforms cannot open folders
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def read(
    path: str | os.PathLike[str], kind: str | tuple[str, ...], *, follow: bool = True
) -> dict[str, Any]:
    """Read and verify a container written by `write`; returns its payload (a dict).

    ``kind`` is the kind expected, or a tuple of the kinds accepted. The file must be a regular
    file (a FIFO or a device is refused before a byte is read, ``_core.files``); ``follow=False``
    (files found in a folder rather than named by the user) also refuses a symbolic link. The
    payload is read only after the header's length matched the file's size, so at most that
    many bytes are read.
    """
    path = _as_path(path)
    try:
        fd = files.open_regular(path, os.O_RDONLY, what="the difffn file", follow=follow)
        with os.fdopen(fd, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            head = handle.read(_HEADER.size)
            digest = _check_header(path, head, size, kind)
            data = handle.read(size - _HEADER.size)
    except FileNotFoundError:
        raise SerializationError(
            f"{str(path)!r} does not exist. Fix: check the path (relative paths start at "
            f"{os.getcwd()!r})."
        ) from None
    except OSError as error:
        raise SerializationError(f"cannot read {str(path)!r}: {error}.") from error
    if len(data) != size - _HEADER.size:
        raise SerializationError(f"{str(path)!r} changed while it was read. Read it again.")
    if hashlib.sha256(data).digest() != digest:
        raise SerializationError(
            f"{str(path)!r} is corrupted: its checksum does not match its contents. Use another "
            "copy."
        )
    try:
        payload = msgpack_codec().msgpack_restore(data)
    except Exception as error:  # a valid checksum over undecodable data: a writer bug
        raise SerializationError(f"{str(path)!r} could not be decoded: {error}.") from error
    if not isinstance(payload, dict):
        _malformed(str(path), f"the payload is a {type(payload).__name__}, not a dict")
    return payload


def _check_header(path: Path, head: bytes, size: int, kind) -> bytes:
    """Check a file's header (before its payload is read); returns the payload's checksum."""
    if len(head) < _HEADER.size or not head.startswith(MAGIC[:6]):
        raise SerializationError(
            f"{str(path)!r} is not a difffn file (no difffn header). Fix: pass a file written "
            "by df.save (or a difffn checkpoint)."
        )
    magic, version, file_kind, length, digest = _HEADER.unpack_from(head)
    if magic != MAGIC:
        raise SerializationError(f"{str(path)!r} has an unknown difffn header {magic!r}.")
    if version > VERSION:
        raise SerializationError(
            f"{str(path)!r} was written by a newer difffn (file format version {version}; this "
            f"version reads up to {VERSION}). Fix: upgrade difffn."
        )
    file_kind = file_kind.rstrip(b"\0").decode("ascii", "replace")
    kinds = (kind,) if isinstance(kind, str) else tuple(kind)
    if file_kind not in kinds:
        wanted = " or ".join(repr(k) for k in kinds)
        reader = _READERS.get(file_kind)
        raise SerializationError(
            f"{str(path)!r} holds a difffn {file_kind!r}, not a {wanted}."
            + (f" Fix: read it with {reader}." if reader else "")
        )
    if size - _HEADER.size != length:
        raise SerializationError(
            f"{str(path)!r} is truncated or has trailing bytes: expected a payload of {length} "
            f"bytes, found {size - _HEADER.size}. The file is damaged. Fix: use another copy."
        )
    return digest


# -- payload schemas ----------------------------------------------------------------------------


class Optional:
    """A schema that also accepts None."""

    def __init__(self, schema):
        self.schema = schema


class Each:
    """A dict whose values all follow one schema (keys are strings)."""

    def __init__(self, schema):
        self.schema = schema


def check_schema(value, schema, *, source: str, where: str = "the payload") -> None:
    """Check a decoded payload against ``schema`` before anything reads it.

    A schema is a type or a tuple of types; a dict ``{key: schema}`` of required keys (others are
    allowed); a one-item list ``[schema]`` for a list of such items; `Optional` or
    `Each`. A file that passed its checksum but does not fit was written so (by another
    program, or a difffn bug): a named error, never a ``KeyError`` deep in the reader.

    Raises:
      SerializationError: naming the first part that does not fit, expected vs got.
    """
    if isinstance(schema, Optional):
        if value is not None:
            check_schema(value, schema.schema, source=source, where=where)
        return
    if isinstance(schema, Each):
        check_schema(value, dict, source=source, where=where)
        for key, item in value.items():
            check_schema(item, schema.schema, source=source, where=f"{where}[{key!r}]")
        return
    if isinstance(schema, dict):
        check_schema(value, dict, source=source, where=where)
        for key, item in schema.items():
            if key not in value:
                _malformed(source, f"{where} lacks {key!r}")
            check_schema(value[key], item, source=source, where=f"{where}[{key!r}]")
        return
    if isinstance(schema, list):
        check_schema(value, list, source=source, where=where)
        for n, item in enumerate(value):
            check_schema(item, schema[0], source=source, where=f"{where}[{n}]")
        return
    types = schema if isinstance(schema, tuple) else (schema,)
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        wanted = " or ".join(t.__name__ for t in types)
        _malformed(source, f"{where} should be {wanted}, not {type(value).__name__}")


def _malformed(source: str, what: str) -> NoReturn:
    raise SerializationError(
        f"{source!r} is malformed: {what}. Its checksum is right, so it was written this way "
        "(by another program, or another version). Fix: write it again (df.save, or a new "
        "checkpoint), or use another copy."
    )


def msgpack_codec():
    """flax's msgpack codec, imported when a file is read or written: importing flax costs
    about a second (it loads flax.linen), which every ``import difffn`` would otherwise pay."""
    from flax import serialization

    return serialization

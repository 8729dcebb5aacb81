"""Checksums over every file of a checkpoint folder, so that damage is found before it is read.

orbax writes a checkpoint's arrays as tensorstore chunks and does not check them when it reads
them back: a flipped byte in an array file loads silently as a wrong number, a truncated file
is a raw tensorstore error. Before a checkpoint folder is committed (renamed to its final
name), the primary process lists every file in it with its size and SHA-256
(`write`, ``difffn_manifest.json``, itself checksummed); `verify` recomputes them
and names the first file that is missing, of another size, or of another checksum. A folder
without a manifest was never committed by difffn.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .._core import SerializationError
from .._core import files as _files

NAME = "difffn_manifest.json"
FORMAT = "difffn.checkpoint-manifest"
_CHUNK = 1 << 20
_LIMIT = 1 << 26  # bytes of a manifest read at most (some 300,000 files)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _listing(folder: Path) -> dict[str, dict]:
    files = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = Path(root) / name
            relative = path.relative_to(folder).as_posix()
            if relative != NAME:
                files[relative] = {"size": path.stat().st_size, "sha256": _sha256(path)}
    return dict(sorted(files.items()))


def _seal(files: dict) -> str:
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


def write(folder) -> Path:
    """List every file under ``folder`` with its size and checksum (flushed and fsync'ed)."""
    folder = Path(folder)
    files = _listing(folder)
    path = folder / NAME
    body = {"format": FORMAT, "algorithm": "sha256", "files": files, "seal": _seal(files)}
    with open(path, "w") as file:
        json.dump(body, file, indent=1)
        file.flush()
        os.fsync(file.fileno())
    return path


def verify(folder) -> None:
    """Check every file the manifest of ``folder`` lists.

    Raises:
      SerializationError: the manifest is missing or damaged, or a file it lists is missing,
        truncated or changed (the file is named).
    """
    folder = Path(folder)
    path = folder / NAME
    try:
        # never through a planted link, never a FIFO or a device, never unbounded
        body = json.loads(_files.read_regular(path, limit=_LIMIT, what=NAME))
        files = body["files"]
        if body.get("format") != FORMAT or _seal(files) != body["seal"]:
            raise ValueError("its seal does not match")
        if not isinstance(files, dict) or not all(
            isinstance(want, dict)
            and type(want.get("size")) is int
            and isinstance(want.get("sha256"), str)
            for want in files.values()
        ):
            raise ValueError("its files are not listed as {name: {size, sha256}}")
    except FileNotFoundError:
        raise SerializationError(
            f"{NAME} is missing (the checkpoint was not committed by difffn, or the file was lost)"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise SerializationError(f"{NAME} is damaged ({error})") from None
    for name, want in files.items():
        file = folder / name
        parts = Path(name).parts
        if not parts or Path(name).is_absolute() or any(p in ("..", ".") for p in parts):
            raise SerializationError(
                f"{NAME} lists {name!r}, which is not a file inside the checkpoint folder; "
                "difffn reads nothing outside it"
            )
        if os.path.lexists(file) and not _files.inside(folder, name):
            raise SerializationError(
                f"the file {name} is not a regular file of the checkpoint folder (a symbolic "
                "link, a FIFO, a device or a folder); difffn does not read it"
            )
        if not file.is_file():
            raise SerializationError(f"the file {name} is missing")
        size = file.stat().st_size
        if size != want["size"]:
            what = "truncated" if size < want["size"] else "longer than written"
            raise SerializationError(
                f"the file {name} is {what}: {size} bytes, {want['size']} written"
            )
        if _sha256(file) != want["sha256"]:
            raise SerializationError(
                f"the file {name} is corrupted: its checksum does not match the one written"
            )

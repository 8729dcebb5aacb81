"""Checkpoints of ``trainnet``: when they are due, which to resume from, and resuming.

``trainnet`` writes a checkpoint after an iteration or a completed epoch when the unit matches
``checkpoint_frequency_unit`` and the count is a multiple of ``checkpoint_frequency``
(`due`), and one of the result when training ends, so that resuming a finished run
returns its result. Every run, one process or many, writes the one format of
``_checkpoint_folder``: an orbax folder named like MATLAB's checkpoints,
``net_checkpoint__<iteration>__<yyyy_mm_dd__HH_MM_SS>``, committed atomically with a manifest of
checksums over every file, holding the progress of a
`TrainingState` with a fingerprint of what the numbers depend
on (``_fingerprint.py``), so that resuming with something else is a clear error rather than a
silently different run.

After a checkpoint is committed, the oldest ones beyond ``checkpoint_keep`` are deleted
(`prune`). A write that fails (a full disk, a read-only folder) is a
[`CheckpointWarning`][difffn.CheckpointWarning]: training goes on, and the older checkpoints
stay as they were.

Resuming reads a checkpoint, or the newest valid one in a folder (`find`): a damaged newest
checkpoint (a file flipped, truncated or missing, not a difffn checkpoint, from a newer difffn) is
reported with a [`CheckpointWarning`][difffn.CheckpointWarning] naming the file, and the previous
good one is used. In a multi-process run every process checks, and process 0's choice is every
process's. Checkpoints of earlier releases still resume: single files
``net_checkpoint__<iteration>__<date>.difffn`` (a difffn container of kind ``"checkpoint"``) and the
``<step>`` folders of multi-process runs (``_checkpoint_sharded``).
"""

from __future__ import annotations

import math
import os
import re
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

from .._core import SerializationError, files
from .._devices import broadcast_int
from .._network import Network
from .._persistence import check_network_structure, restore_network
from .._persistence import container as _container
from . import _fingerprint
from ._checkpoint_folder import FolderCheckpoint
from ._checkpoint_folder import Writer as Writer  # trainnet makes its writer through here
from ._checkpoint_sharded import ShardedCheckpoint
from ._checkpoint_sharded import steps as sharded_steps
from ._state import Checkpoint, CheckpointWarning, same_key

KIND = "checkpoint"
STALE = 60.0  # seconds after which a hidden write is a killed one's, not one in flight
# a checkpoint folder, or a single file of an earlier release (.difffn)
_NAME = re.compile(r"^net_checkpoint__(\d+)__(\d{4}_\d\d_\d\d__\d\d_\d\d_\d\d)(\.difffn)?$")


# -- writing ----------------------------------------------------------------------------------


def due(options, unit: str, count: int) -> bool:
    """Whether a checkpoint is due after ``count`` completed units (iterations or epochs)."""
    return (
        options.checkpoint_path is not None
        and options.checkpoint_frequency_unit == unit
        and count % options.checkpoint_frequency == 0
    )


def prune(folder, keep, *, written: Path | None = None) -> list[Path]:
    """Delete the oldest checkpoints in ``folder`` beyond the newest ``keep``; return them.

    Only checkpoints named like checkpoints are considered (and what a killed write left behind,
    hidden ``.net_checkpoint__*`` folders and files, is removed once it is `STALE` seconds
    old: a newer one may be another run's write in flight). ``written`` is never deleted.
    """
    folder = Path(folder)
    for stale in [*folder.glob(".net_checkpoint__*.tmp"), *folder.glob(".net_checkpoint__*")]:
        try:
            if time.time() - stale.lstat().st_mtime <= STALE:
                continue
            if stale.is_dir() and not stale.is_symlink():
                shutil.rmtree(stale, ignore_errors=True)
            else:
                stale.unlink()
        except OSError:
            pass
    if keep == math.inf:
        return []
    deleted = []
    for path in checkpoints(folder)[int(keep) :]:
        if written is not None and path == written:
            continue
        try:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
            deleted.append(path)
        except OSError:
            pass
    return deleted


def _iteration(path: Path) -> int:
    match = _NAME.match(path.name)
    return -1 if match is None else int(match.group(1))


def checkpoints(folder) -> list[Path]:
    """The checkpoints in ``folder`` (folders, and files of earlier releases), newest first (by
    date in the name, then iteration)."""
    found = []
    for path in Path(folder).iterdir():
        match = _NAME.match(path.name)
        if match and (
            path.is_symlink()  # named when read, never followed
            or (files.regular_file(path) if match.group(3) else path.is_dir())
        ):
            found.append(((match.group(2), int(match.group(1))), path))
    return [path for _, path in sorted(found, key=lambda item: item[0], reverse=True)]


# -- finding ----------------------------------------------------------------------------------


def open_checkpoint(path, *, follow: bool = True) -> Checkpoint:
    """Read and verify one checkpoint: a folder of this release or a file of an earlier one
    (``follow=False``: one found in a folder, where a symbolic link is refused, not followed)."""
    path = Path(path)
    if not follow and path.is_symlink():
        raise SerializationError(
            f"{str(path)!r} is a symbolic link named like a checkpoint; difffn does not follow "
            "links inside a checkpoint folder. Fix: remove the link, or pass the checkpoint it "
            "points to as resume_from."
        )
    if path.is_dir():
        return FolderCheckpoint.read_folder(path)
    return Checkpoint.from_payload(_container.read(path, KIND, follow=follow), str(path))


def read(path) -> dict[str, Any]:
    """Read and verify one checkpoint; returns its payload (the progress, for a folder)."""
    return open_checkpoint(path).payload


def find(resume_from, *, collective: bool = False) -> Checkpoint:
    """The checkpoint to resume from: one checkpoint, or the newest valid one in a folder.

    ``collective``: every process of a multi-process run calls this; each checks the
    checkpoints, and process 0's choice is every process's.

    Raises:
      SerializationError: no such file or folder, no checkpoint in the folder, none valid
        (each one tried is listed with why), or the checkpoint is not valid.
    """
    if not isinstance(resume_from, (str, os.PathLike)):
        raise SerializationError(
            f"trainnet: resume_from must be a checkpoint (a net_checkpoint__<iteration>__<date> "
            f"folder) or a folder of checkpoints; got {type(resume_from).__name__}."
        )
    path = Path(resume_from)
    if not path.exists():
        raise SerializationError(
            f"trainnet: resume_from={str(path)!r} does not exist. Fix: pass a checkpoint "
            "(net_checkpoint__<iteration>__<date>) or the checkpoint_path folder of the run."
        )
    if _NAME.match(path.name) or not path.is_dir():
        try:
            return open_checkpoint(path)
        except SerializationError as error:
            raise SerializationError(f"trainnet: resume_from={str(path)!r}: {error}") from None
    if path.name.isdigit() and (path / "progress").is_dir():  # an earlier multi-process one
        return ShardedCheckpoint.read(path.parent, int(path.name))
    candidates = checkpoints(path)
    sharded = sharded_steps(path)
    newest = _iteration(candidates[0]) if candidates else -1
    if sharded and sharded[0] >= newest:
        return _newest_sharded(path, sharded)
    if not candidates:
        raise SerializationError(
            f"trainnet: resume_from={str(path)!r} holds no checkpoints (folders named "
            "net_checkpoint__<iteration>__<date>). Fix: pass the checkpoint_path folder of the "
            "run, or a checkpoint."
        )
    damaged, chosen = [], None
    for n, candidate in enumerate(candidates):
        try:
            chosen = (n, open_checkpoint(candidate, follow=False))
            break
        except SerializationError as error:
            damaged.append((candidate, error))
    if collective:  # process 0's choice; -1: none valid
        agreed = broadcast_int(-1 if chosen is None else chosen[0] + 1) - 1
        if chosen is None or agreed != chosen[0]:
            chosen = None if agreed < 0 else (agreed, open_checkpoint(candidates[agreed]))
            damaged = [d for d in damaged if candidates.index(d[0]) < max(agreed, 0)]
    if chosen is not None:
        for bad, error in damaged:
            warnings.warn(
                f"trainnet: skipping the damaged checkpoint {bad.name} ({error}); resuming from "
                f"the previous good one, {Path(chosen[1].source).name}.",
                CheckpointWarning,
                stacklevel=3,
            )
        return chosen[1]
    tried = "; ".join(f"{bad.name}: {error}" for bad, error in damaged)
    raise SerializationError(
        f"trainnet: resume_from={str(path)!r}: none of its {len(damaged)} checkpoint(s) is "
        f"valid. Tried, newest first: {tried}. Fix: resume from another copy of the checkpoints, "
        "or start the run again."
    )


def _newest_sharded(folder: Path, steps: list[int]) -> Checkpoint:
    damaged = []
    for step in steps:
        try:
            checkpoint = ShardedCheckpoint.read(folder, step)
        except SerializationError as error:
            damaged.append((step, error))
            continue
        for bad, error in damaged:
            warnings.warn(
                f"trainnet: skipping the damaged checkpoint {bad} ({error}); resuming from the "
                f"previous good one, {step}.",
                CheckpointWarning,
                stacklevel=4,
            )
        return checkpoint
    tried = "; ".join(f"{bad}: {error}" for bad, error in damaged)
    raise SerializationError(
        f"trainnet: resume_from={str(folder)!r}: none of its {len(damaged)} checkpoint(s) is "
        f"valid. Tried, newest first: {tried}. Fix: resume from another copy of the checkpoints, "
        "or start the run again."
    )


# -- resuming ---------------------------------------------------------------------------------


def resume(
    checkpoint: Checkpoint, *, net: Network, key, fingerprint: dict[str, str], defaults
) -> Network:
    """Check that this call continues the run that wrote ``checkpoint``; its network.

    Checked, in order: the key the run started with, the network's structure (the restored
    network is returned), and the fingerprint (``defaults``: the option entries a checkpoint
    written before an option existed is taken to have).

    Raises:
      SerializationError: the first difference, named, with the fix.
    """
    source = checkpoint.source
    if not same_key(checkpoint.run_key, key):
        raise SerializationError(
            f"trainnet(resume_from={source!r}): the key differs from the key the run "
            "that wrote the checkpoint started with. Fix: pass that run's key, or "
            "leave key out to use the checkpoint's."
        )
    if checkpoint.sharded:  # its arrays are read onto the run's devices with the state's
        saved = checkpoint.payload.get("network")
        if saved is not None:  # the layers and connections (earlier releases did not save them)
            try:
                check_network_structure(saved, net, source)
            except SerializationError as error:
                raise SerializationError(
                    f"trainnet(resume_from={source!r}): {error} Fix: pass the network the run "
                    "started from (the same layers, names and sizes)."
                ) from None
        _fingerprint.check(
            checkpoint.fingerprint,
            fingerprint,
            source,
            defaults=defaults,
            load_network="orbax reads its arrays: orbax.checkpoint.PyTreeCheckpointer()"
            ".restore(checkpoint / 'arrays')",
        )
        return net
    try:
        restored = restore_network(checkpoint.network, net, source=source)
    except SerializationError as error:
        raise SerializationError(
            f"trainnet(resume_from={source!r}): {error} Fix: pass the network the run "
            "started from (the same layers, names and sizes)."
        ) from None
    _fingerprint.check(checkpoint.fingerprint, fingerprint, source, defaults=defaults)
    return restored

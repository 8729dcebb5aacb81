"""Checkpoints of ``trainnet``: find one to resume from, write them, and resume.

``trainnet`` writes a checkpoint (`Writer.save`) after an iteration or a completed epoch
when the unit matches ``checkpoint_frequency_unit`` and the count is a multiple of
``checkpoint_frequency`` (`due`), and one of the result when training ends
(`Writer.save_final`), so that resuming a finished run returns its result.

A checkpoint is a difffn container (``_container.py``: msgpack, checksum, atomic write; never
pickle, never code) of kind ``"checkpoint"`` named like MATLAB's,
``net_checkpoint__<iteration>__<yyyy_mm_dd__HH_MM_SS>.difffn``, holding the payload of a
`TrainingState` (its schema is written and read in ``_state.py``)
with a fingerprint of what the numbers depend on (``_fingerprint.py``), so that resuming with
something else is a clear error rather than a silently different run.

After a checkpoint is safely written (renamed into place and the folder fsync'ed), the oldest
ones beyond ``checkpoint_keep`` are deleted. A write that fails (a full disk, a read-only folder)
is a [`CheckpointWarning`][difffn.CheckpointWarning]: training goes on, and the older checkpoints
stay as they were.

Resuming reads a file, or the newest valid checkpoint in a folder: a damaged newest checkpoint
(truncated, corrupted, not a difffn file, from a newer difffn) is reported with a
[`CheckpointWarning`][difffn.CheckpointWarning] and the previous good one is used.

A multi-process run (``execution_environment="multi-host"``) writes its checkpoints through
orbax instead, collectively (``_checkpoint_sharded``): folders ``<iteration>`` in
``checkpoint_path``. `find` reads either kind (the newer, when a folder holds both).
"""

from __future__ import annotations

import math
import os
import re
import time
import warnings
from pathlib import Path
from typing import Any

from .._core import SerializationError
from .._network import Network
from .._persistence import container as _container
from .._persistence import restore_network
from . import _fingerprint, _rowlog
from ._checkpoint_sharded import ShardedCheckpoint
from ._checkpoint_sharded import steps as sharded_steps
from ._state import Checkpoint, CheckpointWarning, key_payload, plain_row, same_key

KIND = "checkpoint"
_NAME = re.compile(r"^net_checkpoint__(\d+)__(\d{4}_\d\d_\d\d__\d\d_\d\d_\d\d)\.difffn$")


# -- writing ----------------------------------------------------------------------------------


def due(options, unit: str, count: int) -> bool:
    """Whether a checkpoint is due after ``count`` completed units (iterations or epochs)."""
    return (
        options.checkpoint_path is not None
        and options.checkpoint_frequency_unit == unit
        and count % options.checkpoint_frequency == 0
    )


def file_name(iteration: int, when: float | None = None) -> str:
    """MATLAB's checkpoint name: ``net_checkpoint__<iteration>__<yyyy_mm_dd__HH_MM_SS>.difffn``."""
    stamp = time.strftime("%Y_%m_%d__%H_%M_%S", time.localtime(when))
    return f"net_checkpoint__{iteration}__{stamp}.difffn"


class Writer:
    """Writes the checkpoints of one run: when due, atomically, then prunes the old ones.

    The history rows go to the run's log (``_rowlog``): each checkpoint appends the rows since
    the previous one, then the checkpoint (which records how many rows it covers) is written.

    Args:
      options: the run's ``TrainingOptions``.
      fingerprint: what the run's numbers depend on (``_fingerprint.run_fingerprint``).
      run_key: the ``key`` the run was started with.
      resumed: the checkpoint the run resumed from (None: a new run).
    """

    def __init__(self, options, *, fingerprint: dict[str, str], run_key, resumed=None):
        self.folder = options.checkpoint_path
        self.keep = options.checkpoint_keep
        self.options = options
        self.fingerprint = fingerprint
        self.run_key = run_key
        self.iteration = None  # of the newest checkpoint written (or tried) for this run
        log = _rowlog.file_name(_rowlog.run_id(key_payload(run_key), fingerprint))
        self.log = Path(self.folder) / log
        self.logged = (0, 0)  # training and validation rows the log holds for this run
        self.repaired = False
        if resumed is not None:
            self.iteration = resumed.iteration
            if resumed.history_log is not None and resumed.history_log.resolve() == (
                self.log.resolve()
            ):
                self.logged = (resumed.history["training"], resumed.history["validation"])

    def save_final(self, state, *, elapsed: float, data_batch_size=None, data_position=None):
        """At the end of training: a checkpoint of the result, unless one of it exists.

        So resuming the folder of a finished run returns its result, not an older checkpoint's
        continuation.
        """
        if self.iteration == state.iteration:
            return None
        return self.save(
            state, elapsed=elapsed, data_batch_size=data_batch_size, data_position=data_position
        )

    def save(self, state, *, elapsed: float, data_batch_size=None, data_position=None):
        """Write a checkpoint of ``state``; return its path (None if it could not be written).

        A failed write (a full disk, a folder removed or read-only) warns with
        [`CheckpointWarning`][difffn.CheckpointWarning] and returns None; the checkpoints written
        before are left as
        they are.
        """
        self.iteration = state.iteration
        path = Path(self.folder) / file_name(state.iteration)
        rows = (len(state.training_rows), len(state.validation_rows))
        try:
            if not self.repaired:
                _rowlog.repair(self.log)
                self.repaired = True
            _rowlog.append(
                self.log,
                (self.logged[0], [plain_row(r) for r in state.training_rows[self.logged[0] :]]),
                (self.logged[1], [plain_row(r) for r in state.validation_rows[self.logged[1] :]]),
            )
            self.logged = rows
            payload = state.to_payload(
                elapsed=elapsed,
                fingerprint=self.fingerprint,
                run_key=self.run_key,
                history={"file": self.log.name, "training": rows[0], "validation": rows[1]},
                data_batch_size=data_batch_size,
                data_position=data_position,
            )
            _container.write(path, KIND, payload)
        except SerializationError as error:  # the disk or the folder, never the payload
            warnings.warn(
                f"trainnet: the checkpoint of iteration {state.iteration} could not be written "
                f"({error}) Training goes on; the older checkpoints in {str(self.folder)!r} are "
                "kept and still valid. Fix: free disk space, make the folder writable, or set "
                "another checkpoint_path.",
                CheckpointWarning,
                stacklevel=3,
            )
            return None
        prune(self.folder, self.keep, written=path)
        return path


def prune(folder, keep, *, written: Path | None = None) -> list[Path]:
    """Delete the oldest checkpoints in ``folder`` beyond the newest ``keep``; return them.

    Only files named like checkpoints are considered (and stale temporary files that a killed
    write left behind are removed). ``written`` is never deleted.
    """
    folder = Path(folder)
    for stale in folder.glob(".net_checkpoint__*.tmp"):
        try:
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
            path.unlink()
            deleted.append(path)
        except OSError:
            pass
    return deleted


def checkpoints(folder) -> list[Path]:
    """The checkpoint files in ``folder``, newest first (by date in the name, then iteration)."""
    found = []
    for path in Path(folder).iterdir():
        match = _NAME.match(path.name)
        if match and path.is_file():
            found.append(((match.group(2), int(match.group(1))), path))
    return [path for _, path in sorted(found, key=lambda item: item[0], reverse=True)]


# -- finding ----------------------------------------------------------------------------------


def read(path) -> dict[str, Any]:
    """Read and verify one checkpoint file; returns its payload."""
    return Checkpoint.from_payload(_container.read(path, KIND), str(path)).payload


def find(resume_from) -> Checkpoint:
    """The checkpoint to resume from: a file, or the newest valid checkpoint in a folder.

    Raises:
      SerializationError: no such file or folder, no checkpoint in the folder, none valid
        (each file tried is listed with why), or the file is not a valid checkpoint.
    """
    if not isinstance(resume_from, (str, os.PathLike)):
        raise SerializationError(
            f"trainnet: resume_from must be a checkpoint file or a folder of checkpoints; got "
            f"{type(resume_from).__name__}."
        )
    path = Path(resume_from)
    if not path.exists():
        raise SerializationError(
            f"trainnet: resume_from={str(path)!r} does not exist. Fix: pass a checkpoint file "
            "(net_checkpoint__<iteration>__<date>.difffn) or the checkpoint_path folder of the "
            "run."
        )
    if not path.is_dir():
        return Checkpoint(str(path), read(path))
    if path.name.isdigit() and (path / "progress").is_dir():  # one multi-process checkpoint
        return ShardedCheckpoint.read(path.parent, int(path.name))
    candidates = checkpoints(path)
    sharded = sharded_steps(path)
    newest_file = int(_NAME.match(candidates[0].name).group(1)) if candidates else -1
    if sharded and sharded[0] >= newest_file:
        return _newest_sharded(path, sharded)
    if not candidates:
        raise SerializationError(
            f"trainnet: resume_from={str(path)!r} holds no checkpoints (files named "
            "net_checkpoint__<iteration>__<date>.difffn). Fix: pass the checkpoint_path folder "
            "of the run, or a checkpoint file."
        )
    damaged = []
    for candidate in candidates:
        try:
            payload = read(candidate)
        except SerializationError as error:
            damaged.append((candidate, error))
            continue
        for bad, error in damaged:
            warnings.warn(
                f"trainnet: skipping the damaged checkpoint {bad.name} ({error}); resuming from "
                f"the previous good one, {candidate.name}.",
                CheckpointWarning,
                stacklevel=3,
            )
        return Checkpoint(str(candidate), payload)
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
        _fingerprint.check(checkpoint.fingerprint, fingerprint, source, defaults=defaults)
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

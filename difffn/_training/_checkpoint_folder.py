"""The checkpoints of every run, one process or many: orbax folders with MATLAB's names.

A checkpoint is the folder ``<checkpoint_path>/net_checkpoint__<iteration>__<yyyy_mm_dd__HH_MM_SS>``
(MATLAB's name, without ``.mat``) holding the ``arrays`` and ``progress`` items of
``_checkpoint_sharded`` and ``difffn_manifest.json`` (``_manifest``: the size and SHA-256 of
every file). Every process of the run calls `Writer.save`: orbax's ``Checkpointer`` writes
the items collectively into ``.net_checkpoint__…partial`` (its own temporary folder, renamed when
every process has written its shards); process 0 then writes the manifest, renames the folder to
its final name and fsyncs the checkpoint folder. After each of these steps the processes vote
(a collective): if any could not do its part, every process warns and training goes on. A
checkpoint is therefore there whole, checksummed, or not at all; a folder left by a killed write
keeps its hidden name and is removed by the next prune.

The history rows go to the run's log (``_history_log``: JSON lines, written by process 0);
``progress`` records how many rows the checkpoint covers.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

import jax
import numpy as np

from .._core import SerializationError, files
from .._devices import all_agree, broadcast_int
from .._persistence import check_schema, network_structure
from . import _history_log, _manifest, _rowlog
from ._checkpoint_sharded import FORMAT as PROGRESS_FORMAT
from ._checkpoint_sharded import ShardedCheckpoint, arrays_of, json_key, layout, ocp_module
from ._state import CheckpointWarning, key_payload, plain_row

PREFIX = "net_checkpoint__"


def folder_name(iteration: int, when: float | None = None) -> str:
    """MATLAB's checkpoint name: ``net_checkpoint__<iteration>__<yyyy_mm_dd__HH_MM_SS>``."""
    stamp = time.strftime("%Y_%m_%d__%H_%M_%S", time.localtime(when))
    return f"{PREFIX}{iteration}__{stamp}"


def _checkpointer():
    ocp = ocp_module()
    return ocp.Checkpointer(ocp.CompositeCheckpointHandler())


def _fsync_folder(folder: Path) -> None:
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


class Writer:
    """Writes the checkpoints of one run: when due, atomically, then prunes the old ones.

    Every process of a multi-process run makes one and calls `Writer.save` at the same points.

    Args:
      options: the run's ``TrainingOptions``.
      fingerprint: what the run's numbers depend on (``_fingerprint.run_fingerprint``).
      run_key: the ``key`` the run was started with.
      resumed: the checkpoint the run resumed from (None: a new run).
      prune: ``prune(folder, keep, written=path)``, called by process 0 after each commit.
    """

    def __init__(self, options, *, fingerprint: dict[str, str], run_key, resumed=None, prune):
        self.folder = Path(options.checkpoint_path)
        self.keep = options.checkpoint_keep
        self.fingerprint = fingerprint
        self.run_key = run_key
        self.prune = prune
        self.primary = jax.process_index() == 0
        self.iteration = None  # of the newest checkpoint written (or tried) for this run
        self.written: Path | None = None  # the newest committed by this run
        log = _history_log.file_name(_rowlog.run_id(key_payload(run_key), fingerprint))
        self.log = self.folder / log
        self.logged = (0, 0)  # training and validation rows the log holds for this run
        self.repaired = False
        self.checkpointer = _checkpointer()
        self.structure = None  # the network's layers and connections, once
        if resumed is not None:
            self.iteration = resumed.iteration
            if resumed.history_log is not None and resumed.history_log.resolve() == (
                self.log.resolve()
            ):
                self.logged = (resumed.history["training"], resumed.history["validation"])

    def save_final(self, state, *, elapsed: float, data_batch_size=None, data_position=None):
        """At the end of training: a checkpoint of the result, unless one of it exists."""
        if self.iteration == state.iteration:
            return None
        return self.save(
            state, elapsed=elapsed, data_batch_size=data_batch_size, data_position=data_position
        )

    def save(self, state, *, elapsed: float, data_batch_size=None, data_position=None):
        """Write a checkpoint of ``state``; return its folder (None if it could not be written).

        A failed write (a full disk, a folder removed or read-only) warns with
        [`CheckpointWarning`][difffn.CheckpointWarning] (in every process) and returns None; the
        checkpoints written before are kept. Every process takes each step or none does (a
        collective vote after each step), so no process waits for another that gave up.
        """
        self.iteration = state.iteration
        name = folder_name(state.iteration, broadcast_int(int(time.time())))
        final, partial = self.folder / name, self.folder / f".{name}.partial"
        rows = (len(state.training_rows), len(state.validation_rows))
        problems: list[str] = []

        def step(action) -> bool:  # run it, then vote: whether it went well everywhere
            try:
                action()
            except (OSError, ValueError, SerializationError) as error:  # the disk, the folder
                problems.append(str(error))
            return all_agree(not problems)

        def prepare():
            if not self.folder.is_dir():
                raise FileNotFoundError(f"the folder {str(self.folder)!r} does not exist")
            if self.primary:
                self._append_rows(state, rows)

        def write():
            arrays = arrays_of(state)
            progress = self._progress(state, arrays, rows, elapsed, data_batch_size, data_position)
            ocp = ocp_module()
            self.checkpointer.save(
                partial.absolute(),
                args=ocp.args.Composite(
                    arrays=ocp.args.StandardSave(arrays), progress=ocp.args.JsonSave(progress)
                ),
                force=True,
            )

        def commit():
            if self.primary:
                _manifest.write(partial)
                if final.exists():  # the same iteration in the same second: replace it
                    shutil.rmtree(final)
                os.replace(partial, final)
                _fsync_folder(self.folder)

        if not (step(prepare) and step(write) and step(commit)):
            if self.primary:
                shutil.rmtree(partial, ignore_errors=True)
            why = problems[0] if problems else "another process could not write its part"
            warnings.warn(
                f"trainnet: the checkpoint of iteration {state.iteration} could not be written "
                f"({why}). Training goes on; the older checkpoints in {str(self.folder)!r} are "
                "kept and still valid. Fix: free disk space, make the folder writable, or set "
                "another checkpoint_path.",
                CheckpointWarning,
                stacklevel=3,
            )
            return None
        self.logged = rows
        self.written = final
        if self.primary:
            self.prune(self.folder, self.keep, written=final)
        return final

    def _append_rows(self, state, rows) -> None:
        if not self.repaired:
            _history_log.repair(self.log)
            self.repaired = True
        _history_log.append(
            self.log,
            (self.logged[0], [plain_row(r) for r in state.training_rows[self.logged[0] :]]),
            (self.logged[1], [plain_row(r) for r in state.validation_rows[self.logged[1] :]]),
        )

    def _progress(self, state, arrays, rows, elapsed, data_batch_size, data_position) -> dict:
        if self.structure is None:
            self.structure = network_structure(state.network)
        progress = state.progress_payload(
            elapsed=elapsed,
            fingerprint=self.fingerprint,
            run_key=self.run_key,
            data_batch_size=data_batch_size,
            data_position=data_position,
        )
        progress.update(
            format=PROGRESS_FORMAT,
            order=None if state.order is None else np.asarray(state.order).tolist(),
            key=json_key(progress["key"]),
            run_key=json_key(progress["run_key"]),
            history={"file": self.log.name, "training": rows[0], "validation": rows[1]},
            layout={name: layout(tree) for name, tree in arrays.items()},
            network=self.structure,
        )
        return progress


@dataclasses.dataclass(frozen=True)
class FolderCheckpoint(ShardedCheckpoint):
    """A checkpoint folder of this release: verified against its manifest, then read."""

    @classmethod
    def read_folder(cls, path) -> FolderCheckpoint:
        """Verify every file of the checkpoint folder ``path``, then read its progress.

        Raises:
          SerializationError: a damaged or missing file (named), or not a difffn checkpoint.
        """
        path = Path(path)
        source = str(path)
        try:
            _manifest.verify(path)
        except SerializationError as error:
            raise SerializationError(f"{path.name} is damaged: {error}.") from None
        checkpointer = _checkpointer()
        progress = cls.progress(
            source, lambda args: checkpointer.restore(path.absolute(), args=args)
        )
        history = {"file": str, "training": int, "validation": int}
        check_schema(progress, {"history": history}, source=source, where="the progress")
        history = progress["history"]
        name = history["file"]
        # a bare name of the log's form (JSON lines; a run resumed from an earlier release's
        # checkpoint may name its *.difffnlog): never a path, '..', or a device
        pattern = _rowlog.NAME if str(name).endswith(".difffnlog") else _history_log.NAME
        files.bare_name(name, pattern, source=source, what="the history log's name")
        if history["training"] < 0 or history["validation"] < 0:
            raise SerializationError(
                f"{source!r} is malformed: its history counts {history['training']} training "
                f"and {history['validation']} validation rows; counts are not negative. Fix: use "
                "another copy."
            )
        return cls(source, progress, folder=str(path.parent))

    def restore(self, args) -> Any:
        return _checkpointer().restore(Path(self.source).absolute(), args=args)

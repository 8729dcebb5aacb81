"""Checkpoints of a multi-process run (``execution_environment="multi-host"``), through orbax.

In a multi-process run the learnables and optimizer state are global ``jax.Array``s whose
shards live in different processes, so no process can write them alone. orbax's
``CheckpointManager`` writes them collectively: every process writes the shards it holds into a
temporary folder ``<step>.orbax-checkpoint-tmp-<time>``, all processes meet at a barrier, and
process 0 commits the checkpoint by renaming the folder to ``<step>`` (orbax's atomic-rename
protocol), so a checkpoint is there whole or not at all; a folder left by a killed write is
never read. orbax also keeps the newest ``checkpoint_keep`` steps and restores each array onto
the shardings of the resuming run.

A checkpoint is the folder ``<checkpoint_path>/<iteration>`` with two items: ``arrays`` (orbax's
``StandardSave`` of the learnables, the other network leaves, the optimizer state and the
best-validation copies) and ``progress`` (``JsonSave`` of everything else: iteration, epoch,
position in the epoch, the epoch's order, keys as key data, shuffle seeds, best-validation
bookkeeping, loss-scaling state, history rows, the fingerprint, and each array's path, shape
and dtype, so a mismatch is named before orbax reads anything). The checkpoint folder must be
one that every process sees (a shared file system, or a cloud bucket orbax supports).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from pathlib import Path
from typing import Any

import jax
import numpy as np

from .._core import SerializationError
from ._state import FORMAT_VERSION, Checkpoint, CheckpointWarning, plain_row

FORMAT = "difffn.sharded-checkpoint"
ITEMS = ("arrays", "progress")


def _ocp():
    import orbax.checkpoint as ocp  # installed with flax; imported only when used

    return ocp


def _manager(folder, keep=None):
    ocp = _ocp()
    options = ocp.CheckpointManagerOptions(
        max_to_keep=None if keep is None or keep == math.inf else int(keep),
        enable_async_checkpointing=False,
        create=True,
    )
    return ocp.CheckpointManager(Path(folder).absolute(), item_names=ITEMS, options=options)


def _layout(tree) -> list:
    """``[path, shape, dtype]`` of every leaf (checked before orbax reads anything)."""
    return [
        [jax.tree_util.keystr(path), list(leaf.shape), np.dtype(leaf.dtype).name]
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
    ]


def _arrays(state) -> dict:
    arrays = {"learnables": state.learnables, "others": state.others, "optimizer": state.opt_state}
    if state.best_network is not None:
        arrays["best_learnables"], arrays["best_others"] = state.best_network
    return arrays


def _json_key(payload) -> dict:
    return {"data": np.asarray(payload["data"]).tolist(), "impl": payload["impl"]}


class ShardedWriter:
    """Writes the checkpoints of one multi-process run (every process calls [`save`][difffn.save]).

    The same interface as ``_checkpoint.Writer``.
    """

    def __init__(self, options, *, fingerprint: dict[str, str], run_key, resumed=None):
        self.folder = options.checkpoint_path
        self.fingerprint = fingerprint
        self.run_key = run_key
        self.manager = _manager(self.folder, options.checkpoint_keep)
        self.iteration = None if resumed is None else resumed.iteration

    def save_final(self, state, *, elapsed: float, data_batch_size=None, data_position=None):
        """At the end of training: a checkpoint of the result, unless one of it exists."""
        if self.iteration == state.iteration:
            return None
        return self.save(
            state, elapsed=elapsed, data_batch_size=data_batch_size, data_position=data_position
        )

    def save(self, state, *, elapsed: float, data_batch_size=None, data_position=None):
        """Write a checkpoint of ``state`` collectively; return its folder."""
        ocp = _ocp()
        self.iteration = state.iteration
        progress = state.progress_payload(
            elapsed=elapsed,
            fingerprint=self.fingerprint,
            run_key=self.run_key,
            data_batch_size=data_batch_size,
            data_position=data_position,
        )
        arrays = _arrays(state)
        progress.update(
            format=FORMAT,
            order=None if state.order is None else np.asarray(state.order).tolist(),
            key=_json_key(progress["key"]),
            run_key=_json_key(progress["run_key"]),
            training_rows=[plain_row(r) for r in state.training_rows],
            validation_rows=[plain_row(r) for r in state.validation_rows],
            layout={name: _layout(tree) for name, tree in arrays.items()},
        )
        try:
            self.manager.save(
                state.iteration,
                args=ocp.args.Composite(
                    arrays=ocp.args.StandardSave(arrays), progress=ocp.args.JsonSave(progress)
                ),
                force=True,
            )
            self.manager.wait_until_finished()
        except OSError as error:  # the disk or the folder, never the payload
            warnings.warn(
                f"trainnet: the checkpoint of iteration {state.iteration} could not be written "
                f"({error}). Training goes on; the older checkpoints in {str(self.folder)!r} are "
                "kept. Fix: free disk space, make the folder writable, or set another "
                "checkpoint_path.",
                CheckpointWarning,
                stacklevel=3,
            )
            return None
        return Path(self.folder) / str(state.iteration)


# -- reading --------------------------------------------------------------------------------------


def steps(folder) -> list[int]:
    """The committed checkpoint steps in ``folder``, newest first (none: an empty list)."""
    folder = Path(folder)
    found = [
        int(p.name)
        for p in folder.iterdir()
        if p.is_dir() and p.name.isdigit() and (p / "progress").is_dir()
    ]
    return sorted(found, reverse=True)


@dataclasses.dataclass(frozen=True)
class ShardedCheckpoint(Checkpoint):
    """A multi-process checkpoint: its progress read, its arrays read on `restore_arrays`."""

    folder: str = ""
    step: int = 0
    sharded = True

    @classmethod
    def read(cls, folder, step: int) -> ShardedCheckpoint:
        source = str(Path(folder) / str(step))
        ocp = _ocp()
        try:
            restored = _manager(folder).restore(
                step, args=ocp.args.Composite(progress=ocp.args.JsonRestore())
            )
            progress = dict(restored.progress)
        except Exception as error:  # noqa: BLE001 - any damage to the files, named below
            raise SerializationError(
                f"{source!r} is not a readable difffn checkpoint ({type(error).__name__}: "
                f"{str(error)[:200]})."
            ) from None
        if progress.get("format") != FORMAT:
            raise SerializationError(f"{source!r} does not hold a difffn training checkpoint.")
        if progress.get("format_version", 0) > FORMAT_VERSION:
            raise SerializationError(
                f"{source!r} holds a checkpoint in format version {progress['format_version']}, "
                f"newer than this difffn reads ({FORMAT_VERSION}). Fix: upgrade difffn."
            )
        for name in ("key", "run_key"):
            progress[name] = {
                "data": np.asarray(progress[name]["data"], dtype=np.uint32),
                "impl": progress[name]["impl"],
            }
        progress["history"] = None
        return cls(source, progress, folder=str(folder), step=step)

    @property
    def network(self) -> dict[str, Any]:
        raise SerializationError(
            f"{self.source!r} is a multi-process checkpoint (orbax); its network is read by "
            "trainnet(resume_from=...) with execution_environment='multi-host'."
        )

    def check_layout(self, state) -> None:
        """Name the first array whose path, shape or dtype differs from the run's."""
        fix = "Fix: resume with the network and options of the run that wrote the checkpoint."
        for name, tree in _arrays(state).items():
            want = _layout(tree)
            got = self.payload["layout"].get(name)
            if got is None:
                continue  # best-validation copies appear after the first validation
            for n, (w, g) in enumerate(zip(want, got, strict=False)):
                if list(w) != list(g):
                    raise SerializationError(
                        f"trainnet(resume_from={self.source!r}): {name} does not match at leaf "
                        f"{n + 1}: the run expects {w[0]!r} {tuple(w[1])} {w[2]}; the "
                        f"checkpoint has {g[0]!r} {tuple(g[1])} {g[2]}. {fix}"
                    )
            if len(want) != len(got):
                raise SerializationError(
                    f"trainnet(resume_from={self.source!r}): {name} has {len(got)} leaves in "
                    f"the checkpoint; the run expects {len(want)}. {fix}"
                )

    def restore_arrays(self, state) -> dict:
        """The checkpoint's arrays onto the devices and shardings of ``state``'s arrays."""
        ocp = _ocp()
        self.check_layout(state)
        templates = {"learnables": state.learnables, "others": state.others}
        templates["optimizer"] = state.opt_state
        if self.payload["best"] is not None and self.payload["best"]["network"]:
            templates["best_learnables"], templates["best_others"] = (
                state.learnables,
                state.others,
            )
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, templates)
        restored = _manager(self.folder).restore(
            self.step, args=ocp.args.Composite(arrays=ocp.args.StandardRestore(abstract))
        )
        return dict(restored.arrays)

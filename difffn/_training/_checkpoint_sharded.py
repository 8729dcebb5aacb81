"""Checkpoints as orbax folders: what a checkpoint folder holds, and reading the step folders
that multi-process runs of earlier releases wrote.

A checkpoint's arrays are global ``jax.Array``s whose shards may live in different processes, so
orbax writes them collectively (every process the shards it holds) and restores each array onto
the shardings of the resuming run, whatever its processes and devices. A checkpoint folder has
two items: ``arrays`` (orbax's ``StandardSave`` of the learnables, the other network leaves, the
optimizer state and the best-validation copies) and ``progress`` (``JsonSave`` of everything
else: iteration, epoch, position in the epoch, the epoch's order, keys as key data, shuffle
seeds, best-validation bookkeeping, loss-scaling state, the fingerprint, and each array's path,
shape and dtype, so a mismatch is named before orbax reads anything).

The writer and the folders of this release are ``_checkpoint_folder``'s (MATLAB's names, a
manifest of checksums). Earlier releases' multi-process runs wrote folders ``<step>`` through an
orbax ``CheckpointManager`` with the history rows in ``progress``: `ShardedCheckpoint`
still reads them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax
import numpy as np

from .._core import SerializationError
from .._persistence import Each, Optional, check_schema
from ._checkpoint_fields import check_key_payload
from ._state import FORMAT_VERSION, Checkpoint

FORMAT = "difffn.sharded-checkpoint"
ITEMS = ("arrays", "progress")
_NUMBER = (int, float)
_KEY = {"data": list, "impl": Optional(str)}
_LAYOUT = Optional([list])  # [path, shape, dtype] per leaf
SCHEMA = {  # the progress item, checked before anything reads it
    "iteration": int,
    "epoch": int,
    "batch": int,
    "order": Optional([int]),
    "key": _KEY,
    "run_key": _KEY,
    "shuffle_seed": [int],
    "best": Optional({"objective": _NUMBER, "iteration": int, "network": bool}),
    "bad_validations": int,
    "elapsed": _NUMBER,
    "stop_reason": Optional(str),
    "data_batch_size": Optional(int),
    "fingerprint": Each(str),
    "layout": Each(_LAYOUT),
}


def ocp_module():
    import orbax.checkpoint as ocp  # installed with flax; imported only when used

    return ocp


def _manager(folder):
    ocp = ocp_module()
    options = ocp.CheckpointManagerOptions(enable_async_checkpointing=False, create=False)
    return ocp.CheckpointManager(Path(folder).absolute(), item_names=ITEMS, options=options)


def layout(tree) -> list:
    """``[path, shape, dtype]`` of every leaf (checked before orbax reads anything)."""
    return [
        [jax.tree_util.keystr(path), list(leaf.shape), np.dtype(leaf.dtype).name]
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
    ]


def arrays_of(state) -> dict:
    arrays = {"learnables": state.learnables, "others": state.others, "optimizer": state.opt_state}
    if state.best_network is not None:
        arrays["best_learnables"], arrays["best_others"] = state.best_network
    return arrays


def json_key(payload) -> dict:
    return {"data": np.asarray(payload["data"]).tolist(), "impl": payload["impl"]}


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
        progress = cls.progress(source, lambda args: _manager(folder).restore(step, args=args))
        progress["history"] = None  # the rows are in progress itself
        return cls(source, progress, folder=str(folder), step=step)

    @staticmethod
    def progress(source: str, restore) -> dict[str, Any]:
        """The ``progress`` item, checked (``restore(args)``: orbax's restore of the folder)."""
        ocp = ocp_module()
        try:
            progress = dict(restore(ocp.args.Composite(progress=ocp.args.JsonRestore())).progress)
        except Exception as error:  # noqa: BLE001 - any damage to the files, named below
            raise SerializationError(
                f"{source!r} is not a readable difffn checkpoint ({type(error).__name__}: "
                f"{str(error)[:200]})."
            ) from None
        if progress.get("format") != FORMAT:
            raise SerializationError(f"{source!r} does not hold a difffn training checkpoint.")
        if "format_version" in progress:  # a crafted one is named, never compared raw
            check_schema(progress, {"format_version": int}, source=source, where="the progress")
        if progress.get("format_version", 0) > FORMAT_VERSION:
            raise SerializationError(
                f"{source!r} holds a checkpoint in format version {progress['format_version']}, "
                f"newer than this difffn reads ({FORMAT_VERSION}). Fix: upgrade difffn."
            )
        check_schema(progress, SCHEMA, source=source, where="the progress")
        for name, leaves in progress["layout"].items():  # [path, shape, dtype] per leaf
            for n, leaf in enumerate(leaves or []):
                if not (
                    len(leaf) == 3
                    and isinstance(leaf[0], str)
                    and isinstance(leaf[1], list)
                    and all(type(size) is int for size in leaf[1])
                    and isinstance(leaf[2], str)
                ):
                    raise SerializationError(
                        f"{source!r} is malformed: the progress['layout'][{name!r}][{n}] is "
                        f"{str(leaf)[:100]}, not [path, shape, dtype]. Fix: use another copy of "
                        "the checkpoint."
                    )
        for name in ("key", "run_key"):
            data = progress[name]["data"]
            if any(not isinstance(v, int) or not 0 <= v < 2**32 for v in data):
                raise SerializationError(
                    f"{source!r} is malformed: the progress[{name!r}]['data'] holds {data}, not "
                    "uint32 values. Fix: use another copy of the checkpoint."
                )
            progress[name] = {
                "data": np.asarray(data, dtype=np.uint32),
                "impl": progress[name]["impl"],
            }
            check_key_payload(progress[name], source=source, where=f"the progress[{name!r}]")
        return progress

    def restore(self, args) -> Any:
        """orbax's restore of this checkpoint's items (``args``: a ``Composite``)."""
        return _manager(self.folder).restore(self.step, args=args)

    @property
    def network(self) -> dict[str, Any]:
        raise SerializationError(
            f"{self.source!r} is an orbax checkpoint folder; its network is read by "
            "trainnet(resume_from=...)."
        )

    def check_layout(self, state) -> None:
        """Name the first array whose path, shape or dtype differs from the run's."""
        fix = "Fix: resume with the network and options of the run that wrote the checkpoint."
        for name, tree in arrays_of(state).items():
            want = layout(tree)
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
        ocp = ocp_module()
        self.check_layout(state)
        templates = {"learnables": state.learnables, "others": state.others}
        templates["optimizer"] = state.opt_state
        if self.payload["best"] is not None and self.payload["best"]["network"]:
            templates["best_learnables"], templates["best_others"] = (
                state.learnables,
                state.others,
            )
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, templates)
        try:
            restored = self.restore(ocp.args.Composite(arrays=ocp.args.StandardRestore(abstract)))
        except Exception as error:  # noqa: BLE001 - damaged array files (orbax, tensorstore)
            raise SerializationError(
                f"trainnet(resume_from={self.source!r}): its arrays cannot be read "
                f"({type(error).__name__}: {str(error)[:200]}). Fix: use another copy of the "
                "checkpoint, or resume from an older one."
            ) from None
        return dict(restored.arrays)

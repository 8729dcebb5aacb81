"""A training run's progress (``TrainingState``), its history and result, and their checkpoint form.

All progress lives in a `TrainingState` (network leaves, optimizer state, iteration,
epoch, position in the epoch, PRNG key, the epoch's data order, best-validation bookkeeping,
history), so a run can be checkpointed and resumed exactly. The checkpoint payload is one schema,
written (`TrainingState.to_payload`) and read (`Checkpoint`,
`TrainingState.restore`) in this file: the network (as ``df.save`` writes it, so
``df.load`` reads a checkpoint's network), the optimizer state (leaves by their pytree paths),
iteration, epoch, mini-batches done in the epoch, the epoch's data order, the step key and the
shuffle seeds, best-validation bookkeeping, history rows, elapsed time, why training stopped,
the key the run started with and its fingerprint (``_fingerprint.py``).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._core import SerializationError, __version__, files
from .._network import Network
from .._persistence import Each, Optional, check_schema, network_payload
from . import _history_log, _rowlog
from ._checkpoint_fields import check_key_payload, check_order
from ._precision import scaling_payload

FORMAT = "difffn.checkpoint"
FORMAT_VERSION = 2  # 2: the history rows in a log next to the checkpoints (_rowlog.py)

_TREE = {"paths": [str], "shapes": [[int]], "dtypes": [str], "values": [np.ndarray]}
_HISTORY = {"file": str, "training": int, "validation": int}
_KEY = {"data": np.ndarray, "impl": Optional(str)}
_NUMBER = (int, float, np.floating, np.integer)
SCHEMA = {
    "network": dict,  # _serialization.SCHEMA, checked when it is restored
    "optimizer": _TREE,
    "iteration": int,
    "epoch": int,
    "batch": int,
    "order": Optional(np.ndarray),
    "key": _KEY,
    "run_key": _KEY,
    "shuffle_seed": [int],
    "best": Optional(
        {
            "objective": _NUMBER,
            "iteration": int,
            "network": Optional({"learnables": _TREE, "others": _TREE}),
        }
    ),
    "bad_validations": int,
    "elapsed": _NUMBER,
    "stop_reason": Optional(str),
    "data_batch_size": Optional(int),
    "fingerprint": Each(str),
}


class CheckpointWarning(UserWarning):
    """A checkpoint could not be written, or a damaged one was skipped when resuming."""


# -- history and info ----------------------------------------------------------------------------


class History:
    """Rows of a training or validation history, with columns by name.

    ``history["loss"]`` is a numpy array of one column; ``history.rows()`` gives dicts;
    ``len(history)`` counts rows; ``history.columns`` names the columns.
    """

    columns: tuple[str, ...]

    def __init__(self, columns: Iterable[str], rows: Iterable[Mapping[str, Any]] = ()) -> None:
        self.columns = tuple(columns)
        self._rows = [dict(r) for r in rows]

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, column: str) -> np.ndarray:
        if column not in self.columns:
            raise KeyError(f"{column!r} is not a column; the columns are {list(self.columns)}.")
        values = [r.get(column) for r in self._rows]
        if column in ("iteration", "epoch"):
            return np.asarray(values, dtype=np.int64)
        return np.asarray([np.nan if v is None else v for v in values], dtype=np.float64)

    def rows(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self._rows]

    def __repr__(self) -> str:
        return f"History({len(self)} rows, columns={list(self.columns)})"


@dataclasses.dataclass(frozen=True)
class TrainingInfo:
    """What ``trainnet`` returns besides the network (MATLAB's ``TrainingInfo``).

    Attributes:
      training_history: one row per iteration: iteration, epoch, time_elapsed, learn_rate,
        loss and the training metrics.
      validation_history: one row per validation: iteration, epoch, time_elapsed, loss and the
        validation metrics (empty without validation data).
      stop_reason: why training stopped (``"Max epochs completed"``, ``"Stopped by validation
        patience"``, ``"Stopped by output_fcn"``, ``"Stopped by user"`` (the training-progress
        plot's stop file), ``"Training loss is NaN"``, ``"Training
        data exhausted"`` (a one-shot iterator ended, with ``steps_per_epoch``)).
      output_network_iteration: the iteration of the returned network.
      plot_path: the training-progress PNG, when ``plots="training-progress"``.
      elapsed: training time in seconds.
      skipped_steps: iterations whose update was skipped because their gradients overflowed
        (``precision="float16"``: the loss scale then shrinks); 0 otherwise.
    """

    training_history: History
    validation_history: History
    stop_reason: str
    output_network_iteration: int
    plot_path: str | None
    elapsed: float
    skipped_steps: int = 0


# -- the network as (learnable, other) leaves ----------------------------------------------------


def combine(treedef, learnable_index, learnables, others):
    """The network of ``treedef`` from its learnable leaves and its other leaves."""
    leaves = list(others)
    for i, value in zip(learnable_index, learnables, strict=True):
        leaves.insert(i, value)
    return jax.tree.unflatten(treedef, leaves)


def split(net, learnable_index):
    """``(learnable leaves, other leaves)`` of a network."""
    leaves = jax.tree.leaves(net)
    chosen = set(learnable_index)
    return [leaves[i] for i in learnable_index], [
        x for i, x in enumerate(leaves) if i not in chosen
    ]


# -- the state ----------------------------------------------------------------------------------


@dataclasses.dataclass
class TrainingState:
    """Everything a run needs to continue exactly where it is (checkpoint and resume).

    Attributes:
      treedef: the network's pytree structure.
      learnable_index: positions of the learnable leaves among the network's leaves.
      learnables: the learnable leaves (what the solver updates).
      others: the other leaves (state and constants), in leaf order.
      opt_state: the optax state of the solver chain.
      key: the base PRNG key of the steps (iteration ``i`` uses ``fold_in(key, i)``).
      shuffle_seed: integers that seed each epoch's data order.
      iteration: completed iterations.
      epoch: the current epoch (from 1; 0 before training).
      batch: mini-batches completed in the current epoch.
      order: the data order of the current epoch (array data), or None.
      best_objective, best_iteration, best_network: the best validation so far and copies of
        the (learnables, others) leaves at that iteration.
      bad_validations: validations in a row without improvement (for patience).
      training_rows, validation_rows: history rows (device scalars until logged).
      elapsed: seconds of training before this segment of the run.
      stop_reason: set when training stops.
      nan_at: the iteration of the first NaN loss, a device scalar the steps carry (0 before
        one; a checkpoint is written after it is read, so it is not part of the payload).
      scaling: the loss-scaling state the steps carry (``_precision.Scaling``: float16's
        dynamic loss scale and the count of skipped steps).
    """

    treedef: Any
    learnable_index: tuple[int, ...]
    learnables: list
    others: list
    opt_state: Any
    key: Any
    shuffle_seed: tuple[int, ...]
    iteration: int = 0
    epoch: int = 0
    batch: int = 0
    order: np.ndarray | None = None
    best_objective: float | None = None
    best_iteration: int | None = None
    best_network: tuple | None = None
    bad_validations: int = 0
    training_rows: list = dataclasses.field(default_factory=list)
    validation_rows: list = dataclasses.field(default_factory=list)
    elapsed: float = 0.0
    stop_reason: str | None = None
    nan_at: Any = 0  # on the device: the iteration of the first NaN loss (0: none yet)
    scaling: Any = None

    @property
    def network(self) -> Network:
        return combine(self.treedef, self.learnable_index, self.learnables, self.others)

    def best(self) -> Network | None:
        if self.best_network is None:
            return None
        return combine(self.treedef, self.learnable_index, *self.best_network)

    def record_validation(self, row: dict, *, objective: str, maximize: bool, keep: bool):
        """Add a validation row; track the best objective (and network, if ``keep``), patience."""
        self.validation_rows.append(row)
        value = row[objective]
        better = self.best_objective is None or (
            value > self.best_objective if maximize else value < self.best_objective
        )
        if better and not math.isnan(value):
            self.best_objective = value
            self.best_iteration = self.iteration
            if keep:
                self.best_network = jax.tree.map(jnp.copy, (self.learnables, self.others))
            if self.iteration > 0:
                self.bad_validations = 0
        elif self.iteration > 0:
            self.bad_validations += 1

    # -- the checkpoint payload ------------------------------------------------------------------

    def progress_payload(
        self, *, elapsed, fingerprint, run_key, data_batch_size, data_position=None
    ) -> dict[str, Any]:
        """Everything of this state but its arrays, as plain values (both checkpoint kinds).

        ``best`` holds the best objective and its iteration; ``best["network"]`` says whether
        best-validation copies of the network exist (their arrays are written apart).
        """
        best = None
        if self.best_objective is not None:
            assert self.best_iteration is not None  # set with the best objective
            best = {
                "objective": float(self.best_objective),
                "iteration": int(self.best_iteration),
                "network": self.best_network is not None,
            }
        return {
            "format_version": FORMAT_VERSION,
            "difffn_version": __version__,
            "written": time.time(),
            "iteration": int(self.iteration),
            "epoch": int(self.epoch),
            "batch": int(self.batch),
            "order": None if self.order is None else np.array(self.order, dtype=np.int32),
            "key": key_payload(self.key),
            "run_key": key_payload(run_key),
            "shuffle_seed": [int(s) for s in self.shuffle_seed],
            "best": best,
            "bad_validations": int(self.bad_validations),
            "elapsed": float(elapsed),
            "stop_reason": self.stop_reason,
            "data_batch_size": None if data_batch_size is None else int(data_batch_size),
            "data_position": None if data_position is None else int(data_position),
            "fingerprint": dict(fingerprint),
            "scaling": scaling_payload(self.scaling),
        }

    def to_payload(
        self, *, elapsed, fingerprint, run_key, history, data_batch_size, data_position=None
    ) -> dict[str, Any]:
        """The msgpack-ready contents of a checkpoint of this state.

        ``history`` names the log that holds the rows (``_rowlog``) and how many it covers.
        """
        payload = self.progress_payload(
            elapsed=elapsed,
            fingerprint=fingerprint,
            run_key=run_key,
            data_batch_size=data_batch_size,
            data_position=data_position,
        )
        if payload["best"] is not None:
            payload["best"]["network"] = (
                None
                if self.best_network is None
                else {
                    "learnables": tree_payload(self.best_network[0]),
                    "others": tree_payload(self.best_network[1]),
                }
            )
        return {
            "format": FORMAT,
            **payload,
            "network": network_payload(_host(self.network)),
            "optimizer": tree_payload(self.opt_state),
            "history": dict(history),
        }

    def restore(self, checkpoint: Checkpoint, *, placement) -> str | None:
        """Put a checkpoint's progress into this fresh state (after resume's checks).

        Returns what is missing of the history (its log lost or damaged; the training state
        itself is whole), or None.
        """
        saved, source = checkpoint.payload, checkpoint.source
        if checkpoint.sharded:
            arrays = checkpoint.restore_arrays(self)
            self.learnables, self.others = arrays["learnables"], arrays["others"]
            self.opt_state = arrays["optimizer"]
            if "best_learnables" in arrays:
                self.best_network = (arrays["best_learnables"], arrays["best_others"])
        else:
            fix = "Fix: resume with the options and network of the run that wrote the checkpoint."
            self.opt_state = restore_tree(
                saved["optimizer"],
                self.opt_state,
                what="the optimizer state",
                source=source,
                fix=fix,
            )
        self.key = restore_key(saved["key"])
        self.shuffle_seed = tuple(int(s) for s in saved["shuffle_seed"])
        self.iteration = int(saved["iteration"])
        self.epoch = int(saved["epoch"])
        self.batch = int(saved["batch"])
        order = saved["order"]
        self.order = None if order is None else check_order(order, source)
        best = saved["best"]
        if best is not None:
            self.best_objective = float(best["objective"])
            self.best_iteration = int(best["iteration"])
            if best["network"] is not None and not checkpoint.sharded:
                fix = "Fix: resume with the options and network of the run that wrote it."
                what = "the best-validation network"
                learnables = restore_tree(
                    best["network"]["learnables"],
                    self.learnables,
                    what=what,
                    source=source,
                    fix=fix,
                )
                others = restore_tree(
                    best["network"]["others"], self.others, what=what, source=source, fix=fix
                )
                shardings = [x.sharding for x in self.learnables]
                self.best_network = (placement.put(learnables, shardings), placement.put(others))
        self.bad_validations = int(saved["bad_validations"])
        self.training_rows, self.validation_rows, problem = checkpoint.history_rows()
        self.elapsed = float(saved["elapsed"])
        # A stop asked for by output_fcn or the user (the plot's stop file) is a pause: resuming
        # continues. Other stops are final.
        reason = saved["stop_reason"]
        paused = ("Stopped by output_fcn", "Stopped by user")
        self.stop_reason = None if reason in paused else reason
        return problem


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A checkpoint read and checked: what resuming needs before it builds the run."""

    source: str
    payload: dict[str, Any]
    sharded = False  # a multi-process checkpoint (``_checkpoint_sharded``) holds arrays apart

    def restore_arrays(self, state: Any) -> dict[str, Any]:
        """A sharded checkpoint's arrays, on ``state``'s devices (``ShardedCheckpoint``'s)."""
        raise NotImplementedError  # the others hold their arrays in the payload

    @classmethod
    def from_payload(cls, payload: dict[str, Any], source: str) -> Checkpoint:
        """Check a checkpoint's payload: format, version, and every field's type."""
        if not isinstance(payload, dict) or payload.get("format") != FORMAT:
            raise SerializationError(f"{source!r} does not hold a difffn training checkpoint.")
        check_schema(payload, {"format_version": int}, source=source)
        if payload["format_version"] > FORMAT_VERSION:
            raise SerializationError(
                f"{source!r} holds a checkpoint in format version {payload['format_version']}, "
                f"newer than this difffn reads ({FORMAT_VERSION}). Fix: upgrade difffn."
            )
        check_schema(payload, SCHEMA, source=source)
        check_schema(payload.get("data_position"), Optional(int), source=source, where="position")
        for name in ("key", "run_key"):
            check_key_payload(payload[name], source=source, where=f"the payload[{name!r}]")
        if payload["format_version"] >= 2:
            check_schema(payload, {"history": _HISTORY}, source=source)
            history = payload["history"]
            name = history["file"]
            pattern = _history_log.NAME if str(name).endswith(_history_log.SUFFIX) else _rowlog.NAME
            files.bare_name(name, pattern, source=source, what="the history log's name")
            if history["training"] < 0 or history["validation"] < 0:
                raise SerializationError(
                    f"{source!r} is malformed: its history counts {history['training']} "
                    f"training and {history['validation']} validation rows; counts are not "
                    "negative. Fix: use another copy."
                )
        else:  # version 1 held the rows themselves
            check_schema(
                payload, {"training_rows": [dict], "validation_rows": [dict]}, source=source
            )
        return cls(source, payload)

    @property
    def history(self) -> dict[str, Any] | None:
        """The history's log file and row counts (None: a version-1 checkpoint holds the rows)."""
        return self.payload.get("history")

    @property
    def history_log(self) -> Path | None:
        """The log of this checkpoint's history rows (None for a version-1 checkpoint)."""
        if self.history is None:
            return None
        return Path(self.source).parent / self.history["file"]

    def history_rows(self) -> tuple[list, list, str | None]:
        """``(training rows, validation rows, problem)``; ``problem`` names rows not found."""
        if self.history is None:
            rows = self.payload["training_rows"], self.payload["validation_rows"]
            return [dict(r) for r in rows[0]], [dict(r) for r in rows[1]], None
        # JSON lines since issue 28; the binary *.difffnlog of earlier runs still reads
        path = Path(self.source).parent / self.history["file"]
        log = _history_log if path.suffix == _history_log.SUFFIX else _rowlog
        return log.read(path, self.history["training"], self.history["validation"])

    @property
    def iteration(self) -> int:
        return int(self.payload["iteration"])

    @property
    def epoch(self) -> int:
        return int(self.payload["epoch"])

    @property
    def network(self) -> dict[str, Any]:
        """The network's payload (``_serialization.restore_network`` reads it)."""
        return self.payload["network"]

    @property
    def run_key(self):
        """The key the run that wrote it started with."""
        return restore_key(self.payload["run_key"])

    @property
    def fingerprint(self) -> dict[str, str]:
        return dict(self.payload["fingerprint"])

    @property
    def data_batch_size(self) -> int | None:
        """The batch size of the run's iterable data, once it was seen."""
        size = self.payload["data_batch_size"]
        return None if size is None else int(size)

    @property
    def data_position(self) -> int | None:
        """Items read from the current pass of a stream of batches (``steps_per_epoch``)."""
        position = self.payload.get("data_position")
        return None if position is None else int(position)


# -- pytrees and keys in payloads -----------------------------------------------------------------


def _host(tree):
    """Copies on the host: the trainer donates its device buffers to the next step."""
    return jax.tree.map(lambda x: np.array(jax.device_get(x)), tree)


def tree_payload(tree) -> dict[str, Any]:
    """A pytree of arrays as leaves by path, with shapes and dtypes (host copies)."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    values = [np.array(jax.device_get(leaf)) for _, leaf in leaves]
    return {
        "paths": [jax.tree_util.keystr(path) for path, _ in leaves],
        "shapes": [list(v.shape) for v in values],
        "dtypes": [v.dtype.name for v in values],
        "values": values,
    }


def restore_tree(data: dict[str, Any], template, *, what: str, source: str, fix: str):
    """The arrays of a `tree_payload` in the structure of ``template`` (checked first)."""
    expected = jax.tree_util.tree_flatten_with_path(template)[0]
    paths, shapes, dtypes = data["paths"], data["shapes"], data["dtypes"]
    if not len(paths) == len(shapes) == len(dtypes) == len(data["values"]):
        raise SerializationError(
            f"{source!r} is malformed: {what} lists {len(paths)} paths, {len(shapes)} shapes, "
            f"{len(dtypes)} dtypes and {len(data['values'])} values. Fix: use another copy."
        )
    for n, (path, leaf) in enumerate(expected):
        key = jax.tree_util.keystr(path)
        want = (key, tuple(np.shape(leaf)), np.dtype(leaf.dtype).name)
        if n >= len(paths):
            raise SerializationError(
                f"{source!r}: {what} does not match: the run expects a leaf at {key!r} "
                f"{want[1]} {want[2]} that the checkpoint lacks. {fix}"
            )
        got = (paths[n], tuple(shapes[n]), dtypes[n])
        if want != got:
            raise SerializationError(
                f"{source!r}: {what} does not match at leaf {n + 1}: the run expects {want[0]!r} "
                f"{want[1]} {want[2]}; the checkpoint has {got[0]!r} {got[1]} {got[2]}. {fix}"
            )
    if len(paths) > len(expected):
        raise SerializationError(
            f"{source!r}: {what} does not match: the checkpoint has {len(paths)} leaves, the run "
            f"expects {len(expected)} (extra: {paths[len(expected)]!r}). {fix}"
        )
    for n, (value, shape) in enumerate(zip(data["values"], shapes, strict=True)):
        if tuple(value.shape) != tuple(shape):
            raise SerializationError(
                f"{source!r} is malformed: {what} leaf {paths[n]!r} is listed with shape "
                f"{tuple(shape)} but holds {tuple(value.shape)}. Fix: use another copy."
            )
    leaves = [jnp.asarray(v, dtype=d) for v, d in zip(data["values"], dtypes, strict=True)]
    return jax.tree.unflatten(jax.tree.structure(template), leaves)


def key_payload(key) -> dict[str, Any]:
    """A PRNG key as its data and implementation name (``impl`` None: a raw ``uint32`` key)."""
    key = jax.device_get(key)
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        return {
            "data": np.array(jax.random.key_data(key)),
            "impl": str(jax.random.key_impl(key)),
        }
    return {"data": np.array(key), "impl": None}


def restore_key(data: dict[str, Any]):
    """The key of a `key_payload` (checked by `check_key_payload` when read)."""
    if data["impl"] is None:
        return jnp.asarray(data["data"])
    return jax.random.wrap_key_data(jnp.asarray(data["data"]), impl=data["impl"])


def same_key(a, b) -> bool:
    """Whether two keys are equal (data and implementation)."""
    a, b = key_payload(a), key_payload(b)
    return a["impl"] == b["impl"] and np.array_equal(a["data"], b["data"])


def _plain(value):
    if isinstance(value, (bool, str)) or value is None:
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    array = np.asarray(jax.device_get(value))
    if array.ndim == 0:
        return array.item()
    return array


def plain_row(row: dict) -> dict:
    """A history row of host numbers (for msgpack)."""
    return {str(k): _plain(v) for k, v in row.items()}

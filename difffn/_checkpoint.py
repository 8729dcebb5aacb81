"""Checkpoints of ``trainnet`` and resuming from them (``checkpoint_path``, ``resume_from=``).

``trainnet`` calls :meth:`Writer.maybe_save` after every iteration (``unit="iteration"``) and
after every completed epoch (``unit="epoch"``); a checkpoint is written when the unit matches
``checkpoint_frequency_unit`` and the count is a multiple of ``checkpoint_frequency``.

A checkpoint is a difffn container (``_container.py``: msgpack, checksum, atomic write; never
pickle, never code) of kind ``"checkpoint"`` named like MATLAB's,
``net_checkpoint__<iteration>__<yyyy_mm_dd__HH_MM_SS>.difffn``. It holds the whole
:class:`~difffn._trainer.TrainingState`: the network (as ``df.save`` writes it, so ``df.load``
reads a checkpoint's network), the optimizer state (leaves by their pytree paths), iteration,
epoch, mini-batches done in the epoch, the epoch's data order, the step key and the shuffle
seeds, best-validation bookkeeping, history rows, elapsed time and why training stopped; and a
fingerprint of what the numbers depend on (the options that change them, the loss, the data's
shapes, dtypes and a hash, the learn-rate and L2 factors) so that resuming with something else
is a clear error rather than a silently different run.

After a checkpoint is safely written (renamed into place and the folder fsync'ed), the oldest
ones beyond ``checkpoint_keep`` are deleted. A write that fails (a full disk, a read-only folder)
is a :class:`CheckpointWarning`: training goes on, and the older checkpoints stay as they were.

Resuming reads a file, or the newest valid checkpoint in a folder: a damaged newest checkpoint
(truncated, corrupted, not a difffn file, from a newer difffn) is reported with a
:class:`CheckpointWarning` and the previous good one is used.
"""

from __future__ import annotations

import hashlib
import math
import numbers
import os
import re
import time
import warnings
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import _container
from ._errors import SerializationError
from ._format import FormattedArray
from ._serialization import network_payload
from ._version import __version__

FORMAT = "difffn.checkpoint"
FORMAT_VERSION = 1
KIND = "checkpoint"
_NAME = re.compile(r"^net_checkpoint__(\d+)__(\d{4}_\d\d_\d\d__\d\d_\d\d_\d\d)\.difffn$")
_FULL_HASH_BYTES = 1 << 24  # arrays up to this size are hashed whole, larger ones sampled
_SAMPLE = 1 << 20  # elements hashed of a larger array


class CheckpointWarning(UserWarning):
    """A checkpoint could not be written, or a damaged one was skipped when resuming."""


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

    Args:
      options: the run's ``TrainingOptions``.
      fingerprint: what the run's numbers depend on (see :func:`fingerprint`).
      run_key: the ``key`` the run was started with.
    """

    def __init__(self, options, *, fingerprint: dict[str, str], run_key):
        self.folder = options.checkpoint_path
        self.keep = options.checkpoint_keep
        self.options = options
        self.fingerprint = fingerprint
        self.run_key = run_key

    def maybe_save(self, state, unit: str, *, elapsed: float, data_batch_size=None):
        """Write a checkpoint of ``state`` if one is due; return its path (None if not written).

        A failed write (a full disk, a folder removed or read-only) warns with
        :class:`CheckpointWarning` and returns None; the checkpoints written before are left as
        they are.
        """
        count = state.iteration if unit == "iteration" else state.epoch
        if not due(self.options, unit, count):
            return None
        payload = state_payload(
            state,
            elapsed=elapsed,
            fingerprint=self.fingerprint,
            run_key=self.run_key,
            data_batch_size=data_batch_size,
        )
        path = Path(self.folder) / file_name(state.iteration)
        try:
            _container.write(path, KIND, payload)
        except SerializationError as error:  # the disk or the folder, never the payload
            warnings.warn(
                f"trainnet: the checkpoint of iteration {state.iteration} could not be written "
                f"({error}) Training goes on; the older checkpoints in {str(self.folder)!r} are "
                "kept and still valid. Fix: free disk space, or set another checkpoint_path.",
                CheckpointWarning,
                stacklevel=2,
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


# -- the payload ------------------------------------------------------------------------------


def state_payload(state, *, elapsed, fingerprint, run_key, data_batch_size) -> dict[str, Any]:
    """The msgpack-ready contents of a checkpoint of a ``TrainingState``."""
    best = None
    if state.best_objective is not None:
        best = {
            "objective": float(state.best_objective),
            "iteration": int(state.best_iteration),
            "network": (
                None
                if state.best_network is None
                else {
                    "learnables": tree_payload(state.best_network[0]),
                    "others": tree_payload(state.best_network[1]),
                }
            ),
        }
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "difffn_version": __version__,
        "written": time.time(),
        "network": network_payload(_host(state.network)),
        "optimizer": tree_payload(state.opt_state),
        "iteration": int(state.iteration),
        "epoch": int(state.epoch),
        "batch": int(state.batch),
        "order": None if state.order is None else np.array(state.order, dtype=np.int32),
        "key": key_payload(state.key),
        "run_key": key_payload(run_key),
        "shuffle_seed": [int(s) for s in state.shuffle_seed],
        "best": best,
        "bad_validations": int(state.bad_validations),
        "training_rows": [_plain_row(r) for r in state.training_rows],
        "validation_rows": [_plain_row(r) for r in state.validation_rows],
        "elapsed": float(elapsed),
        "stop_reason": state.stop_reason,
        "data_batch_size": None if data_batch_size is None else int(data_batch_size),
        "fingerprint": dict(fingerprint),
    }


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
    """The arrays of a :func:`tree_payload` in the structure of ``template`` (checked first)."""
    expected = jax.tree_util.tree_flatten_with_path(template)[0]
    paths, shapes, dtypes = data["paths"], data["shapes"], data["dtypes"]
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
    """The key of a :func:`key_payload`."""
    if data["impl"] is None:
        return jnp.asarray(data["data"])
    return jax.random.wrap_key_data(jnp.asarray(data["data"]), impl=data["impl"])


def same_key(a: dict[str, Any], b: dict[str, Any]) -> bool:
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


def _plain_row(row: dict) -> dict:
    return {str(k): _plain(v) for k, v in row.items()}


# -- reading ----------------------------------------------------------------------------------


def read(path) -> dict[str, Any]:
    """Read and verify one checkpoint file; returns its payload."""
    payload = _container.read(path, KIND)
    if payload.get("format") != FORMAT:
        raise SerializationError(f"{str(path)!r} does not hold a difffn training checkpoint.")
    if int(payload.get("format_version", 0)) > FORMAT_VERSION:
        raise SerializationError(
            f"{str(path)!r} holds a checkpoint in format version {payload['format_version']}, "
            f"newer than this difffn reads ({FORMAT_VERSION}). Fix: upgrade difffn."
        )
    return payload


def find(resume_from) -> tuple[Path, dict[str, Any]]:
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
        return path, read(path)
    candidates = checkpoints(path)
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
        return candidate, payload
    tried = "; ".join(f"{bad.name}: {error}" for bad, error in damaged)
    raise SerializationError(
        f"trainnet: resume_from={str(path)!r}: none of its {len(damaged)} checkpoint(s) is "
        f"valid. Tried, newest first: {tried}. Fix: resume from another copy of the checkpoints, "
        "or start the run again."
    )


# -- fingerprint --------------------------------------------------------------------------------

# The options that change a run's numbers; resuming requires them unchanged. verbose, plots,
# output_fcn, execution_environment and the checkpoint options may change.
FINGERPRINT_OPTIONS = (
    "solver",
    "max_epochs",
    "mini_batch_size",
    "shuffle",
    "initial_learn_rate",
    "learn_rate_schedule",
    "learn_rate_schedule_settings",
    "learn_rate_drop_factor",
    "learn_rate_drop_period",
    "momentum",
    "gradient_decay_factor",
    "squared_gradient_decay_factor",
    "epsilon",
    "l2_regularization",
    "gradient_threshold_method",
    "gradient_threshold",
    "validation_frequency",
    "validation_patience",
    "objective_metric_name",
    "resolved_output_network",
    "metrics",
)


def fingerprint(options, *, loss, data: dict[str, str], factors: dict[str, str]) -> dict[str, str]:
    """What a run's numbers depend on, as ``{name: description}`` strings."""
    out = {f"option {name}": describe(getattr(options, name)) for name in FINGERPRINT_OPTIONS}
    out["option validation_data"] = describe_data(options.validation_data, "validation")
    out["loss"] = describe(loss)
    out.update(data)
    out.update(factors)
    return out


def check_fingerprint(saved: dict[str, str], current: dict[str, str], source: str) -> None:
    """Raise a clear error naming the first thing that differs between two fingerprints."""
    for name in list(current) + [n for n in saved if n not in current]:
        was, now = saved.get(name, "(absent)"), current.get(name, "(absent)")
        if was != now:
            raise SerializationError(
                f"trainnet(resume_from={source!r}): the run that wrote the checkpoint differs "
                f"in {name}: it had {was}; this call has {now}. Resuming continues "
                "that run exactly, so the options that change the numbers, the loss, the data "
                "and the network's factors must be the same. Fix: pass the same ones, or start "
                "a new run from the checkpoint's network (net = df.load(path, like=net))."
            )


def describe(value) -> str:
    """A stable description of an option value (callables by their qualified name)."""
    if isinstance(value, (str, bool, numbers.Number)) or value is None:
        return repr(value)
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(describe(v) for v in value) + "]"
    if isinstance(value, dict):
        items = sorted((str(k), describe(v)) for k, v in value.items())
        return "{" + ", ".join(f"{k!r}: {v}" for k, v in items) + "}"
    name = getattr(value, "name", None)
    if isinstance(name, str):  # a metric object
        return f"{type(value).__name__}({name!r})"
    if callable(value):
        module = getattr(value, "__module__", None) or type(value).__module__
        qualname = getattr(value, "__qualname__", None) or type(value).__qualname__
        return f"{module}.{qualname}"
    return type(value).__qualname__


def describe_array(x) -> str:
    """Shape, dtype and a hash of an array's values (sampled evenly when it is large)."""
    fmt = ""
    if isinstance(x, FormattedArray):
        fmt, x = f" {x.format}", x.data
    shape, dtype = tuple(np.shape(x)), np.dtype(x.dtype).name
    size = int(np.prod(shape, dtype=np.int64))
    if size * np.dtype(dtype).itemsize > _FULL_HASH_BYTES:
        step = max(1, size // _SAMPLE)
        sample = (jnp.ravel(x) if isinstance(x, jax.Array) else np.ravel(x))[::step]
        x = sample
    data = np.ascontiguousarray(np.asarray(jax.device_get(x)))
    digest = hashlib.sha256(data.tobytes()).hexdigest()[:16]
    return f"shape {shape} {dtype}{fmt}, hash {digest}"


def describe_data(data, what: str) -> str:
    """Describe training or validation data: arrays by :func:`describe_array`, else by type."""
    if data is None:
        return "None"
    if (
        isinstance(data, (tuple, list))
        and len(data) == 2
        and all(hasattr(x, "shape") for part in data for x in _group(part))
    ):
        return "; ".join(
            f"{name}[{k}] {describe_array(x)}"
            for name, part in zip(("X", "T"), data, strict=True)
            for k, x in enumerate(_group(part))
        )
    length = len(data) if hasattr(data, "__len__") else "unknown"
    return f"an iterable {type(data).__qualname__} of {length} {what} batches"


def _group(part) -> tuple:
    return tuple(part) if isinstance(part, (tuple, list)) else (part,)

"""Where the private modules were before the floors became packages, for files written then.

Files record some names by module path: a checkpoint's fingerprint names a loss, a metric or an
optax transformation by the qualified name of its function (``difffn._losses.crossentropy``), and
a ``df.save`` file names each layer's class. Those paths changed when the flat modules moved into
the floor packages (``difffn._losses`` -> ``difffn._scoring._losses``). Fingerprints keep naming
difffn's own functions by their former paths (`former_path`), so that a run's fingerprint is
the same string before and after the move and old checkpoints resume; class paths read from a file
are brought to the current layout (`current_path`) before they are compared.
"""

from __future__ import annotations

MOVED: dict[str, str] = {
    "difffn._data_description": "difffn._batching._data_description",
    "difffn._predict": "difffn._batching._predict",
    "difffn._sequence_predict": "difffn._batching._sequence_predict",
    "difffn._sequence_source": "difffn._batching._sequence_source",
    "difffn._sequences": "difffn._batching._sequences",
    "difffn._sources": "difffn._batching._sources",
    "difffn._check_common": "difffn._checking._check_common",
    "difffn._check_function": "difffn._checking._check_function",
    "difffn._check_function_gradients": "difffn._checking._check_function_gradients",
    "difffn._check_function_inputs": "difffn._checking._check_function_inputs",
    "difffn._check_layer": "difffn._checking._check_layer",
    "difffn._check_layer_backward": "difffn._checking._check_layer_backward",
    "difffn._check_layer_gradients": "difffn._checking._check_layer_gradients",
    "difffn._check_layer_precision": "difffn._checking._check_layer_precision",
    "difffn._check_layer_structure": "difffn._checking._check_layer_structure",
    "difffn._check_layer_subject": "difffn._checking._check_layer_subject",
    "difffn._check_list": "difffn._checking._check_list",
    "difffn._check_report": "difffn._checking._check_report",
    "difffn._check_second_order": "difffn._checking._check_second_order",
    "difffn._numerical": "difffn._checking._numerical",
    "difffn._arrays": "difffn._core._arrays",
    "difffn._batches": "difffn._core._batches",
    "difffn._describe": "difffn._core._describe",
    "difffn._errors": "difffn._core._errors",
    "difffn._format": "difffn._core._format",
    "difffn._formatted_array": "difffn._core._formatted_array",
    "difffn._keys": "difffn._core._keys",
    "difffn._labels": "difffn._core._labels",
    "difffn._mask": "difffn._core._mask",
    "difffn._signatures": "difffn._core._signatures",
    "difffn._user_code": "difffn._core._user_code",
    "difffn._version": "difffn._core._version",
    "difffn._distributed": "difffn._devices._distributed",
    "difffn._partition": "difffn._devices._partition",
    "difffn._sharding": "difffn._devices._sharding",
    "difffn._cotangents": "difffn._function._cotangents",
    "difffn._function": "difffn._function._function",
    "difffn._function_rules": "difffn._function._function_rules",
    "difffn._primitive": "difffn._function._primitive",
    "difffn._fields": "difffn._layer._fields",
    "difffn._input_layer": "difffn._layer._input_layer",
    "difffn._layer": "difffn._layer._layer",
    "difffn._layer_backward": "difffn._layer._layer_backward",
    "difffn._layer_call": "difffn._layer._layer_call",
    "difffn._parameters": "difffn._layer._parameters",
    "difffn._table": "difffn._layer._table",
    "difffn._cache": "difffn._network._cache",
    "difffn._execute": "difffn._network._execute",
    "difffn._factors": "difffn._network._factors",
    "difffn._graph": "difffn._network._graph",
    "difffn._graph_edit": "difffn._network._graph_edit",
    "difffn._network": "difffn._network._network",
    "difffn._network_inputs": "difffn._network._network_inputs",
    "difffn._propagate": "difffn._network._propagate",
    "difffn._container": "difffn._persistence._container",
    "difffn._deploy": "difffn._persistence._deploy",
    "difffn._export": "difffn._persistence._export",
    "difffn._serialization": "difffn._persistence._serialization",
    "difffn._losses": "difffn._scoring._losses",
    "difffn._metrics": "difffn._scoring._metrics",
    "difffn._checkpoint": "difffn._training._checkpoint",
    "difffn._checkpoint_sharded": "difffn._training._checkpoint_sharded",
    "difffn._compilation_cache": "difffn._network._compilation_cache",
    "difffn._fingerprint": "difffn._training._fingerprint",
    "difffn._option_checks": "difffn._training._option_checks",
    "difffn._options": "difffn._training._options",
    "difffn._precision": "difffn._training._precision",
    "difffn._progress": "difffn._training._progress",
    "difffn._rowlog": "difffn._training._rowlog",
    "difffn._schedules": "difffn._training._schedules",
    "difffn._solvers": "difffn._training._solvers",
    "difffn._state": "difffn._training._state",
    "difffn._step": "difffn._training._step",
    "difffn._train_args": "difffn._training._train_args",
    "difffn._trainer": "difffn._training._trainer",
}
_FORMER = {new: old for old, new in MOVED.items()}


def _translate(qualified: str, table: dict[str, str]) -> str:
    """``qualified`` with its longest module prefix found in ``table`` replaced."""
    parts = qualified.split(".")
    for k in range(len(parts), 1, -1):
        replaced = table.get(".".join(parts[:k]))
        if replaced is not None:
            return ".".join([replaced, *parts[k:]])
    return qualified


def former_path(qualified: str) -> str:
    """A qualified name as the flat layout spelled it (``difffn._scoring._losses.mse`` ->
    ``difffn._losses.mse``); any other name unchanged."""
    return _translate(qualified, _FORMER)


def current_path(qualified: str) -> str:
    """A qualified name written by the flat layout, in today's layout; any other unchanged."""
    return _translate(qualified, MOVED)

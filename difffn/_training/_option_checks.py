"""The validators of ``TrainingOptions``: one per kind of value, used by the rows of the options
table (``_options.OPTIONS``).

A validator is ``check(name, value, checked) -> stored value``: it raises ``df.OptionsError``
naming the option, what it got and what it takes, and returns the value to store; ``checked``
holds the options earlier in the table (so ``objective_metric_name`` can read ``metrics``).
"""

from __future__ import annotations

import difflib
import math
import numbers
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import optax

from .._core import OptionsError, files
from .._devices import MESH_ENVIRONMENTS
from .._network import compilation_cache as compilation_cache_module
from .._scoring import Metric, get_metric
from . import _schedules
from ._tensorboard import summary_writer_class

SOLVERS = ("sgdm", "adam", "rmsprop")
SHUFFLE = ("once", "every-epoch", "never")
THRESHOLD_METHODS = ("l2norm", "global-l2norm", "absolute-value")
OUTPUT_NETWORK = ("auto", "last-iteration", "best-validation")
PLOTS = ("none", "training-progress")
CHECKPOINT_UNITS = ("epoch", "iteration")
PARAMETER_SHARDINGS = ("replicated", "fsdp")
PRECISIONS = ("float32", "bfloat16", "float16")
MESH_AXES = ("data", "model")

# check(name, value, checked) -> the stored value; ``checked`` holds the options before this one.
Check = Callable[[str, Any, Mapping[str, Any]], Any]


def is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def choice(choices: Sequence[str], hints: Mapping[str, str] | None = None) -> Check:
    def check(name, value, checked):
        if not isinstance(value, str) or value not in choices:
            listed = ", ".join(repr(c) for c in choices)
            hint = (hints or {}).get(value, "") if isinstance(value, str) else ""
            close = difflib.get_close_matches(value, choices, n=1) if isinstance(value, str) else []
            raise OptionsError(
                f"TrainingOptions: {name} must be one of {listed}; got {value!r}.{hint} Fix: "
                f"{name}={(close or choices)[0]!r}, or another of those."
            )
        return value

    return check


def positive_int(*, allow_inf: bool = False, allow_none: bool = False) -> Check:
    def check(name, value, checked):
        if allow_inf and is_real(value) and value == math.inf:
            return math.inf
        if allow_none and value is None:
            return None
        if not (is_int(value) and value > 0):
            more = " or math.inf" if allow_inf else " or None" if allow_none else ""
            raise OptionsError(
                f"TrainingOptions: {name} must be a positive int{more}; got {value!r}. Fix: "
                f"pass a whole number >= 1 (e.g. {name}=10), or leave {name} out for its default."
            )
        return int(value)

    return check


def steps_per_execution(name, value, checked):
    """``"auto"`` or a positive int (the most training iterations one compiled call runs)."""
    if value == "auto":
        return value
    if not isinstance(value, str) and is_int(value) and value > 0:
        return int(value)
    raise OptionsError(
        f"TrainingOptions: {name} must be 'auto' or a positive int; got {value!r}. Fix: "
        f"{name}='auto' (several iterations per call on one CPU device), 1 (one per call) "
        f"or a number such as {name}=16."
    )


def real(*, low=None, high=None, low_open=False, high_open=False, inf=False) -> Check:
    def check(name, value, checked):
        ok = is_real(value) and not math.isnan(value)
        if ok and not inf and math.isinf(value):
            ok = False
        if ok and low is not None:
            ok = value > low if low_open else value >= low
        if ok and high is not None:
            ok = value < high if high_open else value <= high
        if not ok:
            lo = "" if low is None else ("(" if low_open else "[") + f"{low}"
            hi = "" if high is None else f"{high}" + (")" if high_open else "]")
            what = f"a real number in {lo}, {hi}" if lo or hi else "a real number"
            if low == 0 and low_open and high is None:
                what = "a positive real number" + (" or math.inf" if inf else "")
            elif low == 0 and not low_open and high is None:
                what = "a non-negative real number"
            raise OptionsError(
                f"TrainingOptions: {name} must be {what}; got {value!r}. Fix: pass {what} as a "
                f"Python float, or leave {name} out for its default."
            )
        return float(value)

    return check


def solver(name, value, checked):
    if isinstance(value, optax.GradientTransformation):
        return value
    if not isinstance(value, str) or value not in SOLVERS:
        listed = ", ".join(repr(c) for c in SOLVERS)
        raise OptionsError(
            f"TrainingOptions: solver must be one of {listed}, or an optax.GradientTransformation "
            f"(e.g. optax.inject_hyperparams(optax.lion)(learning_rate=1e-4)); got {value!r}. Fix: "
            "pass one of those names as the first argument, or the optax transformation."
        )
    return value


def solver_label(solver) -> str:
    """How messages and ``repr`` name a solver."""
    return repr(solver) if isinstance(solver, str) else "<optax transformation>"


def learn_rate(name, value, checked):
    if value is None and not isinstance(checked["solver"], str):
        return None  # a custom solver's own (its injected learning_rate)
    return real(low=0, low_open=True)(name, value, checked)


def boolean(name, value, checked):
    if not isinstance(value, bool):
        raise OptionsError(
            f"TrainingOptions: {name} must be True or False; got {value!r}. Fix: {name}=True or "
            f"{name}=False."
        )
    return value


def schedule(name, value, checked):
    _schedules.validate(value, None)
    return value


def schedule_settings(name, value, checked):
    _, per_name = _schedules.validate(checked["learn_rate_schedule"], value)
    return per_name or None


def validation_data(name, value, checked):
    if value is None:
        return None
    parts = value if isinstance(value, (tuple, list)) else None
    if hasattr(value, "shape") or (
        parts is not None
        and 1 <= len(parts) <= 2
        and hasattr(parts[0], "shape")
        and (len(parts) == 1 or parts[1] is None)
    ):
        shape = tuple(getattr(value if parts is None else parts[0], "shape", ()))
        raise OptionsError(
            "TrainingOptions: validation_data must hold inputs and targets, (X, T); got inputs "
            f"of shape {shape} without targets. Fix: validation_data=(X_val, T_val)."
        )
    if isinstance(value, (str, bytes)) or not (
        isinstance(value, (tuple, list)) or hasattr(value, "__iter__")
    ):
        raise OptionsError(
            "TrainingOptions: validation_data must be (X, T) (arrays, or a tuple of inputs and "
            f"a tuple of targets) or an iterable of (inputs..., targets...) batches; got "
            f"{type(value).__name__}. Fix: validation_data=(X_val, T_val)."
        )
    return value


def metrics(name, value, checked) -> tuple[Metric, ...]:
    items = value if isinstance(value, (tuple, list)) else (value,)
    metrics = tuple(get_metric(m, who="TrainingOptions: metrics") for m in items)
    names = [m.name for m in metrics]
    if len(set(names)) != len(names):
        raise OptionsError(
            f"TrainingOptions: metrics has repeated names {names}. Fix: give each metric its own "
            "name (FunctionMetric(fn, name=...))."
        )
    if "loss" in names:
        raise OptionsError(
            "TrainingOptions: a metric may not be called 'loss' (the loss is). Fix: name it "
            "otherwise (FunctionMetric(fn, name='my_loss'))."
        )
    return metrics


def objective(name, value, checked):
    names = ["loss"] + [m.name for m in checked["metrics"]]
    if value not in names:
        raise OptionsError(
            f"TrainingOptions: objective_metric_name must be 'loss' or one of the metrics; "
            f"got {value!r}. Valid here: {names}. Fix: add it to metrics."
        )
    return value


def output_network(name, value, checked):
    value = choice(OUTPUT_NETWORK)(name, value, checked)
    if value == "best-validation" and checked["validation_data"] is None:
        raise OptionsError(
            "TrainingOptions: output_network='best-validation' needs validation_data. Fix: "
            "pass validation_data=(X_val, T_val), or use 'last-iteration'."
        )
    return value


def plots_path(name, value, checked):
    if value is not None and not isinstance(value, (str, os.PathLike)):
        raise OptionsError(
            f"TrainingOptions: plots_path must be a file path or None; got {value!r}. Fix: "
            "plots_path='progress.png'."
        )
    return None if value is None else os.fspath(value)


def callables(name, value, checked):
    if value is None:
        return ()
    items = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    for item in items:
        if not callable(item):
            raise OptionsError(
                f"TrainingOptions: {name} must be a callable fn(info) -> bool or a sequence "
                f"of them; got {type(item).__name__}. Fix: pass a function (or a list of "
                "functions) of the training info that returns True to stop."
            )
    return items


def folder(name, value, checked):
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)) or not os.path.isdir(value):
        raise OptionsError(
            f"TrainingOptions: {name} must be an existing folder; got {value!r}. Fix: create "
            "it first (os.makedirs(path, exist_ok=True))."
        )
    return os.fspath(value)


def parameter_sharding(name, value, checked):
    value = choice(PARAMETER_SHARDINGS)(name, value, checked)
    _needs_mesh(name, value, value != "replicated", checked)
    return value


def mesh_shape(name, value, checked):
    """``{"data": n, "model": m}`` (one size may be -1: the devices left), stored as a tuple of
    (axis, size) pairs in ``MESH_AXES`` order; the device count is checked when training starts.
    """
    if value is None:
        return None
    example = "{'data': 2, 'model': 2}"
    if not isinstance(value, Mapping) or not value:
        raise OptionsError(
            f"TrainingOptions: {name} must be a dict of mesh axis sizes, e.g. {example}; got "
            f"{value!r}. Fix: {name}={example} (or leave it out: every device on 'data')."
        )
    unknown = [k for k in value if k not in MESH_AXES]
    if unknown:
        raise OptionsError(
            f"TrainingOptions: {name} names the mesh axis {unknown[0]!r}; the axes are "
            f"{list(MESH_AXES)} (the batch splits over 'data', parameters may split over "
            f"'model'). Fix: e.g. {name}={example}."
        )
    for axis, size in value.items():
        if not (is_int(size) and (size > 0 or size == -1)):
            raise OptionsError(
                f"TrainingOptions: {name}[{axis!r}] must be a positive int (or -1: the devices "
                f"left over); got {size!r}. Fix: e.g. {name}={example}."
            )
    if sum(1 for s in value.values() if s == -1) > 1:
        raise OptionsError(
            f"TrainingOptions: {name} may leave at most one axis size to be inferred (-1); got "
            f"{dict(value)!r}. Fix: give every axis but one its size, e.g. {name}={example}."
        )
    _needs_mesh(name, value, True, checked)
    return tuple((axis, int(value.get(axis, 1))) for axis in MESH_AXES)


def _needs_mesh(name, value, needed: bool, checked) -> None:
    environment = checked["execution_environment"]
    if needed and environment not in MESH_ENVIRONMENTS:
        raise OptionsError(
            f"TrainingOptions: {name}={value!r} applies to training over a mesh of devices, but "
            f"execution_environment={environment!r} runs on one device. Fix: "
            "execution_environment='multi-device' (this process's devices) or 'multi-host' "
            f"(every process's), or leave {name} out."
        )


def log_dir(name, value, checked):
    """A folder for TensorBoard event files (created when training starts); needs tensorboardX."""
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise OptionsError(
            f"TrainingOptions: {name} must be a folder path or None; got {type(value).__name__}. "
            "Fix: log_dir='runs/experiment1'."
        )
    path = os.path.abspath(os.path.expanduser(os.fspath(value)))
    if os.path.exists(path) and not os.path.isdir(path):
        raise OptionsError(
            f"TrainingOptions: {name} must be a folder; {path!r} is a file. Fix: name a folder "
            "(it is created if missing), e.g. log_dir='runs/experiment1'."
        )
    summary_writer_class()
    return path


def compilation_cache(name, value, checked):
    """``"auto"`` (the user's cache folder, see ``_compilation_cache``), None, False or
    ``"off"`` (off: the words ``DIFFFN_COMPILATION_CACHE`` takes for off), or a folder JAX may
    write compiled programs to: existing, or creatable (it is made when training starts)."""
    if value is None or value is False:
        return None
    if isinstance(value, str) and value.lower() in compilation_cache_module.OFF_WORDS:
        return None  # as the environment variable reads it, not a folder named "off"
    if isinstance(value, str) and value == "auto":
        return value
    if not isinstance(value, (str, os.PathLike)):
        raise OptionsError(
            f"TrainingOptions: {name} must be 'auto', a folder path or None (off); got "
            f"{type(value).__name__}."
        )
    return files.writable_folder(
        value, lambda problem: OptionsError(f"TrainingOptions: {name}={problem}")
    )

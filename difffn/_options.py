"""``TrainingOptions``: MATLAB's ``trainingOptions``, in snake_case, with MATLAB's defaults.

Options are validated when the object is made: an unknown name or a bad value raises
``df.OptionsError`` listing the valid names or values. The object is immutable;
``options.replace(**changes)`` returns a new one. ``repr`` shows only what differs from the
solver's defaults.

Decisions where MATLAB leaves room (documented on the class): ``learn_rate_schedule_settings``
holds the settings of the named schedules (see :mod:`difffn._schedules`); ``plots_path`` says
where ``plots="training-progress"`` writes its PNG; solver-specific options given to another
solver are an error (e.g. ``momentum`` for ``"adam"``).
"""

from __future__ import annotations

import difflib
import math
import numbers
import os
import re
from collections.abc import Sequence
from typing import Any

from . import _schedules
from ._errors import OptionsError
from ._metrics import Metric, get_metric

SOLVERS = ("sgdm", "adam", "rmsprop")
SHUFFLE = ("once", "every-epoch", "never")
THRESHOLD_METHODS = ("l2norm", "global-l2norm", "absolute-value")
OUTPUT_NETWORK = ("auto", "last-iteration", "best-validation")
PLOTS = ("none", "training-progress")
ENVIRONMENTS = ("auto", "cpu", "gpu", "multi-device")
CHECKPOINT_UNITS = ("epoch", "iteration")

_SOLVER_DEFAULTS: dict[str, dict[str, Any]] = {
    "sgdm": {"initial_learn_rate": 0.01, "momentum": 0.9},
    "adam": {
        "initial_learn_rate": 0.001,
        "gradient_decay_factor": 0.9,
        "squared_gradient_decay_factor": 0.999,
        "epsilon": 1e-8,
    },
    "rmsprop": {"initial_learn_rate": 0.001, "squared_gradient_decay_factor": 0.9, "epsilon": 1e-8},
}
_SOLVER_SPECIFIC = ("momentum", "gradient_decay_factor", "squared_gradient_decay_factor", "epsilon")

_COMMON_DEFAULTS: dict[str, Any] = {
    "max_epochs": 30,
    "mini_batch_size": 128,
    "shuffle": "once",
    "initial_learn_rate": None,
    "learn_rate_schedule": "none",
    "learn_rate_schedule_settings": None,
    "learn_rate_drop_factor": 0.1,
    "learn_rate_drop_period": 10,
    "l2_regularization": 1e-4,
    "gradient_threshold_method": "l2norm",
    "gradient_threshold": math.inf,
    "validation_data": None,
    "validation_frequency": 50,
    "validation_patience": math.inf,
    "objective_metric_name": "loss",
    "output_network": "auto",
    "metrics": (),
    "verbose": True,
    "verbose_frequency": 50,
    "plots": "none",
    "plots_path": None,
    "output_fcn": None,
    "execution_environment": "auto",
    "checkpoint_path": None,
    "checkpoint_frequency": 1,
    "checkpoint_frequency_unit": "epoch",
    "checkpoint_keep": 3,
}
OPTION_NAMES = tuple(sorted(set(_COMMON_DEFAULTS) | set(_SOLVER_SPECIFIC)))


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _choice(name: str, value, choices: Sequence[str], hint: str = "") -> str:
    if not isinstance(value, str) or value not in choices:
        options = ", ".join(repr(c) for c in choices)
        raise OptionsError(
            f"TrainingOptions: {name} must be one of {options}; got {value!r}.{hint}"
        )
    return value


def _positive_int(name: str, value, *, allow_inf: bool = False):
    if allow_inf and _is_real(value) and value == math.inf:
        return math.inf
    if not (_is_int(value) and value > 0):
        more = " or math.inf" if allow_inf else ""
        raise OptionsError(f"TrainingOptions: {name} must be a positive int{more}; got {value!r}.")
    return int(value)


def _real(name: str, value, *, low=None, high=None, low_open=False, high_open=False, inf=False):
    ok = _is_real(value) and not math.isnan(value)
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
        raise OptionsError(f"TrainingOptions: {name} must be {what}; got {value!r}.")
    return float(value)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _check_validation_data(value):
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not (
        isinstance(value, (tuple, list)) or hasattr(value, "__iter__")
    ):
        raise OptionsError(
            "TrainingOptions: validation_data must be (X, T) (arrays, or a tuple of inputs and "
            f"a tuple of targets) or an iterable of (inputs..., targets...) batches; got "
            f"{type(value).__name__}."
        )
    return value


def _check_callables(name: str, value):
    if value is None:
        return ()
    items = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    for item in items:
        if not callable(item):
            raise OptionsError(
                f"TrainingOptions: {name} must be a callable fn(info) -> bool or a sequence "
                f"of them; got {type(item).__name__}."
            )
    return items


def _check_metrics(value) -> tuple[Metric, ...]:
    items = value if isinstance(value, (tuple, list)) else (value,)
    metrics = tuple(get_metric(m, who="TrainingOptions: metrics") for m in items)
    names = [m.name for m in metrics]
    if len(set(names)) != len(names):
        raise OptionsError(f"TrainingOptions: metrics has repeated names {names}.")
    if "loss" in names:
        raise OptionsError("TrainingOptions: a metric may not be called 'loss' (the loss is).")
    return metrics


class TrainingOptions:
    """Training options (MATLAB ``trainingOptions``) for ``df.trainnet``.

    Args:
      solver: ``"sgdm"`` (default), ``"adam"`` or ``"rmsprop"``.
      max_epochs: passes through the data (30).
      mini_batch_size: observations per iteration (128); the last partial mini-batch of an
        epoch is dropped.
      shuffle: ``"once"`` (default, before training), ``"every-epoch"`` or ``"never"``.
      initial_learn_rate: 0.01 for sgdm, 0.001 for adam and rmsprop.
      learn_rate_schedule: ``"none"``, ``"piecewise"``, ``"warmup"``, ``"polynomial"``,
        ``"exponential"``, ``"cosine"``, ``"cyclical"``, a callable, or a sequence of them
        (see :mod:`difffn._schedules`).
      learn_rate_schedule_settings: settings of the named schedules, e.g.
        ``{"num_steps": 3}`` or ``{"warmup": {...}, "cosine": {"period": 20}}``.
      learn_rate_drop_factor, learn_rate_drop_period: the ``"piecewise"`` schedule's drop
        factor (0.1) and period in epochs (10).
      momentum: sgdm's momentum (0.9).
      gradient_decay_factor: adam's (0.9).
      squared_gradient_decay_factor: adam's (0.999) and rmsprop's (0.9).
      epsilon: adam's and rmsprop's denominator offset (1e-8).
      l2_regularization: coupled L2: ``λ · l2_factor · W`` is added to each gradient (1e-4),
        for every solver.
      gradient_threshold_method: ``"l2norm"`` (per parameter), ``"global-l2norm"`` or
        ``"absolute-value"`` (elementwise).
      gradient_threshold: clipping threshold (``math.inf``: no clipping).
      validation_data: ``(X, T)`` or an iterable of batches.
      validation_frequency: in iterations (50).
      validation_patience: validations without improvement before stopping (``math.inf``).
      objective_metric_name: ``"loss"`` or a metric name; what patience and best-validation
        watch.
      output_network: ``"auto"`` (best-validation with validation data, else last-iteration),
        ``"last-iteration"`` or ``"best-validation"``.
      metrics: names (``"accuracy"``, ``"precision"``, ``"recall"``, ``"fscore"``, ``"auc"``,
        ``"rmse"``), callables ``fn(Y, T)`` or ``df.metrics.Metric`` objects.
      verbose: print the progress table (True).
      verbose_frequency: in iterations (50).
      plots: ``"none"`` or ``"training-progress"`` (a matplotlib PNG written at the end; its
        path is printed).
      plots_path: the PNG's path (default ``training_progress.png`` in the working directory).
      output_fcn: ``fn(info) -> bool`` or a sequence; called at start, every iteration and at
        the end with a dict of progress; returning True stops training.
      execution_environment: ``"auto"``, ``"cpu"``, ``"gpu"`` or ``"multi-device"`` (batches
        sharded over ``jax.devices()``; ``mini_batch_size`` must be a multiple of the device
        count).
      checkpoint_path: an existing folder for checkpoints (None: no checkpoints). Each is a
        ``net_checkpoint__<iteration>__<date>.difffn`` file with everything needed to resume
        (``df.trainnet(..., resume_from=folder)``); ``df.load(file, like=net)`` reads its
        network. Use one folder per run: pruning counts every checkpoint in the folder.
      checkpoint_frequency: every this many units (1).
      checkpoint_frequency_unit: ``"epoch"`` (default) or ``"iteration"``.
      checkpoint_keep: how many of the newest checkpoints to keep (3); older ones are deleted
        once a new one is safely written. ``math.inf`` keeps them all (MATLAB's behavior).

    Raises:
      OptionsError: an unknown option, a bad value, or an option of another solver.

    Examples:
      >>> import difffn as df
      >>> options = df.TrainingOptions("adam", max_epochs=5)
      >>> options
      TrainingOptions('adam', max_epochs=5)
      >>> options.initial_learn_rate, options.squared_gradient_decay_factor
      (0.001, 0.999)
      >>> try:
      ...     df.TrainingOptions(max_epoch=5)
      ... except df.OptionsError as error:
      ...     print(str(error)[:72])
      TrainingOptions: unknown option 'max_epoch' (did you mean 'max_epochs'?)
    """

    def __init__(self, solver: str = "sgdm", **options):
        solver = _choice("solver", solver, SOLVERS)
        unknown = [k for k in options if k not in OPTION_NAMES]
        if unknown:
            name = unknown[0]
            close = difflib.get_close_matches(_snake(name), OPTION_NAMES, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise OptionsError(
                f"TrainingOptions: unknown option {name!r}{hint}. Valid options: "
                f"{', '.join(OPTION_NAMES)}."
            )
        for name in _SOLVER_SPECIFIC:
            if name in options and name not in _SOLVER_DEFAULTS[solver]:
                takers = [s for s in SOLVERS if name in _SOLVER_DEFAULTS[s]]
                raise OptionsError(
                    f"TrainingOptions: {name} is an option of solver(s) {takers}, not of "
                    f"{solver!r}. The {solver!r} options are "
                    f"{sorted(set(_SOLVER_DEFAULTS[solver]) - {'initial_learn_rate'})}."
                )
        values = {**_COMMON_DEFAULTS, **_SOLVER_DEFAULTS[solver]}
        for name in _SOLVER_SPECIFIC:
            values.setdefault(name, None)
        if options.get("initial_learn_rate") is None:
            options.pop("initial_learn_rate", None)
        values.update(options)
        checked = self._check(solver, values)
        d = self.__dict__
        d["solver"] = solver
        d["_given"] = dict(options)
        d.update(checked)

    @staticmethod
    def _check(solver: str, v: dict[str, Any]) -> dict[str, Any]:
        c: dict[str, Any] = {}
        c["max_epochs"] = _positive_int("max_epochs", v["max_epochs"])
        c["mini_batch_size"] = _positive_int("mini_batch_size", v["mini_batch_size"])
        c["shuffle"] = _choice("shuffle", v["shuffle"], SHUFFLE)
        c["initial_learn_rate"] = _real(
            "initial_learn_rate", v["initial_learn_rate"], low=0, low_open=True
        )
        c["learn_rate_drop_factor"] = _real(
            "learn_rate_drop_factor", v["learn_rate_drop_factor"], low=0, high=1
        )
        c["learn_rate_drop_period"] = _positive_int(
            "learn_rate_drop_period", v["learn_rate_drop_period"]
        )
        c["learn_rate_schedule"] = v["learn_rate_schedule"]
        _, per_name = _schedules.validate(
            v["learn_rate_schedule"], v["learn_rate_schedule_settings"]
        )
        c["learn_rate_schedule_settings"] = per_name or None
        if solver == "sgdm":
            c["momentum"] = _real("momentum", v["momentum"], low=0, high=1)
        else:
            c["momentum"] = None
        if solver == "adam":
            c["gradient_decay_factor"] = _real(
                "gradient_decay_factor", v["gradient_decay_factor"], low=0, high=1, high_open=True
            )
        else:
            c["gradient_decay_factor"] = None
        if solver in ("adam", "rmsprop"):
            c["squared_gradient_decay_factor"] = _real(
                "squared_gradient_decay_factor",
                v["squared_gradient_decay_factor"],
                low=0,
                high=1,
                high_open=True,
            )
            c["epsilon"] = _real("epsilon", v["epsilon"], low=0, low_open=True)
        else:
            c["squared_gradient_decay_factor"] = c["epsilon"] = None
        c["l2_regularization"] = _real("l2_regularization", v["l2_regularization"], low=0)
        c["gradient_threshold_method"] = _choice(
            "gradient_threshold_method", v["gradient_threshold_method"], THRESHOLD_METHODS
        )
        c["gradient_threshold"] = _real(
            "gradient_threshold", v["gradient_threshold"], low=0, low_open=True, inf=True
        )
        c["validation_data"] = _check_validation_data(v["validation_data"])
        c["validation_frequency"] = _positive_int("validation_frequency", v["validation_frequency"])
        c["validation_patience"] = _positive_int(
            "validation_patience", v["validation_patience"], allow_inf=True
        )
        c["metrics"] = _check_metrics(v["metrics"])
        names = ["loss"] + [m.name for m in c["metrics"]]
        objective = v["objective_metric_name"]
        if objective not in names:
            raise OptionsError(
                f"TrainingOptions: objective_metric_name must be 'loss' or one of the metrics; "
                f"got {objective!r}. Valid here: {names}. Fix: add it to metrics."
            )
        c["objective_metric_name"] = objective
        c["output_network"] = _choice("output_network", v["output_network"], OUTPUT_NETWORK)
        if c["output_network"] == "best-validation" and c["validation_data"] is None:
            raise OptionsError(
                "TrainingOptions: output_network='best-validation' needs validation_data. Fix: "
                "pass validation_data=(X_val, T_val), or use 'last-iteration'."
            )
        if not isinstance(v["verbose"], bool):
            raise OptionsError(
                f"TrainingOptions: verbose must be True or False; got {v['verbose']!r}."
            )
        c["verbose"] = v["verbose"]
        c["verbose_frequency"] = _positive_int("verbose_frequency", v["verbose_frequency"])
        c["plots"] = _choice("plots", v["plots"], PLOTS)
        path = v["plots_path"]
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise OptionsError(
                f"TrainingOptions: plots_path must be a file path or None; got {path!r}."
            )
        c["plots_path"] = None if path is None else os.fspath(path)
        c["output_fcn"] = _check_callables("output_fcn", v["output_fcn"])
        c["execution_environment"] = _choice(
            "execution_environment",
            v["execution_environment"],
            ENVIRONMENTS,
            " (MATLAB's 'multi-gpu' and 'parallel' are 'multi-device' here.)"
            if v["execution_environment"] in ("multi-gpu", "parallel", "parallel-auto")
            else "",
        )
        checkpoint = v["checkpoint_path"]
        if checkpoint is not None:
            if not isinstance(checkpoint, (str, os.PathLike)) or not os.path.isdir(checkpoint):
                raise OptionsError(
                    f"TrainingOptions: checkpoint_path must be an existing folder; got "
                    f"{checkpoint!r}. Fix: create it first (os.makedirs(path, exist_ok=True))."
                )
            checkpoint = os.fspath(checkpoint)
        c["checkpoint_path"] = checkpoint
        c["checkpoint_frequency"] = _positive_int("checkpoint_frequency", v["checkpoint_frequency"])
        c["checkpoint_frequency_unit"] = _choice(
            "checkpoint_frequency_unit", v["checkpoint_frequency_unit"], CHECKPOINT_UNITS
        )
        c["checkpoint_keep"] = _positive_int(
            "checkpoint_keep", v["checkpoint_keep"], allow_inf=True
        )
        return c

    # -- immutability and display ------------------------------------------------------------

    def __setattr__(self, name, value):
        raise OptionsError(
            f"TrainingOptions is immutable; cannot set {name!r}. Fix: "
            f"options = options.replace({name}=...)."
        )

    def replace(self, **changes) -> TrainingOptions:
        """New options with some values changed (``solver=`` switches solver and its defaults)."""
        solver = changes.pop("solver", self.solver)
        given = dict(self._given)
        if solver != self.solver:
            for name in _SOLVER_SPECIFIC + ("initial_learn_rate",):
                given.pop(name, None)
        return TrainingOptions(solver, **{**given, **changes})

    @property
    def resolved_output_network(self) -> str:
        """``output_network`` with ``"auto"`` resolved."""
        if self.output_network != "auto":
            return self.output_network
        return "best-validation" if self.validation_data is not None else "last-iteration"

    def __repr__(self):
        defaults = {**_COMMON_DEFAULTS, **_SOLVER_DEFAULTS[self.solver]}
        parts = [repr(self.solver)]
        for name in OPTION_NAMES:
            if name not in self._given:
                continue
            value = self._given[name]
            if name in defaults and _same(value, defaults[name]):
                continue
            if name == "validation_data":
                parts.append("validation_data=<...>")
            elif name == "metrics":
                parts.append(f"metrics={[m.name for m in self.metrics]}")
            else:
                parts.append(f"{name}={value!r}")
        return f"TrainingOptions({', '.join(parts)})"


def _same(a, b) -> bool:
    try:
        return bool(a == b) and type(a) is type(b)
    except Exception:  # arrays compare elementwise
        return False

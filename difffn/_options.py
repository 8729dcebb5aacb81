"""``TrainingOptions``: MATLAB's ``trainingOptions``, in snake_case, with MATLAB's defaults.

Every option is one row of :data:`OPTIONS`: its name, its default (per solver where the solvers
differ), its validator, and what it affects: ``numbers`` (it changes a run's numbers, so a resume
must not change it: the checkpoint fingerprint is :func:`fingerprint`) and ``step`` (it changes
the solver, so it is part of the compiled step's cache key: :func:`step_key`). Nothing else lists
options: the valid names, the unknown-name suggestions, the per-solver defaults, ``repr``,
``replace``, the fingerprint and the step key all read the table, so adding a row is enough.

Options are validated when the object is made (in table order, so a validator may read the
options before it): an unknown name or a bad value raises ``df.OptionsError`` listing the valid
names or values. The object is immutable; ``options.replace(**changes)`` returns a new one.
``repr`` shows only what differs from the solver's defaults.
Where MATLAB leaves room, the class documents the decision (schedule settings, ``plots_path``,
``steps_per_epoch``, ``validation_steps``, optax solvers, solver-specific options as errors).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import optax

from . import _schedules
from ._errors import OptionsError
from ._fingerprint import describe, describe_data, describe_solver
from ._metrics import Metric, get_metric

SOLVERS = ("sgdm", "adam", "rmsprop")
SHUFFLE = ("once", "every-epoch", "never")
THRESHOLD_METHODS = ("l2norm", "global-l2norm", "absolute-value")
OUTPUT_NETWORK = ("auto", "last-iteration", "best-validation")
PLOTS = ("none", "training-progress")
ENVIRONMENTS = ("auto", "cpu", "gpu", "multi-device")
CHECKPOINT_UNITS = ("epoch", "iteration")

# check(name, value, checked) -> the stored value; ``checked`` holds the options before this one.
Check = Callable[[str, Any, Mapping[str, Any]], Any]


@dataclasses.dataclass(frozen=True)
class Option:
    """One training option.

    Attributes:
      name: the keyword of ``TrainingOptions``.
      default: the default value; a dict ``{solver: default}`` where it depends on the solver.
      check: ``check(name, value, checked) -> value`` validates (raising ``OptionsError``) and
        returns the value stored; ``checked`` holds the options earlier in the table.
      numbers: it changes a run's numbers: part of the resume fingerprint.
      step: it changes the solver transformation: part of the compiled step's cache key.
      solvers: the solvers it belongs to (None: every solver); it is None for the others, and
        giving it to another solver is an error.
      none_is_default: None given means the default (e.g. ``initial_learn_rate=None``).
      describe: how the fingerprint describes it, from the options (default: its value).
      show: how ``repr`` shows a given value, from the stored one (default: ``repr`` of it).
    """

    name: str
    default: Any
    check: Check
    numbers: bool = False
    step: bool = False
    solvers: tuple[str, ...] | None = None
    none_is_default: bool = False
    describe: Callable[[Any], str] | None = None
    show: Callable[[Any], str] | None = None

    @property
    def per_solver(self) -> bool:
        return isinstance(self.default, dict)

    def default_for(self, solver):
        if not self.per_solver:
            return self.default
        return self.default.get(solver) if isinstance(solver, str) else None

    def applies_to(self, solver) -> bool:
        return self.solvers is None or (isinstance(solver, str) and solver in self.solvers)


# -- validators ---------------------------------------------------------------------------------


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _choice(choices: Sequence[str], hints: Mapping[str, str] | None = None) -> Check:
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


def _positive_int(*, allow_inf: bool = False, allow_none: bool = False) -> Check:
    def check(name, value, checked):
        if allow_inf and _is_real(value) and value == math.inf:
            return math.inf
        if allow_none and value is None:
            return None
        if not (_is_int(value) and value > 0):
            more = " or math.inf" if allow_inf else " or None" if allow_none else ""
            raise OptionsError(
                f"TrainingOptions: {name} must be a positive int{more}; got {value!r}. Fix: "
                f"pass a whole number >= 1 (e.g. {name}=10), or leave {name} out for its default."
            )
        return int(value)

    return check


def _real(*, low=None, high=None, low_open=False, high_open=False, inf=False) -> Check:
    def check(name, value, checked):
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
            raise OptionsError(
                f"TrainingOptions: {name} must be {what}; got {value!r}. Fix: pass {what} as a "
                f"Python float, or leave {name} out for its default."
            )
        return float(value)

    return check


def _solver(name, value, checked):
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


def _learn_rate(name, value, checked):
    if value is None and not isinstance(checked["solver"], str):
        return None  # a custom solver's own (its injected learning_rate)
    return _real(low=0, low_open=True)(name, value, checked)


def _bool(name, value, checked):
    if not isinstance(value, bool):
        raise OptionsError(
            f"TrainingOptions: {name} must be True or False; got {value!r}. Fix: {name}=True or "
            f"{name}=False."
        )
    return value


def _schedule(name, value, checked):
    _schedules.validate(value, None)
    return value


def _schedule_settings(name, value, checked):
    _, per_name = _schedules.validate(checked["learn_rate_schedule"], value)
    return per_name or None


def _validation_data(name, value, checked):
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


def _metrics(name, value, checked) -> tuple[Metric, ...]:
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


def _objective(name, value, checked):
    names = ["loss"] + [m.name for m in checked["metrics"]]
    if value not in names:
        raise OptionsError(
            f"TrainingOptions: objective_metric_name must be 'loss' or one of the metrics; "
            f"got {value!r}. Valid here: {names}. Fix: add it to metrics."
        )
    return value


def _output_network(name, value, checked):
    value = _choice(OUTPUT_NETWORK)(name, value, checked)
    if value == "best-validation" and checked["validation_data"] is None:
        raise OptionsError(
            "TrainingOptions: output_network='best-validation' needs validation_data. Fix: "
            "pass validation_data=(X_val, T_val), or use 'last-iteration'."
        )
    return value


def _plots_path(name, value, checked):
    if value is not None and not isinstance(value, (str, os.PathLike)):
        raise OptionsError(
            f"TrainingOptions: plots_path must be a file path or None; got {value!r}. Fix: "
            "plots_path='progress.png'."
        )
    return None if value is None else os.fspath(value)


def _callables(name, value, checked):
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


def _folder(name, value, checked):
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)) or not os.path.isdir(value):
        raise OptionsError(
            f"TrainingOptions: {name} must be an existing folder; got {value!r}. Fix: create "
            "it first (os.makedirs(path, exist_ok=True))."
        )
    return os.fspath(value)


_MULTI = " (MATLAB's 'multi-gpu' and 'parallel' are 'multi-device' here.)"
_ADAPTIVE = ("adam", "rmsprop")

# -- the table ----------------------------------------------------------------------------------

OPTIONS: tuple[Option, ...] = (
    Option(
        "solver",
        "sgdm",
        _solver,
        numbers=True,
        step=True,
        describe=lambda options: describe_solver(options.solver),
    ),
    Option("max_epochs", 30, _positive_int(), numbers=True),
    Option("mini_batch_size", 128, _positive_int(), numbers=True),
    Option("shuffle", "once", _choice(SHUFFLE), numbers=True),
    Option("steps_per_epoch", None, _positive_int(allow_none=True), numbers=True),
    Option(
        "initial_learn_rate",
        {"sgdm": 0.01, "adam": 0.001, "rmsprop": 0.001},
        _learn_rate,
        numbers=True,
        none_is_default=True,
    ),
    Option("learn_rate_drop_factor", 0.1, _real(low=0, high=1), numbers=True),
    Option("learn_rate_drop_period", 10, _positive_int(), numbers=True),
    Option("learn_rate_schedule", "none", _schedule, numbers=True),
    Option("learn_rate_schedule_settings", None, _schedule_settings, numbers=True),
    Option(
        "momentum", {"sgdm": 0.9}, _real(low=0, high=1), numbers=True, step=True, solvers=("sgdm",)
    ),
    Option(
        "gradient_decay_factor",
        {"adam": 0.9},
        _real(low=0, high=1, high_open=True),
        numbers=True,
        step=True,
        solvers=("adam",),
    ),
    Option(
        "squared_gradient_decay_factor",
        {"adam": 0.999, "rmsprop": 0.9},
        _real(low=0, high=1, high_open=True),
        numbers=True,
        step=True,
        solvers=_ADAPTIVE,
    ),
    Option(
        "epsilon",
        {"adam": 1e-8, "rmsprop": 1e-8},
        _real(low=0, low_open=True),
        numbers=True,
        step=True,
        solvers=_ADAPTIVE,
    ),
    Option("l2_regularization", 1e-4, _real(low=0), numbers=True, step=True),
    Option(
        "gradient_threshold_method",
        "l2norm",
        _choice(THRESHOLD_METHODS),
        numbers=True,
        step=True,
    ),
    Option(
        "gradient_threshold",
        math.inf,
        _real(low=0, low_open=True, inf=True),
        numbers=True,
        step=True,
    ),
    Option(
        "validation_data",
        None,
        _validation_data,
        numbers=True,
        describe=lambda options: describe_data(options.validation_data, "validation"),
        show=lambda value: "<...>",
    ),
    Option("validation_frequency", 50, _positive_int(), numbers=True),
    Option("validation_steps", None, _positive_int(allow_none=True), numbers=True),
    Option("validation_patience", math.inf, _positive_int(allow_inf=True), numbers=True),
    Option(
        "metrics",
        (),
        _metrics,
        numbers=True,
        show=lambda value: repr([m.name for m in value]),
    ),
    Option("objective_metric_name", "loss", _objective, numbers=True),
    Option(
        "output_network",
        "auto",
        _output_network,
        numbers=True,
        describe=lambda options: describe(options.resolved_output_network),
    ),
    Option("verbose", True, _bool),
    Option("verbose_frequency", 50, _positive_int()),
    Option("plots", "none", _choice(PLOTS)),
    Option("plots_path", None, _plots_path),
    Option("output_fcn", None, _callables),
    Option(
        "execution_environment",
        "auto",
        _choice(ENVIRONMENTS, {"multi-gpu": _MULTI, "parallel": _MULTI, "parallel-auto": _MULTI}),
    ),
    Option("checkpoint_path", None, _folder),
    Option("checkpoint_frequency", 1, _positive_int()),
    Option("checkpoint_frequency_unit", "epoch", _choice(CHECKPOINT_UNITS)),
    Option("checkpoint_keep", 3, _positive_int(allow_inf=True)),
)


def _positional_message(solver, pairs: tuple) -> str:
    """The error for options given positionally, as MATLAB's name-value pairs."""
    head = f"TrainingOptions got {len(pairs)} positional argument(s) after the solver"
    names, values = pairs[0::2], pairs[1::2]
    if len(pairs) % 2 == 0 and all(isinstance(n, str) for n in names):
        keywords = ", ".join(f"{_snake(n)}={v!r}" for n, v in zip(names, values))
        return (
            f"{head}: {list(pairs)!r}, MATLAB's name-value pairs. Options are keyword arguments "
            f"here. Fix: df.TrainingOptions({solver!r}, {keywords})."
        )
    return (
        f"{head}: {list(pairs)!r}; only the solver is positional. Fix: name each option, e.g. "
        f"df.TrainingOptions({solver!r}, max_epochs=30, mini_batch_size=128)."
    )


def _rows() -> dict[str, Option]:
    # Read at call time (not frozen at import), so the table is the only list of options.
    return {o.name: o for o in OPTIONS}


def option_names() -> tuple[str, ...]:
    """The keyword options, sorted (``solver`` is the first positional argument)."""
    return tuple(sorted(name for name in _rows() if name != "solver"))


def fingerprint(options: TrainingOptions) -> dict[str, str]:
    """``{"option <name>": description}`` for every option that changes a run's numbers."""
    return {
        f"option {o.name}": (
            o.describe(options) if o.describe else describe(getattr(options, o.name))
        )
        for o in OPTIONS
        if o.numbers
    }


def fingerprint_defaults(solver) -> dict[str, str]:
    """The fingerprint entries of the defaults (what a checkpoint lacking an entry had)."""
    return {
        f"option {o.name}": describe(o.default_for(solver))
        for o in OPTIONS
        if o.numbers and o.describe is None
    }


def step_key(options: TrainingOptions) -> tuple:
    """The values of every option that changes the solver (the compiled step's cache key)."""
    return tuple((o.name, getattr(options, o.name)) for o in OPTIONS if o.step)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class TrainingOptions:
    """Training options (MATLAB ``trainingOptions``) for ``df.trainnet``.

    Args:
      solver: ``"sgdm"`` (default), ``"adam"`` or ``"rmsprop"``; or any optax transformation
        (``optax.GradientTransformation``), which then takes the solver's place with the same
        L2, clipping, learn-rate factors and schedules. trainnet sets its learn rate when it is
        built with ``optax.inject_hyperparams`` (e.g.
        ``optax.inject_hyperparams(optax.lion)(learning_rate=1e-4)``); otherwise it keeps its
        own learn rate (or optax schedule), and ``initial_learn_rate`` and
        ``learn_rate_schedule`` must be left out.
      max_epochs: passes through the data (30).
      mini_batch_size: observations per iteration (128); the last partial mini-batch of an
        epoch is dropped.
      shuffle: ``"once"`` (default, before training), ``"every-epoch"`` or ``"never"``.
      steps_per_epoch: iterations per epoch for an iterable of batches (Keras'; MATLAB has
        none). None (default): an epoch is one pass over the iterable. A number: the iterable
        is read as one stream across epochs, each epoch taking the next this many batches (a
        re-iterable starts a new pass when it ends), so an endless generator trains with
        ``max_epochs`` epochs; a one-shot iterator that runs out ends training ("Training data
        exhausted"). Not for arrays, whose epoch is a pass over the observations.
      initial_learn_rate: 0.01 for sgdm, 0.001 for adam and rmsprop; for an optax
        transformation, the learning rate it was built with.
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
      validation_steps: at most this many validation batches (Keras'); None (default): all of
        them. The validation data is read once and reused; an iterable without ``len()`` is
        read to its end, and one that yields more than 1 GiB is stopped with an error asking
        for ``validation_steps`` (an endless generator needs it).
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

    def __init__(self, solver="sgdm", *pairs, **options):
        if pairs:
            raise OptionsError(_positional_message(solver, pairs))
        rows = _rows()
        solver = rows["solver"].check("solver", solver, {})
        names = option_names()
        unknown = [k for k in options if k not in names]
        if unknown:
            name = unknown[0]
            close = difflib.get_close_matches(_snake(name), names, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise OptionsError(
                f"TrainingOptions: unknown option {name!r}{hint}. Valid options: "
                f"{', '.join(names)}. Fix: "
                + (f"{close[0]}=..." if close else "use one of the valid option names")
                + "."
            )
        for name in options:
            if not rows[name].applies_to(solver):
                takers = [s for s in SOLVERS if rows[name].applies_to(s)]
                own = sorted(o.name for o in OPTIONS if o.solvers and o.applies_to(solver))
                label = solver_label(solver)
                more = (
                    ""
                    if isinstance(solver, str)
                    else " Set them when building the optax transformation."
                )
                raise OptionsError(
                    f"TrainingOptions: {name} is an option of solver(s) {takers}, not of "
                    f"{label}. The {label} options are {own}.{more} Fix: leave {name} out, or "
                    f"choose the solver {takers[0]!r}."
                )
        options = {k: v for k, v in options.items() if not (v is None and rows[k].none_is_default)}
        checked: dict[str, Any] = {"solver": solver}
        for o in OPTIONS:
            if o.name == "solver":
                continue
            if not o.applies_to(solver):
                checked[o.name] = None
                continue
            value = options[o.name] if o.name in options else o.default_for(solver)
            checked[o.name] = o.check(o.name, value, checked)
        d = self.__dict__
        d["_given"] = options
        d.update(checked)

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
            for o in OPTIONS:
                if o.solvers is not None or o.per_solver:
                    given.pop(o.name, None)
        return TrainingOptions(solver, **{**given, **changes})

    @property
    def resolved_output_network(self) -> str:
        """``output_network`` with ``"auto"`` resolved."""
        if self.output_network != "auto":
            return self.output_network
        return "best-validation" if self.validation_data is not None else "last-iteration"

    def __repr__(self):
        rows = _rows()
        parts = [solver_label(self.solver)]
        for name in option_names():
            if name not in self._given:
                continue
            o, value = rows[name], self._given[name]
            if _same(value, o.default_for(self.solver)):
                continue
            shown = o.show(getattr(self, name)) if o.show else repr(value)
            parts.append(f"{name}={shown}")
        return f"TrainingOptions({', '.join(parts)})"


def _same(a, b) -> bool:
    try:
        return bool(a == b) and type(a) is type(b)
    except Exception:  # arrays compare elementwise
        return False

"""``TrainingOptions``: MATLAB's ``trainingOptions``, in snake_case, with MATLAB's defaults.

Every option is one row of `OPTIONS`: its name, its default (per solver where the solvers
differ), its validator, and what it affects: ``numbers`` (it changes a run's numbers, so a resume
must not change it: the checkpoint fingerprint is `fingerprint`) and ``step`` (it changes
the solver, so it is part of the compiled step's cache key: `step_key`). Nothing else lists
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
import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, Unpack, overload

import optax

from .._batching import describe_data
from .._batching import sequences as _sequences
from .._core import OptionsError
from .._devices import ENVIRONMENTS
from .._scoring import Metric
from . import _option_checks as check
from ._fingerprint import describe, describe_solver
from ._option_checks import (
    CHECKPOINT_UNITS,
    PLOTS,
    PRECISIONS,
    SHUFFLE,
    SOLVERS,
    THRESHOLD_METHODS,
    Check,
    solver_label,
)
from ._option_types import (
    AdamOptions,
    CommonOptions,
    OutputFcn,
    RMSPropOptions,
    Schedule,
    SGDMOptions,
    SolverName,
)


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


_MULTI_GPU = " (MATLAB's 'multi-gpu' is 'multi-device' here.)"
_PARALLEL = (
    " (MATLAB's 'parallel' is 'multi-device' here for this machine's devices, or 'multi-host' "
    "for several processes started with jax.distributed.initialize.)"
)
_ENVIRONMENT_HINTS = {"multi-gpu": _MULTI_GPU, "parallel": _PARALLEL, "parallel-auto": _PARALLEL}
_ADAPTIVE = ("adam", "rmsprop")

# -- the table ----------------------------------------------------------------------------------


def _sequence_option(checker) -> Check:
    """A check of ``_sequences`` (shared with ``minibatchpredict``'s keywords) as a row's."""
    return lambda name, value, checked: checker("TrainingOptions", value)


OPTIONS: tuple[Option, ...] = (
    Option(
        "solver",
        "sgdm",
        check.solver,
        numbers=True,
        step=True,
        describe=lambda options: describe_solver(options.solver),
    ),
    Option("max_epochs", 30, check.positive_int(), numbers=True),
    Option("mini_batch_size", 128, check.positive_int(), numbers=True),
    Option("shuffle", "once", check.choice(SHUFFLE), numbers=True),
    Option("steps_per_epoch", None, check.positive_int(allow_none=True), numbers=True),
    Option(
        "initial_learn_rate",
        {"sgdm": 0.01, "adam": 0.001, "rmsprop": 0.001},
        check.learn_rate,
        numbers=True,
        none_is_default=True,
    ),
    Option("learn_rate_drop_factor", 0.1, check.real(low=0, high=1), numbers=True),
    Option("learn_rate_drop_period", 10, check.positive_int(), numbers=True),
    Option("learn_rate_schedule", "none", check.schedule, numbers=True),
    Option("learn_rate_schedule_settings", None, check.schedule_settings, numbers=True),
    Option(
        "momentum",
        {"sgdm": 0.9},
        check.real(low=0, high=1),
        numbers=True,
        step=True,
        solvers=("sgdm",),
    ),
    Option(
        "gradient_decay_factor",
        {"adam": 0.9},
        check.real(low=0, high=1, high_open=True),
        numbers=True,
        step=True,
        solvers=("adam",),
    ),
    Option(
        "squared_gradient_decay_factor",
        {"adam": 0.999, "rmsprop": 0.9},
        check.real(low=0, high=1, high_open=True),
        numbers=True,
        step=True,
        solvers=_ADAPTIVE,
    ),
    Option(
        "epsilon",
        {"adam": 1e-8, "rmsprop": 1e-8},
        check.real(low=0, low_open=True),
        numbers=True,
        step=True,
        solvers=_ADAPTIVE,
    ),
    Option("l2_regularization", 1e-4, check.real(low=0), numbers=True, step=True),
    Option(
        "gradient_threshold_method",
        "l2norm",
        check.choice(THRESHOLD_METHODS),
        numbers=True,
        step=True,
    ),
    Option(
        "gradient_threshold",
        math.inf,
        check.real(low=0, low_open=True, inf=True),
        numbers=True,
        step=True,
    ),
    Option(
        "validation_data",
        None,
        check.validation_data,
        numbers=True,
        describe=lambda options: describe_data(options.validation_data, "validation"),
        show=lambda value: "<...>",
    ),
    Option("validation_frequency", 50, check.positive_int(), numbers=True),
    Option("validation_steps", None, check.positive_int(allow_none=True), numbers=True),
    Option("validation_patience", math.inf, check.positive_int(allow_inf=True), numbers=True),
    Option(
        "metrics",
        (),
        check.metrics,
        numbers=True,
        show=lambda value: repr([m.name for m in value]),
    ),
    Option("objective_metric_name", "loss", check.objective, numbers=True),
    Option(
        "output_network",
        "auto",
        check.output_network,
        numbers=True,
        describe=lambda options: describe(options.resolved_output_network),
    ),
    Option("verbose", True, check.boolean),
    Option("verbose_frequency", 50, check.positive_int()),
    Option("plots", "none", check.choice(PLOTS)),
    Option("plots_path", None, check.plots_path),
    Option("output_fcn", None, check.callables),
    Option("log_dir", None, check.log_dir),
    Option(
        "execution_environment",
        "auto",
        check.choice(
            ENVIRONMENTS,
            {"multi-gpu": _MULTI_GPU, "parallel": _PARALLEL, "parallel-auto": _PARALLEL},
        ),
    ),
    Option("process_timeout", 60.0, check.real(low=0, low_open=True)),
    Option("parameter_sharding", "replicated", check.parameter_sharding),
    Option("mesh_shape", None, check.mesh_shape),
    Option("precision", "float32", check.choice(PRECISIONS), numbers=True, step=True),
    Option("compilation_cache", "auto", check.compilation_cache),
    Option("steps_per_execution", "auto", check.steps_per_execution),
    Option("checkpoint_path", None, check.folder),
    Option("checkpoint_frequency", 1, check.positive_int()),
    Option("checkpoint_frequency_unit", "epoch", check.choice(CHECKPOINT_UNITS)),
    Option("checkpoint_keep", 3, check.positive_int(allow_inf=True)),
    Option("sequence_length", "longest", _sequence_option(_sequences.check_length), numbers=True),
    Option(
        "sequence_padding_value",
        0.0,
        _sequence_option(_sequences.check_padding_value),
        numbers=True,
    ),
    Option(
        "sequence_padding_direction",
        "right",
        _sequence_option(_sequences.check_direction),
        numbers=True,
    ),
    Option(
        "sequence_bucketing",
        "power-of-two",
        _sequence_option(_sequences.check_bucketing),
        numbers=True,
    ),
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
        (see `df._training._schedules`).
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
      plots: ``"none"`` or ``"training-progress"``: MATLAB's training-progress plot as a
        matplotlib PNG redrawn while training runs (curves, epoch shading, an info panel; shown
        in a notebook's output too). Its path is printed when training starts, with the stop
        file: creating it stops training (``"Stopped by user"``). See ``docs/training.md``.
      plots_path: the plot's path (default ``training_progress.png`` in the working directory);
        a ``.html`` path gets a page that reloads itself while training runs.
      output_fcn: ``fn(info) -> bool`` or a sequence; called at start, every iteration and at
        the end with a dict of progress; returning True stops training.
      log_dir: a folder for TensorBoard event files (None: none; created if missing): every
        training row's loss, metrics and learn rate in ``log_dir/train``, every validation's
        loss and metrics in ``log_dir/validation``, at their iteration (``tensorboard
        --logdir``). Needs tensorboardX (``pip install difffn[tensorboard]``).
      execution_environment: ``"auto"``, ``"cpu"``, ``"gpu"``, ``"multi-device"`` (batches
        split over this process's ``jax.devices()``) or ``"multi-host"`` (every process of a
        ``jax.distributed`` job runs the same ``trainnet`` and feeds its share of every batch;
        see ``docs/scaling.md``). On a mesh, a mini-batch that the size of its ``"data"`` axis
        does not divide is padded (the padding carries no weight) or, for a network whose
        state learns from the whole batch, runs replicated.
      process_timeout: ``"multi-host"`` only: seconds without an answer from another process
        (its heartbeat) after which it is taken as lost (60). Every other process then writes
        on stderr which process was lost, the last complete checkpoint and the ``resume_from``
        to use, and exits with status 75, instead of waiting in the next collective until
        JAX's coordination service aborts it (``jax.distributed.initialize``'s
        ``heartbeat_timeout_seconds``, 100 by default: keep ``process_timeout`` below it).
      parameter_sharding: ``"replicated"`` (default: every device holds every learnable) or
        ``"fsdp"``: each learnable and its optimizer state split along its largest axis that
        the ``"data"`` axis size divides (replicated where none does). A learnable declared
        with ``df.learnable(sharding=P(...))`` keeps its own spec either way. Mesh
        environments only.
      mesh_shape: the device mesh, ``{"data": n, "model": m}`` (one size may be -1: the devices
        left); the batch splits over ``"data"``, learnables may split over ``"model"`` through
        their ``df.learnable(sharding=...)``. Default: every device on ``"data"``. Mesh
        environments only.
      precision: ``"float32"`` (default), ``"bfloat16"`` or ``"float16"``: the dtype the
        network computes in. Learnables and the optimizer state stay float32 (they are cast
        for the computation), network state (BatchNorm statistics) stays float32, and the
        loss and metrics are computed in float32. ``"float16"`` scales the loss dynamically
        (flax's ``DynamicScale``); a step whose gradients overflow is skipped and counted in
        ``info.skipped_steps``.
      compilation_cache: JAX's persistent compilation cache: ``"auto"`` (default: the folder
        of the ``DIFFFN_COMPILATION_CACHE`` environment variable, ``off`` to turn it off, else
        ``$XDG_CACHE_HOME/difffn/xla`` or ``~/.cache/difffn/xla``; a folder already given to
        JAX is kept), a folder, or None or ``"off"`` (off; also turns off the default folder
        an earlier ``Network.initialize`` turned on). Training reads compiled programs from it and
        writes new ones there, so a later process that trains the same network skips
        compiling (see ``docs/performance.md``); ``Network.initialize`` uses the default too.
        The folder is created if missing and kept under 2 GiB (JAX evicts the least recently
        used programs). The setting is JAX's, process-wide.
      steps_per_execution: the most iterations one compiled call runs (Keras' name):
        ``"auto"`` (default: 16 on one CPU device, else 1), or a number. Iterations between
        the points where trainnet acts on the state (the first iteration, every
        ``verbose_frequency``, validation and checkpoint iterations, the end of an epoch) run
        as one loop inside one program, which on XLA:CPU allocates its temporary memory once
        per call instead of once per iteration (``docs/performance.md``). The same steps and
        losses; rows of one call share its ``time_elapsed``. In-memory data, or an iterable's
        batches read ahead and stacked (at most 64 MiB of them per call; a batch of other
        shapes starts the next call); in-memory padded sequences run one call per iteration;
        one device; without ``output_fcn``, which sees every iteration; a step with a
        convolution that XLA:CPU cannot run fast inside a loop (a grouped or transposed one,
        or a user's own ``lax`` convolution) runs one iteration per call. An explicit number
        is an ``OptionsError`` with ``output_fcn`` or a mesh, and warns once, saying why, where
        the data, eager layers or convolutions keep it from running.
      checkpoint_path: an existing folder for checkpoints (None: no checkpoints). Each is a
        ``net_checkpoint__<iteration>__<date>`` folder (orbax, with a manifest of checksums over
        its files) with everything needed to resume (``df.trainnet(..., resume_from=folder)``),
        written by every process of a multi-host run together, so the folder must be one that
        every process sees. Use one folder per run: pruning counts every checkpoint in it.
      checkpoint_frequency: every this many units (1).
      checkpoint_frequency_unit: ``"epoch"`` (default) or ``"iteration"``.
      checkpoint_keep: how many of the newest checkpoints to keep (3); older ones are deleted
        once a new one is safely written. ``math.inf`` keeps them all (MATLAB's behavior).
      sequence_length: for data given as lists of sequences of different lengths:
        ``"longest"`` (default: pad each mini-batch to its longest sequence), ``"shortest"``
        (truncate to its shortest) or an int ``L`` (pad, then split into chunks of ``L`` steps,
        one iteration each, the recurrent state carried from chunk to chunk).
      sequence_padding_value: the value of the padding (0).
      sequence_padding_direction: ``"right"`` (default: pad or truncate at the end) or
        ``"left"`` (at the start).
      sequence_bucketing: difffn's: padded lengths are rounded up so that few compiled traces
        serve every length: ``"power-of-two"`` (default), a positive int ``k`` (a multiple of
        ``k``) or ``"none"``. Padded steps are masked out of losses, metrics, recurrent states
        and attention (see ``docs/training.md``).

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

    # The options as stored (validated): what attribute access gives a type checker.
    solver: SolverName | optax.GradientTransformation
    max_epochs: int
    mini_batch_size: int
    shuffle: Literal["once", "every-epoch", "never"]
    steps_per_epoch: int | None
    initial_learn_rate: float | None
    learn_rate_drop_factor: float
    learn_rate_drop_period: int
    learn_rate_schedule: Schedule | tuple[Schedule, ...] | list[Schedule]
    learn_rate_schedule_settings: dict[str, Any] | None
    momentum: float | None
    gradient_decay_factor: float | None
    squared_gradient_decay_factor: float | None
    epsilon: float | None
    l2_regularization: float
    gradient_threshold_method: Literal["l2norm", "global-l2norm", "absolute-value"]
    gradient_threshold: float
    validation_data: tuple[Any, ...] | list[Any] | Iterable[Any] | None
    validation_frequency: int
    validation_steps: int | None
    validation_patience: int | float
    metrics: tuple[Metric, ...]
    objective_metric_name: str
    output_network: Literal["auto", "last-iteration", "best-validation"]
    verbose: bool
    verbose_frequency: int
    plots: Literal["none", "training-progress"]
    plots_path: str | None
    output_fcn: tuple[OutputFcn, ...]
    execution_environment: Literal["auto", "cpu", "gpu", "multi-device", "multi-host"]
    parameter_sharding: Literal["replicated", "fsdp"]
    mesh_shape: Mapping[str, int] | None
    precision: Literal["float32", "bfloat16", "float16"]
    compilation_cache: str | None
    steps_per_execution: Literal["auto"] | int
    process_timeout: float
    log_dir: str | None
    checkpoint_path: str | os.PathLike[str] | None
    checkpoint_frequency: int
    checkpoint_frequency_unit: Literal["epoch", "iteration"]
    checkpoint_keep: int | float
    sequence_length: Literal["longest", "shortest"] | int
    sequence_padding_value: float
    sequence_padding_direction: Literal["right", "left"]
    sequence_bucketing: Literal["power-of-two", "none"] | int
    _given: dict[str, Any]  # the options as given (``replace`` and ``repr`` start from them)

    # One form per solver: each takes its own options (a misspelt or another solver's option
    # is a type error; at run time, a df.OptionsError naming the valid ones).
    @overload
    def __init__(
        self, solver: Literal["sgdm"] = "sgdm", **options: Unpack[SGDMOptions]
    ) -> None: ...
    @overload
    def __init__(self, solver: Literal["adam"], **options: Unpack[AdamOptions]) -> None: ...
    @overload
    def __init__(self, solver: Literal["rmsprop"], **options: Unpack[RMSPropOptions]) -> None: ...
    @overload
    def __init__(
        self, solver: optax.GradientTransformation, **options: Unpack[CommonOptions]
    ) -> None: ...
    def __init__(self, solver: Any = "sgdm", *pairs: Any, **options: Any) -> None:
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

    def __setattr__(self, name: str, value: Any) -> None:
        raise OptionsError(
            f"TrainingOptions is immutable; cannot set {name!r}. Fix: "
            f"options = options.replace({name}=...)."
        )

    def replace(self, **changes: Any) -> TrainingOptions:
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

    def __repr__(self) -> str:
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

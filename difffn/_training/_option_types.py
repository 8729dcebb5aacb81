"""The types of ``TrainingOptions``' keywords, for type checkers (pyright, mypy).

``TrainingOptions`` validates its keywords at run time against the option table
(``_options.OPTIONS``: names, defaults, validators); this file tells a type checker the same
names and what each takes, as one ``TypedDict`` per solver, so that a misspelt option
(``max_epoch=5``) or an option of another solver (``momentum=`` with ``"adam"``) is a type error
before it is a ``df.OptionsError``. ``tests/test_typing.py`` checks that the keys here are the
table's names, solver by solver.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, TypedDict

from .._scoring import Metric

SolverName = Literal["sgdm", "adam", "rmsprop"]
"""The solvers by name; an ``optax.GradientTransformation`` may stand in their place."""

PathLike = str | os.PathLike[str]
"""A file or folder path."""

Schedule = str | Callable[..., Any]
"""A learn-rate schedule: a name (``"piecewise"``, ``"cosine"``, ...) or a callable."""

MetricSpec = str | Callable[..., Any] | Metric
"""A metric: a name (``"accuracy"``, ...), a callable ``fn(Y, T)`` or a ``df.metrics.Metric``."""

OutputFcn = Callable[[dict[str, Any]], Any]
"""``fn(info) -> bool``: called with the training progress; returning True stops training."""


class CommonOptions(TypedDict, total=False):
    """The options every solver takes (see ``TrainingOptions`` for what each means)."""

    max_epochs: int
    mini_batch_size: int
    shuffle: Literal["once", "every-epoch", "never"]
    steps_per_epoch: int | None
    initial_learn_rate: float | None
    learn_rate_drop_factor: float
    learn_rate_drop_period: int
    learn_rate_schedule: Schedule | Sequence[Schedule]
    learn_rate_schedule_settings: Mapping[str, Any] | None
    l2_regularization: float
    gradient_threshold_method: Literal["l2norm", "global-l2norm", "absolute-value"]
    gradient_threshold: float
    validation_data: tuple[Any, ...] | list[Any] | Iterable[Any] | None
    validation_frequency: int
    validation_steps: int | None
    validation_patience: int | float
    metrics: MetricSpec | Sequence[MetricSpec]
    objective_metric_name: str
    output_network: Literal["auto", "last-iteration", "best-validation"]
    verbose: bool
    verbose_frequency: int
    plots: Literal["none", "training-progress"]
    plots_path: PathLike | None
    output_fcn: OutputFcn | Sequence[OutputFcn] | None
    execution_environment: Literal["auto", "cpu", "gpu", "multi-device", "multi-host"]
    parameter_sharding: Literal["replicated", "fsdp"]
    mesh_shape: Mapping[str, int] | None
    precision: Literal["float32", "bfloat16", "float16"]
    compilation_cache: Literal["auto"] | PathLike | bool | None
    steps_per_execution: Literal["auto"] | int
    process_timeout: float
    log_dir: PathLike | None
    checkpoint_path: PathLike | None
    checkpoint_frequency: int
    checkpoint_frequency_unit: Literal["epoch", "iteration"]
    checkpoint_keep: int | float
    sequence_length: Literal["longest", "shortest"] | int
    sequence_padding_value: float
    sequence_padding_direction: Literal["right", "left"]
    sequence_bucketing: Literal["power-of-two", "none"] | int


class SGDMOptions(CommonOptions, total=False):
    """The options of ``TrainingOptions("sgdm", ...)``."""

    momentum: float


class AdamOptions(CommonOptions, total=False):
    """The options of ``TrainingOptions("adam", ...)``."""

    gradient_decay_factor: float
    squared_gradient_decay_factor: float
    epsilon: float


class RMSPropOptions(CommonOptions, total=False):
    """The options of ``TrainingOptions("rmsprop", ...)``."""

    squared_gradient_decay_factor: float
    epsilon: float


SOLVER_OPTIONS: dict[str, type] = {
    "sgdm": SGDMOptions,
    "adam": AdamOptions,
    "rmsprop": RMSPropOptions,
    "optax": CommonOptions,
}
"""Which TypedDict types the keywords of each solver (``"optax"``: a transformation)."""

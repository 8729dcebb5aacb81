r"""Learn-rate schedules: MATLAB's ``LearnRateSchedule`` values, as functions of (iteration, epoch).

``learn_rate_schedule`` takes a name, a callable, or a sequence of them run one after another
(MATLAB's cell array of schedules: each runs for its ``num_steps``, then the next one starts;
the last one runs to the end). Every named schedule gives a *factor* that multiplies
``initial_learn_rate``; ``k`` below counts completed steps of the schedule (epochs or
iterations, per its ``frequency_unit``), from 0.

* ``"none"``: 1.
* ``"piecewise"``: ``drop_factor ** (k // period)``. Settings: ``drop_factor`` (default:
  the option ``learn_rate_drop_factor``, 0.1), ``period`` (default: ``learn_rate_drop_period``,
  10); unit epoch.
* ``"warmup"``: linear from ``initial_factor`` (0.1) to ``final_factor`` (1) over
  ``num_steps`` (5) iterations (MATLAB's ``warmupLearnRate`` counts iterations), then
  ``final_factor``.
* ``"polynomial"``: ``final + (initial - final) * (1 - k / num_steps) ** power``, then
  ``final``. Settings: ``initial_factor`` 1, ``final_factor`` 0, ``power`` 1, ``num_steps``
  (default: the whole training, ``max_epochs``); unit epoch.
* ``"exponential"``: ``initial_factor * drop_factor ** (k / period)``. Settings:
  ``initial_factor`` 1, ``drop_factor`` 0.9, ``period`` 1; unit epoch.
* ``"cosine"``: ``min + (max - min) * (1 + cos(pi * t / P)) / 2`` with warm restarts: ``t``
  counts from the last restart and each period is ``period_growth_factor`` times the previous
  one. Settings: ``initial_factor`` (alias ``max_factor``) 1, ``final_factor`` (alias
  ``min_factor``) 0, ``period`` (default: the whole training), ``period_growth_factor`` (alias
  ``period_growth``) 1, which may be ``math.inf`` (MATLAB scripts write
  ``PeriodGrowthFactor=Inf``): the period after the first is then endless, so the factor
  returns to ``initial_factor`` after the first period and stays there; unit epoch. MathWorks'
  ``cosineLearnRate`` names its factors InitialFactor and FinalFactor; the earlier names
  ``max_factor``/``min_factor``/``period_growth`` are kept as synonyms.
* ``"cyclical"``: triangular, from 1 up to ``max_factor`` (10) during the first ``step_ratio``
  (0.5) of each ``period`` (10), then back down; unit epoch.

The named schedules are built on ``optax.schedules`` where optax has them
(``exponential_decay`` for piecewise (staircase) and exponential, ``linear_schedule`` for
warmup, ``polynomial_schedule``, ``cosine_decay_schedule`` within each cosine period) and
evaluated in float64 over chunks of steps, so the values are MATLAB's; ``"cyclical"`` (optax has
no repeating triangle) and the restarts of ``"cosine"`` are worked out here.

Every named schedule also takes ``frequency_unit`` (``"epoch"`` or ``"iteration"``; default
``"epoch"``, ``"iteration"`` for ``warmup``) and ``num_steps`` (how long it runs inside a
sequence; default: to the end, except ``warmup``). ``docs/training.md`` tables every setting.
Settings go in ``learn_rate_schedule_settings``: a dict of settings when one schedule is named,
or a dict from schedule name to its settings.

A callable is a custom schedule returning the learn rate itself, either MATLAB style
``fn(initial_learn_rate, iteration, epoch)`` (both counted from 1) or an optax schedule
``fn(count)`` with ``count = iteration - 1`` (e.g. ``optax.cosine_decay_schedule(0.01, 1000)``).
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
import optax

from .._core import OptionsError

NAMES = ("none", "piecewise", "warmup", "polynomial", "exponential", "cosine", "cyclical")
UNITS = ("epoch", "iteration")
_INF = math.inf

# Defaults per schedule; None means "filled from the options" (see resolve_settings).
DEFAULTS: dict[str, dict[str, Any]] = {
    "none": {},
    "piecewise": {"drop_factor": None, "period": None},
    # MATLAB's warmupLearnRate ramps up over iterations (its FrequencyUnit default)
    "warmup": {
        "initial_factor": 0.1,
        "final_factor": 1.0,
        "num_steps": 5,
        "frequency_unit": "iteration",
    },
    "polynomial": {"initial_factor": 1.0, "final_factor": 0.0, "power": 1.0, "num_steps": None},
    "exponential": {"initial_factor": 1.0, "drop_factor": 0.9, "period": 1.0},
    "cosine": {"max_factor": 1.0, "min_factor": 0.0, "period": None, "period_growth": 1.0},
    "cyclical": {"max_factor": 10.0, "period": 10.0, "step_ratio": 0.5},
}
# MATLAB's property names that difffn stores under another key (cosineLearnRate's InitialFactor,
# FinalFactor and PeriodGrowthFactor; difffn's cosine first named them max_factor, min_factor
# and period_growth, and saved settings keep those keys).
SYNONYMS: dict[str, dict[str, str]] = {
    "cosine": {
        "initial_factor": "max_factor",
        "final_factor": "min_factor",
        "period_growth_factor": "period_growth",
    },
}
for _name, _settings in DEFAULTS.items():
    if _name != "none":
        _settings.setdefault("num_steps", _INF)
        _settings.setdefault("frequency_unit", "epoch")


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check_setting(schedule: str, key: str, value):
    where = f"learn_rate_schedule_settings[{schedule!r}][{key!r}]"
    if key == "frequency_unit":
        if value not in UNITS:
            raise OptionsError(f"{where} must be one of {list(UNITS)}; got {value!r}.")
        return value
    if not _is_real(value) or math.isnan(value):
        raise OptionsError(f"{where} must be a real number; got {value!r}.")
    value = float(value)
    if key == "num_steps" and not (value == _INF or (value >= 1 and value == int(value))):
        raise OptionsError(f"{where} must be a positive integer or math.inf; got {value!r}.")
    if key in ("period", "power") and not (0 < value < _INF):
        raise OptionsError(f"{where} must be positive and finite; got {value!r}.")
    if key == "step_ratio" and not 0 < value < 1:
        raise OptionsError(f"{where} must be in (0, 1); got {value!r}.")
    if key in ("period_growth", "period_growth_factor") and not value >= 1:
        raise OptionsError(f"{where} must be at least 1 (or math.inf); got {value!r}.")
    if key.endswith("factor") and key != "period_growth_factor" and not 0 <= value < _INF:
        raise OptionsError(f"{where} must be non-negative and finite; got {value!r}.")
    return value


def _callable_kind(fn) -> str:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return "optax"
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if any(p.kind is p.VAR_POSITIONAL for p in params) or len(positional) >= 3:
        return "matlab"
    if len(positional) >= 1:
        return "optax"
    raise OptionsError(
        f"learn_rate_schedule: the callable {fn!r} takes no positional arguments; expected "
        "fn(initial_learn_rate, iteration, epoch) or an optax schedule fn(count)."
    )


def validate(schedule, settings) -> tuple[tuple[Any, ...], dict[str, dict[str, Any]]]:
    """Check ``learn_rate_schedule`` and its settings; return (parts, settings per name)."""
    parts = (
        tuple(schedule)
        if isinstance(schedule, Sequence) and not isinstance(schedule, str)
        else (schedule,)
    )
    if not parts:
        raise OptionsError("learn_rate_schedule is an empty sequence; use 'none' for none.")
    for i, part in enumerate(parts):
        if isinstance(part, str):
            if part not in NAMES:
                raise OptionsError(
                    f"learn_rate_schedule {part!r} is not a schedule; expected one of "
                    f"{list(NAMES)}, a callable fn(initial_learn_rate, iteration, epoch), an "
                    "optax schedule fn(count), or a sequence of those. Fix: name one of those "
                    "schedules (settings go in learn_rate_schedule_settings)."
                )
        elif callable(part):
            _callable_kind(part)
            if i != len(parts) - 1:
                raise OptionsError(
                    "learn_rate_schedule: a callable schedule runs to the end of training, so "
                    "it can only be the last entry of a sequence."
                )
        else:
            raise OptionsError(
                f"learn_rate_schedule entries must be names ({list(NAMES)}) or callables; got "
                f"{type(part).__name__}."
            )
    named = [p for p in parts if isinstance(p, str) and p != "none"]
    if len(named) != len(set(named)):
        raise OptionsError(
            f"learn_rate_schedule names a schedule twice ({named}); each may appear once "
            "because learn_rate_schedule_settings is keyed by name."
        )
    settings = {} if settings is None else settings
    if not isinstance(settings, Mapping):
        raise OptionsError(
            f"learn_rate_schedule_settings must be a dict; got {type(settings).__name__}."
        )
    if settings and all(k in NAMES for k in settings):
        per_name = {k: dict(v) if isinstance(v, Mapping) else v for k, v in settings.items()}
    elif settings and len(named) == 1:
        per_name = {named[0]: dict(settings)}
    elif settings:
        raise OptionsError(
            "learn_rate_schedule_settings: with several schedules "
            f"{named}, key the settings by schedule name, e.g. "
            "{'warmup': {'num_steps': 3}, 'cosine': {'period': 20}}."
        )
    else:
        per_name = {}
    for name, values in per_name.items():
        if name not in named:
            raise OptionsError(
                f"learn_rate_schedule_settings has settings for {name!r}, which "
                f"learn_rate_schedule ({schedule!r}) does not use."
            )
        if not isinstance(values, dict):  # (a Mapping given was copied into a dict above)
            raise OptionsError(
                f"learn_rate_schedule_settings[{name!r}] must be a dict; got "
                f"{type(values).__name__}."
            )
        valid = DEFAULTS[name]
        synonyms = SYNONYMS.get(name, {})
        for key, value in list(values.items()):
            if key in synonyms:
                stored = synonyms[key]
                if stored in values:
                    raise OptionsError(
                        f"learn_rate_schedule_settings[{name!r}] gives both {key!r} and "
                        f"{stored!r}, two names of one setting; keep {key!r} (MATLAB's name)."
                    )
                values[stored] = _check_setting(name, key, values.pop(key))
                continue
            if key not in valid:
                raise OptionsError(
                    f"learn_rate_schedule_settings[{name!r}] has no setting {key!r}; the "
                    f"settings of {name!r} are {sorted({*valid, *synonyms})}."
                )
            values[key] = _check_setting(name, key, value)
    return parts, per_name


@dataclass(frozen=True)
class _Phase:
    factor: Callable[[float], float] | None  # of the local step; None for a custom callable
    custom: Callable | None
    custom_kind: str
    unit: str
    num_steps: float


def _vector_factor(name: str, s: dict[str, Any]) -> Callable[[np.ndarray], Any]:
    """The factor of local steps ``k`` (an integer array), built on ``optax.schedules``."""
    if name == "none":
        return lambda k: np.ones(k.shape)
    if name in ("piecewise", "exponential") and s["drop_factor"] == 0:
        # optax reads a decay rate of 0 as "no decay"; MATLAB's factor drops to 0 (at once for
        # exponential, after the first period for piecewise)
        start = 1.0 if name == "piecewise" else s["initial_factor"]
        first = s["period"] if name == "piecewise" else 1
        return lambda k: np.where(k >= first, 0.0, start)
    if name == "piecewise":
        return optax.exponential_decay(
            1.0, transition_steps=s["period"], decay_rate=s["drop_factor"], staircase=True
        )
    if name == "warmup":
        return optax.linear_schedule(s["initial_factor"], s["final_factor"], s["num_steps"])
    if name == "polynomial":
        return optax.polynomial_schedule(
            s["initial_factor"], s["final_factor"], s["power"], s["num_steps"]
        )
    if name == "exponential":
        return optax.exponential_decay(
            s["initial_factor"], transition_steps=s["period"], decay_rate=s["drop_factor"]
        )
    if name == "cosine":
        return functools.partial(_cosine, s)
    if name == "cyclical":
        # optax has one-cycle schedules but no repeating triangle: MATLAB's formula, by hand
        def cyclical(k):
            position = np.mod(k, s["period"]) / s["period"]
            up = s["step_ratio"]
            rise = np.where(position < up, position / up, (1 - position) / (1 - up))
            return 1.0 + (s["max_factor"] - 1.0) * rise

        return cyclical
    raise AssertionError(name)


def _cosine(s: dict[str, Any], k: np.ndarray) -> np.ndarray:
    """Cosine decay with warm restarts (SGDR): ``optax.cosine_decay_schedule`` within each
    period, each period ``period_growth`` times the one before; where each step falls is
    worked out on the host, since optax's ``sgdr_schedule`` needs every restart listed."""
    period, start = s["period"], 0.0
    local, length = np.zeros(k.shape), np.zeros(k.shape)
    todo = np.ones(k.shape, bool)
    while todo.any():
        inside = todo & (k < start + period)
        local[inside], length[inside] = k[inside] - start, period
        todo &= ~inside
        start, period = start + period, period * s["period_growth"]
    shape = np.ones(k.shape)  # an endless period (growth math.inf) stays at its start: cos(0)
    for value in np.unique(length[np.isfinite(length)]):
        at = length == value
        shape[at] = optax.cosine_decay_schedule(1.0, decay_steps=value)(local[at])
    return s["min_factor"] + (s["max_factor"] - s["min_factor"]) * shape


class _Factor:
    """``factor(k)`` for one local step, from vectorized evaluations of ``fn`` over chunks of
    steps (an optax schedule is a jnp function: one call per chunk of 1024 steps, not one per
    iteration), in float64."""

    _CHUNK = 1024

    def __init__(self, fn):
        self.fn = fn
        self.chunks: dict[int, np.ndarray] = {}

    def __call__(self, k) -> float:
        chunk, i = divmod(int(k), self._CHUNK)
        values = self.chunks.get(chunk)
        if values is None:
            steps = np.arange(chunk * self._CHUNK, (chunk + 1) * self._CHUNK, dtype=np.float64)
            with jax.enable_x64(True):  # MATLAB's values are doubles; so are these, here only
                values = np.asarray(jax.device_get(self.fn(steps)), np.float64)
            self.chunks[chunk] = values
        return float(values[i])


class LearnRateSchedule:
    """The learn rate of every iteration: ``schedule(iteration, epoch)`` (both from 1).

    A pure function of its arguments, so training can resume at any iteration.
    """

    def __init__(self, options, iterations_per_epoch: int | None, *, initial=None):
        parts, per_name = validate(
            options.learn_rate_schedule, options.learn_rate_schedule_settings
        )
        self.initial = float(options.initial_learn_rate if initial is None else initial)
        self.iterations_per_epoch = iterations_per_epoch
        phases = []
        for part in parts:
            if callable(part) and not isinstance(part, str):
                phases.append(_Phase(None, part, _callable_kind(part), "iteration", _INF))
                continue
            s = {**DEFAULTS[part], **per_name.get(part, {})}
            if part == "piecewise":
                s["drop_factor"] = (
                    options.learn_rate_drop_factor if s["drop_factor"] is None else s["drop_factor"]
                )
                s["period"] = options.learn_rate_drop_period if s["period"] is None else s["period"]
            if part != "none":
                whole = options.max_epochs
                if s["frequency_unit"] == "iteration":
                    whole = options.max_epochs * (iterations_per_epoch or 1)
                for key in ("num_steps", "period"):
                    if key in s and s[key] is None:
                        s[key] = float(whole)
            phases.append(
                _Phase(
                    _Factor(_vector_factor(part, s)),
                    None,
                    "",
                    s.get("frequency_unit", "epoch"),
                    s.get("num_steps", _INF),
                )
            )
        self.phases = tuple(phases)
        if len({p.unit for p in phases}) > 1 and iterations_per_epoch is None:
            raise OptionsError(
                "learn_rate_schedule mixes epoch and iteration units in a sequence, which needs "
                "the number of iterations per epoch; the training data is an iterable without "
                "len(). Fix: give every schedule the same frequency_unit, or make the data "
                "define __len__."
            )

    def __call__(self, iteration: int, epoch: int) -> float:
        done_iterations, done_epochs = iteration - 1, epoch - 1
        start_iteration, start_epoch = 0, 0.0
        ipe = self.iterations_per_epoch
        for n, phase in enumerate(self.phases):
            if phase.unit == "iteration":
                local = done_iterations - start_iteration
            elif start_epoch == int(start_epoch):
                local = done_epochs - int(start_epoch)
            else:
                assert ipe is not None  # a fractional start epoch came from iterations / ipe
                local = (done_iterations - start_iteration) // ipe
            if local < phase.num_steps or n == len(self.phases) - 1:
                if phase.custom is None:
                    return self.initial * phase.factor(local)
                if phase.custom_kind == "matlab":
                    return float(phase.custom(self.initial, iteration, epoch))
                return float(phase.custom(done_iterations))
            if phase.unit == "iteration":
                start_iteration += int(phase.num_steps)
                start_epoch = start_iteration / ipe if ipe else start_epoch
            else:
                start_epoch += phase.num_steps
                start_iteration += int(phase.num_steps) * (ipe or 0)
        raise AssertionError("unreachable")


def for_run(who: str, options, iterations_per_epoch, injected: float | None):
    """The learn rate of every iteration of a run. For an optax transformation as the solver,
    that of its injected learning rate (``injected``); without one it keeps its own, and the
    learn rate is NaN (unknown here)."""
    if isinstance(options.solver, str):
        return LearnRateSchedule(options, iterations_per_epoch)
    if injected is not None:
        return LearnRateSchedule(options, iterations_per_epoch, initial=injected)
    if options.learn_rate_schedule != "none" or options.initial_learn_rate is not None:
        raise OptionsError(
            f"{who}: the optax transformation given as solver has no learning_rate that trainnet "
            "can set, so initial_learn_rate and learn_rate_schedule cannot reach it. Fix: build "
            "it with optax.inject_hyperparams, e.g. "
            "optax.inject_hyperparams(optax.lion)(learning_rate=1e-4), or leave both out (it "
            "keeps its own learn rate, or an optax schedule given to it)."
        )
    return lambda iteration, epoch: math.nan

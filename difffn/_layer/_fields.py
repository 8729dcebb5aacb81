"""Layer field declarations: ``df.learnable()``, ``df.state()``, field kinds, parameter values.

A layer class declares its fields like a dataclass. Each field has a kind:

* ``learnable``: trained (MATLAB ``properties (Learnable)``), declared with
  [`learnable`][difffn.learnable];
* ``state``: updated by ``predict``/``forward`` (MATLAB ``properties (State)``),
  [`state`][difffn.state];
* ``property``: a plain field; hashable values are static configuration, arrays are leaves;
* ``base``: the base properties every layer has (``name``, ``num_inputs``, ...).

Learnable and state fields hold parameter values: an array, a pytree of arrays, ``None`` (not
initialized yet) or, for learnables, a nested ``df.Network``. `as_parameter` coerces and
checks one such value;
``NetworkBase`` lets this floor recognise a nested network without importing ``_network``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.core
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from .._core import LayerError, is_array, short, who

KIND = "difffn_kind"  # the dataclass field metadata key that holds a field's kind
SHARDING = "sharding"  # the metadata key of a learnable's own PartitionSpec (or None)
LEARNABLE, STATE, PROPERTY, BASE = "learnable", "state", "property", "base"
CONSTANT = "constant"  # a leaf that is neither learnable nor state (properties, nested constants)
BASE_FIELDS = (
    "name",
    "description",
    "type",
    "num_inputs",
    "input_names",
    "num_outputs",
    "output_names",
)


def learnable(
    default: Any = None,
    *,
    learn_rate_factor: float = 1.0,
    l2_factor: float = 1.0,
    sharding: PartitionSpec | None = None,
    **kwargs: Any,
) -> Any:
    """Declare a learnable parameter field (MATLAB ``properties (Learnable)``).

    Args:
      default: the initial value, usually ``None`` so that ``initialize`` fills it.
      learn_rate_factor: multiplies the global learn rate for this parameter.
      l2_factor: multiplies the global L2 regularization for this parameter.
      sharding: a ``jax.sharding.PartitionSpec`` over the training mesh's axes ``"data"`` and
        ``"model"`` (e.g. ``P(None, "model")``: the second axis split over ``"model"``), used
        when training runs on a mesh (``execution_environment="multi-device"`` or
        ``"multi-host"``); None (default): ``TrainingOptions(parameter_sharding=...)`` decides.
      **kwargs: passed to ``dataclasses.field`` (e.g. ``default_factory``).

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> class Scale(df.Layer):
      ...     weight: jnp.ndarray | None = df.learnable(default=None)
      ...     def predict(self, x):
      ...         return x * self.weight
      >>> Scale(weight=jnp.array(2.0))(jnp.ones(2))
      Array([2., 2.], dtype=float32)
    """
    if sharding is not None and not isinstance(sharding, PartitionSpec):
        raise LayerError(
            f"df.learnable(sharding=...) takes a jax.sharding.PartitionSpec; got "
            f"{type(sharding).__name__} {sharding!r}. Fix: sharding=P(None, 'model') with "
            "from jax.sharding import PartitionSpec as P."
        )
    metadata = {
        KIND: LEARNABLE,
        "learn_rate_factor": float(learn_rate_factor),
        "l2_factor": float(l2_factor),
        SHARDING: sharding,
    }
    if "default_factory" in kwargs:
        return dataclasses.field(metadata=metadata, **kwargs)
    return dataclasses.field(default=default, metadata=metadata, **kwargs)


def state(default: Any = None, **kwargs: Any) -> Any:
    """Declare a state parameter field (MATLAB ``properties (State)``).

    ``predict`` and ``forward`` return the new value of every state field after their outputs.
    """
    if "default_factory" in kwargs:
        return dataclasses.field(metadata={KIND: STATE}, **kwargs)
    return dataclasses.field(default=default, metadata={KIND: STATE}, **kwargs)


def field_kind(field: dataclasses.Field) -> str:
    """The kind of a dataclass field of a layer class."""
    return BASE if field.name in BASE_FIELDS else field.metadata.get(KIND, PROPERTY)


class NetworkBase:
    """Base of ``df.Network`` (defined in ``_network.py``, which builds on layers).

    Layers only need to recognise a nested network; this base breaks the import cycle.
    """

    @property
    def initialized(self) -> bool:
        """Whether every layer is initialized (``df.Network`` defines it)."""
        raise NotImplementedError

    @property
    def has_state(self) -> bool:
        """Whether any layer has state (``df.Network`` defines it)."""
        raise NotImplementedError


def is_network(value) -> bool:
    return isinstance(value, NetworkBase)


def as_parameter(cls, name: str, value):
    """``value`` as the value of learnable/state field ``name`` of layer class ``cls``.

    Python numbers become arrays (a learnable: float32, as in MATLAB); weak types become firm.

    Raises:
      LayerError: a learnable that is not floating point, or a value that is not an array, a
        pytree of arrays, a network or ``None``.
    """
    if value is None:
        return value
    kind = cls._field_kinds[name]
    if isinstance(value, jax.Array):
        if isinstance(value, jax.core.Tracer):
            return value
        if not value.weak_type:  # copies of trained layers take this path: keep it short
            if kind == LEARNABLE:
                _check_learnable_dtype(cls, name, value.dtype)
            return value
    if is_network(value):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool) and kind == LEARNABLE:
        # A Python number as a learnable is meant to be trained: single precision, as MATLAB.
        value = jnp.asarray(float(value), jnp.float32)
    if is_array(value) or isinstance(value, (int, float, bool, complex)):
        value = jnp.asarray(value)
        if value.weak_type:  # e.g. jnp.full(shape, 0.25): keep a firm dtype
            value = jnp.asarray(value, dtype=value.dtype)
        if kind == LEARNABLE:
            _check_learnable_dtype(cls, name, value.dtype)
        return value
    if isinstance(value, (list, tuple, dict)) and all(is_array(v) for v in jax.tree.leaves(value)):
        return value
    raise LayerError(
        f"{cls.__name__}.{name} is a {cls._field_kinds[name]} parameter but holds a "
        f"{type(value).__name__}; expected an array, a df.Network (learnables only) or None. "
        "Fix: store arrays in learnable/state fields and configuration in plain fields."
    )


def _check_learnable_dtype(cls, name: str, dtype) -> None:
    if _dtype_kind(dtype) not in ("floating", "complexfloating"):
        raise LayerError(
            f"{cls.__name__}.{name} is a learnable parameter but holds a {dtype} "
            "array, which cannot be differentiated. Fix: use a floating-point array (or "
            "declare it df.state() / a plain property if it is not trained)."
        )


def check_assigned(layer, name: str, kind: str, current, value) -> None:
    """A value put in place of an initialized one (``Network.replace``) must fit it.

    A learnable keeps its shape (a wrong-shaped bias would otherwise broadcast silently) and its
    dtype kind: floating stays floating, though the precision may change (casting a network to
    float64 for a check is legitimate). A state value keeps its dtype kind only: a state may
    change shape (an LSTM's state takes the batch size of the data it last saw).

    Args:
      layer: the layer that holds ``current``.
      name: the field.
      kind: ``"learnable"`` or ``"state"``.
      current: the value in place now (nothing is checked unless it and ``value`` are arrays).
      value: the new value.

    Raises:
      LayerError: naming the layer, the parameter, expected vs got and the fix.
    """
    if not (is_array(current) and is_array(value)):
        return
    want, got = current.dtype, value.dtype
    same_kind = want == got or _dtype_kind(want) == _dtype_kind(got)
    if same_kind and (kind != LEARNABLE or current.shape == value.shape):
        return
    expected = f"{short(current)}, like its current value" if kind == LEARNABLE else f"{want}"
    raise LayerError(
        f"{who(layer)}: the new value of {kind} {name!r} is {short(value)}; expected {expected}. "
        f"Fix: assign a value of shape {tuple(current.shape)} and dtype {want}; to change the "
        "parameter's size, build the layer anew and initialize it."
    )


@functools.lru_cache(maxsize=64)  # a handful of dtypes; issubdtype is slow on a hot path
def _dtype_kind(dtype) -> str:
    kinds = (jnp.bool_, jnp.integer, jnp.floating, jnp.complexfloating)
    return next((k.__name__ for k in kinds if jnp.issubdtype(dtype, k)), str(dtype))

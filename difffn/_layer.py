r"""``Layer``: custom layers as immutable pytrees, with MATLAB's method contract.

A layer class declares fields like a dataclass. ``df.learnable()`` fields are trained,
``df.state()`` fields are updated by ``predict``/``forward``, and plain fields are properties:
hashable values are static configuration (part of the compiled trace's key), array values are
leaves that are not trained. Layers are immutable; ``layer.replace(**changes)`` returns a new one.

The method contract (DESIGN.md, "Semantics"):

* ``initialize(*layouts, key)`` fills parameters that are still ``None`` and returns a new layer;
* ``predict(*X)`` returns ``Y1..YM`` then the new values of the state fields (declaration order);
* ``forward(*X[, key])`` (optional; falls back to ``predict``) returns the same, plus a memory
  value when the layer defines ``backward``;
* ``backward(*X, *Y, *dLdY, [*dLdSout], memory)`` (optional) returns ``dLdX..``, then one gradient
  per learnable (declaration order), then, if it takes ``dLdSout``, one per state field. It is
  wired in with ``jax.custom_vjp`` over (learnables, state, inputs); without it, JAX autodiff.

Formats: a layer with ``formattable = False`` (the default) receives plain arrays and its outputs
take the format of its first formatted input; ``formattable = True`` layers receive and return
``FormattedArray``\ s. ``acceleratable = False`` makes networks run the layer eagerly.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from . import _cotangents as ct
from ._errors import AccelerationError, BackwardError, ForwardError, LayerError
from ._format import FormattedArray, dims, dlarray, stripdims
from ._primitive import custom_vjp

_KIND = "difffn_kind"
LEARNABLE, STATE, PROPERTY, BASE = "learnable", "state", "property", "base"
BASE_FIELDS = (
    "name",
    "description",
    "type",
    "num_inputs",
    "input_names",
    "num_outputs",
    "output_names",
)
_CONCRETIZATION_ERRORS = (
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerArrayConversionError,
    jax.errors.TracerIntegerConversionError,
    jax.errors.NonConcreteBooleanIndexError,
)


def learnable(default=None, *, learn_rate_factor: float = 1.0, l2_factor: float = 1.0, **kwargs):
    """Declare a learnable parameter field (MATLAB ``properties (Learnable)``).

    Args:
      default: the initial value, usually ``None`` so that ``initialize`` fills it.
      learn_rate_factor: multiplies the global learn rate for this parameter.
      l2_factor: multiplies the global L2 regularization for this parameter.
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
    metadata = {
        _KIND: LEARNABLE,
        "learn_rate_factor": float(learn_rate_factor),
        "l2_factor": float(l2_factor),
    }
    if "default_factory" in kwargs:
        return dataclasses.field(metadata=metadata, **kwargs)
    return dataclasses.field(default=default, metadata=metadata, **kwargs)


def state(default=None, **kwargs):
    """Declare a state parameter field (MATLAB ``properties (State)``).

    ``predict`` and ``forward`` return the new value of every state field after their outputs.
    """
    if "default_factory" in kwargs:
        return dataclasses.field(metadata={_KIND: STATE}, **kwargs)
    return dataclasses.field(default=default, metadata={_KIND: STATE}, **kwargs)


def _is_array(x) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, np.generic))


def _holds_arrays(value) -> bool:
    """Whether a property value must travel as pytree leaves (arrays, layers, networks)."""
    if isinstance(value, Layer) or _is_network(value):
        return True
    return any(_is_array(leaf) for leaf in jax.tree.leaves(value))


class NetworkBase:
    """Base of ``df.Network`` (defined in ``_network.py``, which builds on layers).

    Layers only need to recognise a nested network; this base breaks the import cycle.
    """

    initialized: bool
    has_state: bool


def _is_network(value) -> bool:
    return isinstance(value, NetworkBase)


class _LayerMeta(type):
    """Turns each subclass into a dataclass pytree and controls construction."""

    def __new__(mcls, name, bases, namespace, **kwargs):
        cls = super().__new__(mcls, name, bases, namespace, **kwargs)
        # A hand-written __init__ (here or inherited) is kept; otherwise dataclass writes one.
        user_init = "__init__" in namespace or any(getattr(b, "_user_init", False) for b in bases)
        cls = dataclasses.dataclass(init=not user_init, repr=False, eq=False)(cls)
        kinds = {}
        for f in dataclasses.fields(cls):
            kinds[f.name] = BASE if f.name in BASE_FIELDS else f.metadata.get(_KIND, PROPERTY)
        cls._field_kinds = kinds
        cls._learnable_fields = tuple(n for n, k in kinds.items() if k == LEARNABLE)
        cls._state_fields = tuple(n for n, k in kinds.items() if k == STATE)
        cls._user_init = user_init
        if bases:  # the abstract base itself is never instantiated
            jax.tree_util.register_pytree_with_keys(
                cls, _flatten_with_keys, functools.partial(_unflatten, cls), _flatten
            )
        return cls

    def __call__(cls, *args, **kwargs):
        self = cls.__new__(cls)
        object.__setattr__(self, "_initializing", True)
        if cls._user_init:
            # A hand-written __init__ may set only some fields; the rest take their defaults.
            for f in dataclasses.fields(cls):
                if f.default is not dataclasses.MISSING:
                    object.__setattr__(self, f.name, f.default)
                elif f.default_factory is not dataclasses.MISSING:
                    object.__setattr__(self, f.name, f.default_factory())
        try:
            cls.__init__(self, *args, **kwargs)
        except TypeError as error:
            if "argument" not in str(error):
                raise
            fields = ", ".join(f.name for f in dataclasses.fields(cls))
            raise LayerError(
                f"{cls.__name__}(...) could not be constructed: {error}. Its fields are: {fields}."
            ) from None
        missing = [f.name for f in dataclasses.fields(cls) if f.name not in self.__dict__]
        if missing:
            raise LayerError(
                f"{cls.__name__}.__init__ did not set field(s) {missing} and they have no "
                "default. Fix: assign them in __init__ or give them a default."
            )
        object.__delattr__(self, "_initializing")
        self._finish_init()
        return self


class Layer(metaclass=_LayerMeta):
    """Base class of custom layers (MATLAB ``nnet.layer.Layer``).

    Subclass it, declare fields, and define ``predict`` (required) and optionally
    ``initialize``, ``forward``, ``reset_state`` and ``backward``. See the module docstring for
    the method contract and ``docs/layers.md`` for a guide.

    Class attributes:
      formattable: ``False`` (default): ``predict`` receives plain arrays and its outputs take
        the input's format. ``True``: it receives and returns ``df.FormattedArray``.
      acceleratable: ``True`` (default): networks compile the layer into their trace. ``False``:
        networks run it eagerly (for Python control flow on values) and compile around it.

    Base properties (keyword-only): ``name``, ``description``, ``type``, ``num_inputs``,
    ``input_names``, ``num_outputs``, ``output_names``, with MATLAB's defaults (``("in",)`` or
    ``("in1", ...)``; ``("out",)`` or ``("out1", ...)``; ``num_inputs`` is also inferred from
    ``predict``'s signature).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> import difffn as df
      >>> class PReLU(df.Layer):
      ...     alpha: jax.Array | None = df.learnable(default=None)
      ...     def initialize(self, layout, *, key):
      ...         if self.alpha is None:
      ...             shape = [1] * layout.ndim
      ...             shape[layout.finddim("C")[0]] = layout.size("C")
      ...             return self.replace(alpha=jnp.full(shape, 0.25))
      ...         return self
      ...     def predict(self, x):
      ...         return jnp.maximum(x, 0) + self.alpha * jnp.minimum(x, 0)
      >>> layer = PReLU(name="prelu").initialize(df.Layout((None, 2), "BC"), key=jax.random.key(0))
      >>> layer(jnp.array([[-4.0, 2.0]]))
      Array([[-1.,  2.]], dtype=float32)
      >>> layer.alpha.shape, layer.num_inputs, layer.input_names
      ((1, 2), 1, ('in',))
    """

    formattable: ClassVar[bool] = False
    acceleratable: ClassVar[bool] = True

    name: str = dataclasses.field(default="", kw_only=True)
    description: str = dataclasses.field(default="", kw_only=True)
    type: str = dataclasses.field(default="", kw_only=True)
    num_inputs: int | None = dataclasses.field(default=None, kw_only=True)
    input_names: tuple[str, ...] | None = dataclasses.field(default=None, kw_only=True)
    num_outputs: int | None = dataclasses.field(default=None, kw_only=True)
    output_names: tuple[str, ...] | None = dataclasses.field(default=None, kw_only=True)

    # Filled by the metaclass.
    _field_kinds: ClassVar[dict[str, str]]
    _learnable_fields: ClassVar[tuple[str, ...]]
    _state_fields: ClassVar[tuple[str, ...]]
    _user_init: ClassVar[bool]

    # -- immutability ----------------------------------------------------------------------

    def __setattr__(self, name, value):
        if self.__dict__.get("_initializing"):
            object.__setattr__(self, name, value)
            return
        raise LayerError(
            f"{type(self).__name__} is immutable (a pytree); cannot set {name!r}. Fix: "
            f"layer = layer.replace({name}=...)."
        )

    def __delattr__(self, name):
        raise LayerError(f"{type(self).__name__} is immutable; cannot delete {name!r}.")

    def _finish_init(self) -> None:
        d = self.__dict__
        cls = type(self)
        for n in cls._learnable_fields + cls._state_fields:
            d[n] = _as_parameter(cls, n, d[n])
        _resolve_ports(self)
        d["type"] = d["type"] or cls.__name__
        d["description"] = d["description"] or cls.__name__
        d.setdefault("_factors", ())
        d["_leaf_fields"] = _classify(self)

    # -- the public surface ------------------------------------------------------------------

    def replace(self, **changes) -> Layer:
        """A new layer with some fields replaced (layers are immutable).

        Raises:
          LayerError: a name that is not a field of the layer.
        """
        cls = type(self)
        unknown = sorted(set(changes) - set(cls._field_kinds))
        if unknown:
            raise LayerError(
                f"{cls.__name__}.replace got unknown field(s) {unknown}; its fields are "
                f"{list(cls._field_kinds)}."
            )
        new = object.__new__(cls)
        d = new.__dict__
        d.update(self.__dict__)
        d.pop("_aux", None)  # static values may change
        for n, value in changes.items():
            kind = cls._field_kinds[n]
            d[n] = _as_parameter(cls, n, value) if kind in (LEARNABLE, STATE) else value
        changed = set(changes)
        post_init = getattr(cls, "__post_init__", None)
        if post_init is not None and any(
            cls._field_kinds[n] not in (LEARNABLE, STATE) for n in changes
        ):
            # Configuration changed: validate and normalize it as the constructor does.
            before = {n: d[n] for n in BASE_FIELDS}
            d["_initializing"] = True
            try:
                post_init(new)
            finally:
                del d["_initializing"]
            changed |= {n for n in BASE_FIELDS if d[n] is not before[n]}
        if any(cls._field_kinds[n] == BASE for n in changed):
            _resolve_ports(new, changed=changed)
        d["_leaf_fields"] = _classify(new)
        return new

    def initialize(self, *layouts, key):
        """Fill parameters that are still ``None``; the default does nothing.

        Args:
          *layouts: one ``df.Layout`` per input (sizes may be ``None`` for unknown, e.g. batch).
          key: a ``jax.random`` key for random initialization.
        """
        del layouts, key
        return self

    def predict(self, *inputs):
        raise NotImplementedError

    def reset_state(self):
        """A layer with its state reset; the default (as in MATLAB) leaves the state as it is."""
        return self

    def __call__(self, *inputs, key=None):
        """Run ``predict`` with the custom backward (if any) wired in.

        Returns what ``predict`` returns: ``Y`` alone (one output, no state) or the tuple
        ``(Y1, ..., YM, S1, ..., SK)``.
        """
        outputs, new_state = call_layer(self, inputs, training=False, key=key)
        values = (*outputs, *new_state)
        return values[0] if len(values) == 1 else values

    @property
    def learnable_names(self) -> tuple[str, ...]:
        """Names of the learnable fields, in declaration order."""
        return type(self)._learnable_fields

    @property
    def state_names(self) -> tuple[str, ...]:
        """What ``predict``/``forward`` return after the outputs, in declaration order.

        The state fields, and the learnable fields that hold a network with state (MATLAB's
        ``properties (Learnable, State)``): for those, the nested network's state table.
        """
        kinds = type(self)._field_kinds
        return tuple(
            n
            for n, kind in kinds.items()
            if kind == STATE
            or (kind == LEARNABLE and _is_network(v := self.__dict__[n]) and v.has_state)
        )

    @property
    def initialized(self) -> bool:
        """True when no learnable or state field is ``None`` (nested networks initialized)."""
        for n in self.learnable_names + self.state_names:
            value = getattr(self, n)
            if value is None or (_is_network(value) and not value.initialized):
                return False
        return True

    def __repr__(self):
        parts = []
        for n, kind in type(self)._field_kinds.items():
            value = getattr(self, n)
            if kind == BASE and n != "name":
                continue
            parts.append(f"{n}={_short(value)}")
        return f"{type(self).__name__}({', '.join(parts)})"

    # -- used by networks ----------------------------------------------------------------------

    def _state_values(self) -> tuple:
        """The current value of every entry of ``state_names`` (tables for nested networks)."""
        return tuple(v.state if _is_network(v := self.__dict__[n]) else v for n in self.state_names)

    def _with_state(self, values: Sequence[Any]) -> Layer:
        """A new layer whose ``state_names`` entries hold ``values`` (no validation; hot path)."""
        new = object.__new__(type(self))
        d = new.__dict__
        d.update(self.__dict__)
        for n, value in zip(self.state_names, values):
            current = d[n]
            d[n] = current.replace(state=value) if _is_network(current) else value
        return new


# -- construction helpers -----------------------------------------------------------------------


def _as_parameter(cls, name, value):
    if value is None or _is_network(value) or isinstance(value, jax.core.Tracer):
        return value
    kind = cls._field_kinds[name]
    if isinstance(value, (int, float)) and not isinstance(value, bool) and kind == LEARNABLE:
        # A Python number as a learnable is meant to be trained: single precision, as MATLAB.
        value = jnp.asarray(float(value), jnp.float32)
    if isinstance(value, (jax.Array, np.ndarray, np.generic, int, float, bool, complex)):
        value = jnp.asarray(value)
        if getattr(value, "weak_type", False):  # e.g. jnp.full(shape, 0.25): keep a firm dtype
            value = jnp.asarray(value, dtype=value.dtype)
        if kind == LEARNABLE and not jnp.issubdtype(value.dtype, jnp.inexact):
            raise LayerError(
                f"{cls.__name__}.{name} is a learnable parameter but holds a {value.dtype} "
                "array, which cannot be differentiated. Fix: use a floating-point array (or "
                "declare it df.state() / a plain property if it is not trained)."
            )
        return value
    if isinstance(value, (list, tuple, dict)) and all(_is_array(v) for v in jax.tree.leaves(value)):
        return value
    raise LayerError(
        f"{cls.__name__}.{name} is a {cls._field_kinds[name]} parameter but holds a "
        f"{type(value).__name__}; expected an array, a df.Network (learnables only) or None. "
        "Fix: store arrays in learnable/state fields and configuration in plain fields."
    )


def _resolve_ports(layer: Layer, changed: set[str] | None = None) -> None:
    """MATLAB's rules for NumInputs/InputNames and NumOutputs/OutputNames, kept consistent."""
    d, cls = layer.__dict__, type(layer)
    changed = changed or set()
    inferred = _predict_arity(cls)
    for count, names, prefix, single in (
        ("num_inputs", "input_names", "in", "in"),
        ("num_outputs", "output_names", "out", "out"),
    ):
        n, labels = d[count], d[names]
        if n is None:
            n = getattr(cls, count, None)  # a plain class attribute may set the default
        if labels is None:
            class_labels = getattr(cls, names, None)
            labels = class_labels if isinstance(class_labels, (tuple, list)) else None
        if count in changed and names not in changed:
            labels = None  # a new count regenerates the default names
        if names in changed and count not in changed:
            n = None
        if labels is not None:
            labels = tuple(labels)
            if not all(isinstance(s, str) and s for s in labels) or len(set(labels)) != len(labels):
                raise LayerError(
                    f"{cls.__name__}.{names} is {labels!r}; expected distinct non-empty strings."
                )
            if n is not None and n != len(labels):
                raise LayerError(
                    f"{cls.__name__} has {count}={n} but {names}={labels!r} ({len(labels)} "
                    f"names); they must agree. Fix: set one of them (the other follows)."
                )
            n = len(labels)
        if n is None:
            n = inferred if count == "num_inputs" and inferred is not None else 1
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise LayerError(f"{cls.__name__}.{count} is {n!r}; expected a positive int.")
        if labels is None:
            labels = (single,) if n == 1 else tuple(f"{prefix}{i + 1}" for i in range(n))
        d[count], d[names] = n, labels
    if inferred is not None and d["num_inputs"] != inferred:
        raise LayerError(
            f"{cls.__name__}.predict takes {inferred} input(s) but num_inputs is "
            f"{d['num_inputs']}. Fix: make predict's signature match, or use *inputs."
        )


@functools.cache
def _predict_arity(cls) -> int | None:
    """Number of inputs ``predict`` takes, or None when it takes ``*inputs``."""
    if cls.predict is Layer.predict:
        return None
    params = list(inspect.signature(cls.predict).parameters.values())[1:]
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return None
    return sum(
        1
        for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    )


def _classify(layer: Layer) -> tuple[str, ...]:
    """The fields that are pytree children; the others are static and must be hashable."""
    cls = type(layer)
    leaves = []
    for n, kind in cls._field_kinds.items():
        value = layer.__dict__[n]
        if kind in (LEARNABLE, STATE) or (kind == PROPERTY and _holds_arrays(value)):
            leaves.append(n)
            continue
        try:
            hash(value)
        except TypeError:
            raise LayerError(
                f"{cls.__name__}.{n} holds an unhashable {type(value).__name__}; plain layer "
                "properties are static configuration (part of the compiled trace's key) and must "
                "be hashable. Fix: use a tuple instead of a list, or an array for numeric data; "
                "declare trained values with df.learnable() and updated ones with df.state()."
            ) from None
    return tuple(leaves)


# -- pytree registration ------------------------------------------------------------------------


def _static_items(layer: Layer) -> tuple:
    leaf = layer.__dict__["_leaf_fields"]
    return tuple((n, layer.__dict__[n]) for n in type(layer)._field_kinds if n not in leaf)


def _aux(layer: Layer):
    """The static part of a layer's pytree, computed once per object (layers are immutable).

    JAX flattens every argument on every call of a compiled function, so this is on the hot
    path. Code that changes static values in a copied ``__dict__`` must drop ``"_aux"``.
    """
    d = layer.__dict__
    aux = d.get("_aux")
    if aux is None:
        aux = d["_aux"] = (d["_leaf_fields"], _static_items(layer), d["_factors"])
    return aux


def _flatten(layer: Layer):
    d = layer.__dict__
    return tuple(d[n] for n in d["_leaf_fields"]), _aux(layer)


def _flatten_with_keys(layer: Layer):
    d = layer.__dict__
    children = tuple((jax.tree_util.GetAttrKey(n), d[n]) for n in d["_leaf_fields"])
    return children, _aux(layer)


def _unflatten(cls, aux, children):
    leaf, statics, factors = aux
    layer = object.__new__(cls)
    d = layer.__dict__
    d.update(statics)
    d.update(zip(leaf, children))
    d["_leaf_fields"] = leaf
    d["_factors"] = factors
    d["_aux"] = aux
    return layer


# -- running a layer ----------------------------------------------------------------------------


def _has_method(layer_or_cls, method: str) -> bool:
    cls = layer_or_cls if isinstance(layer_or_cls, type) else type(layer_or_cls)
    return getattr(cls, method, None) is not getattr(Layer, method, None) and callable(
        getattr(cls, method, None)
    )


def has_backward(layer) -> bool:
    return callable(getattr(type(layer), "backward", None))


@functools.cache
def _accepts_key(cls, method: str) -> bool:
    params = inspect.signature(getattr(cls, method)).parameters
    return "key" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _invoke(layer: Layer, method: str, args, key):
    """Call a user method, turning tracing failures into a clear, named error."""
    cls = type(layer)
    fn = getattr(layer, method)
    kwargs = {"key": key} if method == "forward" and _accepts_key(cls, "forward") else {}
    try:
        return fn(*args, **kwargs)
    except _CONCRETIZATION_ERRORS as error:
        if layer.acceleratable:
            fix = (
                "Fixes: express the choice with jnp.where(...) or jax.lax.cond / "
                "jax.lax.while_loop, or set `acceleratable = False` on the class so networks "
                "run this layer eagerly (outside the compiled trace)."
            )
        else:
            fix = (
                "The class sets acceleratable = False, so networks run it eagerly, but here it "
                "is being traced anyway (inside jax.jit or another staging transformation). "
                "Fix: call it outside jit, or use jnp.where / jax.lax.cond."
            )
        raise AccelerationError(
            f"{cls.__name__}.{method} (layer {layer.name!r}) uses Python control flow or a "
            "Python conversion (if/while/bool/int/float) on array values, which cannot be "
            f"traced and compiled. {fix}\nJAX said: {str(error).splitlines()[0]}"
        ) from error


def _split_returns(layer: Layer, method: str, result, with_memory: bool):
    """Split a user predict/forward result into (outputs, state values, memory)."""
    cls = type(layer)
    state_names = layer.state_names
    m, k = layer.num_outputs, len(state_names)
    total = m + k + (1 if with_memory else 0)
    if total == 1 and not isinstance(result, (tuple, list)):
        result = (result,)
    if not isinstance(result, (tuple, list)) or len(result) != total:
        got = (
            f"{len(result)} values"
            if isinstance(result, (tuple, list))
            else "a single array"
            if _is_array(result) or isinstance(result, FormattedArray)
            else f"a single {type(result).__name__}"
        )
        parts = [f"{m} output(s)"]
        if k:
            parts.append(
                f"the new values of the {k} state field(s) {list(state_names)} (a nested "
                "network's state table, e.g. from self.net.forward(...), for a network field)"
                if any(cls._field_kinds[n] == LEARNABLE for n in state_names)
                else f"the new values of the {k} state field(s) {list(state_names)}"
            )
        if with_memory:
            parts.append("a memory value for backward")
        raise ForwardError(
            f"{cls.__name__}.{method} (layer {layer.name!r}) returned {got}; expected {total}: "
            f"{', then '.join(parts)}. Fix: return them in that order"
            + (" (memory may be None)." if with_memory else ".")
        )
    result = tuple(result)
    memory = result[m + k] if with_memory else None
    return result[:m], result[m : m + k], memory


def _run_user(layer: Layer, inputs, training: bool, key):
    """Run predict or forward (with its memory), normalized to (outputs, state, memory)."""
    custom_backward = has_backward(layer)
    if training and _has_method(layer, "forward"):
        result = _invoke(layer, "forward", inputs, key)
        return _split_returns(layer, "forward", result, with_memory=custom_backward)
    result = _invoke(layer, "predict", inputs, key)
    outputs, new_state, _ = _split_returns(layer, "predict", result, with_memory=False)
    return outputs, new_state, None


def call_layer(layer: Layer, inputs: Sequence[Any], *, training: bool = False, key=None):
    """Run one layer: formats, custom backward, checks. Returns ``(outputs, new_state)``.

    Args:
      layer: the layer (initialized).
      inputs: one value per layer input (FormattedArray or plain array).
      training: use ``forward`` (training-time behaviour) instead of ``predict``.
      key: randomness for ``forward``.
    """
    cls = type(layer)
    if not _has_method(layer, "predict"):
        raise LayerError(
            f"{cls.__name__} does not define predict; every layer needs `def predict(self, *X)`."
        )
    if len(inputs) != layer.num_inputs:
        raise LayerError(
            f"{cls.__name__} (layer {layer.name!r}) takes {layer.num_inputs} input(s) "
            f"{list(layer.input_names)}; got {len(inputs)}."
        )
    out_format = next((dims(x) for x in inputs if dims(x)), "")
    if layer.formattable:
        user_inputs = tuple(inputs)
    else:
        user_inputs = tuple(stripdims(x) for x in inputs)
    if has_backward(layer):
        outputs, new_state = _call_with_backward(layer, user_inputs, training, key)
    else:
        outputs, new_state, _ = _run_user(layer, user_inputs, training, key)
    return _format_outputs(layer, outputs, out_format), tuple(new_state)


def _format_outputs(layer: Layer, outputs, out_format: str):
    cls = type(layer)
    formatted = []
    for i, y in enumerate(outputs):
        if layer.formattable:
            if out_format and not isinstance(y, FormattedArray):
                raise LayerError(
                    f"{cls.__name__} (layer {layer.name!r}) is formattable but its output "
                    f"{layer.output_names[i]!r} is a plain array. Fix: return "
                    "df.dlarray(y, fmt) with the output's format."
                )
            formatted.append(y)
            continue
        if isinstance(y, FormattedArray):
            y = y.data
        if out_format:
            if jnp.ndim(y) != len(out_format):
                raise LayerError(
                    f"{cls.__name__} (layer {layer.name!r}) output {layer.output_names[i]!r} has "
                    f"{jnp.ndim(y)} dimensions but its input format {out_format!r} has "
                    f"{len(out_format)}; a layer with formattable = False gives its outputs the "
                    "input's format. Fix: set `formattable = True` on the class and return "
                    "df.dlarray(y, new_format)."
                )
            y = dlarray(y, out_format)
        formatted.append(y)
    return tuple(formatted)


# -- the custom backward, through jax.custom_vjp ------------------------------------------------


@functools.cache
def _backward_takes_state(cls, n_in: int, n_out: int) -> bool:
    """Whether backward's signature includes the state gradients (MATLAB: both or neither)."""
    k = len(cls._state_fields)
    if k == 0:
        return False
    params = list(inspect.signature(cls.backward).parameters.values())[1:]
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return False
    count = sum(1 for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
    without, with_state = n_in + 2 * n_out + 1, n_in + 2 * n_out + k + 1
    if count == with_state:
        return True
    if count == without:
        return False
    raise LayerError(
        f"{cls.__name__}.backward takes {count} arguments after self; expected {without} "
        f"(X x{n_in}, Y x{n_out}, dLdY x{n_out}, memory) or {with_state} (adding dLdSout x{k} "
        "before memory, in which case it also returns dLdSin)."
    )


def _call_with_backward(layer: Layer, inputs, training: bool, key):
    cls = type(layer)
    learnables = tuple(getattr(layer, n) for n in cls._learnable_fields)
    for n, w in zip(cls._learnable_fields, learnables):
        if w is None:
            raise LayerError(
                f"{cls.__name__} (layer {layer.name!r}) learnable {n!r} is None. Fix: call "
                "layer.initialize(*layouts, key=...) (or net.initialize) first."
            )
        if _is_network(w):
            raise LayerError(
                f"{cls.__name__} (layer {layer.name!r}) holds a network in learnable {n!r} and "
                "defines backward; a custom backward cannot cover a nested network. Fix: remove "
                "backward (autodiff differentiates through the nested network)."
            )
    states = tuple(getattr(layer, n) for n in cls._state_fields)
    const_fields = tuple(
        n for n in layer.__dict__["_leaf_fields"] if cls._field_kinds[n] not in (LEARNABLE, STATE)
    )
    consts = tuple(getattr(layer, n) for n in const_fields)
    template = {k: v for k, v in layer.__dict__.items() if k not in layer.__dict__["_leaf_fields"]}
    takes_state = _backward_takes_state(cls, layer.num_inputs, layer.num_outputs)

    def assemble(ws, ss, cs):
        new = object.__new__(cls)
        d = new.__dict__
        d.update(template)
        d.update(zip(cls._learnable_fields, ws))
        d.update(zip(cls._state_fields, ss))
        d.update(zip(const_fields, cs))
        return new

    def run(ws, ss, cs, xs, k):
        outputs, new_state, _ = _run_user(assemble(ws, ss, cs), xs, training, k)
        return tuple(outputs), tuple(new_state)

    def fwd(ws, ss, cs, xs, k):
        is_primal = lambda x: hasattr(x, "perturbed")  # noqa: E731
        values = jax.tree.map(lambda p: p.value, (ws, ss, cs, xs, k), is_leaf=is_primal)
        flags = jax.tree.map(lambda p: bool(p.perturbed), (ws, ss, xs), is_leaf=is_primal)
        ws_, ss_, cs_, xs_, k_ = values
        outputs, new_state, memory = _run_user(assemble(ws_, ss_, cs_), xs_, training, k_)
        specs = ct.Static(
            (
                tuple(any(jax.tree.leaves(f)) for f in flags[0]),
                tuple(any(jax.tree.leaves(f)) for f in flags[1]),
                tuple(any(jax.tree.leaves(f)) for f in flags[2]),
                tuple(_spec(y) for y in outputs),
                tuple(_spec(s) for s in new_state),
            )
        )
        residuals = (ws_, ss_, cs_, xs_, tuple(outputs), memory, specs)
        return (tuple(outputs), tuple(new_state)), residuals

    def bwd(residuals, cotangents):
        ws, ss, cs, xs, outputs, memory, specs = residuals
        w_req, s_req, x_req, y_specs, s_out_specs = specs.value
        dys, dss = cotangents
        zero_state = tuple(None for _ in ss)
        nothing = (tuple(None for _ in ws), zero_state, _none_like(cs), _none_like(xs), None)
        if all(
            ct.is_symbolic_zero(c) for c in jax.tree.leaves((dys, dss), is_leaf=ct.is_symbolic_zero)
        ):
            return nothing
        dys = tuple(_instantiate(c, y, spec) for c, y, spec in zip(dys, outputs, y_specs))
        args = [*xs, *outputs, *dys]
        if takes_state:
            args += [_instantiate(c, None, spec) for c, spec in zip(dss, s_out_specs)]
        args.append(memory)
        try:
            result = assemble(ws, ss, cs).backward(*args)
        except Exception as error:
            if memory is None and not training and _has_method(cls, "forward"):
                raise BackwardError(
                    f"{cls.__name__}.backward (layer {layer.name!r}) failed with memory=None: "
                    "memory comes from forward (training), but here predict was differentiated "
                    "(layer(x), net.predict), which has no memory, as in MATLAB. Fix: handle "
                    "memory is None in backward (recompute what it needs from X and Y), or "
                    f"differentiate the training path (net.forward). It raised: "
                    f"{type(error).__name__}: {error}"
                ) from error
            raise
        who = f"{cls.__name__}.backward (layer {layer.name!r})"
        n_in, n_w, n_s = len(xs), len(ws), len(ss) if takes_state else 0
        names = (
            [f"dLd{n}" for n in layer.input_names]
            + [f"dLd{n}" for n in cls._learnable_fields]
            + ([f"dLd{n}" for n in cls._state_fields] if takes_state else [])
        )
        grads = ct.normalize_returns(result, n_in + n_w + n_s, who=who, names=names)
        total = len(grads)
        dxs = tuple(
            _check_input_gradient(
                g,
                x,
                required,
                who,
                f"the gradient of input {layer.input_names[i]!r} ({i + 1} of {total})",
            )
            for i, (g, x, required) in enumerate(zip(grads[:n_in], xs, x_req))
        )
        dws = tuple(
            ct.check_gradient(
                g,
                ct.Spec.of(w),
                who=who,
                required=required,
                what=f"the gradient of learnable {name!r} ({n_in + j + 1} of {total})",
            )
            for j, (g, w, required, name) in enumerate(
                zip(grads[n_in : n_in + n_w], ws, w_req, cls._learnable_fields)
            )
        )
        if takes_state:
            dss_in = tuple(
                _check_state_gradient(
                    g,
                    s,
                    required,
                    who,
                    f"the gradient of state {name!r} ({n_in + n_w + j + 1} of {total})",
                )
                for j, (g, s, required, name) in enumerate(
                    zip(grads[n_in + n_w :], ss, s_req, cls._state_fields)
                )
            )
        else:
            dss_in = zero_state
        return dws, dss_in, _none_like(cs), dxs, None

    run_with_backward = custom_vjp(run, fwd, bwd, name=f"{cls.__name__}.backward")
    outputs, new_state = run_with_backward(learnables, states, consts, tuple(inputs), key)
    return outputs, new_state


def _spec(value):
    data = stripdims(value)
    return ct.Spec.of(data) if data is not None else None


def _none_like(tree):
    return jax.tree.map(lambda _: None, tree)


def _instantiate(cotangent, primal, spec):
    """A real array for a (possibly symbolic-zero) cotangent, formatted like its primal."""
    if isinstance(cotangent, FormattedArray):
        data = ct.instantiate(cotangent.data, spec)
        return dlarray(data, cotangent.format)
    data = ct.instantiate(cotangent, spec)
    if isinstance(primal, FormattedArray):
        return dlarray(data, primal.format)
    return data


def _check_input_gradient(grad, x, required, who, what):
    checked = ct.check_gradient(
        stripdims(grad) if grad is not None else None,
        ct.Spec.of(stripdims(x)),
        who=who,
        what=what,
        required=required,
    )
    if checked is not None and isinstance(x, FormattedArray):
        return dlarray(checked, x.format)
    if checked is None and isinstance(x, FormattedArray):
        return None
    return checked


def _check_state_gradient(grad, s, required, who, what):
    if s is None:
        return None
    return ct.check_gradient(grad, ct.Spec.of(s), who=who, what=what, required=required)


def _short(value) -> str:
    if _is_array(value) or isinstance(value, jax.core.Tracer):
        return f"{jnp.result_type(value).name}{list(jnp.shape(value))}"
    if isinstance(value, FormattedArray):
        return f"{value.dtype.name}{list(value.shape)}:{value.format}"
    if isinstance(value, str):
        return repr(value)
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# -- input layers ---------------------------------------------------------------------------------


class InputLayer(Layer):
    """Base of input layers (``ImageInput``, ``FeatureInput``, ``SequenceInput``).

    An input layer starts a network: it has one input, which is a network input, and it knows
    that input's layout (``input_layout``), so the network needs no example data to initialize.
    It may normalize its data with statistics that ``trainnet`` computes from the training data
    (``with_statistics``).
    """

    @property
    def input_layout(self):
        """The ``df.Layout`` of the network input this layer receives (batch size ``None``)."""
        raise NotImplementedError

    def with_statistics(self, x):
        """A layer whose normalization statistics still ``None`` are computed from ``x``.

        ``x`` is a (large) sample of training inputs with this layer's format. The default has no
        statistics and returns the layer unchanged.
        """
        del x
        return self

    def needs_statistics(self) -> bool:
        """Whether ``with_statistics`` would change anything (trainnet then computes them)."""
        return False

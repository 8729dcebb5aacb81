r"""``Layer``: custom layers as immutable pytrees, with MATLAB's method contract.

A layer class declares fields like a dataclass (``_fields.py``: ``df.learnable()``,
``df.state()``, plain properties). Layers are immutable; ``layer.replace(**changes)`` returns a new
one. The method contract:

* ``initialize(*layouts, key)`` fills parameters that are still ``None`` and returns a new layer;
* ``predict(*X)`` returns ``Y1..YM`` then the new values of the state fields (declaration order);
* ``forward(*X[, key])`` (optional; falls back to ``predict``) returns the same, plus a memory
  value when the layer defines ``backward``;
* ``backward(*X, *Y, *dLdY, [*dLdSout], memory)`` (optional) returns ``dLdX..``, then one gradient
  per learnable (declaration order), then, if it takes ``dLdSout``, one per state field. It is
  wired in with ``jax.custom_vjp`` (``_layer_backward.py``); without it, JAX autodiff.

Calling a layer (formats, the user's methods, their returns) lives in ``_layer_call.py``.

Construction: every new layer object, from the class call or a copy (``replace``), passes
`_validate`, which checks what is new: parameter values, ports, hashability of static
fields. Only the pytree unflatten (JAX's hot path) rebuilds a layer without it.

Package-internal API (per class) ``_field_kinds``, ``_learnable_fields``, ``_state_fields``,
``_user_methods``; (per layer) ``_leaf_fields`` (the fields that are pytree children),
``_factors`` (learn-rate and L2 factors set on it), ``_copy``, ``_state_values``, ``_with_state``.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Self, TypeVar, cast, dataclass_transform

import jax

from .._core import (
    CONCRETIZATION_ERRORS,
    LAYER_METHODS,
    Error,
    FormattedArray,
    LayerError,
    Layout,
    accepts_key,
    check_key,
    is_array,
    predict_arity,
    raised_at,
    short,
    who,
)
from ._fields import (
    BASE,
    BASE_FIELDS,
    LEARNABLE,
    PROPERTY,
    STATE,
    as_parameter,
    check_assigned,
    field_kind,
    is_network,
    learnable,
    state,
)
from ._layer_call import call_layer

_T = TypeVar("_T")
_Layer = TypeVar("_Layer", bound="Layer")
# The default of the port fields: None, resolved when the layer is made (``_resolve_ports``).
_RESOLVED: Any = None


def _guarded(initialize):
    """A layer class's ``initialize``, with its layouts checked and its failures named.

    Each layout must be a ``df.Layout``; a formatted example array stands for its layout (as
    MATLAB's ``initialize`` takes a ``dlarray``). A tuple of sizes is an error: it has no format,
    and guessing one would be ambiguous. An exception from the user's code becomes a
    ``df.LayerError`` naming the layer, chained to the original (its traceback stays available);
    difffn's own errors, and JAX's tracing errors (networks fall back to an eager initialize on
    those), pass through unchanged.
    """

    @functools.wraps(initialize)
    def guarded(self, *layouts, **kwargs):
        layouts = tuple(_as_layout(self, i, layout) for i, layout in enumerate(layouts))
        check_key(who(self, "initialize"), kwargs.get("key"), LayerError)
        if not accepts_key(type(self), "initialize"):
            raise LayerError(
                f"{type(self).__name__}.initialize does not take the keyword argument key; "
                "difffn passes the randomness for initialization explicitly (MATLAB's initialize "
                "has no key). Fix: def initialize(self, layout, *, key): ..."
            )
        try:
            return initialize(self, *layouts, **kwargs)
        except (Error, *CONCRETIZATION_ERRORS):
            raise
        except Exception as error:
            where = raised_at(error)
            raise LayerError(
                f"{who(self, 'initialize')} raised {type(error).__name__}: {error}"
                + (f" (at {where})" if where else "")
                + f", given the layouts {[str(lo) for lo in layouts]}. Fix: make initialize "
                "handle these layouts; the original exception is chained to this one."
            ) from error

    return guarded


def _as_layout(layer, i: int, value) -> Layout:
    if isinstance(value, Layout):
        return value
    if isinstance(value, FormattedArray):
        return Layout.of(value)
    shape = f" {value!r}" if isinstance(value, (tuple, list)) else ""
    raise LayerError(
        f"{who(layer)}.initialize takes a df.Layout (sizes and a format, one label per axis) or a "
        f"formatted example array per input; layout {i + 1} is a {type(value).__name__}{shape}. "
        "Fix: layer.initialize(df.Layout((None, 3), 'BC'), key=key), with your sizes and format."
    )


# dataclass_transform: type checkers see each layer class as the dataclass that the metaclass
# makes of it (constructors with the real fields; df.learnable()/df.state() as field specifiers).
@dataclass_transform(eq_default=False, field_specifiers=(dataclasses.field, learnable, state))
class _LayerMeta(type):
    """Turns each subclass into a dataclass pytree and controls construction."""

    def __new__(
        mcls, name: str, bases: tuple[type, ...], namespace: dict[str, Any], **kwargs: Any
    ) -> _LayerMeta:
        if "initialize" in namespace:
            namespace = {**namespace, "initialize": _guarded(namespace["initialize"])}
        cls = cast("type[Layer]", super().__new__(mcls, name, bases, namespace, **kwargs))
        # A hand-written __init__ (here or inherited) is kept; otherwise dataclass writes one.
        user_init = "__init__" in namespace or any(getattr(b, "_user_init", False) for b in bases)
        cls = dataclasses.dataclass(init=not user_init, repr=False, eq=False)(cls)
        kinds = {f.name: field_kind(f) for f in dataclasses.fields(cls)}
        cls._field_kinds = kinds
        cls._learnable_fields = tuple(n for n, k in kinds.items() if k == LEARNABLE)
        cls._state_fields = tuple(n for n, k in kinds.items() if k == STATE)
        cls._user_init = user_init
        root = next(c for c in reversed(cls.__mro__) if isinstance(c, _LayerMeta))
        cls._user_methods = frozenset(
            m
            for m in LAYER_METHODS
            if callable(getattr(cls, m, None)) and getattr(cls, m) is not getattr(root, m, None)
        )
        if bases:  # the abstract base itself is never instantiated
            jax.tree_util.register_pytree_with_keys(
                cls, _flatten_with_keys, functools.partial(_unflatten, cls), _flatten
            )
        return cls

    def __call__(cls: type[_T], *args: Any, **kwargs: Any) -> _T:
        # type[_T], not type[Layer]: type checkers then take the constructor's signature from
        # the class's __init__ (the dataclass fields or a hand-written one).
        return cast(_T, _construct(cast("type[Layer]", cls), args, kwargs))


def _construct(cls: type[_Layer], args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Layer:
    """The class call of a layer class: ``__init__``, the fields' defaults, `_validate`."""
    self = cls.__new__(cls)
    object.__setattr__(self, "_initializing", True)
    if cls._user_init:
        # A hand-written __init__ may set only some fields; the rest take their defaults.
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                object.__setattr__(self, f.name, f.default)
            elif f.default_factory is not dataclasses.MISSING:
                object.__setattr__(self, f.name, f.default_factory())
    try:  # the arguments are checked before the call: a TypeError raised inside stays
        inspect.signature(cls.__init__).bind(self, *args, **kwargs)
    except TypeError as error:
        fields = ", ".join(f.name for f in dataclasses.fields(cls))
        raise LayerError(
            f"{cls.__name__}(...) could not be constructed: {error}. Its fields are: {fields}. "
            "Fix: pass only those fields (options after the required ones are keywords)."
        ) from None
    cls.__init__(self, *args, **kwargs)
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in self.__dict__]
    if missing:
        raise LayerError(
            f"{cls.__name__}.__init__ did not set field(s) {missing} and they have no "
            "default. Fix: assign them in __init__ or give them a default."
        )
    object.__delattr__(self, "_initializing")
    _validate(self, None)
    return self


class Layer(metaclass=_LayerMeta):
    """Base class of custom layers (MATLAB ``nnet.layer.Layer``).

    Subclass it, declare fields, and define ``predict`` (required) and optionally
    ``initialize``, ``forward``, ``reset_state`` and ``backward``. See the module docstring for
    the method contract and ``docs/layers.md`` for a guide.

    Attributes:
      formattable: ``False`` (default): ``predict`` receives plain arrays and its outputs take
        the input's format. ``True``: it receives and returns ``df.FormattedArray``.
      acceleratable: ``True`` (default): networks compile the layer into their trace. ``False``:
        networks run it eagerly (for Python control flow on values) and compile around it.
      surrogate_gradients: optional ``{input or learnable name: reason}`` for values whose
        ``backward`` is intentionally not the derivative (a straight-through estimator, gradient
        reversal): ``df.check_layer`` reports their ``gradients_are_correct[name]`` Skipped with
        the reason (and runs every other test); a name that is neither an input nor a learnable
        is a ``df.CheckError``. Read by the checkers only.
      once_differentiable: ``True``: ``backward`` is declared first-order only, so
        ``df.check_layer`` reports ``second_order_gradients_are_correct`` Skipped. Read by the
        checkers only (a layer's backward is not guarded against a second derivative).

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
    surrogate_gradients: ClassVar[dict[str, str] | None] = None
    once_differentiable: ClassVar[bool] = False

    name: str = dataclasses.field(default="", kw_only=True)
    description: str = dataclasses.field(default="", kw_only=True)
    type: str = dataclasses.field(default="", kw_only=True)
    # The ports are resolved by MATLAB's rules when a layer is made: never None on a layer.
    num_inputs: int = dataclasses.field(default=_RESOLVED, kw_only=True)
    input_names: tuple[str, ...] = dataclasses.field(default=_RESOLVED, kw_only=True)
    num_outputs: int = dataclasses.field(default=_RESOLVED, kw_only=True)
    output_names: tuple[str, ...] = dataclasses.field(default=_RESOLVED, kw_only=True)

    # Filled by the metaclass.
    _field_kinds: ClassVar[dict[str, str]]
    _learnable_fields: ClassVar[tuple[str, ...]]
    _state_fields: ClassVar[tuple[str, ...]]
    _user_init: ClassVar[bool]
    _user_methods: ClassVar[frozenset[str]]

    # -- immutability ----------------------------------------------------------------------

    if TYPE_CHECKING:  # set in the instance dict by ``_validate`` (not a dataclass field)

        @property
        def _factors(self) -> tuple[tuple[str, str, float], ...]:
            """The learn-rate and L2 factors set on this layer: (field, kind, value) triples."""
            ...

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("_initializing"):
            object.__setattr__(self, name, value)
            return
        raise LayerError(
            f"{type(self).__name__} is immutable (a pytree); cannot set {name!r}. Fix: "
            f"layer = layer.replace({name}=...)."
        )

    def __delattr__(self, name: str) -> None:
        raise LayerError(f"{type(self).__name__} is immutable; cannot delete {name!r}.")

    # -- the public surface ------------------------------------------------------------------

    def replace(self, **changes: Any) -> Self:
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
        return self._copy(changes)

    def initialize(self, *layouts: Any, **kwargs: Any) -> Self:
        """Fill parameters that are still ``None``; the default does nothing.

        Args:
          *layouts: one ``df.Layout`` per input (sizes may be ``None`` for unknown, e.g. batch);
            a formatted example array stands for its layout.
          key: a ``jax.random`` key for random initialization.

        Raises:
          LayerError: a layout that is not a ``df.Layout`` (a tuple of sizes has no format), or
            an exception raised by the class's ``initialize`` (chained to it).
        """
        del layouts, kwargs
        return self

    def predict(self, *inputs: Any, **kwargs: Any) -> Any:
        """The layer's outputs ``Y1..YM``, then the new values of its state fields.

        Every layer class defines it (MATLAB's ``predict``); ``*inputs`` are its inputs
        (``def predict(self, x)``, ``def predict(self, x1, x2)``), and a keyword ``mask``
        receives the padding mask of sequence data.
        """
        raise NotImplementedError

    def reset_state(self) -> Self:
        """A layer with its state reset; the default (as in MATLAB) leaves the state as it is."""
        return self

    def __call__(self, *inputs: Any, key: jax.Array | None = None) -> Any:
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
            or (kind == LEARNABLE and is_network(v := self.__dict__[n]) and v.has_state)
        )

    @property
    def initialized(self) -> bool:
        """True when no learnable or state field is ``None`` (nested networks initialized)."""
        for n in self.learnable_names + self.state_names:
            value = getattr(self, n)
            if value is None or (is_network(value) and not value.initialized):
                return False
        return True

    def __repr__(self) -> str:
        parts = []
        for n, kind in type(self)._field_kinds.items():
            value = getattr(self, n)
            if kind == BASE and n != "name":
                continue
            parts.append(f"{n}={short(value)}")
        return f"{type(self).__name__}({', '.join(parts)})"

    # -- the package-internal API --------------------------------------------------------------

    def _copy(self, changes: dict[str, Any], *, factors=None, assigned: bool = False) -> Self:
        """The one constructor of layer copies (``replace``, networks, factors, loading, state).

        The copy is validated by `_validate`, for what changed.

        Args:
          changes: field name -> new value.
          factors: new learn-rate and L2 factors (checked by the caller, ``_factors``).
          assigned: the values are put in place of initialized ones (``Network.replace``): each
            must fit the value it replaces (``_fields.check_assigned``).
        """
        new = object.__new__(type(self))
        d = vars(new)
        d.update(self.__dict__)
        d.update(changes)
        if factors is not None:
            d["_factors"] = factors
            d.pop("_aux", None)  # the factors are static: the cached pytree aux is stale
        _validate(new, set(changes), previous=self if assigned else None)
        return new

    def _state_values(self) -> tuple:
        """The current value of every entry of ``state_names`` (tables for nested networks)."""
        return tuple(v.state if is_network(v := self.__dict__[n]) else v for n in self.state_names)

    def _with_state(self, values: Sequence[Any]) -> Layer:
        """A new layer whose ``state_names`` entries hold ``values``.

        It runs once per trace of a training step: only the state values are validated (for
        tracers, a type test), and the static part of the layer is kept as it is.
        """
        changes = {}
        for n, value in zip(self.state_names, values):
            current = self.__dict__[n]
            changes[n] = current.replace(state=value) if is_network(current) else value
        return self._copy(changes)


# -- construction: the one validation of a new layer -------------------------------------------


def _validate(layer: Layer, changed: set[str] | None, *, previous: Layer | None = None) -> None:
    """Check and normalize a new layer object in place: what ``changed`` (``None``: everything).

    Parameter values are coerced (``as_parameter``) and, when ``previous`` is given, checked
    against the values they replace; when configuration changed, the class's ``__post_init__``
    runs again (a copy; the class call ran it already), the ports are resolved and the fields are
    classified into pytree children and hashable static values.
    """
    d, cls = vars(layer), type(layer)
    kinds = cls._field_kinds
    if changed is None:
        for n in cls._learnable_fields + cls._state_fields:
            d[n] = as_parameter(cls, n, d[n])
        _check_name(layer)
        _resolve_ports(layer)
        d["type"] = d["type"] or cls.__name__
        d["description"] = d["description"] or cls.__name__
        d.setdefault("_factors", ())
        d["_leaf_fields"] = _classify(layer)
        return
    for n in changed:
        if kinds[n] in (LEARNABLE, STATE):
            if previous is not None:
                check_assigned(previous, n, kinds[n], previous.__dict__[n], d[n])
            d[n] = as_parameter(cls, n, d[n])
    if all(kinds[n] in (LEARNABLE, STATE) for n in changed):
        return  # only leaf values changed: the static part (and its cached pytree aux) holds
    d.pop("_aux", None)
    post_init = getattr(cls, "__post_init__", None)
    if post_init is not None:
        # Configuration changed: validate and normalize it as the constructor does.
        before = {n: d[n] for n in BASE_FIELDS}
        d["_initializing"] = True
        try:
            post_init(layer)
        finally:
            del d["_initializing"]
        changed = changed | {n for n in BASE_FIELDS if d[n] is not before[n]}
    if any(kinds[n] == BASE for n in changed):
        _check_name(layer)
        _resolve_ports(layer, changed=changed)
    d["_leaf_fields"] = _classify(layer)


def _check_name(layer: Layer) -> None:
    """A layer's name is a string: networks build parameter paths (``"layer/param"``) from it.

    ``None`` (the usual default of a custom layer's ``__init__(..., name=None)``) means unnamed,
    MATLAB's ``''``: a network names it.
    """
    name = layer.__dict__["name"]
    if name is None:
        vars(layer)["name"] = name = ""
    if not isinstance(name, str):
        raise LayerError(
            f"{type(layer).__name__}: name must be a string; got {type(name).__name__} "
            f"{name!r}. Fix: name={str(name)!r}."
        )


def _resolve_ports(layer: Layer, changed: set[str] | None = None) -> None:
    """MATLAB's rules for NumInputs/InputNames and NumOutputs/OutputNames, kept consistent."""
    d, cls = vars(layer), type(layer)
    changed = changed or set()
    inferred = predict_arity(cls)
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


def _holds_arrays(value) -> bool:
    """Whether a property value must travel as pytree leaves (arrays, layers, networks)."""
    if isinstance(value, Layer) or is_network(value):
        return True
    return any(is_array(leaf) for leaf in jax.tree.leaves(value))


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
    path. A copy whose static values change drops ``"_aux"`` (``_validate`` does).
    """
    d = vars(layer)
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
    # JAX's hot path (every compiled call, every tree.map) rebuilds layers here, from a
    # structure that a validated layer produced, with leaves that may be tracers or placeholders:
    # it alone skips _validate.
    leaf, statics, factors = aux
    layer = object.__new__(cls)
    d = vars(layer)
    d.update(statics)
    d.update(zip(leaf, children))
    d["_leaf_fields"] = leaf
    d["_factors"] = factors
    d["_aux"] = aux
    return layer

"""Annotated parameters: one walk over the fields of layers and networks, and the tables on it.

`walk` visits every field of a layer or network that is a pytree child (learnables, state,
properties holding arrays), in the order of the pytree's leaves, and enters networks held in
learnable fields (network composition, MATLAB's ``properties (Learnable)`` holding a
``dlnetwork``). What it yields, `Parameter`, says where the field is (its path), what it
is (learnable, state or constant), and which learnable network fields lead to it.

Everything that needs to know what a leaf is uses it: learn-rate and L2 factors per leaf
(``_factors.leaf_factors``), `leaf_kinds` and [`learnable_mask`][difffn.interop.learnable_mask]
(serialization, the
solvers, optax masks), the parameter tables of a network (``net.learnables``, ``net.state``,
``net.replace``, counts in ``summary``), and the checkers (which leaves belong to which input,
learnable or state of a layer).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp

from .._core import NetworkError, who
from ._fields import CONSTANT, LEARNABLE, STATE, is_network
from ._layer import Layer
from ._table import ParameterTable


@dataclasses.dataclass(frozen=True, eq=False)
class Parameter:
    """One field of one layer, as `walk` reaches it.

    Attributes:
      path: ``"field"`` on a layer, ``"layer/field"`` on a network; through a nested network,
        ``"layer/net_field/inner_layer/field"``. The same paths as the parameter tables.
      layer_path: the path of the layer that holds the field (``""`` for the layer walked).
      layer: that layer.
      field: the field's name.
      kind: ``"learnable"``, ``"state"`` or ``"constant"`` (a property holding arrays, or
        anything inside a field that is not learnable).
      value: the field's value.
      owners: the learnable fields holding networks that lead here, outermost first.
      nested: the field holds a network whose parameters follow as entries of their own.
    """

    path: str
    layer_path: str
    layer: Layer
    field: str
    kind: str
    value: Any
    owners: tuple[Parameter, ...]
    nested: bool

    @property
    def leaves(self) -> list:
        """The pytree leaves of this field (none for a nested network: its entries have them)."""
        return [] if self.nested else jax.tree.leaves(self.value)


def walk(tree) -> Iterator[Parameter]:
    """Every child field of a layer or network, in pytree leaf order (nothing for other trees).

    Examples:
      >>> import jax
      >>> import difffn as df
      >>> from difffn._layer._parameters import walk
      >>> net = df.Network([df.layers.FeatureInput(3, normalization="none", name="in"),
      ...                   df.layers.FullyConnected(2, name="fc")])
      >>> net = net.initialize(key=jax.random.key(0))
      >>> [(p.path, p.kind) for p in walk(net)]
      [('fc/weights', 'learnable'), ('fc/bias', 'learnable')]
    """
    if is_network(tree):
        yield from _walk_network(tree, "", ())
    elif isinstance(tree, Layer):
        yield from _walk_layer(tree, "", ())


def _walk_network(net, prefix: str, owners: tuple[Parameter, ...]) -> Iterator[Parameter]:
    for layer in net.layers:
        yield from _walk_layer(layer, f"{prefix}{layer.name}", owners)


def _walk_layer(layer: Layer, layer_path: str, owners) -> Iterator[Parameter]:
    kinds = type(layer)._field_kinds
    for field in layer.__dict__["_leaf_fields"]:
        value = layer.__dict__[field]
        kind = kinds[field]
        path = f"{layer_path}/{field}" if layer_path else field
        if kind == LEARNABLE and is_network(value):
            entry = Parameter(path, layer_path, layer, field, kind, value, owners, nested=True)
            yield entry
            yield from _walk_network(value, f"{path}/", (*owners, entry))
            continue
        if kind not in (LEARNABLE, STATE) or is_network(value) or isinstance(value, Layer):
            kind = CONSTANT
        yield Parameter(path, layer_path, layer, field, kind, value, owners, nested=False)


def leaf_kinds(tree) -> list[str]:
    """The kind (learnable/state/constant) of every leaf of ``tree``, in leaf order."""
    if not (is_network(tree) or isinstance(tree, Layer)):
        return [CONSTANT] * len(jax.tree.leaves(tree))
    return [p.kind for p in walk(tree) for _ in p.leaves]


def learnable_mask(tree):
    """A pytree like ``tree`` with True at learnable leaves (for optax.masked, partitioning)."""
    kinds = leaf_kinds(tree)
    return jax.tree.unflatten(jax.tree.structure(tree), [k == LEARNABLE for k in kinds])


def count(tree, kind: str) -> int:
    """The number of values (array elements) in the parameters of ``kind``."""
    return sum(int(jnp.size(leaf)) for p in walk(tree) if p.kind == kind for leaf in p.leaves)


# -- the parameter tables of a network ------------------------------------------------------------


def table(net, kind: str) -> ParameterTable:
    """``net.learnables`` / ``net.state``: one row (layer, parameter, value) per field."""
    rows = []
    for p in walk(net):
        if p.kind == kind and not p.nested:
            layer, _, parameter = p.path.partition("/")
            rows.append((layer, parameter, p.value))
    return ParameterTable(rows)


def state_table(net, states) -> ParameterTable:
    """The table of new state values (one tuple per layer, as a run returns them)."""
    rows = []
    for layer, values in zip(net.layers, states):
        for n, v in zip(layer.state_names, values):
            if isinstance(v, ParameterTable):  # the state of a nested network
                rows += [(layer.name, f"{n}/{path}", val) for path, val in v.items()]
            else:
                rows.append((layer.name, n, v))
    return ParameterTable(rows)


def assign(net, values, kind: str):
    """``net.replace(learnables=...)``: ``values`` (a table or ``"layer/param"`` mapping) put in.

    Every new value goes through the layer's constructor, which checks it against the value it
    replaces (shape and dtype kind for learnables, dtype kind for state).
    """
    arg = "learnables" if kind == LEARNABLE else "state"
    if not hasattr(values, "items"):
        raise NetworkError(
            f"Network.replace: {arg} must be a ParameterTable or a mapping from "
            f"'layer/parameter' to a value; got {type(values).__name__}. Fix: e.g. "
            f"net.replace({arg}=net.{arg}.set('fc/bias', b)) or "
            f"net.replace({arg}={{'fc/bias': b}})."
        )
    updates: dict[str, dict[str, Any]] = {}
    for path, value in values.items():
        if not isinstance(path, str) or "/" not in path:
            raise NetworkError(
                f"Network.replace: {path!r} is not a 'layer/parameter' path. Fix: name the "
                f"parameter as in net.{arg}, e.g. {next(iter(table(net, kind)), 'fc/bias')!r}."
            )
        layer_name, _, parameter = path.partition("/")
        updates.setdefault(layer_name, {})[parameter] = value
    layers = list(net.layers)
    for layer_name, params in updates.items():
        i = net.graph.index(layer_name)
        layers[i] = _assign_layer(layers[i], params, kind)
    return net.with_layers(layers)


def _assign_layer(layer: Layer, params: dict[str, Any], kind: str) -> Layer:
    cls = type(layer)
    direct, nested = {}, {}
    for path, value in params.items():
        field, _, rest = path.partition("/")
        if field not in cls._field_kinds:
            raise NetworkError(
                f"layer {layer.name!r} ({cls.__name__}) has no parameter {path!r}; its "
                f"{kind} parameters are {_kind_fields(layer, kind)}. Fix: use one of those "
                "names."
            )
        if rest:
            nested.setdefault(field, {})[rest] = value
        elif cls._field_kinds[field] != kind:
            raise NetworkError(
                f"layer {layer.name!r} ({cls.__name__}) parameter {field!r} is not a {kind} "
                f"parameter; its {kind} parameters are {_kind_fields(layer, kind)}."
            )
        else:
            direct[field] = value
    for field, sub in nested.items():
        inner = getattr(layer, field)
        if not is_network(inner):
            raise NetworkError(
                f"{who(layer)}: {field!r} does not hold a network, so '{field}/...' paths do "
                "not apply."
            )
        direct[field] = assign(inner, sub, kind)
    return layer._copy(direct, assigned=True)


def _kind_fields(layer: Layer, kind: str) -> list[str]:
    return [f for f, k in type(layer)._field_kinds.items() if k == kind]

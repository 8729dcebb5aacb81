"""Learn-rate and L2 factors of learnable parameters (MATLAB ``setLearnRateFactor`` & co.).

A factor multiplies the global learn rate or L2 regularization for one parameter; the default is
the field's declared factor (``df.learnable(learn_rate_factor=..., l2_factor=...)``), else 1.
Factors are static configuration stored on the layer, so setting one returns a new layer (or a
new network). Paths: a parameter name on a layer (``"alpha"``), ``"layer/param"`` on a network,
and ``"layer/net_field/inner_layer/param"`` through a network nested in a layer.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, overload

import jax

from .._core import LayerError, NetworkError, who
from .._layer import LEARNABLE, Layer, walk
from ._network import Network

LEARN_RATE, L2 = "learn_rate_factor", "l2_factor"


def set_learn_rate_factor(obj: Any, path: str, factor: float) -> Any:
    """Return ``obj`` (a layer or network) with the learn-rate factor of ``path`` set.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> class Scale(df.Layer):
      ...     w: jnp.ndarray = df.learnable(default=None)
      ...     def predict(self, x):
      ...         return x * self.w
      >>> layer = df.set_learn_rate_factor(Scale(w=jnp.ones(2)), "w", 0.1)
      >>> df.get_learn_rate_factor(layer, "w")
      0.1
    """
    return _set(obj, path, LEARN_RATE, factor)


def get_learn_rate_factor(obj: Any, path: str) -> float:
    """The learn-rate factor of ``path`` in a layer or network (default 1)."""
    return _get(obj, path, LEARN_RATE)


def set_l2_factor(obj: Any, path: str, factor: float) -> Any:
    """Return ``obj`` (a layer or network) with the L2 factor of ``path`` set."""
    return _set(obj, path, L2, factor)


def get_l2_factor(obj: Any, path: str) -> float:
    """The L2 regularization factor of ``path`` in a layer or network (default 1)."""
    return _get(obj, path, L2)


def _check_value(kind: str, path: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not float(value) >= 0:
        raise LayerError(f"{kind} for {path!r} must be a non-negative real number; got {value!r}.")
    return float(value)


def _split_network_path(net: Network, path: str, kind: str) -> tuple[str, str]:
    if not isinstance(path, str) or "/" not in path:
        raise NetworkError(
            f"{kind} path {path!r}: on a network, name the parameter as 'layer/parameter' "
            f"(layers: {[layer.name for layer in net.layers]})."
        )
    layer_name, _, rest = path.partition("/")
    return layer_name, rest


def _learnable_field(layer: Layer, path: str, kind: str) -> tuple[str, str]:
    field, _, rest = path.partition("/") if isinstance(path, str) else (path, "", "")
    if field not in type(layer)._learnable_fields:
        raise LayerError(
            f"{who(layer)} has no learnable parameter "
            f"{field!r} for {kind}; its learnables are {list(type(layer)._learnable_fields)}."
        )
    return field, rest


def _nested_network(layer: Layer, field: str, path: str, kind: str) -> Network:
    inner = getattr(layer, field)
    if not isinstance(inner, Network):
        raise LayerError(
            f"{kind} path {path!r}: {type(layer).__name__}.{field} is not a network, so it has no "
            "sub-parameters."
        )
    return inner


@overload
def _set(obj: Network, path: str, kind: str, value: Any) -> Network: ...
@overload
def _set(obj: Layer, path: str, kind: str, value: Any) -> Layer: ...
@overload
def _set(obj: Any, path: str, kind: str, value: Any) -> Any: ...
def _set(obj: Any, path: str, kind: str, value: Any) -> Any:
    """``obj`` (a layer or network) with the factor of ``path`` set (a named error otherwise)."""
    if isinstance(obj, Network):
        layer_name, rest = _split_network_path(obj, path, kind)
        layer = obj.layer(layer_name)
        return obj.replace_layer(layer_name, _set(layer, rest, kind, value))
    if not isinstance(obj, Layer):
        raise LayerError(f"{kind}: expected a df.Layer or df.Network; got {type(obj).__name__}.")
    field, rest = _learnable_field(obj, path, kind)
    if rest:
        inner = _nested_network(obj, field, path, kind)
        return obj.replace(**{field: _set(inner, rest, kind, value)})
    value = _check_value(kind, path, value)
    factors = tuple(f for f in obj._factors if f[:2] != (field, kind))
    # A constructor option that sets only this learnable (MATLAB's WeightLearnRateFactor) follows,
    # so that the option and the factor never disagree and a later replace keeps the factor.
    options = {
        option: value
        for option, (option_kind, fields) in getattr(type(obj), "_factor_options", {}).items()
        if (option_kind, tuple(fields)) == (kind, (field,))
    }
    return obj._copy(options, factors=tuple(sorted(factors + ((field, kind, value),))))


def _get(obj, path, kind):
    if isinstance(obj, Network):
        layer_name, rest = _split_network_path(obj, path, kind)
        return _get(obj.layer(layer_name), rest, kind)
    if not isinstance(obj, Layer):
        raise LayerError(f"{kind}: expected a df.Layer or df.Network; got {type(obj).__name__}.")
    field, rest = _learnable_field(obj, path, kind)
    if rest:
        return _get(_nested_network(obj, field, path, kind), rest, kind)
    return _field_factor(obj, field, kind)


def _field_factor(layer: Layer, field: str, kind: str) -> float:
    for name, k, value in layer._factors:
        if (name, k) == (field, kind):
            return value
    for f in dataclasses.fields(layer):
        if f.name == field:
            return float(f.metadata.get(kind, 1.0))
    return 1.0


def leaf_factors(tree, kind: str) -> list[float]:
    """The factor of every leaf of a network or layer, in leaf order (0 for non-learnables).

    Through a network held in a learnable field, the field's own factor multiplies the inner
    ones.
    """
    if not isinstance(tree, (Network, Layer)):
        return [0.0] * len(jax.tree.leaves(tree))
    factors = []
    for p in walk(tree):
        factor = 0.0
        if p.kind == LEARNABLE:
            factor = math.prod(_field_factor(q.layer, q.field, kind) for q in (*p.owners, p))
        factors += [factor] * len(p.leaves)
    return factors

"""``ParameterTable``: MATLAB's ``net.Learnables`` / ``net.State`` tables, as a pytree.

Each row is (layer, parameter, value). ``parameter`` is a field name, or a path such as
``"net/fc/weights"`` for a parameter of a network nested in a layer. The values are the pytree's
leaves and the (layer, parameter) keys are static, so a table can be differentiated, updated with
optax or ``df.adamupdate``, and put back with ``net.replace(learnables=table)``.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from .._core import NetworkError, short


class Row(NamedTuple):
    layer: str
    parameter: str
    value: Any


@jax.tree_util.register_pytree_with_keys_class
class ParameterTable(Mapping):
    """A table of parameters with columns ``layer``, ``parameter``, ``value``.

    It is a read-only mapping from ``"layer/parameter"`` to the value, and a pytree whose leaves
    are the values.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> rows = [("fc", "weights", jnp.ones((2, 3))), ("fc", "bias", jnp.zeros(3))]
      >>> table = df.ParameterTable(rows)
      >>> table["fc/bias"]
      Array([0., 0., 0.], dtype=float32)
      >>> print(table)
      layer  parameter  value
      -----  ---------  -------------
      fc     weights    float32[2, 3]
      fc     bias       float32[3]
    """

    def __init__(self, rows=()):
        keys, values = [], []
        for row in rows:
            layer, parameter, value = row
            keys.append((str(layer), str(parameter)))
            values.append(value)
        if len(set(keys)) != len(keys):
            duplicates = sorted({"/".join(k) for k in keys if keys.count(k) > 1})
            raise NetworkError(f"ParameterTable has duplicate rows {duplicates}.")
        self._keys = tuple(keys)
        self._values = tuple(values)

    # -- columns and rows ----------------------------------------------------------------------

    @property
    def layer(self) -> tuple[str, ...]:
        return tuple(k[0] for k in self._keys)

    @property
    def parameter(self) -> tuple[str, ...]:
        return tuple(k[1] for k in self._keys)

    @property
    def value(self) -> tuple[Any, ...]:
        return self._values

    def rows(self) -> Iterator[Row]:
        for (layer, parameter), value in zip(self._keys, self._values, strict=True):
            yield Row(layer, parameter, value)

    # -- Mapping interface ---------------------------------------------------------------------

    def __getitem__(self, path: str) -> Any:
        key = _split(path)
        try:
            return self._values[self._keys.index(key)]
        except ValueError:
            close = difflib.get_close_matches(path, list(self), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise PathError(
                f"{path!r} is not in this table.{hint} Its rows are {list(self)}. Fix: use a "
                "path 'layer/parameter' from that list."
            ) from None

    def __iter__(self):
        return ("/".join(k) for k in self._keys)

    def __len__(self):
        return len(self._keys)

    def __contains__(self, path):
        return isinstance(path, str) and "/" in path and _split(path) in self._keys

    def set(self, path: str, value) -> ParameterTable:
        """A new table with the value at ``"layer/parameter"`` replaced."""
        key = _split(path)
        if key not in self._keys:
            raise NetworkError(f"{path!r} is not in this table; its rows are {list(self)}.")
        values = list(self._values)
        values[self._keys.index(key)] = value
        return _from_parts(self._keys, values)

    def map(self, fn) -> ParameterTable:
        """Apply ``fn`` to every value (``None`` values are kept)."""
        return jax.tree.map(fn, self)

    @property
    def num_elements(self) -> int:
        """Total number of array elements in the table."""
        return sum(int(jnp.size(v)) for v in jax.tree.leaves(self))

    # -- pytree --------------------------------------------------------------------------------

    def tree_flatten_with_keys(self):
        children = tuple(
            (jax.tree_util.DictKey("/".join(k)), v) for k, v in zip(self._keys, self._values)
        )
        return children, self._keys

    @classmethod
    def tree_unflatten(cls, keys, values):
        return _from_parts(keys, values)

    # -- display -------------------------------------------------------------------------------

    def __repr__(self):
        return f"ParameterTable({len(self)} rows)\n{self}"

    def __str__(self):
        header = ("layer", "parameter", "value")
        body = [(lay, par, _describe(val)) for (lay, par), val in zip(self._keys, self._values)]
        widths = [max(len(r[i]) for r in [header, *body]) for i in range(3)]

        def line(row):
            return "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()

        return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, body)])


def _from_parts(keys, values) -> ParameterTable:
    table = object.__new__(ParameterTable)
    table._keys = tuple(keys)
    table._values = tuple(values)
    return table


class PathError(NetworkError, KeyError):
    """A path that is not in a parameter table (a ``KeyError`` too, as a ``Mapping``'s is)."""

    def __str__(self) -> str:  # KeyError's would quote the message
        return str(self.args[0]) if self.args else ""


def _split(path: str) -> tuple[str, str]:
    if not isinstance(path, str) or "/" not in path:
        raise PathError(
            f"{path!r} is not a parameter path: expected 'layer/parameter' (e.g. 'fc1/weights')."
        )
    layer, parameter = path.split("/", 1)
    return layer, parameter


def _describe(value) -> str:
    return "[] (not initialized)" if value is None else short(value)

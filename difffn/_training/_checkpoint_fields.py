"""The fields of a checkpoint that a crafted file could get wrong, checked before they are used;
and NaN or Inf in the data a run is given, said once ([`DataWarning`][difffn.DataWarning]).

A PRNG key is stored as its data and its implementation's *name*: the name must be one of
jax's implementations (never something looked up or imported by name) and the data of its
shape and dtype. An epoch's data order must be a permutation of the observations (a crafted one
would gather clamped indices silently).
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._core import SerializationError
from .._persistence import Optional, check_schema

_KEY = {"data": np.ndarray, "impl": Optional(str)}


class DataWarning(UserWarning):
    """The data holds NaN or Inf values (said once per run, the first time they are seen)."""


def nonfinite(tree) -> jax.Array:
    """How many NaN or Inf values the floating-point arrays of ``tree`` hold (on the device)."""
    counts = [
        jnp.sum(~jnp.isfinite(x))
        for x in jax.tree.leaves(tree)
        if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.inexact)
    ]
    return sum(counts, jnp.zeros((), jnp.int32))


def finite(value) -> bool:
    """Whether ``value`` (a number option) is finite; False for anything else."""
    try:
        return bool(np.all(np.isfinite(value)))
    except (TypeError, ValueError):
        return False


def warn_nonfinite(count: int, what: str, *, stacklevel: int = 3) -> None:
    """A [`DataWarning`][difffn.DataWarning] when ``count`` values of ``what`` are NaN or Inf."""
    if count:
        warnings.warn(
            f"trainnet: the {what} holds {count} NaN or Inf value(s): every loss and metric "
            f"computed from it is NaN or Inf (said once). Fix: remove or replace them (e.g. "
            "np.nan_to_num, or drop those observations).",
            DataWarning,
            stacklevel=stacklevel,
        )


_IMPLS = ("threefry2x32", "rbg", "unsafe_rbg", "philox2x32", "philox4x32", "threefry4x32")


@functools.cache
def _impl_shapes() -> dict[str, tuple[int, ...]]:
    """The key-data shape of each PRNG implementation this jax has (by its name)."""
    shapes = {}
    for name in _IMPLS:
        try:
            shapes[name] = tuple(jax.random.key_data(jax.random.key(0, impl=name)).shape)
        except (ValueError, TypeError, KeyError):  # not in this jax
            continue
    return shapes


def check_key_payload(data: dict[str, Any], *, source: str, where: str) -> None:
    """Check a `key_payload` read from a file: a known implementation name (a name, never
    something that is looked up or imported) and key data of its shape and dtype.

    Raises:
      SerializationError: naming the field, expected vs got.
    """
    check_schema(data, _KEY, source=source, where=where)
    impl, value = data["impl"], data["data"]
    shapes = _impl_shapes()
    if impl is None:
        want = (2,)  # a raw uint32 key: jax.random.PRNGKey's
    elif impl in shapes:
        want = shapes[impl]
    else:
        raise SerializationError(
            f"{source!r} is malformed: {where}['impl'] is {impl!r}, which is not a PRNG "
            f"implementation of jax (expected one of {sorted(shapes)}, or None for a raw "
            "uint32 key). Fix: use a checkpoint written by difffn, or another copy."
        )
    if tuple(value.shape) != want or value.dtype != np.uint32:
        raise SerializationError(
            f"{source!r} is malformed: {where}['data'] should be uint32 of shape {want} (a "
            f"{impl or 'raw'} key); it is {value.dtype.name} of shape {tuple(value.shape)}. Fix: "
            "use a checkpoint written by difffn, or another copy."
        )


def check_order(order, source: str) -> np.ndarray:
    """An epoch's data order read from a checkpoint: a permutation of the observations (a
    crafted one would otherwise gather clamped indices silently).

    Raises:
      SerializationError: not a 1-D permutation of ``0 .. n-1``.
    """
    order = np.asarray(order)
    if (
        order.ndim != 1
        or not np.issubdtype(order.dtype, np.integer)
        or not np.array_equal(np.sort(order), np.arange(order.size))
    ):
        raise SerializationError(
            f"{source!r} is malformed: its epoch order is not a permutation of the "
            f"observations (shape {order.shape}, dtype {order.dtype.name}). Fix: use another "
            "copy of the checkpoint, or start the run again."
        )
    return order.astype(np.int32)

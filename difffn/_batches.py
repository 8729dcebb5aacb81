"""Observations along the batch axis: finding it, counting, slicing and gathering mini-batches.

Training and prediction data are arrays (plain or ``df.FormattedArray``) whose batch axis is
the ``B`` label of their format; a plain array takes the format of the network input it feeds
(its input layer), and is batch-first when that is unknown. Targets follow the same rule (plain
targets are batch-first).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ._arrays import check_numbers
from ._errors import OptionsError
from ._format import FormattedArray, dlarray


def batch_axis(x, fmt: str | None = None, *, what: str = "data") -> int:
    """The batch axis of ``x``: its ``B`` label, else that of ``fmt``, else 0."""
    if isinstance(x, FormattedArray):
        if "B" not in x.format:
            raise OptionsError(
                f"{what} has format {x.format!r}, which has no batch ('B') axis to split into "
                "mini-batches. Fix: label the observation axis 'B'."
            )
        return x.format.index("B")
    if fmt and "B" in fmt and len(fmt) == np.ndim(x):
        return fmt.index("B")
    if np.ndim(x) == 0:
        raise OptionsError(f"{what} is a scalar; expected an array of observations.")
    return 0


def check_data(x, *, what: str) -> None:
    """Host-side checks of one data array: real numbers (or booleans), not strings or complex
    (``_arrays.check_numbers``, as an ``OptionsError``)."""
    check_numbers(x, what=what, error=OptionsError)


def count(x, axis: int) -> int:
    return int(np.shape(x.data if isinstance(x, FormattedArray) else x)[axis])


def as_device_array(x):
    """A jax array (formats kept); numpy data is copied to the default device."""
    if isinstance(x, FormattedArray):
        return x
    return jnp.asarray(x)


def take(x, index, axis: int):
    """Observations ``index`` of ``x`` (inside or outside jit)."""
    if isinstance(x, FormattedArray):
        return dlarray(jnp.take(x.data, index, axis=axis), x.format)
    return jnp.take(x, index, axis=axis)


def slice_host(x, start: int, stop: int, axis: int):
    """Observations ``start:stop`` (a plain slice, numpy or jax)."""
    index = [slice(None)] * (x.ndim if not isinstance(x, FormattedArray) else x.data.ndim)
    index[axis] = slice(start, stop)
    if isinstance(x, FormattedArray):
        return dlarray(x.data[tuple(index)], x.format)
    return x[tuple(index)]


def concatenate(parts, axis: int):
    if isinstance(parts[0], FormattedArray):
        return dlarray(jnp.concatenate([p.data for p in parts], axis=axis), parts[0].format)
    return jnp.concatenate(parts, axis=axis)


def pad(x, size: int, axis: int):
    """``x`` padded with zeros to ``size`` observations."""
    data = x.data if isinstance(x, FormattedArray) else jnp.asarray(x)
    widths = [(0, 0)] * data.ndim
    widths[axis] = (0, size - data.shape[axis])
    padded = jnp.pad(data, widths)
    return dlarray(padded, x.format) if isinstance(x, FormattedArray) else padded


def first_rows(y, n: int):
    """The first ``n`` observations of a network output (its ``B`` label, else axis 0): what
    is left of a padded batch once the padding is cut."""
    axis = batch_axis(y) if isinstance(y, FormattedArray) and "B" in y.format else 0
    return slice_host(y, 0, n, axis)


def pad_with_first(x, size: int, axis: int):
    """``x`` with copies of its first observation appended up to ``size`` observations."""
    data = x.data if isinstance(x, FormattedArray) else jnp.asarray(x)
    first = jnp.take(data, jnp.zeros(size - data.shape[axis], jnp.int32), axis=axis)
    padded = jnp.concatenate([data, first], axis=axis)
    return dlarray(padded, x.format) if isinstance(x, FormattedArray) else padded

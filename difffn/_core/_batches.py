"""Observations along the batch axis: finding it, counting, slicing and gathering mini-batches.

Training and prediction data are arrays (plain or ``df.FormattedArray``) whose batch axis is
the ``B`` label of their format; a plain array takes the format of the network input it feeds
(its input layer), and is batch-first when that is unknown. Targets follow the same rule (plain
targets are batch-first).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ._arrays import check_numbers, to_device
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
    """A jax array (formats kept); numpy data is copied to the default device (``to_device``:
    converted on the host, no program compiled)."""
    if isinstance(x, FormattedArray):
        return x
    return to_device(x)


def take(x, index, axis: int, *, in_bounds: bool = False):
    """Observations ``index`` of ``x`` (inside or outside jit).

    ``in_bounds``: the caller made ``index`` from the data's own size (a training step's
    shuffled order), so the gather clamps the indices (a no-op on them) instead of ``jnp.take``'s
    out-of-bounds fill, a select over the whole gathered batch (about 2 ms of the benchmark
    transformer's step).
    """
    mode = "clip" if in_bounds else None
    if isinstance(x, FormattedArray):
        return dlarray(jnp.take(x.data, index, axis=axis, mode=mode), x.format)
    return jnp.take(x, index, axis=axis, mode=mode)


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


class Keep(NamedTuple):
    """The real rows of a batch padded to split over the mesh.

    The batch is ``shares`` blocks of ``padded`` rows in a row (one block, or one per process
    when each process feeds its own share), each holding its ``rows`` real observations first
    and copies of its first observation after them. ``targets``: whether the targets were
    padded the same way (a multi-process iterable's, which cannot be joined unpadded) or hold
    only the real rows.
    """

    shares: int
    rows: int
    padded: int
    targets: bool = False


def keep_first(size: int, padded: int) -> Keep | None:
    """The `Keep` of one batch of ``size`` real rows padded to ``padded``; None when
    nothing was padded."""
    return Keep(1, size, padded) if padded > size else None


def real_rows(y, keep: Keep, axis: int | None = None):
    """The real observations of a padded batch ``y`` (along ``axis``; default: its ``B`` label,
    else axis 0): each block's first ``keep.rows``, by a reshape and a slice (inside jit, so
    the padding never reaches the loss, the metrics or the gradients).

    Examples:
      >>> import numpy as np
      >>> y = np.array([0, 1, 1, 9, 3, 4, 3, 9])  # 2 shares of 4 rows, 2 real in each
      >>> real_rows(y, Keep(shares=2, rows=2, padded=4)).tolist()
      [0, 1, 3, 4]
    """
    if axis is None:
        axis = batch_axis(y) if isinstance(y, FormattedArray) and "B" in y.format else 0
    data = y.data if isinstance(y, FormattedArray) else jnp.asarray(y)
    before, after = data.shape[:axis], data.shape[axis + 1 :]
    blocks = jnp.reshape(data, (*before, keep.shares, keep.padded, *after))
    real = jax.lax.slice_in_dim(blocks, 0, keep.rows, axis=axis + 1)
    real = jnp.reshape(real, (*before, keep.shares * keep.rows, *after))
    return dlarray(real, y.format) if isinstance(y, FormattedArray) else real


def pad_with_first(x, size: int, axis: int):
    """``x`` with copies of its first observation appended up to ``size`` observations (a host
    array is padded on the host, in NumPy: jnp would compile a program per shape)."""
    data = x.data if isinstance(x, FormattedArray) else x
    data = data if hasattr(data, "shape") else np.asarray(data)
    xp = np if isinstance(data, np.ndarray) else jnp
    first = xp.take(data, xp.zeros(size - data.shape[axis], xp.int32), axis=axis)
    padded = xp.concatenate([data, first], axis=axis)
    return dlarray(padded, x.format) if isinstance(x, FormattedArray) else padded

"""``df.ops.embed``, ``df.ops.onehot_encode`` and ``df.ops.onehot_decode``: indices and vectors.

Indices are 0-based, as everywhere in Python (MATLAB's word and class indices start at 1).
An index array's ``C`` axis, if it has one, has size 1 and becomes the vector axis; without a
``C`` axis the vector axis is appended as ``C``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.core
import jax.numpy as jnp
import numpy as np

from .._core import Data, FormatError, FormattedArray, OpError, Output
from ._format_args import label, read, shape_error


def _vector_axis(op: str, data, fmt: str) -> tuple[jax.Array, str]:
    """Drop a size-1 ``C`` axis (its position is where vectors go) and say the output format."""
    if "C" not in fmt:
        return data, fmt + "C"
    c = fmt.index("C")
    if data.shape[c] != 1:
        raise FormatError(
            f"df.ops.{op}: the indices' 'C' axis has size {data.shape[c]}; it must have size 1 "
            "(one index per position). Fix: give the indices without a 'C' axis, or with "
            "'C' of size 1."
        )
    return jnp.squeeze(data, c), fmt


def _vectors_at_c(y, fmt: str):
    """Move the trailing vector axis of ``y`` to where ``C`` was in the input format ``fmt``."""
    return jnp.moveaxis(y, -1, fmt.index("C")) if "C" in fmt else y


def embed(x: Data, weights: Data, *, fmt: str | None = None) -> Output:
    """Look up one vector per index (MATLAB's ``embed`` function).

    Args:
      x: indices in ``[0, num_words)`` (integers, or floats rounded to the nearest integer, as
        input layers deliver them), in any format: a ``C`` axis of size 1 is replaced by the
        vectors, otherwise ``C`` is appended (``"BT"`` -> ``"BTC"``). A plain array needs
        ``fmt``.
      weights: ``(num_words, dimension)`` (MATLAB's ``dimension x num_words`` transposed;
        ``nnx.Embed``'s ``embedding``).
      fmt: the format of a plain ``x``.

    Returns:
      The vectors, ``weights``' dtype, with ``C`` of size ``dimension``.

    Raises:
      FormatError: ``x`` has no format or a ``C`` axis of size other than 1.
      OpError: ``weights`` is not 2-D, or a concrete index is out of range. Under ``jit`` an
        out-of-range index gives a row of NaN (JAX's ``mode="fill"``).

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> weights = jnp.arange(6.0).reshape(3, 2)
      >>> y = df.ops.embed(df.dlarray(jnp.array([[2, 0, 1]]), "BT"), weights)
      >>> y.format, y.data.tolist()
      ('BTC', [[[4.0, 5.0], [0.0, 1.0], [2.0, 3.0]]])
    """
    data, fmt, formatted = read("embed", x, fmt)
    weights = jnp.asarray(weights)
    if weights.ndim != 2:
        raise shape_error(
            "embed", "weights", weights, "(num_words, dimension)", "give a 2-D table."
        )
    data, out_fmt = _vector_axis("embed", data, fmt)
    indices = as_indices(data)
    _check_range("embed", indices, weights.shape[0], "num_words")
    y = jnp.take(weights, indices, axis=0, mode="fill", fill_value=jnp.nan)
    return label(_vectors_at_c(y, fmt), out_fmt, formatted)


def onehot_encode(
    x: Data, num_classes: int, *, fmt: str | None = None, dtype: Any = jnp.float32
) -> Output:
    """One-hot vectors of class indices (MATLAB's ``onehotencode``), on ``jax.nn.one_hot``.

    Args:
      x: class indices in ``[0, num_classes)`` (an index outside gives a row of zeros, as
        ``jax.nn.one_hot``). Formatted: a ``C`` axis of size 1 is replaced by the classes,
        otherwise ``C`` is appended. A plain array (with no ``fmt``) gets the classes as a new
        last axis.
      num_classes: the number of classes.
      fmt: the format of a plain ``x``; the output is then plain, in that axis order.
      dtype: the output dtype (default float32).

    Returns:
      The one-hot array (formatted when ``x`` is).

    Raises:
      OpError: ``num_classes`` is not a positive int.
      FormatError: a ``C`` axis of size other than 1.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> df.ops.onehot_encode(jnp.array([2, 0]), 3)
      Array([[0., 0., 1.],
             [1., 0., 0.]], dtype=float32)
      >>> df.ops.onehot_encode(df.dlarray(jnp.array([2, 0]), "B"), 3).format
      'BC'
    """
    if (
        isinstance(num_classes, bool)
        or not isinstance(num_classes, (int, np.integer))
        or (num_classes < 1)
    ):
        raise OpError(
            f"df.ops.onehot_encode: num_classes must be a positive int; got {num_classes!r}."
        )
    if fmt is None and not isinstance(x, FormattedArray):
        return jax.nn.one_hot(as_indices(jnp.asarray(x)), int(num_classes), dtype=dtype)
    data, fmt, formatted = read("onehot_encode", x, fmt)
    data, out_fmt = _vector_axis("onehot_encode", data, fmt)
    y = jax.nn.one_hot(as_indices(data), int(num_classes), dtype=dtype)
    return label(_vectors_at_c(y, fmt), out_fmt, formatted)


def onehot_decode(x: Data, *, fmt: str | None = None) -> Output:
    """Class indices of one-hot vectors or scores (MATLAB's ``onehotdecode``): argmax over ``C``.

    Ties go to the first class. For class names, index them:
    ``np.asarray(names)[df.stripdims(indices)]``.

    Args:
      x: scores or one-hot vectors with a ``C`` axis; a plain array needs ``fmt``.
      fmt: the format of a plain ``x``.

    Returns:
      int32 indices with the format of ``x`` without ``C`` (plain if nothing is left).

    Raises:
      FormatError: no format, or no ``C`` axis.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> scores = df.dlarray(jnp.array([[0.1, 0.7, 0.2], [0.5, 0.2, 0.3]]), "BC")
      >>> labels = df.ops.onehot_decode(scores)
      >>> labels.format, labels.data.tolist()
      ('B', [1, 0])
    """
    data, fmt, formatted = read("onehot_decode", x, fmt)
    if "C" not in fmt:
        raise FormatError(
            f"df.ops.onehot_decode: the input format {fmt!r} has no 'C' axis to decode along. "
            "Fix: label the class axis 'C'."
        )
    y = jnp.argmax(data, axis=fmt.index("C")).astype(jnp.int32)
    return label(y, fmt.replace("C", ""), formatted)


def as_indices(data) -> jax.Array:
    """int32 indices: integers as they are, floats rounded to the nearest integer."""
    if jnp.issubdtype(data.dtype, jnp.integer):
        return data.astype(jnp.int32)
    return jnp.round(data).astype(jnp.int32)


def _check_range(op: str, indices, n: int, what: str) -> None:
    if isinstance(indices, jax.core.Tracer):
        return  # traced: out-of-range indices give NaN rows (jnp.take's mode="fill")
    values = np.asarray(indices)
    bad = values[(values < 0) | (values >= n)]
    if bad.size:
        raise OpError(
            f"df.ops.{op}: {bad.size} index value(s) outside [0, {n}) ({what} = {n}), e.g. "
            f"{int(bad.flat[0])}. Indices are 0-based. Fix: map unknown words to a valid index "
            "(Embedding(oov_mode='map-to-last') does), or enlarge the table."
        )

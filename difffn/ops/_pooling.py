"""Pooling: ``max_pool`` and ``avg_pool`` (MATLAB's ``maxpool``, ``avgpool``), windowed or global.

Windowed pooling is one ``jax.lax.reduce_window`` over the window axes (chosen from the format as
for convolution); global pooling reduces those axes to size 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp

from .._core import Data, OpError, Output
from ._common import floating, ints, pack, pairs, same_padding, unpack, who, window_axes


def _window(op, data, fmt, pool_size, stride, padding):
    """The window axes and ``reduce_window``'s per-axis window, strides and padding."""
    count = len(pool_size) if isinstance(pool_size, (tuple, list)) else None
    axes = window_axes(op, fmt, data.shape, count, what="pooling")
    if pool_size == "global":
        return axes, None
    k = len(axes)
    sizes = ints(op, "pool_size", pool_size, k)
    strides = ints(op, "stride", stride, k)
    pads = pairs(op, "padding", padding, k)
    if pads == "same":
        pads = tuple(
            same_padding(data.shape[a], p, s) for a, p, s in zip(axes, sizes, strides, strict=True)
        )
    assert not isinstance(pads, str)  # pairs returns "same" or the pairs
    window, step, padding = [1] * data.ndim, [1] * data.ndim, [(0, 0)] * data.ndim
    for a, p, s, pad in zip(axes, sizes, strides, pads, strict=True):
        if data.shape[a] + sum(pad) < p:
            raise OpError(
                f"{who(op)}: axis {a} of the input (size {data.shape[a]}, padded by {pad}) is "
                f"smaller than the pooling window ({p}). Fix: pad more or pool less."
            )
        window[a], step[a], padding[a] = p, s, pad
    return axes, (tuple(window), tuple(step), tuple(padding))


def max_pool(
    x: Data,
    pool_size: int | Sequence[int] | Literal["global"],
    *,
    stride: int | Sequence[int] = 1,
    padding: Any = 0,
    fmt: str | None = None,
) -> Output:
    """Max pooling over the ``S`` axes (MATLAB's ``maxpool``); padding never wins.

    Args:
      x: a ``df.FormattedArray``, or a plain array with ``fmt``. The window slides over the
        ``S`` axes (over ``T`` for sequences without ``S``), as [`conv`][difffn.ops.conv] chooses
        them.
      pool_size: an int (every window axis), one int per window axis, or ``"global"`` (the
        maximum over all of them; each becomes size 1, as MATLAB's ``maxpool(X, "global")``).
      stride: an int or one per window axis; default 1.
      padding: ``0`` (default), an int, one int per window axis (both sides), one pair
        ``(before, after)`` per window axis, or ``"same"`` (output size ``ceil(size / stride)``).
      fmt: the format of a plain ``x``.

    Returns:
      The pooled input, with the input's format.

    Raises:
      FormatError: no format, or no axis to pool over.
      OpError: a bad option, or a window larger than the padded input.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> x = df.dlarray(jnp.arange(16.0).reshape(1, 4, 4, 1), "BSSC")
      >>> df.ops.max_pool(x, 2, stride=2).data[0, :, :, 0]
      Array([[ 5.,  7.],
             [13., 15.]], dtype=float32)
      >>> df.ops.max_pool(x, "global").shape
      (1, 1, 1, 1)
    """
    op = "max_pool"
    data, fmt, formatted = unpack(op, x, fmt)
    axes, spec = _window(op, data, fmt, pool_size, stride, padding)
    if spec is None:
        return pack(jnp.max(data, axis=axes, keepdims=True), fmt, formatted)
    # A Python scalar identity lets JAX recognize the max monoid, which it can differentiate.
    if jnp.issubdtype(data.dtype, jnp.floating):
        lowest = -float("inf")
    else:
        lowest = int(jnp.iinfo(data.dtype).min)
    return pack(jax.lax.reduce_window(data, lowest, jax.lax.max, *spec), fmt, formatted)


def avg_pool(
    x: Data,
    pool_size: int | Sequence[int] | Literal["global"],
    *,
    stride: int | Sequence[int] = 1,
    padding: Any = 0,
    padding_value: float = 0,
    fmt: str | None = None,
) -> Output:
    """Average pooling over the ``S`` axes (MATLAB's ``avgpool``).

    Args:
      x: a ``df.FormattedArray``, or a plain array with ``fmt``; the window axes are chosen as
        in [`max_pool`][difffn.ops.max_pool].
      pool_size: an int, one int per window axis, or ``"global"`` (the mean over all of them;
        each becomes size 1).
      stride: an int or one per window axis; default 1.
      padding: as in [`max_pool`][difffn.ops.max_pool].
      padding_value: ``0`` (default: padded values count as zeros, every window divides by its
        full size) or ``"mean"`` (padding is left out: each window averages its input values
        only).
      fmt: the format of a plain ``x``.

    Returns:
      The pooled input, with the input's format (integer data gives float32).

    Raises:
      FormatError: no format, or no axis to pool over.
      OpError: a bad option, or a window larger than the padded input.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> x = df.dlarray(jnp.ones((1, 2, 2, 1)), "BSSC")
      >>> df.ops.avg_pool(x, 2, padding=1).data[0, :, :, 0]
      Array([[0.25, 0.5 , 0.25],
             [0.5 , 1.  , 0.5 ],
             [0.25, 0.5 , 0.25]], dtype=float32)
      >>> df.ops.avg_pool(x, 2, padding=1, padding_value="mean").data[0, 0, 0, 0]
      Array(1., dtype=float32)
    """
    op = "avg_pool"
    data, fmt, formatted = unpack(op, x, fmt)
    if not (padding_value == "mean" or (not isinstance(padding_value, str) and padding_value == 0)):
        raise OpError(f"{who(op)}: padding_value must be 0 or 'mean'; got {padding_value!r}.")
    data = floating(data)
    axes, spec = _window(op, data, fmt, pool_size, stride, padding)
    if spec is None:
        return pack(jnp.mean(data, axis=axes, keepdims=True), fmt, formatted)
    window, step, pads = spec
    total = jax.lax.reduce_window(data, 0.0, jax.lax.add, window, step, pads)
    if padding_value == "mean":
        ones = jnp.ones([data.shape[a] if a in axes else 1 for a in range(data.ndim)], data.dtype)
        count = jax.lax.reduce_window(ones, 0.0, jax.lax.add, window, step, pads)
    else:
        count = 1
        for a in axes:
            count *= window[a]
    return pack(total / count, fmt, formatted)

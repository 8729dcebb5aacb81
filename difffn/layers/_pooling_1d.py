"""1-D pooling layers over ``df.ops``: ``MaxPool1D``, ``AveragePool1D``, ``GlobalMaxPool1D`` and
``GlobalAveragePool1D`` (MATLAB's ``maxPooling1dLayer``, ``averagePooling1dLayer``,
``globalMaxPooling1dLayer`` and ``globalAveragePooling1dLayer``).

As MATLAB's, they pool over time for sequences (``"BTC"``, ``"CBT"``) and over the one ``S`` axis
for 1-D images (``"BSC"``) and 1-D image sequences (``"BSCT"``). A plain input is
``(batch, time, channels)``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .. import ops
from .._core import Data, FormatError, Output
from .._layer import Layer
from ._checks import bad_argument, data_and_format, positive_int, relabel, who

_WANT = (
    "a sequence ('BTC', 'CBT'), a 1-D image ('BSC') or a 1-D image sequence ('BSCT'): one 'C', "
    "and one 'S' or a 'T'"
)


def _format(layer, fmt: str, shape) -> str:
    """The input's format, checked: what ``Conv1D`` takes (plain data is ``"BTC"``)."""
    if not fmt:
        if len(shape) != 3:
            raise FormatError(
                f"{who(layer)} takes sequences; got a plain array of shape {tuple(shape)}. "
                "Fix: give (batch, time, channels), or label it, e.g. df.dlarray(x, 'BTC')."
            )
        return "BTC"
    if not (
        fmt.count("C") == 1
        and fmt.count("S") <= 1
        and ("S" in fmt or "T" in fmt)
        and set(fmt) <= set("SCBT")
    ):
        raise FormatError(
            f"{who(layer)} takes {_WANT}; got format {fmt!r} (shape {tuple(shape)}). Fix: for "
            "2-D images use the 2-D pooling layers; label the axes, e.g. df.dlarray(x, 'BTC')."
        )
    return fmt


def _padding(layer, value):
    """MATLAB's ``Padding``: ``"same"``, an int (both sides) or ``(left, right)``."""
    expected = "'same', a non-negative int, or a pair (left, right)"
    fix = "e.g. padding=1 (both sides), padding=(2, 1) or padding='same'."
    is_int = lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0  # noqa: E731
    if value == "same":
        return value
    if is_int(value):
        return (int(value), int(value))
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(map(is_int, value)):
        return (int(value[0]), int(value[1]))
    raise bad_argument(layer, "padding", expected, value, fix)


class _Pool1D(Layer):
    """What ``MaxPool1D`` and ``AveragePool1D`` share (never used alone)."""

    formattable = True
    pool_size: Any
    stride: Any
    padding: Any

    def _check_window(self) -> None:
        name = type(self).__name__
        self.pool_size = positive_int(
            self, "pool_size", self.pool_size, fix=f"e.g. {name}(2) for windows of 2 steps."
        )
        self.stride = positive_int(self, "stride", self.stride, fix="e.g. stride=2.")
        self.padding = _padding(self, self.padding)
        if self.padding != "same" and max(self.padding) > self.pool_size:
            # MATLAB: the pool size must be at least the padding; a window of padding alone
            # has no input value in it.
            raise bad_argument(
                self,
                "padding",
                f"at most pool_size={self.pool_size} on each side",
                self.padding,
                "pad less, or use a larger pool_size.",
            )


class MaxPool1D(_Pool1D):
    """1-D max pooling (MATLAB's ``maxPooling1dLayer``).

    The output keeps the input's format; padding never wins the maximum (it is ``-inf``).

    Args:
      pool_size: the window length (MATLAB's ``PoolSize``).
      stride: the step between windows; default 1 (MATLAB's default; pass ``stride=pool_size``
        for non-overlapping windows).
      padding: ``0`` (default), an int (both sides), ``(left, right)`` or ``"same"`` (output
        length ``ceil(length / stride)``).

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> x = df.dlarray(jnp.array([[1.0, 3, 2, 5, 4, 0]])[..., None], "BTC")
      >>> y = df.layers.MaxPool1D(2, stride=2)(x)
      >>> y.format, y.data[0, :, 0]
      ('BTC', Array([3., 5., 4.], dtype=float32))
    """

    pool_size: Any
    _: dataclasses.KW_ONLY
    stride: Any = 1
    padding: Any = 0

    def __post_init__(self) -> None:
        self._check_window()

    def predict(self, x: Data) -> Output:
        data, fmt = data_and_format(x)
        fmt = _format(self, fmt, data.shape)
        y = ops.max_pool(data, self.pool_size, stride=self.stride, padding=self.padding, fmt=fmt)
        return relabel(x, y, fmt)


class AveragePool1D(_Pool1D):
    """1-D average pooling (MATLAB's ``averagePooling1dLayer``).

    The output keeps the input's format.

    Args:
      pool_size: the window length (MATLAB's ``PoolSize``).
      stride: the step between windows; default 1 (MATLAB's default).
      padding: as ``MaxPool1D``'s; default 0.
      padding_value: ``0`` (default: padding averages as zeros, every window divides by
        ``pool_size``) or ``"mean"`` (padding is left out of each window's average).

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> x = df.dlarray(jnp.array([[1.0, 3, 2, 6]])[..., None], "BTC")
      >>> df.layers.AveragePool1D(2, stride=2)(x).data[0, :, 0]
      Array([2., 4.], dtype=float32)
      >>> df.layers.AveragePool1D(2, stride=2, padding=1, padding_value="mean")(x).data[0, :, 0]
      Array([1. , 2.5, 6. ], dtype=float32)
    """

    pool_size: Any
    _: dataclasses.KW_ONLY
    stride: Any = 1
    padding: Any = 0
    padding_value: Any = 0

    def __post_init__(self) -> None:
        self._check_window()
        value = self.padding_value
        if not (value == "mean" or (not isinstance(value, (str, bool)) and value == 0)):
            raise bad_argument(
                self,
                "padding_value",
                "0 or 'mean'",
                value,
                "use 0 (padding averages as zeros) or 'mean' (padding left out).",
            )

    def predict(self, x: Data) -> Output:
        data, fmt = data_and_format(x)
        fmt = _format(self, fmt, data.shape)
        y = ops.avg_pool(
            data,
            self.pool_size,
            stride=self.stride,
            padding=self.padding,
            padding_value=self.padding_value,
            fmt=fmt,
        )
        return relabel(x, y, fmt)


def _global(layer, x, pool):
    """Pool over the whole window axis; a pooled time axis is dropped (``"BTC"`` -> ``"BC"``)."""
    data, fmt = data_and_format(x)
    fmt = _format(layer, fmt, data.shape)
    y = pool(data, "global", fmt=fmt)
    if "S" not in fmt:  # sequences: one value per sequence, as MATLAB's "CBT" -> "CB"
        axis = fmt.index("T")
        y, fmt = y.squeeze(axis), fmt.replace("T", "")
    return relabel(x, y, fmt)


class GlobalAveragePool1D(Layer):
    """The mean over time or over the ``S`` axis (MATLAB's ``globalAveragePooling1dLayer``).

    Sequences (``"BTC"``) become one vector per sequence (``"BC"``), as in MATLAB, ready for
    ``FullyConnected``; 1-D images (``"BSC"``) and 1-D image sequences (``"BSCT"``) keep their
    format with the ``S`` axis of size 1.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> y = df.layers.GlobalAveragePool1D()(df.dlarray(jnp.ones((2, 7, 3)), "BTC"))
      >>> y.format, y.shape
      ('BC', (2, 3))
      >>> df.layers.GlobalAveragePool1D()(df.dlarray(jnp.ones((2, 7, 3)), "BSC")).shape
      (2, 1, 3)
    """

    formattable = True

    def predict(self, x: Data) -> Output:
        return _global(self, x, ops.avg_pool)


class GlobalMaxPool1D(Layer):
    """The maximum over time or over the ``S`` axis (MATLAB's ``globalMaxPooling1dLayer``).

    Formats as ``GlobalAveragePool1D``: ``"BTC"`` becomes ``"BC"``; ``"BSC"`` keeps its format.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> x = df.dlarray(jnp.array([[1.0, 3, 2]])[..., None], "BTC")
      >>> df.layers.GlobalMaxPool1D()(x).data
      Array([[3.]], dtype=float32)
    """

    formattable = True

    def predict(self, x: Data) -> Output:
        return _global(self, x, ops.max_pool)

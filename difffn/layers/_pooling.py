"""Pooling layers over ``df.ops``: ``MaxPool2D``, ``AveragePool2D``, ``GlobalMaxPool2D`` and
``GlobalAveragePool2D``."""

from __future__ import annotations

import dataclasses
from typing import Any

from .. import ops
from .._core import Data, Output
from .._layer import Layer
from ._checks import bad_argument, data_and_format, int_pair, padding_2d, relabel, spatial_2d_format


class MaxPool2D(Layer):
    """2-D max pooling (MATLAB's ``maxPooling2dLayer``).

    Input and output: 2-D images with one ``B``, two ``S`` and one ``C`` axis in any order
    (``"BSSC"`` is NHWC); the output keeps the format. A plain input is taken to be NHWC.
    Padding never wins the maximum (it is ``-inf``).

    Args:
      pool_size: ``p`` or ``(ph, pw)``.
      stride: an int or ``(sh, sw)``; default 1, as MATLAB's ``Stride`` (MATLAB's examples often
        pass ``stride=pool_size`` for non-overlapping pooling).
      padding: ``0`` (default), an int, ``(top_bottom, left_right)``,
        ``(top, bottom, left, right)``, ``((top, bottom), (left, right))`` or ``"same"``
        (output size ``ceil(input / stride)``).

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> x = df.dlarray(jnp.arange(16.0).reshape(1, 4, 4, 1), "BSSC")
      >>> y = df.layers.MaxPool2D(2, stride=2)(x)
      >>> y.format, y.data[0, :, :, 0]
      ('BSSC', Array([[ 5.,  7.],
             [13., 15.]], dtype=float32))
    """

    formattable = True

    pool_size: Any
    _: dataclasses.KW_ONLY
    stride: Any = 1
    padding: Any = 0

    def __post_init__(self) -> None:
        self.pool_size = int_pair(self, "pool_size", self.pool_size, fix="e.g. pool_size=2.")
        self.stride = int_pair(self, "stride", self.stride, fix="e.g. stride=2.")
        self.padding = padding_2d(self, self.padding)

    def predict(self, x: Data) -> Output:
        data, fmt = data_and_format(x)
        fmt = spatial_2d_format(self, fmt, data.shape)
        y = ops.max_pool(data, self.pool_size, stride=self.stride, padding=self.padding, fmt=fmt)
        return relabel(x, y, fmt)


class AveragePool2D(Layer):
    """2-D average pooling (MATLAB's ``averagePooling2dLayer``).

    Input and output as ``MaxPool2D``.

    Args:
      pool_size: ``p`` or ``(ph, pw)``.
      stride: an int or ``(sh, sw)``; default 1 (MATLAB's default).
      padding: as ``MaxPool2D``'s; default 0.
      padding_value: ``0`` (default: padding counts as zeros, each window divides by its full
        size) or ``"mean"`` (padding is left out of each window's average).

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> x = df.dlarray(jnp.arange(16.0).reshape(1, 4, 4, 1), "BSSC")
      >>> df.layers.AveragePool2D(2, stride=2)(x).data[0, :, :, 0]
      Array([[ 2.5,  4.5],
             [10.5, 12.5]], dtype=float32)
    """

    formattable = True

    pool_size: Any
    _: dataclasses.KW_ONLY
    stride: Any = 1
    padding: Any = 0
    padding_value: Any = 0

    def __post_init__(self) -> None:
        self.pool_size = int_pair(self, "pool_size", self.pool_size, fix="e.g. pool_size=2.")
        self.stride = int_pair(self, "stride", self.stride, fix="e.g. stride=2.")
        self.padding = padding_2d(self, self.padding)
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
        fmt = spatial_2d_format(self, fmt, data.shape)
        y = ops.avg_pool(
            data,
            self.pool_size,
            stride=self.stride,
            padding=self.padding,
            padding_value=self.padding_value,
            fmt=fmt,
        )
        return relabel(x, y, fmt)


class GlobalAveragePool2D(Layer):
    """Mean over the two spatial axes (MATLAB's ``globalAveragePooling2dLayer``).

    ``"BSSC"`` (any order of one ``B``, two ``S``, one ``C``) of shape ``(n, h, w, c)`` becomes
    the same format with shape ``(n, 1, 1, c)``: as in MATLAB, the 1-by-1 spatial axes stay
    (follow with ``Flatten`` or ``FullyConnected`` for ``"BC"``). A plain input is taken to be NHWC.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> y = df.layers.GlobalAveragePool2D()(df.dlarray(jnp.ones((2, 4, 4, 3)), "BSSC"))
      >>> y.format, y.shape
      ('BSSC', (2, 1, 1, 3))
    """

    formattable = True

    def predict(self, x: Data) -> Output:
        data, fmt = data_and_format(x)
        fmt = spatial_2d_format(self, fmt, data.shape)
        return relabel(x, ops.avg_pool(data, "global", fmt=fmt), fmt)


class GlobalMaxPool2D(Layer):
    """Maximum over the two spatial axes (MATLAB's ``globalMaxPooling2dLayer``).

    As ``GlobalAveragePool2D``: ``(n, h, w, c)`` becomes ``(n, 1, 1, c)`` in the same format.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> x = df.dlarray(jnp.arange(8.0).reshape(1, 2, 2, 2), "BSSC")
      >>> df.layers.GlobalMaxPool2D()(x).data
      Array([[[[6., 7.]]]], dtype=float32)
    """

    formattable = True

    def predict(self, x: Data) -> Output:
        data, fmt = data_and_format(x)
        fmt = spatial_2d_format(self, fmt, data.shape)
        return relabel(x, ops.max_pool(data, "global", fmt=fmt), fmt)

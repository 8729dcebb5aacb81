"""Pooling layers: ``MaxPool2D`` and ``GlobalAveragePool2D``."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from .._layer import Layer
from ._checks import (
    data_and_format,
    int_pair,
    padding_2d,
    relabel,
    same_padding,
    spatial_2d_format,
)


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

    def __post_init__(self):
        self.pool_size = int_pair(self, "pool_size", self.pool_size, fix="e.g. pool_size=2.")
        self.stride = int_pair(self, "stride", self.stride, fix="e.g. stride=2.")
        self.padding = padding_2d(self, self.padding)

    def predict(self, x):
        data, fmt = data_and_format(x)
        fmt = spatial_2d_format(self, fmt, data.shape)
        spatial = [i for i, label in enumerate(fmt) if label == "S"]
        if self.padding == "same":
            pads = [
                same_padding(data.shape[a], p, s)
                for a, p, s in zip(spatial, self.pool_size, self.stride, strict=True)
            ]
        else:
            pads = list(self.padding)
        window, strides, padding = [1] * data.ndim, [1] * data.ndim, [(0, 0)] * data.ndim
        for a, p, s, pad in zip(spatial, self.pool_size, self.stride, pads, strict=True):
            window[a], strides[a], padding[a] = p, s, pad
        # A Python scalar identity lets JAX recognize the max monoid, which it can differentiate.
        if jnp.issubdtype(data.dtype, jnp.floating):
            lowest = -float("inf")
        else:
            lowest = int(jnp.iinfo(data.dtype).min)
        y = jax.lax.reduce_window(data, lowest, jax.lax.max, window, strides, padding)
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

    def predict(self, x):
        data, fmt = data_and_format(x)
        fmt = spatial_2d_format(self, fmt, data.shape)
        spatial = tuple(i for i, label in enumerate(fmt) if label == "S")
        if not jnp.issubdtype(data.dtype, jnp.floating):
            data = data.astype(jnp.float32)
        return relabel(x, jnp.mean(data, axis=spatial, keepdims=True), fmt)

"""``TransposedConv2D``: MATLAB's ``transposedConv2dLayer``, over ``df.ops.conv_transpose``."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Self

import jax

from .. import ops
from .._core import Data, LayerError, Layout, Output
from .._layer import learnable
from ._checks import (
    data_and_format,
    int_pair,
    known_size,
    layout_format,
    padding_2d,
    positive_int,
    relabel,
    require,
    spatial_2d_format,
    who,
)
from ._weights_and_bias import WeightsAndBias


class TransposedConv2D(WeightsAndBias):
    r"""Transposed 2-D convolution, for upsampling (MATLAB's ``transposedConv2dLayer``).

    The adjoint of ``Conv2D``: each input pixel spreads the filters over the output, ``stride``
    apart. Output size per spatial axis: ``(size - 1) * stride + filter - cropping``
    (``size * stride`` with ``cropping="same"``). Input and output: 2-D images with one ``B``,
    two ``S`` and one ``C`` axis in any order (``"BSSC"`` is NHWC); a plain input is NHWC.

    Learnables: ``weights`` of shape ``(fh, fw, num_filters, in_channels)`` (MATLAB's order:
    ``FilterSize x NumFilters x NumChannels``), ``bias`` of shape ``(num_filters,)``.

    Args:
      filter_size: ``fh`` or ``(fh, fw)``.
      num_filters: the number of output channels.
      stride: an int or ``(sh, sw)`` (the upsampling factor); default 1.
      cropping: ``0`` (default), an int, ``(top_bottom, left_right)``,
        ``(top, bottom, left, right)``, ``((top, bottom), (left, right))``, or ``"same"``
        (output size ``input * stride``; an odd total crops the extra row/column at the
        top/left, as MATLAB does).
      weights, bias: the learnables; ``None`` until ``initialize``.
      weights_initializer: ``"glorot"`` (default), ``"he"``, ``"narrow-normal"``, ``"zeros"``,
        ``"ones"``, ``fn(key, shape, dtype)`` or ``fn(sz)``. Fans: ``fh * fw * in_channels`` in and
        ``fh * fw * num_filters`` out.
      bias_initializer: ``"zeros"`` (default), ``"ones"``, ``"narrow-normal"`` or a function.
      weight_learn_rate_factor, weight_l2_factor, bias_learn_rate_factor, bias_l2_factor:
        multiply the global learn rate and L2 regularization (defaults 1, 1, 1 and 0).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> import difffn as df
      >>> layer = df.layers.TransposedConv2D(4, 8, stride=2, cropping="same")
      >>> layer = layer.initialize(df.Layout((None, 5, 5, 3), "BSSC"), key=jax.random.key(0))
      >>> layer.weights.shape
      (4, 4, 8, 3)
      >>> layer(df.dlarray(jnp.ones((2, 5, 5, 3)), "BSSC")).shape
      (2, 10, 10, 8)
    """

    _outputs: ClassVar[str] = "num_filters"

    filter_size: Any
    num_filters: int
    _: dataclasses.KW_ONLY
    stride: Any = 1
    cropping: Any = 0
    weights: jax.Array = learnable(default=None)
    bias: jax.Array = learnable(default=None, l2_factor=0.0)  # MATLAB: BiasL2Factor 0
    weights_initializer: Any = "glorot"
    bias_initializer: Any = "zeros"
    weight_learn_rate_factor: float = 1.0
    weight_l2_factor: float = 1.0
    bias_learn_rate_factor: float = 1.0
    bias_l2_factor: float = 0.0

    def __post_init__(self) -> None:
        self.filter_size = int_pair(
            self, "filter_size", self.filter_size, fix="e.g. filter_size=4 or (4, 2)."
        )
        self.num_filters = positive_int(
            self, "num_filters", self.num_filters, fix="e.g. TransposedConv2D(4, 16)."
        )
        self.stride = int_pair(self, "stride", self.stride, fix="e.g. stride=2 (upsample 2x).")
        self.cropping = padding_2d(self, self.cropping, argument="cropping")
        fh, fw = self.filter_size
        self._check_weights_and_bias(
            (fh, fw, self.num_filters, None),
            "filter height, filter width, num_filters, input channels",
        )

    def _check_channels(self, channels: int, where: str) -> None:
        if self.weights is not None and self.weights.shape[-1] != channels:
            raise LayerError(
                f"{who(self)}: {where} has {channels} channels, but weights of shape "
                f"{tuple(self.weights.shape)} expect {self.weights.shape[-1]} (the last axis). "
                "Fix: give weights of shape (fh, fw, num_filters, in_channels), or leave "
                "weights=None."
            )

    def initialize(self, layout: Layout, *, key: jax.Array) -> Self:
        layout = layout_format(
            self, layout, lambda f: sorted(f) == sorted("BSSC"), want="e.g. 'BSSC' (NHWC images)"
        )
        channels = known_size(self, layout, "C", "number of channels")
        self._check_channels(channels, f"the input layout {layout!r}")
        fh, fw = self.filter_size
        return self._draw_weights_and_bias(
            key,
            (fh, fw, self.num_filters, channels),
            fan_in=fh * fw * channels,
            fan_out=fh * fw * self.num_filters,
        )

    def predict(self, x: Data) -> Output:
        require(self, "weights", "bias")
        data, fmt = data_and_format(x)
        fmt = spatial_2d_format(self, fmt, data.shape)
        self._check_channels(data.shape[fmt.index("C")], "the input")
        y = ops.conv_transpose(
            data, self.weights, self.bias, stride=self.stride, cropping=self.cropping, fmt=fmt
        )
        return relabel(x, y, fmt)

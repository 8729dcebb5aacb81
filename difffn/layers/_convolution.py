"""``Conv2D``: MATLAB's ``convolution2dLayer`` and ``groupedConvolution2dLayer``."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from .._errors import LayerError
from .._fields import learnable
from .._layer import Layer
from . import _initializers as init
from ._checks import (
    array_or_none,
    bad_argument,
    data_and_format,
    int_pair,
    known_size,
    layout_format,
    padding_2d,
    per_channel,
    positive_int,
    relabel,
    require,
    same_padding,
    spatial_2d_format,
    who,
)


def _is_image_format(fmt: str) -> bool:
    return sorted(fmt) == sorted("BSSC")


def _dimension_numbers(fmt: str) -> str:
    """The ``lax.conv_general_dilated`` spec of a format: ``"BSSC"`` -> ``"NHWC"``."""
    spatial = iter("HW")
    return "".join("N" if c == "B" else "C" if c == "C" else next(spatial) for c in fmt)


class Conv2D(Layer):
    r"""2-D convolution (MATLAB's ``convolution2dLayer``; grouped with ``groups``).

    Input and output: 2-D images with one ``B``, two ``S`` and one ``C`` axis in any order
    (``"BSSC"``, i.e. NHWC, or ``"SSCB"``); the output keeps the input's format with
    ``num_filters`` channels. A plain input is taken to be NHWC.

    Learnables: ``weights`` of shape ``(fh, fw, in_channels // groups, num_filters)`` (HWIO; MATLAB
    stores ``fh x fw x channels x filters``, the same order), ``bias`` of shape
    ``(num_filters,)``.

    Args:
      filter_size: ``fh`` or ``(fh, fw)``.
      num_filters: the number of output channels (all groups together).
      stride: an int or ``(sh, sw)``; default 1.
      padding: ``0`` (MATLAB's default), an int, ``(top_bottom, left_right)``,
        ``(top, bottom, left, right)``, ``((top, bottom), (left, right))``, or ``"same"``
        (output size ``ceil(input / stride)``; an odd total padding puts the extra row/column at
        the bottom/right, as MATLAB does).
      dilation: an int or ``(dh, dw)``; default 1.
      groups: the number of channel groups (``groupedConvolution2dLayer``'s ``numGroups``; each
        group gets ``num_filters // groups`` filters) or ``"channel-wise"`` (one group per input
        channel: depth-wise convolution). Default 1.
      weights, bias: the learnables; ``None`` until ``initialize``.
      weights_initializer: ``"glorot"`` (default), ``"he"``, ``"narrow-normal"``, ``"zeros"``,
        ``"ones"``, or ``fn(key, shape, dtype)``. Fans: ``fh*fw*in_channels/groups`` in and
        ``fh*fw*num_filters/groups`` out.
      bias_initializer: ``"zeros"`` (default), ``"ones"``, ``"narrow-normal"`` or a function.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> import difffn as df
      >>> layer = df.layers.Conv2D(3, 8, padding="same", name="conv")
      >>> layer = layer.initialize(df.Layout((None, 5, 5, 2), "BSSC"), key=jax.random.key(0))
      >>> layer.weights.shape, layer.bias.shape
      ((3, 3, 2, 8), (8,))
      >>> y = layer(df.dlarray(jnp.ones((4, 5, 5, 2)), "BSSC"))
      >>> y.format, y.shape
      ('BSSC', (4, 5, 5, 8))
    """

    formattable = True

    filter_size: Any
    num_filters: int
    _: dataclasses.KW_ONLY
    stride: Any = 1
    padding: Any = 0
    dilation: Any = 1
    groups: Any = 1
    weights: jax.Array | None = learnable(default=None)
    bias: jax.Array | None = learnable(default=None, l2_factor=0.0)  # MATLAB: BiasL2Factor 0
    weights_initializer: Any = "glorot"
    bias_initializer: Any = "zeros"

    def __post_init__(self):
        self.filter_size = int_pair(
            self, "filter_size", self.filter_size, fix="e.g. filter_size=3 or (3, 5)."
        )
        self.num_filters = positive_int(
            self, "num_filters", self.num_filters, fix="e.g. Conv2D(3, 16) for 16 filters."
        )
        self.stride = int_pair(self, "stride", self.stride, fix="e.g. stride=1 or (2, 2).")
        self.dilation = int_pair(self, "dilation", self.dilation, fix="e.g. dilation=1.")
        self.padding = padding_2d(self, self.padding)
        if self.groups != "channel-wise":
            self.groups = positive_int(
                self, "groups", self.groups, fix="e.g. groups=2, or groups='channel-wise'."
            )
            if self.num_filters % self.groups:
                raise bad_argument(
                    self,
                    "num_filters",
                    f"a multiple of groups={self.groups} (each group gets the same number of "
                    "filters)",
                    self.num_filters,
                    f"use num_filters = groups * filters_per_group, e.g. {self.groups * 4}.",
                )
        self.weights_initializer = init.check(
            self, "weights_initializer", self.weights_initializer, init.WEIGHTS
        )
        self.bias_initializer = init.check(
            self, "bias_initializer", self.bias_initializer, init.BIAS
        )
        fh, fw = self.filter_size
        self.weights = array_or_none(
            self,
            "weights",
            self.weights,
            (fh, fw, None, self.num_filters),
            "filter height, filter width, input channels per group, num_filters",
        )
        self.bias = array_or_none(self, "bias", self.bias, (self.num_filters,), "num_filters")

    def _groups(self, in_channels: int) -> int:
        groups = in_channels if self.groups == "channel-wise" else self.groups
        if in_channels % groups:
            raise LayerError(
                f"{who(self)}: the input has {in_channels} channels, which cannot be split "
                f"into groups={groups} equal groups. Fix: use a number of groups that divides "
                "the channel count."
            )
        if self.groups == "channel-wise" and self.num_filters % groups:
            raise LayerError(
                f"{who(self)}: groups='channel-wise' makes {groups} groups (one per input "
                f"channel), but num_filters={self.num_filters} is not a multiple of {groups}. "
                "Fix: use a multiple of the channel count."
            )
        return groups

    def _check_channels(self, in_channels: int, where: str) -> int:
        groups = self._groups(in_channels)
        if self.weights is not None and self.weights.shape[2] * groups != in_channels:
            raise LayerError(
                f"{who(self)}: {where} has {in_channels} channels, but weights of shape "
                f"{tuple(self.weights.shape)} with groups={groups} expect "
                f"{self.weights.shape[2] * groups} (weights.shape[2] * groups). Fix: give "
                "weights whose third axis is in_channels // groups, or leave weights=None."
            )
        return groups

    def initialize(self, layout, *, key):
        layout = layout_format(self, layout, _is_image_format, want="e.g. 'BSSC' (NHWC images)")
        in_channels = known_size(self, layout, "C", "number of channels")
        groups = self._check_channels(in_channels, f"the input layout {layout!r}")
        fh, fw = self.filter_size
        k_weights, k_bias = jax.random.split(key)
        changes = {}
        if self.weights is None:
            per_group = in_channels // groups
            changes["weights"] = init.draw(
                self,
                "weights_initializer",
                self.weights_initializer,
                k_weights,
                (fh, fw, per_group, self.num_filters),
                fan_in=fh * fw * per_group,
                fan_out=fh * fw * self.num_filters // groups,
            )
        if self.bias is None:
            changes["bias"] = init.draw(
                self,
                "bias_initializer",
                self.bias_initializer,
                k_bias,
                (self.num_filters,),
                fan_in=fh * fw * in_channels // groups,
                fan_out=fh * fw * self.num_filters // groups,
            )
        return self.replace(**changes) if changes else self

    def predict(self, x):
        require(self, "weights", "bias")
        data, fmt = data_and_format(x)
        fmt = spatial_2d_format(self, fmt, data.shape)
        c_axis = fmt.index("C")
        groups = self._check_channels(data.shape[c_axis], "the input")
        spatial = [i for i, label in enumerate(fmt) if label == "S"]
        if self.padding == "same":
            padding = [
                same_padding(data.shape[a], f, s, d)
                for a, f, s, d in zip(
                    spatial, self.filter_size, self.stride, self.dilation, strict=True
                )
            ]
        else:
            padding = list(self.padding)
        dtype = jnp.result_type(data, self.weights, self.bias)
        spec = _dimension_numbers(fmt)
        y = jax.lax.conv_general_dilated(
            data.astype(dtype),
            self.weights.astype(dtype),
            window_strides=self.stride,
            padding=padding,
            rhs_dilation=self.dilation,
            dimension_numbers=(spec, "HWIO", spec),
            feature_group_count=groups,
        )
        y = y + per_channel(self.bias.astype(dtype), y.ndim, c_axis)
        return relabel(x, y, fmt)

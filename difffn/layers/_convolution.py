"""Convolution layers over ``df.ops.conv``: ``Conv1D``, ``Conv2D`` and ``Conv3D``.

MATLAB's ``convolution1dLayer``, ``convolution2dLayer`` (with ``groupedConvolution2dLayer``) and
``convolution3dLayer``. The three share their options, initializers and checks; they differ in
the window's dimensions and in the formats they take.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Self

import jax

from .. import ops
from .._core import Data, FormatError, LayerError, Layout, Output
from .._layer import learnable
from ._checks import (
    bad_argument,
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

_PAD_WORDS = ("symmetric-include-edge", "symmetric-exclude-edge", "replicate")
_OPTIONS_DOC = """
      weights, bias: the learnables; ``None`` until ``initialize``.
      weights_initializer: ``"glorot"`` (default), ``"he"``, ``"narrow-normal"``, ``"zeros"``,
        ``"ones"``, or a function: ``fn(key, shape, dtype)`` (JAX's form) or ``fn(sz)``
        (MATLAB's ``@(sz)``), with the weights' shape. Fans: ``prod(filter_size) * in_channels``
        in and ``prod(filter_size) * num_filters`` out (per group).
      bias_initializer: ``"zeros"`` (default), ``"ones"``, ``"narrow-normal"`` or a function.
      weight_learn_rate_factor, weight_l2_factor, bias_learn_rate_factor, bias_l2_factor:
        multiply the global learn rate and L2 regularization for ``weights`` and ``bias``
        (defaults 1, 1, 1 and 0, as MATLAB's); ``df.set_learn_rate_factor`` sets them too."""


def _ints(layer, name: str, value, k: int, *, fix: str) -> tuple[int, ...]:
    """An int or ``k`` positive ints."""
    items = (value,) * k if isinstance(value, int) and not isinstance(value, bool) else value
    if (
        not isinstance(items, (tuple, list))
        or len(items) != k
        or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in items)
    ):
        raise bad_argument(layer, name, f"a positive int or {k} positive ints", value, fix)
    return tuple(int(v) for v in items)


def _padding_value(layer, value) -> float | str:
    if isinstance(value, str):
        if value not in _PAD_WORDS:
            raise bad_argument(
                layer,
                "padding_value",
                "a number, 'symmetric-include-edge', 'symmetric-exclude-edge' or 'replicate'",
                value,
                "e.g. padding_value=0 (MATLAB's default) or 'replicate'.",
            )
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    raise bad_argument(
        layer, "padding_value", "a finite number or a padding mode", value, "e.g. padding_value=0."
    )


class _Convolution(WeightsAndBias):
    """What ``Conv1D``, ``Conv2D`` and ``Conv3D`` share (never used alone)."""

    _outputs: ClassVar[str] = "num_filters"
    _dims: ClassVar[int]
    _plain_format: ClassVar[str]
    _want: ClassVar[str]

    def _check_convolution_options(self) -> None:
        # Fields that each subclass declares (in its own order), typed here for these methods.
        self.filter_size: tuple[int, ...]
        self.stride: Any
        self.dilation: Any
        self.padding: Any
        self.num_filters: int = positive_int(
            self,
            "num_filters",
            self.num_filters,
            fix=f"e.g. {type(self).__name__}(3, 16) for 16 filters.",
        )
        self.padding_value: float | str = _padding_value(self, self.padding_value)
        self._check_weights_and_bias(
            (*self.filter_size, None, self.num_filters),
            "filter size, input channels per group, num_filters",
        )

    def _groups(self, in_channels: int) -> int:
        return 1

    def _check_channels(self, in_channels: int, where: str) -> int:
        groups = self._groups(in_channels)
        if self.weights is not None and self.weights.shape[-2] * groups != in_channels:
            raise LayerError(
                f"{who(self)}: {where} has {in_channels} channels, but weights of shape "
                f"{tuple(self.weights.shape)} with groups={groups} expect "
                f"{self.weights.shape[-2] * groups} (weights.shape[-2] * groups). Fix: give "
                "weights whose second-to-last axis is in_channels // groups, or leave "
                "weights=None."
            )
        return groups

    def _layout_allowed(self, fmt: str) -> bool:
        raise NotImplementedError

    def _format(self, fmt: str, shape) -> str:
        raise NotImplementedError

    def initialize(self, layout: Layout, *, key: jax.Array) -> Self:
        layout = layout_format(self, layout, self._layout_allowed, want=self._want)
        in_channels = known_size(self, layout, "C", "number of channels")
        groups = self._check_channels(in_channels, f"the input layout {layout!r}")
        window = math.prod(self.filter_size)
        per_group = in_channels // groups
        return self._draw_weights_and_bias(
            key,
            (*self.filter_size, per_group, self.num_filters),
            fan_in=window * per_group,
            fan_out=window * self.num_filters // groups,
        )

    def predict(self, x: Data) -> Output:
        require(self, "weights", "bias")
        data, fmt = data_and_format(x)
        fmt = self._format(fmt, data.shape)
        self._check_channels(data.shape[fmt.index("C")], "the input")
        y = ops.conv(
            data,
            self.weights,
            self.bias,
            stride=self.stride,
            dilation_factor=self.dilation,
            padding=self.padding,
            padding_value=self.padding_value,
            fmt=fmt,
        )
        return relabel(x, y, fmt)


class _UngroupedConvolution(_Convolution):
    """The fields of ``Conv1D`` and ``Conv3D`` (never used alone).

    ``Conv2D`` declares its own: it adds ``groups``, and its field order (its signature and
    ``repr``) puts ``padding_value`` after the initializers.
    """

    filter_size: Any
    num_filters: int
    _: dataclasses.KW_ONLY
    stride: Any = 1
    padding: Any = 0
    dilation: Any = 1
    padding_value: Any = 0
    weights: jax.Array = learnable(default=None)
    bias: jax.Array = learnable(default=None, l2_factor=0.0)  # MATLAB: BiasL2Factor 0
    weights_initializer: Any = "glorot"
    bias_initializer: Any = "zeros"
    weight_learn_rate_factor: float = 1.0
    weight_l2_factor: float = 1.0
    bias_learn_rate_factor: float = 1.0
    bias_l2_factor: float = 0.0


def _is_sequence_1d(fmt: str) -> bool:
    """One ``C``; one ``S`` or a ``T``; optionally ``B`` (and ``T`` with the ``S``)."""
    return (
        fmt.count("C") == 1
        and fmt.count("S") <= 1
        and ("S" in fmt or "T" in fmt)
        and set(fmt) <= set("SCBT")
    )


class Conv1D(_UngroupedConvolution):
    r"""1-D convolution (MATLAB's ``convolution1dLayer``).

    The window slides over time for sequences (``"BTC"``, ``"CBT"``: a temporal convolution)
    and over the one ``S`` axis for 1-D images (``"BSC"``) and 1-D image sequences (``"BSCT"``).
    The output keeps the input's format with ``num_filters`` channels. A plain input is
    ``(batch, time, channels)``.

    Learnables: ``weights`` of shape ``(filter_size, in_channels, num_filters)`` (MATLAB's
    order), ``bias`` of shape ``(num_filters,)``.

    Args:
      filter_size: the window length.
      num_filters: the number of output channels.
      stride: default 1.
      dilation: default 1 (MATLAB's ``DilationFactor``).
      padding: ``0`` (MATLAB's default), an int (both sides), ``(left, right)``, ``"same"``
        (output length ``ceil(length / stride)``) or ``"causal"`` (``(filter_size - 1) *
        dilation`` on the left only: each output sees only the past, for forecasting).
      padding_value: ``0`` (default) or another number, ``"symmetric-include-edge"``,
        ``"symmetric-exclude-edge"`` or ``"replicate"``.
    """

    __doc__ = (
        (__doc__ or "").rstrip()
        + _OPTIONS_DOC
        + """

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> import difffn as df
      >>> layer = df.layers.Conv1D(3, 8, padding="causal", dilation=2)
      >>> layer = layer.initialize(df.Layout((None, None, 2), "BTC"), key=jax.random.key(0))
      >>> layer.weights.shape
      (3, 2, 8)
      >>> y = layer(df.dlarray(jnp.ones((4, 10, 2)), "BTC"))
      >>> y.format, y.shape
      ('BTC', (4, 10, 8))
    """
    )

    _dims: ClassVar[int] = 1
    _want: ClassVar[str] = (
        "a sequence ('BTC', 'CBT'), a 1-D image ('BSC') or a 1-D image sequence ('BSCT'): one "
        "'C', and one 'S' or a 'T' (for 2-D images use Conv2D)"
    )

    def __post_init__(self) -> None:
        # The user's values, normalized in place (the fields are declared by the base class).
        self.filter_size: Any
        self.stride: Any
        self.dilation: Any
        self.padding: Any
        (self.filter_size,) = _ints(
            self, "filter_size", self.filter_size, 1, fix="e.g. Conv1D(3, 16)."
        )
        (self.stride,) = _ints(self, "stride", self.stride, 1, fix="e.g. stride=1.")
        (self.dilation,) = _ints(self, "dilation", self.dilation, 1, fix="e.g. dilation=2.")
        self.padding = _padding_1d(self, self.padding)
        self.filter_size = (self.filter_size,)
        self._check_convolution_options()

    def _layout_allowed(self, fmt: str) -> bool:
        return _is_sequence_1d(fmt)

    def _format(self, fmt: str, shape) -> str:
        if not fmt:
            if len(shape) != 3:
                raise FormatError(
                    f"{who(self)} takes sequences; got a plain array of shape {tuple(shape)}. "
                    "Fix: give (batch, time, channels), or label it, e.g. df.dlarray(x, 'BTC')."
                )
            return "BTC"
        if not _is_sequence_1d(fmt):
            raise FormatError(
                f"{who(self)} takes {self._want}; got format {fmt!r} (shape {tuple(shape)}). "
                "Fix: label the axes accordingly, e.g. df.dlarray(x, 'BTC')."
            )
        return fmt


def _padding_1d(layer, value):
    expected = "'same', 'causal', a non-negative int, or a pair (left, right)"
    fix = "e.g. padding='causal' (forecasting) or padding='same'."
    if isinstance(value, str):
        if value in ("same", "causal"):
            return value
        raise bad_argument(layer, "padding", expected, value, fix)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return (int(value), int(value))
    if (
        isinstance(value, (tuple, list))
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
    ):
        return (int(value[0]), int(value[1]))
    raise bad_argument(layer, "padding", expected, value, fix)


class Conv2D(_Convolution):
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
      padding_value: ``0`` (default) or another number, ``"symmetric-include-edge"``,
        ``"symmetric-exclude-edge"`` or ``"replicate"``.
      groups: the number of channel groups (``groupedConvolution2dLayer``'s ``numGroups``; each
        group gets ``num_filters // groups`` filters) or ``"channel-wise"`` (one group per input
        channel: depth-wise convolution). Default 1.
    """

    __doc__ = (
        (__doc__ or "").rstrip()
        + _OPTIONS_DOC
        + """

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
    )

    _dims: ClassVar[int] = 2
    _want: ClassVar[str] = "e.g. 'BSSC' (NHWC images)"

    filter_size: Any
    num_filters: int
    _: dataclasses.KW_ONLY
    stride: Any = 1
    padding: Any = 0
    dilation: Any = 1
    groups: Any = 1
    weights: jax.Array = learnable(default=None)
    bias: jax.Array = learnable(default=None, l2_factor=0.0)  # MATLAB: BiasL2Factor 0
    weights_initializer: Any = "glorot"
    bias_initializer: Any = "zeros"
    padding_value: Any = 0
    weight_learn_rate_factor: float = 1.0
    weight_l2_factor: float = 1.0
    bias_learn_rate_factor: float = 1.0
    bias_l2_factor: float = 0.0

    def __post_init__(self) -> None:
        self.filter_size = int_pair(
            self, "filter_size", self.filter_size, fix="e.g. filter_size=3 or (3, 5)."
        )
        self.stride = int_pair(self, "stride", self.stride, fix="e.g. stride=1 or (2, 2).")
        self.dilation = int_pair(self, "dilation", self.dilation, fix="e.g. dilation=1.")
        self.padding = padding_2d(self, self.padding)
        self.num_filters = positive_int(
            self, "num_filters", self.num_filters, fix="e.g. Conv2D(3, 16) for 16 filters."
        )
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
        self._check_convolution_options()

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

    def _layout_allowed(self, fmt: str) -> bool:
        return sorted(fmt) == sorted("BSSC")

    def _format(self, fmt: str, shape) -> str:
        return spatial_2d_format(self, fmt, shape)


class Conv3D(_UngroupedConvolution):
    r"""3-D convolution (MATLAB's ``convolution3dLayer``).

    Input and output: 3-D images (volumes) with one ``B``, three ``S`` and one ``C`` axis in any
    order (``"BSSSC"``, i.e. NDHWC); the output keeps the input's format with ``num_filters``
    channels. A plain input is taken to be NDHWC.

    Learnables: ``weights`` of shape ``(fd, fh, fw, in_channels, num_filters)``, ``bias`` of
    shape ``(num_filters,)``.

    Args:
      filter_size: an int or three ints, one per ``S`` axis in storage order.
      num_filters: the number of output channels.
      stride: an int or three ints; default 1.
      padding: ``0`` (default), an int (all sides), three ints (both sides of each axis), three
        pairs ``(before, after)``, or ``"same"`` (output size ``ceil(input / stride)``, the odd
        extra after).
      dilation: an int or three ints; default 1.
      padding_value: ``0`` (default) or another number, ``"symmetric-include-edge"``,
        ``"symmetric-exclude-edge"`` or ``"replicate"``.
    """

    __doc__ = (
        (__doc__ or "").rstrip()
        + _OPTIONS_DOC
        + """

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> import difffn as df
      >>> layer = df.layers.Conv3D(3, 4, padding="same", stride=2)
      >>> layer = layer.initialize(df.Layout((None, 6, 6, 6, 1), "BSSSC"), key=jax.random.key(0))
      >>> layer.weights.shape
      (3, 3, 3, 1, 4)
      >>> layer(df.dlarray(jnp.ones((2, 6, 6, 6, 1)), "BSSSC")).shape
      (2, 3, 3, 3, 4)
    """
    )

    _dims: ClassVar[int] = 3
    _want: ClassVar[str] = "e.g. 'BSSSC' (NDHWC volumes: one 'B', three 'S', one 'C')"

    def __post_init__(self) -> None:
        fix = "e.g. {}=3 or (3, 3, 1)."
        self.filter_size: Any = _ints(
            self, "filter_size", self.filter_size, 3, fix=fix.format("filter_size")
        )
        self.stride: Any = _ints(self, "stride", self.stride, 3, fix=fix.format("stride"))
        self.dilation: Any = _ints(self, "dilation", self.dilation, 3, fix=fix.format("dilation"))
        self.padding: Any = _padding_3d(self, self.padding)
        self._check_convolution_options()

    def _layout_allowed(self, fmt: str) -> bool:
        return sorted(fmt) == sorted("BSSSC")

    def _format(self, fmt: str, shape) -> str:
        if not fmt:
            if len(shape) != 5:
                raise FormatError(
                    f"{who(self)} takes 3-D image data with format 'BSSSC' (batch, depth, "
                    f"height, width, channels); got a plain array of shape {tuple(shape)}. "
                    "Fix: label it, e.g. df.dlarray(x, 'BSSSC')."
                )
            return "BSSSC"
        if not self._layout_allowed(fmt):
            raise FormatError(
                f"{who(self)} takes 3-D image data: one 'B', three 'S' and one 'C' axis (e.g. "
                f"'BSSSC'); got format {fmt!r} (shape {tuple(shape)}). Fix: for 2-D images "
                "use Conv2D; label the axes, e.g. df.dlarray(x, 'BSSSC')."
            )
        return fmt


def _padding_3d(layer, value):
    expected = (
        "'same', a non-negative int, three non-negative ints (both sides of each axis) or "
        "three pairs (before, after)"
    )
    fix = "e.g. padding='same' or padding=1."
    if value == "same":
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return ((int(value),) * 2,) * 3
    is_int = lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0  # noqa: E731
    if isinstance(value, (tuple, list)) and len(value) == 3:
        if all(is_int(v) for v in value):
            return tuple((int(v), int(v)) for v in value)
        if all(isinstance(v, (tuple, list)) and len(v) == 2 and all(map(is_int, v)) for v in value):
            return tuple((int(a), int(b)) for a, b in value)
    raise bad_argument(layer, "padding", expected, value, fix)

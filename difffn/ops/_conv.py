"""Convolution: ``conv`` (MATLAB's ``dlconv``) and ``conv_transpose`` (``dltranspconv``).

Both are ``jax.lax.conv_general_dilated`` with dimension numbers read from the format, so the data
is never transposed when it has one batch-like axis (``"BSSC"``, ``"SSCB"``, ``"BTC"``); other
axes that the window does not slide over (a second of ``B``/``T``/``U``, or none) are folded into
one batch axis and unfolded after.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from .._core import Data, OpError, Output
from . import _conv_layouts
from ._common import (
    ints,
    pack,
    pairs,
    per_channel,
    plain,
    real,
    require_label,
    same_padding,
    unpack,
    who,
    window_axes,
)

_PAD_MODES = {
    "symmetric-include-edge": "symmetric",
    "symmetric-exclude-edge": "reflect",
    "replicate": "edge",
}
_LETTERS = "HWD"  # the window's dimensions in lax's dimension numbers (any distinct letters)


def _weights(op: str, weights):
    w = plain(op, "weights", weights)
    if not 3 <= w.ndim <= 5:
        raise OpError(
            f"{who(op)}: weights must have 3 to 5 axes (the window's 1 to 3 sizes, then two "
            f"channel axes); got shape {tuple(w.shape)}. Fix: e.g. (3, 3, in_channels, "
            "num_filters) for a 2-D convolution."
        )
    return w


def _operands(op: str, x, weights, fmt, what: str):
    """``(data, fmt, formatted, weights, c_axis, window_axes)`` of a (transposed) convolution."""
    data, fmt, formatted = unpack(op, x, fmt)
    w = _weights(op, weights)
    k = w.ndim - 2
    c_axis = require_label(op, fmt, "C", data.shape, why="convolves the channels 'C'")
    axes = window_axes(op, fmt, data.shape, k, what=f"a {k}-D {what}")
    return data, fmt, formatted, w, c_axis, axes


def _bias(op: str, bias, filters: int, ndim: int, c_axis: int, dtype):
    if bias is None:
        return None
    array = plain(op, "bias", bias)
    if array.size == 1:
        return jnp.reshape(array, ()).astype(dtype)
    return per_channel(op, "bias", array, filters, ndim, c_axis, dtype)


def _windowed(data, axes, c_axis, run):
    """Run ``run(data, lhs_spec)`` where the data has exactly one batch axis ``N``.

    ``run`` gets the spec of the (possibly regrouped) data and returns an array with the same
    spec; the result is put back into the input's axis order.
    """
    others = [i for i in range(data.ndim) if i != c_axis and i not in axes]
    if len(others) == 1:
        spec = ["N"] * data.ndim
        spec[c_axis] = "C"
        for j, a in enumerate(axes):
            spec[a] = _LETTERS[j]
        return run(data, "".join(spec))
    order = others + list(axes) + [c_axis]
    moved = jnp.transpose(data, order)
    lead = moved.shape[: len(others)]
    grouped = jnp.reshape(moved, (math.prod(lead), *moved.shape[len(others) :]))
    y = run(grouped, "N" + _LETTERS[: len(axes)] + "C")
    y = jnp.reshape(y, lead + y.shape[1:])
    return jnp.transpose(y, [order.index(i) for i in range(data.ndim)])


def conv(
    x: Data,
    weights: Data,
    bias: Data | None = None,
    *,
    stride: int | Sequence[int] = 1,
    dilation_factor: int | Sequence[int] = 1,
    padding: Any = 0,
    padding_value: float | str = 0,
    fmt: str | None = None,
) -> Output:
    r"""Deep learning convolution over the ``S`` axes (MATLAB's ``dlconv``).

    The window slides over the input's ``S`` axes (as many as ``weights`` has window
    dimensions), over ``S`` and ``T`` when the window has one more dimension than there are
    ``S`` axes (MATLAB's 1-D image sequences, ``"SCBT"``), and over ``T`` for sequences without
    ``S`` (``"BTC"``: a 1-D convolution in time). Window dimensions follow the axes in storage
    order. The output has the input's format; a plain input with ``fmt=`` gives a plain output.

    Args:
      x: a ``df.FormattedArray`` with a ``C`` axis, or a plain array with ``fmt``.
      weights: ``(*window, in_channels // groups, num_filters)`` (MATLAB's
        ``filterSize x numChannels x numFilters``; HWIO for 2-D). The number of groups is
        ``in_channels // weights.shape[-2]`` (grouped and channel-wise convolution).
      bias: ``(num_filters,)``, a scalar, or ``None`` (no bias).
      stride: an int or one per window dimension; default 1.
      dilation_factor: an int or one per window dimension; default 1.
      padding: ``0`` (default), an int, one int per window dimension (both sides), one pair
        ``(before, after)`` per window dimension, ``"same"`` (output size ``ceil(size /
        stride)``, the odd extra after) or ``"causal"`` (``(filter - 1) * dilation`` before,
        none after: each output sees only the past).
      padding_value: ``0`` (default) or another number, or ``"symmetric-include-edge"``
        (mirror including the edge), ``"symmetric-exclude-edge"`` (mirror excluding it) or
        ``"replicate"`` (repeat the edge).
      fmt: the format of a plain ``x`` (MATLAB's ``DataFormat``).

    Returns:
      The convolution, with the input's format and ``num_filters`` channels.

    Raises:
      FormatError: no format, no ``C`` axis, or not enough axes to slide over.
      OpError: a bad option, or weights that do not fit the input's channels.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> x = df.dlarray(jnp.ones((2, 5, 5, 3)), "BSSC")
      >>> y = df.ops.conv(x, jnp.ones((3, 3, 3, 4)), jnp.zeros(4), padding="same")
      >>> y.format, y.shape, float(y.data[0, 2, 2, 0]), float(y.data[0, 0, 0, 0])
      ('BSSC', (2, 5, 5, 4), 27.0, 12.0)
      >>> seq = df.dlarray(jnp.arange(6.0).reshape(1, 6, 1), "BTC")  # 1-D, in time
      >>> df.ops.conv(seq, jnp.ones((2, 1, 1)), padding="causal").data[0, :, 0]
      Array([0., 1., 3., 5., 7., 9.], dtype=float32)
    """
    op = "conv"
    data, fmt, formatted, w, c_axis, axes = _operands(op, x, weights, fmt, "convolution")
    k = w.ndim - 2
    in_channels, per_group, filters = data.shape[c_axis], w.shape[-2], w.shape[-1]
    if per_group < 1 or in_channels % per_group or filters % (in_channels // per_group):
        raise OpError(
            f"{who(op)}: the input has {in_channels} channels but weights of shape "
            f"{tuple(w.shape)} take {per_group} per group; the channels must be a multiple of "
            "weights.shape[-2] (groups = channels // weights.shape[-2]) and num_filters "
            "(weights.shape[-1]) a multiple of the groups. Fix: give weights of shape "
            f"(*window, {in_channels}, num_filters) for an ungrouped convolution."
        )
    groups = in_channels // per_group
    strides = ints(op, "stride", stride, k)
    dilation = ints(op, "dilation_factor", dilation_factor, k)
    window = w.shape[:k]
    pads = pairs(op, "padding", padding, k, words=("same", "causal"))
    sizes = [data.shape[a] for a in axes]
    if pads == "same":
        pads = tuple(same_padding(*v) for v in zip(sizes, window, strides, dilation, strict=True))
    elif pads == "causal":
        pads = tuple(((f - 1) * d, 0) for f, d in zip(window, dilation, strict=True))
    assert not isinstance(pads, str)  # pairs returns one of the words above, or the pairs
    dtype = jnp.result_type(data, w, *(() if bias is None else (plain(op, "bias", bias),)))
    data = data.astype(dtype)
    mode = _padding_mode(op, padding_value)
    if mode != 0:
        data = _pad(data, axes, pads, mode)
        pads = ((0, 0),) * k
    for a, (lo, hi), f, d in zip(axes, pads, window, dilation, strict=True):
        if data.shape[a] + lo + hi < (f - 1) * d + 1:
            raise OpError(
                f"{who(op)}: axis {a} of the input (size {data.shape[a]}, then padded by "
                f"{(lo, hi)}) is shorter than the dilated window ({(f - 1) * d + 1}). Fix: pad "
                "more (e.g. padding='same') or use a smaller filter or dilation."
            )

    def run(lhs, spec):
        if _conv_layouts.fits(groups):  # XLA:CPU: canonical gradients, in loops too
            pads_ = tuple((int(lo), int(hi)) for lo, hi in pads)
            return _conv_layouts.conv(
                lhs, w.astype(dtype), tuple(strides), pads_, tuple(dilation), spec
            )
        return jax.lax.conv_general_dilated(
            lhs,
            w.astype(dtype),
            window_strides=strides,
            padding=pads,
            rhs_dilation=dilation,
            dimension_numbers=(spec, _LETTERS[:k] + "IO", spec),
            feature_group_count=groups,
        )

    y = _windowed(data, axes, c_axis, run)
    b = _bias(op, bias, filters, y.ndim, c_axis, dtype)
    return pack(y if b is None else y + b, fmt, formatted)


def _padding_mode(op: str, padding_value):
    """``padding_value`` as a ``jnp.pad`` mode, or as a float (``0`` is the convolution's own)."""
    if isinstance(padding_value, str):
        if padding_value not in _PAD_MODES:
            raise OpError(
                f"{who(op)}: padding_value must be a number, 'symmetric-include-edge', "
                f"'symmetric-exclude-edge' or 'replicate'; got {padding_value!r}."
            )
        return _PAD_MODES[padding_value]
    return real(op, "padding_value", padding_value)


def _pad(data, axes, pads, mode):
    """Pad the window axes with a constant (a float ``mode``) or by mirroring/repeating."""
    widths = [(0, 0)] * data.ndim
    for a, pad in zip(axes, pads, strict=True):
        if mode == "reflect" and max(pad) > data.shape[a] - 1:
            raise OpError(
                f"df.ops.conv: 'symmetric-exclude-edge' padding {pad} needs more than "
                f"{max(pad)} values along axis {a} (size {data.shape[a]}). Fix: pad less or "
                "use 'symmetric-include-edge'."
            )
        widths[a] = pad
    if isinstance(mode, str):
        return jnp.pad(data, widths, mode=mode)
    return jnp.pad(data, widths, constant_values=mode)


def conv_transpose(
    x: Data,
    weights: Data,
    bias: Data | None = None,
    *,
    stride: int | Sequence[int] = 1,
    dilation_factor: int | Sequence[int] = 1,
    cropping: Any = 0,
    fmt: str | None = None,
) -> Output:
    r"""Transposed convolution (MATLAB's ``dltranspconv``): the adjoint of
    [`conv`][difffn.ops.conv].

    ``conv_transpose(x, w)`` is the gradient of ``conv(y, w)`` with respect to ``y`` (before
    cropping): each input value spreads ``w`` over the output, ``stride`` apart. Output size per
    window axis: ``(size - 1) * stride + (filter - 1) * dilation + 1 - cropping``.

    Args:
      x: a ``df.FormattedArray`` with a ``C`` axis, or a plain array with ``fmt``; the window
        axes are chosen as in [`conv`][difffn.ops.conv].
      weights: ``(*window, num_filters, in_channels)`` (MATLAB's
        ``filterSize x numFilters x numChannels``: the output channels come first).
      bias: ``(num_filters,)``, a scalar, or ``None``.
      stride: an int or one per window dimension (the upsampling factor); default 1.
      dilation_factor: an int or one per window dimension; default 1.
      cropping: ``0`` (default), an int, one int per window dimension (both sides), one pair
        ``(before, after)`` per window dimension, or ``"same"`` (output size ``size * stride``;
        an odd total crops the extra one before, at the top/left, as MATLAB does).
      fmt: the format of a plain ``x``.

    Returns:
      The transposed convolution, with the input's format and ``num_filters`` channels.

    Raises:
      FormatError: no format, no ``C`` axis, or not enough axes to slide over.
      OpError: a bad option, or weights whose last axis is not the input's channel count.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> x = df.dlarray(jnp.ones((1, 3, 3, 2)), "BSSC")
      >>> y = df.ops.conv_transpose(x, jnp.ones((2, 2, 5, 2)), stride=2)
      >>> y.format, y.shape
      ('BSSC', (1, 6, 6, 5))
      >>> df.ops.conv_transpose(x, jnp.ones((3, 3, 5, 2)), stride=2, cropping="same").shape
      (1, 6, 6, 5)
    """
    op = "conv_transpose"
    data, fmt, formatted, w, c_axis, axes = _operands(op, x, weights, fmt, "transposed convolution")
    k = w.ndim - 2
    in_channels, filters = data.shape[c_axis], w.shape[-2]
    if w.shape[-1] != in_channels:
        raise OpError(
            f"{who(op)}: the input has {in_channels} channels but weights of shape "
            f"{tuple(w.shape)} expect {w.shape[-1]} (its last axis). Fix: give weights of shape "
            f"(*window, num_filters, {in_channels})."
        )
    strides = ints(op, "stride", stride, k)
    dilation = ints(op, "dilation_factor", dilation_factor, k)
    extents = [(f - 1) * d + 1 for f, d in zip(w.shape[:k], dilation, strict=True)]
    crops = pairs(op, "cropping", cropping, k)
    if crops == "same":
        totals = [e - s for e, s in zip(extents, strides, strict=True)]
        crops = tuple((t - t // 2, t // 2) for t in totals)
    assert not isinstance(crops, str)  # pairs returns "same" or the pairs
    for a, (lo, hi), e, s in zip(axes, crops, extents, strides, strict=True):
        if (data.shape[a] - 1) * s + e - lo - hi < 1:
            raise OpError(
                f"{who(op)}: cropping {(lo, hi)} removes the whole output along axis {a} "
                f"(uncropped size {(data.shape[a] - 1) * s + e}). Fix: crop less."
            )
    dtype = jnp.result_type(data, w, *(() if bias is None else (plain(op, "bias", bias),)))
    # The adjoint of a convolution: dilate the input by the stride, pad by the window extent
    # less the cropping, and convolve with the flipped window (I and O swapped by the spec).
    flipped = jnp.flip(w, axis=tuple(range(k))).astype(dtype)
    pads = tuple((e - 1 - lo, e - 1 - hi) for e, (lo, hi) in zip(extents, crops, strict=True))

    def run(lhs, spec):
        return jax.lax.conv_general_dilated(
            lhs,
            flipped,
            window_strides=(1,) * k,
            padding=pads,
            lhs_dilation=strides,
            rhs_dilation=dilation,
            dimension_numbers=(spec, _LETTERS[:k] + "OI", spec),
        )

    y = _windowed(data.astype(dtype), axes, c_axis, run)
    b = _bias(op, bias, filters, y.ndim, c_axis, dtype)
    return pack(y if b is None else y + b, fmt, formatted)

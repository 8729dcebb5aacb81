r"""Normalization: ``batchnorm``, ``layernorm``, ``groupnorm`` and ``instancenorm``.

Every one computes $y = \gamma (x - \mu) / \sqrt{\sigma^2 + \epsilon} + \beta$ with a
per-channel offset $\beta$ and scale $\gamma$; they differ in the axes that the mean
$\mu$ and the biased variance $\sigma^2$ are taken over (MATLAB's functions of the
same names).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from .._core import Data, FormatError, OpError, Output
from ._common import floating, pack, per_channel, plain, real, require_label, unpack, who


def _normalize(op, data, axis, reduce, offset, scale, epsilon, stats=None):
    """Normalize ``data`` over the ``reduce`` axes (or with given statistics)."""
    channels = data.shape[axis]
    out = jnp.result_type(floating(data), plain(op, "offset", offset), plain(op, "scale", scale))
    # bfloat16/float16 data (mixed precision): statistics and normalization in float32, the
    # output cast back; float32 and float64 compute in their own dtype.
    dtype = jnp.promote_types(out, jnp.float32)
    data = data.astype(dtype)
    if stats is None:
        mean = jnp.mean(data, axis=reduce, keepdims=True)
        variance = jnp.mean(jnp.square(data - mean), axis=reduce, keepdims=True)
    else:
        mean, variance = (per_channel(op, n, v, channels, data.ndim, axis, dtype) for n, v in stats)
    beta = per_channel(op, "offset", offset, channels, data.ndim, axis, dtype)
    gamma = per_channel(op, "scale", scale, channels, data.ndim, axis, dtype)
    inv = jax.lax.rsqrt(variance + jnp.asarray(epsilon, dtype))
    return ((data - mean) * (gamma * inv) + beta).astype(out), mean, variance


def batchnorm(
    x: Data,
    offset: Data,
    scale: Data,
    mean: Data | None = None,
    variance: Data | None = None,
    *,
    training: bool = False,
    epsilon: float = 1e-05,
    mean_decay: float = 0.1,
    variance_decay: float = 0.1,
    fmt: str | None = None,
) -> Output:
    r"""Batch normalization over every axis but ``C`` (MATLAB's ``batchnorm``).

    MATLAB tells its three uses apart by the number of outputs asked for; here:

    * ``batchnorm(x, offset, scale)`` normalizes with the mini-batch statistics and returns
      ``(y, mean, variance)``: the batch mean and (biased) variance it normalized with.
    * ``batchnorm(x, offset, scale, mean, variance)`` (inference) normalizes with the given
      statistics and returns ``y``.
    * ``batchnorm(x, offset, scale, mean, variance, training=True)`` normalizes with the
      mini-batch statistics and returns ``(y, new_mean, new_variance)``, the running statistics
      updated as MATLAB does: ``new = decay * batch + (1 - decay) * old``, where the batch
      variance is the *unbiased* one (``m / (m - 1)`` times the biased, for ``m`` values per
      channel). The running statistics carry no gradient and keep their dtype and shape.

    Args:
      x: a ``df.FormattedArray`` with a ``C`` axis, or a plain array with ``fmt``.
      offset, scale: $\beta$ and $\gamma$, one value per channel (any shape).
      mean, variance: running (or trained) statistics, one value per channel, or ``None``.
      training: update ``mean`` and ``variance`` with the batch's (see above).
      epsilon: added to the variance; default 1e-5.
      mean_decay, variance_decay: the decays of the running statistics; default 0.1.
      fmt: the format of a plain ``x``.

    Returns:
      ``y`` with the input's format, or ``(y, mean, variance)`` (see above).

    Raises:
      FormatError: no format, or no ``C`` axis.
      OpError: a parameter without one value per channel, or a bad option.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> x = df.dlarray(jnp.array([[0.0, 10.0], [2.0, 30.0]]), "BC")
      >>> y, mu, var = df.ops.batchnorm(x, jnp.zeros(2), jnp.ones(2))
      >>> jnp.round(y.data, 4)
      Array([[-1., -1.],
             [ 1.,  1.]], dtype=float32)
      >>> mu, var
      (Array([ 1., 20.], dtype=float32), Array([  1., 100.], dtype=float32))
      >>> _, mu, var = df.ops.batchnorm(x, jnp.zeros(2), jnp.ones(2), jnp.zeros(2), jnp.ones(2),
      ...                               training=True)
      >>> mu, var  # 0.1 * batch + 0.9 * running, with unbiased batch variances 2 and 200
      (Array([0.1, 2. ], dtype=float32), Array([ 1.1, 20.9], dtype=float32))
    """
    op = "batchnorm"
    data, fmt, formatted = unpack(op, x, fmt)
    axis = require_label(op, fmt, "C", data.shape, why="normalizes each channel 'C'")
    epsilon = real(op, "epsilon", epsilon, positive=True)
    if (mean is None) != (variance is None):
        raise OpError(
            f"{who(op)}: give both mean and variance (running statistics) or neither (batch "
            "statistics)."
        )
    if training and mean is None:
        raise OpError(
            f"{who(op)}: training=True updates running statistics, so it needs mean and "
            "variance. Fix: pass them, or call batchnorm(x, offset, scale) for the batch's own."
        )
    reduce = tuple(i for i in range(data.ndim) if i != axis)
    if mean is not None and not training:
        y, _, _ = _normalize(
            op, data, axis, reduce, offset, scale, epsilon, (("mean", mean), ("variance", variance))
        )
        return pack(y, fmt, formatted)
    if data.ndim < 2:
        raise FormatError(
            f"{who(op)} needs observations besides the channel axis to compute batch "
            f"statistics; got format {fmt!r} and shape {tuple(data.shape)}. Fix: add a batch "
            "axis 'B'."
        )
    y, batch_mean, batch_variance = _normalize(op, data, axis, reduce, offset, scale, epsilon)
    batch_mean, batch_variance = batch_mean.reshape(-1), batch_variance.reshape(-1)
    if not training:
        return pack(y, fmt, formatted), batch_mean, batch_variance
    for name, decay in (("mean_decay", mean_decay), ("variance_decay", variance_decay)):
        if not 0 <= real(op, name, decay) <= 1:
            raise OpError(f"{who(op)}: {name} must be in [0, 1]; got {decay!r}.")
    m = math.prod(data.shape[i] for i in reduce)
    unbiased = batch_variance * (m / max(m - 1, 1))
    updated = []
    for old, new, decay in ((mean, batch_mean, mean_decay), (variance, unbiased, variance_decay)):
        old = plain(op, "running statistics", old)
        new = jax.lax.stop_gradient(new).astype(jnp.result_type(new, old))
        value = decay * new + (1 - decay) * jnp.reshape(old, (-1,)).astype(new.dtype)
        updated.append(jnp.reshape(value, old.shape).astype(old.dtype))
    return pack(y, fmt, formatted), *updated


def layernorm(
    x: Data,
    offset: Data,
    scale: Data,
    *,
    epsilon: float = 1e-05,
    operation_dimension: str = "auto",
    fmt: str | None = None,
) -> Output:
    r"""Layer normalization, per observation (MATLAB's ``layernorm``).

    The statistics are taken per observation (and time step) over the axes that
    ``operation_dimension`` names:

    * ``"auto"`` (default): ``"spatial-channel"`` when the input has ``S`` axes, else
      ``"channel-only"`` (sequences and features);
    * ``"channel-only"``: over ``C``;
    * ``"spatial-channel"``: over the ``S`` axes and ``C``;
    * ``"batch-excluded"``: over every axis but ``B``.

    Args:
      x: a ``df.FormattedArray`` with a ``C`` axis, or a plain array with ``fmt``.
      offset, scale: $\beta$ and $\gamma$, one value per channel.
      epsilon: added to the variance; default 1e-5.
      operation_dimension: see above.
      fmt: the format of a plain ``x``.

    Returns:
      The normalized input, with the input's format.

    Raises:
      FormatError: no format, or no ``C`` axis.
      OpError: a parameter without one value per channel, or a bad option.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> x = df.dlarray(jnp.array([[1.0, 3.0], [10.0, 30.0]]), "BC")
      >>> jnp.round(df.ops.layernorm(x, jnp.zeros(2), jnp.ones(2)).data, 4)
      Array([[-1.,  1.],
             [-1.,  1.]], dtype=float32)
    """
    op = "layernorm"
    data, fmt, formatted = unpack(op, x, fmt)
    axis = require_label(op, fmt, "C", data.shape, why="normalizes with per-channel parameters")
    epsilon = real(op, "epsilon", epsilon, positive=True)
    choices = ("auto", "channel-only", "spatial-channel", "batch-excluded")
    if operation_dimension not in choices:
        raise OpError(
            f"{who(op)}: operation_dimension must be one of {', '.join(map(repr, choices))}; "
            f"got {operation_dimension!r}."
        )
    if operation_dimension == "auto":
        operation_dimension = "spatial-channel" if "S" in fmt else "channel-only"
    if operation_dimension == "channel-only":
        reduce = (axis,)
    elif operation_dimension == "spatial-channel":
        reduce = tuple(i for i, label in enumerate(fmt) if label in "SC")
    else:
        reduce = tuple(i for i, label in enumerate(fmt) if label != "B")
    y, _, _ = _normalize(op, data, axis, reduce, offset, scale, epsilon)
    return pack(y, fmt, formatted)


def groupnorm(
    x: Data,
    num_groups: int | str,
    offset: Data,
    scale: Data,
    *,
    epsilon: float = 1e-05,
    fmt: str | None = None,
) -> Output:
    r"""Group normalization, per observation (MATLAB's ``groupnorm``).

    The channels are split into ``num_groups`` groups of consecutive channels; the statistics
    are taken per observation (``B``) and group, over the group's channels and every other axis
    (``S``, ``T``, ``U``).

    Args:
      x: a ``df.FormattedArray`` with a ``C`` axis, or a plain array with ``fmt``.
      num_groups: a positive int that divides the channels, ``"all-channels"`` (one group) or
        ``"channel-wise"`` (one group per channel: instance normalization).
      offset, scale: $\beta$ and $\gamma$, one value per channel.
      epsilon: added to the variance; default 1e-5.
      fmt: the format of a plain ``x``.

    Returns:
      The normalized input, with the input's format.

    Raises:
      FormatError: no format, or no ``C`` axis.
      OpError: groups that do not divide the channels, a parameter without one value per
        channel, or a bad option.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> x = df.dlarray(jnp.array([[1.0, 3.0, 10.0, 30.0]]), "BC")
      >>> jnp.round(df.ops.groupnorm(x, 2, jnp.zeros(4), jnp.ones(4)).data, 4)
      Array([[-1.,  1., -1.,  1.]], dtype=float32)
    """
    op = "groupnorm"
    data, fmt, formatted = unpack(op, x, fmt)
    axis = require_label(op, fmt, "C", data.shape, why="normalizes groups of channels 'C'")
    channels = data.shape[axis]
    if num_groups == "all-channels":
        groups = 1
    elif num_groups == "channel-wise":
        groups = channels
    elif isinstance(num_groups, int) and not isinstance(num_groups, bool) and num_groups > 0:
        groups = num_groups
    else:
        raise OpError(
            f"{who(op)}: num_groups must be a positive int, 'all-channels' or 'channel-wise'; "
            f"got {num_groups!r}."
        )
    if channels % groups:
        raise OpError(
            f"{who(op)}: the input has {channels} channels, which cannot be split into "
            f"num_groups={groups} equal groups. Fix: use a number of groups that divides "
            f"{channels}."
        )
    y = _group_normalize(op, data, fmt, axis, groups, offset, scale, epsilon)
    return pack(y, fmt, formatted)


def _group_normalize(op, data, fmt, axis, groups, offset, scale, epsilon):
    epsilon = real(op, "epsilon", epsilon, positive=True)
    channels = data.shape[axis]
    dtype = jnp.result_type(floating(data), plain(op, "offset", offset), plain(op, "scale", scale))
    data = data.astype(dtype)
    # Statistics on a view with C split in place into (groups, channels per group), reduced to
    # (B, groups); then repeated per channel and broadcast against the unsplit data (as flax's
    # GroupNorm does: normalizing the split view itself is several times slower on CPU).
    split = data.reshape(data.shape[:axis] + (groups, channels // groups) + data.shape[axis + 1 :])
    kept = [i for i, label in enumerate(fmt) if label == "B"] + [axis]
    split_kept = {i if i <= axis else i + 1 for i in kept}
    reduce = tuple(i for i in range(split.ndim) if i not in split_kept)
    mean = jnp.mean(split, axis=reduce, keepdims=True)
    variance = jnp.mean(jnp.square(split - mean), axis=reduce)
    mean = jnp.squeeze(mean, axis=reduce)
    group_axis = sorted(kept).index(axis)
    broadcast = [data.shape[i] if i in kept else 1 for i in range(data.ndim)]
    per_channel_stat = lambda v: jnp.reshape(  # noqa: E731
        jnp.repeat(v, channels // groups, axis=group_axis), broadcast
    )
    inv = jax.lax.rsqrt(per_channel_stat(variance) + jnp.asarray(epsilon, dtype))
    beta = per_channel(op, "offset", offset, channels, data.ndim, axis, dtype)
    gamma = per_channel(op, "scale", scale, channels, data.ndim, axis, dtype)
    return (data - per_channel_stat(mean)) * (inv * gamma) + beta


def instancenorm(
    x: Data, offset: Data, scale: Data, *, epsilon: float = 1e-05, fmt: str | None = None
) -> Output:
    r"""Instance normalization, per observation and channel (MATLAB's ``instancenorm``).

    The statistics are taken per observation (``B``) and channel over every other axis (``S``,
    ``T``, ``U``): group normalization with one group per channel.

    Args:
      x: a ``df.FormattedArray`` with a ``C`` axis, or a plain array with ``fmt``.
      offset, scale: $\beta$ and $\gamma$, one value per channel.
      epsilon: added to the variance; default 1e-5.
      fmt: the format of a plain ``x``.

    Returns:
      The normalized input, with the input's format.

    Raises:
      FormatError: no format, or no ``C`` axis.
      OpError: a parameter without one value per channel, or a bad option.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> x = df.dlarray(jnp.array([[[1.0, 10.0], [3.0, 30.0]]]), "BSC")
      >>> jnp.round(df.ops.instancenorm(x, jnp.zeros(2), jnp.ones(2)).data[0], 4)
      Array([[-1., -1.],
             [ 1.,  1.]], dtype=float32)
    """
    op = "instancenorm"
    data, fmt, formatted = unpack(op, x, fmt)
    axis = require_label(op, fmt, "C", data.shape, why="normalizes each channel 'C'")
    y = _group_normalize(op, data, fmt, axis, data.shape[axis], offset, scale, epsilon)
    return pack(y, fmt, formatted)

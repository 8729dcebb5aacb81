"""``BatchNorm``: MATLAB's ``batchNormalizationLayer``."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

from .._errors import FormatError, LayerError
from .._fields import learnable, state
from .._layer import Layer
from . import _initializers as init
from ._checks import (
    array_or_none,
    channel_axis,
    data_and_format,
    known_size,
    layout_format,
    per_channel,
    real,
    relabel,
    require,
    who,
)


class BatchNorm(Layer):
    r"""Batch normalization over every axis but ``C`` (MATLAB's ``batchNormalizationLayer``).

    Works on any format with a ``C`` axis (``"BSSC"``, ``"BC"``, ``"BTC"``, ...); the output has the
    input's format. A plain input has its channels on the last axis.

    Training (``forward``) normalizes with the mini-batch statistics :math:`\mu_B, \sigma_B^2`
    (the biased variance, over every axis but ``C``):
    :math:`y = \gamma (x - \mu_B) / \sqrt{\sigma_B^2 + \epsilon} + \beta`, and returns the
    updated running statistics with MATLAB's rule
    ``trained_mean = mean_decay * mu_B + (1 - mean_decay) * trained_mean`` and
    ``trained_variance = variance_decay * s2 + (1 - variance_decay) * trained_variance``, where
    ``s2`` is the **unbiased** batch variance :math:`\sigma_B^2 \cdot m / (m - 1)` (``m`` values
    per channel; ``s2 = sigma_B^2`` when ``m = 1``). MATLAB's documentation gives the update
    rule without naming the estimator; the unbiased one is the batch-normalization paper's
    estimate of the population variance, also used by PyTorch. Inference (``predict``)
    normalizes with ``trained_mean`` and ``trained_variance`` and returns them unchanged. The
    running statistics carry no gradient and keep their dtype.

    Learnables ``offset`` (:math:`\beta`, zeros) and ``scale`` (:math:`\gamma`, ones); state
    ``trained_mean`` (zeros) and ``trained_variance`` (ones); all of shape ``(C,)``.

    Args:
      epsilon: added to the variance (default 1e-5).
      mean_decay, variance_decay: the decays of the running statistics, in [0, 1] (default 0.1).
      offset, scale, trained_mean, trained_variance: initial values, ``None`` until
        ``initialize``.
      offset_initializer: ``"zeros"`` (default), ``"ones"``, ``"narrow-normal"`` or a function.
      scale_initializer: ``"ones"`` (default), ``"zeros"``, ``"narrow-normal"`` or a function.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> import difffn as df
      >>> from difffn._layer_call import call_layer
      >>> layer = df.layers.BatchNorm()
      >>> layer = layer.initialize(df.Layout((None, 2), "BC"), key=jax.random.key(0))
      >>> layer.trained_mean, layer.trained_variance
      (Array([0., 0.], dtype=float32), Array([1., 1.], dtype=float32))
      >>> x = df.dlarray(jnp.array([[0.0, 10.0], [2.0, 30.0]]), "BC")
      >>> (y,), (mean, variance) = call_layer(layer, (x,), training=True)  # forward
      >>> jnp.round(y.data, 4)
      Array([[-1., -1.],
             [ 1.,  1.]], dtype=float32)
      >>> mean, variance  # 0.1 * batch + 0.9 * running; unbiased batch variances 2 and 200
      (Array([0.1, 2. ], dtype=float32), Array([ 1.1, 20.9], dtype=float32))
      >>> y, mean, variance = layer(x)  # predict: the trained statistics, returned unchanged
      >>> y.data
      Array([[ 0.     ,  9.99995],
             [ 1.99999, 29.99985]], dtype=float32)
    """

    formattable = True

    _: dataclasses.KW_ONLY
    epsilon: float = 1e-5
    mean_decay: float = 0.1
    variance_decay: float = 0.1
    offset: jax.Array | None = learnable(default=None)
    scale: jax.Array | None = learnable(default=None)
    trained_mean: jax.Array | None = state(default=None)
    trained_variance: jax.Array | None = state(default=None)
    offset_initializer: Any = "zeros"
    scale_initializer: Any = "ones"

    def __post_init__(self):
        self.epsilon = real(
            self,
            "epsilon",
            self.epsilon,
            low=0.0,
            open_low=True,
            expected="a positive number",
            fix="e.g. epsilon=1e-5 (MATLAB's default).",
        )
        for name in ("mean_decay", "variance_decay"):
            setattr(
                self,
                name,
                real(
                    self,
                    name,
                    getattr(self, name),
                    low=0.0,
                    high=1.0,
                    expected="a number in [0, 1]",
                    fix=f"e.g. {name}=0.1 (MATLAB's default).",
                ),
            )
        self.offset_initializer = init.check(
            self, "offset_initializer", self.offset_initializer, init.BIAS
        )
        self.scale_initializer = init.check(
            self, "scale_initializer", self.scale_initializer, init.BIAS
        )
        sizes = set()
        for name in ("offset", "scale", "trained_mean", "trained_variance"):
            value = array_or_none(self, name, getattr(self, name), (None,), "one value per channel")
            setattr(self, name, value)
            if value is not None:
                sizes.add(value.shape[0])
        if len(sizes) > 1:
            raise LayerError(
                f"{who(self)}: offset, scale, trained_mean and trained_variance must all have "
                f"one value per channel; got sizes {sorted(sizes)}. Fix: give them the same "
                "length (the number of channels)."
            )

    def _check_channels(self, channels: int, where: str) -> None:
        for name in ("offset", "scale", "trained_mean", "trained_variance"):
            value = getattr(self, name)
            if value is not None and value.shape[0] != channels:
                raise LayerError(
                    f"{who(self)}: {where} has {channels} channels but {name} has "
                    f"{value.shape[0]} values. Fix: give {name} one value per channel, or leave "
                    "it None so that initialize fills it."
                )

    def initialize(self, layout, *, key):
        layout = layout_format(self, layout, lambda f: "C" in f, want="a format with a 'C' axis")
        channels = known_size(self, layout, "C", "number of channels")
        self._check_channels(channels, f"the input layout {layout!r}")
        k_offset, k_scale = jax.random.split(key)
        shape = (channels,)
        changes = {}
        if self.offset is None:
            changes["offset"] = init.draw(
                self, "offset_initializer", self.offset_initializer, k_offset, shape, 1, 1
            )
        if self.scale is None:
            changes["scale"] = init.draw(
                self, "scale_initializer", self.scale_initializer, k_scale, shape, 1, 1
            )
        if self.trained_mean is None:
            changes["trained_mean"] = jnp.zeros(shape, jnp.float32)
        if self.trained_variance is None:
            changes["trained_variance"] = jnp.ones(shape, jnp.float32)
        return self.replace(**changes) if changes else self

    def _prepare(self, x):
        require(self, "offset", "scale", "trained_mean", "trained_variance")
        data, fmt = data_and_format(x)
        axis = channel_axis(self, fmt, data.ndim)
        if data.ndim < 2:
            raise FormatError(
                f"{who(self)} needs observations besides the channel axis; got format {fmt!r} "
                f"and shape {tuple(data.shape)}. Fix: add a batch axis 'B'."
            )
        self._check_channels(data.shape[axis], "the input")
        return data, fmt, axis

    def _normalize(self, x, data, fmt, axis, mean, variance):
        dtype = jnp.result_type(data, self.offset, self.scale, mean, variance)
        shape = lambda v: per_channel(v.astype(dtype), data.ndim, axis)  # noqa: E731
        inv = jax.lax.rsqrt(shape(variance) + jnp.asarray(self.epsilon, dtype))
        y = (data.astype(dtype) - shape(mean)) * (shape(self.scale) * inv) + shape(self.offset)
        return relabel(x, y, fmt)

    def predict(self, x):
        data, fmt, axis = self._prepare(x)
        y = self._normalize(x, data, fmt, axis, self.trained_mean, self.trained_variance)
        return y, self.trained_mean, self.trained_variance

    def forward(self, x):
        data, fmt, axis = self._prepare(x)
        axes = tuple(i for i in range(data.ndim) if i != axis)
        mean = jnp.mean(data, axis=axes)
        variance = jnp.var(data, axis=axes)
        y = self._normalize(x, data, fmt, axis, mean, variance)
        m = math.prod(data.shape[i] for i in axes)
        unbiased = jax.lax.stop_gradient(variance) * (m / max(m - 1, 1))
        running_mean, running_variance = self.trained_mean, self.trained_variance
        new_mean = self.mean_decay * jax.lax.stop_gradient(mean) + (
            1 - self.mean_decay
        ) * running_mean.astype(mean.dtype)
        new_variance = self.variance_decay * unbiased + (
            1 - self.variance_decay
        ) * running_variance.astype(variance.dtype)
        return (
            y,
            new_mean.astype(running_mean.dtype),
            new_variance.astype(running_variance.dtype),
        )

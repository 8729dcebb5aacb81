"""Normalization layers over ``df.ops``: ``BatchNorm``, ``LayerNorm``, ``GroupNorm``,
``InstanceNorm`` (MATLAB's ``batchNormalizationLayer``, ``layerNormalizationLayer``,
``groupNormalizationLayer`` and ``instanceNormalizationLayer``).

All four have a per-channel ``offset`` and ``scale``, MATLAB's ``epsilon``, initializers and
learn-rate/L2 factor options; they share those checks here.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Self

import jax
import jax.numpy as jnp

from .. import ops
from .._core import Data, FormatError, LayerError, Layout, Output
from .._layer import Layer, learnable, state
from . import _factor_options as factor_options
from . import _initializers as init
from ._checks import (
    array_or_none,
    bad_argument,
    channel_axis,
    choice,
    data_and_format,
    known_size,
    layout_format,
    real,
    relabel,
    require,
    who,
)


def _plain_format(ndim: int) -> str:
    """Plain inputs have their channels last and (with two axes or more) observations first."""
    return "C" if ndim == 1 else "B" + "U" * (ndim - 2) + "C"


class _PerChannel(Layer):
    """What the normalization layers share: offset, scale, epsilon, factors (never used alone)."""

    formattable = True
    _factor_options: ClassVar = factor_options.offset_scale()
    _parameters: ClassVar[tuple[str, ...]] = ("offset", "scale")

    def _check_per_channel_options(self) -> None:
        self.epsilon: float = real(
            self,
            "epsilon",
            self.epsilon,
            low=0.0,
            open_low=True,
            expected="a positive number",
            fix="e.g. epsilon=1e-5 (MATLAB's default).",
        )
        init.check_options(self, {"offset": init.BIAS, "scale": init.BIAS})
        sizes = set()
        for name in self._parameters:
            value = array_or_none(self, name, getattr(self, name), (None,), "one value per channel")
            setattr(self, name, value)
            if value is not None:
                sizes.add(value.shape[0])
        if len(sizes) > 1:
            raise LayerError(
                f"{who(self)}: {', '.join(self._parameters)} must all have one value per "
                f"channel; got sizes {sorted(sizes)}. Fix: give them the same length (the "
                "number of channels)."
            )
        factor_options.record(self, self._factor_options)

    def _check_channels(self, channels: int, where: str) -> None:
        for name in self._parameters:
            value = getattr(self, name)
            if value is not None and value.shape[0] != channels:
                raise LayerError(
                    f"{who(self)}: {where} has {channels} channels but {name} has "
                    f"{value.shape[0]} values. Fix: give {name} one value per channel, or leave "
                    "it None so that initialize fills it."
                )

    def initialize(self, layout: Layout, *, key: jax.Array) -> Self:
        layout = layout_format(self, layout, lambda f: "C" in f, want="a format with a 'C' axis")
        channels = known_size(self, layout, "C", "number of channels")
        self._check_channels(channels, f"the input layout {layout!r}")
        self._check_layout(layout, channels)
        k_offset, k_scale = jax.random.split(key)
        shape = (channels,)
        return init.fill(
            self,
            [("offset", k_offset, shape, 1, 1), ("scale", k_scale, shape, 1, 1)],
            **self._initial_states(channels),
        )

    def _check_layout(self, layout, channels: int) -> None:
        del layout, channels

    def _initial_states(self, channels: int) -> dict:
        """The state fields that are still ``None``, with their initial values."""
        del channels
        return {}

    def _prepare(self, x):
        require(self, *self._parameters)
        data, fmt = data_and_format(x)
        fmt = fmt or _plain_format(data.ndim)
        axis = channel_axis(self, fmt, data.ndim)
        self._check_channels(data.shape[axis], "the input")
        return data, fmt


class BatchNorm(_PerChannel):
    r"""Batch normalization over every axis but ``C`` (MATLAB's ``batchNormalizationLayer``).

    Works on any format with a ``C`` axis (``"BSSC"``, ``"BC"``, ``"BTC"``, ...); the output has the
    input's format. A plain input has its channels on the last axis.

    Training (``forward``) normalizes with the mini-batch statistics $\mu_B, \sigma_B^2$
    (the biased variance, over every axis but ``C``):
    $y = \gamma (x - \mu_B) / \sqrt{\sigma_B^2 + \epsilon} + \beta$, and returns the
    updated running statistics with MATLAB's rule
    ``trained_mean = mean_decay * mu_B + (1 - mean_decay) * trained_mean`` and
    ``trained_variance = variance_decay * s2 + (1 - variance_decay) * trained_variance``, where
    ``s2`` is the **unbiased** batch variance $\sigma_B^2 \cdot m / (m - 1)$ (``m`` values
    per channel; ``s2 = sigma_B^2`` when ``m = 1``). MATLAB's documentation gives the update
    rule without naming the estimator; the unbiased one is the batch-normalization paper's
    estimate of the population variance, also used by PyTorch. Inference (``predict``)
    normalizes with ``trained_mean`` and ``trained_variance`` and returns them unchanged. The
    running statistics carry no gradient and keep their dtype.

    Learnables ``offset`` ($\beta$, zeros) and ``scale`` ($\gamma$, ones); state
    ``trained_mean`` (zeros) and ``trained_variance`` (ones); all of shape ``(C,)``.

    Args:
      epsilon: added to the variance (default 1e-5).
      mean_decay, variance_decay: the decays of the running statistics, in [0, 1] (default 0.1).
      offset, scale, trained_mean, trained_variance: initial values, ``None`` until
        ``initialize``.
      offset_initializer: ``"zeros"`` (default), ``"ones"``, ``"narrow-normal"`` or a function.
      scale_initializer: ``"ones"`` (default), ``"zeros"``, ``"narrow-normal"`` or a function.
      offset_learn_rate_factor, offset_l2_factor, scale_learn_rate_factor, scale_l2_factor:
        multiply the global learn rate and L2 regularization for ``offset`` and ``scale``
        (default 1 each, as MATLAB's).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> import difffn as df
      >>> layer = df.layers.BatchNorm()
      >>> layer = layer.initialize(df.Layout((None, 2), "BC"), key=jax.random.key(0))
      >>> layer.trained_mean, layer.trained_variance
      (Array([0., 0.], dtype=float32), Array([1., 1.], dtype=float32))
      >>> x = df.dlarray(jnp.array([[0.0, 10.0], [2.0, 30.0]]), "BC")
      >>> y, mean, variance = layer.forward(x)  # training: the batch statistics
      >>> jnp.round(y.data, 4)
      Array([[-1., -1.],
             [ 1.,  1.]], dtype=float32)
      >>> mean, variance  # 0.1 * batch + 0.9 * running; unbiased batch variances 2 and 200
      (Array([0.1, 2. ], dtype=float32), Array([ 1.1, 20.9], dtype=float32))
      >>> y, mean, variance = layer(x)  # predict: the trained statistics, returned unchanged
      >>> [[round(v, 3) for v in row] for row in y.data.tolist()]  # x / sqrt(1 + epsilon)
      [[0.0, 10.0], [2.0, 30.0]]
    """

    _parameters: ClassVar[tuple[str, ...]] = ("offset", "scale", "trained_mean", "trained_variance")

    _: dataclasses.KW_ONLY
    epsilon: float = 1e-5
    mean_decay: float = 0.1
    variance_decay: float = 0.1
    offset: jax.Array = learnable(default=None)
    scale: jax.Array = learnable(default=None)
    trained_mean: jax.Array = state(default=None)
    trained_variance: jax.Array = state(default=None)
    offset_initializer: Any = "zeros"
    scale_initializer: Any = "ones"
    offset_learn_rate_factor: float = 1.0
    offset_l2_factor: float = 1.0
    scale_learn_rate_factor: float = 1.0
    scale_l2_factor: float = 1.0

    def __post_init__(self) -> None:
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
        self._check_per_channel_options()

    def _initial_states(self, channels: int) -> dict:
        states = {}
        if self.trained_mean is None:
            states["trained_mean"] = jnp.zeros((channels,), jnp.float32)
        if self.trained_variance is None:
            states["trained_variance"] = jnp.ones((channels,), jnp.float32)
        return states

    def _prepare(self, x):
        data, fmt = super()._prepare(x)
        if data.ndim < 2:
            raise FormatError(
                f"{who(self)} needs observations besides the channel axis; got format {fmt!r} "
                f"and shape {tuple(data.shape)}. Fix: add a batch axis 'B'."
            )
        return data, fmt

    def _batchnorm(self, x, training: bool):
        data, fmt = self._prepare(x)
        result = ops.batchnorm(
            data,
            self.offset,
            self.scale,
            self.trained_mean,
            self.trained_variance,
            training=training,
            epsilon=self.epsilon,
            mean_decay=self.mean_decay,
            variance_decay=self.variance_decay,
            fmt=fmt,
        )
        if training:
            y, mean, variance = result
            return relabel(x, y, fmt), mean, variance
        return relabel(x, result, fmt), self.trained_mean, self.trained_variance

    def predict(self, x: Data) -> Output:
        return self._batchnorm(x, training=False)

    def forward(self, x: Data) -> Output:
        return self._batchnorm(x, training=True)


_COMMON_ARGS = """
      offset, scale: $\\beta$ and $\\gamma$, shape ``(C,)``; ``None`` until
        ``initialize``.
      offset_initializer: ``"zeros"`` (default), ``"ones"``, ``"narrow-normal"`` or a function.
      scale_initializer: ``"ones"`` (default), ``"zeros"``, ``"narrow-normal"`` or a function.
      offset_learn_rate_factor, offset_l2_factor, scale_learn_rate_factor, scale_l2_factor:
        multiply the global learn rate and L2 regularization (default 1 each, as MATLAB's)."""


class LayerNorm(_PerChannel):
    r"""Layer normalization, per observation (MATLAB's ``layerNormalizationLayer``).

    Normalizes each observation (and time step) over the axes ``operation_dimension`` names
    (see ``df.ops.layernorm``): by default (``"auto"``) over ``S`` and ``C`` for images and over
    ``C`` for sequences and features. Then scales and shifts per channel. Any format with a
    ``C`` axis; the output has the input's format. A plain input has its channels last (and
    ``"auto"`` normalizes over them only).

    Args:
      epsilon: added to the variance (default 1e-5).
      operation_dimension: ``"auto"`` (default), ``"channel-only"``, ``"spatial-channel"`` or
        ``"batch-excluded"``."""

    __doc__ = (
        (__doc__ or "")
        + _COMMON_ARGS
        + """

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> import difffn as df
      >>> layer = df.layers.LayerNorm()
      >>> layer = layer.initialize(df.Layout((None, None, 3), "BTC"), key=jax.random.key(0))
      >>> layer.offset, layer.scale
      (Array([0., 0., 0.], dtype=float32), Array([1., 1., 1.], dtype=float32))
      >>> y = layer(df.dlarray(jnp.array([[[1.0, 2.0, 3.0]]]), "BTC"))
      >>> y.format, jnp.round(y.data, 3)
      ('BTC', Array([[[-1.225,  0.   ,  1.225]]], dtype=float32))
    """
    )

    _: dataclasses.KW_ONLY
    epsilon: float = 1e-5
    operation_dimension: str = "auto"
    offset: jax.Array = learnable(default=None)
    scale: jax.Array = learnable(default=None)
    offset_initializer: Any = "zeros"
    scale_initializer: Any = "ones"
    offset_learn_rate_factor: float = 1.0
    offset_l2_factor: float = 1.0
    scale_learn_rate_factor: float = 1.0
    scale_l2_factor: float = 1.0

    def __post_init__(self) -> None:
        self.operation_dimension = choice(
            self,
            "operation_dimension",
            self.operation_dimension,
            ("auto", "channel-only", "spatial-channel", "batch-excluded"),
        )
        self._check_per_channel_options()

    def _check_layout(self, layout, channels: int) -> None:
        if self.operation_dimension == "batch-excluded" and "B" not in layout.format:
            raise FormatError(
                f"{who(self)}.initialize: operation_dimension='batch-excluded' normalizes each "
                f"observation, but the input layout {layout!r} has no 'B' axis. Fix: add a "
                "batch axis, or use operation_dimension='auto'."
            )

    def predict(self, x: Data) -> Output:
        data, fmt = self._prepare(x)
        y = ops.layernorm(
            data,
            self.offset,
            self.scale,
            epsilon=self.epsilon,
            operation_dimension=self.operation_dimension,
            fmt=fmt,
        )
        return relabel(x, y, fmt)


class GroupNorm(_PerChannel):
    r"""Group normalization, per observation (MATLAB's ``groupNormalizationLayer``).

    Splits the channels into ``num_groups`` groups of consecutive channels and normalizes each
    observation's groups over their channels and every ``S``, ``T`` and ``U`` axis; then scales
    and shifts per channel. Any format with a ``C`` axis; the output has the input's format. A
    plain input has its observations first and its channels last.

    Args:
      num_groups: a positive int that divides the channels, ``"all-channels"`` (one group: layer
        normalization over everything but ``B``) or ``"channel-wise"`` (one group per channel:
        instance normalization).
      epsilon: added to the variance (default 1e-5)."""

    __doc__ = (
        (__doc__ or "")
        + _COMMON_ARGS
        + """

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> import difffn as df
      >>> layer = df.layers.GroupNorm(2)
      >>> layer = layer.initialize(df.Layout((None, 4, 4, 6), "BSSC"), key=jax.random.key(0))
      >>> layer(df.dlarray(jnp.ones((2, 4, 4, 6)), "BSSC")).shape
      (2, 4, 4, 6)
    """
    )

    num_groups: Any
    _: dataclasses.KW_ONLY
    epsilon: float = 1e-5
    offset: jax.Array = learnable(default=None)
    scale: jax.Array = learnable(default=None)
    offset_initializer: Any = "zeros"
    scale_initializer: Any = "ones"
    offset_learn_rate_factor: float = 1.0
    offset_l2_factor: float = 1.0
    scale_learn_rate_factor: float = 1.0
    scale_l2_factor: float = 1.0

    def __post_init__(self) -> None:
        if not (
            isinstance(self.num_groups, str) and self.num_groups in ("all-channels", "channel-wise")
        ):
            if not (
                isinstance(self.num_groups, int)
                and not isinstance(self.num_groups, bool)
                and self.num_groups > 0
            ):
                raise bad_argument(
                    self,
                    "num_groups",
                    "a positive int, 'all-channels' or 'channel-wise'",
                    self.num_groups,
                    "e.g. GroupNorm(4) for 4 groups of channels.",
                )
        self._check_per_channel_options()

    def _groups(self, channels: int, where: str) -> int:
        named = {"all-channels": 1, "channel-wise": channels}
        groups = named[self.num_groups] if self.num_groups in named else self.num_groups
        if channels % groups:
            raise LayerError(
                f"{who(self)}: {where} has {channels} channels, which cannot be split into "
                f"num_groups={groups} equal groups. Fix: use a number of groups that divides "
                f"{channels}."
            )
        return groups

    def _check_layout(self, layout, channels: int) -> None:
        self._groups(channels, f"the input layout {layout!r}")

    def predict(self, x: Data) -> Output:
        data, fmt = self._prepare(x)
        groups = self._groups(data.shape[fmt.index("C")], "the input")
        y = ops.groupnorm(data, groups, self.offset, self.scale, epsilon=self.epsilon, fmt=fmt)
        return relabel(x, y, fmt)


class InstanceNorm(_PerChannel):
    r"""Instance normalization (MATLAB's ``instanceNormalizationLayer``).

    Normalizes each observation's channels over every ``S``, ``T`` and ``U`` axis, then scales
    and shifts per channel. Any format with a ``C`` axis; the output has the input's format. A
    plain input has its observations first and its channels last.

    Args:
      epsilon: added to the variance (default 1e-5)."""

    __doc__ = (
        (__doc__ or "")
        + _COMMON_ARGS
        + """

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> import difffn as df
      >>> layer = df.layers.InstanceNorm()
      >>> layer = layer.initialize(df.Layout((None, 3, 2), "BSC"), key=jax.random.key(0))
      >>> y = layer(df.dlarray(jnp.array([[[1.0, 5.0], [2.0, 5.0], [3.0, 5.0]]]), "BSC"))
      >>> jnp.round(y.data[0], 3)
      Array([[-1.225,  0.   ],
             [ 0.   ,  0.   ],
             [ 1.225,  0.   ]], dtype=float32)
    """
    )

    _: dataclasses.KW_ONLY
    epsilon: float = 1e-5
    offset: jax.Array = learnable(default=None)
    scale: jax.Array = learnable(default=None)
    offset_initializer: Any = "zeros"
    scale_initializer: Any = "ones"
    offset_learn_rate_factor: float = 1.0
    offset_l2_factor: float = 1.0
    scale_learn_rate_factor: float = 1.0
    scale_l2_factor: float = 1.0

    def __post_init__(self) -> None:
        self._check_per_channel_options()

    def predict(self, x: Data) -> Output:
        data, fmt = self._prepare(x)
        y = ops.instancenorm(data, self.offset, self.scale, epsilon=self.epsilon, fmt=fmt)
        return relabel(x, y, fmt)

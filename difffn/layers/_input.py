"""Input layers: ``ImageInput``, ``FeatureInput`` and ``SequenceInput``.

An input layer knows the layout of the network input it receives (``input_layout``), labels plain
data with that format, checks sizes, and normalizes the data like MATLAB's input layers.

Statistics. ``"zerocenter"`` needs ``mean``, ``"zscore"`` needs ``mean`` and
``standard_deviation``, ``"rescale-symmetric"`` and ``"rescale-zero-one"`` need ``min`` and
``max``. Those still ``None`` are computed from training data by ``with_statistics(x)`` (which
``trainnet`` calls). As in MATLAB since R2019b (``NormalizationDimension="auto"``), computed
statistics are **per channel** (shape ``(C,)``), not the per-pixel "mean image" of older
releases; ``normalization_dimension="element"`` gives per-element statistics (shape
``(h, w, c)`` for images) and ``"all"`` one scalar. Statistics you pass may have any shape that
broadcasts against one observation (``()``, ``(c,)``, ``(1, 1, c)``, ``(h, w, c)``).
Statistics are plain (non-trained) array properties. A zero standard deviation or a zero
``max - min`` range is replaced by 1, so constant channels map to a constant instead of NaN.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Self

import jax
import jax.numpy as jnp
import numpy as np

from .._core import Data, FormatError, LayerError, Layout, Output, dlarray
from .._layer import InputLayer
from ._checks import as_float_array, bad_argument, data_and_format, positive_int, who

NORMALIZATIONS = ("zerocenter", "zscore", "rescale-symmetric", "rescale-zero-one", "none")
DIMENSIONS = ("auto", "channel", "element", "all")
_NEEDS = {
    "zerocenter": ("mean",),
    "zscore": ("mean", "standard_deviation"),
    "rescale-symmetric": ("min", "max"),
    "rescale-zero-one": ("min", "max"),
    "none": (),
}
_STATISTICS = ("mean", "standard_deviation", "min", "max")


class _NormalizingInput(InputLayer):
    """Normalization shared by the three input layers (a private base)."""

    formattable = True
    _FORMAT = ""  # the input format, set by each subclass

    def _observation_shape(self) -> tuple[int | None, ...]:
        """One observation's shape (the layout without B; T is None for sequences)."""
        raise NotImplementedError

    def _check_options(self) -> None:
        # Fields that each subclass declares (in its own order), typed here for these methods.
        self.normalization: Any
        self.normalization_dimension: str
        if not callable(self.normalization) and self.normalization not in NORMALIZATIONS:
            options = " | ".join(repr(n) for n in NORMALIZATIONS)
            raise bad_argument(
                self,
                "normalization",
                f"one of {options} or a function fn(x) -> x",
                self.normalization,
                "use one of those names, e.g. normalization='none' for no normalization.",
            )
        if self.normalization_dimension not in DIMENSIONS:
            options = " | ".join(repr(n) for n in DIMENSIONS)
            raise bad_argument(
                self,
                "normalization_dimension",
                f"one of {options}",
                self.normalization_dimension,
                f"pick one of {options}.",
            )
        observation = tuple(1 if n is None else n for n in self._observation_shape())
        for name in _STATISTICS:
            value = getattr(self, name)
            if value is None:
                continue
            array = as_float_array(self, name, value)
            stat_shape = tuple(
                n for n, label in zip(observation, self._FORMAT[1:], strict=True) if label != "T"
            )
            try:
                ok = array.ndim <= len(stat_shape) and (
                    np.broadcast_shapes(array.shape, stat_shape) == stat_shape
                )
            except ValueError:
                ok = False
            if not ok:
                raise bad_argument(
                    self,
                    name,
                    f"a scalar or an array that broadcasts against one observation of shape "
                    f"{stat_shape} (e.g. per channel {stat_shape[-1:]})",
                    array,
                    f"reshape it, or leave {name}=None so that with_statistics (trainnet) "
                    "computes it.",
                )
            object.__setattr__(self, name, array)

    # -- the InputLayer interface -------------------------------------------------------------

    @property
    def input_layout(self) -> Layout:
        return Layout((None, *self._observation_shape()), self._FORMAT)

    def needs_statistics(self) -> bool:
        if callable(self.normalization):
            return False
        return any(getattr(self, n) is None for n in _NEEDS[self.normalization])

    def with_statistics(self, x: Data) -> Self:
        """A layer whose statistics still ``None`` are computed from the sample ``x``.

        Args:
          x: training inputs in this layer's format (formatted or plain), e.g. the whole
            training set.
        """
        if not self.needs_statistics():
            return self
        data, fmt = self._check_input(x)
        if not jnp.issubdtype(data.dtype, jnp.floating):
            data = data.astype(jnp.float32)
        dimension = self.normalization_dimension
        if dimension in ("auto", "channel"):
            axes = tuple(i for i, label in enumerate(fmt) if label != "C")
        elif dimension == "element":
            axes = tuple(i for i, label in enumerate(fmt) if label in "BT")
        else:
            axes = tuple(range(data.ndim))
        reducers = {
            "mean": jnp.mean,
            "standard_deviation": jnp.std,
            "min": jnp.min,
            "max": jnp.max,
        }
        changes = {}
        for name in _NEEDS[self.normalization]:
            if getattr(self, name) is None:
                changes[name] = reducers[name](data, axis=axes)
        return self.replace(**changes)

    # -- running -----------------------------------------------------------------------------

    def _check_input(self, x) -> tuple[jax.Array, str]:
        data, fmt = data_and_format(x)
        expected = self._FORMAT
        if fmt and fmt != expected:
            fix = (
                f"reorder it with df.permute(x, {expected!r})"
                if sorted(fmt) == sorted(expected)
                else f"give it the format {expected!r}"
            )
            raise FormatError(
                f"{who(self)} receives data with format {expected!r}; got {fmt!r} (shape "
                f"{tuple(data.shape)}). Fix: {fix}."
            )
        observation = self._observation_shape()
        if data.ndim != len(expected) or any(
            n is not None and n != m for n, m in zip(observation, data.shape[1:], strict=True)
        ):
            want = ", ".join("any" if n is None else str(n) for n in (None, *observation))
            raise LayerError(
                f"{who(self)} expects input of shape ({want}) in format {expected!r}; got shape "
                f"{tuple(data.shape)}. Fix: pass data of that size, or build the layer with the "
                "data's size."
            )
        return data, expected

    def _statistic(self, name: str, ndim: int):
        value = getattr(self, name)
        if value is None:
            raise LayerError(
                f"{who(self)}: normalization {self.normalization!r} needs {name!r}, which is "
                "None. trainnet computes it from the training data; outside trainnet call "
                f"layer = layer.with_statistics(x_train), or pass {name}=... to the "
                "constructor, or use normalization='none'."
            )
        value = jnp.asarray(value)
        return jnp.reshape(value, (1,) * (ndim - value.ndim) + value.shape)

    def predict(self, x: Data) -> Output:
        data, fmt = self._check_input(x)
        if not jnp.issubdtype(data.dtype, jnp.floating):
            data = data.astype(jnp.float32)
        # Plain data gets the input format: the input layer is where a network's data is labeled.
        return dlarray(self._normalize(data), fmt)

    def _normalize(self, data):
        method = self.normalization
        if callable(method):
            return jnp.asarray(method(data))
        if method == "none":
            return data
        ndim = data.ndim
        if method == "zerocenter":
            return data - self._statistic("mean", ndim)
        if method == "zscore":
            std = self._statistic("standard_deviation", ndim)
            return (data - self._statistic("mean", ndim)) / jnp.where(std == 0, 1, std)
        low, high = self._statistic("min", ndim), self._statistic("max", ndim)
        span = high - low
        scaled = (data - low) / jnp.where(span == 0, 1, span)
        return 2 * scaled - 1 if method == "rescale-symmetric" else scaled


class ImageInput(_NormalizingInput):
    """MATLAB's ``imageInputLayer``: 2-D images in format ``"BSSC"`` (NHWC).

    Plain input is labeled ``"BSSC"``; its size must be ``(batch, h, w, c)``. Integer images are
    converted to float32. See the module docstring for the statistics.

    Args:
      input_size: ``(h, w, c)``, or ``(h, w)`` for one channel.
      normalization: ``"zerocenter"`` (MATLAB's default: subtract ``mean``), ``"zscore"``,
        ``"rescale-symmetric"`` (to [-1, 1]), ``"rescale-zero-one"`` (to [0, 1]), ``"none"``,
        or a function ``fn(x) -> x``.
      normalization_dimension: ``"auto"`` (= ``"channel"``), ``"channel"``, ``"element"`` or
        ``"all"``: the shape of the statistics that ``with_statistics`` computes.
      mean, standard_deviation, min, max: the statistics; ``None`` until computed.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> layer = df.layers.ImageInput((2, 2, 1))
      >>> layer.input_layout
      Layout((None, 2, 2, 1), 'BSSC')
      >>> x = jnp.arange(8.0).reshape(2, 2, 2, 1)
      >>> layer = layer.with_statistics(x)
      >>> layer.mean
      Array([3.5], dtype=float32)
      >>> y = layer(x)
      >>> y.format, y.data[0, :, :, 0]
      ('BSSC', Array([[-3.5, -2.5],
             [-1.5, -0.5]], dtype=float32))
    """

    _FORMAT = "BSSC"

    input_size: tuple[int, ...]
    _: dataclasses.KW_ONLY
    normalization: Any = "zerocenter"
    normalization_dimension: str = "auto"
    mean: Any = None
    standard_deviation: Any = None
    min: Any = None
    max: Any = None

    def __post_init__(self) -> None:
        size = self.input_size
        if isinstance(size, (tuple, list)) and len(size) == 2:
            size = (*size, 1)
        if not (
            isinstance(size, (tuple, list))
            and len(size) == 3
            and all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in size)
        ):
            raise bad_argument(
                self,
                "input_size",
                "(height, width, channels) or (height, width), positive ints",
                self.input_size,
                "e.g. ImageInput((28, 28, 1)).",
            )
        self.input_size = tuple(int(n) for n in size)
        self._check_options()

    def _observation_shape(self):
        return self.input_size


class FeatureInput(_NormalizingInput):
    """MATLAB's ``featureInputLayer``: feature vectors in format ``"BC"``.

    Args:
      num_features: the number of features (``C``).
      normalization: ``"none"`` (MATLAB's default for feature input), ``"zerocenter"``,
        ``"zscore"``, ``"rescale-symmetric"``, ``"rescale-zero-one"``, or ``fn(x) -> x``.
      normalization_dimension: ``"auto"``/``"channel"``/``"element"`` (per feature) or ``"all"``.
      mean, standard_deviation, min, max: the statistics; ``None`` until computed.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> layer = df.layers.FeatureInput(3, normalization="zscore")
      >>> layer.input_layout
      Layout((None, 3), 'BC')
      >>> layer = layer.with_statistics(jnp.array([[0.0, 1.0, 2.0], [2.0, 3.0, 6.0]]))
      >>> layer(jnp.array([[1.0, 3.0, 4.0]])).data
      Array([[0., 1., 0.]], dtype=float32)
    """

    _FORMAT = "BC"

    num_features: int
    _: dataclasses.KW_ONLY
    normalization: Any = "none"
    normalization_dimension: str = "auto"
    mean: Any = None
    standard_deviation: Any = None
    min: Any = None
    max: Any = None

    def __post_init__(self) -> None:
        self.num_features = positive_int(
            self, "num_features", self.num_features, fix="e.g. FeatureInput(10)."
        )
        self._check_options()

    def _observation_shape(self):
        return (self.num_features,)


class SequenceInput(_NormalizingInput):
    """MATLAB's ``sequenceInputLayer`` for vector sequences: format ``"BTC"``.

    Statistics are per channel over batch and time.

    Args:
      input_size: the number of channels (``C``) per time step.
      min_length: the shortest sequence accepted (MATLAB's ``MinLength``, default 1). A network
        initializes its layers on sequences of this length, so every layer must run on it (a
        ``Conv1D(5, ...)`` needs 5 steps): otherwise building the network is a
        ``df.NetworkError`` naming the layer and the shortest length the network runs on.
      normalization: ``"none"`` (MATLAB's default for sequences), ``"zerocenter"``, ``"zscore"``,
        ``"rescale-symmetric"``, ``"rescale-zero-one"``, or ``fn(x) -> x``.
      normalization_dimension: ``"auto"``/``"channel"``/``"element"`` (per channel) or ``"all"``.
      mean, standard_deviation, min, max: the statistics; ``None`` until computed.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> layer = df.layers.SequenceInput(2)
      >>> layer.input_layout
      Layout((None, None, 2), 'BTC')
      >>> layer(jnp.ones((4, 7, 2))).format
      'BTC'
    """

    _FORMAT = "BTC"

    input_size: int
    _: dataclasses.KW_ONLY
    min_length: int = 1
    normalization: Any = "none"
    normalization_dimension: str = "auto"
    mean: Any = None
    standard_deviation: Any = None
    min: Any = None
    max: Any = None

    def __post_init__(self) -> None:
        self.input_size = positive_int(
            self, "input_size", self.input_size, fix="e.g. SequenceInput(12) for 12 channels."
        )
        self.min_length = positive_int(
            self, "min_length", self.min_length, fix="e.g. min_length=1 (the default)."
        )
        self._check_options()

    def _observation_shape(self):
        return (None, self.input_size)

    def _check_input(self, x):
        data, fmt = super()._check_input(x)
        if data.shape[1] < self.min_length:
            raise LayerError(
                f"{who(self)}: the sequences have length {data.shape[1]} but min_length is "
                f"{self.min_length}. Fix: pad the sequences to at least {self.min_length} "
                "steps, or lower min_length."
            )
        return data, fmt

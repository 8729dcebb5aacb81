"""Embedding layers: ``Embedding`` (MATLAB's ``wordEmbeddingLayer``), ``PositionEmbedding``
(``positionEmbeddingLayer``) and ``SinusoidalPositionEncoding``
(``sinusoidalPositionEncodingLayer``)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Self

import jax
import jax.numpy as jnp

from .._core import Data, FormatError, LayerError, Layout, OpError, Output
from .._layer import Layer, learnable
from ..ops._embedding import as_indices, embed
from . import _factor_options as factors
from . import _initializers as init
from ._checks import (
    array_or_none,
    bad_argument,
    choice,
    data_and_format,
    layout_format,
    positive_int,
    relabel,
    require,
    who,
)


class _Table(Layer):
    """What ``Embedding`` and ``PositionEmbedding`` share (never used alone).

    A learned table ``weights``, one vector per row, with its initializer and two factor options;
    a subclass names the fields that hold the number of rows and of columns.
    """

    formattable = True
    _factor_options: ClassVar = {
        "weight_learn_rate_factor": (factors.LEARN_RATE, ("weights",)),
        "weight_l2_factor": (factors.L2, ("weights",)),
    }
    _rows_and_columns: ClassVar[tuple[str, str]]

    def _table_shape(self) -> tuple[int, int]:
        return tuple(getattr(self, n) for n in self._rows_and_columns)

    def _check_table(self) -> None:
        """Check the initializer, a given table and the factor options (``__post_init__``)."""
        init.check_options(self, {"weights": init.RECURRENT})
        what = ", ".join(self._rows_and_columns)
        self.weights: jax.Array = array_or_none(
            self, "weights", self.weights, self._table_shape(), what
        )
        factors.record(self, self._factor_options)

    def _draw_table(self, key):
        """The layer with ``weights`` drawn if it is still ``None`` (fans: its two sizes)."""
        shape = self._table_shape()
        return init.fill(self, [("weights", key, shape, *shape)])


class Embedding(_Table):
    """Word embedding: one learned vector per word index (MATLAB's ``wordEmbeddingLayer``).

    Input: word indices, 0-based (MATLAB's start at 1), integers or floats holding integers (as
    ``SequenceInput`` delivers them; they are rounded), in any format: a ``C`` axis of size 1
    (``"BTC"`` from ``SequenceInput(1)``) becomes the embedding axis, otherwise ``C`` is
    appended (``"BT"`` -> ``"BTC"``). A plain input is ``(batch, time)`` or
    ``(batch, time, 1)``. Output: the vectors, ``C`` of size ``dimension``.

    Learnable: ``weights`` ``(num_words, dimension)`` (MATLAB's ``Dimension x NumWords``
    transposed; the layout of flax's ``nnx.Embed``).

    Args:
      dimension: the length of each vector.
      num_words: the vocabulary size: indices ``0 .. num_words - 1``.
      oov_mode: ``"map-to-last"`` (default: an index outside the vocabulary, negative or
        ``>= num_words``, gets the last vector) or ``"error"`` (such an index is a
        ``df.LayerError`` when the values are known, and a NaN vector under ``jit``).
      weights: the learnable; ``None`` until ``initialize``.
      weights_initializer: ``"narrow-normal"`` (default), ``"glorot"`` (fans ``num_words`` and
        ``dimension``), ``"he"``, ``"orthogonal"``, ``"zeros"``, ``"ones"`` or a function.
      weight_learn_rate_factor, weight_l2_factor: multiply the global learn rate and L2
        regularization (default 1).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> import difffn as df
      >>> layer = df.layers.Embedding(4, 10)
      >>> layer = layer.initialize(df.Layout((None, None, 1), "BTC"), key=jax.random.key(0))
      >>> y = layer(df.dlarray(jnp.array([[[3.0], [9.0], [12.0]]]), "BTC"))
      >>> y.format, y.shape, bool(jnp.array_equal(y.data[0, 2], layer.weights[9]))
      ('BTC', (1, 3, 4), True)
    """

    _rows_and_columns: ClassVar[tuple[str, str]] = ("num_words", "dimension")

    dimension: int
    num_words: int
    _: dataclasses.KW_ONLY
    oov_mode: str = "map-to-last"
    weights: jax.Array = learnable(default=None)
    weights_initializer: Any = "narrow-normal"
    weight_learn_rate_factor: float = 1.0
    weight_l2_factor: float = 1.0

    def __post_init__(self) -> None:
        self.dimension = positive_int(
            self, "dimension", self.dimension, fix="e.g. Embedding(100, num_words)."
        )
        self.num_words = positive_int(
            self, "num_words", self.num_words, fix="e.g. Embedding(dimension, 5000)."
        )
        choice(self, "oov_mode", self.oov_mode, ("map-to-last", "error"))
        self._check_table()

    def initialize(self, layout: Layout, *, key: jax.Array) -> Self:
        layout = layout_format(
            self,
            layout,
            lambda f: "C" not in f or layout.size("C") in (1, None),
            want="word indices: no 'C' axis, or one of size 1 (e.g. 'BTC' from SequenceInput(1))",
        )
        return self._draw_table(key)

    def predict(self, x: Data) -> Output:
        require(self, "weights")
        data, fmt = data_and_format(x)
        if not fmt:
            if data.ndim not in (2, 3):
                raise FormatError(
                    f"{who(self)} takes plain indices as (batch, time) or (batch, time, 1); got "
                    f"shape {tuple(data.shape)}. Fix: label them with df.dlarray(x, fmt)."
                )
            fmt = "BT" if data.ndim == 2 else "BTC"
        indices = as_indices(data)
        if self.oov_mode == "map-to-last":
            outside = (indices < 0) | (indices >= self.num_words)
            indices = jnp.where(outside, self.num_words - 1, indices)
        try:
            y = embed(indices, self.weights, fmt=fmt)
        except (OpError, FormatError) as error:
            raise type(error)(f"{who(self)}: {error}") from None
        return relabel(x, y, fmt if "C" in fmt else fmt + "C")


def _position_axis(fmt: str, dimension: str) -> int | None:
    """The axis whose positions are embedded, or ``None`` (MATLAB's ``"auto"`` rules)."""
    if dimension in ("auto", "temporal", "temporal-indices") and "T" in fmt:
        return fmt.index("T")
    if dimension in ("auto", "spatial", "spatial-indices") and fmt.count("S") == 1:
        return fmt.index("S")
    return None


def _positions_want(dimension: str) -> str:
    if dimension.startswith("temporal"):
        return "a 'T' axis and a 'C' axis"
    if dimension.startswith("spatial"):
        return "exactly one 'S' axis (1-D images) and a 'C' axis"
    return "a 'C' axis and a 'T' axis, or exactly one 'S' axis"


def _place(table, shape, fmt: str, axis: int):
    """Broadcast a ``(positions, channels)`` table to ``shape`` along ``axis`` and ``C``."""
    c = fmt.index("C")
    channels = table.shape[1]
    expanded = [1] * len(shape)
    expanded[axis], expanded[c] = shape[axis], channels
    out_shape = list(shape)
    out_shape[c] = channels
    return jnp.broadcast_to(jnp.reshape(table if axis < c else table.T, expanded), out_shape)


class PositionEmbedding(_Table):
    """Learned position embedding (MATLAB's ``positionEmbeddingLayer``).

    Maps each position along the sequence (``T``) or the one spatial axis (``S``, 1-D images)
    to a learned vector; the output has the input's format with ``output_size`` channels and
    does not depend on the input's values (add it to the input with ``Addition``). Positions are
    ``0 .. length - 1``; a sequence longer than ``max_position`` is an error.

    Learnable: ``weights`` ``(max_position, output_size)`` (MATLAB's
    ``OutputSize x MaxPosition`` transposed).

    Args:
      output_size: the channels of the output.
      max_position: the longest sequence (or spatial size) the layer takes.
      position_dimension: ``"auto"`` (default: ``T`` if the input has it, else its one ``S``),
        ``"temporal"`` or ``"spatial"``.
      weights: the learnable; ``None`` until ``initialize``.
      weights_initializer: ``"narrow-normal"`` (default), ``"glorot"``, ``"he"``,
        ``"orthogonal"``, ``"zeros"``, ``"ones"`` or a function.
      weight_learn_rate_factor, weight_l2_factor: multiply the global learn rate and L2
        regularization (default 1).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> import difffn as df
      >>> layer = df.layers.PositionEmbedding(4, 10)
      >>> layer = layer.initialize(df.Layout((None, None, 4), "BTC"), key=jax.random.key(0))
      >>> y = layer(df.dlarray(jnp.zeros((2, 6, 4)), "BTC"))
      >>> y.format, y.shape, bool(jnp.array_equal(y.data[1], layer.weights[:6]))
      ('BTC', (2, 6, 4), True)
    """

    _rows_and_columns: ClassVar[tuple[str, str]] = ("max_position", "output_size")

    output_size: int
    max_position: int
    _: dataclasses.KW_ONLY
    position_dimension: str = "auto"
    weights: jax.Array = learnable(default=None)
    weights_initializer: Any = "narrow-normal"
    weight_learn_rate_factor: float = 1.0
    weight_l2_factor: float = 1.0

    def __post_init__(self) -> None:
        self.output_size = positive_int(
            self, "output_size", self.output_size, fix="e.g. PositionEmbedding(64, 512)."
        )
        self.max_position = positive_int(
            self, "max_position", self.max_position, fix="e.g. PositionEmbedding(64, 512)."
        )
        choice(self, "position_dimension", self.position_dimension, ("auto", "temporal", "spatial"))
        self._check_table()

    def _axis(self, fmt: str, where: str) -> int:
        axis = _position_axis(fmt, self.position_dimension) if "C" in fmt else None
        if axis is None:
            raise FormatError(
                f"{who(self)}: {where} has format {fmt!r}; with position_dimension="
                f"{self.position_dimension!r} it needs {_positions_want(self.position_dimension)}"
                ". Fix: relabel the axes, or pick position_dimension."
            )
        return axis

    def initialize(self, layout: Layout, *, key: jax.Array) -> Self:
        layout = layout_format(self, layout, lambda f: True, want="")
        self._axis(layout.format, f"the input layout {layout!r}")
        return self._draw_table(key)

    def predict(self, x: Data) -> Output:
        require(self, "weights")
        data, fmt = data_and_format(x)
        if not fmt:
            fmt = "BTC" if data.ndim == 3 else ""
        axis = self._axis(fmt, "the input")
        length = data.shape[axis]
        if length > self.max_position:
            raise LayerError(
                f"{who(self)}: the input has {length} positions along {fmt[axis]!r} but "
                f"max_position is {self.max_position}. Fix: a larger max_position, or shorter "
                "sequences."
            )
        return relabel(x, _place(self.weights[:length], data.shape, fmt, axis), fmt)


class SinusoidalPositionEncoding(Layer):
    r"""Fixed sinusoidal position encoding (MATLAB's ``sinusoidalPositionEncodingLayer``).

    For a position $p$ and channels $k = 0 .. d/2 - 1$ (``d = output_size``):
    channel $2k$ is $\sin(p / 10000^{2k/d})$ and channel $2k + 1$ is
    $\cos(p / 10000^{2k/d})$ ("Attention is all you need", section 3.5). With index
    positions the output has the input's format with ``d`` channels, the same for every
    observation (add it to the input with ``Addition``); positions are ``0 .. length - 1``.
    With ``positions="data-values"`` the input's values are the positions: a ``C`` axis of size
    1 becomes the ``d`` channels. No learnables.

    Args:
      output_size: ``d``, an even positive int.
      positions: ``"auto"`` (default: the ``T`` indices if the input has ``T``, else the indices
        of its one ``S`` axis, else the data values), ``"temporal-indices"``,
        ``"spatial-indices"`` or ``"data-values"``.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> layer = df.layers.SinusoidalPositionEncoding(4)
      >>> y = layer(df.dlarray(jnp.zeros((1, 3, 4)), "BTC"))
      >>> y.format, jnp.round(y.data[0, 1], 4).tolist()  # position 1: sin 1, cos 1, ...
      ('BTC', [0.8415, 0.5403, 0.01, 1.0])
    """

    formattable = True

    output_size: int
    _: dataclasses.KW_ONLY
    positions: str = "auto"

    def __post_init__(self) -> None:
        self.output_size = positive_int(
            self, "output_size", self.output_size, fix="e.g. SinusoidalPositionEncoding(64)."
        )
        if self.output_size % 2:
            raise bad_argument(
                self,
                "output_size",
                "an even positive int (sine and cosine channels in pairs)",
                self.output_size,
                f"use {self.output_size + 1}.",
            )
        choice(
            self,
            "positions",
            self.positions,
            ("auto", "temporal-indices", "spatial-indices", "data-values"),
        )

    def _axis(self, fmt: str, shape, where: str) -> int | None:
        """The index axis, or ``None`` for data values (whose ``C`` must have size 1)."""
        if self.positions != "data-values" and "C" in fmt:
            axis = _position_axis(fmt, self.positions)
            if axis is not None or self.positions != "auto":
                if axis is None:
                    raise FormatError(
                        f"{who(self)}: {where} has format {fmt!r}; positions="
                        f"{self.positions!r} needs {_positions_want(self.positions)}. Fix: "
                        "relabel the axes, or positions='auto'."
                    )
                return axis
        if "C" not in fmt or shape[fmt.index("C")] not in (1, None):
            raise FormatError(
                f"{who(self)}: {where} has format {fmt!r} and shape {tuple(shape)}; position "
                "values need a 'C' axis of size 1 (index positions need a 'T' or one 'S' "
                "axis). Fix: relabel the axes."
            )
        return None

    def initialize(self, layout: Layout, *, key: jax.Array) -> Self:
        layout = layout_format(self, layout, lambda f: True, want="")
        self._axis(layout.format, layout.shape, f"the input layout {layout!r}")
        return self

    def encode(self, positions: jax.Array) -> jax.Array:
        """The ``(..., output_size)`` encoding of an array of positions."""
        half = self.output_size // 2
        dtype = positions.dtype
        rates = jnp.exp(-math.log(10000.0) * 2.0 * jnp.arange(half, dtype=dtype) / self.output_size)
        angles = positions[..., None] * jnp.reshape(rates, (1,) * positions.ndim + (half,))
        pairs = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1)
        return pairs.reshape(*positions.shape, self.output_size)

    def predict(self, x: Data) -> Output:
        data, fmt = data_and_format(x)
        if not fmt:
            fmt = "BTC" if data.ndim == 3 else ""
        axis = self._axis(fmt, data.shape, "the input")
        dtype = data.dtype if jnp.issubdtype(data.dtype, jnp.floating) else jnp.float32
        if axis is None:
            c = fmt.index("C")
            y = jnp.moveaxis(self.encode(jnp.squeeze(data.astype(dtype), c)), -1, c)
            return relabel(x, y, fmt)
        table = self.encode(jnp.arange(data.shape[axis], dtype=dtype))
        return relabel(x, _place(table, data.shape, fmt, axis), fmt)

"""``FullyConnected``: MATLAB's ``fullyConnectedLayer``."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Self

import jax

from .. import ops
from .._core import Data, FormatError, LayerError, Layout, Output
from .._layer import learnable
from . import _initializers as init
from ._checks import data_and_format, layout_format, positive_int, relabel, require, who
from ._weights_and_bias import WeightsAndBias


def _input_size(layer, layout) -> int:
    """The number of features: the product of the S, C and U sizes of the layout."""
    sizes = [n for n, label in zip(layout.shape, layout.format, strict=True) if label not in "BT"]
    if any(n is None for n in sizes):
        raise LayerError(
            f"{who(layer)}.initialize needs the sizes of the 'S', 'C' and 'U' axes of its input "
            f"(their product is the number of input features); {layout!r} leaves some unknown. "
            "Fix: give them in the layout."
        )
    size = 1
    for n in sizes:
        size *= n
    return size


class FullyConnected(WeightsAndBias):
    r"""Fully connected layer, $y = x W + b$ (MATLAB's ``fullyConnectedLayer``).

    The ``S``, ``C`` and ``U`` axes are flattened into ``C`` in storage order (row-major, the last
    axis fastest) and ``B`` and ``T`` are kept, in their order: ``"BSSC" -> "BC"``,
    ``"BC" -> "BC"``, ``"BTC" -> "BTC"``, ``"TBC" -> "TBC"``. A plain input is taken to be
    batch-first: axis 0 is kept and the rest are flattened. (MATLAB flattens its column-major
    ``"SSCB"`` arrays in another order: weights imported from MATLAB must be reordered.)

    Learnables: ``weights`` of shape ``(input_size, output_size)`` (MATLAB's ``Weights``
    transposed) and ``bias`` of shape ``(output_size,)``.

    Args:
      output_size: the number of output features.
      weights, bias: the learnables; ``None`` until ``initialize``.
      weights_initializer: ``"glorot"`` (default), ``"he"``, ``"orthogonal"``,
        ``"narrow-normal"``, ``"zeros"``, ``"ones"``, or a function: ``fn(key, shape, dtype)``
        (JAX's form) or ``fn(sz)`` (MATLAB's ``@(sz)``), ``shape``/``sz`` being
        ``(input_size, output_size)``.
      bias_initializer: ``"zeros"`` (default), ``"ones"``, ``"narrow-normal"`` or a function.
      weight_learn_rate_factor, weight_l2_factor, bias_learn_rate_factor, bias_l2_factor:
        multiply the global learn rate and L2 regularization for ``weights`` and ``bias``
        (defaults 1, 1, 1 and 0, as MATLAB's); ``df.set_learn_rate_factor`` sets them too.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> import difffn as df
      >>> layer = df.layers.FullyConnected(10)
      >>> layer = layer.initialize(df.Layout((None, 4, 4, 3), "BSSC"), key=jax.random.key(0))
      >>> layer.weights.shape
      (48, 10)
      >>> y = layer(df.dlarray(jnp.ones((2, 4, 4, 3)), "BSSC"))
      >>> y.format, y.shape
      ('BC', (2, 10))
    """

    _outputs: ClassVar[str] = "output_size"
    _weights_initializers: ClassVar[tuple[str, ...]] = init.DENSE

    output_size: int
    _: dataclasses.KW_ONLY
    weights: jax.Array = learnable(default=None)
    bias: jax.Array = learnable(default=None, l2_factor=0.0)  # MATLAB: BiasL2Factor 0
    weights_initializer: Any = "glorot"
    bias_initializer: Any = "zeros"
    weight_learn_rate_factor: float = 1.0
    weight_l2_factor: float = 1.0
    bias_learn_rate_factor: float = 1.0
    bias_l2_factor: float = 0.0

    def __post_init__(self) -> None:
        self.output_size = positive_int(
            self, "output_size", self.output_size, fix="e.g. FullyConnected(10)."
        )
        self._check_weights_and_bias((None, self.output_size), "input_size, output_size")

    def _check_features(self, features: int, where: str) -> None:
        if self.weights is not None and self.weights.shape[0] != features:
            raise LayerError(
                f"{who(self)}: {where} has {features} features (the product of its S, C and U "
                f"sizes) but weights has shape {tuple(self.weights.shape)}, expecting "
                f"{self.weights.shape[0]}. Fix: give weights of shape ({features}, "
                f"{self.output_size}), or leave weights=None."
            )

    def initialize(self, layout: Layout, *, key: jax.Array) -> Self:
        layout = layout_format(self, layout, lambda f: True, want="any format")
        features = _input_size(self, layout)
        self._check_features(features, f"the input layout {layout!r}")
        return self._draw_weights_and_bias(
            key, (features, self.output_size), fan_in=features, fan_out=self.output_size
        )

    def predict(self, x: Data) -> Output:
        require(self, "weights", "bias")
        data, fmt = data_and_format(x)
        if not fmt:  # plain data is batch-first: axis 0 is kept, the others are flattened
            fmt = ("B" + "U" * (data.ndim - 1))[: data.ndim]
        features = [n for n, label in zip(data.shape, fmt, strict=True) if label not in "BT"]
        if not features:
            raise FormatError(
                f"{who(self)} flattens the 'S', 'C' and 'U' axes into features, but its input "
                f"(format {fmt!r}, shape {tuple(data.shape)}) has none. Fix: label the feature "
                "axis 'C'."
            )
        self._check_features(math.prod(features), "the input")
        y = ops.fully_connect(data, self.weights, self.bias, fmt=fmt)
        return relabel(x, y, "".join(label for label in fmt if label in "BT") + "C")

"""``Flatten``: MATLAB's ``flattenLayer``."""

from __future__ import annotations

from .._core import Data, Output
from .._layer import Layer
from ._checks import data_and_format, flatten_features, relabel


class Flatten(Layer):
    """Flatten the ``S``, ``C`` and ``U`` axes into ``C``, keeping ``B`` and ``T``.

    Storage order (row-major): ``"BSSC"`` of shape ``(n, h, w, c)`` becomes ``"BC"`` of shape
    ``(n, h * w * c)``; ``"BTSSC" -> "BTC"``; ``"BC"`` is unchanged. A plain input is taken to be
    batch-first: axis 0 is kept and the rest are flattened.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> y = df.layers.Flatten()(df.dlarray(jnp.zeros((2, 3, 4, 5)), "BSSC"))
      >>> y.format, y.shape
      ('BC', (2, 60))
    """

    formattable = True

    def predict(self, x: Data) -> Output:
        data, fmt = data_and_format(x)
        y, out_fmt = flatten_features(self, data, fmt)
        return relabel(x, y, out_fmt)

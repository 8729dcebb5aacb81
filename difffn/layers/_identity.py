"""``Identity``: MATLAB's ``identityLayer``."""

from __future__ import annotations

from .._core import Data, Output
from .._layer import Layer


class Identity(Layer):
    """Returns its input unchanged (MATLAB's ``identityLayer``); any format.

    Useful as a named junction in a graph (a skip connection's start, a placeholder to replace).

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> df.layers.Identity()(df.dlarray(jnp.ones((2, 3)), "BC")).format
      'BC'
    """

    def predict(self, x: Data) -> Output:
        return x

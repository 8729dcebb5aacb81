"""Activation layers: ``ReLU``, ``ELU`` and ``Softmax``."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .._layer import Layer
from ._checks import channel_axis, data_and_format, real, relabel


class ReLU(Layer):
    """Rectified linear unit, ``max(x, 0)`` (MATLAB's ``reluLayer``); any format.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> df.layers.ReLU()(jnp.array([-1.0, 2.0]))
      Array([0., 2.], dtype=float32)
    """

    def predict(self, x):
        return jax.nn.relu(x)


class ELU(Layer):
    r"""Exponential linear unit (MATLAB's ``eluLayer``); any format.

    :math:`y = x` for :math:`x > 0`, :math:`\alpha (e^x - 1)` otherwise. ``alpha`` is a fixed
    (not learnable) positive number, default 1, as in MATLAB.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> df.layers.ELU(alpha=2.0)(jnp.array([-1.0, 2.0]))
      Array([-1.2642411,  2.       ], dtype=float32)
    """

    alpha: float = 1.0

    def __post_init__(self):
        self.alpha = real(
            self,
            "alpha",
            self.alpha,
            low=0.0,
            open_low=True,
            expected="a positive finite number",
            fix="e.g. ELU(alpha=1.0) (MATLAB's default).",
        )

    def predict(self, x):
        return jax.nn.elu(x, self.alpha)


class Softmax(Layer):
    """Softmax over the channel axis ``C`` (MATLAB's ``softmaxLayer``); any format with ``C``.

    ``C`` may be at any position (``"BC"``, ``"CB"``, ``"BSSC"``: per pixel); a plain input has
    its channels on the last axis.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> df.layers.Softmax()(df.dlarray(jnp.array([[0.0], [0.0]]), "CB")).data
      Array([[0.5],
             [0.5]], dtype=float32)
    """

    formattable = True

    def predict(self, x):
        data, fmt = data_and_format(x)
        axis = channel_axis(self, fmt, data.ndim)
        if not jnp.issubdtype(data.dtype, jnp.floating):
            data = data.astype(jnp.float32)
        return relabel(x, jax.nn.softmax(data, axis=axis), fmt)

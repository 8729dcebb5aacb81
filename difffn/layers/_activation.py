"""Activation layers over ``df.ops``: ``ReLU``, ``LeakyReLU``, ``ClippedReLU``, ``ELU``, ``GELU``,
``Swish``, ``Sigmoid``, ``Tanh`` (elementwise, any format) and ``Softmax`` (over ``C``)."""

from __future__ import annotations

from .. import ops
from .._core import Data, Output
from .._layer import Layer
from ._checks import channel_axis, choice, data_and_format, real, relabel


class ReLU(Layer):
    """Rectified linear unit, ``max(x, 0)`` (MATLAB's ``reluLayer``); any format.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> df.layers.ReLU()(jnp.array([-1.0, 2.0]))
      Array([0., 2.], dtype=float32)
    """

    def predict(self, x: Data) -> Output:
        return ops.relu(x)


class LeakyReLU(Layer):
    """Leaky ReLU: ``x`` where positive, ``scale * x`` elsewhere (MATLAB's ``leakyReluLayer``).

    Args:
      scale: the slope for negative inputs, a finite number; default 0.01 (MATLAB's).

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> df.layers.LeakyReLU(0.1)(jnp.array([-2.0, 3.0]))
      Array([-0.2,  3. ], dtype=float32)
    """

    scale: float = 0.01

    def __post_init__(self) -> None:
        self.scale = real(
            self,
            "scale",
            self.scale,
            expected="a finite number",
            fix="e.g. LeakyReLU(0.01) (MATLAB's default).",
        )

    def predict(self, x: Data) -> Output:
        return ops.leaky_relu(x, self.scale)


class ClippedReLU(Layer):
    """Clipped ReLU, ``min(max(x, 0), ceiling)`` (MATLAB's ``clippedReluLayer``).

    Args:
      ceiling: the largest output, a positive number (required, as in MATLAB).

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> df.layers.ClippedReLU(6.0)(jnp.array([-1.0, 2.0, 9.0]))
      Array([0., 2., 6.], dtype=float32)
    """

    ceiling: float

    def __post_init__(self) -> None:
        self.ceiling = real(
            self,
            "ceiling",
            self.ceiling,
            low=0.0,
            open_low=True,
            expected="a positive finite number",
            fix="e.g. ClippedReLU(6) (ReLU6).",
        )

    def predict(self, x: Data) -> Output:
        return ops.clipped_relu(x, self.ceiling)


class ELU(Layer):
    r"""Exponential linear unit (MATLAB's ``eluLayer``); any format.

    $y = x$ for $x > 0$, $\alpha (e^x - 1)$ otherwise. ``alpha`` is a fixed
    (not learnable) positive number, default 1, as in MATLAB.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> df.layers.ELU(alpha=2.0)(jnp.array([-1.0, 2.0]))
      Array([-1.2642411,  2.       ], dtype=float32)
    """

    alpha: float = 1.0

    def __post_init__(self) -> None:
        self.alpha = real(
            self,
            "alpha",
            self.alpha,
            low=0.0,
            open_low=True,
            expected="a positive finite number",
            fix="e.g. ELU(alpha=1.0) (MATLAB's default).",
        )

    def predict(self, x: Data) -> Output:
        return ops.elu(x, self.alpha)


class GELU(Layer):
    r"""Gaussian error linear unit, $x \Phi(x)$ (MATLAB's ``geluLayer``); any format.

    Args:
      approximation: ``"none"`` (default: exact, with ``erf``) or ``"tanh"``.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> jnp.round(df.layers.GELU()(jnp.array([-1.0, 1.0])), 4)
      Array([-0.1587,  0.8413], dtype=float32)
    """

    approximation: str = "none"

    def __post_init__(self) -> None:
        self.approximation = choice(self, "approximation", self.approximation, ("none", "tanh"))

    def predict(self, x: Data) -> Output:
        return ops.gelu(x, approximation=self.approximation)


class Swish(Layer):
    r"""Swish, $x \sigma(x)$ (MATLAB's ``swishLayer``); any format.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> df.layers.Swish()(jnp.array([0.0, 1.0]))
      Array([0.       , 0.7310586], dtype=float32)
    """

    def predict(self, x: Data) -> Output:
        return ops.swish(x)


class Sigmoid(Layer):
    r"""Logistic sigmoid, $1 / (1 + e^{-x})$ (MATLAB's ``sigmoidLayer``); any format.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> df.layers.Sigmoid()(jnp.array([0.0]))
      Array([0.5], dtype=float32)
    """

    def predict(self, x: Data) -> Output:
        return ops.sigmoid(x)


class Tanh(Layer):
    """Hyperbolic tangent (MATLAB's ``tanhLayer``); any format.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> df.layers.Tanh()(jnp.array([0.0]))
      Array([0.], dtype=float32)
    """

    def predict(self, x: Data) -> Output:
        return ops.tanh(x)


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

    def predict(self, x: Data) -> Output:
        data, fmt = data_and_format(x)
        axis = channel_axis(self, fmt, data.ndim)
        fmt = fmt or "U" * axis + "C"
        return relabel(x, ops.softmax(data, fmt=fmt), fmt)

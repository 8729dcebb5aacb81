"""What layers with ``weights`` and a ``bias`` share: ``Conv1D/2D/3D``, ``TransposedConv2D``,
``FullyConnected``.

Their initializer options (``weights_initializer``, ``bias_initializer``), the checks of given
``weights`` and ``bias``, MATLAB's four factor options and the drawing of the parameters that
are still ``None`` are written here once. The fields themselves stay in each layer class: a
dataclass lists a base class's fields first, and each layer's field order is its public
signature and its ``repr``.
"""

from __future__ import annotations

from typing import ClassVar

import jax

from .._layer import Layer
from . import _factor_options as factor_options
from . import _initializers as init
from ._checks import array_or_none


class WeightsAndBias(Layer):
    """Base of the layers with ``weights`` and a ``bias`` of one value per output channel.

    A subclass declares the fields ``weights``, ``bias``, ``weights_initializer``,
    ``bias_initializer`` and the options of ``factor_options.conv_like()``, and names the field
    that holds the number of output channels in ``_outputs``.
    """

    formattable = True
    _factor_options: ClassVar = factor_options.conv_like()
    _outputs: ClassVar[str]
    # the weights initializer names MATLAB lists for the layer (fullyConnectedLayer adds
    # "orthogonal" to the convolutions' list)
    _weights_initializers: ClassVar[tuple[str, ...]] = init.WEIGHTS

    def _check_weights_and_bias(self, weights_shape: tuple, weights_what: str) -> None:
        """Check the initializers, given values and factor options (call in ``__post_init__``).

        Args:
          weights_shape: the shape ``weights`` must have (``None``: any size).
          weights_what: what its axes are, for the error message.
        """
        init.check_options(self, {"weights": self._weights_initializers, "bias": init.BIAS})
        self.weights: jax.Array = array_or_none(
            self, "weights", self.weights, weights_shape, weights_what
        )
        outputs = getattr(self, self._outputs)
        self.bias: jax.Array = array_or_none(self, "bias", self.bias, (outputs,), self._outputs)
        factor_options.record(self, self._factor_options)

    def _draw_weights_and_bias(self, key, weights_shape: tuple, fan_in: int, fan_out: int):
        """The layer with ``weights`` and ``bias`` drawn where they are still ``None``."""
        k_weights, k_bias = jax.random.split(key)
        bias_shape = (getattr(self, self._outputs),)
        return init.fill(
            self,
            [
                ("weights", k_weights, weights_shape, fan_in, fan_out),
                ("bias", k_bias, bias_shape, fan_in, fan_out),
            ],
        )

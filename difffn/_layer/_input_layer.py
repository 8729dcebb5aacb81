"""``InputLayer``: the base of the layers that start a network and know its input layout."""

from __future__ import annotations

from typing import Any, Self

from .._core import Data
from ._layer import Layer


class InputLayer(Layer):
    """Base of input layers (``ImageInput``, ``FeatureInput``, ``SequenceInput``).

    An input layer starts a network: it has one input, which is a network input, and it knows
    that input's layout (``input_layout``), so the network needs no example data to initialize.
    It may normalize its data with statistics that ``trainnet`` computes from the training data
    (``with_statistics``).
    """

    @property
    def input_layout(self) -> Any:
        """The ``df.Layout`` of the network input this layer receives (batch size ``None``)."""
        raise NotImplementedError

    def with_statistics(self, x: Data) -> Self:
        """A layer whose normalization statistics still ``None`` are computed from ``x``.

        ``x`` is a (large) sample of training inputs with this layer's format. The default has no
        statistics and returns the layer unchanged.
        """
        del x
        return self

    def needs_statistics(self) -> bool:
        """Whether ``with_statistics`` would change anything (trainnet then computes them)."""
        return False

"""``Placeholder``: a stand-in for an operation that could not be imported (MATLAB's
placeholder layers of ``importNetworkFromONNX``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from .._core import Data, LayerError, Output
from .._layer import Layer
from ._checks import who


class Placeholder(Layer):
    """A layer that keeps a network's shape where an imported operation is missing.

    ``df.import_onnx(path, placeholders=True)`` puts one in place of every ONNX node it cannot
    import. It has the node's inputs and outputs, remembers the operator, its attributes and
    its constant inputs, and raises a ``df.LayerError`` when the network runs, until it is
    replaced: ``net = net.replace_layer(name, layer)`` with a layer of the same name and ports
    that takes ``input_formats`` and returns ``output_formats``.

    Args:
      op_type: the operation it stands for (e.g. the ONNX operator type).
      reason: why it was not imported.
      attributes: the operation's attributes, ``((name, value), ...)``.
      constants: its constant inputs by name (arrays; not trained).
      input_formats, output_formats: the difffn formats its replacement takes and returns.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> layer = df.layers.Placeholder("Custom", reason="no implementation", name="n1")
      >>> layer(jnp.ones(3))
      Traceback (most recent call last):
      ...
      difffn.LayerError: Placeholder (layer 'n1') stands for the operation ...
    """

    formattable = True

    op_type: str = ""
    _: dataclasses.KW_ONLY
    reason: str = ""
    attributes: tuple[tuple[str, Any], ...] = ()
    constants: Any = None
    input_formats: tuple[str, ...] = ()
    output_formats: tuple[str, ...] = ()

    def predict(self, *inputs: Data) -> Output:
        reason = f" ({self.reason})" if self.reason else ""
        formats = ""
        if self.input_formats or self.output_formats:
            formats = (
                f" that takes formats {list(self.input_formats)} and returns "
                f"{list(self.output_formats)}"
            )
        raise LayerError(
            f"{who(self)} stands for the operation {self.op_type!r}{reason}, which was not "
            f"imported; it cannot run. Fix: net = net.replace_layer({self.name!r}, layer) "
            f"with a layer named {self.name!r}, inputs {list(self.input_names)} and outputs "
            f"{list(self.output_names)}{formats}."
        )

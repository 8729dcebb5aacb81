"""How messages and displays describe values and layers: one wording everywhere.

* `is_array`: whether a value is an array (concrete or traced), the one definition;
* `short`: ``float32[2, 3]`` for an array (``:BC`` added for a formatted one), ``tuple of
  2 arrays`` for a container of arrays, a short ``repr`` for anything else (layer ``repr``,
  parameter tables, ``Network.replace`` and trace-cache messages);
* `who`: ``"Conv2D (layer 'conv1')"``, or ``"Conv2D.predict (layer 'conv1')"`` with a
  method: how every message names a layer;
* `raised_at`: ``"my_layer.py:12, in predict"``, the user's line where an exception arose.
"""

from __future__ import annotations

import os
import traceback

import jax
import jax.numpy as jnp
import numpy as np

from ._format import FormattedArray

_MAX_REPR = 60
_LIBRARY_DIRS = (
    os.path.dirname(os.path.abspath(__file__)),
    os.path.dirname(os.path.abspath(jax.__file__)),
)


def is_array(value) -> bool:
    """Whether ``value`` is an array: a ``jax.Array`` (tracers included) or a NumPy array/scalar."""
    return isinstance(value, (jax.Array, np.ndarray, np.generic))


def short(value) -> str:
    """A one-line description: ``float32[2, 3]``, ``float32[4, 2]:BC``, or a short ``repr``.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> from difffn._core._describe import short
      >>> short(jnp.zeros((2, 3))), short(df.dlarray(jnp.zeros((4, 2)), "BC")), short("relu")
      ('float32[2, 3]', 'float32[4, 2]:BC', "'relu'")
    """
    if is_array(value) or isinstance(value, jax.ShapeDtypeStruct):
        return f"{jnp.result_type(value).name}{list(jnp.shape(value))}"
    if isinstance(value, FormattedArray):
        return f"{value.dtype.name}{list(value.shape)}:{value.format}"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, (tuple, list, dict)) and value:
        leaves = jax.tree.leaves(value)
        if leaves and all(is_array(leaf) for leaf in leaves):
            return f"{type(value).__name__} of {len(leaves)} arrays"
    text = repr(value)
    return text if len(text) <= _MAX_REPR else text[: _MAX_REPR - 3] + "..."


def who(layer, method: str | None = None) -> str:
    """How messages name a layer: ``"Conv2D (layer 'conv1')"``, ``"Conv2D.predict (layer ...)"``.

    Examples:
      >>> import difffn as df
      >>> from difffn._core._describe import who
      >>> who(df.layers.ReLU(name="relu1")), who(df.layers.ReLU(name="relu1"), "predict")
      ("ReLU (layer 'relu1')", "ReLU.predict (layer 'relu1')")
    """
    cls = type(layer).__name__
    return f"{cls}{'.' + method if method else ''} (layer {layer.name!r})"


def raised_at(error: BaseException) -> str | None:
    """``"my_layer.py:12, in predict"``: the innermost frame of ``error`` outside difffn and JAX.

    None when every frame is library code.
    """
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        path = os.path.abspath(frame.filename)
        if not path.startswith(_LIBRARY_DIRS) and "site-packages" not in path:
            return f"{os.path.basename(frame.filename)}:{frame.lineno}, in {frame.name}"
    return None

"""``learnable_mask``: which leaves of a model that holds difffn networks are trained.

A ``df.Network`` or ``df.Layer`` is an ordinary pytree, so equinox and optax see all of its
leaves, including state (BatchNorm statistics, LSTM states) and float constants (input
normalization statistics), which ``eqx.is_inexact_array`` also selects. Training code needs the
learnables only: this mask gives them (difffn's own kinds inside difffn objects, and
``eqx.is_inexact_array``'s rule elsewhere), for ``eqx.partition``/``eqx.filter`` and
``optax.masked``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._layer import Layer
from .._layer import learnable_mask as _difffn_mask
from .._network import Network


def _is_difffn(x) -> bool:
    return isinstance(x, (Network, Layer))


def _is_inexact_array(x) -> bool:
    """``eqx.is_inexact_array`` without importing equinox."""
    return isinstance(x, (jax.Array, np.ndarray)) and jnp.issubdtype(x.dtype, jnp.inexact)


def learnable_mask(tree: Any) -> Any:
    """A pytree like ``tree`` with ``True`` at the leaves to train, ``False`` elsewhere.

    Inside every ``df.Network`` / ``df.Layer`` of ``tree``, the learnables are ``True`` and the
    state and constants ``False``; elsewhere (an equinox module's own layers, say), a leaf is
    ``True`` when it is a floating-point array, as ``eqx.is_inexact_array`` decides. Use it as
    an equinox filter spec (``eqx.partition(model, df.interop.learnable_mask(model))``) or as
    the mask of ``optax.masked``.

    Args:
      tree: any pytree, e.g. an ``equinox.Module`` with a ``df.Network`` field.

    Returns:
      A pytree of bools with ``tree``'s structure.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> import difffn as df
      >>> net = df.Network([df.layers.FeatureInput(2, normalization="none", name="in"),
      ...                   df.layers.FullyConnected(3, name="fc"),
      ...                   df.layers.BatchNorm(name="bn")]).initialize(key=jax.random.key(0))
      >>> mask = df.interop.learnable_mask({"net": net, "head": jnp.ones(3)})
      >>> mask["net"].learnables["fc/weights"], mask["net"].state["bn/trained_mean"]
      (True, False)
      >>> mask["head"]
      True
    """
    return jax.tree.map(
        lambda x: _difffn_mask(x) if _is_difffn(x) else _is_inexact_array(x),
        tree,
        is_leaf=_is_difffn,
    )

"""``df.dlupdate``: MATLAB's ``dlupdate``, a function applied to every learnable.

For a network the function sees the learnables only (state and fixed properties stay), and the
extra arguments (networks of gradients, ``ParameterTable``s like ``net.learnables``, ...) are
matched to them leaf by leaf, as the custom-loop solvers (``df.sgdmupdate``) match theirs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from .._core import OptionsError
from .._network import Network
from ._solvers import _view


def _names(net) -> list[str]:
    """Each updated leaf's name for messages: its pytree path."""
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(net)[0]]
    if isinstance(net, Network):
        return [str(name) for name in net.learnables] if len(net.learnables) else paths
    return paths


def dlupdate(fn: Callable[..., Any], net: Any, *more: Any) -> Any:
    """Apply ``fn`` to every learnable (MATLAB's ``dlupdate``).

    ``fn(w, *others)`` is called once per learnable ``w``, with the matching value of each of
    ``more``; it returns the new value, or a tuple ``(new value, extra1, ...)``, as MATLAB's
    ``[net, Y1, ...] = dlupdate(fun, net, X1, ...)`` when ``fun`` has several outputs.

    Args:
      fn: the function of one learnable (and the matching values of ``more``).
      net: a ``df.Network`` (only its learnables are passed to ``fn``; state stays), a
        ``df.ParameterTable`` (e.g. ``net.learnables``) or any pytree of arrays.
      *more: values matched to ``net`` learnable by learnable: for a network, networks of the
        same structure (``jax.grad`` of a function of it) or tables like ``net.learnables``;
        otherwise pytrees of ``net``'s structure.

    Returns:
      ``net`` updated (same kind), or ``(net, extra1, ...)`` when ``fn`` returns tuples; each
      extra is a table like ``net.learnables`` for a network, else ``net``'s structure.

    Raises:
      OptionsError: ``fn`` is not callable, a value of ``more`` does not match ``net``, ``fn``
        raises (naming the learnable), or ``fn`` returns tuples of different lengths.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> import difffn as df
      >>> net = df.Network([df.layers.FeatureInput(2), df.layers.FullyConnected(1)])
      >>> net = net.initialize(key=jax.random.key(0))
      >>> halved = df.dlupdate(lambda w: w / 2, net)
      >>> bool(jnp.allclose(halved.layers[1].weights, net.layers[1].weights / 2))
      True
      >>> grads = jax.tree.map(jnp.ones_like, net)  # a network of gradients
      >>> stepped = df.dlupdate(lambda w, g: w - 0.1 * g, net, grads)
      >>> float(stepped.layers[1].bias[0])
      -0.1
    """
    who = "df.dlupdate"
    if not callable(fn):
        raise OptionsError(
            f"{who}: fn must be a function of one learnable (and the matching values of the "
            f"other arguments); got {type(fn).__name__}. Fix: e.g. df.dlupdate(lambda w: w * 0.5, "
            "net), as MATLAB's dlupdate(@(w) w * 0.5, net)."
        )
    view = _view(who, net)
    others = [view.to_leaves(value, f"argument {k + 3}") for k, value in enumerate(more)]
    names = _names(net)
    results = []
    for i, w in enumerate(view.params):
        try:
            results.append(fn(w, *(o[i] for o in others)))
        except Exception as error:
            name = names[i] if i < len(names) else f"#{i}"
            raise OptionsError(
                f"{who}: fn raised {type(error).__name__}: {error} on the learnable {name} "
                f"(shape {tuple(w.shape)}), called as fn(w{', ' * bool(others)}"
                f"{', '.join(f'x{k + 1}' for k in range(len(others)))}). Fix: fn takes one "
                "learnable and the matching value of each further argument."
            ) from error
    tupled = {isinstance(r, tuple) for r in results}
    if tupled != {True}:
        if True in tupled:
            raise OptionsError(
                f"{who}: fn returned a tuple for some learnables and a single value for "
                "others. Fix: return the same number of values for every learnable."
            )
        return view.params_out(results)
    lengths = {len(r) for r in results}
    if len(lengths) != 1:
        raise OptionsError(
            f"{who}: fn returned tuples of different lengths {sorted(lengths)}. Fix: return "
            "the same number of values for every learnable."
        )
    columns = list(zip(*results, strict=True))
    return (view.params_out(list(columns[0])), *(view.state_out(list(c)) for c in columns[1:]))

"""``to_nnx``: a difffn network as a flax.nnx module, trained with nnx's own tools.

The network's leaves become nnx variables in place (the network is a pytree, and nnx keeps
pytrees it finds in a module attribute marked ``nnx.data``): learnables are ``nnx.Param`` (what
``nnx.grad`` and ``nnx.Optimizer`` act on by default), state is ``nnx.BatchStat`` and
constants plain ``nnx.Variable``. Calling the module takes their values, runs the network
(``forward`` in training mode, ``predict`` with ``deterministic=True``, nnx's flag that
``module.eval()``/``nnx.view`` set) and writes the new state back into the ``BatchStat``
variables, as ``nnx.BatchNorm`` does.
"""

from __future__ import annotations

from typing import Any

import jax
from flax import nnx

from .._core import Data, NetworkError, Output, stripdims
from .._layer import LEARNABLE, STATE, leaf_kinds
from .._network import Network


def _is_variable(x) -> bool:
    return isinstance(x, nnx.Variable)


class NNXNetwork(nnx.Module):
    """A ``df.Network`` as an ``nnx.Module`` (made by [`to_nnx`][difffn.interop.to_nnx]).

    Attributes:
      network: the network, with nnx variables as its leaves: ``nnx.Param`` for learnables,
        ``nnx.BatchStat`` for state, ``nnx.Variable`` for constants. ``nnx.state(module)``
        shows them by layer and parameter.
      deterministic: ``False`` (default, nnx's training mode): calls run ``net.forward`` and
        update the state variables; ``True`` (``module.eval()``): calls run ``net.predict``.
      rngs: the random stream for training-time randomness (dropout), or None.
    """

    network: Any
    deterministic: bool
    rngs: Any

    def __init__(self, net: Network, *, rngs: Any = None, deterministic: bool = False) -> None:
        if not isinstance(net, Network):
            raise NetworkError(f"to_nnx expected a df.Network; got {type(net).__name__}.")
        if not net.initialized:
            raise NetworkError(
                "to_nnx: the network is not initialized. Fix: "
                "df.interop.to_nnx(net.initialize(key=jax.random.key(0)))."
            )
        wrap = {LEARNABLE: nnx.Param, STATE: nnx.BatchStat}
        leaves, treedef = jax.tree.flatten(net)
        variables = [wrap.get(k, nnx.Variable)(v) for k, v in zip(leaf_kinds(net), leaves)]
        self.network = nnx.data(jax.tree.unflatten(treedef, variables))
        self.deterministic = deterministic
        if isinstance(rngs, nnx.Rngs):
            rngs = rngs["dropout"].fork()
        elif isinstance(rngs, nnx.RngStream):
            rngs = rngs.fork()
        elif rngs is not None:
            raise NetworkError(
                f"to_nnx: rngs must be an nnx.Rngs, an nnx.RngStream or None; got "
                f"{type(rngs).__name__}."
            )
        self.rngs = nnx.data(rngs)

    def set_view(self, deterministic: bool | None = None) -> None:
        """Used by ``nnx.view``: ``deterministic=True`` selects inference (``predict``)."""
        if deterministic is not None:
            self.deterministic = deterministic

    def values(self) -> Network:
        """The network with the current values of the variables (a plain ``df.Network``)."""
        return jax.tree.map(lambda v: v.get_value(), self.network, is_leaf=_is_variable)

    def __call__(self, *inputs: Data, outputs: Any = None, rngs: Any = None) -> Output:
        """Run the network on ``inputs``; returns plain arrays, as nnx modules do.

        Args:
          *inputs: one array per network input (plain, or ``df.FormattedArray``).
          outputs: names of the outputs to return (default: the network outputs).
          rngs: randomness for this call (an ``nnx.Rngs``, ``nnx.RngStream`` or key); default:
            the module's ``rngs``. Only training-mode calls draw from it.
        """
        net = self.values()
        if self.deterministic:
            return stripdims(net.predict(*inputs, outputs=outputs))
        rngs = rngs if rngs is not None else self.rngs
        if isinstance(rngs, nnx.Rngs):
            key = rngs["dropout"]()
        elif isinstance(rngs, nnx.RngStream):
            key = rngs()
        else:
            key = rngs
        y, state = net.forward(*inputs, key=key, outputs=outputs)
        if len(state):
            updated = jax.tree.leaves(net.replace(state=state))
            for variable, value in zip(
                jax.tree.leaves(self.network, is_leaf=_is_variable), updated
            ):
                if isinstance(variable, nnx.BatchStat):
                    variable.set_value(value)
        return stripdims(y)


def to_nnx(net: Network, *, rngs: Any = None, deterministic: bool = False) -> NNXNetwork:
    """A difffn network as an ``nnx.Module``: nnx's gradients and optimizers train it.

    Its learnables are ``nnx.Param`` variables, so ``nnx.grad``, ``nnx.value_and_grad`` and
    ``nnx.Optimizer(model, tx, wrt=nnx.Param)`` train them, alone or as a part of a bigger nnx
    model; its state is ``nnx.BatchStat`` and updated by training-mode calls. ``model.train()``
    and ``model.eval()`` (or ``nnx.view(model, deterministic=...)``) switch between
    ``net.forward`` and ``net.predict``. Calls return plain arrays. The trained network is
    ``model.values()``.

    Args:
      net: an initialized ``df.Network``.
      rngs: an ``nnx.Rngs`` (its ``"dropout"`` stream, or its default) or ``nnx.RngStream``
        for the network's training-time randomness (``df.layers.Dropout``).
      deterministic: start in inference mode.

    Returns:
      An [`NNXNetwork`][difffn.interop.NNXNetwork].

    Raises:
      NetworkError: ``net`` is not an initialized network, or ``rngs`` is of another type.

    Examples:
      >>> import jax, jax.numpy as jnp, optax
      >>> from flax import nnx
      >>> import difffn as df
      >>> net = df.Network([df.layers.FeatureInput(3, normalization="none", name="in"),
      ...                   df.layers.FullyConnected(2, name="fc")])
      >>> model = df.interop.to_nnx(net.initialize(key=jax.random.key(0)))
      >>> x, t = jnp.ones((4, 3)), jnp.zeros((4, 2))
      >>> loss = lambda m: jnp.mean((m(x) - t) ** 2)
      >>> optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
      >>> before = loss(model)
      >>> _ = optimizer.update(model, nnx.grad(loss)(model))
      >>> bool(loss(model) < before)
      True
      >>> model.values().learnables["fc/bias"].shape
      (2,)
    """
    return NNXNetwork(net, rngs=rngs, deterministic=deterministic)

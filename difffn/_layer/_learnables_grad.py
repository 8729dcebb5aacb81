"""``df.learnables_grad``: the gradient with respect to the learnables of a layer or network.

``jax.grad`` of a function of a layer differentiates every array leaf of the layer: learnables,
state and array properties alike, and JAX refuses a layer whose state holds an integer (a step
counter). ``learnables_grad`` differentiates only the learnables (``df.learnable()`` fields,
nested networks' included), as ``flax.nnx.grad`` differentiates ``nnx.Param`` and
``equinox.filter_grad`` the floating-point arrays; state and properties are constants, and
their places in the result hold ``None``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from .._core import LayerError
from ._fields import is_network
from ._layer import Layer
from ._parameters import learnable_mask


def learnables_grad(
    fun: Callable[..., Any], argnums: int | Sequence[int] = 0, *, has_aux: bool = False
) -> Callable[..., Any]:
    """Like ``jax.grad(fun, argnums)``, with respect to the learnables of layer and network
    arguments only.

    Args:
      fun: a function returning a scalar (and auxiliary data, with ``has_aux``).
      argnums: which positional arguments to differentiate. A layer or network is
        differentiated with respect to its learnables; any other argument with respect to its
        floating-point leaves.
      has_aux: as for ``jax.grad``.

    Returns:
      A function with ``fun``'s arguments returning the gradients (one per ``argnums`` entry,
      a tuple when ``argnums`` is a sequence), each shaped like its argument: a layer or
      network of gradients, with ``None`` in the place of state, properties and other leaves
      that are not differentiated. With ``has_aux``, ``(gradients, aux)``.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> import difffn as df
      >>> class Counted(df.Layer):
      ...     w: jax.Array | None = df.learnable(default=None)
      ...     steps: jax.Array | None = df.state(default=None)
      ...     def predict(self, x):
      ...         return x * self.w, self.steps + 1
      >>> layer = Counted(w=jnp.array(2.0), steps=jnp.array(0, jnp.int32))
      >>> g = df.learnables_grad(lambda layer, x: layer(x)[0].sum())(layer, jnp.ones(3))
      >>> g.w, g.steps
      (Array(3., dtype=float32), None)
    """
    single = isinstance(argnums, int)
    nums = (argnums,) if single else tuple(argnums)
    if not nums or not all(isinstance(i, int) and not isinstance(i, bool) for i in nums):
        raise LayerError(
            f"learnables_grad got argnums={argnums!r}; expected an int or a non-empty sequence "
            "of ints (positions of the arguments to differentiate), as for jax.grad."
        )

    @functools.wraps(fun)
    def gradient(*args, **kwargs):
        name = getattr(fun, "__name__", "the function")
        for i in nums:
            if not -len(args) <= i < len(args):
                raise LayerError(
                    f"learnables_grad(..., argnums={argnums!r}): {name} was called with "
                    f"{len(args)} positional argument(s), so there is no argument {i}. Fix: "
                    "pass the layer or network positionally, or change argnums."
                )
        splits = [_split(args[i]) for i in nums]

        def of_chosen(chosen):
            full = list(args)
            for i, (leaves, mask, tree), values in zip(nums, splits, chosen, strict=True):
                it = iter(values)
                full[i] = tree.unflatten([next(it) if m else x for x, m in zip(leaves, mask)])
            return fun(*full, **kwargs)

        chosen = [[x for x, m in zip(leaves, mask) if m] for leaves, mask, _ in splits]
        result = jax.grad(of_chosen, has_aux=has_aux)(chosen)
        grads, aux = result if has_aux else (result, None)
        out = []
        for (_, mask, tree), values in zip(splits, grads, strict=True):
            it = iter(values)
            out.append(tree.unflatten([next(it) if m else None for m in mask]))
        out = out[0] if single else tuple(out)
        return (out, aux) if has_aux else out

    return gradient


def _split(value):
    """(leaves, differentiated mask, structure) of one argument."""
    leaves, tree = jax.tree.flatten(value)
    if is_network(value) or isinstance(value, Layer):
        mask = jax.tree.leaves(learnable_mask(value))
    else:
        mask = [jnp.issubdtype(jnp.result_type(x), jnp.inexact) for x in leaves]
    return leaves, [bool(m) for m in mask], tree

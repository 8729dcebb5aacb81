"""The SReLU examples' parameter gradients (01, 02, 08, 09), as per-channel sums in one pass.

The four SReLU examples import them from here (each is run as a script, so this folder is on the
import path) rather than keep four copies.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def channel_sums(axes, *terms):
    """``jnp.sum(t, axes, keepdims=True)`` for every term, in one pass over the terms.

    Why not four ``jnp.sum``: XLA's CPU backend runs each sum as a pass of its own over its
    inputs, and writes a ``jnp.where`` in a summand out to memory first. One ``lax.reduce`` of
    all the terms over one axis is a single XLA loop that reads x and dL/dY once and evaluates
    the masks on the fly; what is left to sum is that axis' size times smaller. This about halves
    SReLU's gradient step (docs/performance.md, "Custom backwards"). JAX cannot differentiate
    a ``lax.reduce`` of several arrays, so the derivative is given: sums are linear, and the
    tangents' sums are plain ``jnp.sum``, which keeps the backward differentiable again.
    """
    zeros = tuple(jnp.zeros((), t.dtype) for t in terms)
    rows = jax.lax.reduce(terms, zeros, lambda a, b: tuple(map(jnp.add, a, b)), axes[-1:])
    rest = tuple(a for a in axes if a < axes[-1])  # axes before the reduced one keep their index
    return tuple(jnp.expand_dims(jnp.sum(r, rest, keepdims=True), axes[-1]) for r in rows)


@channel_sums.defjvp
def _channel_sums_jvp(axes, primals, tangents):
    return channel_sums(axes, *primals), tuple(jnp.sum(t, axes, keepdims=True) for t in tangents)


def srelu_parameter_gradients(axes, x, dy, left, right, tl, al, tr, ar):
    """dL/dtl, dL/dal, dL/dtr, dL/dar of SReLU, given its regions ``left`` and ``right``.

    The parameters are broadcast over ``axes`` (every axis but C), so their gradients are sums
    over those axes: four of them, of masked dL/dY and of the same times x, taken in one pass
    (:func:`channel_sums`). The ``(x - t)`` and ``(1 - a)`` factors come after summing,
    ``sum(dyl * (x - tl)) = sum(dyl * x) - tl * sum(dyl)``, so no summand needs a threshold.
    """
    dy_left, dy_right = jnp.where(left, dy, 0.0), jnp.where(right, dy, 0.0)
    s_left, s_right, s_left_x, s_right_x = channel_sums(
        axes, dy_left, dy_right, dy_left * x, dy_right * x
    )
    return s_left * (1 - al), s_left_x - tl * s_left, s_right * (1 - ar), s_right_x - tr * s_right

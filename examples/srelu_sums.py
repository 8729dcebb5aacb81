"""One-pass per-channel sums for the SReLU examples' hand-written backwards (01, 02, 08, 09).

The four SReLU examples import it from here (each is run as a script, so this folder is on the
import path) rather than keep four copies of it.
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

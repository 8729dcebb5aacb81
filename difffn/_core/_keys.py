"""A ``key`` argument: what counts as a ``jax.random`` key, and the error for anything else.

Randomness in difffn is an explicit key (``initialize``, ``forward``, ``trainnet``). An int seed
or ``None`` where a key is needed would fail inside ``jax.random`` with JAX's words (``invalid
PRNG key data``, ``'int' object has no attribute 'shape'``); `check_key` names the argument
and the fix instead.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ._errors import Error


def is_key(key) -> bool:
    """Whether ``key`` is a typed key (``jax.random.key``) or a raw ``uint32[2]`` key
    (``jax.random.PRNGKey``); tracers of either count."""
    if isinstance(key, jax.Array) and jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        return True
    shape, dtype = getattr(key, "shape", None), getattr(key, "dtype", None)
    return shape is not None and tuple(shape) == (2,) and dtype == np.uint32


def check_key(who: str, key, error: type[Error], *, optional: bool = False) -> None:
    """Raise ``error`` unless ``key`` is a ``jax.random`` key (or None, when ``optional``)."""
    if (key is None and optional) or is_key(key):
        return
    hint = f"jax.random.key({key})" if isinstance(key, int) else "jax.random.key(0)"
    got = "no key" if key is None else f"{type(key).__name__} {repr(key)[:40]}"
    raise error(f"{who}: key must be a jax.random key; got {got}. Fix: key={hint}.")

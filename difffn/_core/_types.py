"""The type aliases of difffn's annotations (``df.typing``).

What difffn's functions take and return, for type checkers (pyright, mypy) and readers:

* ``Data``: an array (anything ``jax.numpy.asarray`` takes: a ``jax.Array``, a NumPy array, a
  Python number) or a ``df.FormattedArray``, whose labels then travel with the data;
* ``PyTree``: a pytree (nested tuples, lists and dicts) of arrays, e.g. a layer's state or a
  metric's running totals; typed ``Any``, as JAX types its pytrees;
* ``Output``: what an operation returns: a ``jax.Array`` for array inputs, a
  ``df.FormattedArray`` for formatted ones (or, for several outputs, a tuple of them); typed
  ``Any`` so that the result is used as either without a cast.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import jax

from ._format import FormattedArray

Data: TypeAlias = jax.typing.ArrayLike | FormattedArray
PyTree: TypeAlias = Any
Output: TypeAlias = Any

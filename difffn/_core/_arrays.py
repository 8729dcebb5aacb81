"""User data as arrays of numbers: the one place that names what cannot be one.

Data reaches difffn as arrays, lists, formatted arrays. ``jnp.asarray`` fails on strings, Python
objects and ragged lists with JAX's or NumPy's own words (``Error interpreting argument to stage
as a JAX value``, ``inhomogeneous shape``), and silently drops the imaginary part of complex data
that a real network computes on. `as_numbers` and `check_numbers` say what was given
and how to fix it, in the caller's error class (``NetworkError`` for ``net.predict``,
``OptionsError`` for ``trainnet``'s data, ``FormatError`` for ``df.dlarray``).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._errors import Error


def to_device(value: Any, dtype: Any = None) -> Any:
    """``value`` as a JAX array; NumPy data copied with ``jax.device_put``, never ``jnp.asarray``.

    ``jnp.asarray`` of a NumPy array runs a conversion compiled per shape, and JAX keeps each one
    (measured on CPU, jax 0.10.2: 1.4 MiB per new shape, never released; importing DenseNet-121
    from ONNX compiled one per weight shape). ``jax.device_put`` copies, with the same dtype
    canonicalization, and compiles nothing. JAX arrays and tracers go through ``jnp.asarray``.
    """
    if isinstance(value, (np.ndarray, np.generic)):
        host = value if dtype is None else np.asarray(value, dtype)
        return jax.device_put(host, may_alias=False)  # a copy: the caller may change value
    return jnp.asarray(value, dtype)


def as_numbers(value: Any, *, what: str, error: type[Error], real: bool = True) -> Any:
    """``value`` as an array of numbers (or booleans); raises ``error`` naming ``what`` otherwise.

    Arrays (anything with a ``dtype``: NumPy and JAX arrays, tracers, ``FormattedArray``) are
    returned as they are; anything else (lists, scalars) goes through ``np.asarray``.

    Args:
      value: the data.
      what: how messages name it (``"network input 'in'"``).
      error: the error class to raise.
      real: complex data is an error too (the computation is real).
    """
    if not hasattr(value, "dtype"):
        if value is None:
            raise error(f"{what} is None; expected an array of numbers. Fix: pass the data array.")
        try:
            value = np.asarray(value)
        except ValueError as failure:
            raise error(
                f"{what} is a ragged {type(value).__name__} (its items differ in length or "
                f"shape: {failure}), which cannot be one array. Fix: pad the items to one length "
                "(or one shape) and pass np.asarray(items, dtype=np.float32)."
            ) from None
    check_numbers(value, what=what, error=error, real=real)
    return value


def check_numbers(x: Any, *, what: str, error: type[Error], real: bool = True) -> None:
    """Raise ``error`` unless ``x`` holds real numbers (or booleans; complex too when not ``real``).

    A complex array given to a real network would lose its imaginary part without a word, and
    strings or objects fail deep inside JAX; both are named here, before anything runs.
    """
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        raise error(
            f"{what} must be an array; got {type(x).__name__}. Fix: pass np.asarray(...) of "
            "numbers."
        )
    if isinstance(dtype, np.dtype) and dtype.kind in "biuf":
        return  # the common case, decided without jnp.issubdtype (on every network call)
    if jnp.issubdtype(dtype, jnp.complexfloating) and real:
        raise error(
            f"{what} is complex ({dtype}); the network computes in real numbers and would drop "
            "the imaginary part. Fix: pass the real and imaginary parts as separate channels, "
            "e.g. np.concatenate([x.real, x.imag], axis=channel_axis)."
        )
    if not (jnp.issubdtype(dtype, jnp.number) or jnp.issubdtype(dtype, jnp.bool_)):
        raise error(
            f"{what} has dtype {dtype}, which is not numbers (strings or Python objects?). "
            "Fix: pass numeric arrays (np.asarray(x, dtype=np.float32), class labels as ints)."
        )

r"""Parameter initializers with MATLAB's names and formulas.

An initializer is a name or a function ``fn(key, shape, dtype) -> array`` (the signature of
``jax.nn.initializers``; MATLAB's function handles take only the size, JAX needs the key).

========================= ==================================================================
name                      values
========================= ==================================================================
``"glorot"``              uniform on $\pm\sqrt{6 / (n_{in} + n_{out})}$ (Xavier)
``"he"``                  normal, mean 0, standard deviation $\sqrt{2 / n_{in}}$
``"narrow-normal"``       normal, mean 0, standard deviation 0.01
``"orthogonal"``          an orthogonal matrix: the Q of the QR decomposition of a unit-normal one
``"zeros"``, ``"ones"``   constants
``"unit-forget-gate"``    (LSTM bias) zeros, except ones for the forget gate
========================= ==================================================================
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from .._core import LayerError
from ._checks import bad_argument, who

WEIGHTS = ("glorot", "he", "narrow-normal", "zeros", "ones")
BIAS = ("zeros", "ones", "narrow-normal")
RECURRENT = ("orthogonal", "glorot", "he", "narrow-normal", "zeros", "ones")
LSTM_BIAS = ("unit-forget-gate", "zeros", "ones", "narrow-normal")


def check(layer, argument: str, value, names: tuple[str, ...]):
    """A known initializer name or a callable; otherwise a clear error."""
    if callable(value) or (isinstance(value, str) and value in names):
        return value
    options = ", ".join(repr(n) for n in names)
    raise bad_argument(
        layer,
        argument,
        f"one of {options}, or a function fn(key, shape, dtype) -> array",
        value,
        "use a name from that list or e.g. jax.nn.initializers.lecun_normal().",
    )


def draw(layer, argument: str, initializer, key, shape, fan_in: int, fan_out: int):
    """Draw a float32 parameter of ``shape`` from ``initializer``."""
    dtype = jnp.float32
    if callable(initializer):
        value = jnp.asarray(initializer(key, tuple(shape), dtype))
        if value.shape != tuple(shape):
            raise LayerError(
                f"{who(layer)}: the {argument} function returned shape {tuple(value.shape)}; "
                f"expected {tuple(shape)}. Fix: return an array of the shape it is given."
            )
        return value.astype(dtype) if not jnp.issubdtype(value.dtype, jnp.floating) else value
    if initializer == "glorot":
        bound = math.sqrt(6.0 / (fan_in + fan_out))
        return jax.random.uniform(key, shape, dtype, -bound, bound)
    if initializer == "he":
        return math.sqrt(2.0 / fan_in) * jax.random.normal(key, shape, dtype)
    if initializer == "narrow-normal":
        return 0.01 * jax.random.normal(key, shape, dtype)
    if initializer == "orthogonal":
        return jax.nn.initializers.orthogonal()(key, shape, dtype)
    if initializer == "zeros":
        return jnp.zeros(shape, dtype)
    if initializer == "ones":
        return jnp.ones(shape, dtype)
    raise AssertionError(initializer)  # check() admits only the names above


def check_options(layer, allowed: dict[str, tuple[str, ...]]) -> None:
    """Check each learnable's ``<name>_initializer`` option in place (call in ``__post_init__``).

    Args:
      layer: the layer being constructed (or replaced).
      allowed: learnable field name -> the initializer names its option admits.
    """
    for field, names in allowed.items():
        option = f"{field}_initializer"
        setattr(layer, option, check(layer, option, getattr(layer, option), names))


def fill(layer, draws, **changes):
    """``layer`` with every learnable that is still ``None`` drawn from its initializer option.

    Args:
      layer: the layer being initialized.
      draws: ``(field, key, shape, fan_in, fan_out)`` per learnable; its initializer is the
        option ``<field>_initializer``.
      **changes: other new values (initial states), set in the same copy.

    Returns:
      The new layer, or ``layer`` itself when nothing was ``None``.
    """
    for field, key, shape, fan_in, fan_out in draws:
        if getattr(layer, field) is None:
            option = f"{field}_initializer"
            initializer = getattr(layer, option)
            changes[field] = draw(layer, option, initializer, key, shape, fan_in, fan_out)
    return layer.replace(**changes) if changes else layer

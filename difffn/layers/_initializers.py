r"""Parameter initializers with MATLAB's names and formulas.

An initializer is a name or a function in one of two forms: ``fn(key, shape, dtype) -> array``
(JAX's, the signature of ``jax.nn.initializers``: drawn from the layer's key) or ``fn(sz) ->
array`` (MATLAB's ``@(sz) ...``: the size alone, as a tuple in difffn's storage order; it draws
from its own generator, e.g. numpy's, so the network's ``key`` does not govern it). Which form a
function has is read from its signature: one required positional parameter is MATLAB's form
(``lambda sz: ...``, ``np.ones``); otherwise a function that takes three positional arguments is
JAX's.

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

import inspect
import math

import jax
import jax.numpy as jnp

from .._core import LayerError
from ._checks import bad_argument, who

# The names MATLAB lists for each kind of learnable (its layers' ``*Initializer`` options):
# convolutions' weights (convolution1d/2d/3dLayer, transposedConv2dLayer)
WEIGHTS = ("glorot", "he", "narrow-normal", "zeros", "ones")
# fullyConnectedLayer's weights, also the input weights of lstmLayer/gruLayer, the weights of
# selfAttentionLayer and of the embedding layers
DENSE = ("glorot", "he", "orthogonal", "narrow-normal", "zeros", "ones")
# biases, and the offset and scale of the normalization layers
BIAS = ("zeros", "ones", "narrow-normal")
RECURRENT = ("orthogonal", "glorot", "he", "narrow-normal", "zeros", "ones")
LSTM_BIAS = ("unit-forget-gate", "zeros", "ones", "narrow-normal")

_FORMS = "fn(key, shape, dtype) -> array (JAX's form) or fn(sz) -> array (MATLAB's @(sz) form)"


def form(fn) -> str | None:
    """``"jax"`` for ``fn(key, shape, dtype)``, ``"matlab"`` for ``fn(sz)``, None for neither.

    One required positional parameter is MATLAB's form (``lambda sz: ...``, ``np.ones``); else
    a function that takes three positional arguments is JAX's (``jax.nn.initializers``'
    ``init(key, shape, dtype=...)``), and one that takes one is MATLAB's.
    """
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: JAX's form, as before
        return "jax"
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [
        p
        for p in signature.parameters.values()
        if p.kind in positional and p.default is inspect.Parameter.empty
    ]
    if len(required) == 1:
        return "matlab"
    for count, name in ((3, "jax"), (1, "matlab")):
        try:
            signature.bind(*range(count))
        except TypeError:
            continue
        return name
    return None


def check(layer, argument: str, value, names: tuple[str, ...]):
    """A known initializer name or a function of one of the two forms; otherwise a clear error."""
    if isinstance(value, str) and value in names:
        return value
    options = ", ".join(repr(n) for n in names)
    if callable(value) and not isinstance(value, str):
        if form(value) is not None:
            return value
        name = getattr(value, "__name__", type(value).__name__)
        raise LayerError(
            f"{who(layer)}: {argument} must be one of {options}, or a function {_FORMS}; got "
            f"the function {name}{_signature(value)}, which takes neither one nor three "
            "positional arguments. Fix: write it as lambda key, shape, dtype: ... (e.g. "
            "jax.nn.initializers.lecun_normal()) or as lambda sz: ... (MATLAB's @(sz) ...)."
        )
    raise bad_argument(
        layer,
        argument,
        f"one of {options}, or a function {_FORMS}",
        value,
        "use a name from that list, or a function of either form, e.g. "
        "jax.nn.initializers.lecun_normal() or lambda sz: 0.01 * np.random.randn(*sz).",
    )


def _signature(fn) -> str:
    try:
        return str(inspect.signature(fn))
    except (TypeError, ValueError):
        return "(...)"


def _call(layer, argument: str, fn, key, shape, dtype):
    """Run a function initializer in its form; what it raises names the option and the forms."""
    kind = form(fn)
    try:
        if kind == "matlab":
            return fn(tuple(shape))
        return fn(key, tuple(shape), dtype)
    except Exception as error:
        called = f"fn({tuple(shape)})" if kind == "matlab" else f"fn(key, {tuple(shape)}, {dtype})"
        raise LayerError(
            f"{who(layer)}: the {argument} function raised {type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else ''} when called as {called} "
            f"({'MATLAB' if kind == 'matlab' else 'JAX'}'s form, read from its signature). "
            f"Fix: an initializer is {_FORMS}; make it return an array of that shape."
        ) from error


def draw(layer, argument: str, initializer, key, shape, fan_in: int, fan_out: int):
    """Draw a float32 parameter of ``shape`` from ``initializer``."""
    dtype = jnp.float32
    if callable(initializer):
        value = jnp.asarray(_call(layer, argument, initializer, key, shape, dtype))
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

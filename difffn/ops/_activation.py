r"""Activations (elementwise, any format) and ``softmax`` (over ``C``).

The elementwise ones keep the input's format and need none: a plain array stays plain
(``fmt=`` is accepted for symmetry with the other ops and only checked).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from .._core import Data, OpError, Output
from ._common import floating, pack, real, require_label, softmax_along, unpack, who


def _elementwise(op, x, fmt, fn):
    data, fmt, formatted = unpack(op, x, fmt, needs_format=False)
    return pack(fn(data), fmt, formatted)


def relu(x: Data, *, fmt: str | None = None) -> Output:
    """Rectified linear unit, ``max(x, 0)`` (MATLAB's ``relu``).

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> df.ops.relu(df.dlarray(jnp.array([[-1.0, 2.0]]), "BC"))
      FormattedArray('BC', float32[1,2])
      [[0. 2.]]
    """
    return _elementwise("relu", x, fmt, jax.nn.relu)


def leaky_relu(x: Data, scale: float = 0.01, *, fmt: str | None = None) -> Output:
    """Leaky ReLU: ``x`` where positive, ``scale * x`` elsewhere (MATLAB's ``leakyrelu``).

    Args:
      x: any array; the format is kept.
      scale: the slope for negative inputs; default 0.01.
      fmt: the format of a plain ``x`` (only checked).

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> df.ops.leaky_relu(jnp.array([-2.0, 3.0]), 0.1)
      Array([-0.2,  3. ], dtype=float32)
    """
    scale = real("leaky_relu", "scale", scale)
    return _elementwise("leaky_relu", x, fmt, lambda v: jax.nn.leaky_relu(v, scale))


def clipped_relu(x: Data, ceiling: float, *, fmt: str | None = None) -> Output:
    """Clipped ReLU, ``min(max(x, 0), ceiling)`` (MATLAB's ``clippedReluLayer``).

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> df.ops.clipped_relu(jnp.array([-1.0, 2.0, 9.0]), 6.0)
      Array([0., 2., 6.], dtype=float32)
    """
    ceiling = real("clipped_relu", "ceiling", ceiling, positive=True)
    return _elementwise("clipped_relu", x, fmt, lambda v: jnp.clip(v, 0, ceiling))


def elu(x: Data, alpha: float = 1.0, *, fmt: str | None = None) -> Output:
    r"""Exponential linear unit: ``x`` where positive, $\alpha (e^x - 1)$ elsewhere.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> df.ops.elu(jnp.array([-1.0, 2.0]), 2.0)
      Array([-1.2642411,  2.       ], dtype=float32)
    """
    alpha = real("elu", "alpha", alpha)
    return _elementwise("elu", x, fmt, lambda v: jax.nn.elu(v, alpha))


def gelu(x: Data, *, approximation: str = "none", fmt: str | None = None) -> Output:
    r"""Gaussian error linear unit, $x \Phi(x)$ (MATLAB's ``gelu``).

    Args:
      x: any array; the format is kept.
      approximation: ``"none"`` (default: the exact form with ``erf``) or ``"tanh"``
        ($\frac{x}{2}(1 + \tanh(\sqrt{2/\pi}(x + 0.044715 x^3)))$).
      fmt: the format of a plain ``x`` (only checked).

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> jnp.round(df.ops.gelu(jnp.array([-1.0, 1.0])), 4)
      Array([-0.1587,  0.8413], dtype=float32)
    """
    if approximation not in ("none", "tanh"):
        raise OpError(
            f"{who('gelu')}: approximation must be 'none' or 'tanh'; got {approximation!r}."
        )
    if approximation == "tanh":
        return _elementwise("gelu", x, fmt, lambda v: jax.nn.gelu(v, approximate=True))
    return _elementwise("gelu", x, fmt, _exact_gelu)


def _exact_gelu(v: jax.Array) -> jax.Array:
    v = jnp.asarray(v)
    if not jnp.issubdtype(v.dtype, jnp.floating):
        return jax.nn.gelu(v, approximate=False)
    if jnp.finfo(v.dtype).bits < 32:
        # 1 + erf cancels where erf is near -1: bfloat16 would round Phi(-2) by 4 %, so half
        # precisions compute in float32 and round once.
        return _gelu_erf(v.astype(jnp.float32)).astype(v.dtype)
    return _gelu_erf(v)


@jax.custom_jvp
def _gelu_erf(x: jax.Array) -> jax.Array:
    r"""$x \Phi(x)$ with ``erf`` (as ONNX's ``Gelu`` operator specifies it), its own tangent rule.

    ``jax.nn.gelu(approximate=False)`` writes $\Phi$ with ``erfc``, which XLA:CPU expands into
    two polynomials and a select, and its autodiff derivative into three more passes; here the
    forward is one ``erf`` polynomial and the tangent is $t (\Phi(x) + x \varphi(x))$, one
    fused pass (issue 29: the benchmark transformer's GELU forward and backward 1.5x faster).
    Values agree with ``jax.nn.gelu`` to 2e-6 in float32; below about $x = -5.4$ this gives 0
    where the ``erfc`` form gives a tiny negative value (under 1e-6 in size).
    """
    return _gelu_value(x)


def _gelu_value(x: jax.Array) -> jax.Array:
    return x * _cdf(x)


def _cdf(x: jax.Array) -> jax.Array:
    return 0.5 * (1 + lax.erf(x * jnp.asarray(1 / math.sqrt(2), x.dtype)))


@_gelu_erf.defjvp
def _gelu_erf_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    # Under jax.checkpoint, reverse mode keeps x (the dense layer's output, kept anyway) and
    # computes the derivative inside the backward's one multiply, instead of writing out
    # Phi(x) + x phi(x) in the forward pass as a residual (issue 29: the benchmark's dense,
    # GELU, dense block forward and backward 36.1 -> 25.0 ms, its temporaries 32 -> 24 MiB).
    return _gelu_value(x), jax.checkpoint(_gelu_tangent)(x, t)


def _gelu_tangent(x: jax.Array, t: jax.Array) -> jax.Array:
    pdf = jnp.asarray(1 / math.sqrt(2 * math.pi), x.dtype) * jnp.exp(-0.5 * x * x)
    return t * (_cdf(x) + x * pdf)


def swish(x: Data, *, fmt: str | None = None) -> Output:
    r"""Swish, $x \sigma(x)$ (MATLAB's ``swishLayer``).

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> df.ops.swish(jnp.array([0.0, 1.0]))
      Array([0.       , 0.7310586], dtype=float32)
    """
    return _elementwise("swish", x, fmt, jax.nn.swish)


def sigmoid(x: Data, *, fmt: str | None = None) -> Output:
    r"""Logistic sigmoid, $1 / (1 + e^{-x})$ (MATLAB's ``sigmoid``).

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> df.ops.sigmoid(jnp.array([0.0]))
      Array([0.5], dtype=float32)
    """
    return _elementwise("sigmoid", x, fmt, jax.nn.sigmoid)


def tanh(x: Data, *, fmt: str | None = None) -> Output:
    """Hyperbolic tangent (MATLAB's ``tanh`` on a ``dlarray``).

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> df.ops.tanh(df.dlarray(jnp.zeros((1, 2)), "BC")).format
      'BC'
    """
    return _elementwise("tanh", x, fmt, jnp.tanh)


def softmax(x: Data, *, fmt: str | None = None) -> Output:
    """Softmax over the channel axis ``C`` (MATLAB's ``softmax``); any other axes are independent.

    Args:
      x: a ``df.FormattedArray`` with a ``C`` axis, or a plain array with ``fmt``. Integer data
        computes in float32.
      fmt: the format of a plain ``x``.

    Returns:
      Probabilities along ``C``, with the input's format.

    Raises:
      FormatError: no format, or no ``C`` axis.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> df.ops.softmax(jnp.zeros((1, 4)), fmt="BC")
      Array([[0.25, 0.25, 0.25, 0.25]], dtype=float32)
    """
    data, fmt, formatted = unpack("softmax", x, fmt)
    axis = require_label("softmax", fmt, "C", data.shape, why="works along the channel axis 'C'")
    return pack(softmax_along(floating(data), axis), fmt, formatted)

"""``fully_connect``: MATLAB's ``fullyconnect``."""

from __future__ import annotations

import math

import jax.numpy as jnp

from .._core import Data, FormatError, OpError, Output
from ._common import pack, plain, unpack, who


def fully_connect(
    x: Data, weights: Data, bias: Data | None = None, *, fmt: str | None = None
) -> Output:
    r"""Fully connected operation, $y = x W + b$, per observation and time step.

    The ``S``, ``C`` and ``U`` axes are flattened into one ``C`` axis in storage order (row-major)
    and ``B`` and ``T`` are kept in their order: ``"BSSC" -> "BC"``, ``"BC" -> "BC"``,
    ``"BTC" -> "BTC"``, ``"TBC" -> "TBC"`` (MATLAB's ``fullyconnect`` gives ``"CB"``/``"CBT"``
    in its channel-first storage; the labels are the same).

    Args:
      x: a ``df.FormattedArray`` with at least one ``S``, ``C`` or ``U`` axis, or a plain array
        with ``fmt``.
      weights: ``(input_size, output_size)``, where ``input_size`` is the product of the
        flattened sizes (MATLAB's ``outputSize x inputSize`` transposed).
      bias: ``(output_size,)``, a scalar, or ``None``.
      fmt: the format of a plain ``x``.

    Returns:
      ``B`` and ``T`` (those present) then ``C`` of size ``output_size``.

    Raises:
      FormatError: no format, or no axis to flatten.
      OpError: weights whose first axis is not the input size, or a bias of the wrong size.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> x = df.dlarray(jnp.ones((2, 4, 4, 3)), "BSSC")
      >>> y = df.ops.fully_connect(x, jnp.ones((48, 10)), jnp.zeros(10))
      >>> y.format, y.shape, float(y.data[0, 0])
      ('BC', (2, 10), 48.0)
    """
    op = "fully_connect"
    data, fmt, formatted = unpack(op, x, fmt)
    keep = [i for i, label in enumerate(fmt) if label in "BT"]
    features = [i for i, label in enumerate(fmt) if label not in "BT"]
    if not features:
        raise FormatError(
            f"{who(op)} flattens the 'S', 'C' and 'U' axes into features, but the input format "
            f"{fmt!r} has none. Fix: label the feature axis 'C'."
        )
    w = plain(op, "weights", weights)
    size = math.prod(data.shape[i] for i in features)
    if w.ndim != 2 or w.shape[0] != size:
        raise OpError(
            f"{who(op)}: the input has {size} features (the product of its 'S', 'C' and 'U' "
            f"sizes) but weights has shape {tuple(w.shape)}. Fix: give weights of shape "
            f"({size}, output_size)."
        )
    arrays = (data, w) if bias is None else (data, w, plain(op, "bias", bias))
    dtype = jnp.result_type(*arrays)
    if keep != list(range(len(keep))):
        data = jnp.transpose(data, keep + features)
    leading = tuple(data.shape[: len(keep)])
    # One (observations, features) matrix product, the leading axes flattened (free: they are
    # contiguous): XLA:CPU transposes a product over several leading axes in its backward, and
    # the benchmark transformer's (32, 128, 128) x (128, 512) block ran 3x slower that way.
    data = jnp.reshape(data, (math.prod(leading), size))
    y = jnp.reshape(jnp.dot(data.astype(dtype), w.astype(dtype)), leading + (w.shape[1],))
    if bias is not None:
        b = plain(op, "bias", bias)
        if b.size not in (1, w.shape[1]):
            raise OpError(
                f"{who(op)}: bias has shape {tuple(b.shape)}; expected {w.shape[1]} values "
                "(output_size) or one. Fix: give one value per output."
            )
        y = y + jnp.reshape(b.astype(dtype), (1,) * (y.ndim - 1) + (-1,))
    return pack(y, "".join(fmt[i] for i in keep) + "C", formatted)

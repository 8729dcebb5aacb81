"""What every ``df.ops`` function shares: reading its input's format, labeling its output, and
checking the sizes and options that MATLAB's functions take.

Messages name the op as the user calls it (``df.ops.conv``), say what was expected and what was
got, and how to fix it.
"""

from __future__ import annotations

import numbers
from typing import Any, TypeGuard

import jax
import jax.numpy as jnp
import numpy as np

from .._core import FormatError, FormattedArray, OpError, dlarray
from .._core import validate_format as _validate_format


def who(op: str) -> str:
    return f"df.ops.{op}"


def unpack(op: str, x: Any, fmt: str | None, *, needs_format: bool = True):
    """The plain array, the format and whether ``x`` was formatted.

    A ``FormattedArray`` brings its own format (``fmt`` may repeat it); a plain array takes
    ``fmt``, MATLAB's ``DataFormat``. Without either, an op that reads axes raises.
    """
    if isinstance(x, FormattedArray):
        x._check_rank(who(op))
        if fmt is not None and fmt != x.format:
            raise FormatError(
                f"{who(op)}: x is a FormattedArray {x.format!r}, but fmt={fmt!r} was also given. "
                "fmt labels plain arrays only (MATLAB's DataFormat). Fix: drop fmt=, or relabel "
                f"x first with df.dlarray(x, {fmt!r})."
            )
        return x.data, x.format, True
    if isinstance(x, (str, bytes)) or x is None:
        raise OpError(f"{who(op)}: x must be an array; got {type(x).__name__} {x!r}.")
    data = jnp.asarray(x)
    if fmt is None:
        if needs_format:
            raise FormatError(
                f"{who(op)}: x is a plain array of shape {tuple(data.shape)}, so its axes have no "
                "labels. Fix: pass fmt= with one label per axis (e.g. fmt='BSSC' for NHWC "
                "images), or label it with df.dlarray(x, fmt)."
            )
        return data, "", False
    return data, _validate_format(fmt, data.ndim, what=f"{who(op)}: fmt", shape=data.shape), False


def pack(y, fmt: str, formatted: bool):
    """The output: formatted with ``fmt`` when the input was, else plain (MATLAB's rule)."""
    return dlarray(y, fmt) if formatted else y


def require_label(op: str, fmt: str, label: str, shape, *, why: str) -> int:
    """The axis carrying ``label`` (one of ``C``, ``B``, ``T``), or a ``FormatError``."""
    if label not in fmt:
        raise FormatError(
            f"{who(op)} {why}, but the input format {fmt!r} (shape {tuple(shape)}) has no "
            f"{label!r} axis. Fix: label that axis {label!r} (df.dlarray(x, fmt) or fmt=)."
        )
    return fmt.index(label)


def window_axes(op: str, fmt: str, shape, count: int | None, *, what: str) -> tuple[int, ...]:
    """The axes a convolution or pooling window slides over, in storage order.

    MATLAB slides over the ``S`` axes; when the window has one more dimension than there are
    ``S`` axes, the ``T`` axis too (a 1-D image sequence ``"SCBT"``), and sequences without ``S``
    slide over ``T``. ``count=None`` takes all ``S`` axes (or ``T`` when there are none).
    """
    spatial = [i for i, label in enumerate(fmt) if label == "S"]
    time = [i for i, label in enumerate(fmt) if label == "T"]
    if count is None:
        axes = spatial or time
    elif len(spatial) == count:
        axes = spatial
    elif len(spatial) + len(time) == count:
        axes = sorted(spatial + time)
    else:
        axes = []
    if not axes:
        want = "some 'S' or a 'T' axis" if count is None else f"{count} 'S' (or 'S' and 'T') axes"
        raise FormatError(
            f"{who(op)}: {what} needs {want} to slide over; the input format {fmt!r} (shape "
            f"{tuple(shape)}) has {len(spatial)} 'S' and {len(time)} 'T' axes. Fix: label the "
            "axes to slide over 'S' (or 'T' for time), or give a window with as many dimensions."
        )
    return tuple(axes)


def _is_int(value: object) -> TypeGuard[int | np.integer]:
    # (another numbers.Integral compares and converts as an int does)
    return isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, bool)


def _is_real(value) -> bool:
    return isinstance(value, (numbers.Real, np.floating, np.integer)) and not isinstance(
        value, bool
    )


def ints(op: str, name: str, value, n: int, *, minimum: int = 1) -> tuple[int, ...]:
    """An int or ``n`` ints, each at least ``minimum``, as a tuple of ``n`` ints."""
    items = (value,) * n if _is_int(value) else value
    if (
        not isinstance(items, (tuple, list))
        or len(items) != n
        or not all(_is_int(v) and v >= minimum for v in items)
    ):
        kind = "positive" if minimum == 1 else f"at least {minimum}"
        raise OpError(
            f"{who(op)}: {name} must be an int or {n} ints, each {kind} (one per window "
            f"dimension); got {value!r}. Fix: e.g. {name}={max(minimum, 1)}."
        )
    return tuple(int(v) for v in items)


def pairs(
    op: str, name: str, value: Any, n: int, *, words: tuple[str, ...] = ("same",)
) -> str | tuple[tuple[int, int], ...]:
    """MATLAB-style padding or cropping for ``n`` window dimensions.

    Accepts one of ``words``, a non-negative int (all sides), ``n`` ints (both sides of each
    dimension) or ``n`` pairs ``(before, after)``; for one dimension, two ints are
    ``(before, after)`` (MATLAB's ``[left right]``). Returns the word or ``n`` pairs.
    """
    if isinstance(value, str):
        if value in words:
            return value
    elif n == 1 and isinstance(value, (tuple, list)) and len(value) == 2:
        if all(_is_int(v) and v >= 0 for v in value):
            return ((int(value[0]), int(value[1])),)
    elif _is_int(value) and value >= 0:
        return ((int(value), int(value)),) * n
    elif isinstance(value, (tuple, list)) and len(value) == n:
        if all(_is_int(v) and v >= 0 for v in value):
            return tuple((int(v), int(v)) for v in value)
        if all(
            isinstance(v, (tuple, list)) and len(v) == 2 and all(_is_int(u) and u >= 0 for u in v)
            for v in value
        ):
            return tuple((int(a), int(b)) for a, b in value)
    named = " or ".join(repr(w) for w in words)
    raise OpError(
        f"{who(op)}: {name} must be {named}, a non-negative int, "
        + (
            "a pair (before, after)"
            if n == 1
            else f"{n} ints (both sides of each window dimension) or {n} pairs (before, after)"
        )
        + f"; got {value!r}. Fix: e.g. {name}=1."
    )


def same_padding(size: int, window: int, stride: int, dilation: int = 1) -> tuple[int, int]:
    """MATLAB's (and XLA's) ``"same"``: output ``ceil(size / stride)``, the odd extra at the end."""
    extent = (window - 1) * dilation + 1
    total = max((-(-size // stride) - 1) * stride + extent - size, 0)
    return total // 2, total - total // 2


def real(op: str, name: str, value, *, positive: bool = False) -> float:
    """A finite real number (positive when asked)."""
    ok = _is_real(value) and np.isfinite(float(value)) and (not positive or float(value) > 0)
    if not ok:
        kind = "a positive finite number" if positive else "a finite real number"
        raise OpError(f"{who(op)}: {name} must be {kind}; got {value!r}.")
    return float(value)


def per_channel(op: str, name: str, value, channels: int, ndim: int, axis: int, dtype):
    """A per-channel parameter (any shape with ``channels`` elements) shaped to broadcast."""
    array = jnp.asarray(value.data if isinstance(value, FormattedArray) else value)
    if array.size != channels:
        raise OpError(
            f"{who(op)}: {name} has shape {tuple(array.shape)} ({array.size} values) but the "
            f"input has {channels} channels. Fix: give one value per channel."
        )
    shape = [1] * ndim
    shape[axis] = channels
    return jnp.reshape(array, shape).astype(dtype)


def floating(data) -> jax.Array:
    """Integer data computes in float32 (as MATLAB computes in single)."""
    return data if jnp.issubdtype(data.dtype, jnp.inexact) else data.astype(jnp.float32)


def plain(op: str, name: str, value) -> jax.Array:
    """A parameter as a plain array (a formatted one is stripped)."""
    if isinstance(value, FormattedArray):
        return value.data
    if value is None or isinstance(value, (str, bytes)):
        raise OpError(f"{who(op)}: {name} must be an array; got {value!r}.")
    return jnp.asarray(value)


def softmax_along(data: jax.Array, axis: int) -> jax.Array:
    """``jax.nn.softmax`` with JAX's own tangent rule (``jax.softmax_custom_jvp``).

    JAX still differentiates ``jax.nn.softmax`` through its equations by default; its
    ``custom_jvp`` rule, ``y * (dx - sum(y * dx))``, is one pass over the input where autodiff
    writes out three, and XLA:CPU no longer writes a broadcast of the denominator at full size
    (issue 29: the benchmark transformer's attention forward and backward 1.5x faster). Values
    are the same equations; ``df.export_onnx`` writes either as one ``Softmax``.
    """
    with jax.softmax_custom_jvp(True):
        return jax.nn.softmax(data, axis=axis)

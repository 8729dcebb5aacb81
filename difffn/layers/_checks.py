"""Argument and format checks shared by the built-in layers.

Every message names the layer (class and ``name``), the argument, what was expected and what was
got, and how to fix it (as every difffn error does; see ``difffn/_errors.py``).
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._core import (
    FormatError,
    FormattedArray,
    LayerError,
    Layout,
    as_numbers,
    dlarray,
    to_device,
    who,
)


def bad_argument(layer, argument: str, expected: str, got: Any, fix: str) -> LayerError:
    """The error for a constructor argument with a bad value."""
    return LayerError(f"{who(layer)}: {argument} must be {expected}; got {_show(got)}. Fix: {fix}")


def _show(value: Any) -> str:
    if isinstance(value, (jax.Array, np.ndarray)):
        return f"an array of shape {tuple(value.shape)}"
    return repr(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def positive_int(layer, argument: str, value: Any, *, fix: str) -> int:
    if not (_is_int(value) and value > 0):
        raise bad_argument(layer, argument, "a positive int", value, fix)
    return int(value)


def int_pair(layer, argument: str, value: Any, *, minimum: int = 1, fix: str) -> tuple[int, int]:
    """An int or a pair of ints (height, width), each at least ``minimum``."""
    kind = "positive" if minimum == 1 else "non-negative"
    expected = f"a {kind} int or a pair of {kind} ints (height, width)"
    items = (value, value) if _is_int(value) else value
    if (
        not isinstance(items, (tuple, list))
        or len(items) != 2
        or not all(_is_int(v) and v >= minimum for v in items)
    ):
        raise bad_argument(layer, argument, expected, value, fix)
    return int(items[0]), int(items[1])


def real(
    layer, argument: str, value: Any, *, low=None, high=None, open_low=False, open_high=False,
    expected: str, fix: str,
) -> float:  # fmt: skip
    """A finite real number within the bounds (closed unless ``open_*``), as a Python float."""
    ok = _is_real(value) and math.isfinite(float(value))
    if ok and low is not None:
        ok = value > low if open_low else value >= low
    if ok and high is not None:
        ok = value < high if open_high else value <= high
    if not ok:
        raise bad_argument(layer, argument, expected, value, fix)
    return float(value)


def choice(layer, argument: str, value: Any, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        options = " | ".join(repr(c) for c in choices)
        raise bad_argument(layer, argument, f"one of {options}", value, f"pick one of {options}.")
    return value


def padding_2d(layer, value: Any, *, argument: str = "padding"):
    """MATLAB's 2-D ``Padding``: ``"same"``, an int, ``(tb, lr)``, ``(t, b, l, r)`` or nested.

    Returns ``"same"`` or ``((top, bottom), (left, right))``.
    """
    expected = (
        "'same', a non-negative int, a pair (top_bottom, left_right), four ints "
        "(top, bottom, left, right) or ((top, bottom), (left, right))"
    )
    # TransposedConv2D's cropping shares the forms; its 'same' makes the output size * stride
    same = "input * stride" if argument == "cropping" else "ceil(input / stride)"
    fix = f"e.g. {argument}='same' (output size {same}) or {argument}=1."
    if isinstance(value, str):
        if value != "same":
            raise bad_argument(layer, argument, expected, value, fix)
        return value
    if _is_int(value) and value >= 0:
        return ((int(value),) * 2,) * 2
    if isinstance(value, (tuple, list)):
        flat = [v for item in value for v in (item if isinstance(item, (tuple, list)) else (item,))]
        if all(_is_int(v) and v >= 0 for v in flat):
            nested = all(isinstance(v, (tuple, list)) for v in value)
            if len(value) == 2 and nested and len(flat) == 4:
                return tuple((int(a), int(b)) for a, b in value)
            if len(value) == 2 and len(flat) == 2:
                return ((int(value[0]),) * 2, (int(value[1]),) * 2)
            if len(value) == 4 and len(flat) == 4:
                return ((int(value[0]), int(value[1])), (int(value[2]), int(value[3])))
    raise bad_argument(layer, argument, expected, value, fix)


def as_float_array(layer, argument: str, value: Any) -> jax.Array:
    """An array keeps its floating dtype; Python numbers, lists and integers become float32.

    (``jnp.asarray(0.5)`` would be float64 when ``jax_enable_x64`` is on.) A value that is not
    numeric (a string, a ragged list, a complex array) is the layer's ``LayerError``.
    """
    if isinstance(value, (jax.Array, np.ndarray, np.generic)) and jnp.issubdtype(
        value.dtype, jnp.floating
    ):
        return to_device(value)
    try:
        value = as_numbers(value, what=argument, error=LayerError)
    except LayerError:  # the layer's own wording: its name, the argument, the Fix
        raise bad_argument(
            layer, argument, "a real array (or a number)", value, "pass numbers, e.g. an array."
        ) from None
    return to_device(value, jnp.float32)


def array_or_none(layer, argument: str, value: Any, shape: tuple | None, what: str) -> Any:
    """``None`` or a float array whose shape is ``shape`` (``None`` entries match any size).

    Typed ``Any``: the learnable fields it fills are declared as the arrays they hold once
    initialized (``None`` before).
    """
    if value is None:
        return None
    array = as_float_array(layer, argument, value)
    if shape is not None and (
        array.ndim != len(shape)
        or any(s is not None and s != n for s, n in zip(shape, array.shape, strict=True))
    ):
        want = "(" + ", ".join("any" if s is None else str(s) for s in shape) + ")"
        raise bad_argument(
            layer,
            argument,
            f"an array of shape {want} ({what})",
            array,
            f"pass an array of that shape, or leave {argument}=None so that initialize fills it.",
        )
    return array


def require(layer, *fields: str) -> None:
    """Raise a clear error when a parameter that ``initialize`` fills is still ``None``."""
    missing = [f for f in fields if getattr(layer, f) is None]
    if missing:
        raise LayerError(
            f"{who(layer)}: parameter(s) {missing} are None, so the layer cannot run. Fix: call "
            "layer.initialize(layout, key=key) (or net.initialize) first, or pass them to the "
            "constructor."
        )


# -- formats ---------------------------------------------------------------------------------------


def data_and_format(x) -> tuple[jax.Array, str]:
    """The plain array and the format (``""`` for a plain array) of a layer input."""
    if isinstance(x, FormattedArray):
        x._check_rank("a built-in layer")
        return x.data, x.format
    return jnp.asarray(x), ""


def relabel(like, y, fmt: str):
    """``y`` with format ``fmt`` when the input ``like`` was formatted, else plain ``y``."""
    return dlarray(y, fmt) if isinstance(like, FormattedArray) else y


def spatial_2d_format(layer, fmt: str, shape, *, default: str = "BSSC") -> str:
    """Check a 2-D image format (labels B, S, S, C in any order); plain data is NHWC."""
    if not fmt:
        if len(shape) != len(default):
            raise FormatError(
                f"{who(layer)} takes 2-D image data with format {default!r} (batch, height, "
                f"width, channels); got a plain array of shape {tuple(shape)}. Fix: label it, "
                f"e.g. df.dlarray(x, {default!r})."
            )
        return default
    if sorted(fmt) != sorted(default):
        raise FormatError(
            f"{who(layer)} takes 2-D image data: one 'B', two 'S' and one 'C' axis (e.g. "
            f"{default!r}); got format {fmt!r} (shape {tuple(shape)}). Fix: for feature data "
            "('BC') use FullyConnected; for images label the axes, e.g. "
            f"df.dlarray(x, {default!r})."
        )
    return fmt


def layout_format(layer, layout, allowed, *, want: str) -> Layout:
    """Check that ``layout`` is a ``df.Layout`` whose format passes ``allowed(fmt)``."""
    if not isinstance(layout, Layout):
        raise LayerError(
            f"{who(layer)}.initialize takes a df.Layout describing its input; got "
            f"{type(layout).__name__}. Fix: layer.initialize(df.Layout(shape, fmt), key=key)."
        )
    if not allowed(layout.format):
        raise FormatError(
            f"{who(layer)}.initialize: the input layout {layout!r} has format "
            f"{layout.format!r}; expected {want}. Fix: put the layer after an input layer or "
            "layer giving that format (or build the network's input layer for it)."
        )
    return layout


def known_size(layer, layout: Layout, label: str, what: str) -> int:
    size = layout.size(label)
    sizes = size if isinstance(size, tuple) else (size,)
    known = tuple(s for s in sizes if s is not None)
    if len(known) < len(sizes) or not sizes:
        raise LayerError(
            f"{who(layer)}.initialize needs the {what} (axis {label!r}) of the input layout; "
            f"{layout!r} leaves it unknown. Fix: give its size in the layout."
        )
    return math.prod(known)


def channel_axis(layer, fmt: str, ndim: int) -> int:
    """The ``C`` axis of a formatted input, or the last axis of a plain one."""
    if not fmt:
        if ndim < 1:
            raise FormatError(f"{who(layer)} needs at least one axis; got a scalar.")
        return ndim - 1
    if "C" not in fmt:
        raise FormatError(
            f"{who(layer)} works along the channel axis 'C', but its input format {fmt!r} has "
            "none. Fix: label the channel axis 'C' with df.dlarray(x, fmt)."
        )
    return fmt.index("C")


def flatten_features(layer, data, fmt: str):
    """Flatten the S, C and U axes into one channel axis (storage order), keeping B and T.

    A plain array is taken to be batch-first: axis 0 is kept, the others are flattened.

    Returns:
      ``(data, fmt)``: the flattened array and its format (``""`` for plain input).
    """
    if not fmt:
        if data.ndim < 1:
            raise FormatError(f"{who(layer)} needs at least one axis; got a scalar.")
        return jnp.reshape(data, data.shape[:1] + (math.prod(data.shape[1:]),)), ""
    keep = [i for i, label in enumerate(fmt) if label in "BT"]
    features = [i for i, label in enumerate(fmt) if label not in "BT"]
    if not features:
        raise FormatError(
            f"{who(layer)} flattens the 'S', 'C' and 'U' axes into features, but its input "
            f"format {fmt!r} has none. Fix: label the feature axis 'C'."
        )
    data = jnp.transpose(data, keep + features)
    kept = tuple(data.shape[: len(keep)])
    # The feature size is spelled out: -1 cannot be inferred for an empty batch.
    size = math.prod(data.shape[len(keep) :])
    return jnp.reshape(data, kept + (size,)), "".join(fmt[i] for i in keep) + "C"

"""Layers that merge several inputs: ``Addition``, ``Multiplication`` and ``Concatenation``."""

from __future__ import annotations

import dataclasses
import functools
import operator

import jax.numpy as jnp

from .._core import Data, FormatError, Output
from .._layer import Layer
from ._checks import bad_argument, data_and_format, relabel, who


def _common_format(layer, inputs) -> str:
    """The format all inputs share (``""`` when all are plain), or a clear error."""
    formats = [data_and_format(x)[1] for x in inputs]
    if len(set(formats)) > 1:
        listed = ", ".join(
            f"{name}: {fmt!r}" if fmt else f"{name}: plain array"
            for name, fmt in zip(layer.input_names, formats, strict=True)
        )
        raise FormatError(
            f"{who(layer)} needs inputs with the same format; got {listed}. Fix: give them "
            "one format, e.g. df.permute(x, fmt) to reorder or df.dlarray(x, fmt) to label."
        )
    return formats[0]


class Addition(Layer):
    """Elementwise sum of ``num_inputs`` inputs (MATLAB's ``additionLayer``).

    The inputs must have the same format; sizes must match except for size-1 axes, which
    broadcast. Inputs are named ``"in1"``, ``"in2"``, ...

    Args:
      num_inputs: the number of inputs, at least 2 (default 2).

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> x = df.dlarray(jnp.ones((2, 3)), "BC")
      >>> layer = df.layers.Addition(3)
      >>> layer.input_names, layer(x, x, x).data[0]
      (('in1', 'in2', 'in3'), Array([3., 3., 3.], dtype=float32))
    """

    formattable = True

    num_inputs: int = 2

    def __post_init__(self) -> None:
        _check_num_inputs(self)

    def predict(self, *inputs: Data) -> Output:
        return _elementwise(self, inputs, operator.add, "adds")


class Multiplication(Layer):
    """Elementwise product of ``num_inputs`` inputs (MATLAB's ``multiplicationLayer``).

    The inputs must have the same format; sizes must match except for size-1 axes, which
    broadcast (e.g. a gate of shape ``(n, 1, 1, c)`` scaling an ``(n, h, w, c)`` image). Inputs
    are named ``"in1"``, ``"in2"``, ...

    Args:
      num_inputs: the number of inputs, at least 2 (default 2).

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> x = df.dlarray(2 * jnp.ones((2, 3)), "BC")
      >>> df.layers.Multiplication(3)(x, x, x).data[0]
      Array([8., 8., 8.], dtype=float32)
    """

    formattable = True

    num_inputs: int = 2

    def __post_init__(self) -> None:
        _check_num_inputs(self)

    def predict(self, *inputs: Data) -> Output:
        return _elementwise(self, inputs, operator.mul, "multiplies")


def _elementwise(layer, inputs, combine, verb: str):
    fmt = _common_format(layer, inputs)
    arrays = [data_and_format(x)[0] for x in inputs]
    shapes = [tuple(a.shape) for a in arrays]
    try:
        if len({len(s) for s in shapes}) > 1:
            raise ValueError
        jnp.broadcast_shapes(*shapes)
    except ValueError:
        raise FormatError(
            f"{who(layer)} {verb} inputs of shapes {shapes}, which do not match (only size-1 "
            "axes broadcast). Fix: give the inputs the same sizes."
        ) from None
    return relabel(inputs[0], functools.reduce(combine, arrays), fmt)


class Concatenation(Layer):
    """Concatenate ``num_inputs`` inputs along the axis labeled ``label``.

    MATLAB's ``depthConcatenationLayer`` is ``label="C"`` (the default); ``concatenationLayer``
    is any other label that appears once in the format (``"B"``, ``"T"``, ``"C"``). The inputs
    must have the same format and the same sizes on every other axis. Plain inputs concatenate
    along their last axis, and only for ``label="C"``.

    Args:
      num_inputs: the number of inputs, at least 2 (default 2).
      label: the axis label: ``"C"``, ``"B"`` or ``"T"``.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> a = df.dlarray(jnp.ones((2, 4, 4, 3)), "BSSC")
      >>> b = df.dlarray(jnp.ones((2, 4, 4, 5)), "BSSC")
      >>> y = df.layers.Concatenation()(a, b)
      >>> y.format, y.shape
      ('BSSC', (2, 4, 4, 8))
    """

    formattable = True

    num_inputs: int = 2
    _: dataclasses.KW_ONLY
    label: str = "C"

    def __post_init__(self) -> None:
        _check_num_inputs(self)
        if self.label not in ("C", "B", "T"):
            raise bad_argument(
                self,
                "label",
                "'C', 'B' or 'T' (a label that appears at most once in a format)",
                self.label,
                "use label='C' to concatenate channels (depth concatenation).",
            )

    def predict(self, *inputs: Data) -> Output:
        fmt = _common_format(self, inputs)
        arrays = [data_and_format(x)[0] for x in inputs]
        if fmt:
            if self.label not in fmt:
                raise FormatError(
                    f"{who(self)} concatenates along {self.label!r}, but the inputs have format "
                    f"{fmt!r}, without that axis. Fix: pick a label of the format, or label "
                    "the inputs with df.dlarray(x, fmt)."
                )
            axis = fmt.index(self.label)
        elif self.label == "C":
            axis = arrays[0].ndim - 1
        else:
            raise FormatError(
                f"{who(self)} concatenates along {self.label!r}, which plain arrays do not "
                "label. Fix: pass formatted inputs (df.dlarray(x, fmt))."
            )
        others = {tuple(n for i, n in enumerate(a.shape) if i != axis) for a in arrays}
        if len(others) > 1 or len({a.ndim for a in arrays}) > 1:
            shapes = [tuple(a.shape) for a in arrays]
            raise FormatError(
                f"{who(self)}: the inputs must have the same sizes except along {self.label!r} "
                f"(axis {axis}); got shapes {shapes}. Fix: make the other axes agree."
            )
        return relabel(inputs[0], jnp.concatenate(arrays, axis=axis), fmt)


def _check_num_inputs(layer) -> None:
    n = layer.num_inputs
    if not isinstance(n, int) or isinstance(n, bool) or n < 2:
        raise bad_argument(
            layer,
            "num_inputs",
            "an int of at least 2",
            layer.num_inputs,
            f"e.g. {type(layer).__name__}(2).",
        )

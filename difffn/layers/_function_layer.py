"""``FunctionLayer``: MATLAB's ``functionLayer``."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

from .._core import Data, Output
from .._layer import Layer
from ._checks import bad_argument


def _arity(fn) -> int | None:
    """The number of required positional parameters of ``fn``; None if unknown or ``*args``."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return None
    return sum(
        1
        for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    )


class FunctionLayer(Layer):
    """A layer that applies a function (MATLAB's ``functionLayer``); no learnables.

    ``fn`` is static configuration (part of the compiled trace's key), so it must be hashable:
    functions, ``functools.partial`` objects and ``jax.jit``-ed functions are. It returns one
    array or a tuple of ``num_outputs`` arrays.

    ``formattable`` and ``acceleratable`` are per instance here (class attributes on other
    layers): ``formattable=False`` (default) passes plain arrays and gives the outputs the
    input's format; ``formattable=True`` passes ``df.FormattedArray`` inputs and expects
    formatted outputs. ``acceleratable=False`` makes networks run the function eagerly (Python
    control flow on values).

    Args:
      fn: the function, ``fn(*X) -> Y`` or ``(Y1, ..., YM)``.
      formattable: whether ``fn`` takes and returns formatted arrays (default False).
      acceleratable: whether networks may compile ``fn`` into their trace (default True).
      num_inputs: the number of inputs; default: the number of required positional parameters
        of ``fn`` (1 when it takes ``*args``).
      num_outputs: the number of outputs (default 1).
      description: a one-line description (default ``"FunctionLayer(<fn name>)"``).

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> layer = df.layers.FunctionLayer(lambda x, y: x * y)
      >>> layer.num_inputs, layer.input_names
      (2, ('in1', 'in2'))
      >>> x = df.dlarray(jnp.full((1, 2), 3.0), "BC")
      >>> layer(x, x)
      FormattedArray('BC', float32[1,2])
      [[9. 9.]]
    """

    fn: Callable[..., Any]
    _: dataclasses.KW_ONLY
    # Per layer here (Layer's are per class): fields that override its class-level defaults.
    formattable: bool = False  # pyright: ignore[reportIncompatibleVariableOverride]
    acceleratable: bool = True  # pyright: ignore[reportIncompatibleVariableOverride]

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise bad_argument(
                self,
                "fn",
                "a function fn(*X) -> Y",
                self.fn,
                "e.g. FunctionLayer(jax.nn.gelu) or FunctionLayer(lambda x: x * 2).",
            )
        try:
            hash(self.fn)
        except TypeError:
            raise bad_argument(
                self,
                "fn",
                "a hashable callable (it is static configuration, part of the trace's key)",
                self.fn,
                "wrap the callable in a plain function, e.g. lambda *x: obj(*x).",
            ) from None
        for name in ("formattable", "acceleratable"):
            if not isinstance(getattr(self, name), bool):
                raise bad_argument(
                    self, name, "True or False", getattr(self, name), f"e.g. {name}=True."
                )
        if self.num_inputs is None and self.input_names is None:
            arity = _arity(self.fn)
            if arity:  # else the ports resolve it (one input)
                self.num_inputs = arity
        if not self.description:
            name = getattr(self.fn, "__name__", type(self.fn).__name__)
            self.description: str = f"FunctionLayer({name})"

    def predict(self, *inputs: Data) -> Output:
        return self.fn(*inputs)

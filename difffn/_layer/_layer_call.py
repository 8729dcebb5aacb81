"""Calling a layer: formats in and out, the user's method invoked, its returns split and checked.

`call_layer` is how ``layer(*X)``, networks and the checkers run a layer. A layer with
``formattable = False`` receives plain arrays and its outputs take the format of its first
formatted input; a ``formattable = True`` layer receives and returns ``FormattedArray``\\ s. A
layer with a custom ``backward`` runs through ``_layer_backward``. A user method that uses Python
control flow on traced values, or passes a ``FormattedArray`` to ``jax.numpy``, gets a named error
with the fixes (``_user_code``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp

from .._core import (
    FormattedArray,
    ForwardError,
    LayerError,
    accepts_key,
    accepts_mask,
    dims,
    dlarray,
    has_backward,
    has_method,
    is_array,
    stripdims,
    who,
)
from .._core import user_code as _user_code
from ._fields import LEARNABLE, is_network
from ._layer_backward import call_with_backward


def call_layer(layer, inputs: Sequence[Any], *, training: bool = False, key=None, mask=None):
    """Run one layer: formats, custom backward, checks. Returns ``(outputs, new_state)``.

    Args:
      layer: the layer.
      inputs: one value per layer input (FormattedArray or plain array).
      training: use ``forward`` (training-time behaviour) instead of ``predict``.
      key: randomness for ``forward``.
      mask: the padding mask ``(batch, time)`` of the first input, passed to the layer's
        method as ``mask=`` when it takes one (``_signatures.accepts_mask``), else unused.

    Raises:
      LayerError: the layer is not initialized (a parameter is still ``None``), gets the
        wrong number of inputs, or takes a mask but also defines its own backward.
    """
    cls = type(layer)
    if not has_method(layer, "predict"):
        raise LayerError(
            f"{cls.__name__} does not define predict; every layer needs `def predict(self, *X)`."
        )
    if not layer.initialized:
        raise _uninitialized(layer)
    if len(inputs) != layer.num_inputs:
        raise LayerError(
            f"{who(layer)} takes {layer.num_inputs} input(s) "
            f"{list(layer.input_names)}; got {len(inputs)}."
        )
    out_format = next((dims(x) for x in inputs if dims(x)), "")
    if layer.formattable:
        user_inputs = tuple(inputs)
    else:
        user_inputs = tuple(stripdims(x) for x in inputs)
    if has_backward(layer):
        if mask is not None and accepts_mask(cls):
            raise LayerError(
                f"{who(layer)} takes a padding mask (predict has a 'mask' parameter) and defines "
                "its own backward; a mask cannot reach a custom backward yet. Fix: drop the "
                "backward (JAX differentiates predict), or the mask parameter."
            )
        outputs, new_state = call_with_backward(layer, user_inputs, training, key, run_user)
    else:
        outputs, new_state, _ = run_user(layer, user_inputs, training, key, mask)
    return _format_outputs(layer, outputs, out_format), tuple(new_state)


def _uninitialized(layer) -> LayerError:
    empty = [n for n in (*layer.learnable_names, *layer.state_names) if getattr(layer, n) is None]
    networks = [
        n for n in layer.learnable_names if is_network(v := getattr(layer, n)) and not v.initialized
    ]
    what = f"parameter(s) {empty} are None" if empty else ""
    if networks:
        what += (" and " if what else "") + f"the network(s) in {networks} are not initialized"
    return LayerError(
        f"{who(layer)}: {what}, so the layer cannot run. Fix: call "
        "layer.initialize(layout, key=key) (or net.initialize) first, or pass them to the "
        "constructor."
    )


def run_user(layer, inputs, training: bool, key, mask=None):
    """Run predict or forward (with its memory), normalized to (outputs, state, memory)."""
    custom_backward = has_backward(layer)
    if training and has_method(layer, "forward"):
        result = _invoke(layer, "forward", inputs, key, mask)
        return _split_returns(layer, "forward", result, with_memory=custom_backward)
    result = _invoke(layer, "predict", inputs, key, mask)
    outputs, new_state, _ = _split_returns(layer, "predict", result, with_memory=False)
    return outputs, new_state, None


def _invoke(layer, method: str, args, key, mask=None):
    """Call a user method; what JAX cannot trace in it is named (``_user_code``)."""
    cls = type(layer)
    fn = getattr(layer, method)
    kwargs = {"key": key} if method == "forward" and accepts_key(cls, "forward") else {}
    if mask is not None and accepts_mask(cls, method):
        kwargs["mask"] = mask
    if layer.acceleratable:
        fix = (
            f"{_user_code.TRACEABLE_FIX}, or set `acceleratable = False` on the class so "
            "networks run this layer eagerly (outside the compiled trace)"
        )
    else:
        fix = (
            "call it outside jax.jit, or use jnp.where / jax.lax.cond (the class sets "
            "acceleratable = False, so networks run it eagerly, but here it is being traced "
            "anyway, inside jax.jit or another staging transformation)"
        )
    return _user_code.call(fn, *args, what=who(layer, method), fix=fix, **kwargs)


def _split_returns(layer, method: str, result, with_memory: bool):
    """Split a user predict/forward result into (outputs, state values, memory)."""
    cls = type(layer)
    state_names = layer.state_names
    m, k = layer.num_outputs, len(state_names)
    total = m + k + (1 if with_memory else 0)
    if result is None:
        raise ForwardError(
            f"{who(layer, method)} returned None; expected {total} value(s) ({m} output(s)"
            + (f", then the state field(s) {list(state_names)}" if k else "")
            + "). Fix: add the missing `return`."
        )
    if total == 1 and not isinstance(result, (tuple, list)):
        result = (result,)
    if not isinstance(result, (tuple, list)) or len(result) != total:
        got = (
            f"{len(result)} values"
            if isinstance(result, (tuple, list))
            else "a single array"
            if is_array(result) or isinstance(result, FormattedArray)
            else f"a single {type(result).__name__}"
        )
        parts = [f"{m} output(s)"]
        if k:
            parts.append(
                f"the new values of the {k} state field(s) {list(state_names)} (a nested "
                "network's state table, e.g. from self.net.forward(...), for a network field)"
                if any(cls._field_kinds[n] == LEARNABLE for n in state_names)
                else f"the new values of the {k} state field(s) {list(state_names)}"
            )
        if with_memory:
            parts.append("a memory value for backward")
        raise ForwardError(
            f"{who(layer, method)} returned {got}; expected {total}: "
            f"{', then '.join(parts)}. Fix: return them in that order"
            + (" (memory may be None)." if with_memory else ".")
        )
    result = tuple(result)
    memory = result[m + k] if with_memory else None
    return result[:m], result[m : m + k], memory


def _format_outputs(layer, outputs, out_format: str):
    formatted = []
    for i, y in enumerate(outputs):
        if layer.formattable:
            if out_format and not isinstance(y, FormattedArray):
                raise LayerError(
                    f"{who(layer)} is formattable but its output "
                    f"{layer.output_names[i]!r} is a plain array. Fix: return "
                    "df.dlarray(y, fmt) with the output's format."
                )
            formatted.append(y)
            continue
        if isinstance(y, FormattedArray):
            y = y.data
        if out_format:
            if jnp.ndim(y) != len(out_format):
                raise LayerError(
                    f"{who(layer)} output {layer.output_names[i]!r} has "
                    f"{jnp.ndim(y)} dimensions but its input format {out_format!r} has "
                    f"{len(out_format)}; a layer with formattable = False gives its outputs the "
                    "input's format. Fix: set `formattable = True` on the class and return "
                    "df.dlarray(y, new_format)."
                )
            y = dlarray(y, out_format)
        formatted.append(y)
    return tuple(formatted)

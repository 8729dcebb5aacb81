"""The layer under ``check_layer``: its test data, and its methods run as the runtime runs them.

`LayerSubject` is what every test of ``check_layer`` works on: the (initialized) layer, the
layouts with their concrete sizes, deterministic inputs and keys, what ``predict``, ``forward``
and ``backward`` returned (``None`` until they ran), and how to run them: compiled when the layer
is acceleratable, eagerly otherwise. This module is the checker's one door into ``_layer``.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from .._core import FormattedArray, Layout, dlarray, has_backward, stripdims, type_name
from .._core import backward_takes_state as _backward_takes_state
from .._core import has_method as _has_method
from .._layer import Layer, NetworkBase, call_layer
from .._layer import run_user as _run_user
from ._check_common import Data, declared_surrogates, describe_value, is_array
from ._check_report import Recorder, failed, incomplete, skipped

__all__ = [
    "Layer",
    "LayerSubject",
    "NetworkBase",
    "call_layer",
    "concrete_shape",
    "has_backward",
    "has_method",
    "run_user",
    "user_inputs",
]

DEFAULT_BATCH = 4
DEFAULT_SIZE = 8

has_method = _has_method
run_user = _run_user


def concrete_shape(layout: Layout) -> tuple[int, ...]:
    """The layout's sizes with ``None`` replaced: 4 for ``B``, 8 otherwise."""
    return tuple(
        (DEFAULT_BATCH if label == "B" else DEFAULT_SIZE) if size is None else size
        for size, label in zip(layout.shape, layout.format, strict=True)
    )


def user_inputs(layer, inputs, formats):
    """What the user's methods receive: formatted inputs if formattable, else plain arrays."""
    if layer.formattable:
        return tuple(
            dlarray(stripdims(x), f) if f else x for x, f in zip(inputs, formats, strict=True)
        )
    return tuple(stripdims(x) for x in inputs)


def like(cotangent, primal):
    """``cotangent`` with ``primal``'s format, if it has one."""
    if isinstance(primal, FormattedArray):
        return dlarray(cotangent, primal.format)
    return cotangent


class LayerSubject:
    """The layer under check, its data, and what its methods returned so far."""

    def __init__(self, layer, layouts, key, recorder: Recorder, precision: str | None = None):
        self.layer = layer
        self.precision = precision  # the compute dtype to check at too (None: not asked)
        self.cls = type(layer)
        self.layouts = tuple(layouts)
        self.shapes = tuple(concrete_shape(layout) for layout in layouts)
        self.formats = tuple(layout.format for layout in layouts)
        self.key = key  # initialize gets the caller's key itself
        self.surrogates = declared_surrogates(
            self.cls, "check_layer", layer.input_names, layer.learnable_names
        )
        self.rec = recorder
        self.notes: list[str] = []
        self.data = Data(key)
        self.xs = tuple(
            self.data.normal(10 + i, shape, jnp.float32) for i, shape in enumerate(self.shapes)
        )
        self.forward_key = self.data.key(2)
        # What the layer's methods returned, None until they ran (``require`` checks):
        self.predicted: Any = None  # (outputs, state)
        self.forwarded: Any = None  # (outputs, state, memory)
        self.backward_result: Any = None  # (raw result, takes_state)
        self.usable = True

    @property
    def names(self) -> dict:
        layer = self.layer
        return {
            "inputs": tuple(layer.input_names),
            "outputs": tuple(layer.output_names),
            "learnables": tuple(layer.learnable_names),
            "states": tuple(layer.state_names),
        }

    @property
    def custom_backward(self) -> bool:
        return has_backward(self.layer)

    def takes_state(self) -> bool:
        """Whether backward takes the state gradients (raises ``LayerError`` when its
        signature fits neither form)."""
        layer = self.layer
        return _backward_takes_state(self.cls, layer.num_inputs, layer.num_outputs)

    def require(self, *which):
        """Incomplete unless ``predicted``/``forwarded`` (the names given) ran."""
        for name in which:
            if getattr(self, name) is None:
                method = "predict" if name == "predicted" else "forward"
                raise incomplete(f"{method} did not run (see {method}_runs)")

    def output_format(self, y) -> str:
        """The format an output carries, or gets from the inputs (non-formattable layers)."""
        if isinstance(y, FormattedArray):
            return y.format
        if self.layer.formattable:
            return ""
        return next((f for f in self.formats if f), "")

    # -- running the user's methods --

    def run(self, layer, xs, training: bool, *, abstract: bool = False):
        """The user's predict (or forward) on ``xs``: compiled when the layer is acceleratable.

        ``abstract``: only shapes and dtypes are needed, so trace without compiling.
        """
        key = self.forward_key if training else None
        run = functools.partial(_run_plain, formats=self.formats, training=training)
        args = (layer, tuple(xs), key)
        if abstract:
            return self._traced_or_eager(jax.eval_shape, run, args)
        return self._traced_or_eager(lambda _, *a: _run_jit(*a, self.formats, training), run, args)

    def _traced_or_eager(self, trace, fn, args):
        """``trace(fn, *args)`` (compiled or abstract) for an acceleratable layer, else eager.

        When tracing fails, ``fn`` runs eagerly: an error there is the user's own, and clearer;
        if it runs, the layer cannot be traced although it is acceleratable, which is the finding.
        """
        if not self.cls.acceleratable:
            return fn(*args)
        try:
            return trace(fn, *args)
        except Exception as traced_error:
            fn(*args)
            raise traced_error from None

    def check_returned(self, method: str, outs):
        for name, y in zip(self.names["outputs"], outs, strict=True):
            if not is_array(y):
                raise failed(
                    f"{self.cls.__name__}.{method} returned {describe_value(y)} as output "
                    f"{name!r}; expected an array. Fix: return jax arrays."
                )

    # -- the user's backward --

    def needs_backward(self):
        if not self.custom_backward:
            raise skipped("the layer defines no backward; JAX autodiff differentiates it")
        self.require("forwarded")

    def backward(self, layer, xs, *, abstract: bool = False):
        """Run forward and call the user's backward with random upstream gradients.

        Returns ``(raw result, takes_state)``. ``abstract``: only shapes and dtypes are needed.
        """
        takes_state = _backward_takes_state(self.cls, layer.num_inputs, layer.num_outputs)
        outs, state, _ = self.run(layer, xs, True, abstract=True)
        values = list(outs) + (list(state) if takes_state else [])
        cotangents = tuple(
            self.data.normal(50 + i, stripdims(v).shape, stripdims(v).dtype)
            for i, v in enumerate(values)
        )
        args = (layer, tuple(xs), cotangents, self.forward_key)
        static = {"formats": self.formats, "takes_state": takes_state}
        call = functools.partial(_backward_call, **static)
        if abstract:
            return self._traced_or_eager(jax.eval_shape, call, args), takes_state
        compiled = self._traced_or_eager(lambda _, *a: _backward_jit(*a, **static), call, args)
        return compiled, takes_state

    def expected_gradients(self, layer, xs, takes_state):
        """(kind, name, value) of each value backward must return a gradient for, in order."""
        names = self.names
        expected = [("input", n, x) for n, x in zip(names["inputs"], xs, strict=True)]
        expected += [("learnable", n, getattr(layer, n)) for n in names["learnables"]]
        if takes_state:
            expected += [("state", n, getattr(layer, n)) for n in names["states"]]
        return expected

    def gradients(self, layer, xs, *, abstract: bool = False):
        """The backward's gradients paired with what they are for, and their expected order.

        Fails (the test) when backward returns the wrong number of values.
        """
        if layer is self.layer and xs is self.xs and self.backward_result is not None:
            grads, takes_state = self.backward_result
        else:
            grads, takes_state = self.backward(layer, xs, abstract=abstract)
        expected = self.expected_gradients(layer, xs, takes_state)
        if len(expected) == 1 and not isinstance(grads, (tuple, list)):
            grads = (grads,)
        order = ", ".join(f"dLd{name}" for _, name, _ in expected)
        if not isinstance(grads, (tuple, list)) or len(grads) != len(expected):
            got = f"{len(grads)} values" if isinstance(grads, (tuple, list)) else type_name(grads)
            raise failed(
                f"backward returned {got}; expected {len(expected)} gradients: {order} (inputs, "
                "then learnables in declaration order"
                + (", then state" if takes_state else "")
                + "). Fix: return one gradient per value, in that order."
            )
        return list(zip(expected, grads, strict=True)), order


def _run_plain(layer, xs, key, formats, training):
    return _run_user(layer, user_inputs(layer, xs, formats), training, key)


_run_jit = jax.jit(_run_plain, static_argnames=("formats", "training"))


def _backward_call(layer, xs, cotangents, forward_key, formats, takes_state):
    """Forward, then the user's backward with the given upstream gradients; its raw result.

    ``cotangents``: one per output, then (if ``takes_state``) one per state output.
    """
    inputs = user_inputs(layer, xs, formats)
    outs, state, memory = _run_user(layer, inputs, True, forward_key)
    dys = [
        like(jnp.asarray(c, stripdims(y).dtype), y) for c, y in zip(cotangents, outs, strict=False)
    ]
    extra = []
    if takes_state:
        extra = [
            jnp.asarray(c, stripdims(s).dtype)
            for c, s in zip(cotangents[len(outs) :], state, strict=True)
        ]
    return layer.backward(*inputs, *outs, *dys, *extra, memory)


_backward_jit = jax.jit(_backward_call, static_argnames=("formats", "takes_state"))

"""``check_function``'s gradient tests: the function as a numerical model, and the verdicts.

``gradients_are_correct[NAME]`` per floating-point input (the backward's gradient against
numerical derivatives, JAX autodiff of forward as the reference), and
``second_order_gradients_are_correct`` (``_check_second_order``). An input named in the class's
``surrogate_gradients`` is Skipped with the declared reason; a forward that computes in a
narrower dtype inside is compared with JAX autodiff at that dtype's tolerance.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from . import _check_second_order as second_order
from . import _numerical as numerical
from ._check_common import (
    SURROGATE_HINT,
    CheckModel,
    cast_floating,
    gradient_outcome,
    gradients_or_without_autodiff,
    index_text,
    is_array,
    narrowest_float,
    reference_outcome,
)
from ._format import stripdims
from ._function import DifferentiableFunction, run_forward


def differentiable(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.inexact)


def all_flags(xs) -> tuple[bool, ...]:
    return tuple(differentiable(x) for x in xs)


def call_backward(fcn, xs, cotangents, flags):
    """The user's backward, called as the runtime calls it; its result as a tuple."""
    cls = type(fcn)
    outputs, memory = run_forward(fcn, xs)
    saved_inputs = tuple(xs) if cls.save_inputs_for_backward else ()
    saved_outputs = tuple(outputs) if cls.save_outputs_for_backward else ()
    cotangents = [jnp.asarray(c, y.dtype) for c, y in zip(cotangents, outputs, strict=True)]
    result = fcn.backward(*cotangents, flags, *saved_inputs, *saved_outputs, *memory)
    if len(xs) == 1 and not isinstance(result, (tuple, list)):
        result = (result,)
    return tuple(result) if isinstance(result, (tuple, list)) else result


@dataclasses.dataclass(frozen=True)
class FunctionModel(CheckModel):
    """The function's outputs as a function of its floating inputs (hashable, static).

    ``args``: ``(inputs, upstream gradients)``.
    """

    fcn: DifferentiableFunction
    checked: tuple[int, ...]
    shapes: tuple[tuple[int, ...], ...]
    with_backward: bool = True
    with_autodiff: bool = True
    traceable: bool = True

    def inputs(self, args, parts):
        xs = list(args[0])
        for i, shape, flat in zip(self.checked, self.shapes, parts, strict=True):
            xs[i] = flat.reshape(shape)
        return xs

    def outputs(self, args, parts):
        return list(run_forward(self.fcn, self.inputs(args, parts))[0])

    def runtime_outputs(self, args, parts):
        out = self.fcn(*self.inputs(args, parts))
        return list(out) if isinstance(out, tuple) else [out]

    def cotangents(self, args):
        return args[1]

    def backward_gradient(self, args, parts):
        xs = self.inputs(args, parts)
        grads = call_backward(self.fcn, xs, list(args[1]), all_flags(xs))
        pieces = []
        for i, shape in zip(self.checked, self.shapes, strict=True):
            g = grads[i] if isinstance(grads, tuple) and len(grads) == len(xs) else None
            if is_array(g) and tuple(g.shape) == shape:
                pieces.append(jnp.ravel(stripdims(g)).astype(jnp.float64))
            else:
                pieces.append(jnp.full((math.prod(shape),), jnp.nan, jnp.float64))
        return jnp.concatenate(pieces)


class FunctionGradients:
    """The gradient tests of one check: the float64 point, the model, and the words."""

    def __init__(self, fcn, xs, names, data):
        self.fcn, self.cls, self.names, self.data = fcn, type(fcn), names, data
        self.shapes = tuple(tuple(x.shape) for x in xs)
        self._xs = xs
        self.who = f"{self.cls.__name__}.backward"

    def point(self, checked):
        """``(model, args, segments, base, scale, parts)`` for the inputs ``checked``."""
        xs = tuple(cast_floating(self._xs, "float64"))
        shapes = tuple(tuple(xs[i].shape) for i in checked)
        model = FunctionModel(self.fcn, tuple(checked), shapes)
        segments, base, scale, parts = numerical.lay_out(
            [str(i) for i in checked], [np.ravel(np.asarray(xs[i], np.float64)) for i in checked]
        )
        try:
            shapes_out = jax.eval_shape(lambda p: model.outputs((xs, ()), p), parts)
        except Exception:  # noqa: BLE001 - not traceable: evaluate eagerly, without autodiff
            model = dataclasses.replace(model, traceable=False, with_autodiff=False)
            shapes_out = model.outputs((xs, ()), parts)
        cotangents = tuple(
            self.data.normal(60 + i, tuple(y.shape), jnp.float64) for i, y in enumerate(shapes_out)
        )
        return model, (xs, cotangents), segments, base, scale, parts

    def locate(self, i):
        return lambda k: index_text(k, self.shapes[i])

    def first_order(self, checked) -> dict:
        """``{input index: Outcome}`` for the inputs ``checked``. Runs with float64 enabled."""
        if not checked:
            return {}
        model, args, segments, base, scale, parts = self.point(checked)
        model, grads, note = gradients_or_without_autodiff(model, args, parts)
        labels = {str(i): f"input {self.names[i]!r}" for i in checked}
        order = ", ".join(f"dLd{n}" for n in self.names)

        def fix(i):
            return (
                f"Fix: check backward's formula for dLd{self.names[i]}: by the chain rule it "
                f"is the sum over outputs of dLdY * dY/d{self.names[i]} (multiply by the "
                "upstream gradient; for an input broadcast in forward, sum over the broadcast "
                f"axes); backward returns {order}, in forward's input order. "
                + SURROGATE_HINT.format(name=self.names[i])
            )

        dtype = None
        if model.traceable and "autodiff" in grads:
            dtype = narrowest_float(lambda p: model.outputs(args, p), parts)
        if dtype is not None:
            return {
                i: reference_outcome(
                    labels[str(i)],
                    grads["backward"][s.start : s.stop],
                    grads["autodiff"][s.start : s.stop],
                    dtype=dtype,
                    size=" x ".join(str(n) for n in self.shapes[i]) or "a scalar",
                    locate=self.locate(i),
                    who=self.who,
                    fix=fix(i),
                )
                for i, s in zip(checked, segments, strict=True)
            }
        verdicts = numerical.check_gradients(
            model, args, base, scale, args[1], segments, seed=self.data.seq(7), gradients=grads
        )
        return {
            i: gradient_outcome(
                str(i),
                verdicts,
                labels,
                shape=self.shapes[i],
                locate=self.locate(i),
                who=self.who,
                fix=fix(i),
                note=note,
            )
            for i in checked
        }

    def second_order(self, checked, *, trust_reference: bool):
        """The outcome of ``second_order_gradients_are_correct``. Runs with float64 enabled."""
        model, args, segments, base, scale, parts = self.point(checked)
        point = second_order.Point(
            model,
            args,
            base,
            scale,
            parts,
            tuple(segments),
            {str(i): f"input {self.names[i]!r}" for i in checked},
            {str(i): self.locate(i) for i in checked},
        )
        return second_order.second_order_outcome(
            point, self.data, who=self.who, trust_reference=trust_reference
        )

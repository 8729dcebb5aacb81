"""``check_function``'s gradient tests: the function as a numerical model, and the verdicts.

``gradients_are_correct[NAME]`` per floating-point input, or per floating-point leaf of a pytree
input (NAME with the leaf's path: ``params['w']``): the backward's gradient against numerical
derivatives, JAX autodiff of forward as the reference; and
``second_order_gradients_are_correct`` (``_check_second_order``). An input named in the class's
``surrogate_gradients`` (every leaf of it) is Skipped with the declared reason; a forward that
computes in a narrower dtype inside is compared with JAX autodiff at that dtype's tolerance.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from .._function import DifferentiableFunction, run_forward
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
from ._check_function_inputs import ExampleInputs, call_backward, leaf_gradients


@dataclasses.dataclass(frozen=True)
class FunctionModel(CheckModel):
    """The function's output leaves as a function of its checked input leaves (hashable, static).

    ``args``: ``(input leaves, upstream gradients: one per output leaf)``.
    """

    fcn: DifferentiableFunction
    # of the inputs tuple (jax aliases PyTreeDef from jaxlib, which pyright does not resolve)
    tree: jax.tree_util.PyTreeDef  # pyright: ignore[reportInvalidTypeForm]
    checked: tuple[int, ...]  # leaf indices
    shapes: tuple[tuple[int, ...], ...]
    with_backward: bool = True
    with_autodiff: bool = True
    traceable: bool = True

    def inputs(self, args, parts):
        leaves = list(args[0])
        for k, shape, flat in zip(self.checked, self.shapes, parts, strict=True):
            leaves[k] = flat.reshape(shape)
        return jax.tree.unflatten(self.tree, leaves)

    def outputs(self, args, parts):
        return jax.tree.leaves(run_forward(self.fcn, self.inputs(args, parts))[0])

    def runtime_outputs(self, args, parts):
        return jax.tree.leaves(self.fcn(*self.inputs(args, parts)))

    def cotangents(self, args):
        return args[1]

    def backward_gradient(self, args, parts):
        xs = self.inputs(args, parts)
        inputs = ExampleInputs(xs, [str(i) for i in range(len(xs))])
        grads = call_backward(self.fcn, xs, list(args[1]), inputs.all_flags())
        try:
            found = leaf_gradients(self.fcn, inputs, grads)
        except Exception:  # noqa: BLE001 - backward_returns_valid_gradients names it
            found = [None] * len(inputs.leaves)
        pieces = []
        for k, shape in zip(self.checked, self.shapes, strict=True):
            g = found[k]
            if g is not None and is_array(g) and tuple(g.shape) == shape:
                pieces.append(jnp.ravel(g).astype(jnp.float64))
            else:
                pieces.append(jnp.full((math.prod(shape),), jnp.nan, jnp.float64))
        return jnp.concatenate(pieces)


class FunctionGradients:
    """The gradient tests of one check: the float64 point, the model, and the words."""

    def __init__(self, fcn, inputs: ExampleInputs, data):
        self.fcn, self.cls, self.inputs, self.data = fcn, type(fcn), inputs, data
        self.shapes = inputs.shapes
        self.who = f"{self.cls.__name__}.backward"

    def point(self, checked):
        """``(model, args, segments, base, scale, parts)`` for the input leaves ``checked``."""
        leaves = tuple(cast_floating(self.inputs.leaves, "float64"))
        shapes = tuple(self.shapes[k] for k in checked)
        model = FunctionModel(self.fcn, self.inputs.tree, tuple(checked), shapes)
        segments, base, scale, parts = numerical.lay_out(
            [str(k) for k in checked],
            [np.ravel(np.asarray(leaves[k], np.float64)) for k in checked],
        )
        try:
            shapes_out = jax.eval_shape(lambda p: model.outputs((leaves, ()), p), parts)
        except Exception:  # noqa: BLE001 - not traceable: evaluate eagerly, without autodiff
            model = dataclasses.replace(model, traceable=False, with_autodiff=False)
            shapes_out = model.outputs((leaves, ()), parts)
        cotangents = tuple(
            self.data.normal(60 + i, tuple(y.shape), jnp.float64) for i, y in enumerate(shapes_out)
        )
        return model, (leaves, cotangents), segments, base, scale, parts

    def locate(self, k):
        return lambda i: index_text(i, self.shapes[k])

    def first_order(self, checked) -> dict:
        """``{leaf index: Outcome}`` for the input leaves ``checked``. Runs with float64 enabled."""
        if not checked:
            return {}
        model, args, segments, base, scale, parts = self.point(checked)
        model, grads, note = gradients_or_without_autodiff(model, args, parts)
        inputs = self.inputs
        labels = {str(k): inputs.label(k) for k in checked}
        order = ", ".join(f"dLd{n}" for n in inputs.names)

        def fix(k):
            name = inputs.leaf_names[k]
            return (
                f"Fix: check backward's formula for dLd{name}: by the chain rule it is the sum "
                f"over outputs of dLdY * dY/d{name} (multiply by the upstream gradient; for an "
                f"input broadcast in forward, sum over the broadcast axes); backward returns "
                f"{order}, in forward's input order. "
                + SURROGATE_HINT.format(name=inputs.names[inputs.owner[k]])
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
            {str(k): self.inputs.label(k) for k in checked},
            {str(i): self.locate(i) for i in checked},
        )
        return second_order.second_order_outcome(
            point, self.data, who=self.who, trust_reference=trust_reference
        )

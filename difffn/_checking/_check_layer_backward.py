"""``check_layer``'s tests of the backward pass (not its numbers), autodiff, and export.

The custom backward runs and returns one gradient per input and learnable (and state, when it
takes ``dLdSout``) with the right shapes and dtypes; a layer without one is differentiated by JAX
autodiff with finite gradients; with ``check_export=True``, ``predict`` exports with
``jax.export`` and matches, derivative included. Each test is a function of the
`LayerSubject`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .._core import dlarray, stripdims
from .._persistence import jax_export as _export
from ._check_common import cast_floating, compare, describe_value, is_array, is_floating, shape_text
from ._check_layer_subject import LayerSubject, call_layer, has_backward
from ._check_report import failed, skipped

EXPORT_RTOL = 1e-5


def backward_runs(s: LayerSubject):
    s.needs_backward()
    s.backward_result = None
    s.backward_result = s.backward(s.layer, s.xs)


def backward_returns_valid_gradients(s: LayerSubject):
    s.needs_backward()
    pairs, order = s.gradients(s.layer, s.xs)
    problems = []
    for (kind, name, value), grad in pairs:
        problem = gradient_problem(grad, value)
        if problem:
            problems.append(f"the gradient of {kind} {name!r} {problem}")
    if problems:
        return failed(
            "backward returned invalid gradients: "
            + "; ".join(problems)
            + f". Expected, in order: {order}, each with the shape of its value. Fix: for a "
            "parameter broadcast in forward, sum over the broadcast axes with keepdims=True."
        )
    return None


def gradient_problem(grad, value) -> str:
    """``"is None"``, ``"has shape (4, 3); expected (1, 3)"``... or ``""`` for a usable gradient
    (an array, or a pytree of arrays shaped like ``value``'s leaves)."""
    grad = stripdims(grad)
    if grad is None:
        return "is None"
    leaves_g = [stripdims(g) for g in jax.tree.leaves(grad)]
    leaves_v = jax.tree.leaves(stripdims(value))
    if len(leaves_g) != len(leaves_v) or not all(is_array(g) for g in leaves_g):
        return f"is {describe_value(grad)}"
    for g, v in zip(leaves_g, leaves_v, strict=True):
        if tuple(g.shape) != tuple(np.shape(v)):
            return f"has shape {shape_text(g.shape)}; expected {shape_text(np.shape(v))}"
    return ""


def backward_keeps_dtype(s: LayerSubject, dtype: str):
    s.needs_backward()
    with jax.enable_x64(True):
        layer, xs = cast_floating(s.layer, dtype), cast_floating(s.xs, dtype)
        pairs, _ = s.gradients(layer, xs, abstract=True)
        problems = []
        for (kind, name, _), grad in pairs:
            for g in jax.tree.leaves(stripdims(grad)):
                g = stripdims(g)
                if is_floating(g) and g.dtype != np.dtype(dtype):
                    problems.append(f"the gradient of {kind} {name!r} is {g.dtype}")
    if problems:
        return failed(
            f"with {dtype} inputs and parameters, backward returned "
            + "; ".join(problems)
            + f"; expected {dtype}. Fix: compute gradients in the dtype of their values (no "
            "np.float64 constants or fixed-dtype casts)."
        )
    return None


def autodiff_works(s: LayerSubject, method: str):
    if has_backward(s.layer):
        return skipped("the layer defines backward, which replaces autodiff")
    training = method == "forward"
    s.require("forwarded" if training else "predicted")
    layer = s.layer
    xs = tuple(dlarray(x, f) if f else x for x, f in zip(s.xs, s.formats, strict=True))
    learnables = {n: getattr(layer, n) for n in s.names["learnables"]}

    def loss(learnables, xs, cotangents):
        outs, _ = call_layer(layer.replace(**learnables), xs, training=training, key=s.forward_key)
        return sum(jnp.sum(stripdims(y) * c) for y, c in zip(outs, cotangents, strict=True))

    outs = (s.forwarded if training else s.predicted)[0]
    cotangents = [
        s.data.normal(80 + i, stripdims(y).shape, stripdims(y).dtype) for i, y in enumerate(outs)
    ]
    grad_fn = jax.grad(loss, argnums=(0, 1))
    if s.cls.acceleratable:
        grad_fn = jax.jit(grad_fn)
    grads = grad_fn(learnables, xs, cotangents)
    problems = []
    for path, g in jax.tree_util.tree_flatten_with_path(grads)[0]:
        if not bool(jnp.all(jnp.isfinite(g))):
            problems.append(f"the gradient at {jax.tree_util.keystr(path)} is not finite")
    if problems:
        return failed(f"autodiff through {method}: " + "; ".join(problems))
    return None


def export_matches_predict(s: LayerSubject, check_export: bool):
    if not check_export:
        return skipped("check_export=False")
    s.require("predicted")
    cls = s.cls
    if not cls.acceleratable:
        return failed(
            f"{cls.__name__} sets acceleratable = False: it runs eagerly and cannot be "
            "traced, so jax.export cannot export it. Fix: express value-dependent branches "
            "with jnp.where or jax.lax.cond and drop acceleratable = False."
        )
    layer, formats = s.layer, s.formats

    def predict(*xs):
        inputs = [dlarray(x, f) if f else x for x, f in zip(xs, formats, strict=True)]
        outs, state = call_layer(layer, inputs, training=False)
        return tuple(stripdims(v) for v in (*outs, *state))

    loaded = _export.load_function(_export.export_bytes(predict, *s.layouts))
    batch_sizes: list[int | None] = [None]
    if any(layout.size("B") is None for layout in s.layouts if "B" in layout.format):
        batch_sizes.append(1)
    problems = []
    for batch in batch_sizes:
        xs = list(s.xs)
        if batch is not None:
            xs = [
                jax.lax.slice_in_dim(x, 0, batch, axis=f.find("B")) if "B" in f else x
                for x, f in zip(xs, formats, strict=True)
            ]
        expected, got = predict(*xs), loaded(*xs)
        for i, (e, g) in enumerate(zip(expected, got, strict=True)):
            problems += compare(f"value {i + 1}", e, g, EXPORT_RTOL)
        cotangents = [jnp.ones_like(e) for e in expected]
        expected_vjp = jax.vjp(predict, *xs)[1](tuple(cotangents))
        got_vjp = jax.vjp(loaded, *xs)[1](tuple(cotangents))
        for i, (e, g) in enumerate(zip(expected_vjp, got_vjp, strict=True)):
            problems += compare(f"the gradient of input {i + 1}", e, g, EXPORT_RTOL)
    if problems:
        return failed("the exported predict differs: " + "; ".join(problems))
    return None

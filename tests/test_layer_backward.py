"""A layer's custom backward: what it keeps, second order, and its signature checks.

Gradients are compared with JAX autodiff of the same math in float64; second-order semantics
with a ``jax.custom_vjp`` whose fwd calls the function itself (JAX's recommended pattern).
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import ROOT, assert_tree_allclose, run_python

import difffn as df
from difffn._layer._layer_call import call_layer


def prelu_reference(alpha, x):
    return jnp.maximum(x, 0) + alpha * jnp.minimum(x, 0)


class PReLUAll(df.Layer):
    """PReLU whose backward takes every argument by name: X, Y and memory are kept."""

    alpha: jax.Array | None = df.learnable(default=None)
    seen = []  # a class attribute without annotation: a log, not a field

    def predict(self, x):
        return prelu_reference(self.alpha, x)

    def backward(self, x, y, dLdY, memory):
        PReLUAll.seen.append((x is None, y is None, memory is None))
        dx = jnp.where(x > 0, dLdY, self.alpha * dLdY)
        dalpha = jnp.sum(jnp.where(x > 0, 0.0, x * dLdY), axis=0, keepdims=True)
        return dx, dalpha


class PReLUSlim(PReLUAll):
    """The same backward with MATLAB's ``~``: Y and memory are not kept, and arrive as None."""

    def backward(self, x, _y, dLdY, _memory):
        return super().backward(x, _y, dLdY, _memory)


class ReLUFromOutput(df.Layer):
    """A backward that needs only Y: the input is not kept."""

    seen = []  # a class attribute without annotation: a log, not a field

    def predict(self, x):
        return jnp.maximum(x, 0)

    def backward(self, _x, y, dLdY, _memory):
        ReLUFromOutput.seen.append(_x is None)
        return jnp.where(y > 0, dLdY, 0.0)


def residual_shapes(layer, x):
    _, vjp_fn = jax.vjp(lambda layer, x: layer(x), layer, x)
    return sorted(leaf.shape for leaf in jax.tree.leaves(vjp_fn))


@pytest.mark.parametrize(
    "layer, expected",
    [
        (PReLUAll(alpha=jnp.full((1, 3), 0.2)), [(1, 3), (4, 3), (4, 3)]),  # alpha, x, y
        (PReLUSlim(alpha=jnp.full((1, 3), 0.2)), [(1, 3), (4, 3)]),  # alpha, x
        (ReLUFromOutput(), [(4, 3)]),  # y
    ],
    ids=["all kept", "_y and _memory", "_x and _memory"],
)
def test_underscored_backward_parameters_are_not_residuals(layer, expected):
    x = jnp.linspace(-1.0, 1.0, 12).reshape(4, 3)
    assert residual_shapes(layer, x) == expected


def test_underscored_parameters_receive_none_and_gradients_stay_right(x64):
    x = jnp.linspace(-1.0, 1.0, 12).reshape(4, 3)
    alpha = jnp.full((1, 3), 0.2)
    PReLUAll.seen.clear()
    ReLUFromOutput.seen.clear()

    def loss(fn):
        return lambda alpha, x: jnp.sum(jnp.sin(fn(alpha, x)))

    expected = jax.grad(loss(prelu_reference), (0, 1))(alpha, x)
    got = jax.grad(loss(lambda a, x: PReLUSlim(alpha=a)(x)), (0, 1))(alpha, x)
    assert_tree_allclose(got, expected, rtol=1e-12)
    assert PReLUAll.seen == [(False, True, True)]
    got_relu = jax.jit(jax.grad(lambda x: jnp.sum(jnp.sin(ReLUFromOutput()(x)))))(x)
    assert_tree_allclose(got_relu, jax.grad(lambda x: jnp.sum(jnp.sin(jnp.maximum(x, 0))))(x))
    assert ReLUFromOutput.seen == [True]


# --------------------------------------------------------------------------------------------
# second order: outer derivatives of the outputs use backward again


class SquareLayer(df.Layer):
    """predict x**2 with the deliberately different rule 3 * dLdY: shows which rule runs."""

    def predict(self, x):
        return x**2

    def backward(self, _x, _y, dLdY, _memory):
        return 3.0 * dLdY


def square_custom_vjp():
    @jax.custom_vjp
    def square(x):
        return x**2

    square.defvjp(lambda x: (square(x), None), lambda _, dy: (3.0 * dy,))
    return square


@pytest.mark.parametrize(
    "transform",
    [
        lambda f: jax.grad(f)(1.0),
        lambda f: jax.grad(lambda x: jax.value_and_grad(f)(x)[0])(1.0),
        lambda f: jax.grad(jax.grad(f))(1.0),
        lambda f: jax.jit(jax.grad(jax.grad(f)))(1.0),
    ],
    ids=["grad", "grad(value of value_and_grad)", "grad(grad)", "jit(grad(grad))"],
)
def test_layer_outer_derivatives_use_its_rule_like_custom_vjp(transform):
    got = transform(lambda x: SquareLayer()(x))
    assert float(got) == float(transform(square_custom_vjp()))


class SinCosLayer(df.Layer):
    """Two outputs; forward hands (cos, -sin) to a backward that uses only the memory."""

    scale: jax.Array | None = df.learnable(default=None)

    def predict(self, x):
        return jnp.sin(x) * self.scale, jnp.cos(x) * self.scale

    def forward(self, x):
        return jnp.sin(x) * self.scale, jnp.cos(x) * self.scale, (jnp.cos(x), -jnp.sin(x), x)

    def backward(self, _x, _y1, _y2, dy1, dy2, memory):
        cos, minus_sin, x = memory
        dx = (dy1 * cos + dy2 * minus_sin) * self.scale
        dscale = jnp.sum(dy1 * jnp.sin(x) + dy2 * jnp.cos(x))
        return dx, dscale


def sincos_reference(scale, x):
    return jnp.sin(x) * scale, jnp.cos(x) * scale


@pytest.mark.parametrize(
    "order",
    [
        lambda loss: jax.grad(loss, (0, 1)),
        lambda loss: jax.grad(lambda s, x: jnp.sum(jax.grad(loss, 1)(s, x) ** 2), (0, 1)),
        lambda loss: jax.jacrev(jax.grad(loss, 1), (0, 1)),
    ],
    ids=["grad", "grad(grad)", "jacrev(grad)"],
)
def test_layer_memory_is_differentiated_at_second_order(order, x64):
    x, scale = jnp.linspace(-1.5, 1.5, 4), jnp.array(1.3)

    def trained(scale, x):  # the training path: forward, with its memory value
        (y1, y2), _ = call_layer(SinCosLayer(scale=scale, num_outputs=2), [x], training=True)
        return y1, y2

    def loss(fn):
        return lambda s, x: jnp.sum(jnp.tanh(fn(s, x)[0]) + fn(s, x)[1] ** 3)

    assert_tree_allclose(
        order(loss(trained))(scale, x), order(loss(sincos_reference))(scale, x), rtol=1e-10
    )


# --------------------------------------------------------------------------------------------
# forward over reverse (issue 23): jax.hessian, jax.jvp of a gradient


def prelu_custom_vjp():
    """PReLUAll's rule as a jax.custom_vjp whose fwd computes the forward with plain JAX code,
    the form in which JAX allows forward over reverse (the outer forward mode differentiates
    fwd's body and bwd)."""

    @jax.custom_vjp
    def prelu(alpha, x):
        return prelu_reference(alpha, x)

    def fwd(alpha, x):
        return prelu_reference(alpha, x), (alpha, x)

    def bwd(residuals, dy):
        alpha, x = residuals
        dx = jnp.where(x > 0, dy, alpha * dy)
        dalpha = jnp.sum(jnp.where(x > 0, 0.0, x * dy), axis=0, keepdims=True)
        return dalpha, dx

    prelu.defvjp(fwd, bwd)
    return prelu


def square_plain_fwd_custom_vjp():
    """SquareLayer's rule (3 * dLdY, not forward's 2x) with a plain-JAX fwd."""

    @jax.custom_vjp
    def square(x):
        return x**2

    square.defvjp(lambda x: (x**2, None), lambda _, dy: (3.0 * dy,))
    return square


def _loss(f):
    return lambda a, x: jnp.sum(jnp.sin(f(a, x)) * x)


FORWARD_OVER_REVERSE = {
    "hessian": lambda f, a, x: jax.hessian(_loss(f), (0, 1))(a, x),
    "hessian(jit)": lambda f, a, x: jax.hessian(jax.jit(_loss(f)), (0, 1))(a, x),
    "hessian(checkpoint)": lambda f, a, x: jax.hessian(jax.checkpoint(_loss(f)), (0, 1))(a, x),
    "jit(hessian)": lambda f, a, x: jax.jit(jax.hessian(_loss(f), (0, 1)))(a, x),
    "jvp(grad)": lambda f, a, x: jax.jvp(jax.grad(_loss(f), (0, 1)), (a, x), (a, 2 * x)),
    "jacfwd(jit(grad))": lambda f, a, x: jax.jacfwd(jax.jit(jax.grad(_loss(f), (0, 1))))(a, x),
    "vmap(hessian)": lambda f, a, x: jax.vmap(jax.hessian(_loss(f), 1), (None, 0))(
        a, jnp.stack([x, -2 * x])
    ),
}


@pytest.mark.parametrize("transform", list(FORWARD_OVER_REVERSE))
def test_layer_forward_over_reverse_matches_custom_vjp(transform, x64):
    """Where a jax.custom_vjp with the same rule allows forward over reverse, a layer with a
    custom backward does too, with the same numbers (w.r.t. the input and a learnable)."""
    x, alpha = jnp.array([0.3, -0.7, 1.1, -0.2]), jnp.array([0.25])
    run = FORWARD_OVER_REVERSE[transform]
    got = run(lambda a, x: PReLUAll(alpha=a)(x), alpha, x)
    expected = run(prelu_custom_vjp(), alpha, x)
    assert_tree_allclose(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("transform", ["hessian", "hessian(jit)", "hessian(checkpoint)"])
def test_layer_forward_over_reverse_differentiates_backward_and_the_outputs(transform, x64):
    """The gradient is backward's (3 * dLdY, not 2x); its forward-mode derivative takes the
    outputs' tangents from autodiff of predict, as a custom_vjp's plain fwd body gives them."""
    x = jnp.array([0.3, -0.7, 1.1])
    run = FORWARD_OVER_REVERSE[transform]
    got = run(lambda a, x: SquareLayer()(x), None, x)
    expected = run(lambda a, x: square_plain_fwd_custom_vjp()(x), None, x)
    assert_tree_allclose(got, expected, rtol=1e-12, atol=1e-12)
    assert not np.allclose(got[1][1], jax.hessian(_loss(lambda a, x: x**2), 1)(None, x))


def sincos_custom_vjp():
    """SinCosLayer's training rule: fwd computes the outputs and the memory with plain JAX."""

    @jax.custom_vjp
    def sincos(scale, x):
        return sincos_reference(scale, x)

    def fwd(scale, x):
        return sincos_reference(scale, x), (scale, (jnp.cos(x), -jnp.sin(x), x))

    def bwd(residuals, dys):
        (scale, (cos, minus_sin, x)), (dy1, dy2) = residuals, dys
        dscale = jnp.sum(dy1 * jnp.sin(x) + dy2 * jnp.cos(x))
        return dscale, (dy1 * cos + dy2 * minus_sin) * scale

    sincos.defvjp(fwd, bwd)
    return sincos


@pytest.mark.parametrize("transform", ["hessian", "hessian(jit)", "jvp(grad)"])
def test_layer_forward_over_reverse_with_memory(transform, x64):
    x, scale = jnp.linspace(-1.5, 1.5, 4), jnp.array(1.3)

    def trained(scale, x):  # the training path: forward, with its memory value
        (y1, y2), _ = call_layer(SinCosLayer(scale=scale, num_outputs=2), [x], training=True)
        return y1 + y2**2

    reference = sincos_custom_vjp()
    run = FORWARD_OVER_REVERSE[transform]
    expected = run(lambda s, x: reference(s, x)[0] + reference(s, x)[1] ** 2, scale, x)
    assert_tree_allclose(run(trained, scale, x), expected, rtol=1e-12, atol=1e-12)


class HostPReLU(PReLUAll):
    """predict on the host (a pure_callback): not differentiable in forward mode."""

    def predict(self, x):
        out = jax.ShapeDtypeStruct(x.shape, x.dtype)
        alpha = self.alpha
        return jax.pure_callback(
            lambda a, x: np.asarray(prelu_reference(a, x)), out, alpha, x, vmap_method="sequential"
        )


@pytest.mark.parametrize("transform", ["hessian", "hessian(jit)", "jvp(grad)"])
def test_layer_forward_over_reverse_of_a_non_differentiable_predict_is_named(transform):
    """Where jax.custom_vjp fails too (its fwd body cannot be differentiated in forward mode),
    a named df.ForwardModeError that names the layer's method and the fix."""
    x, alpha = jnp.array([0.3, -0.7, 1.1]), jnp.array([0.25])
    run = FORWARD_OVER_REVERSE[transform]

    @jax.custom_vjp
    def host(alpha, x):
        return HostPReLU(alpha=alpha).predict(x)

    host.defvjp(lambda a, x: (host(a, x), (a, x)), prelu_custom_vjp().bwd)  # type: ignore[attr-defined]
    with pytest.raises(Exception) as theirs:
        run(host, alpha, x)
    assert not isinstance(theirs.value, df.Error)
    with pytest.raises(
        df.ForwardModeError,
        match=r"HostPReLU.*predict.*could not be differentiated in forward mode.*Fix: make predict differentiable JAX code, or take the second derivative in reverse mode",
    ):
        run(lambda a, x: HostPReLU(alpha=a)(x), alpha, x)
    # Reverse over reverse uses backward again, and works.
    grad2 = jax.grad(
        lambda x: jnp.sum(jax.grad(_loss(lambda a, x: HostPReLU(alpha=a)(x)), 1)(alpha, x))
    )
    assert np.all(np.isfinite(grad2(x)))


# --------------------------------------------------------------------------------------------
# signatures


class NoArgsFitting(df.Layer):
    """A stateless layer whose backward leaves out memory (and Y): a wrong arity."""

    def predict(self, x):
        return 2 * x

    def backward(self, x, dLdY):
        return 2 * dLdY


def test_stateless_backward_with_the_wrong_arity_is_named():
    with pytest.raises(
        df.LayerError,
        match=r"NoArgsFitting\.backward takes 2 arguments after self; expected 4 \(X x1, Y x1, "
        r"dLdY x1, memory\), e\.g\. backward\(self, x, y, dLdY, memory\); it takes \(x, dLdY\)",
    ):
        jax.grad(lambda x: jnp.sum(NoArgsFitting()(x)))(jnp.ones(3))


def test_check_layer_reports_the_wrong_arity_in_its_signature_test():
    report = df.check_layer(NoArgsFitting(), df.Layout((2, 3), "BC"))
    result = report["method_signatures_are_well_formed"]
    assert result.status == "Failed" and "takes 2 arguments after self" in result.diagnostic


@pytest.mark.skipif(os.environ.get("JAX_CUSTOM_VJP3") == "1", reason="already the strict run")
def test_this_module_passes_with_the_stricter_custom_vjp():
    result = run_python(
        "import sys, pytest; sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', "
        f"'{ROOT / 'tests' / 'test_layer_backward.py'}']))",
        env={"JAX_CUSTOM_VJP3": "1"},
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "passed" in result.stdout

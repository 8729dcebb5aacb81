"""Second order, forward mode and zero gradients of DifferentiableFunction.

The reference for second-order semantics is JAX's own ``jax.custom_vjp`` whose fwd calls the
function itself (JAX's recommended pattern): the outputs an outer derivative sees carry the
hand-written rule, and residuals computed in fwd are differentiated by autodiff.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_tree_allclose

import difffn as df


class Square(df.DifferentiableFunction):
    """forward x**2 with a deliberately different rule, 3 * dy: which one is used shows."""

    def forward(self, x):
        return x**2

    def backward(self, dy, compute_gradients):
        return 3.0 * dy


def square_custom_vjp():
    @jax.custom_vjp
    def square(x):
        return x**2

    square.defvjp(lambda x: (square(x), None), lambda _, dy: (3.0 * dy,))
    return square


SECOND_ORDER = {
    "grad": lambda f: jax.grad(f)(1.0),
    "grad(value of value_and_grad)": lambda f: jax.grad(lambda x: jax.value_and_grad(f)(x)[0])(1.0),
    "grad(grad)": lambda f: jax.grad(jax.grad(f))(1.0),
    "jit(grad(grad))": lambda f: jax.jit(jax.grad(jax.grad(f)))(1.0),
    "grad(checkpoint(grad))": lambda f: jax.grad(jax.checkpoint(jax.grad(f)))(1.0),
    "grad(grad(grad))": lambda f: jax.grad(jax.grad(jax.grad(f)))(1.0),
}


@pytest.mark.parametrize("name", list(SECOND_ORDER))
def test_outer_derivatives_use_the_hand_written_rule_like_custom_vjp(name):
    got = SECOND_ORDER[name](Square())
    expected = SECOND_ORDER[name](square_custom_vjp())
    assert float(got) == float(expected)
    if name.startswith("grad(value"):
        assert float(got) == 3.0  # the rule, not forward's 2x


class SinCos(df.DifferentiableFunction):
    """Two outputs; the backward uses only memory values, which second order must differentiate."""

    num_outputs = 2
    num_memory_values = 1

    def forward(self, x):
        return jnp.sin(x), jnp.cos(x), (jnp.cos(x), -jnp.sin(x))

    def backward(self, dsin, dcos, compute_gradients, memory):
        dsin_dx, dcos_dx = memory
        return dsin * dsin_dx + dcos * dcos_dx


def sincos_reference(x):
    return jnp.sin(x), jnp.cos(x)


def sincos_loss(fn):
    def loss(x):
        s, c = fn(x)
        return jnp.sum(jnp.tanh(s) * 3.0 + c**3)

    return loss


@pytest.mark.parametrize(
    "transform",
    [
        lambda f: jax.grad(lambda x: jnp.sum(jax.grad(sincos_loss(f))(x) ** 2)),
        lambda f: jax.jacrev(jax.grad(sincos_loss(f))),
        lambda f: jax.jit(jax.jacrev(jax.grad(sincos_loss(f)))),
        lambda f: jax.grad(
            lambda x: jnp.sum(jax.grad(lambda x: jnp.sum(jax.grad(sincos_loss(f))(x) ** 2))(x))
        ),
    ],
    ids=["grad(grad)", "jacrev(grad)", "jit(jacrev(grad))", "third order"],
)
def test_memory_values_are_differentiated_at_second_order(transform, x64):
    x = jnp.linspace(-1.5, 1.5, 5)
    assert_tree_allclose(
        transform(SinCos())(x), transform(sincos_reference)(x), rtol=1e-10, atol=1e-12
    )


def test_first_order_residuals_stay_exactly_what_is_saved():
    _, vjp_fn = jax.vjp(SinCos(), jnp.ones(3))
    assert [leaf.shape for leaf in jax.tree.leaves(vjp_fn)] == [(3,), (3,)]  # the memory only


# --------------------------------------------------------------------------------------------
# once_differentiable


class CubeOnce(df.DifferentiableFunction):
    """A backward that is not differentiable JAX code (a host callback): first order only."""

    save_inputs_for_backward = True
    once_differentiable = True

    def forward(self, x):
        return x**3

    def backward(self, dy, compute_gradients, x):
        def host(dy, x):
            return (3.0 * np.asarray(x) ** 2 * np.asarray(dy)).astype(dy.dtype)

        out = jax.ShapeDtypeStruct(dy.shape, dy.dtype)
        return jax.pure_callback(host, out, dy, x, vmap_method="sequential")


@pytest.mark.parametrize(
    "transform",
    [
        lambda f, x: jax.grad(lambda x: jnp.sum(f(x)))(x),
        lambda f, x: jax.jit(jax.grad(lambda x: jnp.sum(f(x))))(x),
        lambda f, x: jax.vmap(jax.grad(lambda x: jnp.sum(f(x))))(jnp.stack([x, 2 * x])),
        lambda f, x: jax.grad(lambda x: jax.value_and_grad(lambda x: jnp.sum(f(x)))(x)[0])(x),
        lambda f, x: jax.grad(jax.checkpoint(lambda x: jnp.sum(f(x))))(x),
    ],
    ids=["grad", "jit", "vmap", "grad(value of value_and_grad)", "checkpoint"],
)
def test_once_differentiable_works_at_first_order(transform, x64):
    x = jnp.linspace(-1.0, 1.0, 4)
    assert_tree_allclose(transform(CubeOnce(), x), transform(lambda x: x**3, x), rtol=1e-12)


@pytest.mark.parametrize(
    "transform",
    [
        lambda f: jax.grad(jax.grad(f))(0.5),
        lambda f: jax.jit(jax.grad(jax.grad(f)))(0.5),
        lambda f: jax.jacrev(jax.grad(f))(0.5),
    ],
    ids=["grad(grad)", "jit(grad(grad))", "jacrev(grad)"],
)
def test_differentiating_a_once_differentiable_backward_raises(transform):
    with pytest.raises(df.HigherOrderError, match=r"CubeOnce is once_differentiable, but its "):
        transform(CubeOnce())
    assert issubclass(df.HigherOrderError, df.DifferentiableFunctionError)


def test_forward_over_reverse_of_once_differentiable_with_jvp_raises():
    class CubeOnceJVP(CubeOnce):
        def jvp(self, primals, tangents):
            (x,), (t,) = primals, tangents
            return x**3, 3.0 * x**2 * t

    np.testing.assert_allclose(jax.jvp(CubeOnceJVP(), (0.5,), (1.0,))[1], 0.75)
    with pytest.raises(df.HigherOrderError, match="CubeOnceJVP is once_differentiable"):
        jax.hessian(CubeOnceJVP())(0.5)


# --------------------------------------------------------------------------------------------
# forward mode: jvp, linearize and every combination, where the class defines jvp


class Softplus(df.DifferentiableFunction):
    """log(1 + exp(x)) * w over a dict input, with both rules; records which ran."""

    save_inputs_for_backward = True
    rules: list = []

    def forward(self, inputs):
        return jax.nn.softplus(inputs["x"]) * inputs["w"]

    def backward(self, dy, compute_gradients, inputs):
        Softplus.rules.append("backward")
        x, w = inputs["x"], inputs["w"]
        cg = compute_gradients[0]
        return {
            "x": dy * jax.nn.sigmoid(x) * w if cg["x"] else None,
            "w": jnp.sum(dy * jax.nn.softplus(x)) if cg["w"] else None,
        }

    def jvp(self, primals, tangents):
        Softplus.rules.append("jvp")
        ((p,), (t,)) = primals, tangents
        y = jax.nn.softplus(p["x"]) * p["w"]
        return y, jax.nn.sigmoid(p["x"]) * p["w"] * t["x"] + jax.nn.softplus(p["x"]) * t["w"]


def softplus_reference(inputs):
    return jax.nn.softplus(inputs["x"]) * inputs["w"]


def softplus_inputs():
    return {"x": jnp.linspace(-2.0, 2.0, 5), "w": jnp.array(1.5)}


FORWARD_MODE = {
    "jvp": lambda f, p: jax.jvp(f, (p,), (jax.tree.map(jnp.ones_like, p),)),
    "linearize": lambda f, p: jax.linearize(f, p)[1](jax.tree.map(jnp.cos, p)),
    "jit(linearize)": lambda f, p: jax.jit(lambda p: jax.linearize(f, p)[1](p))(p),
    "transpose(linearize)": lambda f, p: jax.linear_transpose(jax.linearize(f, p)[1], p)(
        jnp.arange(5.0)
    ),
    "jacfwd": lambda f, p: jax.jacfwd(f)(p),
    "jacrev": lambda f, p: jax.jacrev(f)(p),
    "hessian": lambda f, p: jax.hessian(lambda p: jnp.sum(f(p) ** 2))(p),
    "jacrev(jacfwd)": lambda f, p: jax.jacrev(jax.jacfwd(lambda p: jnp.sum(f(p) ** 2)))(p),
    "vmap(jvp)": lambda f, p: jax.vmap(lambda x: jax.jvp(f, (p | {"x": x},), (p,))[1])(
        jnp.stack([p["x"], -p["x"]])
    ),
}


@pytest.mark.parametrize("name", list(FORWARD_MODE))
def test_forward_mode_with_jvp_matches_autodiff(name, x64):
    p = softplus_inputs()
    got = FORWARD_MODE[name](Softplus(), p)
    assert_tree_allclose(got, FORWARD_MODE[name](softplus_reference, p), rtol=1e-10, atol=1e-12)


def test_each_mode_uses_its_own_rule():
    p = softplus_inputs()
    Softplus.rules.clear()
    jax.linearize(Softplus(), p)[1](p)
    assert "jvp" in Softplus.rules and "backward" not in Softplus.rules
    Softplus.rules.clear()
    jax.grad(lambda p: jnp.sum(Softplus()(p)))(p)
    assert Softplus.rules == ["backward"]


def test_memory_values_in_forward_mode_over_reverse(x64):
    class SinCosJVP(SinCos):
        def jvp(self, primals, tangents):
            (x,), (t,) = primals, tangents
            return (jnp.sin(x), jnp.cos(x)), (jnp.cos(x) * t, -jnp.sin(x) * t)

    x = jnp.linspace(-1.0, 1.0, 4)
    for transform in (jax.hessian, jax.jacfwd):
        f = sincos_loss(SinCosJVP()) if transform is jax.hessian else SinCosJVP()
        r = sincos_loss(sincos_reference) if transform is jax.hessian else sincos_reference
        assert_tree_allclose(transform(f)(x), transform(r)(x), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "transform",
    [
        lambda f, x: jax.jvp(f, (x,), (x,)),
        lambda f, x: jax.jit(lambda x: jax.jvp(f, (x,), (x,)))(x),
        lambda f, x: jax.jacfwd(f)(x),
        lambda f, x: jax.jit(jax.jacfwd(f))(x),
        lambda f, x: jax.jacrev(jax.jacfwd(f))(x),
        lambda f, x: jax.vmap(lambda x: jax.jvp(f, (x,), (x,)))(jnp.full(3, x)),
        lambda f, x: jax.jit(jax.linearize(f, x)[1])(x),
    ],
    ids=[
        "jvp",
        "jit-of-jvp",
        "jacfwd",
        "jit-of-jacfwd",
        "jacrev-of-jacfwd",
        "vmap-of-jvp",
        "jit-linearized",
    ],
)
def test_forward_mode_without_jvp_is_a_named_error(transform):
    with pytest.raises(df.ForwardModeError, match=r"Square was differentiated in forward mode"):
        transform(Square(), 1.0)


@pytest.mark.parametrize(
    "transform",
    [
        lambda f, x: jax.hessian(f)(x),
        lambda f, x: jax.jvp(jax.grad(f), (x,), (x,)),
        lambda f, x: jax.jit(jax.hessian(f))(x),
    ],
    ids=["hessian", "jvp-of-grad", "jit-of-hessian"],
)
def test_forward_over_reverse_without_jvp_works_as_with_custom_vjp(transform):
    """Issue 23: jax.custom_vjp allows forward over reverse (it differentiates bwd, and fwd's
    body); so does difffn, with the same numbers as the same rule written as a custom_vjp whose
    fwd computes the forward itself."""

    @jax.custom_vjp
    def square(x):
        return x**2

    square.defvjp(lambda x: (x**2, None), lambda _, dy: (3.0 * dy,))
    assert_tree_allclose(transform(Square(), 1.0), transform(square, 1.0), rtol=1e-6)


class HostSin(df.DifferentiableFunction):
    """sin on the host (a pure_callback): not differentiable by JAX, with a correct backward."""

    save_inputs_for_backward = True

    def forward(self, x):
        out = jax.ShapeDtypeStruct(x.shape, x.dtype)
        return jax.pure_callback(np.sin, out, x, vmap_method="sequential")

    def backward(self, dy, compute_gradients, x):
        return dy * jnp.cos(x)


INSIDE = {
    "jit": jax.jit,
    "checkpoint": jax.checkpoint,
}


@pytest.mark.parametrize("inside", list(INSIDE))
def test_jit_or_checkpoint_inside_a_second_derivative_keeps_each_mode_its_rule(inside, x64):
    """With jax.jit or jax.checkpoint inside the derivative, the operation's forward rule is
    traced before the outer derivative meets it. Reverse over reverse still uses backward (so a
    forward JAX cannot differentiate works there), while forward over reverse needs autodiff of
    forward, like jax.custom_vjp's fwd body: a named ForwardModeError here."""
    x = jnp.array([0.3, -0.7, 1.1])
    wrap = INSIDE[inside]
    loss = lambda f: wrap(lambda x: jnp.sum(jnp.sin(f(x))))  # noqa: E731
    grad2 = lambda f: jax.grad(lambda x: jnp.sum(jax.grad(loss(f))(x)))  # noqa: E731
    assert_tree_allclose(grad2(HostSin())(x), grad2(jnp.sin)(x), rtol=1e-12)
    with pytest.raises(
        df.ForwardModeError,
        match=r"HostSin.forward could not be differentiated in forward mode.*jax.hessian.*"
        r"Fix: define HostSin.jvp",
    ):
        jax.hessian(loss(HostSin()))(x)


def test_linearize_without_jvp_fails_when_its_linear_function_runs():
    """jax.linearize is lazy: the named error comes when the tangent map is run (difffn's
    primitive, under JAX_CUSTOM_VJP3=1, names the class at once)."""
    with pytest.raises(df.ForwardModeError, match=r"Square was differentiated in forward mode"):
        _, f_jvp = jax.linearize(Square(), 1.0)
        f_jvp(1.0)


class TrueSquare(df.DifferentiableFunction):
    save_inputs_for_backward = True

    def forward(self, x):
        return x**2

    def backward(self, dy, compute_gradients, x):
        return 2 * x * dy


def test_the_forward_mode_guard_costs_reverse_mode_nothing(x64):
    """Reverse mode transposes the guard's tangent map away: grad, grad-of-grad, vmap-of-grad
    and checkpointed grad agree with JAX autodiff, and the gradient's program keeps only the
    operation itself on the primal (a custom_jvp call named after the class, for an outer
    forward-mode derivative): no guard and no tangent map is left."""
    x = jnp.linspace(-1.0, 2.0, 4)
    loss = lambda f: lambda x: jnp.sum(jnp.sin(f(x)))  # noqa: E731
    reference = loss(lambda x: x**2)
    for transform in (
        jax.grad,
        lambda f: jax.grad(lambda x: jnp.sum(jax.grad(f)(x) ** 2)),
        lambda f: jax.jit(jax.grad(jax.checkpoint(f))),
    ):
        assert_tree_allclose(transform(loss(TrueSquare()))(x), transform(reference)(x), rtol=1e-12)
    per_row = jax.vmap(jax.grad(loss(TrueSquare())))(jnp.stack([x, 2 * x]))
    assert_tree_allclose(per_row, jax.vmap(jax.grad(reference))(jnp.stack([x, 2 * x])), rtol=1e-12)
    jaxpr = str(jax.make_jaxpr(jax.grad(loss(TrueSquare())))(x))
    assert "custom_jvp_call" in jaxpr and "name=TrueSquare" in jaxpr
    assert "difffn_forward_tangent" not in jaxpr and "difffn_tangent_map" not in jaxpr


# --------------------------------------------------------------------------------------------
# zero output gradients


class Both(df.DifferentiableFunction):
    num_outputs = 2
    save_inputs_for_backward = True
    seen: list = []

    def forward(self, x):
        return jnp.sin(x), jnp.cos(x)

    def backward(self, ds, dc, compute_gradients, x):
        Both.seen.append((ds, dc))
        grad = 0.0
        if ds is not None:
            grad = grad + ds * jnp.cos(x)
        if dc is not None:
            grad = grad - dc * jnp.sin(x)
        return grad


class BothLazy(Both):
    materialize_zero_gradients = False


@pytest.mark.parametrize("cls, expected", [(Both, "zeros"), (BothLazy, None)])
def test_the_gradient_of_an_unused_output(cls, expected):
    Both.seen.clear()
    x = jnp.linspace(-1.0, 1.0, 3)
    g = jax.grad(lambda x: jnp.sum(cls()(x)[0]))(x)
    np.testing.assert_allclose(g, jnp.cos(x), rtol=1e-6)
    ((ds, dc),) = Both.seen
    assert isinstance(ds, jax.Array)
    if expected is None:
        assert dc is None
    else:
        np.testing.assert_array_equal(dc, jnp.zeros(3))

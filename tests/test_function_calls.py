"""Issue 23: keyword arguments, PyTorch's per-given-input gradients, and ``jvp_from_forward``.

References nobody on the team wrote: ``jax.custom_vjp`` binds keywords against the signature of
the function it wraps; ``jax.jvp``/``jax.hessian`` of the plain jnp expression give the
forward-mode derivatives that ``jvp_from_forward`` must reproduce.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import difffn as df


class Affine(df.DifferentiableFunction):
    """PyTorch's ``LinearFunction`` (``forward(ctx, input, weight, bias=None)``)."""

    save_inputs_for_backward = True

    def forward(self, x, w, b=None, scale=None):
        y = x @ w
        y = y if b is None else y + b[None, :]
        return y if scale is None else y * scale

    def backward(self, dy, cg, x, w, b, scale):
        if scale is not None:
            dy = dy * scale
        dx = dy @ w.T if cg[0] else None
        dw = x.T @ dy if cg[1] else None
        db = jnp.sum(dy, axis=0) if b is not None and cg[2] else None
        return dx, dw, db, None


class AffineGiven(Affine):
    """The same, returning PyTorch-style one gradient per input *given* (no ``None`` slots)."""

    def backward(self, dy, cg, x, w, b, scale):
        grads = super().backward(dy, cg, x, w, b, scale)
        return tuple(g for g, name in zip(grads, ("x", "w", "b", "scale")) if name in self.given)

    def __init__(self, given):
        self.given = given


def affine_reference():
    @jax.custom_vjp
    def affine(x, w, b=None, scale=None):
        y = x @ w
        y = y if b is None else y + b[None, :]
        return y if scale is None else y * scale

    def fwd(x, w, b=None, scale=None):
        return affine(x, w, b, scale), (x, w, b, scale)

    def bwd(res, dy):
        x, w, b, scale = res
        if scale is not None:
            dy = dy * scale
        db = None if b is None else jnp.sum(dy, axis=0)
        return dy @ w.T, x.T @ dy, db, None if scale is None else jnp.zeros_like(scale)

    affine.defvjp(fwd, bwd)
    return affine


@pytest.fixture
def data(key):
    kx, kw, kb = jax.random.split(key, 3)
    return (
        jax.random.normal(kx, (4, 3)),
        jax.random.normal(kw, (3, 2)),
        jax.random.normal(kb, (2,)),
    )


@pytest.mark.parametrize(
    "call",
    [
        lambda f, x, w, b: f(x, w, b=b),
        lambda f, x, w, b: f(x=x, w=w, b=b),
        lambda f, x, w, b: f(x, b=b, w=w),
        lambda f, x, w, b: f(x, w, scale=2.0),
    ],
    ids=["b", "all", "reordered", "skip-b"],
)
def test_keywords_bind_like_custom_vjp(data, call):
    x, w, b = data
    reference = affine_reference()
    ours = call(Affine(), x, w, b)
    theirs = call(reference, x, w, b)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)

    def loss(f):
        return lambda x, w: jnp.sum(jnp.sin(call(f, x, w, b)))

    for got, want in zip(
        jax.grad(loss(Affine()), (0, 1))(x, w), jax.grad(loss(reference), (0, 1))(x, w)
    ):
        np.testing.assert_allclose(got, want, rtol=1e-5)


def test_keyword_mistakes_show_the_signature(data):
    x, w, b = data
    signature = r"Affine\(\)\(x, w, b=<default>, scale=<default>\)"
    with pytest.raises(
        df.DifferentiableFunctionError, match=rf"input 'w' both positionally.*{signature}"
    ):
        Affine()(x, w, w=w)
    with pytest.raises(
        df.DifferentiableFunctionError, match=rf"keyword argument 'bias', which is not.*{signature}"
    ):
        Affine()(x, w, bias=b)
    with pytest.raises(
        df.DifferentiableFunctionError, match=rf"without its required input\(s\) 'w': {signature}"
    ):
        Affine()(x, b=b)


@pytest.mark.parametrize(
    "given, call",
    [
        (("x", "w"), lambda f, x, w, b: f(x, w)),
        (("x", "w", "b"), lambda f, x, w, b: f(x, w, b)),
        (("x", "w", "scale"), lambda f, x, w, b: f(x, w, scale=2.0)),
    ],
)
def test_backward_may_return_one_gradient_per_given_input(data, given, call):
    """PyTorch's habit: one gradient per input given; the same numbers as per-parameter."""
    x, w, b = data
    reference = affine_reference()

    def loss(f):
        return lambda x, w: jnp.sum(call(f, x, w, b) ** 2)

    want = jax.grad(loss(reference), (0, 1))(x, w)
    for fcn in (Affine(), AffineGiven(given)):
        got = jax.grad(loss(fcn), (0, 1))(x, w)
        for g, e in zip(got, want):
            np.testing.assert_allclose(g, e, rtol=1e-5)


def test_any_other_count_names_both_forms(data):
    x, w, _ = data

    class Wrong(Affine):
        def backward(self, dy, cg, x, w, b, scale):
            return (dy @ w.T,)

    with pytest.raises(
        df.BackwardError,
        match=r"returned 1 gradients; expected either 4, one per parameter of forward "
        r"\(x, w, b, scale; None for the left-out b, scale\), or 2, one per input given "
        r"\(x, w\)",
    ):
        jax.grad(lambda x: Wrong()(x, w).sum())(x)


# -- jvp_from_forward --------------------------------------------------------------------------


class StraightThrough(df.DifferentiableFunction):
    """A surrogate backward (identity) for a forward whose autodiff derivative differs."""

    jvp_from_forward = True

    def forward(self, x):
        return jnp.sin(x) + jnp.round(x)

    def backward(self, dy, cg):
        return dy


def test_jvp_from_forward_differentiates_forward_in_forward_mode_only(x64):
    x = jnp.array([0.2, 1.4, -2.3])
    t = jnp.array([1.0, -0.5, 2.0])
    plain = lambda x: jnp.sin(x) + jnp.round(x)  # noqa: E731
    y, dy = jax.jvp(StraightThrough(), (x,), (t,))
    want_y, want_dy = jax.jvp(plain, (x,), (t,))
    np.testing.assert_allclose(y, want_y, rtol=1e-12)
    np.testing.assert_allclose(dy, want_dy, rtol=1e-12)
    np.testing.assert_allclose(jax.jacfwd(StraightThrough())(x), jax.jacfwd(plain)(x), rtol=1e-12)
    # Reverse mode keeps the hand-written backward (the identity, not cos).
    np.testing.assert_array_equal(jax.grad(lambda x: StraightThrough()(x).sum())(x), jnp.ones(3))


def test_jvp_from_forward_makes_any_hessian_work(x64):
    class Softplus(df.DifferentiableFunction):
        save_inputs_for_backward = True
        jvp_from_forward = True

        def forward(self, x):
            return jnp.logaddexp(x, 0.0)

        def backward(self, dy, cg, x):
            return dy * jax.nn.sigmoid(x)

    x = jnp.array([0.2, 1.4, -2.3])

    def loss(f):
        return lambda x: jnp.sum(jnp.tanh(f(x)) * x)

    want = jax.hessian(loss(lambda x: jnp.logaddexp(x, 0.0)))(x)
    np.testing.assert_allclose(jax.hessian(loss(Softplus()))(x), want, rtol=1e-10)
    np.testing.assert_allclose(
        jax.jit(jax.jacrev(jax.jacfwd(loss(Softplus()))))(x), want, rtol=1e-10
    )
    np.testing.assert_allclose(jax.jacfwd(jax.jacfwd(loss(Softplus())))(x), want, rtol=1e-10)


def test_without_the_flag_forward_mode_is_named_in_and_out_of_jit():
    class Plain(df.DifferentiableFunction):
        def forward(self, x):
            return jnp.sin(x)

        def backward(self, dy, cg):
            return dy

    x = jnp.ones(3)
    for run in (jax.jacfwd(Plain()), jax.jit(jax.jacfwd(Plain()))):
        with pytest.raises(df.ForwardModeError, match=r"define Plain\.jvp.*jvp_from_forward"):
            run(x)


def test_jvp_and_the_flag_together_is_an_error():
    class Both(df.DifferentiableFunction):
        jvp_from_forward = True

        def forward(self, x):
            return x

        def backward(self, dy, cg):
            return dy

        def jvp(self, primals, tangents):
            return primals[0], tangents[0]

    with pytest.raises(df.DifferentiableFunctionError, match=r"Both defines jvp and sets jvp_f"):
        Both()(jnp.ones(2))


def test_a_flag_that_is_not_a_bool_is_named():
    with pytest.raises(df.DifferentiableFunctionError, match=r"jvp_from_forward is 'yes'"):

        class Bad(df.DifferentiableFunction):
            jvp_from_forward = "yes"

            def forward(self, x):
                return x

            def backward(self, dy, cg):
                return dy


def test_check_function_checks_forward_mode():
    class Softplus(df.DifferentiableFunction):
        save_inputs_for_backward = True
        jvp_from_forward = True

        def forward(self, x):
            return jnp.logaddexp(x, 0.0)

        def backward(self, dy, cg, x):
            return dy * jax.nn.sigmoid(x)

    class WrongJvp(Softplus):
        jvp_from_forward = False

        def jvp(self, primals, tangents):
            (x,), (t,) = primals, tangents
            return jnp.logaddexp(x, 0.0), 2.0 * jax.nn.sigmoid(x) * t

    class ReverseOnly(Softplus):
        jvp_from_forward = False

    x = jnp.array([0.3, -1.2, 2.0])
    assert df.check_function(Softplus(), x)["forward_mode_is_correct"].status == "Passed"
    wrong = df.check_function(WrongJvp(), x)["forward_mode_is_correct"]
    assert wrong.status == "Failed"
    assert re.search(r"forward mode \(jvp\) disagrees: jvp against finite differences", str(wrong))
    skipped = df.check_function(ReverseOnly(), x)["forward_mode_is_correct"]
    assert skipped.status == "Skipped" and "jvp_from_forward = False" in str(skipped)


# -- array attributes: closures ----------------------------------------------------------------


class Outer(df.DifferentiableFunction):
    """``def outer(x): @jax.custom_vjp def f(y): return x * y``, with ``x`` an attribute."""

    def __init__(self, x, table=None):
        self.x = x
        self.table = table

    def forward(self, y):
        scale = 1.0 if self.table is None else self.table["s"]
        return self.x * y * scale

    def backward(self, dy, cg):
        scale = 1.0 if self.table is None else self.table["s"]
        return dy * self.x * scale


def outer_reference(x):
    @jax.custom_vjp
    def f(y):
        return x * y

    f.defvjp(lambda y: (x * y, None), lambda _, g: (g * x,))
    return f


def test_array_attributes_are_constants_under_every_transformation(x64):
    y = jnp.array([0.5, -1.0, 2.0])
    xs = jnp.array([1.5, -2.0])
    cases = {
        "vmap over the attribute": lambda make: jax.vmap(lambda x: make(x)(y))(xs),
        "jit": lambda make: jax.jit(lambda x, y: make(x)(y))(xs[1], y),
        "vmap of grad": lambda make: jax.vmap(
            lambda x: jax.grad(lambda y: jnp.sum(jnp.sin(make(x)(y))))(y)
        )(xs),
        "hessian": lambda make: jax.hessian(lambda y: jnp.sum(jnp.sin(make(xs[0])(y))))(y),
        "scan": lambda make: jax.lax.scan(lambda c, x: (c, make(x)(y)), 0.0, xs)[1],
    }
    for name, run in cases.items():
        np.testing.assert_allclose(run(Outer), run(outer_reference), rtol=1e-12, err_msg=name)
    # numpy arrays and pytrees of arrays too; equal shapes share compiled code, not values
    f = jax.jit(lambda x, y: Outer(x, {"s": 2 * x})(y))
    np.testing.assert_allclose(f(1.0, y), 2 * y, rtol=1e-12)
    np.testing.assert_allclose(f(3.0, y), 18 * y, rtol=1e-12)
    np.testing.assert_allclose(Outer(np.array(4.0))(y), 4 * y, rtol=1e-12)
    # As a static jit argument, an instance with arrays is never confused with another.
    g = jax.jit(lambda op, y: op(y), static_argnums=0)
    np.testing.assert_allclose(g(Outer(jnp.array(2.0)), y), 2 * y, rtol=1e-12)
    np.testing.assert_allclose(g(Outer(jnp.array(5.0)), y), 5 * y, rtol=1e-12)


def test_a_differentiated_attribute_is_named():
    y = jnp.ones(3)
    with pytest.raises(
        df.DifferentiableFunctionError,
        match=r"Outer attribute 'x' was differentiated \(reverse mode\).*Fix: pass it as an input",
    ):
        jax.grad(lambda x: jnp.sum(Outer(x)(y)))(2.0)
    with pytest.raises(
        df.DifferentiableFunctionError,
        match=r"Outer attribute 'table' at \['s'\] was differentiated",
    ):
        jax.grad(lambda s: jnp.sum(Outer(jnp.array(1.0), {"s": s})(y)))(2.0)


def test_an_unhashable_attribute_that_is_not_arrays_is_named():
    with pytest.raises(
        df.DifferentiableFunctionError,
        match=r"attribute 'x' holds an unhashable list.*Fix: use a tuple",
    ):
        Outer([1.0, 2.0])(jnp.ones(2))

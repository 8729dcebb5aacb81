"""Custom-derivative code from the sources that define the behaviour, ported to difffn.

Each port is written as a difffn class and checked against the original's own autodiff (JAX's
``jax.custom_vjp`` for JAX's tests and guide, plain JAX autodiff of the same math for PyTorch's
``autograd.Function`` examples, the ``stop_gradient`` idiom for surrogate gradients):
values, gradients with respect to every subset of the inputs, jit, vmap, grad-of-grad,
checkpoint and scan, in float64. The code is our own, after:

- JAX's ``tests/custom_api_test.py`` (``CustomVJPTest``): basic rule, invariance under
  ``value_and_grad``, Python control flow, vmap, pytrees, scan, non-differentiable function
  arguments, closures over tracers, float0, remat, ``None`` cotangents, the scan batching edge
  case;
- JAX's custom-derivatives guide: ``clip_gradient`` and the implicit fixed-point solver;
- PyTorch's ``autograd.Function`` examples: Legendre polynomial P3, ``LinearFunction`` with
  ``needs_input_grad``, ``Exp`` with a saved output;
- a gradient-reversal layer and a straight-through estimator.
"""

from __future__ import annotations

import dataclasses
import itertools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_tree_allclose
from jax.test_util import check_grads

import difffn as df

STRICT = os.environ.get("JAX_CUSTOM_VJP3") == "1"

# --------------------------------------------------------------------------------------------
# the harness: one port against its original under every transformation


def _loss(fn):
    def loss(*args):
        return sum(jnp.sum(jnp.sin(leaf)) for leaf in jax.tree.leaves(fn(*args)))

    return loss


def _differentiable(args):
    return [
        i
        for i, a in enumerate(args)
        if a is not None
        and all(jnp.issubdtype(jnp.result_type(x), jnp.inexact) for x in jax.tree.leaves(a))
    ]


def transformations(args, *, second_order=True):
    """name -> transform(fn) for one port's example arguments."""
    wrt = tuple(_differentiable(args))
    out = {
        "value": lambda f: f(*args),
        "jit": lambda f: jax.jit(f)(*args),
        "jit(grad)": lambda f: jax.jit(jax.grad(_loss(f), wrt))(*args),
        "vmap(grad)": lambda f: jax.vmap(jax.grad(_loss(f), wrt), (0,) + (None,) * (len(args) - 1))(
            jax.tree.map(lambda a: jnp.stack([a, 1.25 * a]), args[0]), *args[1:]
        ),
        "grad(vmap)": lambda f: jax.grad(
            lambda a0, *rest: _loss(lambda *b: jax.vmap(f, (0,) + (None,) * len(rest))(*b))(
                a0, *rest
            ),
            wrt,
        )(jax.tree.map(lambda a: jnp.stack([a, 1.25 * a]), args[0]), *args[1:]),
        "checkpoint": lambda f: jax.grad(jax.checkpoint(_loss(f)), wrt)(*args),
        "scan": lambda f: jax.grad(
            lambda *a: jax.lax.scan(lambda c, _: (c + _loss(f)(*a), None), 0.0, None, length=2)[0],
            wrt,
        )(*args),
    }
    for r in range(1, len(wrt) + 1):
        for subset in itertools.combinations(wrt, r):
            out[f"grad{subset}"] = lambda f, s=subset: jax.grad(_loss(f), s)(*args)
    if second_order:
        out["grad(grad)"] = lambda f: jax.grad(
            lambda *a: jnp.sum(jnp.tanh(jax.tree.leaves(jax.grad(_loss(f), wrt[0])(*a))[0])),
            wrt,
        )(*args)
    return out


def check_port(ours, original, args, *, second_order=True, rtol=1e-9, atol=1e-12):
    with jax.enable_x64(True):
        args = jax.tree.map(
            lambda a: (
                jnp.asarray(a, jnp.float64)
                if jnp.issubdtype(jnp.result_type(a), jnp.floating)
                else a
            ),
            args,
        )
        for name, transform in transformations(args, second_order=second_order).items():
            got, expected = transform(ours), transform(original)
            try:
                assert_tree_allclose(got, expected, rtol=rtol, atol=atol)
            except AssertionError as error:
                raise AssertionError(f"{name}: {error}") from None


# --------------------------------------------------------------------------------------------
# JAX's custom_vjp tests


class SinTwiceCos(df.DifferentiableFunction):
    """sin(x) whose rule is 2 cos(x), as in JAX's basic custom_vjp test (memory: cos x)."""

    num_memory_values = 1

    def forward(self, x):
        return jnp.sin(x), jnp.cos(x)

    def backward(self, g, compute_gradients, cos_x):
        return 2 * cos_x * g


def sin_twice_cos():
    @jax.custom_vjp
    def f(x):
        return jnp.sin(x)

    f.defvjp(lambda x: (f(x), jnp.cos(x)), lambda cos_x, g: (2 * cos_x * g,))
    return f


def test_basic_rule():
    check_port(SinTwiceCos(), sin_twice_cos(), (jnp.linspace(-2.0, 2.0, 5),))
    x = 3.0
    assert_tree_allclose(jax.value_and_grad(SinTwiceCos())(x), (jnp.sin(x), 2 * jnp.cos(x)))


def test_invariance_under_value_and_grad():
    class CosRule3(df.DifferentiableFunction):
        def forward(self, x):
            return jnp.cos(2 * x) / 2.0

        def backward(self, g, compute_gradients):
            return 3 * g

    f = CosRule3()

    def f2(x):
        return jax.value_and_grad(f)(x)[0]

    def f3(x):
        return jax.value_and_grad(f2)(x)[0]

    x = 1.0
    assert float(f(x)) == float(f2(x)) == float(f3(x))
    assert float(jax.grad(f)(x)) == float(jax.grad(f2)(x)) == float(jax.grad(f3)(x)) == 3.0


@pytest.mark.skipif(
    STRICT,
    reason="JAX's custom_vjp3 traces the primal, so Python control "
    "flow on values fails there for JAX's own custom_vjp too",
)
def test_python_control_flow():
    class Branches(df.DifferentiableFunction):
        save_inputs_for_backward = True

        def forward(self, x):
            return jnp.sin(x) if x > 0 else jnp.cos(x)

        def backward(self, g, compute_gradients, x):
            return 2 * g if x > 0 else 3 * g

    for x, value, grad in [(2.0, jnp.sin(2.0), 2.0), (-2.0, jnp.cos(-2.0), 3.0)]:
        assert_tree_allclose(jax.value_and_grad(Branches())(x), (value, jnp.float32(grad)))


def test_vmap_of_grad_and_grad_of_vmap():
    class ScalarOnly(SinTwiceCos):
        def forward(self, x):
            assert jnp.ndim(x) == 0  # vmap hands forward one element, as in JAX's test
            return super().forward(x)

    f, x, xx = ScalarOnly(), jnp.arange(3.0), jnp.arange(6.0).reshape(2, 3)
    assert_tree_allclose(jax.vmap(f)(x), jnp.sin(x))
    assert_tree_allclose(jax.vmap(jax.vmap(f))(xx), jnp.sin(xx))
    assert_tree_allclose(jax.vmap(jax.grad(f))(x), 2 * jnp.cos(x))
    assert_tree_allclose(jax.vmap(jax.value_and_grad(f))(x), (jnp.sin(x), 2 * jnp.cos(x)))
    assert_tree_allclose(jax.vmap(jax.vmap(jax.grad(f)))(xx), 2 * jnp.cos(xx))
    assert_tree_allclose(jax.grad(lambda x: jax.vmap(f)(x).sum())(x), 2 * jnp.cos(x))
    assert_tree_allclose(jax.vmap(jax.grad(lambda x: jax.vmap(f)(x).sum()))(xx), 2 * jnp.cos(xx))


def test_pytrees():
    class DictSin(df.DifferentiableFunction):
        num_memory_values = 1

        def forward(self, x):
            return {"b": jnp.sin(x["a"])}, {"r": jnp.cos(x["a"])}

        def backward(self, g, compute_gradients, residual):
            return {"a": 2 * residual["r"] * g["b"]}

    @jax.custom_vjp
    def dict_sin(x):
        return {"b": jnp.sin(x["a"])}

    dict_sin.defvjp(
        lambda x: (dict_sin(x), {"r": jnp.cos(x["a"])}),
        lambda res, g: ({"a": 2 * res["r"] * g["b"]},),
    )
    check_port(DictSin(), dict_sin, ({"a": jnp.linspace(-1.0, 1.0, 3)},))


def test_scan_and_its_second_derivative():
    def through_scan(f):
        return lambda x: jax.lax.scan(lambda c, _: (f(c), None), x, None, length=1)[0]

    foo = through_scan(SinTwiceCos())
    np.testing.assert_allclose(jax.grad(foo)(3.0), 2.0 * jnp.cos(3.0), rtol=1e-6)
    np.testing.assert_allclose(jax.grad(jax.grad(foo))(3.0), -2.0 * jnp.sin(3.0), rtol=1e-6)
    np.testing.assert_allclose(
        jax.grad(lambda x: jax.vmap(foo)(x).sum())(jnp.arange(3.0)), 2.0 * jnp.cos(jnp.arange(3.0))
    )


def test_function_valued_configuration():
    """JAX's nondiff_argnums for a function argument: a difffn constructor argument."""

    class Apply(df.DifferentiableFunction):
        save_inputs_for_backward = True

        def __init__(self, fn):
            self.fn = fn

        def forward(self, x):
            return self.fn(x)

        def backward(self, g, compute_gradients, x):
            return jnp.cos(x) * g

    double = lambda y: 2 * y  # noqa: E731
    assert float(Apply(double)(1.0)) == 2.0
    assert_tree_allclose(
        jax.value_and_grad(lambda x: Apply(double)(x))(1.0), (jnp.float32(2.0), jnp.cos(1.0))
    )


def test_closures_over_tracers():
    def outer(x):
        class Times(df.DifferentiableFunction):
            save_inputs_for_backward = True

            def forward(self, y):
                return x * y

            def backward(self, g, compute_gradients, y):
                return jnp.cos(y) * g * x

        return Times()

    xs = jnp.arange(3.0)
    if STRICT:  # JAX's own custom_vjp3 refuses a primal closing over a tracer, and so do we
        with pytest.raises(df.DifferentiableFunctionError, match="closes over a value traced"):
            jax.vmap(lambda x: outer(x)(3.0))(xs)
        return
    assert_tree_allclose(jax.vmap(lambda x: outer(x)(3.0))(xs), xs * 3)
    assert_tree_allclose(jax.vmap(lambda x: jax.grad(outer(x))(3.0))(xs), jnp.cos(3.0) * xs)


def test_backward_closing_over_a_tracer():
    def f(y):
        class TwoSin(df.DifferentiableFunction):
            def forward(self, x):
                return 2.0 * jnp.sin(x)

            def backward(self, g, compute_gradients):
                return 2.0 * jnp.cos(y) * g  # captures y

        return jax.grad(TwoSin())(1.0)

    assert_tree_allclose(jax.jit(f)(2.0), 2.0 * jnp.cos(2.0))
    assert_tree_allclose(jax.vmap(f)(jnp.arange(3.0)), 2.0 * jnp.cos(jnp.arange(3.0)))
    assert_tree_allclose(jax.jit(jax.vmap(f))(jnp.arange(3.0)), 2.0 * jnp.cos(jnp.arange(3.0)))
    np.testing.assert_allclose(jax.grad(f)(4.0), -2.0 * jnp.sin(4.0), rtol=1e-6)


def test_float0_for_an_integer_input():
    class Identity(df.DifferentiableFunction):
        def forward(self, x, _):
            return x

        def backward(self, g, compute_gradients):
            return 2.0, None

    gx, gi = jax.grad(Identity(), (0, 1), allow_int=True)(2.0, 3)
    assert float(gx) == 2.0 and gi.dtype == jax.dtypes.float0


@pytest.mark.parametrize(
    "transform",
    [
        lambda g: jax.grad(jax.remat(g)),
        lambda g: jax.grad(jax.grad(jax.remat(g))),
        lambda g: jax.grad(jax.remat(jax.grad(g))),
        lambda g: jax.grad(jax.grad(jax.grad(jax.remat(g)))),
    ],
    ids=["grad(remat)", "grad(grad(remat))", "grad(remat(grad))", "third order"],
)
def test_remat(transform):
    ours, theirs = SinTwiceCos(), sin_twice_cos()
    assert_tree_allclose(
        transform(lambda x: ours(ours(x)))(2.0), transform(lambda x: theirs(theirs(x)))(2.0)
    )


def test_none_cotangents():
    class TimesSin(df.DifferentiableFunction):
        num_memory_values = 1

        def forward(self, x, y):
            return x * jnp.sin(y), jnp.cos(y)

        def backward(self, g, compute_gradients, cos_y):
            return None, 2 * cos_y * g

    class PairTimesSin(df.DifferentiableFunction):
        num_memory_values = 1

        def forward(self, xs, y):
            return xs[0] * xs[1] * jnp.sin(y), jnp.cos(y)

        def backward(self, g, compute_gradients, cos_y):
            return None, 2 * cos_y * g  # None for a whole tuple input

    np.testing.assert_allclose(jax.grad(lambda x: TimesSin()(x, x))(3.0), 2 * jnp.cos(3.0))
    np.testing.assert_allclose(
        jax.grad(lambda x: jax.vmap(TimesSin())(x, x).sum())(jnp.arange(3.0)),
        2 * jnp.cos(jnp.arange(3.0)),
    )
    np.testing.assert_allclose(
        jax.grad(lambda x: PairTimesSin()((x, x), x))(3.0), 2 * jnp.cos(3.0), rtol=1e-6
    )


def test_scan_batching_edge_case(key):
    class Mul(df.DifferentiableFunction):
        save_inputs_for_backward = True

        def forward(self, x, coeff):
            return x * coeff

        def backward(self, g, compute_gradients, x, coeff):
            return g * coeff, (x * g).sum()

    def scan_over_mul(x, coeff):
        return jax.lax.scan(lambda x, _: (Mul()(x, coeff), None), x, jnp.arange(3))[0]

    with jax.enable_x64(True):
        k1, k2 = jax.random.split(key)
        x_batch = jax.random.normal(k1, (3, 2), jnp.float64)
        covector = jax.random.normal(k2, (3, 2), jnp.float64)
        batched = jax.vmap(scan_over_mul, in_axes=(0, None))
        _, vjp = jax.vjp(batched, x_batch, jnp.array(1.0, jnp.float64))
        vjp(covector)
        check_grads(batched, (x_batch, jnp.array(1.0, jnp.float64)), order=2, modes=["rev"])


# --------------------------------------------------------------------------------------------
# the JAX custom-derivatives guide


class ClipGradient(df.DifferentiableFunction):
    """Identity whose gradient is clipped to [lo, hi]; lo and hi get no gradient."""

    save_inputs_for_backward = True

    def forward(self, lo, hi, x):
        return x

    def backward(self, g, compute_gradients, lo, hi, x):
        return None, None, jnp.clip(g, lo, hi)


def clip_gradient_original():
    @jax.custom_vjp
    def clip_gradient(lo, hi, x):
        return x

    clip_gradient.defvjp(
        lambda lo, hi, x: (x, (lo, hi)), lambda res, g: (None, None, jnp.clip(g, *res))
    )
    return clip_gradient


def test_clip_gradient():
    lo, hi, x = jnp.array(-0.3), jnp.array(0.4), jnp.linspace(-2.0, 2.0, 5)
    check_port(ClipGradient(), clip_gradient_original(), (lo, hi, x))


def tolerance(x):
    """A few ulps of x, so the iteration stops in any precision."""
    return 8 * jnp.finfo(x.dtype).eps * (1 + jnp.max(jnp.abs(x)))


def newton_sqrt_step(a, x):
    return 0.5 * (x + a / x)


@dataclasses.dataclass(frozen=True)
class AdjointStep:
    """u -> v + (d f(a, x*) / dx)^T u: the adjoint equation as a fixed-point map (hashable)."""

    f: object

    def __call__(self, packed, u):
        a, x_star, v = packed
        _, vjp_x = jax.vjp(lambda x: self.f(a, x), x_star)
        return v + vjp_x(u)[0]


class FixedPoint(df.DifferentiableFunction):
    """x* = f(a, x*) by iteration; its gradient by implicit differentiation (the guide's)."""

    save_inputs_for_backward = True
    save_outputs_for_backward = True

    def __init__(self, f):
        self.f = f

    def forward(self, a, x_guess):
        def not_converged(carry):
            previous, x = carry
            return jnp.max(jnp.abs(previous - x)) > tolerance(x)

        def step(carry):
            _, x = carry
            return x, self.f(a, x)

        return jax.lax.while_loop(not_converged, step, (x_guess, self.f(a, x_guess)))[1]

    def backward(self, dx_star, compute_gradients, a, x_guess, x_star):
        _, vjp_a = jax.vjp(lambda a: self.f(a, x_star), a)
        # The adjoint solve is itself a FixedPoint: differentiable again, so grad-of-grad works.
        w = FixedPoint(AdjointStep(self.f))((a, x_star, dx_star), dx_star)
        return (vjp_a(w)[0] if compute_gradients[0] else None), None


def fixed_point_original():
    """The guide's fixed_point: a jax.custom_vjp whose bwd calls it again.

    Always JAX's classic custom_vjp: with JAX_CUSTOM_VJP3=1, JAX's own custom_vjp3 fails on this
    function under jax.checkpoint (nondiff_argnums; a ValueError inside JAX), so the strict run
    compares difffn with the classic original.
    """
    from functools import partial

    previous = jax.config.jax_custom_vjp3
    jax.config.update("jax_custom_vjp3", False)
    try:
        return _fixed_point_original(partial)
    finally:
        jax.config.update("jax_custom_vjp3", previous)


def _fixed_point_original(partial):
    @partial(jax.custom_vjp, nondiff_argnums=(0,))
    def fixed_point(f, a, x_guess):
        def not_converged(carry):
            previous, x = carry
            return jnp.max(jnp.abs(previous - x)) > tolerance(x)

        def step(carry):
            _, x = carry
            return x, f(a, x)

        return jax.lax.while_loop(not_converged, step, (x_guess, f(a, x_guess)))[1]

    def fwd(f, a, x_guess):
        x_star = fixed_point(f, a, x_guess)
        return x_star, (a, x_star)

    def bwd(f, res, x_star_bar):
        a, x_star = res
        _, vjp_a = jax.vjp(lambda a: f(a, x_star), a)
        w = fixed_point(AdjointStep(f), (a, x_star, x_star_bar), x_star_bar)
        return vjp_a(w)[0], jnp.zeros_like(x_star)

    fixed_point.defvjp(fwd, bwd)
    return lambda a, x_guess: fixed_point(newton_sqrt_step, a, x_guess)


def test_implicit_fixed_point_solver():
    a, x_guess = jnp.array([2.0, 9.0, 0.5]), jnp.ones(3)
    check_port(FixedPoint(newton_sqrt_step), fixed_point_original(), (a, x_guess))


def test_implicit_fixed_point_grad_of_grad_is_sqrt_s():
    sqrt = lambda a: FixedPoint(newton_sqrt_step)(a, jnp.ones_like(a))  # noqa: E731
    with jax.enable_x64(True):
        a = jnp.array(2.0, jnp.float64)
        for order in (
            jax.grad,
            lambda f: jax.grad(jax.grad(f)),
            lambda f: jax.grad(jax.grad(jax.grad(f))),
        ):
            np.testing.assert_allclose(order(sqrt)(a), order(jnp.sqrt)(a), rtol=1e-10)


# --------------------------------------------------------------------------------------------
# PyTorch's autograd.Function examples


class LegendreP3(df.DifferentiableFunction):
    """P3(x) = (5x^3 - 3x) / 2, with P3'(x) = 1.5 (5x^2 - 1)."""

    save_inputs_for_backward = True

    def forward(self, x):
        return 0.5 * (5 * x**3 - 3 * x)

    def backward(self, grad_output, compute_gradients, x):
        return grad_output * 1.5 * (5 * x**2 - 1)


def test_legendre_polynomial_p3():
    check_port(LegendreP3(), lambda x: 0.5 * (5 * x**3 - 3 * x), (jnp.linspace(-1.0, 1.0, 7),))


class LinearFunction(df.DifferentiableFunction):
    """y = x W^T + b; each gradient only if needs_input_grad says so; the bias is optional."""

    save_inputs_for_backward = True

    def forward(self, x, weight, bias=None):
        y = x @ weight.T
        return y if bias is None else y + bias[None, :]

    def backward(self, grad_output, needs_input_grad, x, weight, bias):
        grad_x = grad_output @ weight if needs_input_grad[0] else None
        grad_w = grad_output.T @ x if needs_input_grad[1] else None
        grad_b = grad_output.sum(0) if bias is not None and needs_input_grad[2] else None
        return grad_x, grad_w, grad_b


def linear_original(x, weight, bias=None):
    y = x @ weight.T
    return y if bias is None else y + bias[None, :]


@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_function(with_bias, key):
    k = jax.random.split(key, 3)
    args = (jax.random.normal(k[0], (4, 3)), jax.random.normal(k[1], (2, 3)))
    if with_bias:
        args += (jax.random.normal(k[2], (2,)),)
    check_port(LinearFunction(), linear_original, args)


class Exp(df.DifferentiableFunction):
    """exp(x), whose backward reuses the saved output."""

    save_outputs_for_backward = True

    def forward(self, x):
        return jnp.exp(x)

    def backward(self, grad_output, compute_gradients, result):
        return grad_output * result


def test_exp_with_saved_output():
    check_port(Exp(), jnp.exp, (jnp.linspace(-1.0, 1.0, 5),))


# --------------------------------------------------------------------------------------------
# surrogate gradients


class GradientReversal(df.DifferentiableFunction):
    """Identity forward, -scale * gradient backward (domain-adversarial training)."""

    def __init__(self, scale=1.0):
        self.scale = scale

    def forward(self, x):
        return x

    def backward(self, g, compute_gradients):
        return -self.scale * g


def test_gradient_reversal():
    def original(x):  # the stop_gradient idiom: value x, derivative -0.5
        return jax.lax.stop_gradient(1.5 * x) - 0.5 * x

    check_port(GradientReversal(0.5), original, (jnp.linspace(-1.0, 1.0, 4),))


class StraightThrough(df.DifferentiableFunction):
    """round(x) forward, identity backward (quantization-aware training)."""

    def forward(self, x):
        return jnp.round(x)

    def backward(self, g, compute_gradients):
        return g


def test_straight_through_estimator():
    def original(x):
        return x + jax.lax.stop_gradient(jnp.round(x) - x)

    check_port(StraightThrough(), original, (jnp.array([-1.3, -0.2, 0.4, 1.7]),))

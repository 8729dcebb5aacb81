"""Tests of difffn/ops/_activation.py: the activations and softmax against numpy formulas."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import difffn as df

ops = df.ops


def _randn(shape, *, seed=0, dtype=jnp.float32):
    """Test data from numpy: no JAX compilation per shape, unlike jax.random."""
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


_erf = np.vectorize(math.erf)

# (op, keyword arguments, numpy reference on float64)
ACTIVATIONS = [
    (ops.relu, {}, lambda x: np.maximum(x, 0)),
    (ops.leaky_relu, {}, lambda x: np.where(x > 0, x, 0.01 * x)),
    (ops.leaky_relu, {"scale": 0.2}, lambda x: np.where(x > 0, x, 0.2 * x)),
    (ops.clipped_relu, {"ceiling": 1.5}, lambda x: np.minimum(np.maximum(x, 0), 1.5)),
    (ops.elu, {}, lambda x: np.where(x > 0, x, np.expm1(x))),
    (ops.elu, {"alpha": 0.5}, lambda x: np.where(x > 0, x, 0.5 * np.expm1(x))),
    (ops.gelu, {}, lambda x: 0.5 * x * (1 + _erf(x / np.sqrt(2)))),
    (
        ops.gelu,
        {"approximation": "tanh"},
        lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))),
    ),
    (ops.swish, {}, lambda x: x / (1 + np.exp(-x))),
    (ops.sigmoid, {}, lambda x: 1 / (1 + np.exp(-x))),
    (ops.tanh, {}, np.tanh),
]
IDS = [
    f"{op.__name__}{'-' + '-'.join(map(str, kw.values())) if kw else ''}"
    for op, kw, _ in ACTIVATIONS
]


@pytest.mark.parametrize(("op", "kwargs", "reference"), ACTIVATIONS, ids=IDS)
def test_activation_matches_formula_and_keeps_format(op, kwargs, reference):
    x = 2 * _randn((3, 4), seed=1)
    y = op(df.dlarray(x, "BC"), **kwargs)
    assert y.format == "BC"
    expected = reference(np.asarray(x, np.float64))
    np.testing.assert_allclose(y.data, expected, rtol=1e-5, atol=1e-6)
    plain = op(x, **kwargs)
    assert not isinstance(plain, df.FormattedArray)
    np.testing.assert_array_equal(plain, y.data)
    assert not isinstance(op(x, fmt="BC", **kwargs), df.FormattedArray)


@pytest.mark.parametrize(("op", "kwargs", "reference"), ACTIVATIONS, ids=IDS)
def test_activation_gradients_float64(x64, op, kwargs, reference):
    x = _randn((3, 4), seed=2, dtype=jnp.float64)
    x = jnp.where(jnp.abs(x) < 1e-2, 0.5, x)  # away from the kinks at 0
    x = jnp.where(jnp.abs(x - 1.5) < 1e-2, 1.0, x)  # and at the ceiling
    f = jax.jit(lambda x: op(x, **kwargs))
    check_grads(f, (x,), order=1, modes=("rev", "fwd"))
    np.testing.assert_allclose(jax.vmap(f)(x), f(x), rtol=1e-12)


def test_exact_gelu_derivatives_match_jax_nn_gelu_to_second_order(x64):
    """The erf form and its own tangent rule against autodiff of ``jax.nn.gelu`` (erfc)."""
    x = jnp.concatenate([_randn((40,), seed=3, dtype=jnp.float64) * 3, jnp.array([0.0, -7, 7])])

    def theirs(x):
        return jax.nn.gelu(x, approximate=False)

    for transform in (jax.grad, lambda f: jax.grad(jax.grad(f))):
        np.testing.assert_allclose(
            jax.vmap(transform(ops.gelu))(x), jax.vmap(transform(theirs))(x), rtol=1e-12, atol=1e-14
        )
    np.testing.assert_allclose(
        jax.jacfwd(ops.gelu)(x), jax.jacfwd(theirs)(x), rtol=1e-12, atol=1e-14
    )
    np.testing.assert_allclose(
        jax.hessian(lambda x: jnp.sum(ops.gelu(x)))(x[:5]),
        jax.hessian(lambda x: jnp.sum(theirs(x)))(x[:5]),
        rtol=1e-12,
        atol=1e-14,
    )
    check_grads(ops.gelu, (x[:8],), order=2, modes=("fwd", "rev"))


def test_softmax_tangent_rule_matches_autodiff_of_jax_nn_softmax(x64):
    """df.ops.softmax takes JAX's custom_jvp rule; its derivatives equal autodiff's."""
    x = _randn((3, 5), seed=4, dtype=jnp.float64)
    w = _randn((3, 5), seed=5, dtype=jnp.float64)

    def ours(x):
        return jnp.vdot(jnp.sin(ops.softmax(x, fmt="BC")), w)

    def theirs(x):
        return jnp.vdot(jnp.sin(jax.nn.softmax(x, axis=1)), w)

    np.testing.assert_allclose(jax.grad(ours)(x), jax.grad(theirs)(x), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(jax.hessian(ours)(x), jax.hessian(theirs)(x), rtol=1e-10, atol=1e-13)
    assert "custom_jvp_call" in str(jax.make_jaxpr(ours)(x))


def test_exact_gelu_backward_keeps_only_its_input(capsys):
    """JAX's own residual report: reverse mode saves x alone (the derivative is recomputed in
    the backward pass), where autodiff of jax.nn.gelu saves three arrays."""
    from jax.ad_checkpoint import print_saved_residuals

    x = jnp.linspace(-3.0, 3.0, 7)
    print_saved_residuals(lambda x: jnp.sum(ops.gelu(x)), x)
    saved = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert saved == ["f32[7] from the argument x"]
    print_saved_residuals(lambda x: jnp.sum(jax.nn.gelu(x, approximate=False)), x)
    assert len([ln for ln in capsys.readouterr().out.splitlines() if "f32[7]" in ln]) == 3


def test_exact_gelu_float32_and_edges():
    x = jnp.asarray(np.linspace(-12, 12, 2001), jnp.float32)
    np.testing.assert_allclose(ops.gelu(x), jax.nn.gelu(x, approximate=False), atol=2e-6)
    edges = jnp.array([jnp.inf, -jnp.inf, jnp.nan, -30.0, 30.0], jnp.float32)
    ours, theirs = ops.gelu(edges), jax.nn.gelu(edges, approximate=False)
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(theirs))
    np.testing.assert_array_equal(ours[jnp.isfinite(theirs)], theirs[jnp.isfinite(theirs)])
    grads = jax.vmap(jax.grad(ops.gelu))(edges)
    exact = jax.vmap(jax.grad(lambda v: jax.nn.gelu(v, approximate=False)))(edges)
    np.testing.assert_array_equal(grads, exact)
    assert ops.gelu(jnp.arange(3)).dtype == jax.nn.gelu(jnp.arange(3), approximate=False).dtype


@pytest.mark.parametrize(("fmt", "shape"), [("BC", (2, 5)), ("CB", (5, 2)), ("BSSC", (2, 2, 3, 5))])
def test_softmax_over_the_channel_axis(fmt, shape):
    x = 3 * _randn(shape, seed=3)
    y = ops.softmax(df.dlarray(x, fmt))
    axis = fmt.index("C")
    e = np.exp(np.asarray(x, np.float64) - np.asarray(x).max(axis=axis, keepdims=True))
    assert y.format == fmt
    np.testing.assert_allclose(y.data, e / e.sum(axis=axis, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(ops.softmax(x, fmt=fmt), y.data, rtol=1e-6)


def test_softmax_gradient_and_integers(x64):
    x = _randn((3, 4), seed=4, dtype=jnp.float64)
    check_grads(jax.jit(lambda x: ops.softmax(x, fmt="CB")), (x,), order=2, modes=("rev",))
    y = ops.softmax(jnp.arange(4, dtype=jnp.int32)[None], fmt="BC")
    assert jnp.issubdtype(y.dtype, jnp.floating)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: ops.softmax(jnp.ones((2, 3))), df.FormatError, r"df.ops.softmax: x is a plain"),
        (lambda: ops.softmax(df.dlarray(jnp.ones((2, 3)), "BT")), df.FormatError,
         r"softmax works along the channel axis 'C'.*'BT'"),
        (lambda: ops.clipped_relu(jnp.ones(2), 0), df.OpError,
         r"clipped_relu: ceiling must be a positive finite number; got 0"),
        (lambda: ops.leaky_relu(jnp.ones(2), "x"), df.OpError, r"scale must be a finite real"),
        (lambda: ops.gelu(jnp.ones(2), approximation="erf"), df.OpError,
         r"approximation must be 'none' or 'tanh'; got 'erf'"),
        (lambda: ops.relu(jnp.ones(2), fmt="BC"), df.FormatError,
         r"df.ops.relu: fmt 'BC' has 2 labels but the array has 1 dimensions"),
    ],
)  # fmt: skip
def test_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()

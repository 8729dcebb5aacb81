"""Tests of difffn/layers/_merge.py: Addition, Multiplication and Concatenation."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import difffn as df

L = df.layers


def _randn(shape, *, seed=0, dtype=jnp.float32):
    """Test data from numpy: no JAX compilation per shape, unlike jax.random."""
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def test_addition(key):
    a, b, c = (_randn((2, 3, 3, 4), seed=s) for s in range(3))
    layer = L.Addition()
    assert (layer.num_inputs, layer.input_names) == (2, ("in1", "in2"))
    y = L.Addition(3)(*(df.dlarray(v, "BSSC") for v in (a, b, c)))
    assert y.format == "BSSC"
    np.testing.assert_allclose(y.data, a + b + c, rtol=1e-6)
    np.testing.assert_allclose(layer(a, b), a + b, rtol=1e-6)
    broadcast = layer(df.dlarray(a, "BSSC"), df.dlarray(b[:, :1, :1], "BSSC"))
    assert broadcast.shape == a.shape
    grads = jax.grad(lambda a, b: jnp.sum(layer(a, b) ** 2), argnums=(0, 1))(a, b)
    np.testing.assert_allclose(grads[0], 2 * (a + b), rtol=1e-6)


def test_addition_errors():
    a, b = df.dlarray(jnp.ones((2, 3)), "BC"), df.dlarray(jnp.ones((3, 2)), "CB")
    with pytest.raises(df.FormatError, match=r"Addition \(layer 'add'\) needs inputs with the "
                       r"same format; got in1: 'BC', in2: 'CB'"):  # fmt: skip
        L.Addition(name="add")(a, b)
    with pytest.raises(df.FormatError, match=r"in2: plain array"):
        L.Addition()(a, jnp.ones((2, 3)))
    with pytest.raises(df.FormatError, match=r"shapes \[\(2, 3\), \(2, 4\)\], which do not match"):
        L.Addition()(a, df.dlarray(jnp.ones((2, 4)), "BC"))
    for n in (1, 0, "2"):
        with pytest.raises(df.LayerError, match="num_inputs must be an int of at least 2"):
            L.Addition(n)


@pytest.mark.parametrize(
    ("label", "fmt", "shapes", "axis"),
    [
        ("C", "BSSC", [(2, 3, 3, 4), (2, 3, 3, 1)], 3),
        ("C", "CB", [(4, 2), (3, 2)], 0),
        ("B", "BC", [(2, 3), (5, 3)], 0),
        ("T", "BTC", [(2, 4, 3), (2, 1, 3)], 1),
    ],
)
def test_concatenation(key, label, fmt, shapes, axis):
    xs = [_randn(s, seed=i) for i, s in enumerate(shapes)]
    y = L.Concatenation(label=label)(*(df.dlarray(x, fmt) for x in xs))
    assert y.format == fmt
    np.testing.assert_array_equal(y.data, np.concatenate([np.asarray(x) for x in xs], axis=axis))


def test_concatenation_three_inputs_plain_and_gradient(key):
    xs = [jnp.full((2, n), float(n)) for n in (1, 2, 3)]
    layer = L.Concatenation(3)
    assert layer.input_names == ("in1", "in2", "in3")
    y = layer(*xs)
    assert y.shape == (2, 6)
    grads = jax.grad(lambda *xs: jnp.sum(layer(*xs) * jnp.arange(6.0)[None]), argnums=(0, 1, 2))(
        *xs
    )
    np.testing.assert_array_equal(grads[2], [[3.0, 4.0, 5.0]] * 2)


def test_concatenation_errors():
    a = df.dlarray(jnp.ones((2, 3)), "BC")
    with pytest.raises(df.LayerError, match=r"Concatenation \(layer ''\): label must be 'C', 'B'"):
        L.Concatenation(label="S")
    with pytest.raises(df.FormatError, match=r"along 'T', but the inputs have format 'BC'"):
        L.Concatenation(label="T")(a, a)
    with pytest.raises(df.FormatError, match=r"same sizes except along 'C' \(axis 1\)"):
        L.Concatenation()(a, df.dlarray(jnp.ones((3, 3)), "BC"))
    with pytest.raises(df.FormatError, match=r"along 'B', which plain arrays do not label"):
        L.Concatenation(label="B")(jnp.ones((2, 3)), jnp.ones((2, 3)))
    with pytest.raises(df.FormatError, match="same format"):
        L.Concatenation()(a, df.dlarray(jnp.ones((2, 3)), "BU"))


def test_multiplication(key):
    a, b, c = (_randn((2, 3, 3, 4), seed=s) for s in range(3))
    layer = L.Multiplication()
    assert (layer.num_inputs, layer.input_names) == (2, ("in1", "in2"))
    y = L.Multiplication(3)(*(df.dlarray(v, "BSSC") for v in (a, b, c)))
    assert y.format == "BSSC"
    np.testing.assert_allclose(y.data, a * b * c, rtol=1e-6)
    gate = df.dlarray(b[:, :1, :1], "BSSC")  # a per-channel gate broadcasts over space
    np.testing.assert_allclose(layer(df.dlarray(a, "BSSC"), gate).data, a * b[:, :1, :1], 1e-6)
    grads = jax.grad(lambda a, b: jnp.sum(layer(a, b) ** 2), argnums=(0, 1))(a, b)
    np.testing.assert_allclose(grads[0], 2 * a * b * b, rtol=1e-5)


def test_multiplication_check_layer_and_errors():
    layout = df.Layout((4, 3), "BC")
    report = df.check_layer(L.Multiplication(), layout, layout)
    assert report.failed == 0 and report.incomplete == 0, str(report)
    a, b = df.dlarray(jnp.ones((2, 3)), "BC"), df.dlarray(jnp.ones((2, 4)), "BC")
    with pytest.raises(df.FormatError, match=r"Multiplication \(layer 'm'\) multiplies inputs of "
                       r"shapes \[\(2, 3\), \(2, 4\)\], which do not match"):  # fmt: skip
        L.Multiplication(name="m")(a, b)
    with pytest.raises(df.FormatError, match=r"needs inputs with the same format"):
        L.Multiplication()(a, df.dlarray(jnp.ones((3, 2)), "CB"))
    with pytest.raises(df.LayerError, match="num_inputs must be an int of at least 2"):
        L.Multiplication(1)

"""Tests of difffn/layers/_activation.py and _dropout.py: ReLU, ELU, Softmax, Dropout."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import difffn as df
from difffn._layer import call_layer

L = df.layers


def _randn(shape, *, seed=0, dtype=jnp.float32):
    """Test data from numpy: no JAX compilation per shape, unlike jax.random."""
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def test_relu_and_elu_match_reference(key):
    x = _randn((3, 4), seed=1) * 2
    relu = L.ReLU()(df.dlarray(x, "BC"))
    assert relu.format == "BC"
    np.testing.assert_array_equal(relu.data, np.maximum(np.asarray(x), 0))
    for alpha in (1.0, 0.3):
        y = L.ELU(alpha=alpha)(x)
        expected = np.where(x > 0, x, alpha * np.expm1(np.asarray(x)))
        np.testing.assert_allclose(y, expected, rtol=1e-6)
    assert L.ELU().alpha == 1.0
    assert L.ELU().learnable_names == ()


def test_activation_gradients_float64(x64, key):
    x = _randn((3, 4), seed=2, dtype=jnp.float64)
    x = jnp.where(jnp.abs(x) < 1e-3, 0.5, x)  # away from the kinks
    elu = L.ELU(alpha=0.7)
    grad = jax.grad(lambda x: jnp.sum(elu(x) ** 2))(x)
    expected = jax.grad(lambda x: jnp.sum(jnp.where(x > 0, x, 0.7 * jnp.expm1(x)) ** 2))(x)
    np.testing.assert_allclose(grad, expected, rtol=1e-12)
    check_grads(jax.jit(L.ReLU()), (x,), 1, ("rev",))
    softmax = L.Softmax()
    check_grads(jax.jit(lambda x: softmax(df.dlarray(x, "CB")).data), (x,), 1, ("rev",))


@pytest.mark.parametrize(("fmt", "shape"), [("BC", (2, 5)), ("CB", (5, 2)), ("BSSC", (2, 2, 3, 5))])
def test_softmax_over_the_channel_axis(key, fmt, shape):
    x = _randn(shape, seed=3) * 3
    y = L.Softmax()(df.dlarray(x, fmt))
    axis = fmt.index("C")
    e = np.exp(np.asarray(x, np.float64) - np.asarray(x).max(axis=axis, keepdims=True))
    assert y.format == fmt
    np.testing.assert_allclose(y.data, e / e.sum(axis=axis, keepdims=True), rtol=1e-5)


def test_softmax_plain_and_errors():
    y = L.Softmax()(jnp.zeros((2, 4)))
    np.testing.assert_allclose(y, 0.25)
    with pytest.raises(df.FormatError, match=r"Softmax \(layer 's'\) works along.*'BT' has none"):
        L.Softmax(name="s")(df.dlarray(jnp.zeros((2, 4)), "BT"))


def test_elu_bad_alpha():
    with pytest.raises(df.LayerError, match=r"ELU \(layer ''\): alpha must be a positive finite"):
        L.ELU(alpha=0)
    with pytest.raises(df.LayerError, match="alpha must be"):
        L.ELU(alpha=float("nan"))


def test_dropout_predict_is_identity_and_forward_drops(key):
    layer = L.Dropout(0.25)
    x = df.dlarray(jnp.full((20, 50), 3.0), "BC")
    assert layer(x) is not None and np.array_equal(layer(x).data, x.data)
    (y,), state = call_layer(layer, (x,), training=True, key=key)
    assert state == () and y.format == "BC"
    values = np.asarray(y.data)
    assert set(np.unique(values)) <= {0.0, 4.0}
    assert abs((values == 0).mean() - 0.25) < 0.06
    (again,), _ = call_layer(layer, (x,), training=True, key=key)
    np.testing.assert_array_equal(again.data, y.data)
    mask = values != 0
    grad = jax.grad(lambda x: jnp.sum(call_layer(layer, (x,), training=True, key=key)[0][0]))(
        x.data
    )
    np.testing.assert_allclose(grad, np.where(mask, 1 / 0.75, 0.0), rtol=1e-6)


def test_dropout_defaults_zero_probability_and_jit(key):
    assert L.Dropout().probability == 0.5
    x = jnp.ones((4, 4))
    (y,), _ = call_layer(L.Dropout(0.0), (x,), training=True, key=key)
    np.testing.assert_array_equal(y, x)
    run = jax.jit(lambda layer, x, k: call_layer(layer, (x,), training=True, key=k)[0][0])
    np.testing.assert_array_equal(
        run(L.Dropout(0.5), x, key), call_layer(L.Dropout(0.5), (x,), training=True, key=key)[0][0]
    )


def test_dropout_errors():
    with pytest.raises(df.LayerError, match=r"Dropout \(layer 'd'\): training-time dropout.*key="):
        call_layer(L.Dropout(name="d"), (jnp.ones(3),), training=True)
    for p in (1.0, -0.1, "half"):
        with pytest.raises(df.LayerError, match=r"probability must be a number in \[0, 1\)"):
            L.Dropout(p)

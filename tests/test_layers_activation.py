"""Tests of difffn/layers/_activation.py and _dropout.py: ReLU, ELU, Softmax, Dropout."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import difffn as df
from difffn._layer._layer import call_layer

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


# -- LeakyReLU, ClippedReLU, Tanh, Sigmoid, Swish, GELU -------------------------------------------

NEW = [
    (L.LeakyReLU(), lambda x: np.where(x > 0, x, 0.01 * x)),
    (L.LeakyReLU(0.3), lambda x: np.where(x > 0, x, 0.3 * x)),
    (L.ClippedReLU(1.5), lambda x: np.clip(x, 0, 1.5)),
    (L.Tanh(), np.tanh),
    (L.Sigmoid(), lambda x: 1 / (1 + np.exp(-x))),
    (L.Swish(), lambda x: x / (1 + np.exp(-x))),
    (L.GELU(), lambda x: np.asarray(jax.nn.gelu(jnp.asarray(x), approximate=False))),
    (L.GELU(approximation="tanh"), lambda x: np.asarray(jax.nn.gelu(jnp.asarray(x)))),
]
NEW_IDS = [repr(layer).replace(", name=''", "") for layer, _ in NEW]


@pytest.mark.parametrize(("layer", "reference"), NEW, ids=NEW_IDS)
def test_new_activations_match_reference_and_keep_the_format(layer, reference):
    x = 2 * _randn((3, 4), seed=5)
    y = layer(df.dlarray(x, "BC"))
    assert y.format == "BC" and layer.learnable_names == ()
    np.testing.assert_allclose(y.data, reference(np.asarray(x, np.float64)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("layer", "reference"), NEW, ids=NEW_IDS)
def test_new_activation_gradients_float64(x64, layer, reference):
    x = _randn((3, 4), seed=6, dtype=jnp.float64)
    x = jnp.where((jnp.abs(x) < 1e-2) | (jnp.abs(x - 1.5) < 1e-2), 0.5, x)  # away from kinks
    check_grads(jax.jit(layer), (x,), 2 if not isinstance(layer, L.ClippedReLU) else 1, ("rev",))


@pytest.mark.parametrize(
    "layer",
    [L.LeakyReLU(), L.ClippedReLU(1.0), L.GELU(), L.Swish(), L.Tanh(), L.Sigmoid(), L.ReLU(),
     L.ELU(0.5), L.Softmax()],
    ids=lambda layer: type(layer).__name__,
)  # fmt: skip
def test_check_layer_passes(layer):
    report = df.check_layer(layer, df.Layout((4, 3), "BC"))
    assert report.failed == 0 and report.incomplete == 0, str(report)


def test_new_activation_defaults_and_bad_arguments():
    assert L.LeakyReLU().scale == 0.01 and L.GELU().approximation == "none"
    with pytest.raises(df.LayerError, match=r"ClippedReLU\(...\) could not be constructed"):
        L.ClippedReLU()
    with pytest.raises(df.LayerError, match=r"ClippedReLU \(layer ''\): ceiling must be a pos"):
        L.ClippedReLU(0)
    with pytest.raises(df.LayerError, match=r"LeakyReLU \(layer 'l'\): scale must be a finite"):
        L.LeakyReLU(float("inf"), name="l")
    with pytest.raises(df.LayerError, match=r"approximation must be one of 'none' \| 'tanh'"):
        L.GELU(approximation="erf")

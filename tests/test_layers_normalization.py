"""Tests of difffn/layers/_normalization.py: BatchNorm."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_tree_allclose
from jax.test_util import check_grads

import difffn as df
from difffn._layer import call_layer

L = df.layers


def _randn(shape, *, seed=0, dtype=jnp.float32):
    """Test data from numpy: no JAX compilation per shape, unlike jax.random."""
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def _layer(key, channels=3, fmt="BSSC", shape=(None, 4, 4, 3)):
    layer = L.BatchNorm(
        name="bn",
        offset=_randn((channels,), seed=1),
        scale=_randn((channels,), seed=2),
        trained_mean=_randn((channels,), seed=3),
        trained_variance=1 + 0.5 * jnp.tanh(_randn((channels,), seed=4)),
    )
    return layer.initialize(df.Layout(shape, fmt), key=key)


def _reference(x, axis, offset, scale, mean, variance, epsilon=1e-5):
    shape = [1] * x.ndim
    shape[axis] = -1
    r = lambda v: jnp.reshape(v, shape)  # noqa: E731
    return r(scale) * (x - r(mean)) / jnp.sqrt(r(variance) + epsilon) + r(offset)


def test_initialize_defaults_and_idempotence(key):
    layout = df.Layout((None, 5, 5, 3), "BSSC")
    layer = L.BatchNorm().initialize(layout, key=key)
    for name, value in [("offset", 0), ("scale", 1), ("trained_mean", 0), ("trained_variance", 1)]:
        array = getattr(layer, name)
        assert array.shape == (3,)
        assert array.dtype == jnp.float32
        np.testing.assert_array_equal(array, value)
    assert layer.learnable_names == ("offset", "scale")
    assert layer.state_names == ("trained_mean", "trained_variance")
    assert layer.initialize(layout, key=jax.random.key(3)) is layer
    given = L.BatchNorm(scale=jnp.full(3, 2.0)).initialize(layout, key=key)
    np.testing.assert_array_equal(given.scale, 2.0)
    assert (L.BatchNorm().epsilon, L.BatchNorm().mean_decay, L.BatchNorm().variance_decay) == (
        1e-5,
        0.1,
        0.1,
    )


@pytest.mark.parametrize(
    ("fmt", "shape"),
    [("BSSC", (4, 3, 5, 3)), ("BC", (6, 3)), ("CB", (3, 6)), ("BTC", (2, 5, 3)), ("", (4, 3))],
)
def test_forward_uses_batch_statistics_and_updates_running_ones(key, fmt, shape):
    layer = _layer(key)
    x = _randn(shape, seed=4) * 3 + 1
    axis = fmt.index("C") if fmt else len(shape) - 1
    axes = tuple(i for i in range(len(shape)) if i != axis)
    data = np.asarray(x, np.float64)
    mean, variance = data.mean(axis=axes), data.var(axis=axes)
    m = data.size // 3
    inputs = (df.dlarray(x, fmt),) if fmt else (x,)
    (y,), (new_mean, new_variance) = call_layer(layer, inputs, training=True)
    expected = _reference(data, axis, layer.offset, layer.scale, mean, variance)
    assert df.dims(y) == fmt
    np.testing.assert_allclose(df.stripdims(y), expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(new_mean, 0.1 * mean + 0.9 * np.asarray(layer.trained_mean), 1e-5)
    unbiased = variance * m / (m - 1)
    np.testing.assert_allclose(
        new_variance, 0.1 * unbiased + 0.9 * np.asarray(layer.trained_variance), rtol=1e-5
    )


def test_predict_uses_trained_statistics_and_returns_them_unchanged(key):
    layer = _layer(key)
    x = _randn((2, 4, 4, 3), seed=5)
    y, mean, variance = layer(df.dlarray(x, "BSSC"))
    expected = _reference(
        x, 3, layer.offset, layer.scale, layer.trained_mean, layer.trained_variance
    )
    np.testing.assert_allclose(y.data, expected, rtol=1e-5, atol=1e-5)
    assert mean is layer.trained_mean and variance is layer.trained_variance


def test_custom_decay_epsilon_and_single_value_batches(key):
    layer = _layer(key).replace(mean_decay=0.5, variance_decay=1.0, epsilon=0.1)
    x = jnp.arange(3.0).reshape(1, 1, 1, 3)  # one value per channel: m = 1
    (y,), (mean, variance) = call_layer(layer, (x,), training=True)
    np.testing.assert_allclose(mean, 0.5 * x[0, 0, 0] + 0.5 * layer.trained_mean, rtol=1e-6)
    np.testing.assert_array_equal(variance, 0)
    np.testing.assert_allclose(y, jnp.broadcast_to(layer.offset, (1, 1, 1, 3)), rtol=1e-6)


def test_running_statistics_keep_dtype_and_carry_no_gradient(x64, key):
    layer = L.BatchNorm().initialize(df.Layout((None, 2, 2, 3), "BSSC"), key=key)
    x = _randn((4, 2, 2, 3), seed=6, dtype=jnp.float64)
    (y,), (mean, variance) = call_layer(layer, (x,), training=True)
    assert y.dtype == jnp.float64
    assert mean.dtype == variance.dtype == jnp.float32

    def from_state(x):
        _, (mean, variance) = call_layer(layer, (x,), training=True)
        return jnp.sum(mean) + jnp.sum(variance)

    np.testing.assert_array_equal(jax.grad(from_state)(x), 0)


def test_forward_gradients_float64(x64, key):
    layer = jax.tree.map(lambda a: a.astype(jnp.float64), _layer(key, shape=(None, 3, 3, 3)))
    x = _randn((2, 3, 3, 3), seed=7, dtype=jnp.float64)

    def loss(layer, x):
        (y,), _ = call_layer(layer, (df.dlarray(x, "BSSC"),), training=True)
        return jnp.sum(jnp.sin(y.data))

    def reference(offset, scale, x):
        mean = jnp.mean(x, axis=(0, 1, 2))
        variance = jnp.var(x, axis=(0, 1, 2))
        return jnp.sum(jnp.sin(_reference(x, 3, offset, scale, mean, variance)))

    grads = jax.jit(jax.grad(loss, argnums=(0, 1)))(layer, x)
    expected = jax.jit(jax.grad(reference, argnums=(0, 1, 2)))(layer.offset, layer.scale, x)
    assert_tree_allclose(
        (grads[0].offset, grads[0].scale, grads[1]), expected, rtol=1e-10, atol=1e-12
    )
    np.testing.assert_array_equal(grads[0].trained_mean, 0)
    check_grads(jax.jit(lambda x: loss(layer, x)), (x,), 1, ("rev",))


def test_forward_under_jit(key):
    layer = _layer(key)
    x = _randn((2, 4, 4, 3), seed=8)
    step = jax.jit(lambda layer, x: call_layer(layer, (x,), training=True))
    assert_tree_allclose(step(layer, x), call_layer(layer, (x,), training=True), rtol=1e-5)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: L.BatchNorm(epsilon=0), r"BatchNorm \(layer ''\): epsilon must be a positive"),
        (lambda: L.BatchNorm(mean_decay=1.5), r"mean_decay must be a number in \[0, 1\]; got 1.5"),
        (lambda: L.BatchNorm(variance_decay=-0.1), r"variance_decay must be a number in \[0, 1\]"),
        (lambda: L.BatchNorm(scale_initializer="glorot"), r"scale_initializer must be one of"),
        (lambda: L.BatchNorm(offset=jnp.ones((2, 2))), r"offset must be an array of shape \(any\)"),
        (
            lambda: L.BatchNorm(offset=jnp.ones(2), scale=jnp.ones(3)),
            r"one value per channel; got sizes \[2, 3\]",
        ),
    ],
)
def test_bad_arguments(make, match):
    with pytest.raises(df.LayerError, match=match):
        make()


def test_format_and_channel_errors(key):
    layer = L.BatchNorm(name="bn")
    with pytest.raises(df.FormatError, match=r"BatchNorm \(layer 'bn'\)\.initialize.*'C' axis"):
        layer.initialize(df.Layout((None, 4), "BU"), key=key)
    with pytest.raises(df.LayerError, match=r"parameter\(s\) \['offset', 'scale', 'trained_mean'"):
        layer(jnp.ones((2, 3)))
    ready = layer.initialize(df.Layout((None, 3), "BC"), key=key)
    with pytest.raises(df.LayerError, match=r"the input has 4 channels but offset has 3 values"):
        ready(df.dlarray(jnp.ones((2, 4)), "BC"))
    with pytest.raises(df.FormatError, match=r"format 'BSS' has none"):
        ready(df.dlarray(jnp.ones((2, 3, 3)), "BSS"))
    given = L.BatchNorm(trained_mean=jnp.zeros(2))
    with pytest.raises(df.LayerError, match=r"layout .* has 3 channels but trained_mean has 2"):
        given.initialize(df.Layout((None, 3), "BC"), key=key)

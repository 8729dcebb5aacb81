"""Tests of difffn/layers/_fully_connected.py and _flatten.py: FullyConnected, Flatten."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_tree_allclose

import difffn as df

L = df.layers


def _randn(shape, *, seed=0, dtype=jnp.float32):
    """Test data from numpy: no JAX compilation per shape, unlike jax.random."""
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


@pytest.mark.parametrize(
    ("fmt", "shape", "out_fmt", "out_shape"),
    [
        ("BSSC", (2, 3, 4, 5), "BC", (2, 60)),
        ("BC", (2, 7), "BC", (2, 7)),
        ("CB", (7, 2), "BC", (2, 7)),
        ("BTC", (2, 3, 7), "BTC", (2, 3, 7)),
        ("TBC", (3, 2, 7), "TBC", (3, 2, 7)),
        ("BTSSC", (2, 3, 2, 2, 4), "BTC", (2, 3, 16)),
        ("BSSU", (2, 2, 3, 2), "BC", (2, 12)),
    ],
)
def test_flatten_formats_in_storage_order(fmt, shape, out_fmt, out_shape):
    x = jnp.arange(np.prod(shape), dtype=jnp.float32).reshape(shape)
    y = L.Flatten()(df.dlarray(x, fmt))
    assert (y.format, y.shape) == (out_fmt, out_shape)
    keep = [i for i, label in enumerate(fmt) if label in "BT"]
    rest = [i for i, label in enumerate(fmt) if label not in "BT"]
    expected = np.transpose(np.asarray(x), keep + rest).reshape(out_shape)
    np.testing.assert_array_equal(y.data, expected)


def test_flatten_plain_input_is_batch_first():
    y = L.Flatten()(jnp.ones((2, 3, 4)))
    assert not isinstance(y, df.FormattedArray) and y.shape == (2, 12)
    with pytest.raises(df.FormatError, match=r"Flatten \(layer ''\) flattens.*format 'B' has none"):
        L.Flatten()(df.dlarray(jnp.ones(2), "B"))


@pytest.mark.parametrize(
    ("fmt", "shape", "features", "out_fmt"),
    [
        ("BSSC", (2, 3, 2, 2), 12, "BC"),
        ("BC", (3, 5), 5, "BC"),
        ("BTC", (2, 4, 5), 5, "BTC"),
        ("TBC", (4, 2, 5), 5, "TBC"),
    ],
)
def test_fully_connected_matches_reference(key, fmt, shape, features, out_fmt):
    layout = df.Layout((None, *shape[1:]), fmt)
    layer = L.FullyConnected(6).initialize(layout, key=key)
    layer = layer.replace(bias=jnp.arange(6.0))
    assert layer.weights.shape == (features, 6)
    x = _randn(shape, seed=1)
    y = layer(df.dlarray(x, fmt))
    flat = L.Flatten()(df.dlarray(x, fmt)).data
    expected = np.einsum("...f,fo->...o", np.asarray(flat), np.asarray(layer.weights)) + np.arange(
        6
    )
    assert y.format == out_fmt
    np.testing.assert_allclose(y.data, expected, rtol=1e-5, atol=1e-5)


def test_plain_input_and_initializers(key):
    layer = L.FullyConnected(4, weights_initializer="zeros", bias_initializer="ones")
    layer = layer.initialize(df.Layout((None, 3), "BC"), key=key)
    y = layer(jnp.ones((2, 3)))
    assert not isinstance(y, df.FormattedArray)
    np.testing.assert_array_equal(y, 1)
    glorot = L.FullyConnected(50).initialize(df.Layout((None, 30), "BC"), key=key)
    bound = np.sqrt(6 / 80)
    assert float(jnp.max(jnp.abs(glorot.weights))) <= bound
    assert float(jnp.max(jnp.abs(glorot.weights))) > 0.9 * bound


def test_initialize_idempotent_and_keeps_given(key):
    layout = df.Layout((None, 2, 2, 3), "BSSC")
    layer = L.FullyConnected(4).initialize(layout, key=key)
    assert layer.initialize(layout, key=jax.random.key(5)) is layer
    given = L.FullyConnected(4, weights=jnp.ones((12, 4))).initialize(layout, key=key)
    np.testing.assert_array_equal(given.weights, 1)
    assert given.bias.shape == (4,)


def test_gradients_float64(x64, key):
    layer = L.FullyConnected(3).initialize(df.Layout((None, 2, 2, 2), "BSSC"), key=key)
    layer = jax.tree.map(lambda a: a.astype(jnp.float64), layer)
    x = _randn((4, 2, 2, 2), seed=2, dtype=jnp.float64)

    def loss(layer, x):
        return jnp.sum(jnp.tanh(layer(df.dlarray(x, "BSSC")).data))

    def reference(w, b, x):
        return jnp.sum(jnp.tanh(x.reshape(4, 8) @ w + b[None]))

    grads = jax.jit(jax.grad(loss, argnums=(0, 1)))(layer, x)
    assert isinstance(grads[0], L.FullyConnected)
    expected = jax.jit(jax.grad(reference, argnums=(0, 1, 2)))(layer.weights, layer.bias, x)
    assert_tree_allclose((grads[0].weights, grads[0].bias, grads[1]), expected, rtol=1e-12)


def test_vmap_over_an_ensemble_of_layers(key):
    layout = df.Layout((None, 3), "BC")
    layers = [L.FullyConnected(2).initialize(layout, key=k) for k in jax.random.split(key, 4)]
    stacked = jax.tree.map(lambda *a: jnp.stack(a), *layers)
    x = _randn((5, 3), seed=3)
    ys = jax.vmap(lambda layer, x: layer(x), in_axes=(0, None))(stacked, x)
    assert ys.shape == (4, 5, 2)
    np.testing.assert_allclose(ys[2], layers[2](x), rtol=1e-6)


def test_errors(key):
    with pytest.raises(df.LayerError, match=r"FullyConnected \(layer 'fc'\): output_size must be"):
        L.FullyConnected(0, name="fc")
    with pytest.raises(df.LayerError, match="weights_initializer must be one of"):
        L.FullyConnected(2, weights_initializer="xavier")  # "orthogonal" is MATLAB's: accepted
    with pytest.raises(df.LayerError, match=r"weights must be an array of shape \(any, 2\)"):
        L.FullyConnected(2, weights=jnp.ones((3, 3)))
    layer = L.FullyConnected(2, name="fc")
    with pytest.raises(df.LayerError, match="needs the sizes of the 'S', 'C' and 'U' axes"):
        layer.initialize(df.Layout((None, None, 3), "BSC"), key=key)
    with pytest.raises(df.LayerError, match=r"initialize takes a df.Layout"):
        layer.initialize((None, 3), key=key)
    given = L.FullyConnected(2, weights=jnp.ones((5, 2)), bias=jnp.zeros(2))
    with pytest.raises(df.LayerError, match=r"layout .* has 6 features .* expecting 5"):
        given.initialize(df.Layout((None, 2, 3), "BSC"), key=key)
    with pytest.raises(df.LayerError, match=r"the input has 3 features .* Fix: give weights"):
        given(df.dlarray(jnp.ones((1, 3)), "BC"))


def test_check_layer_passes():
    report = df.check_layer(L.FullyConnected(3), df.Layout((2, 2, 2, 3), "SSCB"))
    assert report.failed == 0 and report.incomplete == 0, str(report)

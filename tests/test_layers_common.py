"""Properties every built-in layer shares (difffn/layers): initialize, jit, grad, documentation."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_tree_allclose

import difffn as df
from difffn._layer._layer import call_layer

L = df.layers


def _randn(shape, *, seed=0, dtype=jnp.float32):
    """Test data from numpy: no JAX compilation per shape, unlike jax.random."""
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


IMAGE = df.Layout((None, 6, 6, 3), "BSSC")
FEATURES = df.Layout((None, 4), "BC")
SEQUENCE = df.Layout((None, None, 3), "BTC")
VOLUME = df.Layout((None, 4, 4, 4, 3), "BSSSC")

# (layer, input layout, example input shape): one entry per built-in layer class.
LAYERS = [
    (L.ImageInput((6, 6, 3), mean=jnp.full(3, 0.5)), IMAGE, (2, 6, 6, 3)),
    (L.FeatureInput(4, normalization="zscore", mean=1.0, standard_deviation=2.0), FEATURES, (2, 4)),
    (L.SequenceInput(3), SEQUENCE, (2, 5, 3)),
    (L.Conv2D(3, 4, padding="same"), IMAGE, (2, 6, 6, 3)),
    (L.BatchNorm(), IMAGE, (2, 6, 6, 3)),
    (L.FullyConnected(5), IMAGE, (2, 6, 6, 3)),
    (L.ReLU(), FEATURES, (2, 4)),
    (L.ELU(), FEATURES, (2, 4)),
    (L.Softmax(), FEATURES, (2, 4)),
    (L.Dropout(), FEATURES, (2, 4)),
    (L.Flatten(), IMAGE, (2, 6, 6, 3)),
    (L.MaxPool2D(2, stride=2), IMAGE, (2, 6, 6, 3)),
    (L.GlobalAveragePool2D(), IMAGE, (2, 6, 6, 3)),
    (L.Addition(), FEATURES, (2, 4)),
    (L.Concatenation(), FEATURES, (2, 4)),
    (L.LSTM(3), SEQUENCE, (2, 5, 3)),
    (L.GRU(3), SEQUENCE, (2, 5, 3)),
    (L.BiLSTM(3), SEQUENCE, (2, 5, 3)),
    (L.Embedding(4, 10), df.Layout((None, None, 1), "BTC"), (2, 5, 1)),
    (L.PositionEmbedding(4, 8), SEQUENCE, (2, 5, 3)),
    (L.SinusoidalPositionEncoding(4), SEQUENCE, (2, 5, 3)),
    (L.SelfAttention(2, 4, attention_mask="causal"), SEQUENCE, (2, 5, 3)),
    (L.FunctionLayer(jnp.sin), FEATURES, (2, 4)),
    (L.Conv1D(3, 4, padding="causal"), SEQUENCE, (2, 5, 3)),
    (L.Conv3D(2, 4, padding="same"), VOLUME, (2, 4, 4, 4, 3)),
    (L.TransposedConv2D(3, 4, stride=2), IMAGE, (2, 6, 6, 3)),
    (L.AveragePool2D(2, stride=2), IMAGE, (2, 6, 6, 3)),
    (L.GlobalMaxPool2D(), IMAGE, (2, 6, 6, 3)),
    (L.LayerNorm(), SEQUENCE, (2, 5, 3)),
    (L.GroupNorm(3), IMAGE, (2, 6, 6, 3)),
    (L.InstanceNorm(), IMAGE, (2, 6, 6, 3)),
    (L.LeakyReLU(), FEATURES, (2, 4)),
    (L.ClippedReLU(1.0), FEATURES, (2, 4)),
    (L.Tanh(), FEATURES, (2, 4)),
    (L.Sigmoid(), FEATURES, (2, 4)),
    (L.Swish(), FEATURES, (2, 4)),
    (L.GELU(), FEATURES, (2, 4)),
    (L.Multiplication(), FEATURES, (2, 4)),
    (L.Resize2D(scale=2, method="bilinear"), IMAGE, (2, 6, 6, 3)),
    (L.Identity(), FEATURES, (2, 4)),
    (L.MaxPool1D(2, stride=2), SEQUENCE, (2, 6, 3)),
    (L.AveragePool1D(2, padding=1, padding_value="mean"), SEQUENCE, (2, 6, 3)),
    (L.GlobalAveragePool1D(), SEQUENCE, (2, 6, 3)),
    (L.GlobalMaxPool1D(), SEQUENCE, (2, 6, 3)),
]
IDS = [type(layer).__name__ for layer, _, _ in LAYERS]


def _initialized(layer, layout, key):
    layouts = (layout,) * layer.num_inputs
    return layer.initialize(*layouts, key=key)


def _inputs(layer, layout, shape, key):
    return tuple(df.dlarray(_randn(shape, seed=i), layout.format) for i in range(layer.num_inputs))


# Wrappers of another library's module: built from that module, tested in their own files
# (tests/test_layers_from_nnx.py, tests/test_layers_from_equinox.py). Placeholder raises when it
# runs, by design (it stands for an operation df.import_onnx could not import): its behaviour is
# tested in tests/test_onnx_import.py.
WRAPPERS = {"FromNNX", "FromEquinox", "Placeholder"}


def test_every_layer_of_the_api_is_here_and_documented():
    assert sorted(set(L.__all__) - WRAPPERS) == sorted(IDS)
    for name in L.__all__:
        cls = getattr(L, name)
        assert issubclass(cls, df.Layer)
        doc = inspect.getdoc(cls)
        assert doc and "Examples:" in doc, name


@pytest.mark.parametrize(("layer", "layout", "shape"), LAYERS, ids=IDS)
def test_initialize_twice_changes_nothing(key, layer, layout, shape):
    once = _initialized(layer, layout, key)
    assert once.initialized
    twice = _initialized(once, layout, jax.random.key(7))
    assert jax.tree.structure(twice) == jax.tree.structure(once)
    assert_tree_allclose(twice, once, rtol=0, atol=0)


WITH_LEARNABLES = [(layer, layout) for layer, layout, _ in LAYERS if layer.learnable_names]


@pytest.mark.parametrize(
    ("layer", "layout"), WITH_LEARNABLES, ids=[type(lo).__name__ for lo, _ in WITH_LEARNABLES]
)
def test_initialize_fills_only_what_is_none(key, layer, layout):
    # One shared fill (layers/_initializers.fill) for every built-in layer: a learnable given to
    # the constructor is kept, and the others draw what they would draw without it.
    full = _initialized(layer, layout, key)
    first, *others = layer.learnable_names
    given = jnp.full_like(getattr(full, first), 0.5)
    partial = _initialized(layer.replace(**{first: given}), layout, key)
    assert np.array_equal(getattr(partial, first), given)
    for name in others:
        assert np.array_equal(getattr(partial, name), getattr(full, name)), name


@pytest.mark.parametrize(("layer", "layout", "shape"), LAYERS, ids=IDS)
def test_jit_grad_and_training_mode(key, layer, layout, shape):
    k_init, k_x, k_drop = jax.random.split(key, 3)
    layer = _initialized(layer, layout, k_init)
    inputs = _inputs(layer, layout, shape, k_x)
    eager = call_layer(layer, inputs, training=False)
    jitted = jax.jit(lambda layer, xs: call_layer(layer, xs, training=False))(layer, inputs)
    assert_tree_allclose(jitted, eager, rtol=1e-5, atol=1e-6)

    def loss(layer, xs):
        (y, *_), _ = call_layer(layer, xs, training=True, key=k_drop)
        return jnp.sum(jnp.sin(df.stripdims(y)))

    grads = jax.jit(jax.grad(loss, argnums=(0, 1)))(layer, inputs)
    assert type(grads[0]) is type(layer)
    assert jax.tree.structure(grads[0]) == jax.tree.structure(layer)
    assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads))


def test_a_small_network_of_layers_trains(key):
    chain = [
        L.ImageInput((6, 6, 1), normalization="none"),
        L.Conv2D(3, 4, padding="same"),
        L.BatchNorm(),
        L.ReLU(),
        L.MaxPool2D(2, stride=2),
        L.Dropout(0.2),
        L.FullyConnected(3),
        L.Softmax(),
    ]
    image, pooled = df.Layout((None, 6, 6, 1), "BSSC"), df.Layout((None, 3, 3, 4), "BSSC")
    layouts = [image, image, image.with_size("C", 4), None, None, pooled, pooled, None]
    keys = jax.random.split(key, len(chain))
    layers = [
        layer.initialize(layout, key=k) if layout else layer
        for layer, layout, k in zip(chain, layouts, keys, strict=True)
    ]
    x = jnp.abs(_randn((8, 6, 6, 1)))
    labels = jnp.arange(8) % 3

    def loss(layers, x, key):
        keys = jax.random.split(key, len(layers))
        for i, (layer, k) in enumerate(zip(layers, keys, strict=True)):
            (x,), state = call_layer(layer, (x,), training=True, key=k)
            if state:
                layers[i] = layer.replace(**dict(zip(layer.state_names, state, strict=True)))
        log_p = jnp.log(x.data)
        return -jnp.mean(jnp.take_along_axis(log_p, labels[:, None], axis=1)), layers

    @jax.jit
    def step(layers, key):
        (value, layers_with_state), grads = jax.value_and_grad(loss, has_aux=True)(layers, x, key)
        learned = jax.tree.map(lambda w, g: w - 0.5 * g, layers, grads)
        states = [
            layer.replace(**{n: getattr(new, n) for n in layer.state_names})
            for layer, new in zip(learned, layers_with_state, strict=True)
        ]
        return value, states

    first, layers = step(layers, key)
    for k in jax.random.split(key, 3):
        value, layers = step(layers, k)
    assert float(value) < float(first)
    assert float(jnp.max(jnp.abs(layers[2].trained_mean))) > 0
    assert layers[1].weights.dtype == jnp.float32


@pytest.mark.parametrize(
    ("make", "argument"),
    [
        (lambda: L.Conv2D(3, 4, bias="bad"), "bias"),
        (lambda: L.FullyConnected(5, weights=[[1.0, 2.0], [3.0]]), "weights"),
        (lambda: L.LSTM(3, hidden_state="zeros"), "hidden_state"),
        (
            lambda: L.FeatureInput(4, normalization="zscore", mean="x", standard_deviation=1.0),
            "mean",
        ),
    ],
)
def test_a_non_numeric_array_argument_is_the_layers_error(make, argument):
    with pytest.raises(
        df.LayerError, match=rf"{argument} must be a real array .*; got .*Fix: pass numbers"
    ):
        make()

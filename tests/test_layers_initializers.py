"""Tests of difffn/layers/_initializers.py: every initializer name MATLAB lists per layer, and
function initializers in both forms (MATLAB's ``fn(sz)``, JAX's ``fn(key, shape, dtype)``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import difffn as df

L = df.layers
FEATURES = df.Layout((None, 6), "BC")
SEQUENCE = df.Layout((None, None, 6), "BTC")
IMAGE = df.Layout((None, 5, 5, 6), "BSSC")

# (layer class and required arguments, input layout, option, the names MATLAB lists for it)
GLOROT_HE_ORTH = ("glorot", "he", "orthogonal", "narrow-normal", "zeros", "ones")
CONV = ("glorot", "he", "narrow-normal", "zeros", "ones")
BIAS = ("zeros", "narrow-normal", "ones")
OPTIONS = [
    ((L.FullyConnected, 4), FEATURES, "weights", GLOROT_HE_ORTH),  # fullyConnectedLayer
    ((L.FullyConnected, 4), FEATURES, "bias", BIAS),
    ((L.Conv2D, 3, 4), IMAGE, "weights", CONV),  # convolution2dLayer
    ((L.Conv2D, 3, 4), IMAGE, "bias", BIAS),
    ((L.Conv1D, 3, 4), SEQUENCE, "weights", CONV),  # convolution1dLayer
    ((L.TransposedConv2D, 3, 4), IMAGE, "weights", CONV),  # transposedConv2dLayer
    ((L.LSTM, 4), SEQUENCE, "input_weights", GLOROT_HE_ORTH),  # lstmLayer
    ((L.LSTM, 4), SEQUENCE, "recurrent_weights", GLOROT_HE_ORTH),
    ((L.LSTM, 4), SEQUENCE, "bias", ("unit-forget-gate", *BIAS)),
    ((L.GRU, 4), SEQUENCE, "input_weights", GLOROT_HE_ORTH),  # gruLayer
    ((L.GRU, 4), SEQUENCE, "bias", BIAS),
    ((L.BatchNorm,), IMAGE, "scale", ("ones", "narrow-normal", "zeros")),  # batchNormalization
    ((L.BatchNorm,), IMAGE, "offset", BIAS),
    ((L.LayerNorm,), SEQUENCE, "scale", ("ones", "narrow-normal", "zeros")),
    ((L.SelfAttention, 2, 4), SEQUENCE, "query_weights", GLOROT_HE_ORTH),  # selfAttentionLayer
    ((L.Embedding, 4, 10), df.Layout((None, None, 1), "BTC"), "weights", GLOROT_HE_ORTH),
]
IDS = [f"{make[0].__name__}.{option}" for make, _, option, _ in OPTIONS]


def _layer(make, option, initializer):
    cls, *args = make
    return cls(*args, **{f"{option}_initializer": initializer})


@pytest.mark.parametrize(("make", "layout", "option", "names"), OPTIONS, ids=IDS)
def test_every_name_matlab_lists_is_accepted_and_drawn(make, layout, option, names, key):
    shapes = set()
    for name in names:
        layer = _layer(make, option, name).initialize(layout, key=key)
        value = np.asarray(getattr(layer, option))
        assert np.all(np.isfinite(value))
        if name == "zeros":
            assert not value.any()
        if name == "ones":
            assert (value == 1).all()
        if name == "orthogonal" and value.ndim == 2:
            small = min(value.shape)
            gram = value.T @ value if value.shape[0] >= value.shape[1] else value @ value.T
            np.testing.assert_allclose(gram, np.eye(small), atol=1e-5)
        shapes.add(value.shape)
    assert len(shapes) == 1


@pytest.mark.parametrize(("make", "layout", "option", "names"), OPTIONS, ids=IDS)
def test_function_initializers_in_matlab_and_jax_form(make, layout, option, names, key):
    shape = getattr(_layer(make, option, "zeros").initialize(layout, key=key), option).shape
    want = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    seen = []

    def matlab(sz):  # MATLAB's @(sz) ...: the size alone
        seen.append(sz)
        return want

    layer = _layer(make, option, matlab).initialize(layout, key=key)
    np.testing.assert_array_equal(getattr(layer, option), want)
    assert seen[-1] == tuple(shape)
    jax_form = jax.nn.initializers.constant(0.25)  # JAX's (key, shape, dtype)
    layer = _layer(make, option, jax_form).initialize(layout, key=key)
    np.testing.assert_array_equal(getattr(layer, option), jnp.full(shape, 0.25))


def test_the_jax_form_draws_from_the_layers_key(key):
    draws = [
        L.FullyConnected(4, weights_initializer=jax.nn.initializers.lecun_normal())
        .initialize(FEATURES, key=k)
        .weights
        for k in (key, key, jax.random.fold_in(key, 1))
    ]
    np.testing.assert_array_equal(draws[0], draws[1])
    assert not np.array_equal(draws[0], draws[2])


def test_a_matlab_style_initializer_inside_a_network(key):
    net = df.Network([L.FeatureInput(6), L.FullyConnected(4, weights_initializer=np.ones)])
    assert float(net.initialize(key=key).layers[1].weights.sum()) == 24.0


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (
            lambda a, b: a,
            r"FullyConnected .*weights_initializer must be one of 'glorot', 'he', 'orthogonal', "
            r".*got the function <lambda>\(a, b\), which takes neither one nor three positional "
            r"arguments\. Fix: write it as lambda key, shape, dtype: \.\.\. .* or as lambda sz",
        ),
        ("xavier", r"weights_initializer must be one of .*fn\(sz\) .*got 'xavier'"),
    ],
)
def test_bad_initializers_are_named_errors_that_give_both_forms(value, match):
    with pytest.raises(df.LayerError, match=match):
        L.FullyConnected(4, weights_initializer=value)


def test_orthogonal_is_refused_where_matlab_does_not_list_it():
    with pytest.raises(df.LayerError, match=r"Conv2D .*weights_initializer must be one of"):
        L.Conv2D(3, 4, weights_initializer="orthogonal")


def test_an_initializer_that_raises_names_the_option_and_the_form(key):
    def broken(sz):
        raise ValueError("no such size")

    with pytest.raises(
        df.LayerError,
        match=r"the weights_initializer function raised ValueError: no such size when called "
        r"as fn\(\(6, 4\)\) \(MATLAB's form, read from its signature\)",
    ) as caught:
        L.FullyConnected(4, weights_initializer=broken).initialize(FEATURES, key=key)
    assert isinstance(caught.value.__cause__, ValueError)

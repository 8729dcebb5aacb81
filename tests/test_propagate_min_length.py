"""Tests of difffn/_network/_propagate.py on sequences of unknown length: a network initializes
at its input layers' ``min_length`` (or, from a bare layout, the shortest length its layers
accept), and a network that cannot run on ``min_length`` names the layer and the length."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import difffn as df

L = df.layers


def test_a_1d_convolution_builds_from_min_length_and_runs_on_any_longer_sequence(key):
    # MATLAB's "Sequence Classification Using 1-D Convolutions": filters longer than the
    # placeholder length difffn once stood in for an unknown one (3)
    net = df.Network([L.SequenceInput(3, min_length=5), L.Conv1D(5, 4)]).initialize(key=key)
    conv = net.layers[1]
    module = nnx.Conv(3, 4, (5,), padding="VALID", rngs=nnx.Rngs(0))
    module.kernel[...], module.bias[...] = conv.weights, conv.bias
    for length in (5, 6, 11):
        x = jnp.asarray(np.random.default_rng(length).standard_normal((2, length, 3)), "float32")
        y = net.predict(x)
        assert y.shape == (2, length - 4, 4)
        np.testing.assert_allclose(y.data, module(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("layers", "match"),
    [
        (
            [L.SequenceInput(3), L.Conv1D(5, 4)],
            r"layer 'conv1d_1' \(Conv1D\) cannot run on sequences of length 1, the min_length of "
            r"input layer 'sequenceinput_1' \(min_length=1\); every layer of the network runs "
            r"on sequences of at least 5 steps\. Fix: SequenceInput\(\.\.\., min_length=5\)",
        ),
        (  # the second convolution sees 5 - 4 = 1 step: the network needs 7
            [L.SequenceInput(3, min_length=5), L.Conv1D(5, 4), L.Conv1D(3, 2, name="c2")],
            r"layer 'c2' \(Conv1D\) cannot run on sequences of length 5.*at least 7 steps",
        ),
        (
            [L.SequenceInput(3, min_length=4), L.MaxPool1D(3, stride=3), L.MaxPool1D(2)],
            r"layer 'maxpool1d_2' \(MaxPool1D\).*length 4.*at least 6 steps",
        ),
    ],
)
def test_a_network_that_cannot_run_on_min_length_names_the_layer_and_the_length(layers, match):
    with pytest.raises(df.NetworkError, match=match):
        df.Network(layers)


def test_the_length_named_is_the_one_that_works(key):
    net = df.Network([L.SequenceInput(3, min_length=7), L.Conv1D(5, 4), L.Conv1D(3, 2)])
    assert net.initialize(key=key).predict(jnp.ones((1, 7, 3))).shape == (1, 1, 2)
    with pytest.raises(df.LayerError, match=r"length 6 but min_length is 7"):
        net.initialize(key=key).predict(jnp.ones((1, 6, 3)))


def test_a_bare_layout_initializes_at_the_shortest_length_every_layer_accepts(key):
    net = df.Network([L.Conv1D(5, 4), L.Conv1D(3, 2)])
    net = net.initialize(df.Layout((None, None, 3), "BTC"), key=key)
    assert net.predict(df.dlarray(jnp.ones((2, 7, 3)), "BTC")).shape == (2, 1, 2)


def test_an_error_that_no_length_fixes_is_the_layer_s_own(key):
    with pytest.raises(df.FormatError, match=r"Conv2D .*format 'BTC'"):
        df.Network([L.SequenceInput(3, min_length=2), L.Conv2D(3, 2)])

"""Tests of the logits guard (difffn/_scoring/_probabilities.py, difffn/_training/_logits_guard.py)
and of the logits loss ("crossentropy-logits", from_logits=True) against optax."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import difffn as df

L = df.layers


def _data(n=16):
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, 4)).astype(np.float32), np.arange(n) % 3


OPTIONS = dict(max_epochs=1, mini_batch_size=8, verbose=False)


def test_logits_trained_with_crossentropy_are_a_named_error_on_the_first_batch(key):
    X, T = _data()
    net = df.Network([L.FeatureInput(4), L.FullyConnected(3)]).initialize(key=key)
    with pytest.raises(
        df.OptionsError,
        match=r"trainnet: the loss 'crossentropy' expects probabilities .* on the first batch "
        r"has values in .*outside \[0, 1\]: it looks like logits\..*Fix: end the network with "
        r"df\.layers\.Softmax\(\), or train with loss='crossentropy-logits'",
    ):
        df.trainnet(X, T, net, "crossentropy", df.TrainingOptions(**OPTIONS))


def test_outputs_in_range_that_do_not_sum_to_one_are_caught_too(key):
    X, T = _data()
    net = df.Network([L.FeatureInput(4), L.FullyConnected(3), L.Sigmoid()]).initialize(key=key)
    with pytest.raises(df.OptionsError, match=r"sums over the class axis 'C' from .*logits"):
        df.trainnet(X, T, net, df.losses.crossentropy, df.TrainingOptions(**OPTIONS))


def test_probabilities_pass_and_the_logits_loss_trains_logits(key):
    X, T = _data()
    layers = [L.FeatureInput(4), L.FullyConnected(3)]
    with_softmax = df.Network([*layers, L.Softmax()]).initialize(key=key)
    _, info = df.trainnet(X, T, with_softmax, "crossentropy", df.TrainingOptions(**OPTIONS))
    logits = df.Network(layers).initialize(key=key)
    _, info_logits = df.trainnet(X, T, logits, "crossentropy-logits", df.TrainingOptions(**OPTIONS))
    # the same parameters, the same data: the softmax inside the loss gives the same losses
    np.testing.assert_allclose(
        info_logits.training_history["loss"], info.training_history["loss"], rtol=1e-5
    )


def test_a_softmax_inside_a_function_layer_is_seen_as_probabilities(key):
    X, T = _data()
    layers = [L.FeatureInput(4), L.FullyConnected(3), L.FunctionLayer(jax.nn.softmax)]
    net = df.Network(layers).initialize(key=key)
    df.trainnet(X, T, net, "crossentropy", df.TrainingOptions(**OPTIONS))


@pytest.mark.parametrize("fmt", ["BC", "CB"])
def test_the_logits_loss_matches_optax(fmt, key):
    logits = jax.random.normal(key, (5, 4))
    labels = jnp.array([0, 3, 1, 2, 3])
    want = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    Y = df.dlarray(logits if fmt == "BC" else logits.T, fmt)
    np.testing.assert_allclose(df.losses.crossentropy_logits(Y, labels), want, rtol=1e-6)
    np.testing.assert_allclose(
        df.losses.index_crossentropy(Y, labels, from_logits=True), want, rtol=1e-6
    )
    onehot = jax.nn.one_hot(labels, 4)
    T = onehot if fmt == "BC" else onehot.T
    np.testing.assert_allclose(
        df.losses.crossentropy(Y, T, from_logits=True),
        optax.softmax_cross_entropy(logits, onehot).mean(),
        rtol=1e-6,
    )
    g = jax.grad(lambda z: df.losses.crossentropy_logits(df.dlarray(z, "BC"), labels))(logits)
    g_optax = jax.grad(lambda z: optax.softmax_cross_entropy_with_integer_labels(z, labels).mean())(
        logits
    )
    np.testing.assert_allclose(g, g_optax, rtol=1e-5, atol=1e-7)


def test_from_logits_needs_a_class_axis():
    with pytest.raises(df.OptionsError, match=r"from_logits=True needs predictions with a channel"):
        df.losses.crossentropy(jnp.ones(3), jnp.ones(3), from_logits=True)

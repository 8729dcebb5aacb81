"""Tests of difffn/layers/_identity.py: Identity."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import difffn as df


def test_identity_returns_its_input_in_a_network(key):
    x = df.dlarray(jnp.arange(6.0).reshape(2, 3), "BC")
    assert df.layers.Identity()(x).format == "BC"
    np.testing.assert_array_equal(df.layers.Identity()(x.data), x.data)
    net = df.Network(
        [df.layers.FeatureInput(3), df.layers.Identity(name="skip"), df.layers.ReLU()]
    ).initialize(key=key)
    np.testing.assert_array_equal(net.predict(x).data, jax.nn.relu(x.data))
    grad = jax.grad(lambda x: jnp.sum(df.layers.Identity()(x) ** 2))(x.data)
    np.testing.assert_array_equal(grad, 2 * x.data)


def test_identity_check_layer():
    report = df.check_layer(df.layers.Identity(), df.Layout((4, 3, 2), "BTC"))
    assert report.failed == 0 and report.incomplete == 0, str(report)

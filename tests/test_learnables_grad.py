"""Issue 23: ``df.learnables_grad``, the gradient of a layer's or network's learnables only.

References: ``jax.grad`` itself (with respect to the learnable arrays, the rest closed over),
and its refusal of a layer whose state holds an integer counter.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import difffn as df


class Counted(df.Layer):
    w: jax.Array | None = df.learnable(default=None)
    steps: jax.Array | None = df.state(default=None)

    def predict(self, x):
        return jnp.sin(x * self.w), self.steps + 1


def test_a_layer_with_an_integer_counter():
    layer = Counted(w=jnp.array([0.5, -1.0, 2.0]), steps=jnp.array(0, jnp.int32))
    x = jnp.array([0.3, 0.7, -1.1])

    def loss(layer, x):
        return jnp.sum(layer(x)[0] ** 2)

    with pytest.raises(TypeError, match="grad requires real- or complex-valued inputs"):
        jax.grad(loss)(layer, x)  # JAX itself: the integer state
    g = df.learnables_grad(loss)(layer, x)
    assert isinstance(g, Counted) and g.steps is None
    want = jax.grad(lambda w: jnp.sum(jnp.sin(x * w) ** 2))(layer.w)
    np.testing.assert_allclose(g.w, want, rtol=1e-6)
    (gl, gx), aux = df.learnables_grad(lambda l, x: (loss(l, x), 7), (0, 1), has_aux=True)(layer, x)
    np.testing.assert_allclose(gl.w, want, rtol=1e-6)
    np.testing.assert_allclose(
        gx, jax.grad(lambda x: jnp.sum(jnp.sin(x * layer.w) ** 2))(x), rtol=1e-6
    )
    assert aux == 7


def test_a_network_differentiates_only_its_learnables(key):
    net = df.Network(
        [
            df.layers.FeatureInput(3, normalization="none", name="in"),
            df.layers.FullyConnected(2, name="fc"),
        ]
    ).initialize(key=key)
    x = jnp.ones((4, 3))

    def loss(net):
        return jnp.sum(net.predict(df.dlarray(x, "BC")).data ** 2)

    g = df.learnables_grad(loss)(net)
    want = jax.grad(loss)(net)  # every leaf of this network is a learnable
    for a, e in zip(g.learnables.value, want.learnables.value, strict=True):
        np.testing.assert_allclose(a, e, rtol=1e-6)
    assert len(jax.tree.leaves(g)) == 2


def test_argnums_mistakes_are_named():
    layer = Counted(w=jnp.ones(2), steps=jnp.array(0, jnp.int32))
    with pytest.raises(df.LayerError, match=r"argnums='w'; expected an int"):
        df.learnables_grad(lambda layer: 0.0, "w")
    with pytest.raises(df.LayerError, match=r"there is no argument 1\. Fix: pass the layer"):
        df.learnables_grad(lambda layer, x: jnp.sum(layer(x)[0]), 1)(layer)

"""difffn networks inside equinox and flax.nnx models, trained with their own gradient functions.

The reference for every gradient is ``jax.grad`` of the same computation written in plain
``jax.numpy`` with the network's weights (float64).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from helpers import assert_tree_allclose

import difffn as df

L = df.layers


def mlp(key, *, norm=False, dropout=0.0):
    layers = [L.FeatureInput(3, normalization="none", name="in"), L.FullyConnected(4, name="fc1")]
    if norm:
        layers.append(L.BatchNorm(name="bn"))
    layers.append(L.FunctionLayer(jnp.tanh, name="tanh"))
    if dropout:
        layers.append(L.Dropout(dropout, name="drop"))
    layers.append(L.FullyConnected(2, name="fc2"))
    return df.Network(layers).initialize(key=key)


def reference(learnables, x):
    """The network without BatchNorm, in plain jax.numpy."""
    h = jnp.tanh(x @ learnables["fc1/weights"] + learnables["fc1/bias"][None, :])
    return h @ learnables["fc2/weights"] + learnables["fc2/bias"][None, :]


def as_dict(table):
    return {k: table[k] for k in table}


# -- equinox ---------------------------------------------------------------------------------


class Model(eqx.Module):
    """An equinox model with a difffn network as one of its fields."""

    net: df.Network
    scale: jax.Array

    def __call__(self, x):
        return self.scale * df.stripdims(self.net.predict(x))


def test_eqx_filter_grad_through_a_network_field_matches_plain_jax(x64, key):
    net = mlp(key)
    model = Model(net, jnp.asarray(1.5))
    x = jax.random.normal(jax.random.key(1), (5, 3))
    assert net.learnables["fc1/weights"].dtype == jnp.float32  # initialized before x64 matters

    def loss(m):
        return jnp.sum(m(x) ** 2)

    grads = eqx.filter_jit(eqx.filter_grad(loss))(model)
    assert isinstance(grads.net, df.Network)
    expected = jax.grad(lambda p, s: jnp.sum((s * reference(p, x)) ** 2), argnums=(0, 1))(
        as_dict(net.learnables), model.scale
    )
    assert_tree_allclose(as_dict(grads.net.learnables), expected[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grads.scale, expected[1], rtol=1e-5)
    # Without state or float constants, eqx.is_inexact_array selects exactly the learnables.
    selected = jax.tree.leaves(eqx.filter(model.net, eqx.is_inexact_array))
    assert len(selected) == len(jax.tree.leaves(net.learnables))


def test_learnable_mask_keeps_state_out_of_an_equinox_training_step(key):
    net = mlp(key, norm=True)
    model = Model(net, jnp.asarray(1.0))
    mask = df.interop.learnable_mask(model)
    assert mask.scale is True
    assert mask.net.state["bn/trained_mean"] is False
    # eqx.is_inexact_array also selects the BatchNorm statistics: the mask is what to train.
    assert (
        len(jax.tree.leaves(eqx.filter(model, eqx.is_inexact_array)))
        == len(jax.tree.leaves(net.learnables)) + len(jax.tree.leaves(net.state)) + 1
    )
    x = jax.random.normal(jax.random.key(1), (8, 3))
    params, static = eqx.partition(model, mask)
    tx = optax.adamw(0.1, weight_decay=0.5)
    state = tx.init(params)

    @eqx.filter_jit
    def step(params, state):
        grads = jax.grad(lambda p: jnp.sum(eqx.combine(p, static)(x) ** 2))(params)
        updates, state = tx.update(grads, state, params)
        return eqx.apply_updates(params, updates), state

    params, state = step(params, state)
    trained = eqx.combine(params, static)
    assert_tree_allclose(trained.net.state, net.state, rtol=0, atol=0)  # untouched by adamw
    assert not np.allclose(trained.net.learnables["fc1/weights"], net.learnables["fc1/weights"])


# -- flax.nnx ----------------------------------------------------------------------------------


class Head(nnx.Module):
    """An nnx model: a difffn network followed by an nnx.Linear."""

    def __init__(self, net, *, rngs=None):
        self.body = df.interop.to_nnx(net, rngs=rngs)
        self.linear = nnx.Linear(2, 1, rngs=nnx.Rngs(3))

    def __call__(self, x):
        return self.linear(self.body(x))


def network_grads(grads) -> dict[str, jax.Array]:
    """The gradients of the network's learnables, by "layer/parameter", from an nnx State."""
    flat = nnx.to_flat_state(grads["body"]["network"])
    return {"/".join(map(str, path)): v.get_value() for path, v in flat}


def test_nnx_grad_of_a_model_with_a_network_matches_plain_jax(x64, key):
    net = mlp(key)
    model = Head(net)
    x = jax.random.normal(jax.random.key(1), (5, 3))
    grads = nnx.grad(lambda m: jnp.sum(m(x) ** 2))(model)
    kernel, bias = model.linear.kernel.get_value(), model.linear.bias.get_value()
    expected = jax.grad(lambda p: jnp.sum((reference(p, x) @ kernel + bias[None, :]) ** 2))(
        as_dict(net.learnables)
    )
    assert_tree_allclose(network_grads(grads), expected, rtol=1e-5, atol=1e-6)


def test_nnx_optimizer_updates_the_network_learnables(key):
    net = mlp(key)
    model = Head(net)
    x = jax.random.normal(jax.random.key(1), (5, 3))
    optimizer = nnx.Optimizer(model, optax.sgd(0.01), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer):
        loss, grads = nnx.value_and_grad(lambda m: jnp.sum(m(x) ** 2))(model)
        optimizer.update(model, grads)
        return loss, grads

    loss, grads = step(model, optimizer)
    trained = model.body.values()
    assert isinstance(trained, df.Network)
    grad_table = network_grads(grads)
    assert sorted(grad_table) == sorted(net.learnables)
    for name in net.learnables:
        np.testing.assert_allclose(
            trained.learnables[name],
            net.learnables[name] - 0.01 * grad_table[name],
            rtol=1e-6,
            atol=1e-7,
        )
    assert float(step(model, optimizer)[0]) < float(loss)


def test_batch_statistics_follow_nnx_train_and_eval_modes(key):
    net = mlp(key, norm=True)
    model = df.interop.to_nnx(net)
    x = jax.random.normal(jax.random.key(1), (8, 3))
    _, expected_state = net.forward(x)
    y = model(x)  # training mode: net.forward, the state variables are updated
    assert isinstance(y, jax.Array)
    stats = nnx.state(model, nnx.BatchStat)
    assert_tree_allclose(model.values().state, expected_state, rtol=1e-6, atol=1e-7)
    assert len(jax.tree.leaves(stats)) == 2
    model.eval()
    assert model.deterministic
    after = model.values()
    np.testing.assert_allclose(model(x), df.stripdims(after.predict(x)), rtol=1e-6)
    assert_tree_allclose(model.values().state, after.state, rtol=0, atol=0)  # unchanged
    view = nnx.view(model, deterministic=False)
    assert not view.deterministic and model.deterministic


def test_dropout_draws_from_the_modules_rngs(key):
    net = mlp(key, dropout=0.5)
    x = jnp.ones((16, 3))
    a = df.interop.to_nnx(net, rngs=nnx.Rngs(dropout=1))(x)
    b = df.interop.to_nnx(net, rngs=nnx.Rngs(dropout=1))(x)
    np.testing.assert_array_equal(a, b)
    model = df.interop.to_nnx(net, rngs=nnx.Rngs(dropout=1))
    first, second = model(x), model(x)  # the stream advances
    assert not np.allclose(first, second)
    with pytest.raises(
        df.LayerError, match=r"Dropout \(layer 'drop'\): training-time dropout needs randomness"
    ):
        df.interop.to_nnx(net)(x)
    np.testing.assert_allclose(df.interop.to_nnx(net, deterministic=True)(x),
                               df.stripdims(net.predict(x)), rtol=1e-6)  # fmt: skip


def test_to_nnx_errors_are_named(key):
    with pytest.raises(df.NetworkError, match=r"to_nnx expected a df.Network; got Linear"):
        df.interop.to_nnx(nnx.Linear(2, 2, rngs=nnx.Rngs(0)))
    unready = df.Network([L.FeatureInput(3, name="in", normalization="none"), L.FullyConnected(2)])
    with pytest.raises(df.NetworkError, match=r"to_nnx: the network is not initialized"):
        df.interop.to_nnx(unready)
    with pytest.raises(
        df.NetworkError, match=r"rngs must be an nnx.Rngs, an nnx.RngStream or None; got int"
    ):
        df.interop.to_nnx(mlp(key), rngs=0)

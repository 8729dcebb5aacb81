"""orbax checkpoints of networks and layers (issue 14, item 4): they are ordinary pytrees.

orbax stores the array leaves; the structure (graph, layer configuration, factors, recorded
layouts) comes from the restore target, so a restore into a target of the same structure must
give back an equal network, including the state of LSTM and BatchNorm layers and of a network
nested in a layer.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from helpers import assert_tree_allclose

import difffn as df

L = df.layers


class Block(df.Layer):
    """A custom layer holding a network with state (MATLAB's properties (Learnable, State))."""

    net: df.Network | None = df.learnable(default=None)

    def predict(self, x):
        return self.net.predict(x), self.net.state

    def forward(self, x):
        return self.net.forward(x)


def build(key=None) -> df.Network:
    """A sequence network: LSTM, a nested network with BatchNorm, factors set."""
    inner = df.Network([L.FullyConnected(6, name="fc"), L.BatchNorm(name="bn")])
    inner = inner.initialize(df.Layout((None, 5), "BC"), key=jax.random.key(7))
    net = df.Network(
        [
            L.SequenceInput(3, name="in"),
            L.LSTM(5, output_mode="last", name="lstm"),
            Block(net=inner, name="block"),
            L.FullyConnected(4, name="fc"),
            L.BatchNorm(name="bn"),
            L.Softmax(name="softmax"),
        ]
    )
    net = df.set_learn_rate_factor(net, "fc/weights", 2.0)
    net = df.set_l2_factor(net, "block/net/fc/bias", 0.5)
    return net.initialize(key=key if key is not None else jax.random.key(0))


@pytest.fixture
def trained():
    """A network whose state moved away from its initial values (positive, as variances)."""
    net = build()
    keys = jax.random.split(jax.random.key(1), len(net.state) + 1)
    state = {
        name: jax.random.uniform(k, value.shape, minval=0.5, maxval=1.5)
        for k, (name, value) in zip(keys[1:], net.state.items())
    }
    return net.replace(state=state), jax.random.normal(keys[0], (2, 7, 3))


def assert_same_network(restored, net, x):
    assert isinstance(restored, df.Network)
    assert_tree_allclose(restored, net, rtol=0, atol=0)  # also compares the static structure
    assert restored.recorded_layouts == net.recorded_layouts
    assert df.get_learn_rate_factor(restored, "fc/weights") == 2.0
    assert df.get_l2_factor(restored, "block/net/fc/bias") == 0.5
    for name in net.state.keys():
        np.testing.assert_array_equal(restored.state[name], net.state[name])
    np.testing.assert_array_equal(restored.predict(x).data, net.predict(x).data)


def test_network_state_changed_before_saving(trained):
    net, _ = trained
    assert not np.allclose(net.state["bn/trained_mean"], 0)
    assert not np.allclose(net.state["lstm/hidden_state"], 0)
    assert not np.allclose(net.state["block/net/bn/trained_mean"], 0)


def test_standard_checkpointer_restores_into_the_network_itself(tmp_path, trained):
    net, x = trained
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp_path / "ckpt", net)
    checkpointer.wait_until_finished()
    assert_same_network(checkpointer.restore(tmp_path / "ckpt", net), net, x)


def test_standard_checkpointer_restores_into_a_fresh_network(tmp_path, trained):
    net, x = trained
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(tmp_path / "ckpt", net)
    fresh = build(key=jax.random.key(42))  # other values, same structure
    assert not np.allclose(fresh.learnables["fc/weights"], net.learnables["fc/weights"])
    with ocp.StandardCheckpointer() as checkpointer:
        restored = checkpointer.restore(tmp_path / "ckpt", fresh)
    assert_same_network(restored, net, x)


def test_standard_checkpointer_restores_into_an_abstract_network(tmp_path, trained):
    net, x = trained
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(tmp_path / "ckpt", net)
    abstract = jax.eval_shape(build)
    assert all(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(abstract))
    with ocp.StandardCheckpointer() as checkpointer:
        restored = checkpointer.restore(tmp_path / "ckpt", abstract)
    assert all(isinstance(leaf, jax.Array) for leaf in jax.tree.leaves(restored))
    assert_same_network(restored, net, x)


def test_checkpoint_manager_with_standard_args(tmp_path, trained):
    net, x = trained
    with ocp.CheckpointManager(tmp_path / "run") as manager:
        manager.save(3, args=ocp.args.StandardSave(net))
        manager.wait_until_finished()
        assert manager.latest_step() == 3
        restored = manager.restore(3, args=ocp.args.StandardRestore(jax.eval_shape(build)))
    assert_same_network(restored, net, x)


def test_pytree_checkpointer(tmp_path, trained):
    net, x = trained
    checkpointer = ocp.PyTreeCheckpointer()
    checkpointer.save(tmp_path / "ckpt", net)
    target = build(key=jax.random.key(3))
    restored = checkpointer.restore(
        tmp_path / "ckpt",
        args=ocp.args.PyTreeRestore(
            item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target)
        ),
    )
    assert_same_network(restored, net, x)


def test_restore_without_a_target_gives_nested_dicts_by_layer_and_parameter(tmp_path, trained):
    net, _ = trained
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(tmp_path / "ckpt", net)
        raw = checkpointer.restore(tmp_path / "ckpt")
    np.testing.assert_array_equal(raw["fc"]["weights"], net.learnables["fc/weights"])
    np.testing.assert_array_equal(
        raw["block"]["net"]["bn"]["trained_mean"], net.state["block/net/bn/trained_mean"]
    )


def test_a_single_layer_saves_and_restores(tmp_path, key):
    layer = L.BatchNorm(name="bn").initialize(df.Layout((None, 4, 4, 3), "BSSC"), key=key)
    layer = layer.replace(trained_mean=jnp.arange(3.0), trained_variance=jnp.full(3, 2.0))
    layer = df.set_learn_rate_factor(layer, "scale", 0.1)
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(tmp_path / "layer", layer)
        target = L.BatchNorm(name="bn").initialize(df.Layout((None, 4, 4, 3), "BSSC"), key=key)
        target = df.set_learn_rate_factor(target, "scale", 0.1)
        restored = checkpointer.restore(tmp_path / "layer", jax.eval_shape(lambda: target))
    assert isinstance(restored, L.BatchNorm)
    assert_tree_allclose(restored, layer, rtol=0, atol=0)
    assert df.get_learn_rate_factor(restored, "scale") == 0.1


def test_restored_network_trains_under_jit(tmp_path, trained):
    """The restored leaves are ordinary arrays: jit and grad see the same network as before."""
    net, x = trained
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(tmp_path / "ckpt", net)
        restored = checkpointer.restore(tmp_path / "ckpt", jax.eval_shape(build))

    @jax.jit
    def loss(n):
        return jnp.sum(df.stripdims(n.forward(x)[0]) ** 2)

    assert_tree_allclose(jax.grad(loss)(restored), jax.grad(loss)(net), rtol=1e-6, atol=1e-7)

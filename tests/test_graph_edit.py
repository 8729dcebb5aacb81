"""Graph editing: add_layers, connect_layers, disconnect_layers, remove_layers, replace_layer.

The networks are MATLAB's own documentation examples for addLayers, connectLayers,
disconnectLayers and replaceLayer (made small); each edited network is checked against the network
built directly with the final connections, and against a plain JAX reference where one is short.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_tree_allclose

import difffn as df

L = df.layers


def leaky(name=""):
    return L.FunctionLayer(lambda x: jax.nn.leaky_relu(x, 0.1), name=name)


def images(key, n=3):
    return jax.random.normal(jax.random.fold_in(key, 99), (n, 8, 8, 1))


def rebuilt(net, **kwargs):
    """The same layers as ``net`` in a network built directly with ``net``'s connections."""
    return df.Network([[layer] for layer in net.layers], connections=net.connections, **kwargs)


def assert_same_predictions(a, b, *inputs):
    ya, yb = a.predict(*inputs), b.predict(*inputs)
    ya, yb = (ya, yb) if isinstance(ya, tuple) else ((ya,), (yb,))
    assert len(ya) == len(yb)
    for u, v in zip(ya, yb, strict=True):
        assert u.format == v.format
        np.testing.assert_allclose(u.data, v.data, rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------------------------
# MATLAB's examples


def test_connect_layers_addition_example(key):
    # connectLayers: an addition layer fed by two ReLU layers, added one at a time.
    net = df.Network(L.Addition(2, name="add"))
    net = net.add_layers(L.ReLU(name="relu1")).connect_layers("relu1", "add/in1")
    net = net.add_layers(L.ReLU(name="relu2")).connect_layers("relu2", "add/in2")
    assert net.input_names == ("relu1/in", "relu2/in") and net.output_names == ("add",)
    layout = df.Layout((None, 5), "BC")
    net = net.initialize(layout, layout, key=key)
    a, b = jax.random.normal(key, (2, 4, 5))
    y = net.predict(df.dlarray(a, "BC"), df.dlarray(b, "BC"))
    np.testing.assert_allclose(y.data, jax.nn.relu(a) + jax.nn.relu(b), rtol=1e-6)


def two_output_branches():
    main = [
        L.ImageInput((8, 8, 1), normalization="none", name="input"),
        L.Conv2D(5, 4, padding="same"),
        L.BatchNorm(),
        L.ReLU(name="relu_1"),
        L.Conv2D(3, 6, padding="same", stride=2),
        L.BatchNorm(),
        L.ReLU(),
        L.Conv2D(3, 6, padding="same"),
        L.BatchNorm(),
        L.ReLU(),
        L.Addition(2, name="add"),
        L.FullyConnected(10),
        L.Softmax(name="softmax"),
    ]
    skip = [
        L.Conv2D(1, 6, stride=2, name="conv_skip"),
        L.BatchNorm(),
        L.ReLU(name="relu_skip"),
    ]
    return main, skip


def test_two_output_network_built_from_scratch(key):
    # connectLayers/addLayers "Create Neural Network from Scratch": a main branch, a skip
    # connection added as a second chain, and a regression output added last.
    main, skip = two_output_branches()
    net = df.Network(main)
    assert net.graph.dangling  # add/in2: an incomplete network, as MATLAB allows while editing
    net = net.add_layers(skip)
    net = net.connect_layers("relu_1", "conv_skip").connect_layers("relu_skip", "add/in2")
    net = net.add_layers(L.FullyConnected(1, name="fc_2")).connect_layers("add", "fc_2")
    assert net.output_names == ("softmax", "fc_2")
    net = net.initialize(key=key)

    main, skip = two_output_branches()
    direct = df.Network(
        [main, skip, [L.FullyConnected(1, name="fc_2")]],
        connections=[("relu_1", "conv_skip"), ("relu_skip", "add/in2"), ("add", "fc_2")],
    )
    assert [layer.name for layer in direct.layers] == [layer.name for layer in net.layers]
    assert set(direct.connections) == set(net.connections)
    direct = direct.initialize(key=key)  # the same layer order, so the same initial values
    assert_tree_allclose(direct.learnables, net.learnables)
    assert_same_predictions(net, direct, images(key))


def test_replace_layer_by_a_chain_example(key):
    # replaceLayer: relu1 in a network with a residual connection becomes batch norm + leaky
    # ReLU; the old layer's input feeds the first new layer, the last feeds what relu1 fed.
    net = df.Network(
        [
            L.ImageInput((8, 8, 1), normalization="none", name="input"),
            L.Conv2D(3, 4, padding="same"),
            L.ReLU(name="relu1"),
            L.Addition(2, name="add"),
            L.FullyConnected(10),
            L.Softmax(),
        ]
    ).connect_layers("input", "add/in2")
    net = net.initialize(key=key)
    conv = net.layer("conv2d_1")
    edited = net.replace_layer("relu1", [L.BatchNorm(), leaky(name="leaky")])
    assert [layer.name for layer in edited.layers][1:5] == [
        "conv2d_1",
        "batchnorm_1",
        "leaky",
        "add",
    ]
    assert ("conv2d_1/out", "batchnorm_1/in") in edited.connections
    assert ("batchnorm_1/out", "leaky/in") in edited.connections
    assert ("leaky/out", "add/in1") in edited.connections
    assert not edited.initialized  # the new batch norm is empty until initialize
    edited = edited.initialize(key=jax.random.key(5))
    # Untouched layers keep their parameters (initialize fills only the empty ones).
    np.testing.assert_array_equal(edited.layer("conv2d_1").weights, conv.weights)

    x = images(key)
    assert_same_predictions(edited, rebuilt(edited), x)
    # An independent reference for the edited part: BatchNorm at prediction time with its
    # initial statistics (mean 0, variance 1) and jax.nn.leaky_relu.
    bn = edited.layer("batchnorm_1")
    h = conv(df.dlarray(x, "BSSC")).data
    mean, var, scale, offset = (
        v.reshape(1, 1, 1, -1) for v in (bn.trained_mean, bn.trained_variance, bn.scale, bn.offset)
    )
    h = (h - mean) / jnp.sqrt(var + bn.epsilon) * scale + offset
    h = jax.nn.leaky_relu(h, 0.1) + x
    fc = edited.layer("fullyconnected_1")
    expected = jax.nn.softmax(h.reshape(3, -1) @ fc.weights + fc.bias[None])
    np.testing.assert_allclose(edited.predict(x).data, expected, rtol=1e-5, atol=1e-6)


def test_disconnect_layers_example(key):
    # disconnectLayers: conv -> batch norm is cut; the batch norm's input is left dangling.
    net = df.Network(
        [
            L.ImageInput((8, 8, 1), normalization="none"),
            L.Conv2D(3, 4, padding="same"),
            L.BatchNorm(),
            L.ReLU(),
        ]
    ).initialize(key=key)
    cut = net.disconnect_layers("conv2d_1", "batchnorm_1")
    assert ("conv2d_1/out", "batchnorm_1/in") not in cut.connections
    assert cut.output_names == ("conv2d_1", "relu_1")  # conv's output now feeds nothing
    message = r"unconnected \(dangling\) inputs \['batchnorm_1/in'\].*Fix: net\.connect_layers"
    with pytest.raises(df.NetworkError, match=message):
        cut.predict(images(key))
    with pytest.raises(df.NetworkError, match=message):
        cut.initialize(key=key)
    again = cut.connect_layers("conv2d_1", "batchnorm_1")
    assert again.initialized and again.recorded_layouts is not None
    assert_same_predictions(again, net, images(key))


# --------------------------------------------------------------------------------------------
# small networks of the test's own


def residual_net():
    return df.Network(
        [
            L.FeatureInput(4, normalization="none", name="in"),
            L.FullyConnected(4, name="fc"),
            L.ReLU(name="relu"),
            L.Addition(2, name="add"),
        ]
    )


def test_residual_connection_added_with_connect_layers(key):
    net = residual_net().connect_layers("in", "add/in2").initialize(key=key)
    x = jax.random.normal(key, (5, 4))
    fc = net.layer("fc")
    np.testing.assert_allclose(
        net.predict(x).data, jax.nn.relu(x @ fc.weights + fc.bias[None]) + x, rtol=1e-6
    )
    direct = df.Network(list(net.layers), connections=[("in", "add/in2")])
    assert direct.connections == net.connections
    assert_same_predictions(net, direct, x)


def test_gradients_through_an_edited_network_match_the_direct_one(key, x64):
    net = residual_net().connect_layers("in", "add/in2").initialize(key=key)
    net = net.replace_layer("relu", L.ELU(name="elu"))
    direct = df.Network(list(net.layers), connections=[("in", "add/in2")])
    x = jax.random.normal(key, (3, 4), dtype=jnp.float64)

    @jax.jit
    def loss(n):
        return jnp.sum(n.predict(x).data ** 2)

    got, expected = jax.grad(loss)(net).learnables, jax.grad(loss)(direct).learnables
    assert_tree_allclose(dict(got.items()), dict(expected.items()), rtol=1e-12, atol=1e-12)


def test_remove_layers_and_reconnect(key):
    net = df.Network(
        [
            L.FeatureInput(3, normalization="none", name="in"),
            L.FullyConnected(4, name="fc1"),
            L.ReLU(name="act"),
            L.FullyConnected(2, name="fc2"),
        ]
    ).initialize(key=key)
    removed = net.remove_layers("act")
    assert [layer.name for layer in removed.layers] == ["in", "fc1", "fc2"]
    assert removed.connections == (("in/out", "fc1/in"),)  # nothing is reconnected
    with pytest.raises(df.NetworkError, match=r"dangling\) inputs \['fc2/in'\]"):
        removed.predict(jnp.ones((2, 3)))
    joined = removed.connect_layers("fc1", "fc2")
    assert joined.layer("fc1") is net.layer("fc1") and joined.layer("fc2") is net.layer("fc2")
    x = jax.random.normal(key, (5, 3))
    fc1, fc2 = net.layer("fc1"), net.layer("fc2")
    expected = (x @ fc1.weights + fc1.bias[None]) @ fc2.weights + fc2.bias[None]
    np.testing.assert_allclose(joined.predict(x).data, expected, rtol=1e-5)
    both = net.remove_layers(["act", "fc2"])
    assert both.output_names == ("fc1",)


def test_a_network_without_input_layers_gains_inputs_where_layers_are_removed(key):
    net = df.Network([L.FullyConnected(3, name="a"), L.ReLU(name="r"), L.FullyConnected(2)])
    net = net.initialize(df.Layout((None, 5), "BC"), key=key)
    cut = net.remove_layers("r")
    assert cut.input_names == ("a/in", "fullyconnected_1/in")
    assert cut.output_names == ("a", "fullyconnected_1")
    # The new input's layout is unknown: the layouts are dropped, parameters kept.
    assert cut.recorded_layouts is None and cut.initialized


def test_replace_layer_keeps_parameters_state_and_factors(key):
    net = df.Network(
        [
            L.FeatureInput(3, normalization="none", name="in"),
            L.FullyConnected(4, name="fc1"),
            L.BatchNorm(name="bn"),
            L.ReLU(name="act"),
            L.FullyConnected(2, name="fc2"),
        ]
    ).initialize(key=key)
    net = df.set_learn_rate_factor(net, "fc1/weights", 0.5)
    x = jax.random.normal(key, (6, 3))
    _, state = net.forward(x)
    net = net.replace(state=state)
    edited = net.replace_layer("act", [L.ELU(name="elu"), leaky(name="leaky")])
    assert edited.initialized  # every layer is initialized and the sizes fit: no initialize
    assert edited.recorded_layouts is not None
    assert df.get_learn_rate_factor(edited, "fc1/weights") == 0.5
    assert_tree_allclose(edited.state, net.state)
    assert_tree_allclose(dict(edited.learnables.items()), dict(net.learnables.items()))
    fc1, bn, fc2 = (net.layer(n) for n in ("fc1", "bn", "fc2"))
    h = bn(fc1(df.dlarray(x, "BC")))[0].data  # BatchNorm returns its output and its state
    expected = jax.nn.leaky_relu(jax.nn.elu(h), 0.1) @ fc2.weights + fc2.bias[None]
    np.testing.assert_allclose(edited.predict(x).data, expected, rtol=1e-5, atol=1e-6)


def test_an_initialized_network_stays_initialized_with_propagated_layouts(key):
    net = residual_net().connect_layers("in", "add/in2").initialize(key=key)
    edited = net.replace_layer("relu", L.ELU(name="elu"))
    assert edited.initialized
    before, after = net.recorded_layouts, edited.recorded_layouts
    assert after == before  # the same sizes everywhere
    assert "elu" in edited.summary() and "?,4:BC" in edited.summary()


def test_edits_that_break_the_sizes_are_named_at_predict_and_initialize(key):
    net = residual_net().connect_layers("in", "add/in2").initialize(key=key)
    wider = L.FullyConnected(6, name="fc").initialize(df.Layout((None, 4), "BC"), key=key)
    edited = net.replace_layer("fc", wider)
    assert edited.initialized and edited.recorded_layouts is None
    message = r"'add' \(Addition\)"
    with pytest.raises(df.Error, match=message):
        edited.predict(jnp.ones((2, 4)))
    with pytest.raises(df.Error, match=message):
        edited.initialize(key=key)


def test_a_raw_jax_size_error_in_an_edited_network_names_the_layer(key):
    class Dense(df.Layer):  # no size checks of its own: JAX's dot_general meets the mismatch
        formattable = True
        w: jax.Array | None = df.learnable(default=None)

        def predict(self, x):
            return df.dlarray(df.stripdims(x) @ self.w, "BC")

    net = df.Network(
        [
            L.FeatureInput(3, normalization="none", name="in"),
            Dense(w=jnp.ones((3, 4)), name="d1"),
            Dense(w=jnp.ones((4, 2)), name="d2"),
        ]
    )
    edited = net.replace_layer("d1", Dense(w=jnp.ones((3, 5)), name="d1"))
    assert edited.initialized
    x = jnp.ones((2, 3))
    message = r"layer 'd2' \(Dense\) failed on inputs \[.*5.*\] \(a size mismatch\?\)"
    with pytest.raises(df.NetworkError, match=message):
        edited.predict(x)
    with pytest.raises(df.NetworkError, match=message):
        jax.jit(lambda n: n.predict(x))(edited)


def test_outputs_named_by_the_user_follow_the_edits(key):
    net = df.Network(
        [
            L.FeatureInput(3, normalization="none", name="in"),
            L.FullyConnected(4, name="fc1"),
            L.ReLU(name="act"),
            L.FullyConnected(2, name="fc2"),
        ],
        outputs=["act", "fc2"],
    )
    assert net.replace_layer("act", [L.ELU(name="e1"), L.ELU(name="e2")]).output_names == (
        "e2",
        "fc2",
    )
    assert net.add_layers(L.ReLU(name="extra")).output_names == ("act", "fc2")
    assert net.remove_layers("fc2").output_names == ("act",)
    assert net.remove_layers(["act", "fc2"]).output_names == ("fc1",)  # back to the default


def test_reconnect_by_order(key):
    class Pair(df.Layer):
        def predict(self, x, y):
            return x - y

    class Other(df.Layer):
        input_names = ("a", "b")

        def predict(self, a, b):
            return a - 2 * b

    net = df.Network(
        [[L.FeatureInput(2, name="x")], [L.FeatureInput(2, name="y")], [Pair(name="p")]],
        connections=[("x", "p/in1"), ("y", "p/in2")],
    )
    with pytest.raises(
        df.NetworkError,
        match=r"input 'p/in1' is connected, but the first new layer 'o' has no input 'in1' "
        r"\(its inputs are \['a', 'b'\]\)\. Fix: reconnect_by='order'",
    ):
        net.replace_layer("p", Other(name="o"))
    edited = net.replace_layer("p", Other(name="o"), reconnect_by="order")
    assert set(edited.connections) == {("x/out", "o/a"), ("y/out", "o/b")}
    x, y = jnp.ones((1, 2)), jnp.full((1, 2), 3.0)
    np.testing.assert_allclose(edited.predict(x, y).data, x - 2 * y)


# --------------------------------------------------------------------------------------------
# the compiled-trace cache


def test_the_cache_is_new_exactly_when_the_structure_changes(key):
    # Caches are shared by every live network of one structure (interned), and other tests may
    # still hold one: count what this test adds, with a batch size no other test uses.
    net = residual_net().connect_layers("in", "add/in2").initialize(key=key)
    x = jnp.ones((13, 4))
    before = net.cache_info()
    net.predict(x)
    assert net.cache_info().misses == before.misses + 1

    # A layer replaced by one of the same structure (new values): the same cache.
    fc = net.layer("fc")
    same = net.replace_layer("fc", fc.replace(weights=2 * fc.weights))
    assert same.compile_cache is net.compile_cache
    same.predict(x)
    assert same.cache_info().misses == before.misses + 1
    assert same.cache_info().hits >= before.hits + 1

    # A new edge, layer or removed layer: another cache; the old network's stays as it was.
    for edited in (
        net.disconnect_layers("in", "add/in2").connect_layers("fc", "add/in2"),
        net.replace_layer("relu", L.ELU(name="relu")),
        net.add_layers(L.ReLU(name="extra")).connect_layers("add", "extra"),
    ):
        assert edited.compile_cache is not net.compile_cache
        misses = edited.cache_info().misses
        edited.predict(x)
        assert edited.cache_info().misses == misses + 1
    assert net.cache_info().misses == before.misses + 1


# --------------------------------------------------------------------------------------------
# errors


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda n: n.add_layers(L.ReLU(name="relu")),
            r"add_layers: layer names must be unique; \['relu'\] already name layers",
        ),
        (
            lambda n: n.add_layers([L.ReLU(name="r"), L.ReLU(name="r")]),
            r"\['r'\] appear more than once among the new layers",
        ),
        (
            lambda n: n.add_layers("relu"),
            r"add_layers: expected a df\.Layer or a non-empty list of df\.Layer \(a chain\); "
            r"got str",
        ),
        (lambda n: n.add_layers([]), r"got an empty list"),
        (
            lambda n: n.connect_layers("nope", "add/in2"),
            r"connect_layers\('nope', 'add/in2'\): no layer named 'nope'; the layers are "
            r"\['in', 'fc', 'relu', 'add'\]",
        ),
        (
            lambda n: n.connect_layers("in", "add/in7"),
            r"layer 'add' has no input 'in7'; its inputs are \['in1', 'in2'\]",
        ),
        (lambda n: n.connect_layers("in", "add"), r"layer 'add' has 2 inputs.*'add/in1'"),
        (
            lambda n: n.connect_layers("in", "add/in1"),
            r"input 'add/in1' is already fed by 'relu/out'.*"
            r"Fix: net\.disconnect_layers\('relu/out', 'add/in1'\) first",
        ),
        (
            lambda n: n.connect_layers("relu", "in"),
            r"'in' is an input layer; its input is a network input",
        ),
        (
            lambda n: n.disconnect_layers("in", "add/in2").connect_layers("add", "add/in2"),
            r"connect_layers\('add', 'add/in2'\): the connections form a cycle through "
            r"'add' <- 'add'",
        ),
        (
            lambda n: (
                n.add_layers(L.Addition(2, name="b"))
                .connect_layers("add", "b/in1")
                .connect_layers("in", "b/in2")
                .disconnect_layers("in", "fc")
                .connect_layers("b", "fc")
            ),
            r"cycle through 'fc' <- 'b' <- 'add' <- 'relu' <- 'fc'",
        ),
        (
            lambda n: n.disconnect_layers("in", "add/in1"),
            r"disconnect_layers\('in', 'add/in1'\): there is no connection 'in/out' -> "
            r"'add/in1'; the connections into layer 'add' are \[\('relu/out', 'add/in1'\), "
            r"\('in/out', 'add/in2'\)\]\. Fix",
        ),
        (lambda n: n.disconnect_layers("fc", "zz"), r"no layer named 'zz'"),
        (
            lambda n: n.remove_layers(["fc", "zz", "yy"]),
            r"remove_layers\(\['fc', 'zz', 'yy'\]\): the network has no layer named "
            r"\['zz', 'yy'\]; its layers are",
        ),
        (
            lambda n: n.remove_layers(["in", "fc", "relu", "add"]),
            r"would remove every layer",
        ),
        (
            lambda n: n.replace_layer("zz", L.ReLU()),
            r"replace_layer\('zz', \.\.\.\): the network has no layer named 'zz'",
        ),
        (
            lambda n: n.replace_layer("relu", L.ReLU(name="fc")),
            r"replace_layer\('relu', \.\.\.\): layer names must be unique; \['fc'\]",
        ),
        (
            lambda n: n.replace_layer("relu", L.ReLU(), reconnect_by="position"),
            r"reconnect_by='position'; expected one of \['name', 'order'\]",
        ),
        (
            lambda n: n.replace_layer("add", L.ReLU(name="r2"), reconnect_by="order"),
            r"input 'add/in1' is connected, but the first new layer 'r2' has no input number 1"
            r"|input 'add/in2' is connected, but the first new layer 'r2' has no input number 2",
        ),
        (lambda n: n.replace_layer("relu", [L.ReLU(), 3]), r"got a list containing a int"),
    ],
)
def test_edit_errors(edit, message):
    net = residual_net().connect_layers("in", "add/in2")
    with pytest.raises(df.NetworkError, match=message):
        edit(net)


def test_a_layer_name_with_a_slash_is_refused():
    with pytest.raises(df.NetworkError, match=r"layer name 'a/b' contains '/'"):
        residual_net().add_layers(L.ReLU(name="a/b"))

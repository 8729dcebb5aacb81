"""df.Network: graphs, initialize, predict/forward, tables, acceleration and its cache, pytrees."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_tree_allclose

import difffn as df

# --------------------------------------------------------------------------------------------
# Small layers (the built-in ones have their own tests)


class Features(df.InputLayer):
    size: int = 3

    @property
    def input_layout(self):
        return df.Layout((None, self.size), "BC")

    def predict(self, x):
        return x


class Dense(df.Layer):
    formattable = True
    w: jax.Array | None = df.learnable(default=None)
    b: jax.Array | None = df.learnable(default=None, l2_factor=0.0)
    size: int = 4

    def initialize(self, layout, *, key):
        if self.w is None:
            n = layout.size("C")
            return self.replace(
                w=jax.random.normal(key, (n, self.size)) / n, b=jnp.zeros(self.size)
            )
        return self

    def predict(self, x):
        return df.dlarray(df.stripdims(x) @ self.w + self.b[None, :], "BC")


class Tanh(df.Layer):
    def predict(self, x):
        return jnp.tanh(x)


class Add(df.Layer):
    def predict(self, a, b):
        return a + b


class Split(df.Layer):
    num_outputs = 2

    def predict(self, x):
        return x, -x


class Noise(df.Layer):
    """Adds noise in forward only (key-driven), like dropout."""

    def predict(self, x):
        return x

    def forward(self, x, *, key):
        return x + jax.random.normal(key, x.shape)


class RunningMean(df.Layer):
    mean: jax.Array | None = df.state(default=None)

    def initialize(self, layout, *, key):
        return self if self.mean is not None else self.replace(mean=jnp.zeros(layout.size("C")))

    def predict(self, x):
        return x - self.mean[None, :], self.mean

    def forward(self, x):
        new = 0.9 * self.mean + 0.1 * jnp.mean(x, axis=0)
        return x - new[None, :], new

    def reset_state(self):
        return self.replace(mean=jnp.zeros_like(self.mean))


class Eager(df.Layer):
    """Python control flow on a value: fine eagerly, even under jax.grad (not under jit)."""

    acceleratable = False

    def predict(self, x):
        return x * 2 if jnp.sum(x) > 0 else x * 3


def mlp(**kwargs):
    return df.Network(
        [Features(name="in"), Dense(name="fc1"), Tanh(name="act"), Dense(size=2, name="fc2")],
        **kwargs,
    )


@pytest.fixture
def net(key):
    return mlp().initialize(key=key)


@pytest.fixture
def x(key):
    return jax.random.normal(jax.random.fold_in(key, 7), (5, 3))


# --------------------------------------------------------------------------------------------
# building


def test_a_list_is_a_chain():
    n = mlp()
    assert n.connections == (("in/out", "fc1/in"), ("fc1/out", "act/in"), ("act/out", "fc2/in"))
    assert n.input_names == ("in",) and n.output_names == ("fc2",)
    assert not n.initialized


def test_graph_with_named_ports_and_chains():
    n = df.Network(
        [[Features(name="in"), Split(name="split"), Add(name="add")], [Tanh(name="t")]],
        connections=[("split/out2", "t"), ("t", "add/in2")],
    )
    assert set(n.connections) == {
        ("in/out", "split/in"),
        ("split/out1", "add/in1"),
        ("split/out2", "t/in"),
        ("t/out", "add/in2"),
    }
    assert n.output_names == ("add",)


def test_unnamed_layers_get_unique_names():
    n = df.Network([Tanh(), Tanh(name="tanh_1"), Tanh()])
    assert [layer.name for layer in n.layers] == ["tanh_2", "tanh_1", "tanh_3"]


def test_network_without_input_layers_takes_layouts(key, x):
    n = df.Network([Dense(name="fc"), Tanh(name="t")])
    assert n.input_names == ("fc/in",)
    with pytest.raises(
        df.NetworkError,
        match=r"network input 'fc/in' has no input layer, so initialize needs its layout",
    ):
        n.initialize(key=key)
    n = n.initialize(df.Layout((None, 3), "BC"), key=key)
    assert n.predict(df.dlarray(x, "BC")).shape == (5, 4)
    # plain arrays work once the layout (and so the format) is known
    assert df.dims(n.predict(x)) == "BC"


def test_example_arrays_can_stand_for_layouts(key, x):
    n = df.Network([Dense(name="fc")]).initialize(df.dlarray(x, "BC"), key=key)
    assert n.initialized


def test_outputs_selection(net, x):
    n = mlp(outputs=["act", "fc2"]).initialize(key=jax.random.key(0))
    act, out = n.predict(x)
    assert act.shape == (5, 4) and out.shape == (5, 2)
    only = net.predict(x, outputs="fc1")
    assert only.shape == (5, 4)


@pytest.mark.parametrize(
    "layers, kwargs, message",
    [
        ([Tanh(name="a"), Tanh(name="a")], {}, r"layer names must be unique; \['a'\]"),
        (
            [Tanh(name="a"), Add(name="b")],
            {"connections": [("b", "a")]},
            r"cycle through 'a' <- 'b' <- 'a'",
        ),
        (
            [Tanh(name="a")],
            {"connections": [("zz", "a")]},
            r"no layer named 'zz'; the layers are \['a'\]",
        ),
        (
            [Tanh(name="a"), Add(name="b")],
            {"connections": [("a", "b/in9")]},
            r"layer 'b' has no input 'in9'; its inputs are \['in1', 'in2'\]",
        ),
        (
            [Tanh(name="a"), Add(name="b")],
            {"connections": [("a", "b")]},
            r"layer 'b' has 2 inputs.*say which, e.g. 'b/in1'",
        ),
        (
            [Features(name="in"), Tanh(name="t")],
            {"connections": [("t", "in")]},
            r"'in' is an input layer",
        ),
        ([Tanh(name="a/b")], {}, r"contains '/'"),
        ([Tanh(name="a")], {"outputs": ["nope"]}, r"no layer named 'nope'"),
        ("not layers", {}, r"expected a non-empty list of df\.Layer"),
    ],
)
def test_construction_errors(layers, kwargs, message):
    with pytest.raises(df.NetworkError, match=message):
        df.Network(layers, **kwargs)


def test_dangling_inputs_are_named_when_the_network_is_initialized_or_run(key, x):
    # As MATLAB's dlnetwork: an incomplete network can be built (and edited), not used.
    n = df.Network([Features(name="in"), Add(name="add"), Add(name="add2")])
    message = r"unconnected \(dangling\) inputs \['add/in2', 'add2/in2'\].*connect_layers"
    with pytest.raises(df.NetworkError, match=message):
        n.initialize(key=key)
    ready = df.Network([Features(name="in"), Tanh(name="t")]).initialize(key=key)
    with pytest.raises(df.NetworkError, match=message):
        df.Network([*ready.layers, Add(name="add"), Add(name="add2")]).predict(x)


def test_a_port_fed_twice_is_an_error():
    with pytest.raises(df.NetworkError, match=r"input 'b/in1' is already fed by 'a/out'"):
        df.Network([Tanh(name="a"), Add(name="b")], connections=[("a", "b/in1"), ("a", "b/in1")])


def test_size_mismatch_is_detected_at_construction():
    class Mismatch(df.Layer):
        def predict(self, a, b):
            return a + b

    with pytest.raises(
        df.NetworkError, match=r"layer 'add' \(Mismatch\) failed on inputs .*size mismatch"
    ):
        df.Network(
            [
                [Features(size=3, name="x"), Dense(size=4, name="fc")],
                [Features(size=3, name="y")],
                [Mismatch(name="add")],
            ],
            connections=[("fc", "add/in1"), ("y", "add/in2")],
        )


# --------------------------------------------------------------------------------------------
# initialize, predict, forward, state


def test_initialize_fills_only_empty_parameters(net, key):
    again = net.initialize(key=jax.random.key(123))
    assert_tree_allclose(again.learnables, net.learnables)


def test_predict_matches_a_plain_jax_reference(net, x):
    w1, b1, w2, b2 = (net.learnables[p] for p in ("fc1/w", "fc1/b", "fc2/w", "fc2/b"))
    expected = jnp.tanh(x @ w1 + b1[None]) @ w2 + b2[None]
    y = net.predict(x)
    assert isinstance(y, df.FormattedArray) and y.format == "BC"
    np.testing.assert_allclose(y.data, expected, rtol=1e-6)


def test_acceleration_none_gives_the_same_numbers(net, x):
    np.testing.assert_allclose(
        net.predict(x).data, net.predict(x, acceleration="none").data, rtol=1e-6
    )


def test_forward_uses_key_and_returns_state(key, x):
    n = df.Network([Features(name="in"), Noise(name="noise"), RunningMean(name="mean")])
    n = n.initialize(key=key)
    y1, state = n.forward(x, key=jax.random.key(1))
    y2, _ = n.forward(x, key=jax.random.key(1))
    y3, _ = n.forward(x, key=jax.random.key(2))
    np.testing.assert_array_equal(y1.data, y2.data)
    assert not np.allclose(y1.data, y3.data)
    assert list(state) == ["mean/mean"]
    np.testing.assert_allclose(
        state["mean/mean"],
        0.1
        * jnp.mean(
            x + jax.random.normal(jax.random.fold_in(jax.random.key(1), 1), x.shape), axis=0
        ),
        rtol=1e-5,
    )
    updated = n.replace(state=state)
    np.testing.assert_allclose(updated.state["mean/mean"], state["mean/mean"])
    np.testing.assert_array_equal(updated.reset_state().state["mean/mean"], 0.0)
    # predict does not change state and ignores the noise
    np.testing.assert_allclose(n.predict(x).data, x)


def test_predict_can_return_state(key, x):
    n = df.Network([Features(name="in"), RunningMean(name="mean")]).initialize(key=key)
    _, state = n.predict(x, return_state=True)
    assert list(state) == ["mean/mean"]


def test_uninitialized_network_cannot_predict(x):
    with pytest.raises(
        df.NetworkError, match=r"not initialized \(layers \['fc1', 'fc2'\] have empty parameters\)"
    ):
        mlp().predict(x)


def test_input_checks(net, x):
    with pytest.raises(df.NetworkError, match=r"takes 1 input\(s\) \['in'\]; got 2"):
        net.predict(x, x)
    with pytest.raises(df.NetworkError, match=r"expects format 'BC'; got 'CB'.*df\.permute"):
        net.predict(df.dlarray(x.T, "CB"))
    with pytest.raises(df.NetworkError, match=r"expects size 3 on axis 1"):
        net.predict(jnp.ones((5, 4)))


# --------------------------------------------------------------------------------------------
# tables, summary, repr


def test_learnables_and_state_tables(net):
    table = net.learnables
    assert table.layer == ("fc1", "fc1", "fc2", "fc2")
    assert table.parameter == ("w", "b", "w", "b")
    assert table["fc1/w"].shape == (3, 4)
    assert "layer  parameter  value" in str(table)
    assert len(net.state) == 0


def test_replace_learnables_from_a_table(net, x):
    zeros = net.learnables.map(jnp.zeros_like)
    np.testing.assert_array_equal(net.replace(learnables=zeros).predict(x).data, 0.0)
    with pytest.raises(df.NetworkError, match=r"layer 'fc1' \(Dense\) has no parameter 'zz'"):
        net.replace(learnables={"fc1/zz": jnp.ones(2)})
    with pytest.raises(df.NetworkError, match=r"the network has no layer named 'nope'"):
        net.replace(learnables={"nope/w": jnp.ones(2)})


def test_replace_checks_each_value_against_the_one_it_replaces(net, x):
    # a wrong-shaped bias used to broadcast silently into predict
    with pytest.raises(
        df.LayerError,
        match=r"Dense \(layer 'fc1'\): the new value of learnable 'b' is float32\[1\]; expected "
        r"float32\[4\], like its current value\. Fix: assign a value of shape \(4,\) and dtype "
        r"float32",
    ):
        net.replace(learnables={"fc1/b": jnp.zeros(1)})
    # an integer learnable used to fail later, in jax.grad ("grad requires real-valued")
    with pytest.raises(
        df.LayerError,
        match=r"Dense \(layer 'fc2'\): the new value of learnable 'w' is int32\[4, 2\]; expected "
        r"float32\[4, 2\]",
    ):
        net.replace(learnables={"fc2/w": jnp.ones((4, 2), jnp.int32)})
    # the same kind of dtype at another precision is a legitimate change (a float64 check)
    with jax.enable_x64(True):
        w = net.learnables["fc1/w"].astype(jnp.float64)
        assert net.replace(learnables={"fc1/w": w}).learnables["fc1/w"].dtype == jnp.float64
    # values are coerced as by Layer.replace: a NumPy array becomes a jax.Array
    b = net.replace(learnables={"fc1/b": np.ones(4, np.float32)}).learnables["fc1/b"]
    assert isinstance(b, jax.Array)


def test_replace_state_checks_the_dtype_kind_but_not_the_shape(key, x):
    net = df.Network([Features(name="in"), RunningMean(name="rm")]).initialize(key=key)
    with pytest.raises(
        df.LayerError,
        match=r"RunningMean \(layer 'rm'\): the new value of state 'mean' is bool\[3\]; expected "
        r"float32",
    ):
        net.replace(state={"rm/mean": jnp.ones(3, bool)})
    # a state may change shape (an LSTM's state takes the batch size of the data it saw)
    wider = net.replace(state={"rm/mean": jnp.ones((1, 3))})
    assert wider.state["rm/mean"].shape == (1, 3)


def test_initialize_with_a_tuple_names_the_fix(key):
    net = df.Network([Tanh(name="t")])
    with pytest.raises(
        df.NetworkError,
        match=r"network input 't/in': expected a df\.Layout or a formatted example .*got tuple "
        r"\(None, 3\)\. Fix: net\.initialize\(df\.Layout\(\(None, 3\), fmt\), key=key\)",
    ):
        net.initialize((None, 3), key=key)


def test_a_layer_error_while_the_network_initializes_keeps_its_type(key):
    class BadInit(df.Layer):
        w: jax.Array | None = df.learnable(default=None)

        def initialize(self, layout, *, key):
            return self.replace(w=jnp.ones(layout.shape[3]))  # an IndexError for "BC" data

        def predict(self, x):
            return x * self.w

    with pytest.raises(
        df.LayerError,
        match=r"BadInit\.initialize \(layer 'bad'\) raised IndexError: tuple index out of range "
        r"\(at test_network\.py:\d+, in initialize\)",
    ) as caught:
        df.Network([Features(name="in"), BadInit(name="bad")])  # sizes are checked when built
    assert isinstance(caught.value.__cause__, IndexError)  # the user's traceback stays available
    notes = "\n".join(caught.value.__notes__)
    assert "while the network initialized layer 'bad' (BadInit)" in notes


def test_summary_and_repr(net):
    text = net.summary()
    assert "fc1" in text and "?,3:BC" in text and "?,4:BC" in text
    assert text.splitlines()[0].split()[-1] == "description"
    described = net.replace_layer("act", Tanh(name="act", description="hyperbolic tangent"))
    assert "act   Tanh" in described.summary()
    assert described.summary().splitlines()[4].endswith("hyperbolic tangent")
    assert "26 learnable parameters" in text
    assert (
        repr(net) == "Network(4 layers, inputs=['in'], outputs=['fc2'], 26 learnables, initialized)"
    )


# --------------------------------------------------------------------------------------------
# acceleration and the trace cache


def test_one_compilation_per_input_signature(net, x):
    net.predict(x)
    start = net.cache_info()
    net.predict(x + 1)  # same signature: a hit
    net.predict(jnp.ones((7, 3)))  # new batch size: a miss
    net.predict(df.dlarray(x, "BC"))  # formatted or not, the same signature after preparation
    info = net.cache_info()
    assert (info.hits - start.hits, info.misses - start.misses) == (2, 1)


def test_updated_networks_share_the_cache(net, x):
    net.predict(x)
    before = net.cache_info()
    newer = net.replace(learnables=net.learnables.map(lambda v: v * 2))
    newer.predict(x)
    assert newer.cache_info().hits == before.hits + 1


def test_cache_is_bounded_and_warns_about_retracing(key):
    n = df.Network([Features(size=2, name="in"), Tanh(name="t")]).initialize(key=key)
    with pytest.warns(
        df.RetraceWarning, match=r"has compiled 10 traces.*pad them to a few fixed sizes"
    ):
        for batch in range(1, 53):
            n.predict(jnp.ones((batch, 2)))
    info = n.cache_info()
    assert (info.entries, info.maxsize, info.misses) == (50, 50, 52)
    n.predict(jnp.ones((1, 2)))  # the oldest entry was evicted: a miss again
    assert n.cache_info().misses == 53


class Counted(df.Layer):
    """Counts its traces: a compiled network traces it once per compilation."""

    traces = 0

    def predict(self, x):
        type(self).traces += 1
        return jnp.sin(x)


def counted_mlp():
    return df.Network(
        [Features(name="in"), Dense(name="fc1"), Counted(name="c"), Dense(size=2, name="fc2")]
    )


def reference(net, x):
    """The same network hand-written on its parameter values (jax.numpy only)."""
    p = net.learnables
    h = jnp.sin(x @ p["fc1/w"] + p["fc1/b"][None, :])
    return h @ p["fc2/w"] + p["fc2/b"][None, :]


def test_repeated_predict_reuses_one_compilation_with_the_same_numbers(key, x):
    n = counted_mlp().initialize(key=key)
    Counted.traces = 0  # initialize traced it too
    expected = reference(n, x)
    for _ in range(3):
        np.testing.assert_allclose(n.predict(x).data, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(n.predict(df.dlarray(x, "BC")).data, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(n.predict(x, outputs="fc2").data, expected, rtol=1e-5, atol=1e-6)
    assert Counted.traces == 1  # "fc2" names the default output: the same compilation
    info = n.cache_info()
    assert (info.hits, info.misses) == (4, 1)
    updated = n.replace(learnables=n.learnables.map(lambda v: -v))
    np.testing.assert_allclose(updated.predict(x).data, reference(updated, x), rtol=1e-5, atol=1e-6)
    assert Counted.traces == 1 and updated.cache_info().hits == 5


def test_a_cache_hit_keeps_every_option_of_predict(key, x):
    """After a first call, predict takes the cached entry; the options still act as documented."""
    n = counted_mlp().initialize(key=key)
    expected = reference(n, x)
    n.predict(x)  # records the entry for these inputs
    out, state = n.predict(x, return_state=True)
    np.testing.assert_allclose(out.data, expected, rtol=1e-5, atol=1e-6)
    assert out.format == "BC" and len(state) == 0
    np.testing.assert_allclose(n.predict(np.asarray(x)).data, expected, rtol=1e-5, atol=1e-6)
    traced = jax.jit(lambda v: n.predict(v).data)(x)
    np.testing.assert_allclose(traced, expected, rtol=1e-5, atol=1e-6)
    hidden, last = n.predict(x, outputs=["c", "fc2"])
    np.testing.assert_allclose(
        hidden.data,
        jnp.sin(x @ n.learnables["fc1/w"] + n.learnables["fc1/b"][None, :]),
        rtol=1e-5,
        atol=1e-6,
    )
    np.testing.assert_allclose(last.data, expected, rtol=1e-5, atol=1e-6)
    eager = n.predict(x, acceleration="none")
    np.testing.assert_allclose(eager.data, expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(df.NetworkError, match=r"takes the inputs positionally.*\['x'\]"):
        n.predict(x, x=x)
    with pytest.raises(df.NetworkError, match=r"acceleration='fast'; expected one of"):
        n.predict(x, acceleration="fast")


def test_a_network_whose_entry_was_evicted_compiles_it_again(key, monkeypatch):
    monkeypatch.setenv("DIFFFN_CACHE_SIZE", "2")
    n = df.Network([Features(size=6, name="in"), Counted(name="c")]).initialize(key=key)
    x = jnp.linspace(0.0, 1.0, 12).reshape(2, 6)
    n.predict(x)
    n.predict(jnp.ones((3, 6)))
    n.predict(jnp.ones((4, 6)))  # evicts the first entry
    traces = Counted.traces
    np.testing.assert_allclose(n.predict(x).data, jnp.sin(x), rtol=1e-6)
    info = n.cache_info()
    assert Counted.traces == traces + 1 and (info.entries, info.maxsize, info.misses) == (2, 2, 4)


def test_a_cache_size_that_is_not_a_positive_int_is_named(key, monkeypatch):
    monkeypatch.setenv("DIFFFN_CACHE_SIZE", "many")
    with pytest.raises(df.OptionsError, match=r"DIFFFN_CACHE_SIZE='many' must be a positive int"):
        df.Network([Features(size=7, name="in"), Tanh(name="t")])


def test_equal_networks_built_separately_share_one_compilation(key, x):
    a = counted_mlp().initialize(key=key)
    b = counted_mlp().initialize(key=jax.random.fold_in(key, 1))
    assert a.compile_cache is b.compile_cache
    a.predict(x)
    traces, hits = Counted.traces, a.cache_info().hits
    np.testing.assert_allclose(b.predict(x).data, reference(b, x), rtol=1e-5, atol=1e-6)
    assert Counted.traces == traces and b.cache_info().hits == hits + 1


def test_networks_loaded_twice_share_one_compilation(key, x, tmp_path):
    path = df.save(tmp_path / "n.difffn", counted_mlp().initialize(key=key))
    first = df.load(path, like=counted_mlp())
    second = df.load(path, like=counted_mlp())
    first_y = first.predict(x)
    traces, hits = Counted.traces, first.cache_info().hits
    np.testing.assert_allclose(second.predict(x).data, first_y.data)
    assert Counted.traces == traces and second.cache_info().hits == hits + 1


def test_non_acceleratable_layer_runs_eagerly_between_compiled_segments(key, x):
    n = df.Network(
        [Features(name="in"), Dense(name="fc1"), Eager(name="eager"), Dense(size=2, name="fc2")]
    )
    n = n.initialize(key=key)
    assert not n.acceleratable
    np.testing.assert_allclose(n.predict(x).data, n.predict(x, acceleration="none").data, rtol=1e-6)
    assert n.cache_info().entries == 2  # two compiled segments around the eager layer
    g = jax.grad(lambda n: jnp.sum(n.predict(x).data))(n)
    assert g.learnables["fc1/w"].shape == (3, 4)


# --------------------------------------------------------------------------------------------
# networks are pytrees


def test_grad_of_a_loss_is_a_network_of_gradients(net, x, x64):
    def loss(n):
        return jnp.sum(n.predict(x).data ** 2)

    grads = jax.grad(loss)(net)
    assert isinstance(grads, df.Network)

    def reference(w1, b1, w2, b2):
        return jnp.sum((jnp.tanh(x @ w1 + b1[None]) @ w2 + b2[None]) ** 2)

    expected = jax.grad(reference, (0, 1, 2, 3))(*net.learnables.value)
    assert_tree_allclose(tuple(grads.learnables.value), expected, rtol=1e-5, atol=1e-6)


def test_networks_pass_through_jit_vmap_and_tree_map(net, x):
    y = jax.jit(lambda n, x: n.predict(x).data)(net, x)
    np.testing.assert_allclose(y, net.predict(x).data, rtol=1e-6)
    batched = jax.vmap(lambda xi: net.predict(xi[None]).data[0])(x)
    np.testing.assert_allclose(batched, y, rtol=1e-5)
    doubled = jax.tree.map(lambda v: 2 * v, net)
    np.testing.assert_allclose(doubled.learnables["fc1/b"], 2 * net.learnables["fc1/b"])


def test_network_learnable_mask_and_factors(net):
    from difffn._layer._parameters import learnable_mask
    from difffn._network._factors import leaf_factors

    assert jax.tree.leaves(learnable_mask(net)) == [True] * 4
    net = df.set_learn_rate_factor(net, "fc1/w", 0.0)
    assert df.get_learn_rate_factor(net, "fc1/w") == 0.0
    assert leaf_factors(net, "learn_rate_factor") == [0.0, 1.0, 1.0, 1.0]
    assert leaf_factors(net, "l2_factor") == [1.0, 0.0, 1.0, 0.0]
    with pytest.raises(
        df.NetworkError, match=r"on a network, name the parameter as 'layer/parameter'"
    ):
        df.get_l2_factor(net, "w")


# --------------------------------------------------------------------------------------------
# a nested network with state (MATLAB's properties (Learnable, State))


class Block(df.Layer):
    """A custom layer holding a network with state; it returns the nested state after Y."""

    net: df.Network | None = df.learnable(default=None)

    def predict(self, x):
        return self.net.predict(x), self.net.state

    def forward(self, x):
        return self.net.forward(x)


def test_nested_network_state_is_updated_by_forward(key, x):
    inner = df.Network([Dense(size=3, name="fc"), RunningMean(name="rm")]).initialize(
        df.Layout((None, 3), "BC"), key=key
    )
    outer = df.Network([Features(name="in"), Block(net=inner, name="blk")]).initialize(key=key)
    assert list(outer.state) == ["blk/net/rm/mean"]
    y, state = outer.forward(x)
    assert list(state) == ["blk/net/rm/mean"]
    expected = 0.1 * jnp.mean(df.stripdims(inner.predict(x)) + inner.state["rm/mean"][None], axis=0)
    np.testing.assert_allclose(state["blk/net/rm/mean"], expected, rtol=1e-5, atol=1e-6)
    updated = outer.replace(state=state)
    np.testing.assert_allclose(updated.state["blk/net/rm/mean"], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        updated.layer("blk").net.state["rm/mean"], expected, rtol=1e-5, atol=1e-6
    )


def test_nested_stateful_network_must_return_its_state(key, x):
    class Forgetful(Block):
        def predict(self, x):
            return self.net.predict(x)

    inner = df.Network([RunningMean(name="rm")]).initialize(df.Layout((None, 3), "BC"), key=key)
    # caught when built; the layer's own error keeps its type, the network adds a note
    with pytest.raises(
        df.ForwardError,
        match=r"Forgetful\.predict \(layer 'blk'\) returned a single array; expected 2.*\['net'\].*self\.net\.forward",
    ) as caught:
        df.Network([Features(name="in"), Forgetful(net=inner, name="blk")])
    assert "while the network initialized layer 'blk' (Forgetful)" in "\n".join(
        caught.value.__notes__
    )

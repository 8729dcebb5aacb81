"""``Network.initialize``'s compiled program: its Threefry draws merged, the values unchanged.

The reference for every value is JAX itself: the same initializers traced and compiled as they
are (``merged_draws`` taken out), and each layer's ``initialize`` run eagerly with the key the
network gives it, one ``jax.random`` call at a time. Random bits must match exactly; numbers
made from them (a normal's inverse error function, a scale) are compared to float32 rounding,
since XLA may contract or order their arithmetic differently in another program.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import difffn as df
from difffn._network import _merged_draws
from difffn._network import _network as network_module
from difffn._network._merged_draws import merged_draws

L = df.layers


class RandomThings(df.Layer):
    """A user's layer whose initialize draws in every way jax.random offers."""

    a: jax.Array | None = df.learnable(default=None)
    b: jax.Array | None = df.learnable(default=None)
    c: jax.Array | None = df.learnable(default=None)
    d: jax.Array | None = df.learnable(default=None)
    e: jax.Array | None = df.state(default=None)  # raw bits: compared exactly

    def initialize(self, layout, *, key):
        n = layout.size("C")
        k1, k2, k3 = jax.random.split(key, 3)
        keys = jax.random.split(k3, 4)  # an array of keys: drawn under vmap, left unmerged
        return self.replace(
            a=jax.random.normal(k1, (n, 3)),
            b=jax.random.uniform(jax.random.fold_in(k2, 7), (5,), minval=-2.0, maxval=2.0),
            c=jax.vmap(lambda k: jax.random.normal(k, (2,)))(keys),
            d=jax.random.permutation(k2, 6).astype(jnp.float32),
            e=jax.random.bits(k1, (3, 2)),
        )

    def predict(self, x):
        return x, self.e


class Printing(df.Layer):
    """An initialize with a side effect: the program keeps its order (not merged)."""

    w: jax.Array | None = df.learnable(default=None)

    def initialize(self, layout, *, key):
        w = jax.random.normal(key, (layout.size("C"), 2))
        jax.debug.print("initialized {s}", s=w.shape[0])
        return self.replace(w=w)

    def predict(self, x):
        return x


def _networks():
    return {
        "cnn": df.Network(
            [
                L.ImageInput((8, 8, 3)),
                L.Conv2D(3, 4, padding="same"),
                L.BatchNorm(),
                L.ReLU(),
                L.Conv2D(3, 4, weights_initializer="he"),
                L.FullyConnected(5, weights_initializer="narrow-normal", bias_initializer="ones"),
                L.Softmax(),
            ]
        ),
        "recurrent": df.Network(
            [
                L.SequenceInput(3),
                L.LSTM(4),  # orthogonal recurrent weights: a QR of a normal draw
                L.GRU(3, output_mode="last"),
                L.FullyConnected(2, weights_initializer="orthogonal"),
            ]
        ),
        "attention": df.Network(
            [
                L.SequenceInput(8),
                L.SelfAttention(2, 8),
                L.LayerNorm(),
                L.FullyConnected(8, weights_initializer=jax.nn.initializers.lecun_normal()),
                L.FullyConnected(4, weights_initializer=lambda sz: np.full(sz, 0.5)),
            ]
        ),
        "custom": df.Network([L.FeatureInput(4), RandomThings(), L.FullyConnected(3)]),
    }


def _same(got, want, what=""):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, what
    if np.issubdtype(got.dtype, np.floating):
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


def _unmerged(monkeypatch, net, key):
    """The same program compiled without merging: what JAX computes on its own."""
    with monkeypatch.context() as m:
        m.setattr(network_module, "merged_draws", lambda fn: fn)
        return net.initialize(key=key)


def _eager(net, initialized, key):
    """Each layer initialized on its own, eagerly, with the key the network gives it."""
    layers = []
    for i, layer in enumerate(net.layers):
        if layer.learnable_names:
            inputs = initialized.recorded_layouts[i][0]
            with jax.disable_jit():
                layer = layer.initialize(*inputs, key=jax.random.fold_in(key, i))
        layers.append(layer)
    return layers


def _no_fallback(*_):
    raise AssertionError("merged_draws fell back to the program as traced")


@pytest.mark.parametrize("name", ["cnn", "recurrent", "attention", "custom"])
@pytest.mark.parametrize("make_key", [jax.random.key, jax.random.PRNGKey], ids=["typed", "raw"])
def test_merged_initializers_give_jax_own_values_bit_for_bit(monkeypatch, name, make_key):
    net, key = _networks()[name], make_key(3)
    with monkeypatch.context() as m:  # the merge itself ran, not its fallback
        m.setattr(_merged_draws, "_as_traced", _no_fallback)
        merged = net.initialize(key=key)
    reference = _unmerged(monkeypatch, net, key)
    leaves, tree = jax.tree.flatten(merged)
    assert tree == jax.tree.structure(reference)
    for got, want in zip(leaves, jax.tree.leaves(reference), strict=True):
        _same(got, want)
    assert len(leaves) > 3
    for got_layer, eager_layer in zip(merged.layers, _eager(net, merged, key), strict=True):
        for field in got_layer.learnable_names:
            what = f"{got_layer.name}.{field}"
            _same(getattr(got_layer, field), getattr(eager_layer, field), what)


def test_other_key_implementations_are_left_as_they_are(monkeypatch):
    net = df.Network([L.FeatureInput(4), RandomThings(), L.FullyConnected(2)])
    key = jax.random.key(5, impl="rbg")
    with monkeypatch.context() as m:  # no side effect: the rewrite runs, leaving rbg's draws
        m.setattr(_merged_draws, "_as_traced", _no_fallback)
        merged = net.initialize(key=key)
    reference = _unmerged(monkeypatch, net, key)
    for got, want in zip(jax.tree.leaves(merged), jax.tree.leaves(reference), strict=True):
        _same(got, want)


def test_side_effects_keep_the_program_as_traced(monkeypatch, capfd):
    net = df.Network([L.FeatureInput(4), RandomThings(), Printing(), L.FullyConnected(2)])
    key = jax.random.key(5)
    merged = net.initialize(key=key)
    reference = _unmerged(monkeypatch, net, key)
    for got, want in zip(jax.tree.leaves(merged), jax.tree.leaves(reference), strict=True):
        _same(got, want)
    assert capfd.readouterr().out.count("initialized 4") == 2


@pytest.mark.parametrize("layout", [True, False], ids=["partitionable", "original"])
def test_each_draw_keeps_the_threefry_layout_it_was_traced_under(monkeypatch, layout):
    def draws(key):
        with jax.threefry_partitionable(layout):
            a = jax.random.bits(jax.random.fold_in(key, 1), (5, 3))
            b = jax.random.split(jax.random.fold_in(key, 2), 4)
            folded = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(3))  # unmerged
            return a, jax.random.key_data(b), jax.random.key_data(folded)

    key = jax.random.key(11)
    with monkeypatch.context() as m:
        m.setattr(_merged_draws, "_as_traced", _no_fallback)
        got = jax.jit(merged_draws(draws))(key)
    for g, w in zip(got, draws(key), strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))  # bits: exactly


def test_independent_draws_become_one_threefry_call_per_depth():
    def draws(key):
        keys = [jax.random.fold_in(key, i) for i in range(10)]  # depth 1: ten fold_ins
        return [jax.random.bits(k, (i + 1, 3)) for i, k in enumerate(keys)]  # depth 2

    key = jax.random.key(0)
    plain = jax.make_jaxpr(draws)(key)
    merged = jax.make_jaxpr(merged_draws(draws))(key)
    calls = [e for e in merged.jaxpr.eqns if e.primitive.name == "threefry2x32"]
    assert len(calls) == 2, [e.primitive.name for e in merged.jaxpr.eqns]
    assert calls[0].outvars[0].aval.shape == (10,)  # the fold_ins' words
    assert calls[1].outvars[0].aval.shape == (sum(3 * (i + 1) for i in range(10)),)
    assert sum(e.primitive.name == "random_fold_in" for e in plain.jaxpr.eqns) == 10
    for got, want in zip(jax.jit(merged_draws(draws))(key), draws(key), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))  # the bits, exactly


def test_draws_nobody_reads_are_dropped_before_merging():
    # merging would otherwise keep them alive: their bits come out of the one call
    def draws(key):
        keys = [jax.random.fold_in(key, i) for i in range(4)]
        unused = [jax.random.bits(k, (50,)) for k in keys[1:]]  # noqa: F841 - read by nobody
        return jax.random.bits(keys[0], (2, 3))

    key = jax.random.key(0)
    merged = jax.make_jaxpr(merged_draws(draws))(key)
    calls = [e for e in merged.jaxpr.eqns if e.primitive.name == "threefry2x32"]
    assert [c.outvars[0].aval.shape for c in calls] == [(1,), (2, 3)]  # one fold_in, one draw
    np.testing.assert_array_equal(
        np.asarray(jax.jit(merged_draws(draws))(key)), np.asarray(draws(key))
    )


@pytest.mark.parametrize(("impl", "vectorized"), [("threefry2x32", True), ("rbg", True),
                                                   ("unsafe_rbg", False)])  # fmt: skip
def test_the_network_derives_its_layer_keys_with_one_vectorized_fold_in(impl, vectorized):
    # fold_in(key, i) for layer i, as before; one equation where the implementation's fold_in
    # is elementwise (unsafe_rbg's vmap draws the batch from one stream: layer by layer there)
    L = df.layers
    net = df.Network(
        [L.FeatureInput(3), L.FullyConnected(4), L.ReLU(), L.FullyConnected(2), L.Softmax()]
    )
    key = jax.random.key(5, impl=impl)
    program = jax.make_jaxpr(lambda k: net.initialize(key=k))(key)
    folds = [e.outvars[0].aval.shape for e in program.jaxpr.eqns if "fold_in" in str(e)]
    assert folds == ([(5,)] if vectorized else [()] * 5), folds
    initialized = net.initialize(key=key)
    for i in (1, 3):
        alone = net.layers[i].initialize(
            initialized.recorded_layouts[i][0][0], key=jax.random.fold_in(key, i)
        )
        _same(initialized.layers[i].weights, alone.weights, f"layer {i}")


def test_merged_draws_compose_with_jit_vmap_and_grad():
    def init(key, scale):
        k1, k2 = jax.random.split(key)
        return scale * jax.random.normal(k1, (3,)) + jax.random.uniform(k2, (3,))

    merged = merged_draws(init)
    keys = jax.random.split(jax.random.key(1), 4)
    _same(jax.vmap(merged, (0, None))(keys, 2.0), jax.vmap(init, (0, None))(keys, 2.0))
    grad = jax.grad(lambda s: merged(keys[0], s).sum())(2.0)
    assert np.isclose(grad, jax.grad(lambda s: init(keys[0], s).sum())(2.0))


def test_an_initializer_error_still_names_the_layer():
    class Broken(df.Layer):
        w: jax.Array | None = df.learnable(default=None)

        def initialize(self, layout, *, key):
            w = jax.random.normal(key, (layout.size("C"), 2))
            return self.replace(w=w @ jnp.ones((3, 2)))  # (4, 2) @ (3, 2): a shape error

        def predict(self, x):
            return x

    net = df.Network([Broken()])  # no input layer: nothing runs before initialize
    with pytest.raises(df.LayerError, match=r"Broken.initialize \(layer 'broken_1'\) raised Ty"):
        net.initialize(df.Layout((None, 4), "BC"), key=jax.random.key(0))


class Counted(df.Layer):
    """A user's layer that counts how often the network traces or runs its ``predict``."""

    weights: jax.Array | None = df.learnable(default=None)
    calls = [0]

    def initialize(self, layout, *, key):
        return self.replace(weights=jax.random.normal(key, (layout.size("C"), 2)))

    def predict(self, x):
        Counted.calls[0] += 1
        return df.dlarray(jnp.tanh(df.stripdims(x) @ self.weights), "BC")


def test_the_constructor_traces_the_network_once_and_initialize_reuses_its_sizes():
    """One trace checks every layer's sizes; initialize takes the outputs' sizes from it."""
    Counted.calls[0] = 0
    layers = [L.FeatureInput(3, name="in"), Counted(name="a"), L.ReLU(name="r"), Counted(name="b")]
    net = df.Network(layers)
    assert Counted.calls[0] == 2  # each Counted once, in the constructor's one trace
    net = net.initialize(key=jax.random.key(0))
    assert Counted.calls[0] == 2  # initialize traced the initializers, not the calls again
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    a = net.layers[1].weights
    expected = np.tanh(np.maximum(np.tanh(x @ a), 0) @ net.layers[3].weights)
    np.testing.assert_allclose(net.predict(x).data, expected, rtol=1e-6, atol=1e-6)
    assert a.shape == (3, 2) and net.layers[3].weights.shape == (2, 2)


def test_initialize_with_another_layout_traces_the_layers_again():
    """Sizes remembered for one input layout are not used for another."""
    Counted.calls[0] = 0
    net = df.Network([L.FeatureInput(3, name="in"), Counted(name="a")])
    assert Counted.calls[0] == 1
    fixed = net.initialize(df.Layout((4, 3), "BC"), key=jax.random.key(0))
    assert Counted.calls[0] == 2  # a batch of 4, not the constructor's unknown batch
    assert str(fixed.recorded_layouts[1][1][0]) != str(net.initialize(key=jax.random.key(0))
                                                        .recorded_layouts[1][1][0])  # fmt: skip
    assert Counted.calls[0] == 2  # the constructor's layout: remembered

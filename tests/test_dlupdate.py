"""Tests of difffn/_training/_dlupdate.py: df.dlupdate against plain-Python references."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import difffn as df

L = df.layers


@pytest.fixture
def net(key):
    layers = [L.FeatureInput(3), L.FullyConnected(4, name="fc"), L.BatchNorm(name="bn")]
    return df.Network(layers).initialize(key=key)


def test_fn_sees_every_learnable_and_nothing_else(net):
    seen = []
    out = df.dlupdate(lambda w: seen.append(w.shape) or w * 2, net)
    assert seen == [tuple(v.shape) for v in net.learnables.values()]  # not the BN statistics
    for name, value in net.learnables.items():
        np.testing.assert_array_equal(out.learnables[name], value * 2)
    for name, value in net.state.items():
        np.testing.assert_array_equal(out.state[name], value)


def test_several_arguments_are_matched_learnable_by_learnable(net):
    grads = jax.tree.map(lambda x: jnp.full_like(x, 0.5), net)  # a network of gradients
    table = net.learnables  # and a table like net.learnables
    out = df.dlupdate(lambda w, g, t: w - g * t, net, grads, table)
    for name, value in net.learnables.items():  # the reference: the formula per entry
        np.testing.assert_allclose(out.learnables[name], value - 0.5 * value)


def test_several_outputs_give_tables_as_matlab_gives_several_outputs(net):
    out, norms = df.dlupdate(lambda w: (w / 2, jnp.sum(w * w)), net)
    assert isinstance(norms, df.ParameterTable) and list(norms) == list(net.learnables)
    for name, value in net.learnables.items():
        np.testing.assert_allclose(norms[name], np.sum(np.asarray(value) ** 2), rtol=1e-6)
        np.testing.assert_allclose(out.learnables[name], value / 2)


def test_tables_and_pytrees(net):
    table = df.dlupdate(lambda w: w + 1, net.learnables)
    assert isinstance(table, df.ParameterTable)
    for name, value in net.learnables.items():
        np.testing.assert_array_equal(table[name], value + 1)
    tree = {"a": jnp.ones(2), "b": [jnp.zeros(3)]}
    out = df.dlupdate(lambda w, v: w * 3 + v, tree, tree)
    assert jax.tree.map(lambda x: x.tolist(), out) == {"a": [4.0, 4.0], "b": [[0.0, 0.0, 0.0]]}


def test_it_runs_under_jit(net):
    step = jax.jit(lambda n, g: df.dlupdate(lambda w, g: w - 0.1 * g, n, g))
    grads = jax.tree.map(jnp.ones_like, net)
    out = step(net, grads)
    np.testing.assert_allclose(out.learnables["fc/bias"], net.learnables["fc/bias"] - 0.1)


def test_errors_name_the_argument_and_the_learnable(net):
    with pytest.raises(df.OptionsError, match=r"df.dlupdate: fn must be a function"):
        df.dlupdate(3, net)
    with pytest.raises(df.OptionsError, match=r"argument 3 has rows .*expected the rows"):
        df.dlupdate(lambda w, g: w, net, df.ParameterTable([("fc", "weights", jnp.ones(1))]))
    with pytest.raises(
        df.OptionsError,
        match=r"fn raised ZeroDivisionError: .* on the learnable fc/weights \(shape \(3, 4\)\)",
    ):
        df.dlupdate(lambda w: 1 / 0, net)
    flip = iter([True, False] * 10)
    with pytest.raises(df.OptionsError, match=r"a tuple for some learnables"):
        df.dlupdate(lambda w: (w, w) if next(flip) else w, net)

"""df.layers.FromEquinox: an equinox module as a difffn layer, judged against equinox itself.

Gradients (float64) and an optimizer step are compared with ``eqx.filter_grad`` and
``eqx.apply_updates`` on the native module mapped over the batch with ``jax.vmap``, as equinox's
examples do; BatchNorm state with the native ``eqx.nn.State``.
"""

from __future__ import annotations

import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import assert_tree_allclose, run_python

import difffn as df
from difffn._layer._layer import call_layer
from difffn.layers._foreign import path_name

L = df.layers


class Block(eqx.Module):
    """Linear -> BatchNorm -> relu -> Dropout -> Linear, stateful (eqx.nn.make_with_state)."""

    linear1: eqx.nn.Linear
    norm: eqx.nn.BatchNorm
    dropout: eqx.nn.Dropout
    linear2: eqx.nn.Linear

    def __init__(self, key, *, dtype=jnp.float32, dropout=0.0):
        k1, k2 = jax.random.split(key)
        self.linear1 = eqx.nn.Linear(3, 5, dtype=dtype, key=k1)
        self.norm = eqx.nn.BatchNorm(5, axis_name="batch", momentum=0.8, mode="ema", dtype=dtype)
        self.dropout = eqx.nn.Dropout(dropout)
        self.linear2 = eqx.nn.Linear(5, 2, dtype=dtype, key=k2)

    def __call__(self, x, state, *, key=None):
        x, state = self.norm(self.linear1(x), state)
        return self.linear2(self.dropout(jax.nn.relu(x), key=key)), state


def inexact_leaves(module) -> dict[str, jax.Array]:
    """What eqx.filter_grad differentiates, by path: the names FromEquinox gives them."""
    leaves = jax.tree_util.tree_flatten_with_path(eqx.filter(module, eqx.is_inexact_array))[0]
    return {path_name(p): v for p, v in leaves}


def native_batched(module, state, x, key=None):
    """The equinox way to run a per-observation stateful module on a batch."""
    keys = None if key is None else jax.random.split(key, x.shape[0])
    return jax.vmap(
        lambda x, s, k: module(x, s, key=k),
        in_axes=(0, None, None if key is None else 0),
        out_axes=(0, None),
        axis_name="batch",
    )(x, state, keys)


def test_learnables_are_what_eqx_is_inexact_array_selects(key):
    module, state = eqx.nn.make_with_state(Block)(key)
    layer = L.FromEquinox(module, state=state, name="block")
    assert_tree_allclose(layer.params, inexact_leaves(module), rtol=0, atol=0)
    assert sorted(layer.params) == [
        "linear1/bias",
        "linear1/weight",
        "linear2/bias",
        "linear2/weight",
        "norm/bias",
        "norm/weight",
    ]
    assert layer.state_names == ("state",)
    assert sorted(layer.state) == [
        "Block.norm.ema_first_time_index",
        "Block.norm.ema_state_index/0",
        "Block.norm.ema_state_index/1",
    ]
    assert layer.num_inputs == 1  # x; the state is not an input


def test_gradients_and_state_match_eqx_filter_grad_in_float64(x64, key):
    module, state = eqx.nn.make_with_state(Block)(key, dtype=jnp.float64)
    layer = L.FromEquinox(module, state=state, name="block")
    x = jax.random.normal(jax.random.key(1), (6, 3), jnp.float64)
    w = jnp.linspace(-1.0, 2.0, 12).reshape(6, 2)

    @eqx.filter_grad(has_aux=True)
    def native_grad(m):
        y, new_state = native_batched(m, state, x)
        return jnp.sum(w * y**2), new_state

    native_grads, native_state = native_grad(module)

    def loss(params):
        (y,), (new_state,) = call_layer(layer.replace(params=params), (x,), training=True)
        return jnp.sum(w * y**2), new_state

    grads, new_state = jax.jit(jax.grad(loss, has_aux=True))(layer.params)
    assert grads["linear1/weight"].dtype == jnp.float64
    assert_tree_allclose(grads, inexact_leaves(native_grads), rtol=1e-12, atol=1e-12)
    expected_state = dict(zip(layer.state, jax.tree.leaves(native_state)))
    assert_tree_allclose(new_state, expected_state, rtol=1e-12, atol=1e-12)


def test_one_adam_step_matches_eqx_apply_updates(key):
    mlp = eqx.nn.MLP(3, 2, width_size=8, depth=2, activation=jnp.tanh, key=key)
    layer = L.FromEquinox(mlp)
    x = jax.random.normal(jax.random.key(1), (5, 3))
    tx = optax.adam(0.05)

    grads = eqx.filter_grad(lambda m: jnp.sum(jax.vmap(m)(x) ** 2))(mlp)
    params = eqx.filter(mlp, eqx.is_inexact_array)
    updates, _ = tx.update(grads, tx.init(params), params)
    native = eqx.apply_updates(mlp, updates)

    grads = jax.grad(lambda p: jnp.sum(layer.replace(params=p)(x) ** 2))(layer.params)
    updates, _ = tx.update(grads, tx.init(layer.params), layer.params)
    stepped = optax.apply_updates(layer.params, updates)
    assert_tree_allclose(stepped, inexact_leaves(native), rtol=1e-5, atol=1e-6)


def test_predict_runs_in_inference_mode_with_the_state(key):
    module, state = eqx.nn.make_with_state(Block)(key)
    layer = L.FromEquinox(module, state=state)
    x = jax.random.normal(jax.random.key(1), (8, 3))
    (_,), (trained,) = call_layer(layer, (x,), training=True)  # moves the running statistics
    layer = layer.replace(state=trained)
    y, kept = layer(x)
    eqx_state = jax.tree.unflatten(jax.tree.structure(state), list(trained.values()))
    expected, _ = native_batched(eqx.nn.inference_mode(module), eqx_state, x)
    np.testing.assert_allclose(y, expected, rtol=1e-6, atol=1e-6)
    assert_tree_allclose(kept, trained, rtol=0, atol=0)


def test_dropout_draws_from_the_key_and_training_without_one_is_an_error(key):
    module, state = eqx.nn.make_with_state(Block)(key, dropout=0.5)
    layer = L.FromEquinox(module, state=state, name="drop")
    x = jax.random.normal(jax.random.key(1), (64, 3))
    (a,), _ = call_layer(layer, (x,), training=True, key=jax.random.key(1))
    (b,), _ = call_layer(layer, (x,), training=True, key=jax.random.key(1))
    (c,), _ = call_layer(layer, (x,), training=True, key=jax.random.key(2))
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)
    expected, _ = native_batched(module, state, x, jax.random.key(1))
    np.testing.assert_allclose(a, expected, rtol=1e-6, atol=1e-6)
    with pytest.raises(
        df.LayerError,
        match=r"FromEquinox \(layer 'drop'\): the module Block holds eqx.nn.Dropout.*no key was given",
    ):
        call_layer(layer, (x,), training=True)


class SmallCNN(eqx.Module):
    conv: eqx.nn.Conv2d
    linear: eqx.nn.Linear

    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.conv = eqx.nn.Conv2d(1, 4, 3, padding=1, key=k1)
        self.linear = eqx.nn.Linear(4 * 8 * 8, 10, key=k2)

    def __call__(self, x):  # one channel-first image (C, H, W)
        return self.linear(jax.nn.relu(self.conv(x)).reshape(-1))


def test_fmt_permutes_to_the_modules_channel_first_layout(key):
    module = SmallCNN(key)
    layer = L.FromEquinox(module, fmt="BCSS", output_format="BC")
    x = jax.random.normal(jax.random.key(1), (3, 8, 8, 1))
    y = layer(df.dlarray(x, "BSSC"))
    assert y.format == "BC"
    expected = jax.vmap(module)(jnp.transpose(x, (0, 3, 1, 2)))
    np.testing.assert_allclose(y.data, expected, rtol=1e-5, atol=1e-5)


def test_vmap_false_gives_the_module_the_batch(key):
    class Scale(eqx.Module):
        w: jax.Array

        def __call__(self, x):
            assert x.ndim == 2  # the whole batch
            return x * self.w[None, :]

    layer = L.FromEquinox(Scale(jnp.arange(1.0, 4.0)), vmap=False)
    y = layer(df.dlarray(jnp.ones((2, 3)), "BC"))
    np.testing.assert_array_equal(y.data, [[1, 2, 3], [1, 2, 3]])


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"fmt": "SC"}, df.LayerError, r"fmt 'SC' has no B \(batch\) axis.*vmap=False"),
        ({"output_format": "BC"}, df.LayerError, r"output_format='BC' needs fmt"),
        ({"vmap": 1}, df.LayerError, r"vmap must be True or False; got 1"),
    ],
)
def test_bad_arguments_are_named(key, kwargs, error, message):
    with pytest.raises(error, match=message):
        L.FromEquinox(eqx.nn.Linear(3, 2, key=key), name="m", **kwargs)


def test_a_stateful_module_without_its_state_is_a_named_error(key):
    module, _ = eqx.nn.make_with_state(Block)(key)
    with pytest.raises(
        df.LayerError, match=r"has stateful layers \(eqx.nn.StateIndex.*make_with_state"
    ):
        L.FromEquinox(module)


def test_a_non_equinox_module_is_a_named_error():
    with pytest.raises(
        df.LayerError, match=r"module must be an equinox Module; got function.*FromNNX"
    ):
        L.FromEquinox(lambda x: x, name="m")


def test_without_equinox_it_says_what_to_install(monkeypatch, key):
    linear = eqx.nn.Linear(3, 2, key=key)
    monkeypatch.setitem(sys.modules, "equinox", None)  # import equinox now raises ImportError
    with pytest.raises(
        df.MissingDependencyError,
        match=r"FromEquinox needs equinox.*pip install equinox.*difffn\[equinox\]",
    ):
        L.FromEquinox(linear)
    assert issubclass(df.MissingDependencyError, ImportError)


def test_difffn_imports_and_works_without_equinox():
    code = """
import sys
sys.modules["equinox"] = None  # as if it were not installed
import jax, jax.numpy as jnp
import difffn as df
net = df.Network([df.layers.FeatureInput(2, normalization="none", name="in"),
                  df.layers.FullyConnected(1, name="fc")]).initialize(key=jax.random.key(0))
print(net.predict(jnp.ones((1, 2))).shape)
try:
    df.layers.FromEquinox(object())
except df.MissingDependencyError as error:
    print(error)
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "(1, 1)",
        "df.layers.FromEquinox needs equinox, which is not installed. Fix: pip install equinox "
        "(or pip install 'difffn[equinox]').",
    ]


def test_check_layer_passes_for_a_module_without_state(key):
    mlp = eqx.nn.MLP(3, 2, width_size=8, depth=1, activation=jnp.tanh, key=key)
    report = df.check_layer(L.FromEquinox(mlp), df.Layout((None, 3), "BC"))
    assert report.failed == 0 and report.passed >= 10, str(report)
    assert "gradients_are_correct[params]" in {
        r.name for r in report.results if r.status == "Passed"
    }


def test_in_a_network_trained_saved_and_loaded(tmp_path, key):
    def network(seed):
        module, state = eqx.nn.make_with_state(Block)(jax.random.key(seed), dropout=0.2)
        return df.Network(
            [
                L.FeatureInput(3, normalization="none", name="in"),
                L.FromEquinox(module, state=state, name="block"),
            ]
        )

    X = np.asarray(jax.random.normal(key, (48, 3)))
    T = np.asarray(X[:, :2] * 2.0 - X[:, 2:])
    options = df.TrainingOptions("adam", max_epochs=3, mini_batch_size=16, verbose=False)
    net, info = df.trainnet(X, T, network(0), "mse", options)
    assert np.isfinite(info.training_history["loss"]).all()
    assert not np.allclose(net.state["block/state"]["Block.norm.ema_state_index/0"], 0)
    loaded = df.load(df.save(tmp_path / "eqx.difffn", net), like=network(7))
    np.testing.assert_array_equal(loaded.predict(X).data, net.predict(X).data)

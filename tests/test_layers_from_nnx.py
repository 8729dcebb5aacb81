"""df.layers.FromNNX: a flax.nnx module as a difffn layer, judged against nnx itself.

Gradients (float64) and an optimizer step are compared with ``nnx.grad`` and ``nnx.Optimizer``
on the native module; batch statistics with the native module in training mode.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import nnx
from helpers import assert_tree_allclose

import difffn as df
from difffn._layer._layer import call_layer

L = df.layers


class Block(nnx.Module):
    """Linear -> BatchNorm -> relu -> Linear, in the dtype asked for."""

    def __init__(self, *, dtype=jnp.float32, dropout=0.0, seed=0):
        rngs = nnx.Rngs(params=seed, dropout=seed + 1)
        self.linear1 = nnx.Linear(3, 5, param_dtype=dtype, rngs=rngs)
        self.norm = nnx.BatchNorm(5, momentum=0.8, param_dtype=dtype, rngs=rngs)
        self.dropout = nnx.Dropout(dropout, rngs=rngs)
        self.linear2 = nnx.Linear(5, 2, param_dtype=dtype, rngs=rngs)
        for stat in (self.norm.mean, self.norm.var):  # nnx keeps them float32 whatever the dtype
            stat.set_value(stat.get_value().astype(dtype))

    def __call__(self, x):
        return self.linear2(self.dropout(nnx.relu(self.norm(self.linear1(x)))))


def flat(state) -> dict[str, jax.Array]:
    """An nnx State as ``{"a/b": value}``, the names FromNNX gives its parameters."""
    return {"/".join(map(str, p)): v.get_value() for p, v in nnx.to_flat_state(state)}


def weights(shape):
    """A fixed, uneven output weighting, so that gradients are not all alike."""
    return jnp.linspace(-1.0, 2.0, int(np.prod(shape))).reshape(shape)


def test_parameters_and_batch_statistics_are_the_modules_variables():
    module = Block()
    layer = L.FromNNX(module, name="block")
    assert_tree_allclose(layer.params, flat(nnx.state(module, nnx.Param)), rtol=0, atol=0)
    assert_tree_allclose(layer.batch_stats, flat(nnx.state(module, nnx.BatchStat)), rtol=0, atol=0)
    assert sorted(layer.params) == [
        "linear1/bias",
        "linear1/kernel",
        "linear2/bias",
        "linear2/kernel",
        "norm/bias",
        "norm/scale",
    ]
    assert layer.state_names == ("batch_stats",)
    assert layer.num_inputs == 1 and layer.description == "FromNNX(Block)"


def test_gradients_and_batch_statistics_match_nnx_in_float64(x64, key):
    module = Block(dtype=jnp.float64)
    layer = L.FromNNX(module, name="block")
    x = jax.random.normal(key, (6, 3), jnp.float64)
    w = weights((6, 2))

    native = nnx.view(module, use_running_average=False, deterministic=True)
    native_grads = nnx.grad(lambda m: jnp.sum(w * m(x) ** 2))(native)  # also updates the stats

    def loss(params):
        (y,), (stats,) = call_layer(layer.replace(params=params), (x,), training=True)
        return jnp.sum(w * y**2), stats

    grads, stats = jax.jit(jax.grad(loss, has_aux=True))(layer.params)
    assert grads["linear1/kernel"].dtype == jnp.float64
    assert_tree_allclose(grads, flat(native_grads), rtol=1e-12, atol=1e-12)
    assert_tree_allclose(stats, flat(nnx.state(native, nnx.BatchStat)), rtol=1e-12, atol=1e-12)
    assert not np.allclose(stats["norm/mean"], 0)  # the running mean moved


def test_one_adam_step_matches_nnx_optimizer(key):
    module = Block()
    layer = L.FromNNX(module, name="block")
    x = jax.random.normal(key, (6, 3))
    native = nnx.view(module, use_running_average=False, deterministic=True)
    optimizer = nnx.Optimizer(native, optax.adam(0.05), wrt=nnx.Param)
    optimizer.update(native, nnx.grad(lambda m: jnp.sum(m(x) ** 2))(native))

    tx = optax.adam(0.05)
    grads = jax.grad(
        lambda p: jnp.sum(call_layer(layer.replace(params=p), (x,), training=True)[0][0] ** 2)
    )(layer.params)
    updates, _ = tx.update(grads, tx.init(layer.params), layer.params)
    stepped = optax.apply_updates(layer.params, updates)
    assert_tree_allclose(stepped, flat(nnx.state(native, nnx.Param)), rtol=1e-5, atol=1e-6)


def test_predict_is_the_inference_mode_module_and_keeps_the_statistics(key):
    module = Block()
    stats = {"norm/mean": jnp.arange(5.0), "norm/var": jnp.full(5, 4.0)}
    layer = L.FromNNX(module).replace(batch_stats=stats)
    module.norm.mean.set_value(stats["norm/mean"])
    module.norm.var.set_value(stats["norm/var"])
    x = jax.random.normal(key, (4, 3))
    y, new_stats = layer(x)
    expected = nnx.view(module, use_running_average=True, deterministic=True)(x)
    np.testing.assert_allclose(y, expected, rtol=1e-6, atol=1e-6)
    assert new_stats is stats


def test_dropout_draws_from_the_key_and_training_without_one_is_an_error(key):
    layer = L.FromNNX(Block(dropout=0.5), name="drop")
    x = jax.random.normal(key, (64, 3))
    (a,), _ = call_layer(layer, (x,), training=True, key=jax.random.key(1))
    (b,), _ = call_layer(layer, (x,), training=True, key=jax.random.key(1))
    (c,), _ = call_layer(layer, (x,), training=True, key=jax.random.key(2))
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)
    (p,), _ = call_layer(layer, (x,), training=False)
    np.testing.assert_allclose(p, nnx.view(Block(dropout=0.5), deterministic=True,
                                           use_running_average=True)(x), rtol=1e-6)  # fmt: skip
    with pytest.raises(
        df.LayerError,
        match=r"FromNNX \(layer 'drop'\): the module Block has random streams \['dropout'\].*no key was given.*key=jax.random.key",
    ):
        call_layer(layer, (x,), training=True)


def cnn():
    return nnx.Sequential(
        nnx.Conv(1, 4, (3, 3), rngs=nnx.Rngs(0)),
        nnx.relu,
        lambda x: x.reshape(x.shape[0], -1),
        nnx.Linear(8 * 8 * 4, 10, rngs=nnx.Rngs(1)),
    )


def test_fmt_permutes_the_input_to_the_modules_axis_order(key):
    module = cnn()
    layer = L.FromNNX(module, fmt="BSSC", output_format="BC")
    assert layer.formattable
    x = jax.random.normal(key, (2, 8, 8, 1))
    y = layer(df.permute(df.dlarray(x, "BSSC"), "SSCB"))  # arrives channel- and batch-last
    assert y.format == "BC"
    np.testing.assert_allclose(y.data, module(x), rtol=1e-5, atol=1e-5)


def test_a_module_that_changes_the_rank_needs_its_formats():
    with pytest.raises(
        df.LayerError,
        match=r"FromNNX \(layer 'cnn'\): output 'out' of the module has 2 dimensions but the input format 'BSSC' has 4.*fmt='BSSC', output_format='BC'",
    ):
        df.Network([L.ImageInput((8, 8, 1), name="in"), L.FromNNX(cnn(), name="cnn")])


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"fmt": "BXC"}, df.FormatError, r"FromNNX \(layer 'm'\): fmt 'BXC' has invalid label"),
        ({"fmt": ("BC", "BC")}, df.LayerError, r"fmt must be a format string or a tuple of 1"),
        ({"output_format": "BC"}, df.LayerError, r"output_format='BC' needs fmt"),
        ({"rngs": 0}, df.LayerError, r"unknown argument\(s\) \['rngs'\]"),
    ],
)
def test_bad_arguments_are_named(kwargs, error, message):
    with pytest.raises(error, match=message):
        L.FromNNX(Block(), name="m", **kwargs)


def test_a_non_nnx_module_is_a_named_error():
    with pytest.raises(
        df.LayerError, match=r"module must be a flax.nnx Module; got function.*FromEquinox"
    ):
        L.FromNNX(lambda x: x, name="m")


def test_input_that_cannot_take_the_modules_format_is_named(key):
    layer = L.FromNNX(cnn(), name="cnn", fmt="BSSC", output_format="BC")
    with pytest.raises(
        df.LayerError,
        match=r"input 'in' has format 'BC', which cannot be reordered to the module's fmt 'BSSC'",
    ):
        layer(df.dlarray(jnp.ones((2, 64)), "BC"))


def test_check_layer_passes_for_a_module_without_state():
    mlp = nnx.Sequential(
        nnx.Linear(3, 8, rngs=nnx.Rngs(0)), nnx.tanh, nnx.Linear(8, 2, rngs=nnx.Rngs(1))
    )
    report = df.check_layer(L.FromNNX(mlp), df.Layout((None, 3), "BC"))
    assert report.failed == 0 and report.passed >= 10, str(report)
    report = df.check_layer(L.FromNNX(cnn(), fmt="BSSC", output_format="BC"),
                            df.Layout((None, 8, 8, 1), "BSSC"))  # fmt: skip
    assert report.failed == 0, str(report)
    assert {r.name for r in report.results if r.status == "Passed"} >= {
        "gradients_are_correct[params]",
        "formattable_predict_is_formatted",
    }


def test_check_layer_with_batch_statistics_passes():
    """The batch statistics are one state field holding a dict of arrays."""
    report = df.check_layer(L.FromNNX(Block()), df.Layout((None, 3), "BC"))
    assert report.failed == 0, str(report)
    assert report["gradients_are_correct[params]"].status == "Passed"
    assert report["predict_returns_valid_state"].status == "Passed"
    assert report["forward_returns_valid_state"].status == "Passed"


def digits_network(module=None):
    return df.Network(
        [
            L.ImageInput((8, 8, 1), name="in"),
            L.FromNNX(
                module if module is not None else cnn(), fmt="BSSC", output_format="BC", name="cnn"
            ),  # fmt: skip
            L.Softmax(name="softmax"),
        ]
    )


@pytest.mark.slow
def test_trainnet_on_the_digits_then_save_and_load(tmp_path):
    X, T, X_test, T_test = df.data.digits()
    options = df.TrainingOptions("adam", max_epochs=4, mini_batch_size=64, initial_learn_rate=0.01,
                                 verbose=False)  # fmt: skip
    net, info = df.trainnet(X, T, digits_network(), "crossentropy", options)
    losses = np.asarray(info.training_history["loss"])
    assert losses[-5:].mean() < 0.5 * losses[:5].mean()
    accuracy = df.testnet(net, X_test, T_test, "accuracy")
    assert accuracy > 0.85  # a small CNN on 8x8 digits after four epochs

    path = df.save(tmp_path / "cnn.difffn", net)
    loaded = df.load(path, like=digits_network(cnn()))
    np.testing.assert_array_equal(loaded.predict(X_test).data, net.predict(X_test).data)


def test_learn_rate_factor_of_the_module_by_its_path(key):
    mlp = nnx.Sequential(nnx.Linear(3, 4, rngs=nnx.Rngs(0)), nnx.tanh)
    net = df.Network(
        [
            L.FeatureInput(3, normalization="none", name="in"),
            L.FromNNX(mlp, name="mlp"),
            L.FullyConnected(2, name="fc"),
        ]
    ).initialize(key=key)
    frozen = df.set_learn_rate_factor(net, "mlp/params", 0.0)
    assert df.get_learn_rate_factor(frozen, "mlp/params") == 0.0
    X = np.asarray(jax.random.normal(key, (32, 3)))
    T = np.asarray(jax.random.normal(jax.random.key(1), (32, 2)))
    options = df.TrainingOptions("sgdm", max_epochs=2, mini_batch_size=16, verbose=False)
    trained, _ = df.trainnet(X, T, frozen, "mse", options)
    assert_tree_allclose(
        trained.learnables["mlp/params"], net.learnables["mlp/params"], rtol=0, atol=0
    )
    assert not np.allclose(trained.learnables["fc/weights"], net.learnables["fc/weights"])
    moved, _ = df.trainnet(X, T, net, "mse", options)
    assert not np.allclose(
        moved.learnables["mlp/params"]["layers/0/kernel"],
        net.learnables["mlp/params"]["layers/0/kernel"],
    )


def test_network_state_table_and_orbax(tmp_path, key):
    net = df.Network(
        [L.FeatureInput(3, normalization="none", name="in"), L.FromNNX(Block(), name="b")]
    )
    net = net.initialize(key=key)
    _, state = net.forward(jax.random.normal(key, (8, 3)))
    net = net.replace(state=state)
    assert list(net.state) == ["b/batch_stats"]
    assert "dict of 2 arrays" in str(net.state)
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(tmp_path / "ckpt", net)
        restored = checkpointer.restore(
            tmp_path / "ckpt",
            jax.eval_shape(
                lambda: df.Network([L.FeatureInput(3, normalization="none", name="in"),
                                    L.FromNNX(Block(seed=5), name="b")]).initialize(key=key)
            ),
        )  # fmt: skip
    assert_tree_allclose(restored, net, rtol=0, atol=0)

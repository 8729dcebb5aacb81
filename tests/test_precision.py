"""Mixed precision (``TrainingOptions(precision=...)``): bfloat16/float16 compute with float32
learnables, flax's dynamic loss scaling for float16, and the float32 NaN stop."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn.datasets import load_digits

import difffn as df
from difffn._training._precision import Policy


@pytest.fixture(scope="module")
def digits():
    data = load_digits()
    X = (data.data / 16.0).astype(np.float32)
    T = data.target.astype(np.int32)
    order = np.random.default_rng(0).permutation(len(T))
    X, T = X[order], T[order]
    return X[:600], T[:600], X[1200:], T[1200:]


def _digits_net():
    L = df.layers
    return df.Network(
        [
            L.FeatureInput(64),
            L.FullyConnected(32),
            L.BatchNorm(),
            L.ReLU(),
            L.FullyConnected(10),
            L.Softmax(),
        ]
    )


def _train_digits(digits, precision):
    X, T, _, _ = digits
    options = df.TrainingOptions(
        "adam",
        max_epochs=4,
        mini_batch_size=50,
        initial_learn_rate=0.01,
        verbose=False,
        precision=precision,
    )
    return df.trainnet(X, T, _digits_net(), "crossentropy", options, key=jax.random.key(0))


@pytest.mark.slow
def test_digits_in_bfloat16_within_a_point_of_float32(digits):
    precision = "bfloat16"
    _, _, Xt, Tt = digits
    reference, _ = _train_digits(digits, "float32")
    net, info = _train_digits(digits, precision)
    # the masters and the BatchNorm statistics stay float32
    assert {str(v.dtype) for v in net.learnables.values()} == {"float32"}
    assert {str(v.dtype) for v in jax.tree.leaves(net.state)} == {"float32"}
    accuracy = df.testnet(net, Xt, Tt, "accuracy")
    expected = df.testnet(reference, Xt, Tt, "accuracy")
    assert expected > 80
    assert abs(accuracy - expected) <= 1.0, (accuracy, expected)
    assert info.skipped_steps >= 0 and np.isfinite(info.training_history["loss"]).all()


def test_the_step_computes_in_the_compute_dtype():
    seen = []

    def loss(Y, T):
        seen.append(Y.dtype)  # the loss gets float32 outputs, whatever the compute dtype
        return jnp.mean((df.stripdims(Y) - T) ** 2)

    X = np.linspace(-1, 1, 32, dtype=np.float32).reshape(16, 2)
    T = X.sum(axis=1, keepdims=True)
    net = df.Network([df.layers.FeatureInput(2), df.layers.FullyConnected(1)])
    options = df.TrainingOptions(
        max_epochs=1, mini_batch_size=8, verbose=False, precision="bfloat16"
    )
    df.trainnet(X, T, net, loss, options, key=jax.random.key(0))
    assert seen and set(seen) == {jnp.dtype("float32")}
    policy = Policy("bfloat16")
    assert policy.compute(jnp.ones(2)).dtype == jnp.bfloat16
    assert policy.compute(jnp.ones(2, jnp.int32)).dtype == jnp.int32


def _overflowing_run(precision):
    X = np.linspace(-1, 1, 64, dtype=np.float32).reshape(32, 2)
    T = X @ np.array([[1.0], [-2.0]], np.float32)

    def loss(Y, T):
        # scaled by float16's initial loss scale (2**16), these gradients overflow float16
        return 50.0 * jnp.mean((df.stripdims(Y) - T) ** 2)

    net = df.Network([df.layers.FeatureInput(2), df.layers.FullyConnected(1, name="fc")])
    options = df.TrainingOptions(
        "sgdm",
        max_epochs=8,
        mini_batch_size=32,
        initial_learn_rate=0.01,
        verbose=False,
        precision=precision,
    )
    return df.trainnet(X, T, net, loss, options, key=jax.random.key(0))


def test_float16_overflow_is_recovered_by_loss_scaling():
    net, info = _overflowing_run("float16")
    reference, reference_info = _overflowing_run("float32")
    assert info.skipped_steps > 0  # the first steps overflowed and were skipped
    assert info.stop_reason == "Max epochs completed"
    assert np.isfinite(np.asarray(net.learnables["fc/weights"])).all()
    # once the scale came down, it trained: the loss fell as in float32
    loss = info.training_history["loss"]
    assert loss[-1] < 0.5 * loss[0]
    assert reference_info.skipped_steps == 0


def test_nan_in_float32_stops_with_a_named_reason():
    X = np.ones((8, 2), np.float32)
    T = np.ones((8, 1), np.float32)
    net = df.Network([df.layers.FeatureInput(2), df.layers.FullyConnected(1)])
    options = df.TrainingOptions(max_epochs=3, mini_batch_size=4, verbose=False)
    _, info = df.trainnet(
        X,
        T,
        net,
        lambda Y, T: jnp.log(-jnp.mean(df.stripdims(Y) * 0 + 1)),
        options,
        key=jax.random.key(0),
    )
    assert info.stop_reason == "Training loss is NaN"
    assert len(info.training_history) == 1


def test_unknown_precision_is_a_named_error():
    with pytest.raises(df.OptionsError, match=r"precision.*'float8'"):
        df.TrainingOptions(precision="float8")

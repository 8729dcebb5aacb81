"""minibatchpredict, testnet and scores2label."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from training_layers import classification_data, classifier_net

import difffn as df


@pytest.fixture
def net(key):
    return classifier_net().initialize(key=key)


@pytest.mark.parametrize("size", [16, 40, 100, 128])
def test_minibatchpredict_equals_one_predict(key, size):
    # a network of its own (5 inputs): these sizes should not fill the shared compile cache
    net = classifier_net(inputs=5).initialize(key=key)
    X, _ = classification_data(100, inputs=5)
    whole = net.predict(X)
    batched = df.minibatchpredict(net, X, mini_batch_size=size)
    assert isinstance(batched, df.FormattedArray) and batched.format == "BC"
    assert batched.shape == (100, 3)
    np.testing.assert_allclose(batched.data, whole.data, rtol=1e-6)


def test_minibatchpredict_reuses_one_compiled_size_for_a_partial_batch(key):
    net = df.Network(
        [df.layers.FeatureInput(4, name="in"), df.layers.FullyConnected(7, name="fc7")]
    ).initialize(key=key)
    X = np.ones((70, 4), np.float32)
    before = net.cache_info().misses
    df.minibatchpredict(net, X, mini_batch_size=32)  # 32, 32 and 6 padded to 32
    assert net.cache_info().misses - before == 1


def test_minibatchpredict_several_outputs_and_formatted_inputs(key):
    net = df.Network(
        [
            df.layers.FeatureInput(4, name="in"),
            df.layers.FullyConnected(3, name="a"),
            df.layers.Softmax(name="sm"),
        ],
        outputs=["a", "sm"],
    ).initialize(key=key)
    X = df.dlarray(jnp.ones((10, 4)), "BC")
    a, sm = df.minibatchpredict(net, X, mini_batch_size=4)
    assert a.shape == sm.shape == (10, 3)
    only = df.minibatchpredict(net, X, mini_batch_size=4, outputs="sm")
    np.testing.assert_allclose(only.data, sm.data)


def test_testnet_metrics_and_losses(net):
    X, T = classification_data(90)
    scores = net.predict(X)
    result = df.testnet(net, X, T, ["accuracy", "crossentropy", "fscore"], mini_batch_size=32)
    assert set(result) == {"accuracy", "crossentropy", "fscore"}
    assert result["accuracy"] == pytest.approx(float(df.metrics.accuracy(scores, T)))
    assert result["crossentropy"] == pytest.approx(
        float(df.losses.crossentropy(scores, T)), rel=1e-5
    )
    assert df.testnet(net, X, T, "accuracy") == pytest.approx(result["accuracy"])


def test_testnet_on_an_iterable_and_with_a_callable(net):
    X, T = classification_data(64)
    batches = [(X[i : i + 16], T[i : i + 16]) for i in range(0, 64, 16)]
    assert df.testnet(net, batches, "accuracy") == pytest.approx(df.testnet(net, X, T, "accuracy"))

    def mean_top(y, t):
        return jnp.mean(jnp.max(df.stripdims(y), axis=-1))

    value = df.testnet(net, X, T, mean_top)
    assert value == pytest.approx(float(jnp.mean(jnp.max(net.predict(X).data, axis=-1))), rel=1e-6)


def test_scores2label():
    scores = np.array([[0.1, 0.7, 0.2], [0.5, 0.3, 0.2]])
    np.testing.assert_array_equal(df.scores2label(scores), [1, 0])
    np.testing.assert_array_equal(df.scores2label(scores, ["a", "b", "c"]), ["b", "a"])
    cb = df.dlarray(jnp.asarray(scores.T), "CB")
    np.testing.assert_array_equal(df.scores2label(cb), [1, 0])
    np.testing.assert_array_equal(
        df.scores2label(scores, mode="multilabel", threshold=0.3),
        [[False, True, False], [True, True, False]],
    )


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda net: df.minibatchpredict("net", np.ones((2, 4))), "net must be a df.Network"),
        (lambda net: df.minibatchpredict(net, np.ones((2, 4)), mini_batch_size=0), "positive"),
        (lambda net: df.minibatchpredict(net), "1 input"),
        (lambda net: df.testnet(net, np.ones((2, 4))), "takes \\(net, X, T, metrics\\)"),
        (lambda net: df.testnet(net, np.ones((2, 4)), np.zeros(2, int), "acc"), "unknown metric"),
        (lambda net: df.scores2label(np.ones((2, 3)), ["a"]), "1 class names for 3 classes"),
        (lambda net: df.scores2label(np.ones(3)), "no class axis"),
        (lambda net: df.scores2label(np.ones((2, 3)), mode="top"), "single-label"),
    ],
)
def test_errors(net, call, match):
    with pytest.raises(df.OptionsError, match=match):
        call(net)


def test_minibatchpredict_matches_jit_of_predict(net):
    X, _ = classification_data(20)
    expected = jax.jit(lambda x: net.predict(x).data)(X)
    np.testing.assert_allclose(
        df.minibatchpredict(net, X, mini_batch_size=8).data, expected, rtol=1e-6
    )


# -- data mistakes (issue 12 items 3, 7, 8, 10) ---------------------------------------------------


@pytest.mark.parametrize(
    "call, match",
    [
        (
            lambda net, X, T: df.testnet(net, X, T + 1, "accuracy"),
            r"testnet: .*class labels 1\.\.3.*MATLAB's 1-based class indices\. Fix: subtract one",
        ),
        (
            lambda net, X, T: df.testnet(net, X, np.where(T == 0, -1, T), ["crossentropy"]),
            r"class label -1, outside 0\.\.2",
        ),
        (
            lambda net, X, T: df.testnet(net, [(X[:8], T[:8] + 3)], "accuracy"),
            r"class label 5, outside 0\.\.2",
        ),
        (
            lambda net, X, T: df.testnet(net, list(X), T, "accuracy"),
            r"X is a list of 32 arrays of shape \(4,\).*np\.stack\(X\)",
        ),
        (
            lambda net, X, T: df.minibatchpredict(net, X * 1j),
            r"minibatchpredict: X is complex .*would drop the imaginary part",
        ),
        (lambda net, X, T: df.minibatchpredict(net, X[:0]), r"the inputs have no observations"),
        (lambda net, X, T: df.testnet(net, X[:0], T[:0], "accuracy"), r"no observations"),
        (lambda net, X, T: df.minibatchpredict(net, X.astype(str)), r"not numbers"),
    ],
    ids=[
        "1-based",
        "negative",
        "iterable",
        "per-observation",
        "complex",
        "empty",
        "empty-test",
        "strings",
    ],
)
def test_data_mistakes_are_named(net, call, match):
    X, T = classification_data(32)
    with pytest.raises(df.OptionsError, match=match):
        call(net, X, T)


def test_keyword_inputs_to_predict_and_forward_are_named(net):
    X, _ = classification_data(8)
    with pytest.raises(
        df.NetworkError,
        match=r"Network\.predict takes the inputs positionally, in the order of net\.input_names "
        r"\['in'\]; got keyword argument\(s\) \['x'\]\. Fix: net\.predict\(\*arrays\)",
    ):
        net.predict(x=X)
    with pytest.raises(df.NetworkError, match=r"Network\.forward takes the inputs positionally"):
        net.forward(X, inputs=X)

"""Tests of difffn/_sequence_predict.py: minibatchpredict and testnet on lists of sequences of
different lengths, against each sequence run alone, and the compiled traces they cost."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import difffn as df

L = df.layers
C = 2


def _data(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(n, C)).astype(np.float32) for n in lengths]


def _net(key, output_mode="last", attention=False):
    layers = [L.SequenceInput(C), L.LSTM(4, output_mode=output_mode)]
    if attention:
        layers.append(L.SelfAttention(2, 4))
    layers += [L.FullyConnected(3), L.Softmax()]
    return df.Network(layers).initialize(key=key)


def _alone(net, seqs):
    """Each sequence predicted on its own, unpadded."""
    return [np.asarray(net.predict(x[None]).data)[0] for x in seqs]


@pytest.mark.parametrize("direction", ["right", "left"])
def test_sequence_to_one_predictions_equal_each_sequence_alone(key, direction):
    X = _data([5, 1, 12, 7, 3])
    net = _net(key)
    y = df.minibatchpredict(net, X, mini_batch_size=2, sequence_padding_direction=direction)
    assert y.format == "BC" and y.shape == (5, 3)
    np.testing.assert_allclose(np.asarray(y.data), np.stack(_alone(net, X)), atol=1e-6)


@pytest.mark.parametrize("direction", ["right", "left"])
def test_sequence_to_sequence_predictions_with_attention(key, direction):
    """LSTM then SelfAttention per step: the padding is masked out of the recurrent state and
    out of the attended keys, so each sequence's outputs are its own, in either direction."""
    X = _data([4, 9, 2])
    net = _net(key, "sequence", attention=True)
    ys = df.minibatchpredict(net, X, uniform_output=False, sequence_padding_direction=direction)
    for y, want in zip(ys, _alone(net, X), strict=True):
        assert y.format == "TC"
        np.testing.assert_allclose(np.asarray(y.data), want, atol=1e-5)
    uniform = df.minibatchpredict(net, X, sequence_padding_value=np.nan,
                                  sequence_padding_direction=direction)  # fmt: skip
    assert uniform.format == "BTC" and uniform.shape == (3, 9, 3)
    data = np.asarray(uniform.data)
    short = data[2, :2] if direction == "right" else data[2, 7:]
    np.testing.assert_allclose(short, ys[2].data, atol=1e-6)
    assert np.isnan(data[2]).all(axis=1).sum() == 7


def test_truncated_predictions_keep_the_shortest_length(key):
    X = _data([5, 3])
    net = _net(key, "sequence")
    for direction, part in (("right", slice(0, 3)), ("left", slice(2, 5))):
        ys = df.minibatchpredict(net, X, sequence_length="shortest", uniform_output=False,
                                 sequence_padding_direction=direction)  # fmt: skip
        assert [y.shape[0] for y in ys] == [3, 3]
        np.testing.assert_allclose(ys[0].data, _alone(net, [X[0][part]])[0], atol=1e-6)


@pytest.mark.slow
def test_two_hundred_lengths_compile_a_handful_of_traces(key):
    """200 sequences of 200 different lengths, one per mini-batch: with power-of-two buckets
    the network compiles one trace per bucket (1, 2, 4, ..., 256: 9), counted by its cache."""
    lengths = np.random.default_rng(1).permutation(np.arange(1, 201))
    X = _data(lengths)
    net = _net(key)
    net.compile_cache.clear()
    y = df.minibatchpredict(net, X, mini_batch_size=1)
    info = net.cache_info()
    assert info.misses == 9 and info.hits == 191 and y.shape == (200, 3)
    net.compile_cache.clear()
    df.minibatchpredict(net, X[:50], mini_batch_size=1, sequence_bucketing=32)
    assert net.cache_info().misses == len({-(-n // 32) for n in lengths[:50]})
    net.compile_cache.clear()
    np.testing.assert_allclose(np.asarray(y.data)[:5], np.stack(_alone(net, X[:5])), atol=1e-6)


def test_without_buckets_every_length_is_a_trace_and_the_warning_says_so(key):
    X = _data(np.arange(1, 12))
    net = _net(key)
    net.compile_cache.clear()
    with pytest.warns(df.RetraceWarning, match="sequence lengths"):
        df.minibatchpredict(net, X, mini_batch_size=1, sequence_bucketing="none")
    assert net.cache_info().misses == 11


def test_testnet_scores_only_real_steps(key):
    X = _data([3, 6, 2, 5])
    T = [np.random.default_rng(i).integers(0, 3, size=len(x)) for i, x in enumerate(X)]
    net = _net(key, "sequence")
    results = df.testnet(net, X, T, ["accuracy", "crossentropy"], mini_batch_size=3)
    probs = np.concatenate(_alone(net, X))
    labels = np.concatenate(T)
    accuracy = 100 * np.mean(probs.argmax(axis=1) == labels)
    crossentropy = -np.mean(np.log(probs[np.arange(len(labels)), labels]))
    np.testing.assert_allclose(results["accuracy"], accuracy, rtol=1e-5)
    np.testing.assert_allclose(results["crossentropy"], crossentropy, rtol=1e-5)
    one = df.testnet(_net(key), X, np.array([0, 1, 2, 1]), "accuracy")
    probs = np.stack(_alone(_net(key), X))
    np.testing.assert_allclose(one, 100 * np.mean(probs.argmax(1) == [0, 1, 2, 1]))


def test_testnet_names_targets_of_the_wrong_kind(key):
    X = _data([3, 4])
    with pytest.raises(df.OptionsError, match=r"one per sequence, but T is given per time step"):
        df.testnet(_net(key), X, [np.zeros(3, np.int32), np.zeros(4, np.int32)], "accuracy")


def test_masked_predict_and_forward_on_the_network(key):
    """net.predict / net.forward take the mask of df.padsequences; a mask of the wrong size is
    named."""
    X = _data([6, 2, 4])
    net = _net(key)
    x, mask = df.padsequences(X, direction="left")
    np.testing.assert_allclose(np.asarray(net.predict(x, mask=mask).data),
                               np.stack(_alone(net, X)), atol=1e-6)  # fmt: skip
    y, state = net.forward(x, mask=jax.numpy.asarray(mask))
    np.testing.assert_allclose(np.asarray(y.data), np.stack(_alone(net, X)), atol=1e-6)
    with pytest.raises(df.NetworkError, match=r"mask of input .* has shape \(3, 5\); it must be"):
        net.predict(x, mask=mask[:, :5])

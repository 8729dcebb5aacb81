"""Tests of difffn/_batching/_minibatchqueue.py: df.minibatchqueue against plain-Python
references (order, shuffling with a key, partial batches, formats), and as trainnet's data."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import difffn as df


def _data(n=7):
    X = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
    return X, np.arange(n)


def _reference_batches(order, size, partial):
    """Plain Python: consecutive slices of ``order``; the short last one kept or dropped."""
    batches = [list(order[i : i + size]) for i in range(0, len(order), size)]
    if batches and len(batches[-1]) < size and partial == "discard":
        batches.pop()
    return batches


@pytest.mark.parametrize("partial", ["return", "discard"])
@pytest.mark.parametrize("size", [1, 3, 7, 10])
def test_batches_follow_the_observation_order(size, partial):
    X, T = _data()
    mbq = df.minibatchqueue((X, T), mini_batch_size=size, partial_mini_batch=partial)
    got = []
    while mbq.has_data():
        x, t = mbq.next()
        np.testing.assert_array_equal(x, X[np.asarray(t)])
        got.append(np.asarray(t).tolist())
    want = _reference_batches(list(range(7)), size, partial)
    assert got == want
    assert len(mbq) == len(want)
    with pytest.raises(df.OptionsError, match=r"no mini-batch left in this pass .*mbq\.reset\(\)"):
        mbq.next()
    mbq.reset()
    assert [np.asarray(t).tolist() for _, t in mbq] == want  # Python iteration: a new pass


def test_shuffle_draws_the_order_from_the_key(key):
    X, T = _data(10)
    want = np.asarray(jax.random.permutation(key, 10))  # the reference order
    mbq = df.minibatchqueue((X, T), mini_batch_size=4, shuffle=True, key=key)
    got = [np.asarray(t).tolist() for _, t in mbq]
    assert got == _reference_batches(want.tolist(), 4, "return")
    assert [np.asarray(t).tolist() for _, t in mbq] == got  # "once": the same order again
    other = jax.random.fold_in(key, 7)
    mbq.shuffle(other)  # MATLAB's shuffle(mbq): a new order, from the start
    reshuffled = np.concatenate([np.asarray(t) for _, t in mbq])
    np.testing.assert_array_equal(reshuffled, np.asarray(jax.random.permutation(other, 10)))


def test_every_epoch_shuffle_gives_each_pass_its_own_order(key):
    X, T = _data(10)
    mbq = df.minibatchqueue((X, T), mini_batch_size=5, shuffle="every-epoch", key=key)
    passes = [np.concatenate([np.asarray(t) for _, t in mbq]) for _ in range(3)]
    for n, order in enumerate(passes):
        want = jax.random.permutation(key if n == 0 else jax.random.fold_in(key, n), 10)
        np.testing.assert_array_equal(order, np.asarray(want))
        assert sorted(order.tolist()) == list(range(10))


def test_formats_and_the_mini_batch_function():
    X, T = _data(6)
    images = np.arange(6 * 2 * 2, dtype=np.float32).reshape(6, 2, 2, 1)

    def fcn(x, t):  # MATLAB's MiniBatchFcn: preprocess, one-hot encode
        return x / 10, jax.nn.one_hot(t, 6)

    mbq = df.minibatchqueue(
        (images, T), mini_batch_size=4, mini_batch_fcn=fcn, mini_batch_format=("BSSC", "BC")
    )
    x, t = mbq.next()
    assert (x.format, x.shape, t.format, t.shape) == ("BSSC", (4, 2, 2, 1), "BC", (4, 6))
    np.testing.assert_allclose(x.data, images[:4] / 10)
    np.testing.assert_array_equal(t.data, np.eye(6)[:4])
    single = df.minibatchqueue(X, mini_batch_size=4, mini_batch_format="BC")
    y = single.next()
    assert isinstance(y, df.FormattedArray) and y.format == "BC"
    np.testing.assert_array_equal(y.data, X[:4])


def test_lists_of_sequences_reach_the_function_as_lists():
    sequences = [np.ones((n, 2), np.float32) * n for n in (3, 5, 2, 4)]
    labels = np.array([0, 1, 0, 1])

    def pad(xs, t):
        longest = max(len(x) for x in xs)
        return np.stack([np.pad(x, ((0, longest - len(x)), (0, 0))) for x in xs]), t

    mbq = df.minibatchqueue(
        (sequences, labels), mini_batch_size=2, mini_batch_fcn=pad, mini_batch_format=("BTC", "")
    )
    shapes = [x.shape for x, _ in mbq]
    assert shapes == [(2, 5, 2), (2, 4, 2)]


def test_the_next_batch_is_prepared_while_the_caller_works():
    X, T = _data(9)
    seen = []

    def fcn(x, t):
        seen.append(int(np.asarray(t)[0]))
        return x, t

    mbq = df.minibatchqueue((X, T), mini_batch_size=3, mini_batch_fcn=fcn)
    first = mbq.next()
    mbq._ahead[1].result()  # the second batch was started by next(), before it was asked for
    assert seen == [0, 3]
    np.testing.assert_array_equal(mbq.next()[1], [3, 4, 5])
    assert seen[:2] == [0, 3] and first[1].tolist() == [0, 1, 2]


def test_outputs_are_on_the_device_or_host():
    X, T = _data(4)
    x, _ = df.minibatchqueue((X, T), mini_batch_size=2).next()
    assert isinstance(x, jax.Array)
    x, _ = df.minibatchqueue((X, T), mini_batch_size=2, output_environment="cpu").next()
    assert isinstance(x, np.ndarray)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(mini_batch_size=0), r"mini_batch_size must be a positive int; got 0"),
        (dict(partial_mini_batch="keep"), r"partial_mini_batch must be 'return' or 'discard'"),
        (dict(shuffle=True), r"shuffle='once' needs key"),
        (dict(shuffle="sometimes"), r"shuffle must be one of \['never', 'once', 'every-epoch'\]"),
        (dict(mini_batch_fcn=3), r"mini_batch_fcn must be a function"),
    ],
)
def test_bad_options_are_named_errors(kwargs, match):
    with pytest.raises(df.OptionsError, match=match):
        df.minibatchqueue(_data(), **kwargs)


def test_bad_data_and_failing_functions_are_named_errors():
    X, T = _data()
    with pytest.raises(df.OptionsError, match=r"different numbers of observations \[6, 7\]"):
        df.minibatchqueue((X, T[:6]))
    with pytest.raises(df.OptionsError, match=r"mini_batch_format .* does not give one format"):
        df.minibatchqueue((X, T), mini_batch_format="BC").next()
    broken = df.minibatchqueue((X, T), mini_batch_fcn=lambda x: x)
    with pytest.raises(df.OptionsError, match=r"mini_batch_fcn raised TypeError"):
        broken.next()


def test_trainnet_reads_the_queue_once_per_epoch_as_the_same_arrays_would(key):
    X = np.random.default_rng(0).standard_normal((12, 3)).astype(np.float32)
    T = np.random.default_rng(1).integers(0, 2, 12)
    layers = [df.layers.FeatureInput(3), df.layers.FullyConnected(2), df.layers.Softmax()]
    net = df.Network(layers).initialize(key=key)
    options = df.TrainingOptions(
        max_epochs=2, mini_batch_size=4, shuffle="never", verbose=False, l2_regularization=0.0
    )
    mbq = df.minibatchqueue((X, T), mini_batch_size=4, mini_batch_format=("BC", ""))
    from_queue, info = df.trainnet(mbq, net, "crossentropy", options)
    from_arrays, _ = df.trainnet(X, T, net, "crossentropy", options)
    assert len(info.training_history["loss"]) == 6  # 3 mini-batches in each of 2 epochs
    w_queue, w_arrays = from_queue.layers[1].weights, from_arrays.layers[1].weights
    np.testing.assert_allclose(w_queue, w_arrays, rtol=1e-5, atol=1e-6)
    assert not np.allclose(w_queue, net.layers[1].weights)


def test_a_custom_loop_with_the_queue_and_dlupdate_is_plain_sgd(key):
    X = jnp.asarray(np.random.default_rng(2).standard_normal((8, 3)), jnp.float32)
    T = jnp.asarray(np.random.default_rng(3).standard_normal((8, 1)), jnp.float32)
    net = df.Network([df.layers.FeatureInput(3), df.layers.FullyConnected(1)]).initialize(key=key)
    w, b = net.layers[1].weights, net.layers[1].bias
    mbq = df.minibatchqueue((X, T), mini_batch_size=4, mini_batch_format=("BC", ""))
    for _ in range(2):
        for x, t in mbq:
            grads = jax.grad(lambda n, x=x, t=t: df.losses.mse(n.predict(x), t))(net)
            net = df.dlupdate(lambda p, g: p - 0.1 * g, net, grads)
            # the same step by hand: half mean squared error over the mini-batch
            gw, gb = jax.grad(
                lambda w, b, x=x, t=t: 0.5 * jnp.sum((x.data @ w + b[None] - t) ** 2) / len(t),
                (0, 1),
            )(w, b)
            w, b = w - 0.1 * gw, b - 0.1 * gb
    np.testing.assert_allclose(net.layers[1].weights, w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(net.layers[1].bias, b, rtol=1e-5, atol=1e-6)

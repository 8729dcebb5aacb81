"""Tests of difffn/_sequence_source.py: trainnet on lists of sequences of different lengths.

The judge is an independent reference: each sequence run unpadded through a plain
``jax.lax.scan`` loop of MATLAB's GRU or LSTM equations (float64), its loss and gradients taken
with ``jax.grad``. trainnet's gradient is read from one plain SGD step (no momentum, no L2, learn
rate 1: the parameters move by minus the gradient).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_tree_allclose

import difffn as df
from difffn._batching import _sequences
from difffn._training import _step

L = df.layers
H, C, K = 3, 2, 2


def _data(lengths, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(n, C)).astype(dtype) for n in lengths]


def _params(kind, seed=1):
    rng = np.random.default_rng(seed)
    gates = 3 if kind == "gru" else 4
    return {
        "w": rng.normal(size=(C, gates * H)) / 2,
        "r": rng.normal(size=(H, gates * H)) / 2,
        "b": rng.normal(size=(gates * H,)) / 2,
        "fc_w": rng.normal(size=(H, K)),
        "fc_b": rng.normal(size=(K,)),
    }


def _gru_steps(p, x):
    """MATLAB's GRU (reset gate after the multiplication) over one unpadded sequence."""

    def step(h, x_t):
        zx, zh = x_t @ p["w"] + p["b"], h @ p["r"]
        reset = jax.nn.sigmoid(zx[:H] + zh[:H])
        update = jax.nn.sigmoid(zx[H : 2 * H] + zh[H : 2 * H])
        candidate = jnp.tanh(zx[2 * H :] + reset * zh[2 * H :])
        h = (1 - update) * candidate + update * h
        return h, h

    return jax.lax.scan(step, jnp.zeros(H, x.dtype), x)


def _lstm_steps(p, x):
    """MATLAB's LSTM (gates: input, forget, cell candidate, output) over one sequence."""

    def step(carry, x_t):
        h, c = carry
        z = x_t @ p["w"] + h @ p["r"] + p["b"]
        i, f, g, o = (z[k * H : (k + 1) * H] for k in range(4))
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (h, c), h

    (h, _), hs = jax.lax.scan(step, (jnp.zeros(H, x.dtype), jnp.zeros(H, x.dtype)), x)
    return h, hs


def _probabilities(p, h):
    z = h @ p["fc_w"]
    return jax.nn.softmax(z + jnp.broadcast_to(p["fc_b"], z.shape), axis=-1)


def _reference_loss(kind, per_step):
    """The mean cross-entropy over sequences (sequence-to-one) or over every real step."""
    steps = _gru_steps if kind == "gru" else _lstm_steps

    def loss(p, xs, ts):
        terms = []
        for x, t in zip(xs, ts, strict=True):
            h, hs = steps(p, jnp.asarray(x))
            if per_step:
                probs = _probabilities(p, hs)
                terms.append(-jnp.log(probs[jnp.arange(len(t)), t]))
            else:
                terms.append(-jnp.log(_probabilities(p, h)[t])[None])
        return jnp.mean(jnp.concatenate(terms))

    return loss


def _network(kind, p, output_mode, **states):
    recurrent = L.GRU if kind == "gru" else L.LSTM
    return [
        L.SequenceInput(C, name="in"),
        recurrent(H, output_mode=output_mode, input_weights=p["w"], recurrent_weights=p["r"],
                  bias=p["b"], name="rnn", **states),
        L.FullyConnected(K, weights=p["fc_w"], bias=p["fc_b"], name="fc"),
        L.Softmax(name="sm"),
    ]  # fmt: skip


def _one_sgd_step(X, T, net, **options):
    """trainnet's loss and gradient of one mini-batch holding every sequence."""
    options = df.TrainingOptions(
        "sgdm", momentum=0.0, l2_regularization=0.0, initial_learn_rate=1.0, max_epochs=1,
        mini_batch_size=len(X), shuffle="never", verbose=False, **options,
    )  # fmt: skip
    trained, info = df.trainnet(X, T, net, "crossentropy", options)
    before = df.Network(net).initialize(key=jax.random.key(0)).learnables
    after = trained.learnables
    grads = {k: np.asarray(before[k]) - np.asarray(after[k]) for k in before}
    return float(info.training_history["loss"][0]), grads


_NAMES = {"w": "rnn/input_weights", "r": "rnn/recurrent_weights", "b": "rnn/bias",
          "fc_w": "fc/weights", "fc_b": "fc/bias"}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "direction"), [("gru", "right"), ("lstm", "left")])
def test_sequence_to_one_loss_and_gradients_equal_unpadded_sequences(x64, kind, direction):
    """Padding (to the bucket of 16 steps) changes neither the loss nor any gradient: the
    recurrent state ignores padded steps on either side, and "last" is the last real step."""
    X = _data([5, 2, 9, 1, 6])
    T = np.array([0, 1, 1, 0, 1])
    p = _params(kind)
    loss, grads = _one_sgd_step(X, T, _network(kind, p, "last"),
                                sequence_padding_direction=direction)  # fmt: skip
    want, want_grads = jax.value_and_grad(_reference_loss(kind, per_step=False))(p, X, T)
    np.testing.assert_allclose(loss, want, rtol=1e-12)
    assert_tree_allclose(grads, {_NAMES[k]: np.asarray(v) for k, v in want_grads.items()},
                         rtol=1e-9, atol=1e-12)  # fmt: skip


@pytest.mark.slow
def test_sequence_to_sequence_loss_is_the_mean_over_real_steps(x64):
    X = _data([4, 7, 2])
    T = [np.random.default_rng(i).integers(0, K, size=len(x)) for i, x in enumerate(X)]
    p = _params("lstm")
    loss, grads = _one_sgd_step(X, T, _network("lstm", p, "sequence"))
    want, want_grads = jax.value_and_grad(_reference_loss("lstm", per_step=True))(p, X, T)
    np.testing.assert_allclose(loss, want, rtol=1e-12)
    assert_tree_allclose(grads, {_NAMES[k]: np.asarray(v) for k, v in want_grads.items()},
                         rtol=1e-9, atol=1e-12)  # fmt: skip


@pytest.mark.slow
def test_split_sequences_carry_the_state_from_chunk_to_chunk(x64):
    """sequence_length=3: one mini-batch of lengths up to 7 makes 3 iterations; the first
    one's loss is that of the first 3 steps (a fresh state), and predictions after training
    equal running whole sequences (the state carried through the chunks, in float64: a
    state left to its float32 default would round at each chunk boundary)."""
    X = _data([7, 2, 5])
    T = [np.random.default_rng(i).integers(0, K, size=len(x)) for i, x in enumerate(X)]
    p = _params("gru")
    options = df.TrainingOptions(
        "sgdm", momentum=0.0, l2_regularization=0.0, initial_learn_rate=1e-3, max_epochs=1,
        mini_batch_size=3, shuffle="never", verbose=False, sequence_length=3,
    )  # fmt: skip
    layers = _network("gru", p, "sequence", hidden_state=np.zeros((1, H)))
    net, info = df.trainnet(X, T, layers, "crossentropy", options)
    assert len(info.training_history) == 3
    first = _reference_loss("gru", per_step=True)(p, [x[:3] for x in X], [t[:3] for t in T])
    np.testing.assert_allclose(info.training_history["loss"][0], first, rtol=1e-12)
    chunked = df.minibatchpredict(net, X, sequence_length=3, uniform_output=False)
    whole = df.minibatchpredict(net, X, uniform_output=False)
    for a, b in zip(chunked, whole, strict=True):
        np.testing.assert_allclose(np.asarray(a.data), np.asarray(b.data), rtol=1e-12)


@pytest.mark.slow
def test_sequence_to_one_with_split_sequences_scores_only_observations_with_data(x64):
    """A chunk in which a sequence has no data leaves it out of the loss (its "last" output
    would repeat the previous chunk's)."""
    X = _data([6, 2])
    T = np.array([0, 1])
    p = _params("gru")
    loss, _ = _one_sgd_step(X, T, _network("gru", p, "last"), sequence_length=3)
    # the first chunk: both sequences have data; the loss uses their states after step 3 / 2
    h0, _ = _gru_steps(p, jnp.asarray(X[0][:3]))
    h1, _ = _gru_steps(p, jnp.asarray(X[1]))
    want = -(jnp.log(_probabilities(p, h0)[0]) + jnp.log(_probabilities(p, h1)[1])) / 2
    np.testing.assert_allclose(loss, want, rtol=1e-12)


@pytest.mark.slow
def test_training_compiles_one_step_per_length_bucket(key):
    """64 sequences of 64 different lengths, 8 mini-batches: the compiled step is traced once
    per bucket of the mini-batches' longest lengths (counted by a metric that runs at trace
    time and by the step's jit cache), not once per length."""
    lengths = np.random.default_rng(3).permutation(np.arange(1, 65))
    X = _data(lengths, dtype=np.float32)
    T = np.array([int(x[0, 0] > 0) for x in X])
    for bucketing in ("power-of-two", 16, "none"):
        traced = []

        def probe(Y, T, mask=None, traced=traced):  # a metric: Python runs once per trace
            traced.append(Y.shape)
            return jnp.zeros(())

        options = df.TrainingOptions(
            "adam", max_epochs=1, mini_batch_size=8, shuffle="never", verbose=False,
            metrics=probe, sequence_bucketing=bucketing,
        )  # fmt: skip
        net = [L.SequenceInput(C), L.GRU(2, output_mode="last"), L.FullyConnected(K),
               L.Softmax()]  # fmt: skip
        df.trainnet(X, T, net, "crossentropy", options, key=key)
        longest = lengths.reshape(8, 8).max(axis=1)
        buckets = {_sequences.bucket(int(n), bucketing) for n in longest}
        assert sorted({shape[0] for shape in traced}) == [8]
        assert len(traced) == len(buckets)
        steps = next(reversed(_step._CACHE.values()))
        jitted = [f for (name, _), f in steps._jitted.items() if name == "sequences"]
        assert sum(f._cache_size() for f in jitted) == len(buckets)
    assert len(buckets) == len(set(longest.tolist())) > 2  # "none": one per longest length


@pytest.mark.slow
def test_validation_on_sequences_uses_masks(x64):
    """Validation loss of per-step targets is the mean over real steps of the whole set."""
    X = _data([4, 7, 2, 5])
    T = [np.random.default_rng(i).integers(0, K, size=len(x)) for i, x in enumerate(X)]
    p = _params("lstm")
    options = df.TrainingOptions(
        "sgdm", initial_learn_rate=1e-300, max_epochs=1, mini_batch_size=2, shuffle="never",
        verbose=False, validation_data=(X, T), validation_frequency=1, metrics="accuracy",
    )  # fmt: skip
    _, info = df.trainnet(X, T, _network("lstm", p, "sequence"), "crossentropy", options)
    want = _reference_loss("lstm", per_step=True)(p, X, T)
    np.testing.assert_allclose(info.validation_history["loss"], float(want), rtol=1e-12)


def test_a_custom_loss_without_a_mask_is_named():
    X = _data([3, 4], dtype=np.float32)
    T = [np.zeros(3, np.int32), np.ones(4, np.int32)]
    net = [L.SequenceInput(C), L.LSTM(H), L.FullyConnected(K), L.Softmax()]

    def my_loss(Y, T):
        return df.losses.crossentropy(Y, T)

    options = df.TrainingOptions(max_epochs=1, mini_batch_size=2, verbose=False)
    with pytest.raises(df.OptionsError, match=r"loss 'my_loss' .* takes no mask.*mask=None"):
        df.trainnet(X, T, net, my_loss, options)

    def masked_loss(Y, T, mask=None):
        return df.losses.crossentropy(Y, T, mask=mask)

    _, info = df.trainnet(X, T, net, masked_loss, options)
    _, builtin = df.trainnet(X, T, net, "crossentropy", options)
    np.testing.assert_allclose(info.training_history["loss"], builtin.training_history["loss"])

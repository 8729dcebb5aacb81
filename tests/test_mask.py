"""Tests of difffn/_mask.py: padding masks in df.ops.lstm/gru, through networks to the layers
that read them (built-in and custom), and in the losses and metrics."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_tree_allclose

import difffn as df

L = df.layers
H, C = 3, 2


def _randn(shape, seed):
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape))


def _right_padded(lengths, steps, seed=0):
    rng = np.random.default_rng(seed)
    seqs = [rng.normal(size=(n, C)) for n in lengths]
    x = np.zeros((len(seqs), steps, C))
    for b, s in enumerate(seqs):
        x[b, : len(s)] = s
    mask = np.arange(steps)[None, :] < np.asarray(lengths)[:, None]
    return seqs, jnp.asarray(x), jnp.asarray(mask)


@pytest.mark.slow
@pytest.mark.parametrize("op", ["lstm", "gru"])
def test_masked_ops_equal_each_sequence_alone_with_gradients(x64, op):
    """The final state of a padded batch is each sequence's own (jit, float64), and so are the
    gradients of its sum with respect to the weights."""
    blocks = 4 if op == "lstm" else 3
    w, r, b = _randn((C, blocks * H), 1), _randn((H, blocks * H), 2), _randn((blocks * H,), 3)
    seqs, x, mask = _right_padded([4, 1, 6], 8)

    def final(w, r, b, x, mask):
        states = (jnp.zeros(H),) * (2 if op == "lstm" else 1)
        out = getattr(df.ops, op)(df.dlarray(x, "BTC"), *states, w, r, b, mask=mask)
        return out[1]

    padded = jax.jit(final)(w, r, b, x, mask)
    alone = jnp.concatenate([final(w, r, b, s[None], None) for s in seqs])
    np.testing.assert_allclose(padded, alone, rtol=1e-12)
    grads = jax.grad(lambda *p: jnp.sum(final(*p, x, mask)), argnums=(0, 1, 2))(w, r, b)
    want = jax.grad(
        lambda *p: sum(jnp.sum(final(*p, s[None], None)) for s in seqs), argnums=(0, 1, 2)
    )(w, r, b)
    assert_tree_allclose(grads, want, rtol=1e-10, atol=1e-12)


def test_mask_formats_and_errors_of_the_ops():
    w, r, b = _randn((C, 4 * H), 1), _randn((H, 4 * H), 2), _randn((4 * H,), 3)
    _, x, mask = _right_padded([2, 3], 3)
    h0 = jnp.zeros(H)
    want = df.ops.lstm(df.dlarray(x, "BTC"), h0, h0, w, r, b, mask=mask)[1]
    by_tb = df.ops.lstm(df.dlarray(jnp.swapaxes(x, 0, 1), "TBC"), h0, h0, w, r, b,
                        mask=df.dlarray(mask.T, "TB"))[1]  # fmt: skip
    np.testing.assert_allclose(by_tb, want, rtol=1e-6)
    one = df.ops.gru(x[1], h0, w[:, : 3 * H], r[:, : 3 * H], b[: 3 * H], fmt="TC",
                     mask=mask[0])[1]  # fmt: skip
    alone = df.ops.gru(x[1, :2], h0, w[:, : 3 * H], r[:, : 3 * H], b[: 3 * H], fmt="TC")[1]
    np.testing.assert_allclose(one, alone, rtol=1e-6)
    with pytest.raises(df.OpError, match=r"mask has shape \(2, 2\); expected \(batch, time\)"):
        df.ops.lstm(df.dlarray(x, "BTC"), h0, h0, w, r, b, mask=mask[:, :2])
    with pytest.raises(df.OpError, match=r"format 'BC' has no 'T' axis"):
        df.ops.lstm(df.dlarray(x[:, 0], "BC"), h0, h0, w, r, b, mask=mask)


class MaskReader(df.Layer):
    """A custom layer that reads the padding mask: zeros at padded steps."""

    def predict(self, x, *, mask=None):
        if mask is None:
            return x
        return x * mask[:, :, None]


@pytest.mark.slow
def test_the_mask_reaches_layers_that_take_it_while_batch_and_time_sizes_hold(key):
    """FullyConnected keeps "BTC", so the second recurrent layer and the custom layer still get
    the input's mask; after the GRU's "last" output there is no time axis and no mask."""
    seqs, x, mask = _right_padded([5, 2], 6)
    x = x.astype(jnp.float32)
    net = df.Network([
        L.SequenceInput(C), L.LSTM(H), L.FullyConnected(4), MaskReader(name="reader"),
        L.GRU(H, output_mode="last", name="gru"),
    ]).initialize(key=key)  # fmt: skip
    y_reader, y_gru = net.predict(x, mask=mask, outputs=["reader", "gru"])
    assert float(jnp.abs(y_reader.data[1, 2:]).max()) == 0.0
    for b, s in enumerate(seqs):
        alone = net.predict(jnp.asarray(s[None], jnp.float32), outputs=["gru"])
        np.testing.assert_allclose(y_gru.data[b], alone.data[0], atol=1e-6)


class MaskWithBackward(df.Layer):
    def predict(self, x, *, mask=None):
        return x

    def backward(self, x, y, dLdY, memory):
        return dLdY


def test_a_layer_with_its_own_backward_cannot_take_a_mask(key):
    _, x, mask = _right_padded([2, 3], 3)
    net = df.Network([L.SequenceInput(C), MaskWithBackward(name="mine")]).initialize(key=key)
    with pytest.raises(df.LayerError, match=r"takes a padding mask .* defines its own backward"):
        net.predict(x.astype(jnp.float32), mask=mask)


def test_masked_losses_are_means_over_real_steps():
    """Each loss with a mask equals the same loss on the real steps alone, each step one
    observation (numpy references)."""
    rng = np.random.default_rng(0)
    probs = rng.dirichlet([1.0, 1.0, 1.0], size=(3, 5)).astype(np.float32)
    labels = rng.integers(0, 3, size=(3, 5))
    target = rng.normal(size=(3, 5, 3)).astype(np.float32)
    mask = np.arange(5)[None, :] < np.array([[5], [2], [3]])
    Y = df.dlarray(probs, "BTC")
    real_p, real_l, real_t = probs[mask], labels[mask], target[mask]
    n = mask.sum()
    cases = {
        "crossentropy": (df.losses.crossentropy(Y, labels, mask=mask),
                         -np.log(real_p[np.arange(n), real_l]).mean()),
        "mse": (df.losses.mse(Y, target, mask=mask), 0.5 * ((real_p - real_t) ** 2).sum() / n),
        "l1loss": (df.losses.l1loss(Y, target, mask=mask), np.abs(real_p - real_t).sum() / n),
        "all-elements": (df.losses.l2loss(Y, target, mask=mask, normalization="all-elements"),
                         ((real_p - real_t) ** 2).mean()),
    }  # fmt: skip
    for name, (got, want) in cases.items():
        np.testing.assert_allclose(float(got), want, rtol=1e-5, err_msg=name)
    accuracy = df.metrics.Accuracy()(Y, labels, mask=mask)
    np.testing.assert_allclose(float(accuracy), 100 * np.mean(real_p.argmax(1) == real_l))
    rmse = df.metrics.RMSE()(Y, target, mask=mask)
    np.testing.assert_allclose(float(rmse), np.sqrt(((real_p - real_t) ** 2).mean()), rtol=1e-5)
    # per observation: a (batch,) mask drops whole sequences
    last = df.dlarray(probs[:, -1], "BC")
    np.testing.assert_allclose(
        float(df.losses.crossentropy(last, labels[:, -1], mask=np.array([True, False, True]))),
        -np.log(probs[[0, 2], -1][[0, 1], labels[[0, 2], -1]]).mean(), rtol=1e-6,
    )  # fmt: skip
    with pytest.raises(df.OptionsError, match=r"crossentropy: mask has shape \(3, 4\)"):
        df.losses.crossentropy(Y, labels, mask=mask[:, :4])

"""Layers: each built-in layer's jitted forward+backward against flax.nnx's module of its kind.

One row per layer: the gradient of ``sum(y * upstream)`` with respect to the input and every
learnable, jitted, for the difffn layer (through ``call_layer``: formats, state, checks) and for
the flax.nnx module with the same weights (``nnx.split`` / ``nnx.merge`` inside ``jax.jit``).
Where flax has no such module, the baseline is the same math written with ``jax.numpy``. The
ratio is difffn / baseline (target <= 1.1x). Sizes are modest: batch 32, 32 steps, 32 channels.

The PositionEmbedding row is a broadcast of a few kilobytes: both calls take tens of
microseconds, nearly all per-call dispatch, and difffn's passes a layer pytree and a formatted
array where the baseline passes two arrays, so its ratio measures that overhead, not the compiled
computation. SinusoidalPositionEncoding has no row: it has no learnables and its output does not
depend on the input's values, so there is no backward pass to time.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

import difffn as df
from difffn._layer import call_layer

from ._timing import compare, fmt_time, table

B, T, C, H = 32, 32, 32, 64


def _difffn_step(layer, x, upstream, argnums=(0, 1)):
    """A jitted forward+backward of a difffn layer, as a thunk."""

    @jax.jit
    def step(layer, x):
        def loss(layer, x):
            (y, *_), _ = call_layer(layer, (x,), training=True)
            return jnp.sum(df.stripdims(y) * upstream)

        return jax.grad(loss, argnums=argnums)(layer, x)

    return lambda: step(layer, x)


def _nnx_step(module, x, upstream, call=lambda m, x: m(x), argnums=(0, 1)):
    graphdef, params, rest = nnx.split(module, nnx.Param, ...)  # rest: RNG keys, not trained

    @jax.jit
    def step(params, rest, x):
        def loss(p, x):
            return jnp.sum(call(nnx.merge(graphdef, p, rest), x) * upstream)

        return jax.grad(loss, argnums=argnums)(params, x)

    return lambda: step(params, rest, x)


def _lstm_cell(w, r, b):
    cell = nnx.LSTMCell(w.shape[0], r.shape[0], rngs=nnx.Rngs(0))
    n = r.shape[0]
    pairs = zip((cell.ii, cell.if_, cell.ig, cell.io), (cell.hi, cell.hf, cell.hg, cell.ho))
    for k, (dense_i, dense_h) in enumerate(pairs):
        dense_i.kernel[...] = w[:, k * n : (k + 1) * n]
        dense_h.kernel[...] = r[:, k * n : (k + 1) * n]
        dense_h.bias[...] = b[k * n : (k + 1) * n]
    return cell


def _rows(key, x, upstream_of):
    """``(layer name, reference name, difffn thunk, reference thunk)`` per layer."""
    layout = df.Layout((None, T, C), "BTC")
    xf = df.dlarray(x, "BTC")
    zeros = lambda n: jnp.zeros((B, n))  # noqa: E731  (the layers' initial states: zeros)

    lstm = df.layers.LSTM(H).initialize(layout, key=key)
    up = upstream_of((B, T, H))
    yield (
        "LSTM",
        "nnx.RNN(LSTMCell)",
        _difffn_step(lstm, xf, up),
        _nnx_step(
            nnx.RNN(_lstm_cell(lstm.input_weights, lstm.recurrent_weights, lstm.bias)),
            x,
            up,
            lambda m, x: m(x, initial_carry=(zeros(H), zeros(H))),
        ),
    )

    gru = df.layers.GRU(H).initialize(layout, key=key)
    cell = nnx.GRUCell(C, H, rngs=nnx.Rngs(0))
    cell.dense_i.kernel[...] = gru.input_weights
    cell.dense_i.bias[...] = gru.bias
    cell.dense_h.kernel[...] = gru.recurrent_weights
    yield (
        "GRU",
        "nnx.RNN(GRUCell)",
        _difffn_step(gru, xf, up),
        _nnx_step(nnx.RNN(cell), x, up, lambda m, x: m(x, initial_carry=zeros(H))),
    )

    bilstm = df.layers.BiLSTM(H // 2).initialize(layout, key=key)
    w, r, b = bilstm.input_weights, bilstm.recurrent_weights, bilstm.bias
    half = 2 * H
    bidirectional = nnx.Bidirectional(
        nnx.RNN(_lstm_cell(w[:, :half], r[:, :half], b[:half])),
        nnx.RNN(_lstm_cell(w[:, half:], r[:, half:], b[half:])),
    )
    yield (
        "BiLSTM",
        "nnx.Bidirectional",
        _difffn_step(bilstm, xf, up),
        _nnx_step(
            bidirectional,
            x,
            up,
            lambda m, x: m(x, initial_carry=((zeros(H // 2),) * 2, (zeros(H // 2),) * 2)),
        ),
    )

    heads = 4
    attention = df.layers.SelfAttention(heads, C).initialize(layout, key=key)
    mha = nnx.MultiHeadAttention(heads, C, decode=False, rngs=nnx.Rngs(0))
    for name in ("query", "key", "value"):
        dense = getattr(mha, name)
        dense.kernel[...] = getattr(attention, f"{name}_weights").reshape(C, heads, -1)
        dense.bias[...] = getattr(attention, f"{name}_bias").reshape(heads, -1)
    mha.out.kernel[...] = attention.output_weights.reshape(heads, -1, C)
    mha.out.bias[...] = attention.output_bias
    up = upstream_of((B, T, C))
    yield (
        "SelfAttention",
        "nnx.MultiHeadAttention",
        _difffn_step(attention, xf, up),
        _nnx_step(mha, x, up, lambda m, x: m(x, deterministic=True)),
    )

    words = 1000
    embedding = df.layers.Embedding(C, words).initialize(df.Layout((None, T), "BT"), key=key)
    embed = nnx.Embed(words, C, rngs=nnx.Rngs(0))
    embed.embedding[...] = embedding.weights
    indices = jax.random.randint(key, (B, T), 0, words)
    yield (
        "Embedding",
        "nnx.Embed",
        _difffn_step(embedding, df.dlarray(indices, "BT"), up, argnums=0),
        _nnx_step(embed, indices, up, lambda m, i: m(i), argnums=0),
    )

    position = df.layers.PositionEmbedding(C, 2 * T).initialize(layout, key=key)

    @jax.jit
    def plain_position(weights, x):
        loss = lambda w, x: jnp.sum((jnp.broadcast_to(w[:T], x.shape) + 0 * x) * up)  # noqa: E731
        return jax.grad(loss, argnums=(0, 1))(weights, x)

    yield (
        "PositionEmbedding",
        "jax.numpy",
        _difffn_step(position, xf, up),
        lambda: plain_position(position.weights, x),
    )


def run(*, quick: bool = False) -> None:
    key = jax.random.key(0)
    rounds = 5 if quick else 15
    x = jax.random.normal(key, (B, T, C))
    upstream_of = lambda shape: jax.random.normal(jax.random.fold_in(key, 1), shape)  # noqa: E731
    rows = []
    for layer, reference, ours, theirs in _rows(key, x, upstream_of):
        timings = compare({"difffn": ours, "reference": theirs}, rounds=rounds)
        ratio = timings["difffn"].ratio_to(timings["reference"])
        noise = max(timings["difffn"].noise, timings["reference"].noise)
        rows.append(
            [
                layer,
                fmt_time(timings["difffn"].median_s),
                reference,
                fmt_time(timings["reference"].median_s),
                f"{ratio:5.2f}x",
                f"{noise * 100:4.1f}%",
            ]
        )
    print(f"\njitted forward+backward (input and learnables), batch {B}, {T} steps, {C} channels")
    print(table(rows, ["layer", "difffn", "baseline", "baseline time", "ratio", "noise"]))
    print("target: ratio <= 1.1x")

"""Layers: each built-in layer's jitted forward+backward against flax.nnx's module of its kind.

One row per layer: one ``jax.jit`` function computes ``jax.grad`` of ``sum(y * upstream)`` with
respect to the input(s) and every learnable (``upstream`` is an argument too, so that XLA cannot
fold a linear layer's input gradient into a constant). The difffn layer is a pytree passed to the
jitted function and run through ``call_layer`` (formats, state, checks); the flax.nnx module with
the same weights is split (``nnx.split``) and merged inside the jitted function, its state passed
as an argument. Where flax.nnx has no module of that kind (pooling, activations, resizing,
merging, position embedding) the baseline is the flax.nnx function (``nnx.avg_pool``,
``nnx.gelu``, ...), ``jax.image.resize`` or the same math written with ``jax.numpy``. The ratio is
difffn / baseline (target <= 1.1x). The XLA-flops column compares the two compiled programs
(XLA's cost analysis): 1.00x means the same computation, so a time ratio above 1 there is the
per-call cost of passing a layer pytree and formatted arrays, or noise.

The PositionEmbedding row is a broadcast of a few kilobytes: both calls take tens of
microseconds, nearly all per-call dispatch, so its ratio measures that overhead, not the compiled
computation. SinusoidalPositionEncoding has no row: it has no learnables and its output does not
depend on the input's values, so there is no backward pass to time.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

import difffn as df
from difffn._layer._layer import call_layer

from ._timing import compare, fmt_time, table

L = df.layers
B, T, C, H = 32, 32, 32, 64  # the sequence rows


def _difffn_step(layer, xs, upstream, argnums=(0, 1)):
    """The layer's jitted training-time forward+backward (BatchNorm uses batch statistics)."""

    @jax.jit
    def step(layer, xs, upstream):
        def loss(layer, xs):
            (y, *_), _ = call_layer(layer, xs, training=True)
            return jnp.sum(df.stripdims(y) * upstream)

        return jax.grad(loss, argnums=argnums)(layer, xs)

    return step, (layer, tuple(xs), upstream)


def _nnx_step(module, x, upstream, call=lambda m, x: m(x), argnums=(0, 1)):
    graphdef, params, rest = nnx.split(module, nnx.Param, ...)  # rest: statistics, RNG keys

    @jax.jit
    def step(params, rest, x, upstream):
        def loss(p, x):
            # rest rebuilt in this trace: BatchNorm writes its batch statistics into it, and
            # flax.nnx refuses to write a variable made in the enclosing jit's trace
            here = jax.tree.map(lambda v: v, rest)
            return jnp.sum(call(nnx.merge(graphdef, p, here), x) * upstream)

        return jax.grad(loss, argnums=argnums)(params, x)

    return step, (params, rest, x, upstream)


def _fn_step(fn, xs, upstream):
    """A function of the input(s) with no parameters, e.g. ``nnx.gelu``."""
    step = jax.jit(
        jax.grad(lambda xs, upstream: jnp.sum(fn(*xs) * upstream)),
    )
    return step, (tuple(xs), upstream)


def _flops(step, args) -> float:
    """The compiled program's floating-point operations, by XLA's cost analysis."""
    cost = step.lower(*args).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float((cost or {}).get("flops", 0.0))


def _copy(module, **values):
    for name, value in values.items():
        getattr(module, name)[...] = value
    return module


def _upstream(key, layer, xs):
    y = layer(*xs)
    y = y[0] if isinstance(y, tuple) else y  # BatchNorm also returns its state
    return jax.random.normal(jax.random.fold_in(key, 1), y.shape)


def _describe(x) -> str:
    return "x".join(map(str, x.shape)) + f":{df.dims(x)}"


def _image_rows(key, quick: bool):
    """Convolution, normalization, pooling, activations, merging, resizing."""
    rngs = nnx.Rngs(0)
    n = 8 if quick else 32
    image = jax.random.normal(key, (n, 16, 16, 16))
    seq = jax.random.normal(key, (n, 64, 16))
    volume = jax.random.normal(key, (n // 4 or 1, 8, 8, 8, 8))
    features = jax.random.normal(key, (n * 16, 64))

    def conv(layer, **options):
        w = layer.weights
        module = nnx.Conv(w.shape[-2], w.shape[-1], w.shape[:-2], rngs=rngs, **options)
        return _copy(module, kernel=w, bias=layer.bias)

    def norm(module):
        return lambda layer: _copy(module, bias=layer.offset, scale=layer.scale)

    def transposed(layer):
        module = nnx.ConvTranspose(
            16, 16, (4, 4), strides=2, padding="VALID", transpose_kernel=True, rngs=rngs
        )
        return _copy(module, kernel=layer.weights, bias=layer.bias)

    def resize(x):
        return jax.image.resize(x, (x.shape[0], 32, 32, 16), "linear", antialias=False)

    cases = [
        ("Conv1D", L.Conv1D(5, 32, padding="causal", dilation=2), (seq,), "BTC", "nnx.Conv",
         lambda l: conv(l, padding="CAUSAL", kernel_dilation=2)),
        ("Conv2D", L.Conv2D(3, 32, padding="same"), (image,), "BSSC", "nnx.Conv",
         lambda l: conv(l, padding="SAME")),
        ("Conv3D", L.Conv3D(3, 16, padding="same"), (volume,), "BSSSC", "nnx.Conv",
         lambda l: conv(l, padding="SAME")),
        ("TransposedConv2D", L.TransposedConv2D(4, 16, stride=2), (image,), "BSSC",
         "nnx.ConvTranspose", transposed),
        ("FullyConnected", L.FullyConnected(64), (features,), "BC", "nnx.Linear",
         lambda l: _copy(nnx.Linear(64, 64, rngs=rngs), kernel=l.weights, bias=l.bias)),
        ("BatchNorm (training)", L.BatchNorm(), (image,), "BSSC", "nnx.BatchNorm",
         norm(nnx.BatchNorm(16, momentum=0.9, epsilon=1e-5, use_fast_variance=False,
                            rngs=rngs))),
        ("LayerNorm", L.LayerNorm(), (seq,), "BTC", "nnx.LayerNorm",
         norm(nnx.LayerNorm(16, epsilon=1e-5, use_fast_variance=False, rngs=rngs))),
        ("GroupNorm", L.GroupNorm(4), (image,), "BSSC", "nnx.GroupNorm",
         norm(nnx.GroupNorm(16, num_groups=4, epsilon=1e-5, use_fast_variance=False, rngs=rngs))),
        ("InstanceNorm", L.InstanceNorm(), (image,), "BSSC", "nnx.GroupNorm",
         norm(nnx.GroupNorm(16, num_groups=16, epsilon=1e-5, use_fast_variance=False, rngs=rngs))),
        ("AveragePool2D", L.AveragePool2D(2, stride=2), (image,), "BSSC", "nnx.avg_pool",
         lambda l: lambda x: nnx.avg_pool(x, (2, 2), (2, 2))),
        ("GlobalMaxPool2D", L.GlobalMaxPool2D(), (image,), "BSSC", "nnx.max_pool",
         lambda l: lambda x: nnx.max_pool(x, (16, 16))),
        ("MaxPool1D", L.MaxPool1D(3, stride=2), (seq,), "BTC", "nnx.max_pool",
         lambda l: lambda x: nnx.max_pool(x, (3,), (2,))),
        ("AveragePool1D", L.AveragePool1D(2, stride=2), (seq,), "BTC", "nnx.avg_pool",
         lambda l: lambda x: nnx.avg_pool(x, (2,), (2,))),
        ("GlobalAveragePool1D", L.GlobalAveragePool1D(), (seq,), "BTC", "jax.numpy.mean",
         lambda l: lambda x: jnp.mean(x, axis=1)),
        ("GlobalMaxPool1D", L.GlobalMaxPool1D(), (seq,), "BTC", "jax.numpy.max",
         lambda l: lambda x: jnp.max(x, axis=1)),
        ("LeakyReLU", L.LeakyReLU(), (image,), "BSSC", "nnx.leaky_relu",
         lambda l: lambda x: nnx.leaky_relu(x, 0.01)),
        ("ClippedReLU", L.ClippedReLU(6.0), (image,), "BSSC", "nnx.relu6", lambda l: nnx.relu6),
        ("Tanh", L.Tanh(), (image,), "BSSC", "nnx.tanh", lambda l: nnx.tanh),
        ("Sigmoid", L.Sigmoid(), (image,), "BSSC", "nnx.sigmoid", lambda l: nnx.sigmoid),
        ("Swish", L.Swish(), (image,), "BSSC", "nnx.swish", lambda l: nnx.swish),
        ("GELU", L.GELU(), (image,), "BSSC", "nnx.gelu",
         lambda l: lambda x: nnx.gelu(x, approximate=False)),
        ("Multiplication", L.Multiplication(), (image, image), "BSSC", "jax.numpy",
         lambda l: lambda a, b: a * b),
        ("Resize2D (bilinear)", L.Resize2D(scale=2, method="bilinear"), (image,), "BSSC",
         "jax.image.resize", lambda l: resize),
        ("Identity", L.Identity(), (image,), "BSSC", "identity", lambda l: lambda x: x),
    ]  # fmt: skip
    for name, layer, xs, fmt, baseline, peer in cases:
        layout = df.Layout((None, *xs[0].shape[1:]), fmt)
        layer = layer.initialize(*[layout] * len(xs), key=key)
        formatted = [df.dlarray(x, fmt) for x in xs]
        up = _upstream(key, layer, formatted)
        target = peer(layer)
        theirs = (
            _nnx_step(target, xs[0], up)
            if isinstance(target, nnx.Module)
            else _fn_step(target, xs, up)
        )
        # A layer without learnables has no gradient to return, as the baseline function has
        # none: only the input's gradient is taken (the layer is still an argument).
        argnums = (0, 1) if jax.tree.leaves(layer) else 1
        ours = _difffn_step(layer, formatted, up, argnums)
        yield name, _describe(formatted[0]), baseline, ours, theirs


def _lstm_cell(w, r, b):
    cell = nnx.LSTMCell(w.shape[0], r.shape[0], rngs=nnx.Rngs(0))
    n = r.shape[0]
    pairs = zip((cell.ii, cell.if_, cell.ig, cell.io), (cell.hi, cell.hf, cell.hg, cell.ho))
    for k, (dense_i, dense_h) in enumerate(pairs):
        dense_i.kernel[...] = w[:, k * n : (k + 1) * n]
        dense_h.kernel[...] = r[:, k * n : (k + 1) * n]
        dense_h.bias[...] = b[k * n : (k + 1) * n]
    return cell


def _sequence_rows(key):
    """Recurrent, attention and embedding layers."""
    x = jax.random.normal(key, (B, T, C))
    layout = df.Layout((None, T, C), "BTC")
    xf = df.dlarray(x, "BTC")
    size = _describe(xf)
    zeros = lambda n: jnp.zeros((B, n))  # noqa: E731  (the layers' initial states: zeros)

    lstm = df.layers.LSTM(H).initialize(layout, key=key)
    up = _upstream(key, lstm, [xf])
    yield (
        "LSTM",
        size,
        "nnx.RNN(LSTMCell)",
        _difffn_step(lstm, [xf], up),
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
        size,
        "nnx.RNN(GRUCell)",
        _difffn_step(gru, [xf], up),
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
        size,
        "nnx.Bidirectional",
        _difffn_step(bilstm, [xf], up),
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
    up = _upstream(key, attention, [xf])
    yield (
        "SelfAttention",
        size,
        "nnx.MultiHeadAttention",
        _difffn_step(attention, [xf], up),
        _nnx_step(mha, x, up, lambda m, x: m(x, deterministic=True)),
    )

    words = 1000
    embedding = df.layers.Embedding(C, words).initialize(df.Layout((None, T), "BT"), key=key)
    embed = nnx.Embed(words, C, rngs=nnx.Rngs(0))
    embed.embedding[...] = embedding.weights
    indices = jax.random.randint(key, (B, T), 0, words)
    yield (
        "Embedding",
        _describe(df.dlarray(indices, "BT")),
        "nnx.Embed",
        _difffn_step(embedding, [df.dlarray(indices, "BT")], up, argnums=0),
        _nnx_step(embed, indices, up, lambda m, i: m(i), argnums=0),
    )

    position = df.layers.PositionEmbedding(C, 2 * T).initialize(layout, key=key)

    @jax.jit
    def plain_position(weights, x, up):
        loss = lambda w, x: jnp.sum((jnp.broadcast_to(w[:T], x.shape) + 0 * x) * up)  # noqa: E731
        return jax.grad(loss, argnums=(0, 1))(weights, x)

    yield (
        "PositionEmbedding",
        size,
        "jax.numpy",
        _difffn_step(position, [xf], up),
        (plain_position, (position.weights, x, up)),
    )


def run(*, quick: bool = False) -> None:
    key = jax.random.key(0)
    rounds = 5 if quick else 15
    rows, misses = [], []
    for name, size, baseline, ours, theirs in (*_image_rows(key, quick), *_sequence_rows(key)):
        steps = {"difffn": ours, "baseline": theirs}
        timings = compare(
            {n: (lambda f=f, a=a: f(*a)) for n, (f, a) in steps.items()}, rounds=rounds
        )
        flops = {n: _flops(f, a) for n, (f, a) in steps.items()}
        ratio = timings["difffn"].ratio_to(timings["baseline"])
        if ratio > 1.1:
            misses.append(f"{name} ({ratio:.2f}x)")
        rows.append(
            [
                name,
                size,
                fmt_time(timings["difffn"].median_s),
                baseline,
                fmt_time(timings["baseline"].median_s),
                f"{ratio:5.2f}x",
                f"{max(timings['difffn'].noise, timings['baseline'].noise) * 100:4.1f}%",
                f"{flops['difffn'] / flops['baseline']:5.2f}x" if flops["baseline"] else "n/a",
            ]
        )
    header = [
        "layer",
        "input",
        "difffn",
        "baseline",
        "baseline time",
        "ratio",
        "noise",
        "XLA flops",
    ]
    print("\njitted forward+backward (gradients of the input(s) and learnables), float32")
    print(table(rows, header))
    print(f"target <= 1.1x; missed by: {', '.join(misses) if misses else 'none'}")

"""Layers: each built-in layer's jitted forward+backward against flax.nnx's module of the same kind.

For every pair, one ``jax.jit`` function computes ``jax.grad`` of ``sum(layer(x) * upstream)``
with respect to the parameters and the input (``upstream`` is an argument too, so that XLA cannot
fold a linear layer's input gradient into a constant): the difffn layer is a pytree passed to the
jitted function; the flax.nnx module is split (``nnx.split``) and merged inside it, its state
passed as an argument. Where flax.nnx has no module of that kind
(pooling, activations, resizing, merging) the peer is the flax.nnx function (``nnx.avg_pool``,
``nnx.gelu``, ...) or ``jax.image.resize``, in the same jitted gradient. Target: difffn / flax
<= 1.1x.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import difffn as df

from ._timing import compare, fmt_time, table

L = df.layers


def _nnx_step(module, x, upstream):
    from flax import nnx

    graphdef, params = nnx.split(module)

    @jax.jit
    def step(params, x, upstream):
        def loss(params, x):
            return jnp.sum(nnx.merge(graphdef, params)(x) * upstream)

        return jax.grad(loss, argnums=(0, 1))(params, x)

    return step, (params, x, upstream)


def _fn_step(fn, x, upstream):
    step = jax.jit(jax.grad(lambda x, upstream: jnp.sum(fn(x) * upstream)))
    return step, (x, upstream)


def _difffn_step(layer, xs, fmt, upstream):
    """The layer's jitted training-time forward+backward (BatchNorm uses batch statistics)."""
    from difffn._layer import call_layer

    @jax.jit
    def step(layer, xs, upstream):
        def loss(layer, xs):
            (y, *_), _ = call_layer(layer, [df.dlarray(x, fmt) for x in xs], training=True)
            return jnp.sum(y.data * upstream)

        return jax.grad(loss, argnums=(0, 1))(layer, xs)

    return step, (layer, xs, upstream)


def _flops(step, args) -> float:
    """The compiled program's floating-point operations, by XLA's cost analysis."""
    cost = step.lower(*args).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float((cost or {}).get("flops", 0.0))


def _copy(module, **values):
    for name, value in values.items():
        getattr(module, name)[...] = value
    return module


def _cases(quick: bool):
    """(name, difffn layer, inputs, format, a function of the initialized layer -> flax thunk)."""
    from flax import nnx

    rngs = nnx.Rngs(0)
    n = 8 if quick else 32
    key = jax.random.key(1)
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

    return [
        ("Conv1D", L.Conv1D(5, 32, padding="causal", dilation=2), (seq,), "BTC",
         lambda l: conv(l, padding="CAUSAL", kernel_dilation=2)),
        ("Conv2D", L.Conv2D(3, 32, padding="same"), (image,), "BSSC",
         lambda l: conv(l, padding="SAME")),
        ("Conv3D", L.Conv3D(3, 16, padding="same"), (volume,), "BSSSC",
         lambda l: conv(l, padding="SAME")),
        ("TransposedConv2D", L.TransposedConv2D(4, 16, stride=2), (image,), "BSSC",
         lambda l: _copy(
             nnx.ConvTranspose(16, 16, (4, 4), strides=2, padding="VALID", transpose_kernel=True,
                               rngs=rngs), kernel=l.weights, bias=l.bias)),
        ("FullyConnected", L.FullyConnected(64), (features,), "BC",
         lambda l: _copy(nnx.Linear(64, 64, rngs=rngs), kernel=l.weights, bias=l.bias)),
        ("BatchNorm (training)", L.BatchNorm(), (image,), "BSSC", None),
        ("LayerNorm", L.LayerNorm(), (seq,), "BTC",
         norm(nnx.LayerNorm(16, epsilon=1e-5, use_fast_variance=False, rngs=rngs))),
        ("GroupNorm", L.GroupNorm(4), (image,), "BSSC",
         norm(nnx.GroupNorm(16, num_groups=4, epsilon=1e-5, use_fast_variance=False, rngs=rngs))),
        ("InstanceNorm", L.InstanceNorm(), (image,), "BSSC",
         norm(nnx.GroupNorm(16, num_groups=16, epsilon=1e-5, use_fast_variance=False, rngs=rngs))),
        ("AveragePool2D", L.AveragePool2D(2, stride=2), (image,), "BSSC",
         lambda l: lambda x: nnx.avg_pool(x, (2, 2), (2, 2))),
        ("GlobalMaxPool2D", L.GlobalMaxPool2D(), (image,), "BSSC",
         lambda l: lambda x: nnx.max_pool(x, (16, 16))),
        ("LeakyReLU", L.LeakyReLU(), (image,), "BSSC",
         lambda l: lambda x: nnx.leaky_relu(x, 0.01)),
        ("ClippedReLU", L.ClippedReLU(6.0), (image,), "BSSC", lambda l: nnx.relu6),
        ("Tanh", L.Tanh(), (image,), "BSSC", lambda l: nnx.tanh),
        ("Sigmoid", L.Sigmoid(), (image,), "BSSC", lambda l: nnx.sigmoid),
        ("Swish", L.Swish(), (image,), "BSSC", lambda l: nnx.swish),
        ("GELU", L.GELU(), (image,), "BSSC", lambda l: lambda x: nnx.gelu(x, approximate=False)),
        ("Multiplication", L.Multiplication(), (image, image), "BSSC", None),
        ("Resize2D (bilinear)", L.Resize2D(scale=2, method="bilinear"), (image,), "BSSC",
         lambda l: lambda x: jax.image.resize(x, (x.shape[0], 32, 32, 16), "linear",
                                              antialias=False)),
        ("Identity", L.Identity(), (image,), "BSSC", lambda l: lambda x: x),
    ]  # fmt: skip


def _peer(name, peer, layer, xs, upstream):
    from flax import nnx

    if name.startswith("BatchNorm"):
        module = nnx.BatchNorm(
            16, momentum=0.9, epsilon=1e-5, use_fast_variance=False, rngs=nnx.Rngs(0)
        )
        return _nnx_step(_copy(module, bias=layer.offset, scale=layer.scale), xs[0], upstream)
    if name == "Multiplication":
        step = jax.jit(jax.grad(lambda a, b, u: jnp.sum(a * b * u), argnums=(0, 1)))
        return step, (*xs, upstream)
    target = peer(layer)
    if isinstance(target, nnx.Module):
        return _nnx_step(target, xs[0], upstream)
    return _fn_step(target, xs[0], upstream)


def run(*, quick: bool = False) -> None:
    rounds = 5 if quick else 15
    rows, misses = [], []
    for name, layer, xs, fmt, peer in _cases(quick):
        layouts = [df.Layout((None, *x.shape[1:]), fmt) for x in xs]
        layer = layer.initialize(*layouts, key=jax.random.key(0))
        y = layer(*(df.dlarray(x, fmt) for x in xs))
        y = y[0] if isinstance(y, tuple) else y  # BatchNorm also returns its state
        upstream = jax.random.normal(jax.random.key(2), y.shape)
        steps = {
            "difffn": _difffn_step(layer, xs, fmt, upstream),
            "flax": _peer(name, peer, layer, xs, upstream),
        }
        timings = compare(
            {n: (lambda f=f, a=a: f(*a)) for n, (f, a) in steps.items()}, rounds=rounds
        )
        flops = {n: _flops(f, a) for n, (f, a) in steps.items()}
        ours, theirs = timings["difffn"], timings["flax"]
        ratio = ours.ratio_to(theirs)
        if ratio > 1.1:
            misses.append(f"{name} ({ratio:.2f}x)")
        rows.append(
            [
                name,
                "x".join(map(str, xs[0].shape)) + f":{fmt}",
                fmt_time(ours.median_s),
                fmt_time(theirs.median_s),
                f"{ratio:5.2f}x",
                f"{max(ours.noise, theirs.noise) * 100:4.1f}%",
                f"{flops['difffn'] / flops['flax']:5.2f}x" if flops["flax"] else "n/a",
            ]
        )
    print("\njitted forward+backward (gradients of parameters and input), float32")
    print(table(rows, ["layer", "input", "difffn", "flax peer", "ratio", "noise", "XLA flops"]))
    print(f"target <= 1.1x; missed by: {', '.join(misses) if misses else 'none'}")
    print(
        "XLA flops: difffn's compiled program over flax's (XLA's cost analysis); 1.00x means the "
        "same computation, so a time ratio above 1 there is the per-call cost of passing the "
        "layer as a pytree, or noise."
    )

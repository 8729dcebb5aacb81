"""Network: per-call cost of a cached net.predict, and a custom-backward layer's gradient step.

1. ``net.predict`` on a cache hit, for a small MLP (the call is dominated by dispatch), against
   the same network function through a bare ``jax.jit`` (target: <= 1.2x, and within 15 us of
   the hand-written jit: the cost of difffn's input checks and trace cache), and, as measured
   peers, the same math hand-written for ``jax.jit`` (no network objects to flatten), an
   equivalent equinox model under ``equinox.filter_jit`` and a flax.nnx model under ``nnx.jit``.
2. A jitted gradient step of a custom layer with a hand-written backward (SReLU) against the same
   layer without it (JAX autodiff of the same predict).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import difffn as df

from ._examples import load
from ._timing import compare, fmt_time, table

SIZES = (32, 64, 64, 10)


def _difffn_mlp(key):
    layers = [df.layers.FeatureInput(SIZES[0], normalization="none", name="in")]
    for i, n in enumerate(SIZES[1:]):
        layers.append(df.layers.FullyConnected(n, name=f"fc{i}"))
        if i < len(SIZES) - 2:
            layers.append(df.layers.ReLU(name=f"relu{i}"))
    return df.Network(layers).initialize(key=key)


def _bare(net):
    """The same MLP as a plain function of its parameters, under jax.jit."""
    params = [
        (net.learnables[f"fc{i}/weights"], net.learnables[f"fc{i}/bias"])
        for i in range(len(SIZES) - 1)
    ]

    @jax.jit
    def apply(params, x):
        for i, (w, b) in enumerate(params):
            x = x @ w + b[None, :]
            if i < len(params) - 1:
                x = jax.nn.relu(x)
        return x

    return lambda x: apply(params, x)


@jax.jit
def _apply_layers(layers, x):
    """A user's own model function: it calls difffn layers on a formatted array."""
    y = df.dlarray(x, "BC")
    for layer in layers:
        y = layer(y)
    return df.stripdims(y)


def _model_function(net):
    """The network's layers (FullyConnected, ReLU; not the input layer) in ``_apply_layers``."""
    layers = tuple(net.layers[1:])
    return lambda x: _apply_layers(layers, x)


def _equinox(key):
    import equinox as eqx

    keys = jax.random.split(key, len(SIZES) - 1)
    layers = []
    for i, (n_in, n_out) in enumerate(zip(SIZES, SIZES[1:])):
        layers.append(eqx.nn.Linear(n_in, n_out, key=keys[i]))
        if i < len(SIZES) - 2:
            layers.append(eqx.nn.Lambda(jax.nn.relu))
    model = eqx.nn.Sequential(layers)
    apply = eqx.filter_jit(lambda m, x: jax.vmap(m)(x))
    return lambda x: apply(model, x)


def _nnx():
    from flax import nnx

    class MLP(nnx.Module):
        def __init__(self, rngs):
            self.layers = nnx.List([nnx.Linear(a, b, rngs=rngs) for a, b in zip(SIZES, SIZES[1:])])

        def __call__(self, x):
            for i, layer in enumerate(self.layers):
                x = layer(x)
                if i < len(self.layers) - 1:
                    x = jax.nn.relu(x)
            return x

    model = MLP(nnx.Rngs(0))
    apply = nnx.jit(lambda m, x: m(x))
    return lambda x: apply(model, x)


class _SReLULayer(df.Layer):
    """SReLU with per-channel parameters, using the example's DifferentiableFunction."""

    tl: jax.Array | None = df.learnable(default=None)
    al: jax.Array | None = df.learnable(default=None)
    tr: jax.Array | None = df.learnable(default=None)
    ar: jax.Array | None = df.learnable(default=None)

    def predict(self, x):
        return jnp.where(
            x <= self.tl,
            self.tl + self.al * (x - self.tl),
            jnp.where(x >= self.tr, self.tr + self.ar * (x - self.tr), x),
        )


class _SReLULayerWithBackward(_SReLULayer):
    def backward(self, x, y, dy, memory):
        fcn = load("01_srelu_function").SReLUFunction("BSSC")
        return fcn.backward(dy, (True,) * 5, x, self.tl, self.al, self.tr, self.ar)


def run(*, quick: bool = False) -> None:
    key = jax.random.key(0)
    rounds = 5 if quick else 15
    net = _difffn_mlp(key)
    x = jax.random.normal(key, (8, SIZES[0]))
    from difffn._network._execute import execute

    same_function = jax.jit(
        lambda n, x: execute(
            n, (df.dlarray(x, "BC"),), None, training=False, wanted=n._graph.outputs
        )[0][0]
    )
    candidates = {
        "net.predict (cache hit)": lambda: net.predict(x),
        "bare jax.jit": lambda x: same_function(net, x),
        "Layer.__call__ in a jitted model function": _model_function(net),
        "hand-written jax.jit": _bare(net),
        "equinox.filter_jit": _equinox(key),
        "flax.nnx.jit": _nnx(),
    }
    wrapped = {
        name: (lambda f=f: f(x)) if name != "net.predict (cache hit)" else f
        for name, f in candidates.items()
    }
    timings = compare(wrapped, rounds=rounds, min_round_s=0.05)
    base = timings["bare jax.jit"]
    rows = [
        [n, fmt_time(t.median_s), f"{t.ratio_to(base):5.2f}x", f"{t.noise * 100:4.1f}%"]
        for n, t in timings.items()
    ]
    print(f"\nper-call time, MLP {SIZES}, batch 8")
    print(table(rows, ["call", "time/call", "vs bare jit", "noise"]))
    ours, hand = timings["net.predict (cache hit)"], timings["hand-written jax.jit"]
    print(
        f"target: net.predict / bare jax.jit = {ours.ratio_to(base):.2f}x (<= 1.2x); "
        f"net.predict - hand-written = {(ours.median_s - hand.median_s) * 1e6:.1f} us (<= 15 us)"
    )
    called = timings["Layer.__call__ in a jitted model function"]
    print(
        f"target: layers in a jitted model function - hand-written = "
        f"{(called.median_s - hand.median_s) * 1e6:.1f} us (<= 15 us)"
    )

    shape = (16, 14, 14, 8) if quick else (64, 28, 28, 32)
    ones = jnp.ones((1, 1, 1, shape[-1]))
    params = dict(tl=-0.5 * ones, al=0.1 * ones, tr=0.5 * ones, ar=0.1 * ones)
    xs = jax.random.normal(key, shape)
    upstream = jax.random.normal(jax.random.fold_in(key, 1), shape)

    def step(layer, x):
        return jax.grad(lambda l, x: jnp.sum(l(x) * upstream), (0, 1))(layer, x)

    custom = _SReLULayerWithBackward(**params)
    plain = _SReLULayer(**params)
    step_jit = jax.jit(step)
    timings = compare(
        {"custom backward": lambda: step_jit(custom, xs), "autodiff": lambda: step_jit(plain, xs)},
        rounds=rounds,
    )
    ratio = timings["autodiff"].ratio_to(timings["custom backward"])
    print(f"\ngradient step of an SReLU layer on {shape} float32 (inputs and learnables)")
    for name, t in timings.items():
        print(f"  {name:<16} {fmt_time(t.median_s)}  noise {t.noise * 100:4.1f}%")
    print(f"  autodiff / custom backward = {ratio:.2f}x")

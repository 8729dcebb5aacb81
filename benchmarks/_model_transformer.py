"""The transformer encoder of ``bench_models``, written four times with the same parameters.

Sequence classification: ``layers`` post-norm encoder blocks (multi-head self-attention, residual,
layer normalization; a GELU feed-forward block four times as wide, residual, layer
normalization) over vector sequences ``(batch, steps, width)``, then the mean over time, a fully
connected layer and softmax. difffn builds and initializes it; the hand-written, flax.nnx and
equinox versions copy difffn's initial learnables, so every framework starts from the same
numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

import difffn as df

CLASSES = 10


@dataclass(frozen=True)
class Sizes:
    layers: int
    heads: int
    width: int
    steps: int
    batch: int


FULL = Sizes(layers=4, heads=4, width=128, steps=128, batch=32)
QUICK = Sizes(layers=1, heads=2, width=8, steps=6, batch=4)


def data(sizes: Sizes, batches: int, seed: int = 0):
    """Synthetic sequences ``(N, steps, width)`` and integer labels."""
    rng = np.random.default_rng(seed)
    n = batches * sizes.batch
    X = rng.standard_normal((n, sizes.steps, sizes.width), dtype=np.float32)
    return X, rng.integers(0, CLASSES, n).astype(np.int32)


# -- difffn ---------------------------------------------------------------------------------------


def _mean_over_time(x):
    """``"BTC"`` -> ``"BC"``: the sequence's summary for classification."""
    (t,) = df.finddim(x, "T")
    return df.dlarray(jnp.mean(df.stripdims(x), axis=t), "BC")


def difffn_network(sizes: Sizes) -> df.Network:
    L = df.layers
    chain = [L.SequenceInput(sizes.width, name="input")]
    connections, block_input = [], "input"
    for i in range(sizes.layers):
        b = f"l{i}"
        chain += [
            L.SelfAttention(sizes.heads, sizes.width, name=f"{b}_attn"),
            L.Addition(name=f"{b}_add1"),
            L.LayerNorm(name=f"{b}_ln1"),
            L.FullyConnected(4 * sizes.width, name=f"{b}_fc1"),
            L.GELU(name=f"{b}_gelu"),
            L.FullyConnected(sizes.width, name=f"{b}_fc2"),
            L.Addition(name=f"{b}_add2"),
            L.LayerNorm(name=f"{b}_ln2"),
        ]
        connections += [(block_input, f"{b}_add1/in2"), (f"{b}_ln1", f"{b}_add2/in2")]
        block_input = f"{b}_ln2"
    chain += [
        L.FunctionLayer(_mean_over_time, formattable=True, name="pool"),
        L.FullyConnected(CLASSES, name="fc"),
        L.Softmax(name="softmax"),
    ]
    net = df.Network(chain, connections=connections)
    return net.initialize(key=jax.random.key(0))


# -- hand-written jax -----------------------------------------------------------------------------


def _dense(x, p):
    return x @ p["weights"] + p["bias"]


def _layernorm(x, p):
    mean, var = jnp.mean(x, axis=-1, keepdims=True), jnp.var(x, axis=-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + 1e-5) * p["scale"] + p["offset"]


def _attention(x, p, heads):
    def project(w, b):
        y = x @ p[w] + p[b]
        return y.reshape(*y.shape[:-1], heads, -1)  # heads: contiguous channel groups

    q, k, v = (project(f"{n}_weights", f"{n}_bias") for n in ("query", "key", "value"))
    a = jax.nn.dot_product_attention(q, k, v)
    return a.reshape(*x.shape[:-1], -1) @ p["output_weights"] + p["output_bias"]


def hand_written_forward(sizes: Sizes):
    """``forward(params, state, x) -> (probabilities, state)`` over ``{layer: {name: array}}``."""

    def forward(params, state, x):
        for i in range(sizes.layers):
            b = f"l{i}"
            x = _layernorm(x + _attention(x, params[f"{b}_attn"], sizes.heads), params[f"{b}_ln1"])
            y = _dense(
                jax.nn.gelu(_dense(x, params[f"{b}_fc1"]), approximate=False), params[f"{b}_fc2"]
            )
            x = _layernorm(x + y, params[f"{b}_ln2"])
        logits = _dense(jnp.mean(x, axis=1), params["fc"])
        return jax.nn.softmax(logits, axis=-1), state

    return forward


# -- flax.nnx -------------------------------------------------------------------------------------


def nnx_model(sizes: Sizes, params):
    from flax import nnx

    heads, width = sizes.heads, sizes.width
    split = width // heads

    def linear(cin, cout, p):
        layer = nnx.Linear(cin, cout, rngs=nnx.Rngs(0))
        layer.kernel[...], layer.bias[...] = p["weights"], p["bias"]
        return layer

    def layernorm(p):
        layer = nnx.LayerNorm(width, epsilon=1e-5, rngs=nnx.Rngs(0))
        layer.scale[...], layer.bias[...] = p["scale"], p["offset"]
        return layer

    def attention(p):
        layer = nnx.MultiHeadAttention(
            heads, width, qkv_features=width, out_features=width, decode=False, rngs=nnx.Rngs(0)
        )
        for name in ("query", "key", "value"):
            proj = getattr(layer, name)
            proj.kernel[...] = p[f"{name}_weights"].reshape(width, heads, split)
            proj.bias[...] = p[f"{name}_bias"].reshape(heads, split)
        layer.out.kernel[...] = p["output_weights"].reshape(heads, split, width)
        layer.out.bias[...] = p["output_bias"]
        return layer

    class Block(nnx.Module):
        def __init__(self, b):
            self.attn = attention(params[f"{b}_attn"])
            self.ln1 = layernorm(params[f"{b}_ln1"])
            self.fc1 = linear(width, 4 * width, params[f"{b}_fc1"])
            self.fc2 = linear(4 * width, width, params[f"{b}_fc2"])
            self.ln2 = layernorm(params[f"{b}_ln2"])

        def __call__(self, x):
            x = self.ln1(x + self.attn(x))
            return self.ln2(x + self.fc2(jax.nn.gelu(self.fc1(x), approximate=False)))

    class Encoder(nnx.Module):
        def __init__(self):
            self.blocks = nnx.List([Block(f"l{i}") for i in range(sizes.layers)])
            self.fc = linear(width, CLASSES, params["fc"])

        def __call__(self, x):
            for block in self.blocks:
                x = block(x)
            return jax.nn.softmax(self.fc(jnp.mean(x, axis=1)), axis=-1)

    return Encoder()


# -- equinox --------------------------------------------------------------------------------------


def equinox_model(sizes: Sizes, params):
    """``(model, state)``; the model maps one sequence ``(steps, width)``."""
    import equinox as eqx

    key = jax.random.key(0)
    width = sizes.width

    def linear(cin, cout, p):
        layer = eqx.nn.Linear(cin, cout, key=key)
        return eqx.tree_at(lambda m: (m.weight, m.bias), layer, (p["weights"].T, p["bias"]))

    def layernorm(p):
        layer = eqx.nn.LayerNorm(width, eps=1e-5)
        return eqx.tree_at(lambda m: (m.weight, m.bias), layer, (p["scale"], p["offset"]))

    def attention(p):
        layer = eqx.nn.MultiheadAttention(
            sizes.heads,
            width,
            use_query_bias=True,
            use_key_bias=True,
            use_value_bias=True,
            use_output_bias=True,
            key=key,
        )
        names = {"query": "query_proj", "key": "key_proj", "value": "value_proj"}
        names["output"] = "output_proj"
        for name, proj in names.items():
            new = (p[f"{name}_weights"].T, p[f"{name}_bias"])
            layer = eqx.tree_at(
                lambda m, proj=proj: (getattr(m, proj).weight, getattr(m, proj).bias), layer, new
            )
        return layer

    class Block(eqx.Module):
        attn: eqx.nn.MultiheadAttention
        ln1: eqx.nn.LayerNorm
        fc1: eqx.nn.Linear
        fc2: eqx.nn.Linear
        ln2: eqx.nn.LayerNorm

        def __init__(self, b):
            self.attn = attention(params[f"{b}_attn"])
            self.ln1 = layernorm(params[f"{b}_ln1"])
            self.fc1 = linear(width, 4 * width, params[f"{b}_fc1"])
            self.fc2 = linear(4 * width, width, params[f"{b}_fc2"])
            self.ln2 = layernorm(params[f"{b}_ln2"])

        def __call__(self, x):  # (steps, width)
            x = jax.vmap(self.ln1)(x + self.attn(x, x, x))
            y = jax.vmap(self.fc2)(jax.nn.gelu(jax.vmap(self.fc1)(x), approximate=False))
            return jax.vmap(self.ln2)(x + y)

    class Encoder(eqx.Module):
        blocks: list
        fc: eqx.nn.Linear

        def __init__(self):
            self.blocks = [Block(f"l{i}") for i in range(sizes.layers)]
            self.fc = linear(width, CLASSES, params["fc"])

        def __call__(self, x, state):
            for block in self.blocks:
                x = block(x)
            return jax.nn.softmax(self.fc(jnp.mean(x, axis=0))), state

    return eqx.nn.make_with_state(Encoder)()


def to_equinox_inputs(X):
    return X

"""The ResNet-style CNN of ``bench_models``, written four times with the same parameters.

Stem (3x3 convolution, batch normalization, ReLU), then one residual block per stage (two 3x3
convolutions with batch normalization; the first stage keeps the size, each later one halves it
with stride 2 and projects the shortcut with a 1x1 convolution and batch normalization), global
average pooling, a fully connected layer and softmax. difffn builds and initializes it; the
hand-written, flax.nnx and equinox versions copy difffn's initial learnables, so every framework
starts from the same numbers.
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
    image: int  # height and width
    channels: tuple[int, ...]  # per stage
    batch: int


FULL = Sizes(image=32, channels=(16, 32, 64), batch=64)
QUICK = Sizes(image=8, channels=(4, 8), batch=4)


def data(sizes: Sizes, batches: int, seed: int = 0):
    """Synthetic images ``(N, H, W, 3)`` and integer labels, ``batches`` mini-batches of them."""
    rng = np.random.default_rng(seed)
    n = batches * sizes.batch
    X = rng.standard_normal((n, sizes.image, sizes.image, 3), dtype=np.float32)
    return X, rng.integers(0, CLASSES, n).astype(np.int32)


def _stages(sizes: Sizes):
    """``(name, channels, stride, projected)`` per residual block."""
    previous = sizes.channels[0]
    for i, c in enumerate(sizes.channels):
        stride = 1 if i == 0 else 2
        yield f"s{i}", c, stride, stride != 1 or c != previous
        previous = c


# -- difffn ---------------------------------------------------------------------------------------


def difffn_network(sizes: Sizes) -> df.Network:
    L = df.layers
    chain = [
        L.ImageInput((sizes.image, sizes.image, 3), normalization="none", name="input"),
        L.Conv2D(3, sizes.channels[0], padding="same", name="stem_conv"),
        L.BatchNorm(name="stem_bn"),
        L.ReLU(name="stem_relu"),
    ]
    branches, connections, block_input = [], [], "stem_relu"
    for s, c, stride, projected in _stages(sizes):
        chain += [
            L.Conv2D(3, c, stride=stride, padding="same", name=f"{s}_conv1"),
            L.BatchNorm(name=f"{s}_bn1"),
            L.ReLU(name=f"{s}_relu1"),
            L.Conv2D(3, c, padding="same", name=f"{s}_conv2"),
            L.BatchNorm(name=f"{s}_bn2"),
            L.Addition(name=f"{s}_add"),
            L.ReLU(name=f"{s}_out"),
        ]
        if projected:
            branches.append(
                [L.Conv2D(1, c, stride=stride, name=f"{s}_proj"), L.BatchNorm(name=f"{s}_proj_bn")]
            )
            connections += [(block_input, f"{s}_proj"), (f"{s}_proj_bn", f"{s}_add/in2")]
        else:
            connections.append((block_input, f"{s}_add/in2"))
        block_input = f"{s}_out"
    chain += [
        L.GlobalAveragePool2D(name="gap"),
        L.FullyConnected(CLASSES, name="fc"),
        L.Softmax(name="softmax"),
    ]
    net = df.Network([chain, *branches], connections=connections)
    return net.initialize(key=jax.random.key(0))


# -- hand-written jax -----------------------------------------------------------------------------


def _conv(x, p, stride=1):
    y = jax.lax.conv_general_dilated(
        x, p["weights"], (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )
    return y + p["bias"]


def _batchnorm(x, p, s):
    """Training-mode batch normalization and MATLAB's running-statistics update."""
    mean, var = jnp.mean(x, axis=(0, 1, 2)), jnp.var(x, axis=(0, 1, 2))
    m = x.shape[0] * x.shape[1] * x.shape[2]
    new = {
        "trained_mean": 0.1 * mean + 0.9 * s["trained_mean"],
        "trained_variance": 0.1 * var * m / (m - 1) + 0.9 * s["trained_variance"],
    }
    return (x - mean) / jnp.sqrt(var + 1e-5) * p["scale"] + p["offset"], new


def hand_written_forward(sizes: Sizes):
    """``forward(params, state, x) -> (probabilities, new state)`` over layer -> name -> array."""
    stages = list(_stages(sizes))

    def forward(params, state, x):
        new = {}

        def conv_bn(x, conv, bn, stride=1):
            y, new[bn] = _batchnorm(_conv(x, params[conv], stride), params[bn], state[bn])
            return y

        x = jax.nn.relu(conv_bn(x, "stem_conv", "stem_bn"))
        for s, _, stride, projected in stages:
            y = jax.nn.relu(conv_bn(x, f"{s}_conv1", f"{s}_bn1", stride))
            y = conv_bn(y, f"{s}_conv2", f"{s}_bn2")
            shortcut = conv_bn(x, f"{s}_proj", f"{s}_proj_bn", stride) if projected else x
            x = jax.nn.relu(y + shortcut)
        x = jnp.mean(x, axis=(1, 2))
        logits = x @ params["fc"]["weights"] + params["fc"]["bias"]
        return jax.nn.softmax(logits, axis=-1), new

    return forward


# -- flax.nnx -------------------------------------------------------------------------------------


def nnx_model(sizes: Sizes, params):
    from flax import nnx

    def conv(k, cin, cout, stride, p):
        layer = nnx.Conv(cin, cout, (k, k), strides=stride, padding="SAME", rngs=nnx.Rngs(0))
        layer.kernel[...], layer.bias[...] = p["weights"], p["bias"]
        return layer

    def bn(c, p):
        layer = nnx.BatchNorm(c, momentum=0.9, epsilon=1e-5, rngs=nnx.Rngs(0))
        layer.scale[...], layer.bias[...] = p["scale"], p["offset"]
        return layer

    class Block(nnx.Module):
        def __init__(self, s, cin, c, stride, projected):
            self.conv1 = conv(3, cin, c, stride, params[f"{s}_conv1"])
            self.bn1 = bn(c, params[f"{s}_bn1"])
            self.conv2 = conv(3, c, c, 1, params[f"{s}_conv2"])
            self.bn2 = bn(c, params[f"{s}_bn2"])
            self.proj = conv(1, cin, c, stride, params[f"{s}_proj"]) if projected else None
            self.proj_bn = bn(c, params[f"{s}_proj_bn"]) if projected else None

        def __call__(self, x):
            y = self.bn2(self.conv2(jax.nn.relu(self.bn1(self.conv1(x)))))
            shortcut = self.proj_bn(self.proj(x)) if self.proj is not None else x
            return jax.nn.relu(y + shortcut)

    class ResNet(nnx.Module):
        def __init__(self):
            c0 = sizes.channels[0]
            self.stem_conv = conv(3, 3, c0, 1, params["stem_conv"])
            self.stem_bn = bn(c0, params["stem_bn"])
            blocks, cin = [], c0
            for s, c, stride, projected in _stages(sizes):
                blocks.append(Block(s, cin, c, stride, projected))
                cin = c
            self.blocks = nnx.List(blocks)
            self.fc = nnx.Linear(cin, CLASSES, rngs=nnx.Rngs(0))
            self.fc.kernel[...], self.fc.bias[...] = params["fc"]["weights"], params["fc"]["bias"]

        def __call__(self, x):
            x = jax.nn.relu(self.stem_bn(self.stem_conv(x)))
            for block in self.blocks:
                x = block(x)
            return jax.nn.softmax(self.fc(jnp.mean(x, axis=(1, 2))), axis=-1)

    return ResNet()


# -- equinox --------------------------------------------------------------------------------------


def equinox_model(sizes: Sizes, params):
    """``(model, state)``; the model maps one CHW image (equinox convolves channels first)."""
    import equinox as eqx

    key = jax.random.key(0)

    def conv(k, cin, cout, stride, p):
        layer = eqx.nn.Conv2d(cin, cout, k, stride=stride, padding="SAME", key=key)
        weight = jnp.transpose(p["weights"], (3, 2, 0, 1))  # HWIO -> OIHW
        return eqx.tree_at(lambda m: (m.weight, m.bias), layer, (weight, p["bias"][:, None, None]))

    def bn(c, p):
        layer = eqx.nn.BatchNorm(c, axis_name="batch", momentum=0.9, eps=1e-5, mode="batch")
        return eqx.tree_at(lambda m: (m.weight, m.bias), layer, (p["scale"], p["offset"]))

    class Block(eqx.Module):
        conv1: eqx.nn.Conv2d
        bn1: eqx.nn.BatchNorm
        conv2: eqx.nn.Conv2d
        bn2: eqx.nn.BatchNorm
        proj: eqx.nn.Conv2d | None
        proj_bn: eqx.nn.BatchNorm | None

        def __init__(self, s, cin, c, stride, projected):
            self.conv1 = conv(3, cin, c, stride, params[f"{s}_conv1"])
            self.bn1 = bn(c, params[f"{s}_bn1"])
            self.conv2 = conv(3, c, c, 1, params[f"{s}_conv2"])
            self.bn2 = bn(c, params[f"{s}_bn2"])
            self.proj = conv(1, cin, c, stride, params[f"{s}_proj"]) if projected else None
            self.proj_bn = bn(c, params[f"{s}_proj_bn"]) if projected else None

        def __call__(self, x, state):
            y, state = self.bn1(self.conv1(x), state)
            y, state = self.bn2(self.conv2(jax.nn.relu(y)), state)
            shortcut = x
            if self.proj is not None:
                shortcut, state = self.proj_bn(self.proj(x), state)
            return jax.nn.relu(y + shortcut), state

    class ResNet(eqx.Module):
        stem_conv: eqx.nn.Conv2d
        stem_bn: eqx.nn.BatchNorm
        blocks: list
        fc: eqx.nn.Linear

        def __init__(self):
            c0 = sizes.channels[0]
            self.stem_conv = conv(3, 3, c0, 1, params["stem_conv"])
            self.stem_bn = bn(c0, params["stem_bn"])
            self.blocks, cin = [], c0
            for s, c, stride, projected in _stages(sizes):
                self.blocks.append(Block(s, cin, c, stride, projected))
                cin = c
            fc = eqx.nn.Linear(cin, CLASSES, key=key)
            p = params["fc"]
            self.fc = eqx.tree_at(lambda m: (m.weight, m.bias), fc, (p["weights"].T, p["bias"]))

        def __call__(self, x, state):
            x, state = self.stem_bn(self.stem_conv(x), state)
            x = jax.nn.relu(x)
            for block in self.blocks:
                x, state = block(x, state)
            return jax.nn.softmax(self.fc(jnp.mean(x, axis=(1, 2)))), state

    return eqx.nn.make_with_state(ResNet)()


def to_equinox_inputs(X):
    return np.ascontiguousarray(X.transpose(0, 3, 1, 2))

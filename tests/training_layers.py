"""Small layers and data for the training tests (independent of the built-in layers' defaults)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import difffn as df


class Affine(df.Layer):
    """``x @ weights + bias`` on ``"BC"`` data; weights start at a fixed value (for formulas)."""

    size: int = 1
    weights: jax.Array | None = df.learnable(default=None)
    bias: jax.Array | None = df.learnable(default=None)

    def initialize(self, layout, *, key):
        changes = {}
        if self.weights is None:
            c = layout.size("C")
            changes["weights"] = jax.random.normal(key, (c, self.size)) / np.sqrt(c)
        if self.bias is None:
            changes["bias"] = jnp.zeros((1, self.size))
        return self.replace(**changes) if changes else self

    def predict(self, x):
        return x @ self.weights + self.bias


class SoftmaxC(df.Layer):
    """Softmax over the last axis."""

    def predict(self, x):
        return jax.nn.softmax(x, axis=-1)


class RunningMean(df.Layer):
    """Identity that tracks the mean of its inputs in a state field while training."""

    mean: jax.Array | None = df.state(default=None)

    def initialize(self, layout, *, key):
        if self.mean is None:
            return self.replace(mean=jnp.zeros((layout.size("C"),)))
        return self

    def predict(self, x):
        return x, self.mean

    def forward(self, x):
        return x, 0.5 * self.mean + 0.5 * jnp.mean(x, axis=0)


def regression_net(inputs=3, outputs=1, *, name="fc"):
    return df.Network([df.layers.FeatureInput(inputs, name="in"), Affine(size=outputs, name=name)])


def classifier_net(inputs=4, classes=3):
    return df.Network(
        [
            df.layers.FeatureInput(inputs, name="in"),
            Affine(size=classes, name="fc"),
            SoftmaxC(name="softmax"),
        ]
    )


def regression_data(n=64, inputs=3, outputs=1, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, inputs)).astype(np.float32)
    W = rng.normal(size=(inputs, outputs)).astype(np.float32)
    return X, (X @ W + 0.5).astype(np.float32)


def classification_data(n=96, inputs=4, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    T = rng.integers(0, classes, size=n).astype(np.int32)
    centers = rng.normal(size=(classes, inputs)) * 2.0
    X = (centers[T] + rng.normal(size=(n, inputs))).astype(np.float32)
    return X, T

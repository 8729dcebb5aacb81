"""03: a PReLU custom layer with a hand-written backward, in a small CNN on the digits.

PReLU (parametric ReLU) scales the negative part of its input by a learnable coefficient, one
per channel:

    f(x) = x          if x > 0
           alpha x    if x <= 0

so df/dx = 1 where x > 0 and alpha elsewhere, and df/dalpha = min(x, 0). Because alpha is
broadcast over every axis but the channel axis, dL/dalpha is the sum of dL/dY * min(x, 0) over
those axes (batch and both spatial axes for ``"BSSC"`` images).

This script
1. writes ``PReLUAutodiff`` (``initialize`` and ``predict`` only: JAX differentiates ``predict``)
   and ``PReLULayer``, the same layer with a ``backward`` written from the formulas above;
2. compares the two in float64: the layer's gradients for a random input, then the gradients of
   a whole network's loss with respect to every learnable parameter, once with each layer;
3. trains the CNN (convolution, batch normalization, PReLU, max pooling, twice; fully connected;
   softmax) with ``df.trainnet`` on scikit-learn's 8x8 digits, prints the learned coefficients
   and the test accuracy.

Run: ``python examples/03_prelu_layer.py [--small]``.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import difffn as df


class PReLUAutodiff(df.Layer):
    """PReLU with one coefficient per channel; gradients by JAX autodiff of ``predict``."""

    alpha: jax.Array = df.learnable(default=None)

    def initialize(self, layout, *, key):
        if self.alpha is not None:  # fill only what is still empty
            return self
        shape = [1] * layout.ndim
        shape[layout.finddim("C")[0]] = layout.size("C")
        return self.replace(alpha=jnp.full(shape, 0.25))  # the PReLU paper's starting value

    def predict(self, x):
        return jnp.maximum(x, 0) + self.alpha * jnp.minimum(x, 0)


class PReLULayer(PReLUAutodiff):
    """The same layer with a custom backward."""

    def backward(self, x, y, dLdY, memory):
        positive = x > 0
        dLdX = jnp.where(positive, dLdY, self.alpha * dLdY)
        axes = tuple(i for i, n in enumerate(self.alpha.shape) if n == 1)  # all but C
        # dL/dY * min(x, 0) is plain arithmetic, which XLA's CPU backend fuses into its
        # reduction (one pass over x and dL/dY); a jnp.where there would be written out at full
        # size first. -0.0 instead of 0 (the same sum) keeps XLA from sharing one zero array
        # with `x > 0` above, which it would also write out (docs/performance.md).
        dLdAlpha = jnp.sum(dLdY * jnp.minimum(x, -0.0), axis=axes, keepdims=True)
        return dLdX, dLdAlpha


def build_network(prelu: type[df.Layer], filters: int) -> df.Network:
    L = df.layers
    return df.Network(
        [
            L.ImageInput((8, 8, 1), normalization="none", name="input"),
            L.Conv2D(3, filters, padding="same", name="conv1"),
            L.BatchNorm(name="bn1"),
            prelu(name="prelu1"),
            L.MaxPool2D(2, stride=2, name="pool"),
            L.Conv2D(3, 2 * filters, padding="same", name="conv2"),
            L.BatchNorm(name="bn2"),
            prelu(name="prelu2"),
            L.FullyConnected(10, name="fc"),
            L.Softmax(name="softmax"),
        ]
    )


def relative_difference(a, b) -> float:
    """Largest difference relative to the largest reference value (0 when both are zero)."""
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), np.finfo(b.dtype).tiny))


def compare_layer_gradients(seed: int = 0) -> float:
    """The layer's custom backward against autodiff of its predict, in float64."""
    rng = np.random.default_rng(seed)
    with jax.enable_x64(True):
        alpha = jnp.asarray(rng.uniform(0.1, 0.5, (1, 1, 1, 6)))
        x = rng.standard_normal((4, 5, 5, 6))
        dLdY = rng.standard_normal(x.shape)

        def loss(layer, x):
            return jnp.sum(layer(x) * dLdY)  # layer(x): predict with the custom backward

        custom = jax.jit(jax.grad(loss, argnums=(0, 1)))(PReLULayer(alpha=alpha), x)
        autodiff = jax.jit(jax.grad(loss, argnums=(0, 1)))(PReLUAutodiff(alpha=alpha), x)
    errors = {
        "x": relative_difference(custom[1], autodiff[1]),
        "alpha": relative_difference(custom[0].alpha, autodiff[0].alpha),
    }
    for name, error in errors.items():
        print(f"  dL/d{name:<6} max relative difference: {error:.1e}")
    return max(errors.values())


def compare_network_gradients(X, T, filters: int) -> float:
    """d(loss)/d(every learnable) of the network, custom backward against autodiff, float64."""
    key = jax.random.key(1)
    custom_net = build_network(PReLULayer, filters).initialize(key=key)
    autodiff_net = build_network(PReLUAutodiff, filters).initialize(key=key)

    @jax.jit
    def gradients(net, x, t):
        def loss(net):
            y, _ = net.forward(x)  # training mode: batch normalization uses batch statistics
            return df.losses.crossentropy(y, t)

        net64 = jax.tree.map(lambda v: v.astype(jnp.float64), net)
        return jax.grad(loss)(net64).learnables  # a table: layer, parameter, value

    with jax.enable_x64(True):
        x = X.astype(np.float64)
        custom = gradients(custom_net, x, T)
        autodiff = gradients(autodiff_net, x, T)
    worst = 0.0
    for (layer, parameter, c), a in zip(custom.rows(), autodiff.values(), strict=True):
        assert c.dtype == np.float64
        error = relative_difference(c, a)
        worst = max(worst, error)
        path = f"{layer}/{parameter}"
        print(f"  {path:<14} {str(c.shape):<14} max relative difference: {error:.1e}")
    return worst


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=str(__doc__).splitlines()[0])
    parser.add_argument("--small", action="store_true", help="tiny settings (the test suite)")
    args = parser.parse_args(argv)
    filters = 4 if args.small else 12

    print("== PReLU layer: custom backward vs autodiff of predict (float64)")
    worst = compare_layer_gradients()
    assert worst < 1e-10, f"the layer's custom backward disagrees with autodiff: {worst:.2e}"

    X_train, T_train, X_test, T_test = df.data.digits()
    print("\n== the network's loss gradients, PReLULayer vs PReLUAutodiff (float64, 32 digits)")
    worst = compare_network_gradients(X_train[:32], T_train[:32], filters)
    assert worst < 1e-10, f"the network gradients disagree: {worst:.2e}"

    if args.small:
        X_train, T_train = X_train[:256], T_train[:256]
    options = df.TrainingOptions(
        "adam",
        initial_learn_rate=0.01,
        max_epochs=2 if args.small else 15,
        mini_batch_size=32,
        shuffle="every-epoch",
        metrics="accuracy",
        verbose_frequency=8 if args.small else 100,
    )
    print(f"\n== training on {len(X_train)} digits with df.trainnet (adam)")
    start = time.perf_counter()
    net, info = df.trainnet(
        X_train,
        T_train,
        build_network(PReLULayer, filters),
        "crossentropy",
        options,
        key=jax.random.key(0),
    )
    seconds = time.perf_counter() - start
    print()
    print(net.summary())
    for name in ("prelu1", "prelu2"):
        prelu = net.layer(name)
        assert isinstance(prelu, PReLUAutodiff)
        alpha = np.asarray(prelu.alpha).ravel()
        print(f"  learned {name}.alpha: " + " ".join(f"{a:.2f}" for a in alpha))
    accuracy = df.testnet(net, X_test, T_test, "accuracy")
    iterations = len(info.training_history)
    print(f"trained {iterations} iterations in {seconds:.1f} s; test accuracy {accuracy:.2f}%")
    assert np.isfinite(info.training_history["loss"][-1])
    assert accuracy > (30.0 if args.small else 93.0), f"test accuracy only {accuracy:.2f}%"


if __name__ == "__main__":
    main()

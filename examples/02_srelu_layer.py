"""02: an SReLU custom layer with a hand-written backward, checked and trained on the digits.

SReLU (S-shaped rectified linear unit) has four learnable parameters per channel: a left
threshold ``tl`` and slope ``al`` and a right threshold ``tr`` and slope ``ar``:

    f(x) = tl + al (x - tl)   if x <= tl
           x                  if tl < x < tr
           tr + ar (x - tr)   if x >= tr

Its derivatives, which the backward below follows (each parameter gradient is summed over every
axis but the channel axis, because the parameter is broadcast over them):

    df/dx  = al if x <= tl,  ar if x >= tr,  1 otherwise
    df/dtl = 1 - al if x <= tl (else 0)       df/dal = x - tl if x <= tl (else 0)
    df/dtr = 1 - ar if x >= tr (else 0)       df/dar = x - tr if x >= tr (else 0)

This script
1. writes SReLU as a ``df.Layer`` with learnables ``left_threshold``, ``left_slope``,
   ``right_threshold``, ``right_slope``; ``initialize`` sizes them from the layout's channel count
   and fills only the ones still empty; ``backward`` returns dL/dX, then the four parameter
   gradients in declaration order;
2. compares that backward with JAX autodiff of ``predict`` in float64;
3. runs ``df.check_layer`` on the layout of MATLAB's example (128 images of 24x24 with 20
   channels, ``"BSSC"``; a smaller one with ``--small``) and prints its report;
4. puts the layer in a network next to built-in layers (image input with statistics computed by
   ``trainnet``, convolution, batch normalization, SReLU, fully connected, softmax), trains it
   briefly with ``df.trainnet`` on scikit-learn's 8x8 digits and prints the test accuracy.

Run: ``python examples/02_srelu_layer.py [--small]``.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from srelu_sums import srelu_parameter_gradients  # this folder's one-pass sums

import difffn as df

# Starting values are drawn per channel from these ranges (the input is about unit scale after
# batch normalization): a small slope left of a negative threshold, a slope near 1 right of a
# positive one.
INITIAL_RANGES = {
    "left_threshold": (-0.5, 0.0),
    "left_slope": (0.0, 0.2),
    "right_threshold": (0.5, 1.0),
    "right_slope": (0.5, 1.0),
}


class SReLULayer(df.Layer):
    """SReLU with per-channel thresholds and slopes (size 1 on every axis but ``C``)."""

    left_threshold: jax.Array = df.learnable(default=None)
    left_slope: jax.Array = df.learnable(default=None)
    right_threshold: jax.Array = df.learnable(default=None)
    right_slope: jax.Array = df.learnable(default=None)

    def initialize(self, layout, *, key):
        shape = [1] * layout.ndim
        shape[layout.finddim("C")[0]] = layout.size("C")
        new = {}
        for k, (name, (low, high)) in zip(
            jax.random.split(key, 4), INITIAL_RANGES.items(), strict=True
        ):
            if getattr(self, name) is None:  # fill only what is still empty
                new[name] = jax.random.uniform(k, tuple(shape), minval=low, maxval=high)
        return self.replace(**new) if new else self

    def predict(self, x):
        tl, al = self.left_threshold, self.left_slope
        tr, ar = self.right_threshold, self.right_slope
        return jnp.where(x <= tl, tl + al * (x - tl), jnp.where(x >= tr, tr + ar * (x - tr), x))

    def backward(self, x, y, dLdY, memory):
        tl, al = self.left_threshold, self.left_slope
        tr, ar = self.right_threshold, self.right_slope
        # The same regions as predict: the left branch wins where both conditions hold, so
        # right is x >= tr and x > tl, written as one compare (x > tl is x >= nextafter(tl, inf)):
        # with `(x >= tr) & ~left` the one-pass sums below ran about 3x slower on XLA's CPU.
        # A bound that only feeds a compare has no gradient; stop_gradient says so to JAX,
        # which has no derivative rule for nextafter.
        left = x <= tl
        right = x >= jnp.maximum(tr, jnp.nextafter(jax.lax.stop_gradient(tl), jnp.inf))
        dLdX = dLdY * jnp.where(left, al, jnp.where(right, ar, 1.0))

        axes = tuple(i for i, n in enumerate(tl.shape) if n == 1)  # all but the channel axis

        # sums over those axes, in one pass (srelu_sums.py says how)
        return dLdX, *srelu_parameter_gradients(axes, x, dLdY, left, right, tl, al, tr, ar)


def compare_with_autodiff(seed: int = 0) -> float:
    """Largest relative difference between the custom backward and autodiff (float64)."""
    rng = np.random.default_rng(seed)
    channels = 5

    def per_channel(low, high):
        return jnp.asarray(rng.uniform(low, high, (1, 1, 1, channels)))

    with jax.enable_x64(True):  # float64 arrays stay float64
        layer = SReLULayer(
            left_threshold=per_channel(-0.5, 0.0),
            left_slope=per_channel(0.0, 0.3),
            right_threshold=per_channel(0.5, 1.0),
            right_slope=per_channel(0.5, 1.5),
            name="srelu",
        )
        x = 1.5 * rng.standard_normal((4, 6, 6, channels))  # hits all three regions
        dLdY = rng.standard_normal(x.shape)

        # layer(x) runs predict with the custom backward wired in; layer.predict is the plain
        # method, which JAX differentiates by itself.
        custom = jax.jit(jax.grad(lambda lyr, x: jnp.sum(lyr(x) * dLdY), argnums=(0, 1)))(layer, x)
        autodiff = jax.jit(jax.grad(lambda lyr, x: jnp.sum(lyr.predict(x) * dLdY), argnums=(0, 1)))(
            layer, x
        )
        assert custom[1].dtype == jnp.float64
    pairs = {"x": (custom[1], autodiff[1])}
    for name in layer.learnable_names:
        pairs[name] = (getattr(custom[0], name), getattr(autodiff[0], name))
    errors = {}
    for name, (c, a) in pairs.items():
        c, a = np.asarray(c), np.asarray(a)
        errors[name] = float(np.max(np.abs(c - a)) / np.max(np.abs(a)))
        print(f"  dL/d{name:<16} max relative difference: {errors[name]:.1e}")
    return max(errors.values())


def build_network(filters: int) -> df.Network:
    L = df.layers
    return df.Network(
        [
            L.ImageInput((8, 8, 1), name="input"),  # zero-center: trainnet computes the mean
            L.Conv2D(3, filters, padding="same", name="conv"),
            L.BatchNorm(name="batchnorm"),
            SReLULayer(name="srelu"),
            L.FullyConnected(10, name="fc"),
            L.Softmax(name="softmax"),
        ]
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=str(__doc__).splitlines()[0])
    parser.add_argument("--small", action="store_true", help="tiny settings (the test suite)")
    args = parser.parse_args(argv)
    key = jax.random.key(0)

    print("== custom backward vs autodiff of predict (float64)")
    worst = compare_with_autodiff()
    assert worst < 1e-10, f"the custom backward disagrees with autodiff: {worst:.2e}"

    shape = (4, 8, 8, 4) if args.small else (128, 24, 24, 20)
    layout = df.Layout(shape, "BSSC")
    print(f"\n== df.check_layer(SReLULayer(), {layout})")
    start = time.perf_counter()
    report = df.check_layer(SReLULayer(name="srelu"), layout)
    print(report)
    print(f"(check_layer took {time.perf_counter() - start:.1f} s)")
    assert report.ok, "the SReLU layer should pass every check"

    X_train, T_train, X_test, T_test = df.data.digits()
    if args.small:
        X_train, T_train = X_train[:256], T_train[:256]
    filters = 8 if args.small else 16
    net = build_network(filters)
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
    net, info = df.trainnet(X_train, T_train, net, "crossentropy", options, key=key)
    seconds = time.perf_counter() - start
    print()
    print(net.summary())

    srelu = net.layer("srelu")
    for name in srelu.learnable_names:
        values = np.asarray(getattr(srelu, name)).ravel()
        print(f"  learned {name:<16} per channel: min {values.min():+.3f}, max {values.max():+.3f}")
    accuracy = df.testnet(net, X_test, T_test, "accuracy")
    iterations = len(info.training_history)
    print(f"trained {iterations} iterations in {seconds:.1f} s; test accuracy {accuracy:.2f}%")
    assert np.isfinite(info.training_history["loss"][-1])
    assert accuracy > (30.0 if args.small else 93.0), f"test accuracy only {accuracy:.2f}%"


if __name__ == "__main__":
    main()

"""06: a formattable layer that changes the format: projecting image features to vectors.

A layer with ``formattable = True`` (MATLAB's ``nnet.layer.Formattable``) receives
``df.FormattedArray`` inputs, so it can find axes by their labels and return data of another
rank and format. ``SpatialProjection(output_size)`` takes images (``"BSSC"``, or the same labels
in any order) and projects every observation's spatial x channel features onto
``output_size`` features: ``"BSSC"`` -> ``"BC"``.

A layer with ``formattable = False`` (the default) receives plain arrays and its outputs take
its input's format, so it cannot change the rank: difffn stops it with a ``df.LayerError`` that
says so and how to fix it.

This script
1. writes ``SpatialProjection``, which uses ``df.finddim`` and ``df.permute`` to accept the
   labels in any order, and checks it against the built-in ``FullyConnected`` with the same
   weights, on ``"BSSC"`` data and on the same data stored as ``"SSCB"``;
2. builds a network (image input, convolution, batch normalization, ReLU, the projection, ReLU,
   fully connected, softmax) and prints ``net.summary()``, where the formats change from
   ``"BSSC"`` to ``"BC"`` at the projection;
3. shows the error a non-formattable version of the same layer gives, called directly and in a
   network;
4. trains the network briefly with ``df.trainnet`` on scikit-learn's 8x8 digits.

Run: ``python examples/06_formattable_projection.py [--small]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np

import difffn as df


class SpatialProjection(df.Layer):
    """Project the spatial x channel features of each observation: ``"BSSC"`` -> ``"BC"``."""

    formattable = True

    output_size: int
    _: dataclasses.KW_ONLY
    weights: jax.Array = df.learnable(default=None)  # (S1 * S2 * C, output_size), row-major S, S, C
    bias: jax.Array = df.learnable(default=None)

    def initialize(self, layout, *, key):
        features = math.prod(layout.size("S")) * layout.size("C")  # size("S"): one per S axis
        new = {}
        if self.weights is None:
            limit = np.sqrt(6 / (features + self.output_size))  # Glorot uniform
            shape = (features, self.output_size)
            new["weights"] = jax.random.uniform(key, shape, minval=-limit, maxval=limit)
        if self.bias is None:
            new["bias"] = jnp.zeros(self.output_size)
        return self.replace(**new) if new else self

    def predict(self, x):
        # Put the labels in a known order, whatever the input's order: batch, spatial, channel.
        fmt = "B" + "S" * len(df.finddim(x, "S")) + "C"
        data = df.stripdims(df.permute(x, fmt))
        features = data.reshape(data.shape[0], -1) @ self.weights + self.bias
        return df.dlarray(features, "BC")  # a new rank and a new format


class PlainProjection(SpatialProjection):
    """The same computation without ``formattable``: it gets a plain array, cannot relabel."""

    formattable = False

    def predict(self, x):
        return x.reshape(x.shape[0], -1) @ self.weights + self.bias


def build_network(filters: int, features: int) -> df.Network:
    L = df.layers
    return df.Network(
        [
            L.ImageInput((8, 8, 1), name="input"),  # zero-center: trainnet computes the mean
            L.Conv2D(3, filters, name="conv"),
            L.BatchNorm(name="batchnorm"),
            L.ReLU(name="relu1"),
            SpatialProjection(features, name="project"),
            L.ReLU(name="relu2"),
            L.FullyConnected(10, name="fc"),
            L.Softmax(name="softmax"),
        ]
    )


def compare_with_fully_connected() -> float:
    """The projection equals FullyConnected (which flattens S, S, C row-major) with its weights."""
    key = jax.random.key(0)
    layout = df.Layout((None, 6, 6, 4), "BSSC")
    projection = SpatialProjection(5).initialize(layout, key=key)
    fc = df.layers.FullyConnected(5, weights=projection.weights, bias=projection.bias)
    x = df.dlarray(np.random.default_rng(0).standard_normal((3, 6, 6, 4)), "BSSC")
    y, reference = projection(x), fc(x)
    y_sscb = projection(df.permute(x, "SSCB"))  # the same data, stored in another axis order
    print(f"  on 'BSSC' input: {df.dims(y)} {y.shape}, on 'SSCB' input: {df.dims(y_sscb)}")
    reference = np.asarray(df.stripdims(reference))
    return max(
        float(np.max(np.abs(np.asarray(df.stripdims(y)) - reference))),
        float(np.max(np.abs(np.asarray(df.stripdims(y_sscb)) - reference))),
    )


def indent(error: Exception) -> str:
    return textwrap.fill(str(error), 96, initial_indent="  ", subsequent_indent="  ")


def show_rank_error() -> None:
    layer = SpatialProjection(5).initialize(
        df.Layout((None, 6, 6, 4), "BSSC"), key=jax.random.key(0)
    )
    plain = PlainProjection(5, weights=layer.weights, bias=layer.bias, name="plain")
    x = df.dlarray(jnp.ones((2, 6, 6, 4)), "BSSC")
    try:
        plain(x)
    except df.LayerError as error:
        print(f"called directly, df.{type(error).__name__}:\n{indent(error)}")
    else:
        raise AssertionError("a non-formattable layer changed the rank without an error")

    # In a network the same check runs when the network is built (the input layer fixes the
    # sizes): the layer's own error, with a note from the network saying where.
    try:
        df.Network([df.layers.ImageInput((6, 6, 4), normalization="none", name="input"), plain])
    except df.LayerError as error:
        note = next(n for n in error.__notes__ if "while the network" in n)
        print(f"\nin a network, df.{type(error).__name__}:\n{indent(error)}\n  {note}")
    else:
        raise AssertionError("a network accepted a non-formattable layer that changes the rank")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=str(__doc__).splitlines()[0])
    parser.add_argument("--small", action="store_true", help="tiny settings (the test suite)")
    args = parser.parse_args(argv)
    filters, features = (4, 16) if args.small else (16, 64)

    print("== SpatialProjection vs FullyConnected with the same weights")
    gap = compare_with_fully_connected()
    print(f"  max difference: {gap:.1e}")
    assert gap < 1e-5, gap

    net = build_network(filters, features).initialize(key=jax.random.key(0))
    print("\n== formats layer by layer (net.summary())")
    print(net.summary())

    print("\n== a non-formattable layer that changes the rank")
    show_rank_error()

    X_train, T_train, X_test, T_test = df.data.digits()
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
    net, info = df.trainnet(X_train, T_train, net, "crossentropy", options, key=jax.random.key(0))
    seconds = time.perf_counter() - start
    y = net.predict(X_test[:5], outputs="project")  # an intermediate output, by layer name
    print(f"the projection's output for 5 test digits: {df.dims(y)} {y.shape}")
    assert df.dims(y) == "BC" and y.shape == (5, features), (df.dims(y), y.shape)
    accuracy = df.testnet(net, X_test, T_test, "accuracy")
    iterations = len(info.training_history)
    print(f"trained {iterations} iterations in {seconds:.1f} s; test accuracy {accuracy:.2f}%")
    assert accuracy > (30.0 if args.small else 93.0), f"test accuracy only {accuracy:.2f}%"


if __name__ == "__main__":
    main()

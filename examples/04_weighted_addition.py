"""04: a layer with several inputs: weighted addition, merging the branches of a graph network.

The layer adds its N inputs (all of one size and format), each scaled by a learnable weight:

    Y = w_1 X_1 + w_2 X_2 + ... + w_N X_N

so dL/dX_i = w_i dL/dY and dL/dw_i = sum(dL/dY * X_i) (a sum over every element). N is set in
the constructor, and so are the weights, because their size depends on N only, not on the data
(MATLAB's multiple-input example does the same); the layer needs no ``initialize``.

This script
1. writes ``WeightedAddition(num_inputs)``: ``predict(*inputs)`` takes any number of inputs, named
   ``"in1"`` ... ``"inN"`` as in MATLAB, and ``backward(*X, Y, dLdY, memory)`` returns the N input
   gradients and then the weights' gradient;
2. compares that backward with autodiff of ``predict`` in float64;
3. builds a graph network with ``connections=``: an image input feeding three branches (3x3
   convolution, 5x5 convolution, 1x1 convolution), merged by the weighted addition, then a fully
   connected layer and softmax; prints its summary, connections and learnables table;
4. takes the gradient of the loss with respect to the whole network and prints the one of the
   merge weights;
5. trains it briefly on scikit-learn's 8x8 digits with ``df.trainnet`` and prints the learned
   weight of each branch and the test accuracy.

Run: ``python examples/04_weighted_addition.py [--small]``.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import difffn as df


class WeightedAddition(df.Layer):
    """``Y = sum_i weights[i] * X_i`` over ``num_inputs`` inputs of the same size."""

    weights: jax.Array = df.learnable(default=None)

    def __init__(self, num_inputs: int, *, name: str = "", weights=None):
        self.num_inputs = num_inputs  # the input names follow: "in1", ..., "inN"
        self.name = name
        self.description = f"Weighted addition of {num_inputs} inputs"
        # Start as the plain average: the weights' size is known without any data.
        self.weights = jnp.full(num_inputs, 1 / num_inputs) if weights is None else weights

    def predict(self, *inputs):
        return sum(w * x for w, x in zip(self.weights, inputs, strict=True))

    def backward(self, *args):
        # args: X1..XN, Y, dLdY, memory
        n = self.num_inputs
        inputs, dLdY = args[:n], args[n + 1]
        dLdX = [w * dLdY for w in self.weights]
        dLdW = jnp.stack([jnp.sum(dLdY * x) for x in inputs])
        return (*dLdX, dLdW)


def compare_with_autodiff(num_inputs: int = 3, seed: int = 0) -> float:
    """Largest relative difference between the custom backward and autodiff (float64)."""
    rng = np.random.default_rng(seed)
    with jax.enable_x64(True):
        layer = WeightedAddition(num_inputs, weights=jnp.asarray(rng.uniform(-1, 1, num_inputs)))
        xs = tuple(rng.standard_normal((4, 5, 5, 3)) for _ in range(num_inputs))
        dLdY = rng.standard_normal((4, 5, 5, 3))
        argnums = tuple(range(num_inputs + 1))  # the layer, then every input
        custom = jax.jit(jax.grad(lambda lyr, *xs: jnp.sum(lyr(*xs) * dLdY), argnums))(layer, *xs)
        autodiff = jax.jit(jax.grad(lambda lyr, *xs: jnp.sum(lyr.predict(*xs) * dLdY), argnums))(
            layer, *xs
        )
    pairs = {"weights": (custom[0].weights, autodiff[0].weights)}
    for i, name in enumerate(layer.input_names):
        pairs[name] = (custom[i + 1], autodiff[i + 1])
    worst = 0.0
    for name, (c, a) in pairs.items():
        c, a = np.asarray(c), np.asarray(a)
        assert c.dtype == np.float64
        error = float(np.max(np.abs(c - a)) / np.max(np.abs(a)))
        worst = max(worst, error)
        print(f"  dL/d{name:<8} max relative difference: {error:.1e}")
    return worst


def build_network(filters: int) -> df.Network:
    L = df.layers
    return df.Network(
        [
            # The main chain: the 3x3 branch feeds the merge's first input, "wadd/in1".
            [
                L.ImageInput((8, 8, 1), normalization="none", name="input"),
                L.Conv2D(3, filters, padding="same", name="conv3x3"),
                L.BatchNorm(name="bn3x3"),
                L.ReLU(name="relu3x3"),
                WeightedAddition(3, name="wadd"),
                L.FullyConnected(10, name="fc"),
                L.Softmax(name="softmax"),
            ],
            # Two more branches, each a chain of its own.
            [
                L.Conv2D(5, filters, padding="same", name="conv5x5"),
                L.BatchNorm(name="bn5x5"),
                L.ReLU(name="relu5x5"),
            ],
            [L.Conv2D(1, filters, name="conv1x1")],
        ],
        connections=[
            ("input", "conv5x5"),
            ("input", "conv1x1"),
            ("relu5x5", "wadd/in2"),
            ("conv1x1", "wadd/in3"),
        ],
    )


BRANCHES = ("3x3 conv + bn + relu", "5x5 conv + bn + relu", "1x1 conv")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=str(__doc__).splitlines()[0])
    parser.add_argument("--small", action="store_true", help="tiny settings (the test suite)")
    args = parser.parse_args(argv)
    filters = 4 if args.small else 16

    print("== WeightedAddition(3): custom backward vs autodiff of predict (float64)")
    worst = compare_with_autodiff()
    assert worst < 1e-10, f"the custom backward disagrees with autodiff: {worst:.2e}"

    net = build_network(filters).initialize(key=jax.random.key(0))
    wadd = net.layer("wadd")
    print(f"\n== the network\n{net.summary()}")
    print(f"\n'wadd' inputs: {wadd.input_names}; it is fed by:")
    for source, destination in net.connections:
        if destination.startswith("wadd/"):
            print(f"  {source:<12} -> {destination}")
    assert wadd.input_names == ("in1", "in2", "in3")
    print(f"\nnet.learnables:\n{net.learnables}")

    X_train, T_train, X_test, T_test = df.data.digits()
    if args.small:
        X_train, T_train = X_train[:256], T_train[:256]

    @jax.jit
    def loss_gradients(net, x, t):
        def loss(net):
            y, _ = net.forward(x)
            return df.losses.crossentropy(y, t)

        return jax.grad(loss)(net)  # a network of gradients

    grads = loss_gradients(net, X_train[:64], T_train[:64])
    dLdW = grads.learnables["wadd/weights"]
    print("\n== d(loss)/d(wadd/weights) on 64 digits: " + ", ".join(f"{g:+.4f}" for g in dLdW))
    assert dLdW.shape == (3,) and np.all(np.isfinite(dLdW)) and np.any(dLdW != 0)

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
    trained = net.layer("wadd")
    assert isinstance(trained, WeightedAddition)
    weights = np.asarray(trained.weights)
    print("\nlearned merge weights (they started at 1/3 each):")
    for name, branch, w in zip(wadd.input_names, BRANCHES, weights, strict=True):
        print(f"  {name}  {branch:<22} {w:+.3f}")
    accuracy = df.testnet(net, X_test, T_test, "accuracy")
    iterations = len(info.training_history)
    print(f"trained {iterations} iterations in {seconds:.1f} s; test accuracy {accuracy:.2f}%")
    assert not np.allclose(weights, 1 / 3), "the merge weights did not change"
    assert accuracy > (30.0 if args.small else 93.0), f"test accuracy only {accuracy:.2f}%"


if __name__ == "__main__":
    main()

"""11: a small transformer encoder that classifies the 8x8 digits read row by row.

The encoder block of "Attention is all you need" with MATLAB's layers: each image is a sequence
of 8 rows (time steps) of 8 pixels; an input projection (``FullyConnected`` on ``"BTC"`` keeps
``T``) and a learned ``PositionEmbedding`` are added, then a residual ``SelfAttention`` block
and a residual feed-forward block, each followed by ``LayerNorm`` (MATLAB's
``layerNormalizationLayer``: every step normalized over its channels, then a learned scale and
offset per channel); the sequence is averaged over time and classified.

This script
1. builds the network as a graph (``connections=`` for the position embedding and the two
   residual connections) and prints its summary;
2. trains it with ``df.trainnet`` (adam, learn rate 0.003, mini-batches of 64, shuffled every
   epoch) on scikit-learn's digits;
3. prints the accuracy on the held-out test split and the attention pattern of one test digit
   (the average weight each row gives to every row, from the ``"scores"`` output).

Run: ``python examples/11_transformer_digits.py [--small]``.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import difffn as df

STEPS, FEATURES, WIDTH, HEADS = 8, 8, 32, 4


def mean_over_time(x):
    """``"BTC"`` -> ``"BC"``: the average of the sequence's steps (a formattable function)."""
    return df.dlarray(jnp.mean(x.data, axis=df.finddim(x, "T")[0]), x.format.replace("T", ""))


def build_network(scores: bool = False) -> df.Network:
    L = df.layers
    return df.Network(
        [
            [
                L.SequenceInput(FEATURES, name="rows"),
                L.FullyConnected(WIDTH, name="project"),
                L.Addition(name="add_position"),
                L.SelfAttention(HEADS, WIDTH, has_scores_output=scores, name="attention"),
                L.Addition(name="residual1"),
                L.LayerNorm(name="norm1"),
                L.FullyConnected(2 * WIDTH, name="feedforward1"),
                L.ReLU(name="relu"),
                L.FullyConnected(WIDTH, name="feedforward2"),
                L.Addition(name="residual2"),
                L.LayerNorm(name="norm2"),
                L.FunctionLayer(mean_over_time, formattable=True, name="pool"),
                L.FullyConnected(10, name="fc"),
                L.Softmax(name="softmax"),
            ],
            [L.PositionEmbedding(WIDTH, STEPS, name="position")],
        ],
        connections=[
            ("project", "position"),
            ("position", "add_position/in2"),
            ("add_position", "residual1/in2"),
            ("norm1", "residual2/in2"),
        ],
        outputs=["softmax", "attention/scores"] if scores else None,
    )


def main(small: bool) -> float:
    X_train, T_train, X_test, T_test = df.data.digits()
    X_train = X_train.reshape(-1, STEPS, FEATURES)  # rows as time steps: "BTC"
    X_test = X_test.reshape(-1, STEPS, FEATURES)
    if small:
        X_train, T_train = X_train[:256], T_train[:256]
    net = build_network()
    print(net.initialize(key=jax.random.key(0)).summary())
    options = df.TrainingOptions(
        "adam",
        initial_learn_rate=0.003,
        max_epochs=2 if small else 40,
        mini_batch_size=64,
        shuffle="every-epoch",
        metrics="accuracy",
        verbose=False,
    )
    start = time.perf_counter()
    net, info = df.trainnet(X_train, T_train, net, "crossentropy", options, key=jax.random.key(1))
    seconds = time.perf_counter() - start
    accuracy = df.testnet(net, X_test, T_test, "accuracy")
    print(f"\ntrained in {seconds:.1f} s ({len(info.training_history)} iterations)")
    print(f"test accuracy: {accuracy:.2f}%")

    # The trained layers in a network that also outputs the attention layer's "scores".
    with_scores = build_network(scores=True)
    for layer in net.layers:
        if layer.name == "attention":
            layer = layer.replace(has_scores_output=True)
        with_scores = with_scores.replace_layer(layer.name, layer)
    with_scores = with_scores.initialize(key=jax.random.key(0))  # fills nothing: all trained
    probabilities, scores = with_scores.predict(df.dlarray(X_test[:1], "BTC"))
    label = int(jnp.argmax(probabilities.data[0]))
    pattern = np.asarray(jnp.mean(scores.data[0], axis=0))  # average over the heads
    print(f"\nattention of test digit 0 (true {int(T_test[0])}, predicted {label}), averaged "
          "over heads; row i attends to row j:")  # fmt: skip
    for i, row in enumerate(pattern):
        print(f"  row {i}: " + " ".join(f"{w:4.2f}" for w in row))
    return accuracy


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=str(__doc__).splitlines()[0])
    parser.add_argument("--small", action="store_true", help="tiny settings for the test suite")
    main(parser.parse_args().small)

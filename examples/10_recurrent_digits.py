"""10: GRU and BiLSTM classifiers that read the 8x8 digits row by row (8 steps x 8 features).

MATLAB's sequence-classification workflow (``sequenceInputLayer``, ``gruLayer`` or
``bilstmLayer`` with ``OutputMode="last"``, ``fullyConnectedLayer``, ``softmaxLayer``,
``trainnet``) on scikit-learn's handwritten digits: each image is a sequence of its 8 rows,
each row a time step of 8 pixel features, and the class is read from the recurrent layer's
final hidden state.

This script
1. turns the ``(N, 8, 8, 1)`` images into ``(N, 8, 8)`` sequences (``"BTC"``: batch, time =
   row, channels = the row's pixels);
2. builds two networks, ``SequenceInput(8)`` -> ``GRU(48, output_mode="last")`` or
   ``BiLSTM(32, output_mode="last")`` -> ``FullyConnected(10)`` -> ``Softmax``, and prints the
   GRU network's summary;
3. trains each with ``df.trainnet`` (adam, learn rate 0.01, mini-batches of 64, shuffled every
   epoch) and prints its accuracy on the held-out test split.

Run: ``python examples/10_recurrent_digits.py [--small]``.
"""

from __future__ import annotations

import argparse
import time

import jax

import difffn as df

STEPS, FEATURES = 8, 8


def build_network(kind: str) -> df.Network:
    L = df.layers
    recurrent = (
        L.GRU(48, output_mode="last", name="gru")
        if kind == "gru"
        else L.BiLSTM(32, output_mode="last", name="bilstm")
    )
    return df.Network(
        [
            L.SequenceInput(FEATURES, name="rows"),
            recurrent,
            L.FullyConnected(10, name="fc"),
            L.Softmax(name="softmax"),
        ]
    )


def main(small: bool) -> dict[str, float]:
    X_train, T_train, X_test, T_test = df.data.digits()
    # (N, 8, 8, 1) "BSSC" images -> (N, 8, 8) "BTC" sequences: one row per time step
    X_train = X_train.reshape(-1, STEPS, FEATURES)
    X_test = X_test.reshape(-1, STEPS, FEATURES)
    if small:
        X_train, T_train = X_train[:256], T_train[:256]
    print(f"{len(X_train)} training and {len(X_test)} test sequences of {STEPS} steps x "
          f"{FEATURES} features")  # fmt: skip
    options = df.TrainingOptions(
        "adam",
        initial_learn_rate=0.01,
        max_epochs=2 if small else 25,
        mini_batch_size=64,
        shuffle="every-epoch",
        metrics="accuracy",
        verbose=False,
    )
    accuracies = {}
    for kind in ("gru", "bilstm"):
        net = build_network(kind)
        if kind == "gru":
            print(net.initialize(key=jax.random.key(0)).summary())
        start = time.perf_counter()
        net, info = df.trainnet(
            X_train, T_train, net, "crossentropy", options, key=jax.random.key(1)
        )
        seconds = time.perf_counter() - start
        accuracies[kind] = df.testnet(net, X_test, T_test, "accuracy")
        name = "GRU" if kind == "gru" else "BiLSTM"
        print(
            f"{name:7} trained in {seconds:5.1f} s ({len(info.training_history)} iterations); "
            f"test accuracy: {accuracies[kind]:.2f}%"
        )
    return accuracies


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=str(__doc__).splitlines()[0])
    parser.add_argument("--small", action="store_true", help="tiny settings for the test suite")
    main(parser.parse_args().small)

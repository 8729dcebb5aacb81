"""17: classify sequences of different lengths with 1-D convolutions (MATLAB's "Sequence
Classification Using 1-D Convolutions").

Each synthetic sequence has 3 channels and 40 to 80 steps: noise plus, in one channel, a short
burst of a waveform whose shape gives the class (a sine, a square wave, a sawtooth or a
spike train; 4 classes), at a random position. The network, as in MATLAB's example, is two
blocks of a 1-D convolution, a ReLU and layer normalization, then 1-D global average pooling over
time and a classifier:

    SequenceInput(3, min_length=MIN) -> [Conv1D(5, F) -> ReLU -> LayerNorm] x 2, the second
    after MaxPool1D(2, stride=2) -> GlobalAveragePool1D -> FullyConnected(4) -> Softmax

The sequences' lengths are unknown when the network is built: it initializes at ``min_length``,
the shortest length it promises to take (a filter longer than the sequences there would be a
named error naming the layer and the length it needs). ``df.trainnet`` pads each mini-batch to
its longest sequence (``df.testnet`` too); ``predict`` runs on a sequence of any length from
``min_length`` on.

Run: ``python examples/17_conv1d_sequence_classifier.py [--small]``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import difffn as df

L = df.layers
CHANNELS, CLASSES, MIN = 3, 4, 16


def burst(kind: int, n: int) -> np.ndarray:
    t = np.arange(n) / n * 4 * np.pi
    if kind == 0:
        return np.sin(t)
    if kind == 1:
        return np.sign(np.sin(t))
    if kind == 2:
        return (t / np.pi) % 2 - 1
    return (np.arange(n) % 5 == 0) * 2.0 - 0.4


def sequences(count: int, *, seed: int):
    """``count`` sequences of 40..80 steps (a list of (length, 3) arrays) and their classes."""
    rng = np.random.default_rng(seed)
    xs, labels = [], rng.integers(0, CLASSES, count)
    for label in labels:
        length = int(rng.integers(40, 81))
        x = 0.3 * rng.standard_normal((length, CHANNELS))
        width = 20
        start = int(rng.integers(0, length - width))
        x[start : start + width, int(rng.integers(0, CHANNELS))] += burst(int(label), width)
        xs.append(x.astype(np.float32))
    return xs, labels


def build(filters: int) -> df.Network:
    return df.Network(
        [
            L.SequenceInput(CHANNELS, min_length=MIN, name="input"),
            L.Conv1D(5, filters, name="conv1"),
            L.ReLU(name="relu1"),
            L.LayerNorm(name="norm1"),
            L.MaxPool1D(2, stride=2, name="pool"),
            L.Conv1D(5, 2 * filters, name="conv2"),
            L.ReLU(name="relu2"),
            L.LayerNorm(name="norm2"),
            L.GlobalAveragePool1D(name="gap"),
            L.FullyConnected(CLASSES, name="fc"),
            L.Softmax(name="softmax"),
        ]
    )


def main(small: bool = False) -> float:
    import jax

    train_count, test_count, epochs, filters = (48, 16, 2, 8) if small else (600, 200, 20, 32)
    X, T = sequences(train_count, seed=0)
    X_test, T_test = sequences(test_count, seed=1)
    net = build(filters).initialize(key=jax.random.key(0))
    print(net.summary())
    try:  # a filter longer than min_length allows is refused when the network is built
        df.Network([L.SequenceInput(CHANNELS, min_length=4), L.Conv1D(5, filters)])
    except df.NetworkError as error:
        print(f"min_length too short: {str(error).split('. Fix')[0]}.")
    options = df.TrainingOptions(
        "adam",
        max_epochs=epochs,
        mini_batch_size=16 if small else 32,
        initial_learn_rate=0.005,
        shuffle="every-epoch",
        sequence_length="longest",
        verbose=False,
    )
    start = time.perf_counter()
    net, info = df.trainnet(X, T, net, "crossentropy", options)
    losses = info.training_history["loss"]
    print(
        f"trained {epochs} epochs in {time.perf_counter() - start:.1f} s; loss "
        f"{losses[0]:.3f} -> {losses[-1]:.3f}"
    )
    lengths = sorted({len(x) for x in X_test})
    results = df.testnet(net, X_test, T_test, ["accuracy"])  # padded per mini-batch, masked
    accuracy = float(results["accuracy"]) / 100  # testnet's accuracy is a percentage (MATLAB's)
    print(
        f"test accuracy {accuracy:.3f} on {len(X_test)} sequences of {lengths[0]} to "
        f"{lengths[-1]} steps (chance {1 / CLASSES:.2f})"
    )
    for length in (MIN, 23, 80):  # any length from min_length on, unpadded
        x = sequences(1, seed=length)[0][0][:length]
        x = np.pad(x, ((0, length - len(x)), (0, 0)))
        scores = net.predict(df.dlarray(x[None], "BTC"))
        print(f"a sequence of {length} steps: scores {scores.format} {scores.shape}")
    assert np.isfinite(losses[-1])
    if not small:
        assert accuracy > 0.75, "the classifier should learn the burst shapes"
    return accuracy


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--small", action="store_true", help="tiny settings for the test suite")
    main(parser.parse_args().small)

"""Writes the files in this folder with the difffn checked out before the floors became packages.

Run once, from the repository root, on commit bc4239f (the last commit of the flat layout):

    python tests/data/before_move/make.py

The files record module paths of that layout (``difffn._losses.crossentropy`` in the resume
fingerprint, and the history log's name derived from the fingerprint), which
``tests/test_architecture.py`` loads with the current layout. Do not rerun it on a later commit:
the point of the files is that they were written by the old code.
"""

from pathlib import Path

import jax
import numpy as np

import difffn as df
from difffn import layers as L

HERE = Path(__file__).resolve().parent


def data():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((24, 4)).astype(np.float32)
    T = np.eye(3, dtype=np.float32)[rng.integers(0, 3, 24)]
    return X, T


def network() -> df.Network:
    return df.Network(
        [
            L.FeatureInput(4, name="input"),
            L.FullyConnected(5, name="fc_in"),
            L.ReLU(name="relu_in"),
            L.FullyConnected(3, name="fc"),
            L.Softmax(name="sm"),
        ]
    ).initialize(key=jax.random.key(0))


def main() -> None:
    net = network()
    df.save(HERE / "network.difffn", net)
    df.export(net, df.Layout((None, 4), "BC"), path=HERE / "network.export.difffn")
    X, T = data()
    folder = HERE / "checkpoints"
    folder.mkdir(exist_ok=True)
    options = df.TrainingOptions(
        "sgdm",
        max_epochs=2,
        mini_batch_size=8,
        shuffle="never",
        verbose=False,
        checkpoint_path=folder,
        checkpoint_frequency=1,
    )
    df.trainnet(X, T, net, df.losses.crossentropy, options, key=jax.random.key(1))
    print(sorted(p.name for p in HERE.rglob("*") if p.is_file()))


if __name__ == "__main__":
    main()

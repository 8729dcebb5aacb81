"""A small training run with checkpoints, for tests/test_checkpoint.py (also run as a script).

``python tests/checkpoint_run.py FOLDER [--slow SECONDS]`` trains with a checkpoint after every
iteration in FOLDER, sleeping SECONDS per iteration so that a test can kill it mid-run. The run
uses everything a resume must restore: input statistics, batch-norm state, dropout keys, a
shuffle every epoch, a piecewise learn-rate schedule, momentum, validation with patience
bookkeeping and the best-validation network.
"""

from __future__ import annotations

import sys
import time

import jax
import numpy as np

import difffn as df

KEY = 7
ITERATIONS = 24  # 4 epochs of 6 mini-batches


def data(inputs=4, classes=3):
    """96 training and 48 validation observations of three classes."""
    rng = np.random.default_rng(0)
    T = rng.integers(0, classes, size=144).astype(np.int32)
    centers = rng.normal(size=(classes, inputs)) * 1.5
    X = (centers[T] + rng.normal(size=(144, inputs))).astype(np.float32)
    return X[:96], T[:96], X[96:], T[96:]


def network():
    return df.Network(
        [
            df.layers.FeatureInput(4, normalization="zscore", name="in"),
            df.layers.FullyConnected(16, name="fc1"),
            df.layers.BatchNorm(name="bn"),
            df.layers.ReLU(name="relu"),
            df.layers.Dropout(0.3, name="drop"),
            df.layers.FullyConnected(3, name="fc2"),
            df.layers.Softmax(name="softmax"),
        ]
    )


def options(folder=None, *, slow=0.0, **changes):
    _, _, X_val, T_val = data()

    def sleep(info):
        if info["state"] == "iteration":
            time.sleep(slow)
        return False

    settings = {
        "max_epochs": 4,
        "mini_batch_size": 16,
        "shuffle": "every-epoch",
        "learn_rate_schedule": "piecewise",
        "learn_rate_drop_period": 2,
        "initial_learn_rate": 0.05,
        "validation_data": (X_val, T_val),
        "validation_frequency": 5,
        "metrics": ["accuracy"],
        "verbose": False,
        "checkpoint_path": folder,
        "checkpoint_frequency_unit": "iteration",
        "output_fcn": sleep if slow else None,
        **changes,
    }
    if folder is None:
        settings.pop("checkpoint_frequency_unit")
    return df.TrainingOptions("sgdm", **settings)


def train(folder=None, *, slow=0.0, resume_from=None, **changes):
    X, T, _, _ = data()
    key = None if resume_from is not None else jax.random.key(KEY)
    return df.trainnet(
        X,
        T,
        network(),
        "crossentropy",
        options(folder, slow=slow, **changes),
        key=key,
        resume_from=resume_from,
    )


if __name__ == "__main__":
    slow = float(sys.argv[sys.argv.index("--slow") + 1]) if "--slow" in sys.argv else 0.0
    net, info = train(sys.argv[1], slow=slow)
    print("done", info.stop_reason, flush=True)

"""execution_environment="multi-device" in a subprocess with 4 host devices."""

from __future__ import annotations

import json

import pytest
from helpers import run_python

pytestmark = pytest.mark.multidevice

CODE = r"""
import json, jax, numpy as np
import difffn as df

assert len(jax.devices()) == 4, jax.devices()
rng = np.random.default_rng(0)
T = rng.integers(0, 3, size=96).astype(np.int32)
X = (rng.normal(size=(3, 6))[T] * 2 + rng.normal(size=(96, 6))).astype(np.float32)
Xv, Tv = X[:50], T[:50]  # 50: the last validation batch (2) does not split over 4 devices

def network():
    L = df.layers
    return df.Network([L.FeatureInput(6, normalization="zscore"), L.FullyConnected(8),
                       L.BatchNorm(), L.ReLU(), L.FullyConnected(3), L.Softmax()])

def train(environment, **extra):
    settings = dict(
        max_epochs=3, mini_batch_size=16, shuffle="every-epoch", verbose=False,
        validation_data=(Xv, Tv), validation_frequency=4, metrics="accuracy",
        execution_environment=environment)
    options = df.TrainingOptions(**{**settings, **extra})
    return df.trainnet(X, T, network(), "crossentropy", options, key=jax.random.key(1))

one, info_one = train("auto")
many, info_many = train("multi-device")
w = many.learnables["fullyconnected_2/weights"]
result = {
    "devices": len(w.sharding.device_set),
    "max_param_diff": max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                          for a, b in zip(jax.tree.leaves(one.learnables),
                                          jax.tree.leaves(many.learnables))),
    "max_state_diff": max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                          for a, b in zip(jax.tree.leaves(one.state), jax.tree.leaves(many.state))),
    "loss_one": info_one.training_history["loss"].tolist(),
    "loss_many": info_many.training_history["loss"].tolist(),
    "val_one": info_one.validation_history["loss"].tolist(),
    "val_many": info_many.validation_history["loss"].tolist(),
}
try:
    train("multi-device", mini_batch_size=30)
except df.OptionsError as error:
    result["indivisible"] = str(error)
batches = [(X[i:i + 16], T[i:i + 16]) for i in range(0, 96, 16)]
options = df.TrainingOptions(max_epochs=1, verbose=False, execution_environment="multi-device")
_, info = df.trainnet(batches, network(), "crossentropy", options)
result["iterable_iterations"] = len(info.training_history)
try:
    df.trainnet([(X[:10], T[:10])], network(), "crossentropy", options)
except df.OptionsError as error:
    result["iterable_indivisible"] = str(error)
print("RESULT" + json.dumps(result))
"""


@pytest.fixture(scope="module")
def result():
    completed = run_python(CODE, devices=4, timeout=300)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    line = next(x for x in completed.stdout.splitlines() if x.startswith("RESULT"))
    return json.loads(line[len("RESULT") :])


def test_parameters_are_replicated_over_the_devices(result):
    assert result["devices"] == 4


def test_multi_device_training_equals_one_device_up_to_rounding(result):
    assert result["max_param_diff"] < 1e-4
    assert result["max_state_diff"] < 1e-4
    assert result["loss_one"] == pytest.approx(result["loss_many"], rel=1e-4, abs=1e-5)
    assert result["val_one"] == pytest.approx(result["val_many"], rel=1e-4, abs=1e-5)


def test_an_indivisible_mini_batch_is_a_clear_error(result):
    message = result["indivisible"]
    assert "splits each mini-batch over the 4 devices" in message
    assert "mini_batch_size must be a multiple of 4; got 30" in message
    assert "mini_batch_size=28 or 32" in message
    assert "multiple of 4; got 10" in result["iterable_indivisible"]


def test_iterable_data_is_sharded_too(result):
    assert result["iterable_iterations"] == 6

"""execution_environment="multi-device" in a subprocess with 4 host devices."""

from __future__ import annotations

import json

import pytest
from helpers import run_python

pytestmark = pytest.mark.multidevice

CODE = r"""
import contextlib, io, json, jax, numpy as np
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
def diff(a, b):
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))

def plain():  # no layer whose state learns from the whole batch: uneven batches are padded
    L = df.layers
    return df.Network([L.FeatureInput(6), L.FullyConnected(8), L.ReLU(), L.FullyConnected(3),
                       L.Softmax()])

def uneven(environment, net, verbose=False):
    options = df.TrainingOptions(max_epochs=1, mini_batch_size=30, verbose=verbose,
                                 execution_environment=environment)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        trained, info = df.trainnet(X, T, net, "crossentropy", options, key=jax.random.key(1))
    return trained, info, out.getvalue()

for name, make in (("padded", plain), ("replicated", network)):
    one_u, info_u, _ = uneven("auto", make())
    many_u, info_m, printed = uneven("multi-device", make(), verbose=True)
    result[name] = {
        "param_diff": diff(one_u.learnables, many_u.learnables),
        "state_diff": diff(one_u.state, many_u.state) if name == "replicated" else 0.0,
        "loss_one": info_u.training_history["loss"].tolist(),
        "loss_many": info_m.training_history["loss"].tolist(),
        "printed": [line for line in printed.splitlines() if "Mini-batches" in line],
    }
predicted = df.minibatchpredict(one_u, X[:37], mini_batch_size=10,
                                execution_environment="multi-device")
result["predict_rows"] = int(np.shape(predicted)[0])
result["predict_diff"] = float(np.max(np.abs(np.asarray(predicted) - np.asarray(
    df.minibatchpredict(one_u, X[:37], mini_batch_size=10)))))
batches = [(X[i:i + 16], T[i:i + 16]) for i in range(0, 96, 16)]
options = df.TrainingOptions(max_epochs=1, verbose=False, execution_environment="multi-device")
_, info = df.trainnet(batches, network(), "crossentropy", options)
result["iterable_iterations"] = len(info.training_history)
# an iterable's batches of 10 over 4 devices: padded to 12, the same training as one device
odd = [(X[i:i + 10], T[i:i + 10]) for i in range(0, 90, 10)]
one_i, _ = df.trainnet(odd, plain(), "crossentropy", df.TrainingOptions(max_epochs=1, verbose=False))
many_i, _ = df.trainnet(odd, plain(), "crossentropy", options)
result["iterable_padded_diff"] = diff(one_i.learnables, many_i.learnables)
# shares of a multi-process iterable are padded one by one, to one size that splits together
from difffn._devices._sharding import Placement
placement = Placement("multi-device")
result["padded_shares"] = [placement.padded(6, 2), placement.padded(10, 2),
                           placement.padded(6, 3), placement.padded(30), placement.padded(8, 2)]
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


@pytest.mark.parametrize("plan", ["padded", "replicated"])
def test_an_uneven_mini_batch_trains_as_on_one_device(result, plan):
    # 30 observations over 4 devices: padded to 32 (the padding weightless), or, with BatchNorm
    # (whose statistics would see the padding), replicated
    run = result[plan]
    assert run["param_diff"] < 1e-4
    assert run["state_diff"] < 1e-4
    assert run["loss_one"] == pytest.approx(run["loss_many"], rel=1e-4, abs=1e-5)


def test_the_verbose_output_says_what_was_done_with_an_uneven_batch(result):
    (padded,) = result["padded"]["printed"]
    assert "Mini-batches of 30 observations are padded to 32" in padded
    assert "the 2 padded observation(s) carry no weight" in padded
    (replicated,) = result["replicated"]["printed"]
    assert "the state of batchnorm_1 learns from the whole batch: they run replicated" in (
        replicated
    )


def test_an_uneven_iterable_batch_is_padded(result):
    assert result["iterable_padded_diff"] < 1e-4


def test_prediction_of_an_uneven_batch_returns_every_row(result):
    assert result["predict_rows"] == 37
    assert result["predict_diff"] < 1e-5


def test_iterable_data_is_sharded_too(result):
    assert result["iterable_iterations"] == 6


def test_shares_are_padded_to_one_size_that_splits_over_the_mesh(result):
    # over 4 devices: 2 shares of 3 -> 2 of 4; 2 of 5 -> 2 of 6; 3 of 2 -> 3 of 4; one batch
    # of 30 -> 32; 2 shares of 4 already split
    assert result["padded_shares"] == [8, 12, 12, 32, 8]

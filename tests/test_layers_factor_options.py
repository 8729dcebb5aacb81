"""Tests of difffn/layers/_factor_options.py: MATLAB's factor options on built-in layers."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import difffn as df

L = df.layers

# (layer class and positional arguments, option -> (parameter, kind, MATLAB's default))
CASES = [
    (lambda **kw: L.Conv1D(3, 2, **kw), "weight_learn_rate_factor", "weights", "learn_rate", 1.0),
    (lambda **kw: L.Conv2D(3, 2, **kw), "bias_l2_factor", "bias", "l2", 0.0),
    (lambda **kw: L.Conv3D(3, 2, **kw), "weight_l2_factor", "weights", "l2", 1.0),
    (lambda **kw: L.TransposedConv2D(3, 2, **kw), "bias_learn_rate_factor", "bias", "learn_rate", 1.0),
    (lambda **kw: L.FullyConnected(2, **kw), "weight_learn_rate_factor", "weights", "learn_rate", 1.0),
    (lambda **kw: L.BatchNorm(**kw), "scale_l2_factor", "scale", "l2", 1.0),
    (lambda **kw: L.LayerNorm(**kw), "offset_learn_rate_factor", "offset", "learn_rate", 1.0),
    (lambda **kw: L.GroupNorm(2, **kw), "offset_l2_factor", "offset", "l2", 1.0),
    (lambda **kw: L.InstanceNorm(**kw), "scale_learn_rate_factor", "scale", "learn_rate", 1.0),
]  # fmt: skip
IDS = [f"{make().__class__.__name__}.{option}" for make, option, *_ in CASES]
GET = {"learn_rate": df.get_learn_rate_factor, "l2": df.get_l2_factor}
SET = {"learn_rate": df.set_learn_rate_factor, "l2": df.set_l2_factor}


@pytest.mark.parametrize(("make", "option", "param", "kind", "default"), CASES, ids=IDS)
def test_option_default_sets_and_follows_set_factor(make, option, param, kind, default):
    assert getattr(make(), option) == default
    assert GET[kind](make(), param) == default
    layer = make(**{option: 0.25})
    assert GET[kind](layer, param) == 0.25
    moved = SET[kind](layer, param, 3.0)
    assert getattr(moved, option) == 3.0 and GET[kind](moved, param) == 3.0
    assert getattr(layer, option) == 0.25  # layers are immutable
    # re-validating the configuration keeps the factor the option holds
    again = moved.replace(name="renamed", description="x")
    assert GET[kind](again, param) == 3.0


def test_a_frozen_weight_does_not_train_and_the_factor_survives_save_and_load(tmp_path, key):
    layers = [
        L.FeatureInput(3, name="in"),
        L.FullyConnected(4, weight_learn_rate_factor=0.0, name="frozen"),
        L.Tanh(name="tanh"),
        L.FullyConnected(1, name="fc"),
    ]
    net = df.Network(layers).initialize(key=key)
    X = np.random.default_rng(0).standard_normal((32, 3)).astype(np.float32)
    T = X.sum(axis=1, keepdims=True)
    options = df.TrainingOptions(max_epochs=2, mini_batch_size=8, verbose=False)
    trained, _ = df.trainnet(X, T, net, "mse", options)
    np.testing.assert_array_equal(
        trained.learnables["frozen/weights"], net.learnables["frozen/weights"]
    )
    assert not np.array_equal(trained.learnables["frozen/bias"], net.learnables["frozen/bias"])
    assert not np.array_equal(trained.learnables["fc/weights"], net.learnables["fc/weights"])
    path = tmp_path / "net.dfn"
    df.save(path, df.set_learn_rate_factor(trained, "fc/weights", 0.5))
    loaded = df.load(path, like=net)
    assert df.get_learn_rate_factor(loaded, "frozen/weights") == 0.0
    assert df.get_learn_rate_factor(loaded, "fc/weights") == 0.5
    assert loaded.layer("fc").weight_learn_rate_factor == 0.5


def test_bad_factor_option_names_the_layer_and_the_option():
    with pytest.raises(df.LayerError, match=r"LayerNorm \(layer 'ln'\): scale_l2_factor must be a "
                       r"non-negative number.*got -1"):  # fmt: skip
        L.LayerNorm(scale_l2_factor=-1, name="ln")
    with pytest.raises(df.LayerError, match=r"weight_learn_rate_factor must be a non-negative"):
        L.Conv2D(3, 4, weight_learn_rate_factor=float("nan"))
    with pytest.raises(df.LayerError, match=r"bias_learn_rate_factor must be a non-negative"):
        L.FullyConnected(2, bias_learn_rate_factor=True)
    assert jax.tree.structure(L.Conv2D(3, 4, weight_l2_factor=2)) != jax.tree.structure(
        L.Conv2D(3, 4)
    )  # a factor is static configuration: jit retraces for another one

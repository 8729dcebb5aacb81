"""Tests of difffn/layers/_normalization.py: BatchNorm."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_tree_allclose
from jax.test_util import check_grads

import difffn as df
from difffn._layer._layer import call_layer

L = df.layers


def _randn(shape, *, seed=0, dtype=jnp.float32):
    """Test data from numpy: no JAX compilation per shape, unlike jax.random."""
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def _layer(key, channels=3, fmt="BSSC", shape=(None, 4, 4, 3)):
    layer = L.BatchNorm(
        name="bn",
        offset=_randn((channels,), seed=1),
        scale=_randn((channels,), seed=2),
        trained_mean=_randn((channels,), seed=3),
        trained_variance=1 + 0.5 * jnp.tanh(_randn((channels,), seed=4)),
    )
    return layer.initialize(df.Layout(shape, fmt), key=key)


def _reference(x, axis, offset, scale, mean, variance, epsilon=1e-5):
    shape = [1] * x.ndim
    shape[axis] = -1
    r = lambda v: jnp.reshape(v, shape)  # noqa: E731
    return r(scale) * (x - r(mean)) / jnp.sqrt(r(variance) + epsilon) + r(offset)


def test_initialize_defaults_and_idempotence(key):
    layout = df.Layout((None, 5, 5, 3), "BSSC")
    layer = L.BatchNorm().initialize(layout, key=key)
    for name, value in [("offset", 0), ("scale", 1), ("trained_mean", 0), ("trained_variance", 1)]:
        array = getattr(layer, name)
        assert array.shape == (3,)
        assert array.dtype == jnp.float32
        np.testing.assert_array_equal(array, value)
    assert layer.learnable_names == ("offset", "scale")
    assert layer.state_names == ("trained_mean", "trained_variance")
    assert layer.initialize(layout, key=jax.random.key(3)) is layer
    given = L.BatchNorm(scale=jnp.full(3, 2.0)).initialize(layout, key=key)
    np.testing.assert_array_equal(given.scale, 2.0)
    assert (L.BatchNorm().epsilon, L.BatchNorm().mean_decay, L.BatchNorm().variance_decay) == (
        1e-5,
        0.1,
        0.1,
    )


@pytest.mark.parametrize(
    ("fmt", "shape"),
    [("BSSC", (4, 3, 5, 3)), ("BC", (6, 3)), ("CB", (3, 6)), ("BTC", (2, 5, 3)), ("", (4, 3))],
)
def test_forward_uses_batch_statistics_and_updates_running_ones(key, fmt, shape):
    layer = _layer(key)
    x = _randn(shape, seed=4) * 3 + 1
    axis = fmt.index("C") if fmt else len(shape) - 1
    axes = tuple(i for i in range(len(shape)) if i != axis)
    data = np.asarray(x, np.float64)
    mean, variance = data.mean(axis=axes), data.var(axis=axes)
    m = data.size // 3
    inputs = (df.dlarray(x, fmt),) if fmt else (x,)
    (y,), (new_mean, new_variance) = call_layer(layer, inputs, training=True)
    expected = _reference(data, axis, layer.offset, layer.scale, mean, variance)
    assert df.dims(y) == fmt
    np.testing.assert_allclose(df.stripdims(y), expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(new_mean, 0.1 * mean + 0.9 * np.asarray(layer.trained_mean), 1e-5)
    unbiased = variance * m / (m - 1)
    np.testing.assert_allclose(
        new_variance, 0.1 * unbiased + 0.9 * np.asarray(layer.trained_variance), rtol=1e-5
    )


def test_predict_uses_trained_statistics_and_returns_them_unchanged(key):
    layer = _layer(key)
    x = _randn((2, 4, 4, 3), seed=5)
    y, mean, variance = layer(df.dlarray(x, "BSSC"))
    expected = _reference(
        x, 3, layer.offset, layer.scale, layer.trained_mean, layer.trained_variance
    )
    np.testing.assert_allclose(y.data, expected, rtol=1e-5, atol=1e-5)
    assert mean is layer.trained_mean and variance is layer.trained_variance


def test_custom_decay_epsilon_and_single_value_batches(key):
    layer = _layer(key).replace(mean_decay=0.5, variance_decay=1.0, epsilon=0.1)
    x = jnp.arange(3.0).reshape(1, 1, 1, 3)  # one value per channel: m = 1
    (y,), (mean, variance) = call_layer(layer, (x,), training=True)
    np.testing.assert_allclose(mean, 0.5 * x[0, 0, 0] + 0.5 * layer.trained_mean, rtol=1e-6)
    np.testing.assert_array_equal(variance, 0)
    np.testing.assert_allclose(y, jnp.broadcast_to(layer.offset, (1, 1, 1, 3)), rtol=1e-6)


def test_running_statistics_keep_dtype_and_carry_no_gradient(x64, key):
    layer = L.BatchNorm().initialize(df.Layout((None, 2, 2, 3), "BSSC"), key=key)
    x = _randn((4, 2, 2, 3), seed=6, dtype=jnp.float64)
    (y,), (mean, variance) = call_layer(layer, (x,), training=True)
    assert y.dtype == jnp.float64
    assert mean.dtype == variance.dtype == jnp.float32

    def from_state(x):
        _, (mean, variance) = call_layer(layer, (x,), training=True)
        return jnp.sum(mean) + jnp.sum(variance)

    np.testing.assert_array_equal(jax.grad(from_state)(x), 0)


def test_forward_gradients_float64(x64, key):
    layer = jax.tree.map(lambda a: a.astype(jnp.float64), _layer(key, shape=(None, 3, 3, 3)))
    x = _randn((2, 3, 3, 3), seed=7, dtype=jnp.float64)

    def loss(layer, x):
        (y,), _ = call_layer(layer, (df.dlarray(x, "BSSC"),), training=True)
        return jnp.sum(jnp.sin(y.data))

    def reference(offset, scale, x):
        mean = jnp.mean(x, axis=(0, 1, 2))
        variance = jnp.var(x, axis=(0, 1, 2))
        return jnp.sum(jnp.sin(_reference(x, 3, offset, scale, mean, variance)))

    grads = jax.jit(jax.grad(loss, argnums=(0, 1)))(layer, x)
    expected = jax.jit(jax.grad(reference, argnums=(0, 1, 2)))(layer.offset, layer.scale, x)
    assert_tree_allclose(
        (grads[0].offset, grads[0].scale, grads[1]), expected, rtol=1e-10, atol=1e-12
    )
    np.testing.assert_array_equal(grads[0].trained_mean, 0)
    check_grads(jax.jit(lambda x: loss(layer, x)), (x,), 1, ("rev",))


def test_forward_under_jit(key):
    layer = _layer(key)
    x = _randn((2, 4, 4, 3), seed=8)
    step = jax.jit(lambda layer, x: call_layer(layer, (x,), training=True))
    assert_tree_allclose(step(layer, x), call_layer(layer, (x,), training=True), rtol=1e-5)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: L.BatchNorm(epsilon=0), r"BatchNorm \(layer ''\): epsilon must be a positive"),
        (lambda: L.BatchNorm(mean_decay=1.5), r"mean_decay must be a number in \[0, 1\]; got 1.5"),
        (lambda: L.BatchNorm(variance_decay=-0.1), r"variance_decay must be a number in \[0, 1\]"),
        (lambda: L.BatchNorm(scale_initializer="glorot"), r"scale_initializer must be one of"),
        (lambda: L.BatchNorm(offset=jnp.ones((2, 2))), r"offset must be an array of shape \(any\)"),
        (
            lambda: L.BatchNorm(offset=jnp.ones(2), scale=jnp.ones(3)),
            r"one value per channel; got sizes \[2, 3\]",
        ),
    ],
)
def test_bad_arguments(make, match):
    with pytest.raises(df.LayerError, match=match):
        make()


def test_format_and_channel_errors(key):
    layer = L.BatchNorm(name="bn")
    with pytest.raises(df.FormatError, match=r"BatchNorm \(layer 'bn'\)\.initialize.*'C' axis"):
        layer.initialize(df.Layout((None, 4), "BU"), key=key)
    with pytest.raises(df.LayerError, match=r"parameter\(s\) \['offset', 'scale', 'trained_mean'"):
        layer(jnp.ones((2, 3)))
    ready = layer.initialize(df.Layout((None, 3), "BC"), key=key)
    with pytest.raises(df.LayerError, match=r"the input has 4 channels but offset has 3 values"):
        ready(df.dlarray(jnp.ones((2, 4)), "BC"))
    with pytest.raises(df.FormatError, match=r"format 'BSS' has none"):
        ready(df.dlarray(jnp.ones((2, 3, 3)), "BSS"))
    given = L.BatchNorm(trained_mean=jnp.zeros(2))
    with pytest.raises(df.LayerError, match=r"layout .* has 3 channels but trained_mean has 2"):
        given.initialize(df.Layout((None, 3), "BC"), key=key)


# -- LayerNorm, GroupNorm, InstanceNorm against flax.nnx ------------------------------------------


def _with_params(layer, channels):
    return layer.replace(
        offset=_randn((channels,), seed=11), scale=1 + 0.3 * _randn((channels,), seed=12)
    )


def _copy(module, layer):
    from flax import nnx

    assert isinstance(module, nnx.Module)
    module.bias[...] = layer.offset
    module.scale[...] = layer.scale
    return module


@pytest.mark.parametrize(
    ("layer", "fmt", "shape", "reduction"),
    [
        (L.LayerNorm(), "BTC", (2, 5, 6), (-1,)),
        (L.LayerNorm(), "BC", (4, 6), (-1,)),
        (L.LayerNorm(), "BSSC", (2, 3, 4, 6), (1, 2, 3)),
        (L.LayerNorm(operation_dimension="channel-only"), "BSSC", (2, 3, 4, 6), (-1,)),
        (L.LayerNorm(operation_dimension="batch-excluded"), "BTC", (2, 5, 6), (1, 2)),
    ],
)
def test_layer_norm_matches_nnx_layer_norm(key, layer, fmt, shape, reduction):
    from flax import nnx

    layer = _with_params(layer.initialize(df.Layout((None, *shape[1:]), fmt), key=key), 6)
    x = 2 * _randn(shape, seed=13) + 1
    y = layer(df.dlarray(x, fmt))
    module = nnx.LayerNorm(
        6, epsilon=1e-5, reduction_axes=reduction, use_fast_variance=False, rngs=nnx.Rngs(0)
    )
    assert y.format == fmt
    np.testing.assert_allclose(y.data, _copy(module, layer)(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("layer", "groups"),
    [(L.GroupNorm(2), 2), (L.GroupNorm("all-channels"), 1), (L.GroupNorm("channel-wise"), 6),
     (L.InstanceNorm(), 6)],
    ids=["GroupNorm-2", "GroupNorm-all", "GroupNorm-channel-wise", "InstanceNorm"],
)  # fmt: skip
def test_group_and_instance_norm_match_nnx_group_norm(key, layer, groups):
    from flax import nnx

    layer = _with_params(layer.initialize(df.Layout((None, 4, 3, 6), "BSSC"), key=key), 6)
    x = 2 * _randn((3, 4, 3, 6), seed=14) - 1
    y = layer(df.dlarray(x, "BSSC"))
    module = nnx.GroupNorm(
        6, num_groups=groups, epsilon=1e-5, use_fast_variance=False, rngs=nnx.Rngs(0)
    )
    np.testing.assert_allclose(y.data, _copy(module, layer)(x), rtol=1e-5, atol=1e-5)
    sscb = layer(df.permute(df.dlarray(x, "BSSC"), "SSCB"))
    np.testing.assert_allclose(df.permute(sscb, "BSSC").data, y.data, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(layer(x), y.data, rtol=1e-6)  # plain: batch first, channels last


def test_norm_layers_initialize_defaults_factors_and_idempotence(key):
    layout = df.Layout((None, 5, 4), "BTC")
    for layer in (L.LayerNorm(), L.GroupNorm(2), L.InstanceNorm()):
        ready = layer.initialize(layout, key=key)
        np.testing.assert_array_equal(ready.offset, 0)
        np.testing.assert_array_equal(ready.scale, 1)
        assert ready.offset.dtype == jnp.float32 and ready.learnable_names == ("offset", "scale")
        assert ready.initialize(layout, key=jax.random.key(1)) is ready
        assert ready.epsilon == 1e-5
        assert df.get_l2_factor(ready, "offset") == df.get_l2_factor(ready, "scale") == 1.0
    slow = L.LayerNorm(scale_learn_rate_factor=0.1, offset_l2_factor=0)
    assert df.get_learn_rate_factor(slow, "scale") == 0.1 and df.get_l2_factor(slow, "offset") == 0
    assert df.get_learn_rate_factor(L.BatchNorm(offset_learn_rate_factor=2), "offset") == 2


@pytest.mark.parametrize(
    "layer", [L.LayerNorm(), L.GroupNorm(2), L.InstanceNorm()], ids=lambda l: type(l).__name__
)
def test_norm_layer_gradients_float64(x64, key, layer):
    layer = layer.initialize(df.Layout((None, 3, 4), "BSC"), key=key)
    layer = jax.tree.map(lambda a: a.astype(jnp.float64), _with_params(layer, 4))
    x = _randn((2, 3, 4), seed=15, dtype=jnp.float64)

    def loss(offset, scale, x):
        y = layer.replace(offset=offset, scale=scale)(df.dlarray(x, "BSC"))
        return jnp.sum(jnp.sin(y.data))

    check_grads(jax.jit(loss), (layer.offset, layer.scale, x), order=2, modes=("rev",))


@pytest.mark.parametrize(
    ("layer", "layout"),
    [
        (L.LayerNorm(), df.Layout((2, 5, 3), "BTC")),
        (L.LayerNorm(operation_dimension="batch-excluded"), df.Layout((3, 2, 2), "CBT")),
        (L.GroupNorm(2), df.Layout((2, 3, 3, 4), "BSSC")),
        (L.InstanceNorm(), df.Layout((2, 3, 3, 2), "BSSC")),
        (L.BatchNorm(), df.Layout((4, 3), "BC")),
    ],
    ids=["LayerNorm", "LayerNorm-batch-excluded", "GroupNorm", "InstanceNorm", "BatchNorm"],
)
def test_check_layer_passes(layer, layout):
    report = df.check_layer(layer, layout)
    assert report.failed == 0 and report.incomplete == 0, str(report)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: L.LayerNorm(epsilon=-1), r"LayerNorm \(layer ''\): epsilon must be a positive"),
        (lambda: L.LayerNorm(operation_dimension="all"), r"operation_dimension must be one of "
         r"'auto' \| 'channel-only' \| 'spatial-channel' \| 'batch-excluded'"),
        (lambda: L.GroupNorm(0), r"GroupNorm \(layer ''\): num_groups must be a positive int, "
         r"'all-channels' or 'channel-wise'; got 0"),
        (lambda: L.GroupNorm(2, offset=jnp.ones(3), scale=jnp.ones(4)),
         r"offset, scale must all have one value per channel; got sizes \[3, 4\]"),
        (lambda: L.InstanceNorm(scale_initializer="he"), r"scale_initializer must be one of"),
        (lambda: L.InstanceNorm(scale_l2_factor="1"), r"scale_l2_factor must be a non-negative"),
    ],
)  # fmt: skip
def test_norm_layer_bad_arguments(make, match):
    with pytest.raises(df.LayerError, match=match):
        make()


def test_norm_layer_format_errors(key):
    with pytest.raises(df.LayerError, match=r"GroupNorm \(layer 'g'\): the input layout .* has 6 "
                       r"channels, which cannot be split into num_groups=4"):  # fmt: skip
        L.GroupNorm(4, name="g").initialize(df.Layout((None, 6), "BC"), key=key)
    with pytest.raises(df.FormatError, match=r"LayerNorm \(layer ''\)\.initialize.*'C' axis"):
        L.LayerNorm().initialize(df.Layout((None, 4), "BT"), key=key)
    with pytest.raises(
        df.FormatError, match=r"'batch-excluded' normalizes each observation.*no 'B'"
    ):
        L.LayerNorm(operation_dimension="batch-excluded").initialize(
            df.Layout((5, 4), "TC"), key=key
        )
    ready = L.InstanceNorm(name="in").initialize(df.Layout((None, 4, 3), "BSC"), key=key)
    with pytest.raises(df.LayerError, match=r"the input has 2 channels but offset has 3 values"):
        ready(df.dlarray(jnp.ones((1, 4, 2)), "BSC"))
    with pytest.raises(
        df.FormatError, match=r"InstanceNorm \(layer 'in'\) works along the channel"
    ):
        ready(df.dlarray(jnp.ones((1, 4, 3)), "BSU"))

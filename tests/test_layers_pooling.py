"""Tests of difffn/layers/_pooling.py: MaxPool2D and GlobalAveragePool2D."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import difffn as df

L = df.layers


def _randn(shape, *, seed=0, dtype=jnp.float32):
    """Test data from numpy: no JAX compilation per shape, unlike jax.random."""
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def max_pool_reference(x, pool, stride, padding):
    """NHWC max pooling as the max over strided slices of the -inf padded input."""
    (top, bottom), (left, right) = padding
    x = jnp.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)), constant_values=-jnp.inf)
    out_h = (x.shape[1] - pool[0]) // stride[0] + 1
    out_w = (x.shape[2] - pool[1]) // stride[1] + 1
    slices = [
        x[
            :,
            i : i + (out_h - 1) * stride[0] + 1 : stride[0],
            j : j + (out_w - 1) * stride[1] + 1 : stride[1],
        ]
        for i in range(pool[0])
        for j in range(pool[1])
    ]
    return jnp.max(jnp.stack(slices), axis=0)


@pytest.mark.parametrize(
    ("options", "padding"),
    [
        (dict(pool_size=2), ((0, 0), (0, 0))),
        (dict(pool_size=2, stride=2), ((0, 0), (0, 0))),
        (dict(pool_size=(3, 2), stride=(2, 1), padding=1), ((1, 1), (1, 1))),
        (dict(pool_size=3, stride=2, padding="same"), "same"),
    ],
)
def test_max_pool_matches_reference(key, options, padding):
    layer = L.MaxPool2D(**options)
    x = _randn((2, 7, 6, 3), seed=1)
    if padding == "same":
        padding = jax.lax.padtype_to_pads((7, 6), layer.pool_size, layer.stride, "SAME")
    y = layer(df.dlarray(x, "BSSC"))
    assert y.format == "BSSC"
    np.testing.assert_array_equal(
        y.data, max_pool_reference(x, layer.pool_size, layer.stride, padding)
    )


def test_max_pool_defaults_follow_matlab(key):
    layer = L.MaxPool2D(3)
    assert (layer.stride, layer.padding) == ((1, 1), ((0, 0), (0, 0)))
    assert layer(jnp.ones((1, 5, 6, 2))).shape == (1, 3, 4, 2)
    same = L.MaxPool2D(2, stride=3, padding="same")
    assert same(jnp.ones((1, 7, 8, 1))).shape == (1, math.ceil(7 / 3), math.ceil(8 / 3), 1)


def test_max_pool_other_format_and_integers(key):
    x = _randn((2, 6, 6, 3), seed=2)
    layer = L.MaxPool2D(2, stride=2)
    y = layer(df.permute(df.dlarray(x, "BSSC"), "SSCB"))
    assert y.format == "SSCB"
    np.testing.assert_array_equal(df.permute(y, "BSSC").data, layer(x))
    ints = L.MaxPool2D(2, padding=1)(jnp.arange(16, dtype=jnp.int32).reshape(1, 4, 4, 1))
    assert ints.dtype == jnp.int32 and int(ints.max()) == 15


def test_max_pool_gradient_float64(x64, key):
    layer = L.MaxPool2D(2, stride=2, padding="same")
    x = _randn((2, 5, 5, 2), seed=3, dtype=jnp.float64)
    grad = jax.jit(jax.grad(lambda x: jnp.sum(layer(x) ** 2)))(x)
    pads = ((0, 1), (0, 1))
    expected = jax.grad(lambda x: jnp.sum(max_pool_reference(x, (2, 2), (2, 2), pads) ** 2))(x)
    np.testing.assert_allclose(grad, expected, rtol=1e-12)


def test_global_average_pool_keeps_unit_spatial_axes(key):
    x = _randn((2, 4, 3, 5), seed=4)
    y = L.GlobalAveragePool2D()(df.dlarray(x, "BSSC"))
    assert (y.format, y.shape) == ("BSSC", (2, 1, 1, 5))
    np.testing.assert_allclose(y.data, np.asarray(x).mean(axis=(1, 2), keepdims=True), rtol=1e-5)
    grad = jax.grad(lambda x: jnp.sum(L.GlobalAveragePool2D()(x)))(x)
    np.testing.assert_allclose(grad, 1 / 12, rtol=1e-6)
    sscb = L.GlobalAveragePool2D()(df.permute(df.dlarray(x, "BSSC"), "SSCB"))
    assert sscb.shape == (1, 1, 5, 2)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: L.MaxPool2D(0), r"MaxPool2D \(layer ''\): pool_size must be a positive int"),
        (lambda: L.MaxPool2D(2, stride=-1), "stride must be a positive int"),
        (lambda: L.MaxPool2D(2, padding="full"), r"padding must be 'same'.*got 'full'"),
    ],
)
def test_bad_arguments(make, match):
    with pytest.raises(df.LayerError, match=match):
        make()


@pytest.mark.parametrize("layer", [L.MaxPool2D(2, name="p"), L.GlobalAveragePool2D(name="p")])
def test_format_errors(layer):
    with pytest.raises(df.FormatError, match=r"\(layer 'p'\) takes 2-D image data.*'BTC'"):
        layer(df.dlarray(jnp.ones((2, 3, 4)), "BTC"))


# -- AveragePool2D and GlobalMaxPool2D -------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "window", "strides", "padding"),
    [
        (dict(pool_size=2), (2, 2), (1, 1), "VALID"),
        (dict(pool_size=2, stride=2), (2, 2), (2, 2), "VALID"),
        (dict(pool_size=(3, 2), stride=(2, 1), padding=1), (3, 2), (2, 1), ((1, 1), (1, 1))),
        (dict(pool_size=3, stride=2, padding="same"), (3, 3), (2, 2), "SAME"),
    ],
)
def test_average_pool_matches_nnx_avg_pool(options, window, strides, padding):
    from flax import nnx

    x = _randn((2, 7, 6, 3), seed=5)
    y = L.AveragePool2D(**options)(df.dlarray(x, "BSSC"))
    assert y.format == "BSSC"
    np.testing.assert_allclose(
        y.data, nnx.avg_pool(x, window, strides, padding), rtol=1e-6, atol=1e-6
    )
    excluded = L.AveragePool2D(**options, padding_value="mean")(x)
    expected = nnx.avg_pool(x, window, strides, padding, count_include_pad=False)
    np.testing.assert_allclose(excluded, expected, rtol=1e-6, atol=1e-6)


def test_average_pool_defaults_and_global_max_pool():
    layer = L.AveragePool2D(2)
    assert (layer.stride, layer.padding, layer.padding_value) == ((1, 1), ((0, 0), (0, 0)), 0)
    x = _randn((2, 4, 3, 5), seed=6)
    y = L.GlobalMaxPool2D()(df.permute(df.dlarray(x, "BSSC"), "SSCB"))
    assert (y.format, y.shape) == ("SSCB", (1, 1, 5, 2))
    np.testing.assert_array_equal(y.data[0, 0].T, np.asarray(x).max(axis=(1, 2)))
    grad = jax.grad(lambda x: jnp.sum(L.GlobalMaxPool2D()(x)))(x)
    np.testing.assert_array_equal(grad, (x == x.max(axis=(1, 2), keepdims=True)).astype(x.dtype))


def test_average_pool_gradient_float64(x64):
    from jax.test_util import check_grads

    layer = L.AveragePool2D(3, stride=2, padding=1, padding_value="mean")
    x = _randn((2, 5, 5, 2), seed=7, dtype=jnp.float64)
    check_grads(jax.jit(lambda x: jnp.sin(layer(x))), (x,), order=2, modes=("rev",))


@pytest.mark.parametrize(
    "layer",
    [L.AveragePool2D(2, stride=2, padding=1, padding_value="mean"), L.GlobalMaxPool2D(),
     L.MaxPool2D(2, stride=2), L.GlobalAveragePool2D()],
    ids=lambda layer: type(layer).__name__,
)  # fmt: skip
def test_check_layer_passes(layer):
    report = df.check_layer(layer, df.Layout((2, 4, 4, 2), "BSSC"))
    assert report.failed == 0 and report.incomplete == 0, str(report)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: L.AveragePool2D(0), r"AveragePool2D \(layer ''\): pool_size must be a positive"),
        (lambda: L.AveragePool2D(2, padding_value="replicate"),
         r"padding_value must be 0 or 'mean'; got 'replicate'"),
        (lambda: L.AveragePool2D(2, padding_value=1), r"padding_value must be 0 or 'mean'"),
    ],
)  # fmt: skip
def test_average_pool_bad_arguments(make, match):
    with pytest.raises(df.LayerError, match=match):
        make()


@pytest.mark.parametrize("layer", [L.AveragePool2D(2, name="p"), L.GlobalMaxPool2D(name="p")])
def test_new_pooling_format_errors(layer):
    with pytest.raises(df.FormatError, match=r"\(layer 'p'\) takes 2-D image data.*'BTC'"):
        layer(df.dlarray(jnp.ones((2, 3, 4)), "BTC"))

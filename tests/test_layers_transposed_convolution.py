"""Tests of difffn/layers/_transposed_convolution.py: TransposedConv2D against nnx.ConvTranspose."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.test_util import check_grads

import difffn as df

L = df.layers


def _randn(shape, *, seed=0, dtype=jnp.float32):
    """Test data from numpy: no JAX compilation per shape, unlike jax.random."""
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def _nnx(layer, stride):
    """nnx.ConvTranspose with the layer's weights: nnx's kernel is flipped, I and O swapped."""
    fh, fw, filters, channels = layer.weights.shape
    module = nnx.ConvTranspose(
        channels, filters, (fh, fw), strides=stride, padding="VALID", rngs=nnx.Rngs(0)
    )
    module.kernel[...] = jnp.flip(layer.weights, axis=(0, 1)).swapaxes(2, 3)
    module.bias[...] = layer.bias
    return module


@pytest.mark.parametrize(
    ("options", "crop"),
    [
        (dict(), ((0, 0), (0, 0))),
        (dict(stride=2), ((0, 0), (0, 0))),
        (dict(stride=(2, 3), cropping=1), ((1, 1), (1, 1))),
        (dict(stride=2, cropping=(1, 0, 0, 2)), ((1, 0), (0, 2))),
        (dict(stride=2, cropping="same"), ((1, 0), (1, 0))),
    ],
)
def test_transposed_conv_matches_nnx_conv_transpose(key, options, crop):
    layer = L.TransposedConv2D((3, 3), 4, **options)
    layer = layer.initialize(df.Layout((None, 4, 5, 2), "BSSC"), key=key)
    layer = layer.replace(bias=_randn((4,), seed=1))
    x = _randn((2, 4, 5, 2), seed=2)
    y = layer(df.dlarray(x, "BSSC"))
    full = _nnx(layer, layer.stride)(x)
    if options.get("cropping") == "same":
        # output = input * stride; the total crop 3 - 2 = 1 is odd, MATLAB crops it at the top/left
        assert y.shape == (2, 8, 10, 4)
    (top, bottom), (left, right) = crop
    expected = full[:, top : full.shape[1] - bottom, left : full.shape[2] - right]
    assert y.format == "BSSC" and layer.weights.shape == (3, 3, 4, 2)
    np.testing.assert_allclose(y.data, expected, rtol=1e-5, atol=1e-5)


def test_upsamples_the_adjoint_of_a_strided_conv2d(key):
    """<TransposedConv2D(x), z> = <x, Conv2D(z)> with shared weights (no bias)."""
    up = L.TransposedConv2D(4, 3, stride=2, bias_initializer="zeros")
    up = up.initialize(df.Layout((None, 3, 3, 5), "BSSC"), key=key)
    down = L.Conv2D(4, 5, stride=2, weights=up.weights, bias=jnp.zeros(5))
    x = _randn((1, 3, 3, 5), seed=3)
    y = up(x)
    z = _randn(y.shape, seed=4)
    np.testing.assert_allclose(jnp.vdot(y, z), jnp.vdot(x, down(z)), rtol=1e-4)


def test_initializers_and_fans(key):
    layout = df.Layout((None, 4, 4, 8), "BSSC")
    layer = L.TransposedConv2D(3, 16).initialize(layout, key=key)
    bound = math.sqrt(6 / (9 * 8 + 9 * 16))
    assert float(jnp.max(jnp.abs(layer.weights))) <= bound
    np.testing.assert_array_equal(layer.bias, 0)
    assert layer.initialize(layout, key=jax.random.key(3)) is layer
    he = L.TransposedConv2D(3, 64, weights_initializer="he").initialize(layout, key=key)
    assert abs(float(jnp.std(he.weights)) - math.sqrt(2 / (9 * 8))) < 0.02
    assert df.get_l2_factor(layer, "bias") == 0.0
    assert (
        df.get_learn_rate_factor(L.TransposedConv2D(3, 2, weight_learn_rate_factor=2), "weights")
        == 2
    )


def test_gradients_float64(x64, key):
    layer = L.TransposedConv2D(3, 2, stride=2, cropping="same")
    layer = layer.initialize(df.Layout((None, 3, 3, 2), "BSSC"), key=key)
    layer = jax.tree.map(lambda a: a.astype(jnp.float64), layer)
    x = _randn((2, 3, 3, 2), seed=5, dtype=jnp.float64)

    def loss(weights, bias, x):
        return jnp.sum(jnp.sin(layer.replace(weights=weights, bias=bias)(x)))

    check_grads(jax.jit(loss), (layer.weights, layer.bias, x), order=2, modes=("rev",))


def test_check_layer_passes():
    layer = L.TransposedConv2D(3, 2, stride=2, cropping=(1, 0, 1, 0))
    report = df.check_layer(layer, df.Layout((2, 3, 3, 2), "SSCB"))
    assert report.failed == 0 and report.incomplete == 0, str(report)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: L.TransposedConv2D(0, 4), r"TransposedConv2D \(layer ''\): filter_size must be"),
        (lambda: L.TransposedConv2D(3, 4, cropping="valid"), r"cropping must be 'same'"),
        (lambda: L.TransposedConv2D(3, 4, stride=0), r"stride must be a positive int"),
        (lambda: L.TransposedConv2D(3, 4, weights=jnp.ones((3, 3, 2, 2))),
         r"weights must be an array of shape \(3, 3, 4, any\)"),
        (lambda: L.TransposedConv2D(3, 4, bias_l2_factor=-1), r"bias_l2_factor must be a non-neg"),
    ],
)  # fmt: skip
def test_bad_arguments(make, match):
    with pytest.raises(df.LayerError, match=match):
        make()


def test_format_and_channel_errors(key):
    layer = L.TransposedConv2D(3, 4, name="up")
    with pytest.raises(df.FormatError, match=r"TransposedConv2D \(layer 'up'\)\.initialize.*'BTC'"):
        layer.initialize(df.Layout((None, 5, 3), "BTC"), key=key)
    ready = layer.initialize(df.Layout((None, 4, 4, 3), "BSSC"), key=key)
    with pytest.raises(df.FormatError, match=r"takes 2-D image data.*got format 'BC'"):
        ready(df.dlarray(jnp.ones((2, 3)), "BC"))
    with pytest.raises(df.LayerError, match=r"the input has 2 channels, but weights of shape"):
        ready(df.dlarray(jnp.ones((1, 4, 4, 2)), "BSSC"))

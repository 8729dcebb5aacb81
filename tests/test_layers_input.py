"""Tests of difffn/layers/_input.py: ImageInput, FeatureInput, SequenceInput."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_tree_allclose

import difffn as df

L = df.layers


def _randn(shape, *, seed=0, dtype=jnp.float32):
    """Test data from numpy: no JAX compilation per shape, unlike jax.random."""
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def _images(key, shape=(6, 3, 4, 2)):
    return 2 * _randn(shape) + 1


def test_input_layouts():
    assert L.ImageInput((28, 28, 1)).input_layout == df.Layout((None, 28, 28, 1), "BSSC")
    assert L.ImageInput((8, 6)).input_size == (8, 6, 1)
    assert L.FeatureInput(5).input_layout == df.Layout((None, 5), "BC")
    assert L.SequenceInput(3).input_layout == df.Layout((None, None, 3), "BTC")
    assert all(isinstance(layer, df.InputLayer) for layer in (L.ImageInput((2, 2, 1)),))


def test_matlab_default_normalizations():
    assert L.ImageInput((2, 2, 1)).normalization == "zerocenter"
    assert L.FeatureInput(2).normalization == "none"
    assert L.SequenceInput(2).normalization == "none"
    assert L.ImageInput((2, 2, 1)).needs_statistics()
    assert not L.FeatureInput(2).needs_statistics()


def test_zerocenter_statistics_are_per_channel(key):
    x = _images(key)
    layer = L.ImageInput((3, 4, 2)).with_statistics(x)
    assert layer.mean.shape == (2,)
    np.testing.assert_allclose(layer.mean, np.asarray(x).mean(axis=(0, 1, 2)), rtol=1e-6)
    assert not layer.needs_statistics()
    y = layer(x)
    assert y.format == "BSSC"
    np.testing.assert_allclose(y.data, x - layer.mean.reshape(1, 1, 1, 2), rtol=1e-6)


@pytest.mark.parametrize(
    ("dimension", "shape"), [("auto", (2,)), ("channel", (2,)), ("element", (3, 4, 2)), ("all", ())]
)
def test_normalization_dimension_sets_statistics_shape(key, dimension, shape):
    x = _images(key)
    layer = L.ImageInput((3, 4, 2), normalization="zscore", normalization_dimension=dimension)
    layer = layer.with_statistics(x)
    assert layer.mean.shape == shape
    assert layer.standard_deviation.shape == shape
    y = np.asarray(layer(x).data)
    axes = {"auto": (0, 1, 2), "channel": (0, 1, 2), "element": (0,), "all": None}[dimension]
    np.testing.assert_allclose(y.mean(axis=axes), 0, atol=1e-5)
    np.testing.assert_allclose(y.std(axis=axes), 1, atol=1e-5)


@pytest.mark.parametrize(
    ("normalization", "low", "high"), [("rescale-symmetric", -1, 1), ("rescale-zero-one", 0, 1)]
)
def test_rescale(key, normalization, low, high):
    x = _images(key)
    layer = L.ImageInput((3, 4, 2), normalization=normalization).with_statistics(x)
    assert layer.min.shape == layer.max.shape == (2,)
    y = np.asarray(layer(x).data)
    np.testing.assert_allclose(y.min(axis=(0, 1, 2)), low, atol=1e-6)
    np.testing.assert_allclose(y.max(axis=(0, 1, 2)), high, atol=1e-6)


def test_with_statistics_fills_only_missing_statistics(key):
    x = _images(key)
    layer = L.ImageInput((3, 4, 2), normalization="zscore", mean=jnp.array([1.0, 2.0]))
    assert layer.needs_statistics()
    filled = layer.with_statistics(x)
    np.testing.assert_array_equal(filled.mean, [1.0, 2.0])
    assert filled.standard_deviation.shape == (2,)
    assert filled.with_statistics(x * 10) is filled


def test_given_statistics_may_have_any_broadcastable_shape(key):
    x = _images(key)
    mean_image = jnp.arange(24.0).reshape(3, 4, 2)
    layer = L.ImageInput((3, 4, 2), mean=mean_image)
    np.testing.assert_allclose(layer(x).data, x - mean_image[None], rtol=1e-6)
    assert L.ImageInput((3, 4, 2), mean=0.5)(x).shape == x.shape
    assert L.ImageInput((3, 4, 2), mean=jnp.ones((1, 1, 2)))(x).shape == x.shape


def test_zero_spread_does_not_divide_by_zero():
    x = jnp.ones((4, 3))
    y = L.FeatureInput(3, normalization="zscore").with_statistics(x)(x)
    np.testing.assert_array_equal(y.data, 0)
    y = L.FeatureInput(3, normalization="rescale-zero-one").with_statistics(x)(x)
    np.testing.assert_array_equal(y.data, 0)


def test_feature_and_sequence_statistics(key):
    x = _randn((5, 7, 3), seed=1) * 2 + 1
    layer = L.SequenceInput(3, normalization="zerocenter").with_statistics(x)
    assert layer.mean.shape == (3,)
    np.testing.assert_allclose(layer.mean, np.asarray(x).mean(axis=(0, 1)), rtol=1e-5)
    y = layer(df.dlarray(x, "BTC"))
    assert y.format == "BTC"
    np.testing.assert_allclose(np.asarray(y.data).mean(axis=(0, 1)), 0, atol=1e-5)
    features = L.FeatureInput(3, normalization="zscore").with_statistics(x[:, 0])
    assert features.mean.shape == features.standard_deviation.shape == (3,)


def test_none_and_function_normalization(key):
    x = _images(key)
    assert_tree_allclose(L.ImageInput((3, 4, 2), normalization="none")(x).data, x)
    layer = L.ImageInput((3, 4, 2), normalization=jnp.tanh)
    assert not layer.needs_statistics()
    np.testing.assert_allclose(layer(x).data, jnp.tanh(x), rtol=1e-6)


def test_integer_images_become_float32():
    x = jnp.arange(8, dtype=jnp.uint8).reshape(2, 2, 2, 1)
    y = L.ImageInput((2, 2, 1), normalization="none")(x)
    assert y.dtype == jnp.float32


def test_missing_statistics_error_names_the_fixes():
    layer = L.ImageInput((2, 2, 1), name="images")
    with pytest.raises(
        df.LayerError,
        match=r"ImageInput \(layer 'images'\): normalization 'zerocenter' needs 'mean', which "
        r"is None\. trainnet computes it.*with_statistics.*mean=\.\.\..*normalization='none'",
    ):
        layer(jnp.zeros((1, 2, 2, 1)))


def test_format_and_size_errors():
    layer = L.ImageInput((2, 3, 1), normalization="none", name="in")
    with pytest.raises(df.FormatError, match=r"'BSSC'; got 'SSCB'.*df\.permute\(x, 'BSSC'\)"):
        layer(df.dlarray(jnp.zeros((2, 3, 1, 4)), "SSCB"))
    with pytest.raises(df.FormatError, match=r"got 'BC'.*give it the format 'BSSC'"):
        layer(df.dlarray(jnp.zeros((2, 3)), "BC"))
    with pytest.raises(
        df.LayerError, match=r"expects input of shape \(any, 2, 3, 1\).*\(4, 3, 2, 1\)"
    ):
        layer(jnp.zeros((4, 3, 2, 1)))
    sequence = L.SequenceInput(2, min_length=5)
    with pytest.raises(df.LayerError, match="length 3 but min_length is 5"):
        sequence(jnp.zeros((1, 3, 2)))


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: L.ImageInput((2, -2, 1)), r"ImageInput \(layer ''\): input_size must be"),
        (lambda: L.ImageInput((2, 2, 1), normalization="center"), "normalization must be one of"),
        (lambda: L.FeatureInput(0), "num_features must be a positive int; got 0"),
        (lambda: L.SequenceInput(2, min_length=0), "min_length must be a positive int"),
        (lambda: L.FeatureInput(3, normalization_dimension="pixel"), "normalization_dimension"),
        (lambda: L.FeatureInput(3, mean=jnp.ones(4)), r"mean must be .*shape \(3,\).*got an array"),
        (lambda: L.ImageInput((2, 2, 3), mean=jnp.ones((2, 2))), r"mean must be .*\(2, 2, 3\)"),
    ],
)
def test_bad_arguments(make, match):
    with pytest.raises(df.LayerError, match=match):
        make()


def test_statistics_are_non_trained_leaves_and_jit(key):
    x = _images(key)
    layer = L.ImageInput((3, 4, 2), normalization="zscore").with_statistics(x)
    leaves = jax.tree.leaves(layer)
    assert len(leaves) == 2
    y = jax.jit(lambda layer, x: layer(x))(layer, x)
    assert_tree_allclose(y, layer(x), rtol=1e-6)


def test_input_gradient_float64(x64, key):
    x = _randn((3, 4), seed=2, dtype=jnp.float64)
    layer = L.FeatureInput(4, normalization="zscore").with_statistics(x)
    grad = jax.grad(lambda x: jnp.sum(df.stripdims(layer(x)) ** 2))(x)
    mean, std = layer.mean[None], layer.standard_deviation[None]
    expected = jax.grad(lambda x: jnp.sum(((x - mean) / std) ** 2))(x)
    assert grad.dtype == jnp.float64
    np.testing.assert_allclose(grad, expected, rtol=1e-12)


def test_python_number_statistics_are_float32_even_with_x64(x64):
    layer = L.FeatureInput(3, normalization="zscore", mean=0.5, standard_deviation=[1, 2, 4])
    assert layer.mean.dtype == layer.standard_deviation.dtype == jnp.float32
    assert layer(jnp.ones((2, 3), jnp.float32)).dtype == jnp.float32

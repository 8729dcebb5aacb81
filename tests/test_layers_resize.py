"""Tests of difffn/layers/_resize.py: Resize2D against jax.image.resize and index arithmetic."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import difffn as df

L = df.layers


def _randn(shape, *, seed=0, dtype=jnp.float32):
    """Test data from numpy: no JAX compilation per shape, unlike jax.random."""
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


@pytest.mark.parametrize(
    ("options", "out"),
    [
        (dict(scale=2), (10, 8)),
        (dict(scale=(0.4, 1.5)), (2, 6)),
        (dict(output_size=(7, 3)), (7, 3)),
        (dict(output_size=(10, None)), (10, 8)),
    ],
)
@pytest.mark.parametrize(("method", "jax_method"), [("nearest", "nearest"), ("bilinear", "linear")])
def test_half_pixel_resize_matches_jax_image_resize(options, out, method, jax_method):
    """Half-pixel coordinates, MATLAB's round (halves up): jax.image.resize without antialias."""
    x = _randn((2, 5, 4, 3), seed=1)
    y = L.Resize2D(**options, method=method)(df.dlarray(x, "BSSC"))
    expected = jax.image.resize(x, (2, *out, 3), jax_method, antialias=False)
    assert y.format == "BSSC" and y.shape == (2, *out, 3)
    np.testing.assert_allclose(y.data, expected, rtol=1e-5, atol=1e-5)


def test_asymmetric_and_floor_modes_follow_their_formulas():
    x = jnp.arange(5.0).reshape(1, 5, 1, 1)
    nearest = L.Resize2D(
        output_size=(8, 1), geometric_transform_mode="asymmetric", nearest_rounding_mode="floor"
    )
    # source index floor(dst * 5 / 8)
    expected = np.floor(np.arange(8) * 5 / 8)
    np.testing.assert_array_equal(nearest(x)[0, :, 0, 0], expected)
    linear = L.Resize2D(scale=(2, 1), method="bilinear", geometric_transform_mode="asymmetric")
    np.testing.assert_allclose(linear(x)[0, :, 0, 0], np.minimum(np.arange(10) / 2, 4), 1e-6)
    # a given scale maps coordinates by itself (ONNX's rule), not by output / input sizes
    half = L.Resize2D(scale=(0.5, 1), method="bilinear")(x)  # (dst + 0.5) / 0.5 - 0.5
    np.testing.assert_allclose(half[0, :, 0, 0], [0.5, 2.5], rtol=1e-6)
    rounded = L.Resize2D(output_size=(3, 1))(x)  # (dst + 0.5) * 5 / 3 - 0.5 = 0.33, 2, 3.67
    np.testing.assert_array_equal(rounded[0, :, 0, 0], [0.0, 2.0, 4.0])


def test_reference_input_and_other_formats():
    layer = L.Resize2D(enable_reference_input=True, method="bilinear")
    assert layer.input_names == ("in", "ref") and layer.num_inputs == 2
    x = df.dlarray(_randn((2, 4, 4, 3), seed=2), "BSSC")
    ref = df.dlarray(jnp.zeros((2, 6, 5, 1)), "BSSC")
    assert layer(x, ref).shape == (2, 6, 5, 3)
    sscb = L.Resize2D(scale=2)(df.permute(x, "SSCB"))
    assert sscb.format == "SSCB"
    np.testing.assert_array_equal(df.permute(sscb, "BSSC").data, L.Resize2D(scale=2)(x).data)
    assert L.Resize2D(scale=2).replace(scale=None, output_size=(3, 3)).num_inputs == 1


def test_bilinear_gradient_float64_and_check_layer(x64):
    layer = L.Resize2D(output_size=(5, 7), method="bilinear")
    x = _randn((2, 3, 4, 2), seed=3, dtype=jnp.float64)
    check_grads(jax.jit(lambda x: jnp.sin(layer(x))), (x,), order=2, modes=("rev",))


@pytest.mark.parametrize("layer", [L.Resize2D(scale=2), L.Resize2D(output_size=(5, 3),
                         method="bilinear")], ids=["nearest", "bilinear"])  # fmt: skip
def test_check_layer_passes(layer):
    report = df.check_layer(layer, df.Layout((2, 3, 4, 2), "BSSC"))
    assert report.failed == 0 and report.incomplete == 0, str(report)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: L.Resize2D(), r"Resize2D \(layer ''\): give exactly one of scale, output_size "
         r"or enable_reference_input=True; got none"),
        (lambda: L.Resize2D(scale=2, output_size=(4, 4)), r"got \['scale', 'output_size'\]"),
        (lambda: L.Resize2D(scale=0), r"scale must be a positive number or a pair"),
        (lambda: L.Resize2D(output_size=(None, None)), r"output_size must be a pair \(h, w\)"),
        (lambda: L.Resize2D(scale=2, method="bicubic"), r"method must be one of 'nearest' \| "
         r"'bilinear'; got 'bicubic'"),
        (lambda: L.Resize2D(scale=2, nearest_rounding_mode="onnx-10"),
         r"nearest_rounding_mode must be one of 'round' \| 'floor'"),
        (lambda: L.Resize2D(scale=2, geometric_transform_mode="align-corners"),
         r"geometric_transform_mode must be one of 'half-pixel' \| 'asymmetric'"),
    ],
)  # fmt: skip
def test_bad_arguments(make, match):
    with pytest.raises(df.LayerError, match=match):
        make()


def test_format_errors():
    with pytest.raises(df.FormatError, match=r"Resize2D \(layer 'r'\) takes 2-D image data.*'BTC'"):
        L.Resize2D(scale=2, name="r")(df.dlarray(jnp.ones((2, 3, 4)), "BTC"))

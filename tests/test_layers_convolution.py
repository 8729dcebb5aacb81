"""Tests of difffn/layers/_convolution.py: Conv2D (plain, strided, dilated, grouped)."""

from __future__ import annotations

import functools
import math

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


@functools.partial(jax.jit, static_argnums=(3, 4, 5, 6))
def conv_reference(x, w, b, stride, padding, dilation, groups):
    """Direct NHWC convolution: a sum over filter taps of strided slices (differentiable)."""
    fh, fw, per_group, filters = w.shape
    if padding == "same":
        window = ((fh - 1) * dilation[0] + 1, (fw - 1) * dilation[1] + 1)
        padding = jax.lax.padtype_to_pads(x.shape[1:3], window, stride, "SAME")
    (top, bottom), (left, right) = padding
    x = jnp.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)))
    out_h = (x.shape[1] - (fh - 1) * dilation[0] - 1) // stride[0] + 1
    out_w = (x.shape[2] - (fw - 1) * dilation[1] - 1) // stride[1] + 1
    per_group_out = filters // groups
    outputs = []
    for g in range(groups):
        xg = x[..., g * per_group : (g + 1) * per_group]
        wg = w[..., g * per_group_out : (g + 1) * per_group_out]
        total = 0
        for i in range(fh):
            for j in range(fw):
                r, c = i * dilation[0], j * dilation[1]
                patch = xg[
                    :,
                    r : r + (out_h - 1) * stride[0] + 1 : stride[0],
                    c : c + (out_w - 1) * stride[1] + 1 : stride[1],
                ]
                total = total + jnp.einsum("nhwc,cf->nhwf", patch, wg[i, j])
        outputs.append(total)
    return jnp.concatenate(outputs, axis=-1) + b[None, None, None, :]


CASES = [
    dict(filter_size=3, num_filters=4),
    dict(filter_size=(2, 3), num_filters=3, stride=(2, 1), padding="same"),
    dict(filter_size=3, num_filters=2, stride=2, padding="same"),
    dict(filter_size=2, num_filters=2, dilation=2, padding="same"),
    dict(filter_size=(3, 2), num_filters=4, padding=(1, 0, 2, 1), stride=(1, 2)),
    dict(filter_size=1, num_filters=4, groups=2),
    dict(filter_size=2, num_filters=4, groups="channel-wise", padding=1),
]


def _layer(key, case, channels=4, size=(7, 6)):
    """A layer with given (numpy-drawn) parameters: initialize only checks them."""
    groups = channels if case.get("groups") == "channel-wise" else case.get("groups", 1)
    fh, fw = (
        (case["filter_size"],) * 2 if isinstance(case["filter_size"], int) else case["filter_size"]
    )
    weights = _randn((fh, fw, channels // groups, case["num_filters"]), seed=10)
    layer = L.Conv2D(**case, weights=weights, bias=_randn((case["num_filters"],), seed=11))
    return layer.initialize(df.Layout((None, *size, channels), "BSSC"), key=key)


def _reference_args(layer, channels):
    groups = channels if layer.groups == "channel-wise" else layer.groups
    return layer.stride, layer.padding, layer.dilation, groups


@pytest.mark.parametrize("case", CASES)
def test_conv2d_matches_reference(key, case):
    k_layer = key
    layer = _layer(k_layer, case)
    x = _randn((2, 7, 6, 4), seed=2)
    y = layer(df.dlarray(x, "BSSC"))
    expected = conv_reference(x, layer.weights, layer.bias, *_reference_args(layer, 4))
    assert y.format == "BSSC"
    np.testing.assert_allclose(y.data, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("size", [5, 6, 7, 8])
@pytest.mark.parametrize("stride", [1, 2, 3])
def test_same_padding_output_size_is_ceil_of_input_over_stride(key, size, stride):
    layer = L.Conv2D(3, 1, stride=stride, padding="same")
    layer = layer.initialize(df.Layout((None, size, size + 1, 1), "BSSC"), key=key)
    y = layer(jnp.ones((1, size, size + 1, 1)))
    assert y.shape == (1, math.ceil(size / stride), math.ceil((size + 1) / stride), 1)


def test_other_image_formats_and_plain_input(key):
    layer = _layer(key, CASES[1])
    x = df.dlarray(_randn((2, 7, 6, 4), seed=3), "BSSC")
    y = layer(x)
    y_sscb = layer(df.permute(x, "SSCB"))
    assert y_sscb.format == "SSCB"
    assert_tree_allclose(df.permute(y_sscb, "BSSC"), y, rtol=1e-5, atol=1e-6)
    plain = layer(x.data)
    assert not isinstance(plain, df.FormattedArray)
    np.testing.assert_allclose(plain, y.data, rtol=1e-6)


def test_initialize_shapes_fans_and_idempotence(key):
    layer = L.Conv2D((3, 2), 6, groups=2)
    layout = df.Layout((None, 8, 8, 4), "BSSC")
    once = layer.initialize(layout, key=key)
    assert once.weights.shape == (3, 2, 2, 6)
    assert once.bias.shape == (6,)
    assert once.weights.dtype == once.bias.dtype == jnp.float32
    np.testing.assert_array_equal(once.bias, 0)
    bound = math.sqrt(6 / (3 * 2 * 2 + 3 * 2 * 3))  # glorot fans per group
    assert float(jnp.max(jnp.abs(once.weights))) <= bound
    twice = once.initialize(layout, key=jax.random.key(9))
    assert twice is once
    given = L.Conv2D(1, 2, weights=jnp.ones((1, 1, 4, 2))).initialize(layout, key=key)
    np.testing.assert_array_equal(given.weights, 1)
    assert given.bias.shape == (2,)


def test_initializers(key):
    layout = df.Layout((None, 4, 4, 3), "BSSC")
    he = L.Conv2D(3, 64, weights_initializer="he").initialize(layout, key=key)
    assert abs(float(jnp.std(he.weights)) - math.sqrt(2 / 27)) < 0.03
    ones = L.Conv2D(1, 2, weights_initializer="ones", bias_initializer="ones")
    ones = ones.initialize(layout, key=key)
    np.testing.assert_array_equal(ones.weights, 1)
    np.testing.assert_array_equal(ones.bias, 1)
    custom = L.Conv2D(1, 2, weights_initializer=jax.nn.initializers.constant(0.5))
    np.testing.assert_array_equal(custom.initialize(layout, key=key).weights, 0.5)


def test_conv2d_gradients_float64(x64, key):
    k_layer = key
    layer = _layer(k_layer, CASES[2], channels=2, size=(5, 5))
    layer = jax.tree.map(lambda a: a.astype(jnp.float64), layer)
    x = _randn((2, 5, 5, 2), seed=4, dtype=jnp.float64)
    stride, padding, dilation, groups = _reference_args(layer, 2)

    def loss(layer, x):
        return jnp.sum(jnp.sin(layer(x)))

    def reference(w, b, x):
        return jnp.sum(jnp.sin(conv_reference(x, w, b, stride, padding, dilation, groups)))

    grads = jax.jit(jax.grad(loss, argnums=(0, 1)))(layer, x)
    assert isinstance(grads[0], L.Conv2D)
    expected = jax.jit(jax.grad(reference, argnums=(0, 1, 2)))(layer.weights, layer.bias, x)
    assert_tree_allclose(
        (grads[0].weights, grads[0].bias, grads[1]), expected, rtol=1e-10, atol=1e-12
    )


def test_vmap_over_inputs(key):
    layer = _layer(key, CASES[0])
    xs = _randn((3, 2, 7, 6, 4), seed=5)
    ys = jax.vmap(layer)(xs)
    np.testing.assert_allclose(ys[1], layer(xs[1]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: L.Conv2D(-1, 4), r"Conv2D \(layer ''\): filter_size must be a positive int"),
        (lambda: L.Conv2D(3, 0, name="c"), r"Conv2D \(layer 'c'\): num_filters must be a positive"),
        (lambda: L.Conv2D(3, 4, padding="valid"), r"padding must be 'same'.*got 'valid'"),
        (lambda: L.Conv2D(3, 4, padding=-1), "padding must be"),
        (lambda: L.Conv2D(3, 4, stride=(1, 0)), r"stride must be .*got \(1, 0\)"),
        (lambda: L.Conv2D(3, 4, weights_initializer="xavier"), r"weights_initializer must be"),
        (lambda: L.Conv2D(3, 4, bias_initializer="he"), r"bias_initializer must be one of"),
        (lambda: L.Conv2D(3, 5, groups=2), r"num_filters must be a multiple of groups=2"),
        (lambda: L.Conv2D(3, 4, groups=0), r"groups must be a positive int"),
        (lambda: L.Conv2D(3, 4, weights=jnp.ones((3, 3, 2))), r"weights must be an array of shape"),
        (lambda: L.Conv2D(3, 4, bias=jnp.ones(3)), r"bias must be an array of shape \(4\)"),
    ],
)
def test_bad_arguments(make, match):
    with pytest.raises(df.LayerError, match=match):
        make()


def test_format_and_channel_errors(key):
    layer = L.Conv2D(3, 4, name="conv")
    with pytest.raises(df.FormatError, match=r"Conv2D \(layer 'conv'\)\.initialize.*'BC'"):
        layer.initialize(df.Layout((None, 10), "BC"), key=key)
    with pytest.raises(df.LayerError, match=r"needs the number of channels"):
        layer.initialize(df.Layout((None, 8, 8, None), "BSSC"), key=key)
    with pytest.raises(df.LayerError, match=r"parameter\(s\) \['weights', 'bias'\] are None"):
        layer(jnp.ones((1, 4, 4, 3)))
    ready = layer.initialize(df.Layout((None, 8, 8, 3), "BSSC"), key=key)
    with pytest.raises(df.FormatError, match=r"takes 2-D image data.*got format 'BC'"):
        ready(df.dlarray(jnp.ones((2, 3)), "BC"))
    with pytest.raises(df.FormatError, match=r"got a plain array of shape \(2, 3\)"):
        ready(jnp.ones((2, 3)))
    with pytest.raises(df.LayerError, match=r"the input has 5 channels, but weights of shape"):
        ready(df.dlarray(jnp.ones((1, 8, 8, 5)), "BSSC"))
    given = L.Conv2D(3, 4, weights=jnp.ones((3, 3, 2, 4)))
    with pytest.raises(df.LayerError, match=r"layout .* has 3 channels, but weights of shape"):
        given.initialize(df.Layout((None, 8, 8, 3), "BSSC"), key=key)
    grouped = L.Conv2D(1, 4, groups=2)
    with pytest.raises(df.LayerError, match=r"3 channels, which cannot be split into groups=2"):
        grouped.initialize(df.Layout((None, 8, 8, 3), "BSSC"), key=key)


# -- Conv1D and Conv3D against flax.nnx.Conv ------------------------------------------------------


def _nnx_conv(w, b, **options):
    from flax import nnx

    conv = nnx.Conv(w.shape[-2], w.shape[-1], w.shape[:-2], rngs=nnx.Rngs(0), **options)
    conv.kernel[...] = w
    conv.bias[...] = b
    return conv


@pytest.mark.parametrize(
    ("options", "nnx_options"),
    [
        (dict(), dict(padding="VALID")),
        (dict(padding="causal", dilation=2), dict(padding="CAUSAL", kernel_dilation=2)),
        (dict(padding="same", stride=2), dict(padding="SAME", strides=2)),
        (dict(padding=(2, 1)), dict(padding=[(2, 1)])),
    ],
)
def test_conv1d_matches_nnx_conv(key, options, nnx_options):
    layer = L.Conv1D(3, 5, **options).initialize(df.Layout((None, None, 4), "BTC"), key=key)
    layer = layer.replace(bias=_randn((5,), seed=1))
    x = _randn((2, 9, 4), seed=2)
    y = layer(df.dlarray(x, "BTC"))
    assert y.format == "BTC" and layer.weights.shape == (3, 4, 5)
    expected = _nnx_conv(layer.weights, layer.bias, **nnx_options)(x)
    np.testing.assert_allclose(y.data, expected, rtol=1e-5, atol=1e-5)
    # channels-first sequences and 1-D images slide the same window
    cbt = layer(df.dlarray(jnp.transpose(x, (2, 0, 1)), "CBT"))
    np.testing.assert_allclose(jnp.transpose(cbt.data, (1, 2, 0)), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(layer(df.dlarray(x, "BSC")).data, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(layer(x), expected, rtol=1e-5, atol=1e-5)  # plain: BTC


def test_conv1d_causal_output_sees_only_the_past(key):
    layer = L.Conv1D(4, 2, padding="causal", dilation=3)
    layer = layer.initialize(df.Layout((None, None, 1), "BTC"), key=key)
    x = _randn((1, 20, 1), seed=3)
    y = layer(x)
    later = x.at[:, 10:].set(100.0)
    np.testing.assert_allclose(layer(later)[:, :10], y[:, :10], rtol=1e-6)
    assert not np.allclose(layer(later)[:, 10:], y[:, 10:])


@pytest.mark.parametrize(
    ("options", "nnx_options"),
    [
        (dict(), dict(padding="VALID")),
        (dict(padding="same", stride=(1, 2, 2)), dict(padding="SAME", strides=(1, 2, 2))),
        (dict(padding=((1, 0), (0, 1), (1, 1)), dilation=(1, 2, 1)),
         dict(padding=[(1, 0), (0, 1), (1, 1)], kernel_dilation=(1, 2, 1))),
    ],
)  # fmt: skip
def test_conv3d_matches_nnx_conv(key, options, nnx_options):
    layout = df.Layout((None, 5, 6, 4, 2), "BSSSC")
    layer = L.Conv3D((2, 3, 2), 3, **options).initialize(layout, key=key)
    layer = layer.replace(bias=_randn((3,), seed=4))
    x = _randn((2, 5, 6, 4, 2), seed=5)
    y = layer(df.dlarray(x, "BSSSC"))
    assert y.format == "BSSSC" and layer.weights.shape == (2, 3, 2, 2, 3)
    expected = _nnx_conv(layer.weights, layer.bias, **nnx_options)(x)
    np.testing.assert_allclose(y.data, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("padding_value", [1.5, "symmetric-include-edge", "replicate"])
def test_conv2d_padding_value(key, padding_value):
    layer = L.Conv2D(3, 2, padding=1, padding_value=padding_value)
    layer = layer.initialize(df.Layout((None, 5, 5, 2), "BSSC"), key=key)
    x = _randn((2, 5, 5, 2), seed=6)
    mode = {"symmetric-include-edge": "symmetric", "replicate": "edge"}.get(padding_value)
    widths = ((0, 0), (1, 1), (1, 1), (0, 0))
    padded = np.pad(
        np.asarray(x),
        widths,
        mode=mode or "constant",
        **({} if mode else {"constant_values": padding_value}),
    )
    expected = _nnx_conv(layer.weights, layer.bias, padding="VALID")(jnp.asarray(padded))
    np.testing.assert_allclose(layer(x), expected, rtol=1e-5, atol=1e-5)


def test_conv1d_and_conv3d_gradients_float64(x64, key):
    from jax.test_util import check_grads

    for layer, layout, shape, fmt in [
        (L.Conv1D(3, 2, padding="causal", stride=2), (None, None, 2), (2, 7, 2), "BTC"),
        (L.Conv3D(2, 2, padding="same"), (None, 3, 3, 3, 2), (2, 3, 3, 3, 2), "BSSSC"),
    ]:
        layer = layer.initialize(df.Layout(layout, fmt), key=key)
        layer = jax.tree.map(lambda a: a.astype(jnp.float64), layer)
        x = _randn(shape, seed=7, dtype=jnp.float64)

        def loss(weights, bias, x, layer=layer, fmt=fmt):
            y = layer.replace(weights=weights, bias=bias)(df.dlarray(x, fmt))
            return jnp.sum(jnp.sin(y.data))

        check_grads(jax.jit(loss), (layer.weights, layer.bias, x), order=1, modes=("rev",))


@pytest.mark.parametrize(
    ("layer", "layout"),
    [
        (L.Conv1D(3, 4, padding="causal", dilation=2), df.Layout((2, 6, 3), "BTC")),
        (L.Conv1D(2, 3, padding="same", stride=2), df.Layout((2, 3, 5), "CBT")),
        (L.Conv2D(3, 4, padding=1, padding_value="replicate", groups=2), df.Layout((2, 4, 4, 2), "BSSC")),
        (L.Conv3D(2, 3, padding="same"), df.Layout((2, 3, 3, 3, 2), "BSSSC")),
    ],
    ids=["Conv1D-BTC", "Conv1D-CBT", "Conv2D-grouped", "Conv3D"],
)  # fmt: skip
def test_check_layer_passes(layer, layout):
    report = df.check_layer(layer, layout)
    assert report.failed == 0 and report.incomplete == 0, str(report)


def test_factor_options(key):
    layer = L.Conv1D(3, 4, weight_learn_rate_factor=0.5, bias_l2_factor=2.0)
    assert df.get_learn_rate_factor(layer, "weights") == 0.5
    assert df.get_l2_factor(layer, "bias") == 2.0
    assert df.get_l2_factor(L.Conv3D(2, 4), "bias") == 0.0  # MATLAB's BiasL2Factor
    assert df.get_l2_factor(L.Conv2D(2, 4), "weights") == 1.0
    frozen = df.set_learn_rate_factor(L.Conv2D(3, 4), "weights", 0.0)
    assert frozen.weight_learn_rate_factor == 0.0
    assert df.get_learn_rate_factor(frozen.replace(stride=2), "weights") == 0.0


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: L.Conv1D((3, 3), 4), r"Conv1D \(layer ''\): filter_size must be a positive int"),
        (lambda: L.Conv1D(3, 4, padding="valid"), r"padding must be 'same', 'causal'.*'valid'"),
        (lambda: L.Conv1D(3, 4, padding=(1, 2, 3)), r"padding must be .*a pair \(left, right\)"),
        (lambda: L.Conv1D(3, 4, padding_value="wrap"), r"padding_value must be a number, "),
        (lambda: L.Conv1D(3, 4, weight_learn_rate_factor=-1), r"weight_learn_rate_factor must "
         r"be a non-negative number"),
        (lambda: L.Conv3D((3, 3), 4), r"Conv3D \(layer ''\): filter_size must be a positive int "
         r"or 3 positive ints"),
        (lambda: L.Conv3D(3, 4, padding=((1, 1), (1, 1))), r"padding must be 'same', a non-neg"),
        (lambda: L.Conv3D(3, 4, weights=jnp.ones((3, 3, 3, 4))),
         r"weights must be an array of shape \(3, 3, 3, any, 4\)"),
        (lambda: L.Conv2D(3, 4, padding_value=float("nan")), r"padding_value must be a finite"),
    ],
)  # fmt: skip
def test_conv1d_conv3d_bad_arguments(make, match):
    with pytest.raises(df.LayerError, match=match):
        make()


def test_conv1d_conv3d_format_errors(key):
    with pytest.raises(df.FormatError, match=r"Conv1D \(layer 'c'\)\.initialize.*'BSSC'.*Conv2D"):
        L.Conv1D(3, 4, name="c").initialize(df.Layout((None, 8, 8, 3), "BSSC"), key=key)
    with pytest.raises(df.FormatError, match=r"Conv1D \(layer ''\)\.initialize.*'BC'"):
        L.Conv1D(3, 4).initialize(df.Layout((None, 3), "BC"), key=key)
    ready = L.Conv1D(3, 4).initialize(df.Layout((None, None, 3), "BTC"), key=key)
    with pytest.raises(df.FormatError, match=r"Conv1D \(layer ''\) takes a sequence.*'BSSC'"):
        ready(df.dlarray(jnp.ones((1, 4, 4, 3)), "BSSC"))
    with pytest.raises(
        df.FormatError, match=r"takes sequences; got a plain array of shape \(4, 3\)"
    ):
        ready(jnp.ones((4, 3)))
    with pytest.raises(df.LayerError, match=r"the input has 2 channels, but weights of shape"):
        ready(df.dlarray(jnp.ones((1, 5, 2)), "BTC"))
    with pytest.raises(df.FormatError, match=r"Conv3D \(layer ''\)\.initialize.*'BSSC'"):
        L.Conv3D(3, 4).initialize(df.Layout((None, 8, 8, 3), "BSSC"), key=key)
    volume = L.Conv3D(1, 2).initialize(df.Layout((None, 2, 2, 2, 1), "BSSSC"), key=key)
    with pytest.raises(df.FormatError, match=r"Conv3D \(layer ''\) takes 3-D image data.*'BSSC'"):
        volume(df.dlarray(jnp.ones((1, 2, 2, 1)), "BSSC"))

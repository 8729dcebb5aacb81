"""Tests of difffn/ops/_conv.py: conv and conv_transpose against flax.nnx and lax's own adjoint."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.test_util import check_grads

import difffn as df

ops = df.ops


def _randn(shape, *, seed=0, dtype=jnp.float32):
    """Test data from numpy: no JAX compilation per shape, unlike jax.random."""
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def _nnx_conv(w, b, *, stride, dilation, padding, groups=1):
    """nnx.Conv with the given kernel (HWIO, as difffn's) and bias copied in."""
    k, (per_group, filters) = w.shape[:-2], w.shape[-2:]
    conv = nnx.Conv(
        per_group * groups,
        filters,
        k,
        strides=stride,
        kernel_dilation=dilation,
        padding=padding,
        feature_group_count=groups,
        rngs=nnx.Rngs(0),
    )
    conv.kernel[...] = w
    conv.bias[...] = b
    return conv


CASES = [
    # (input shape (BSSC-like, batch first, channels last), kernel shape, options, nnx padding)
    ((2, 9, 4), (3, 4, 5), {}, "VALID"),
    ((2, 9, 4), (3, 4, 6), dict(stride=2, padding="same"), "SAME"),
    ((2, 9, 4), (2, 2, 6), dict(dilation_factor=3, padding=(2, 1)), [(2, 1)]),
    ((2, 7, 6, 4), (3, 2, 4, 3), dict(stride=(2, 1), padding=((1, 0), (2, 1))), [(1, 0), (2, 1)]),
    ((2, 7, 6, 4), (3, 3, 2, 4), dict(padding=1), [(1, 1), (1, 1)]),  # 2 groups
    ((2, 7, 6, 4), (3, 3, 1, 8), dict(padding="same", dilation_factor=2), "SAME"),  # channel-wise
    ((2, 5, 6, 4, 3), (3, 2, 2, 3, 4), dict(stride=(1, 2, 1), padding="same"), "SAME"),
]


@pytest.mark.parametrize(("shape", "kernel", "options", "padding"), CASES)
def test_conv_matches_nnx_conv(shape, kernel, options, padding):
    x, w, b = _randn(shape, seed=1), _randn(kernel, seed=2), _randn((kernel[-1],), seed=3)
    fmt = "B" + "S" * (len(shape) - 2) + "C"
    y = ops.conv(df.dlarray(x, fmt), w, b, **options)
    groups = shape[-1] // kernel[-2]
    reference = _nnx_conv(
        w,
        b,
        stride=options.get("stride", 1),
        dilation=options.get("dilation_factor", 1),
        padding=padding,
        groups=groups,
    )
    assert y.format == fmt
    np.testing.assert_allclose(y.data, reference(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("fmt", "order"),
    [("SSCB", (1, 2, 3, 0)), ("CBSS", (3, 0, 1, 2)), ("SSC", None), ("BSSCU", None)],
)
def test_conv_reads_the_axes_from_any_format(fmt, order):
    x, w, b = _randn((2, 6, 5, 3), seed=4), _randn((3, 2, 3, 4), seed=5), _randn((4,), seed=6)
    expected = ops.conv(df.dlarray(x, "BSSC"), w, b, padding="same").data
    if order is not None:
        y = ops.conv(df.dlarray(jnp.transpose(x, order), fmt), w, b, padding="same")
        back = df.permute(y, "BSSC")
        np.testing.assert_allclose(back.data, expected, rtol=1e-5, atol=1e-5)
    elif fmt == "SSC":  # no batch axis: one observation
        y = ops.conv(df.dlarray(x[0], fmt), w, b, padding="same")
        np.testing.assert_allclose(y.data, expected[0], rtol=1e-5, atol=1e-5)
    else:  # a second batch-like axis (U) is folded into the batch
        xu = jnp.stack([x, 2 * x], axis=-1)
        y = ops.conv(df.dlarray(xu, fmt), w, b, padding="same")
        assert y.format == fmt and y.shape == (2, 6, 5, 4, 2)
        doubled = ops.conv(df.dlarray(2 * x, "BSSC"), w, b, padding="same").data
        np.testing.assert_allclose(y.data[..., 0], expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(y.data[..., 1], doubled, rtol=1e-5, atol=1e-5)


def test_conv_over_time_and_over_space_and_time():
    x, w = _randn((2, 7, 3), seed=7), _randn((3, 3, 2), seed=8)
    y = ops.conv(df.dlarray(x, "BTC"), w, 0.0, padding="causal", dilation_factor=2)
    assert y.format == "BTC" and y.shape == (2, 7, 2)
    # causal: pad (3 - 1) * 2 = 4 steps before, none after
    padded = jnp.pad(x, ((0, 0), (4, 0), (0, 0)))
    reference = _nnx_conv(w, jnp.zeros(2), stride=1, dilation=2, padding="VALID")
    np.testing.assert_allclose(y.data, reference(padded), rtol=1e-5, atol=1e-5)
    # the first output sees only the first input step
    changed = x.at[:, 1:].set(0.0)
    y0 = ops.conv(df.dlarray(changed, "BTC"), w, 0.0, padding="causal", dilation_factor=2)
    np.testing.assert_allclose(y0.data[:, 0], y.data[:, 0], rtol=1e-6)
    # "SCBT" with a 2-D window: the window slides over S and T
    seq = _randn((5, 3, 2, 4), seed=9)  # S C B T
    w2 = _randn((2, 3, 3, 2), seed=10)
    z = ops.conv(df.dlarray(seq, "SCBT"), w2)
    as_image = jnp.transpose(seq, (2, 0, 3, 1))  # B S T C
    expected = _nnx_conv(w2, jnp.zeros(2), stride=1, dilation=1, padding="VALID")(as_image)
    np.testing.assert_allclose(jnp.transpose(z.data, (2, 0, 3, 1)), expected, rtol=1e-5)


@pytest.mark.parametrize(
    ("padding_value", "mode"),
    [
        (2.5, "constant"),
        ("symmetric-include-edge", "symmetric"),
        ("symmetric-exclude-edge", "reflect"),
        ("replicate", "edge"),
    ],
)
def test_padding_values_match_numpy_pad(padding_value, mode):
    x, w, b = _randn((2, 6, 5, 3), seed=11), _randn((3, 3, 3, 2), seed=12), _randn((2,), seed=13)
    y = ops.conv(df.dlarray(x, "BSSC"), w, b, padding=((2, 1), (1, 2)), padding_value=padding_value)
    widths = ((0, 0), (2, 1), (1, 2), (0, 0))
    kwargs = {"constant_values": padding_value} if mode == "constant" else {}
    padded = jnp.asarray(np.pad(np.asarray(x), widths, mode=mode, **kwargs))
    reference = _nnx_conv(w, b, stride=1, dilation=1, padding="VALID")(padded)
    np.testing.assert_allclose(y.data, reference, rtol=1e-5, atol=1e-5)


def test_plain_input_with_fmt_gives_plain_output():
    x, w = _randn((2, 5, 5, 2), seed=14), _randn((3, 3, 2, 4), seed=15)
    y = ops.conv(x, w, fmt="BSSC")
    assert not isinstance(y, df.FormattedArray)
    np.testing.assert_allclose(y, ops.conv(df.dlarray(x, "BSSC"), w).data, rtol=1e-6)
    assert ops.conv(df.dlarray(x, "BSSC"), w, fmt="BSSC").format == "BSSC"


def test_conv_under_jit_vmap_and_grad():
    x, w, b = _randn((3, 2, 6, 6, 2), seed=16), _randn((3, 3, 2, 4), seed=17), _randn((4,), seed=18)
    f = jax.jit(lambda x, w, b: ops.conv(df.dlarray(x, "BSSC"), w, b, stride=2, padding="same"))
    y = f(x[0], w, b)
    assert y.format == "BSSC" and y.shape == (2, 3, 3, 4)
    batched = jax.vmap(lambda x: ops.conv(x, w, b, stride=2, padding="same", fmt="BSSC"))(x)
    np.testing.assert_allclose(batched[1], f(x[1], w, b).data, rtol=1e-5, atol=1e-5)
    grads = jax.grad(lambda w, x: jnp.sum(f(x, w, b).data ** 2), argnums=(0, 1))(w, x[0])
    assert grads[0].shape == w.shape and grads[1].shape == x[0].shape


@pytest.mark.parametrize(
    "options",
    [
        dict(stride=2, padding="same"),
        dict(dilation_factor=2, padding=(1, 2), padding_value="symmetric-include-edge"),
        dict(padding=1, padding_value="replicate"),
    ],
)
def test_conv_gradients_float64(x64, options):
    x = _randn((2, 5, 5, 2), seed=19, dtype=jnp.float64)
    w = _randn((3, 3, 2, 3), seed=20, dtype=jnp.float64)
    b = _randn((3,), seed=21, dtype=jnp.float64)
    f = lambda x, w, b: jnp.sin(ops.conv(x, w, b, fmt="BSSC", **options))  # noqa: E731
    check_grads(jax.jit(f), (x, w, b), order=2, modes=("rev",))


# -- transposed convolution --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "kernel", "stride", "dilation"),
    [
        ((2, 4, 3), (3, 5, 3), 2, 1),
        ((2, 3, 4, 2), (3, 2, 4, 2), (2, 3), 1),
        ((1, 4, 4, 2), (2, 2, 3, 2), 1, 2),
    ],
)
def test_conv_transpose_is_the_adjoint_of_conv(shape, kernel, stride, dilation):
    """<conv_transpose(x, w), y> equals <x, conv(y, w)>: the defining property."""
    k = len(kernel) - 2
    fmt = "B" + "S" * k + "C"
    x, w = _randn(shape, seed=22), _randn(kernel, seed=23)
    y = ops.conv_transpose(df.dlarray(x, fmt), w, stride=stride, dilation_factor=dilation)
    strides = (stride,) * k if isinstance(stride, int) else stride
    extent = [(f - 1) * dilation + 1 for f in kernel[:k]]
    expected_shape = [(n - 1) * s + e for n, s, e in zip(shape[1:-1], strides, extent)]
    assert y.format == fmt and y.shape == (shape[0], *expected_shape, kernel[-2])
    probe = _randn(y.shape, seed=24)
    forward = ops.conv(probe, w, fmt=fmt, stride=stride, dilation_factor=dilation)
    assert forward.shape == x.shape
    np.testing.assert_allclose(jnp.vdot(y.data, probe), jnp.vdot(x, forward), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("cropping", "crops"),
    [
        (0, ((0, 0), (0, 0))),
        (1, ((1, 1), (1, 1))),
        (((1, 0), (0, 2)), ((1, 0), (0, 2))),
        ("same", None),
    ],
)
def test_conv_transpose_matches_nnx_conv_transpose(cropping, crops):
    x, w, b = _randn((2, 4, 3, 3), seed=25), _randn((3, 4, 5, 3), seed=26), _randn((5,), seed=27)
    y = ops.conv_transpose(df.dlarray(x, "BSSC"), w, b, stride=2, cropping=cropping)
    reference = nnx.ConvTranspose(
        3, 5, (3, 4), strides=2, padding="VALID", transpose_kernel=True, rngs=nnx.Rngs(0)
    )
    reference.kernel[...] = w
    reference.bias[...] = b
    full = reference(x)  # (2, 9, 8, 5): (n - 1) * 2 + k
    if crops is None:  # "same": output = input * stride; MATLAB crops the odd extra at the top
        crops = ((1, 0), (1, 1))
        assert y.shape == (2, 8, 6, 5)
    (t, bottom), (left, r) = crops
    expected = full[:, t : full.shape[1] - bottom, left : full.shape[2] - r]
    np.testing.assert_allclose(y.data, expected, rtol=1e-5, atol=1e-5)


def test_conv_transpose_weights_are_flipped_nnx_kernels():
    """nnx's default (transpose_kernel=False) kernel is difffn's flipped, with I and O swapped."""
    x, w = _randn((1, 3, 3, 2), seed=28), _randn((2, 3, 4, 2), seed=29)
    reference = nnx.ConvTranspose(2, 4, (2, 3), strides=2, padding="VALID", rngs=nnx.Rngs(0))
    reference.kernel[...] = jnp.flip(w, axis=(0, 1)).swapaxes(2, 3)
    reference.bias[...] = jnp.zeros(4)
    y = ops.conv_transpose(x, w, stride=2, fmt="BSSC")
    np.testing.assert_allclose(y, reference(x), rtol=1e-5, atol=1e-5)


def test_conv_transpose_gradients_float64(x64):
    x = _randn((2, 3, 3, 2), seed=30, dtype=jnp.float64)
    w = _randn((3, 3, 4, 2), seed=31, dtype=jnp.float64)
    b = _randn((4,), seed=32, dtype=jnp.float64)
    f = lambda x, w, b: jnp.sin(ops.conv_transpose(x, w, b, stride=2, cropping="same", fmt="BSSC"))  # noqa: E731
    check_grads(jax.jit(f), (x, w, b), order=2, modes=("rev",))


def test_conv_transpose_under_vmap_over_sequences():
    x, w = _randn((3, 2, 5, 2), seed=33), _randn((3, 4, 2), seed=34)
    ys = jax.vmap(lambda x: ops.conv_transpose(x, w, stride=2, fmt="BTC"))(x)
    assert ys.shape == (3, 2, 11, 4)
    np.testing.assert_allclose(
        ys[2], ops.conv_transpose(df.dlarray(x[2], "BTC"), w, stride=2).data, rtol=1e-5
    )


# -- errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (
            lambda: ops.conv(jnp.ones((1, 4, 4, 2)), jnp.ones((3, 3, 2, 1))),
            df.FormatError,
            r"df.ops.conv: x is a plain array of shape \(1, 4, 4, 2\).*fmt=",
        ),
        (
            lambda: ops.conv(df.dlarray(jnp.ones((1, 4, 2)), "BTU"), jnp.ones((3, 2, 1))),
            df.FormatError,
            r"df.ops.conv convolves the channels 'C'.*'BTU'.*no 'C' axis",
        ),
        (
            lambda: ops.conv(df.dlarray(jnp.ones((1, 4, 4, 2)), "BSSC"), jnp.ones((3, 2, 1))),
            df.FormatError,
            r"a 1-D convolution needs 1 'S'.*'BSSC'.*2 'S' and 0 'T'",
        ),
        (
            lambda: ops.conv(df.dlarray(jnp.ones((1, 4, 4, 3)), "BSSC"), jnp.ones((3, 3, 2, 1))),
            df.OpError,
            r"the input has 3 channels but weights of shape \(3, 3, 2, 1\)",
        ),
        (
            lambda: ops.conv(
                df.dlarray(jnp.ones((1, 4, 4, 2)), "BSSC"), jnp.ones((3, 3, 2, 1)), stride=0
            ),
            df.OpError,
            r"stride must be an int or 2 ints.*got 0",
        ),
        (
            lambda: ops.conv(
                df.dlarray(jnp.ones((1, 4, 4, 2)), "BSSC"), jnp.ones((3, 3, 2, 1)), padding="valid"
            ),
            df.OpError,
            r"padding must be 'same' or 'causal'",
        ),
        (
            lambda: ops.conv(
                df.dlarray(jnp.ones((1, 4, 4, 2)), "BSSC"),
                jnp.ones((3, 3, 2, 1)),
                padding_value="mirror",
            ),
            df.OpError,
            r"padding_value must be a number",
        ),
        (
            lambda: ops.conv(df.dlarray(jnp.ones((1, 2, 2, 2)), "BSSC"), jnp.ones((3, 3, 2, 1))),
            df.OpError,
            r"shorter than the dilated window \(3\)",
        ),
        (
            lambda: ops.conv(
                df.dlarray(jnp.ones((1, 4, 4, 2)), "BSSC"), jnp.ones((3, 3, 2, 1)), fmt="SSCB"
            ),
            df.FormatError,
            r"x is a FormattedArray 'BSSC', but fmt=",
        ),
        (
            lambda: ops.conv(df.dlarray(jnp.ones((1, 4, 4, 2)), "BSSC"), jnp.ones((2, 1))),
            df.OpError,
            r"weights must have 3 to 5 axes",
        ),
        (
            lambda: ops.conv_transpose(
                df.dlarray(jnp.ones((1, 4, 4, 2)), "BSSC"), jnp.ones((3, 3, 2, 5))
            ),
            df.OpError,
            r"conv_transpose: the input has 2 channels but weights .* expect 5",
        ),
        (
            lambda: ops.conv_transpose(
                df.dlarray(jnp.ones((1, 1, 1, 2)), "BSSC"), jnp.ones((2, 2, 3, 2)), cropping=1
            ),
            df.OpError,
            r"cropping \(1, 1\) removes the whole output",
        ),
    ],
)
def test_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()

"""Tests of difffn/ops/_normalization.py: batchnorm, layernorm, groupnorm, instancenorm vs flax.nnx."""

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


def _params(channels, seed=1, dtype=jnp.float32):
    return _randn((channels,), seed=seed, dtype=dtype), 1 + 0.3 * _randn((channels,), seed=seed + 1)


def _copy(module, offset, scale):
    module.bias[...] = offset
    module.scale[...] = scale
    return module


# -- batchnorm --------------------------------------------------------------------------------


def test_batchnorm_training_matches_nnx_batch_norm():
    x = 3 * _randn((6, 4, 5, 3), seed=2) + 1
    offset, scale = _params(3)
    mean, variance = _randn((3,), seed=5), 1 + jnp.abs(_randn((3,), seed=6))
    y, new_mean, new_variance = ops.batchnorm(
        df.dlarray(x, "BSSC"), offset, scale, mean, variance, training=True
    )
    bn = _copy(nnx.BatchNorm(3, momentum=0.9, epsilon=1e-5, rngs=nnx.Rngs(0)), offset, scale)
    bn.mean[...] = mean
    bn.var[...] = variance
    np.testing.assert_allclose(y.data, bn(x), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(new_mean, bn.mean[...], rtol=1e-5, atol=1e-6)
    # nnx updates with the biased variance; MATLAB's running variance takes the unbiased one
    m = 6 * 4 * 5
    biased = np.asarray(x, np.float64).var(axis=(0, 1, 2))
    np.testing.assert_allclose(new_variance, 0.1 * biased * m / (m - 1) + 0.9 * variance, 1e-5)
    batch = ops.batchnorm(x, offset, scale, fmt="BSSC")
    np.testing.assert_allclose(batch[0], y.data, rtol=1e-6)
    np.testing.assert_allclose(batch[2], biased, rtol=1e-5)


def test_batchnorm_inference_matches_nnx_with_running_average():
    x = _randn((4, 3), seed=7)
    offset, scale = _params(3)
    mean, variance = _randn((3,), seed=8), 1 + jnp.abs(_randn((3,), seed=9))
    y = ops.batchnorm(df.dlarray(x.T, "CB"), offset, scale, mean, variance)
    bn = _copy(
        nnx.BatchNorm(3, use_running_average=True, epsilon=1e-5, rngs=nnx.Rngs(0)), offset, scale
    )
    bn.mean[...] = mean
    bn.var[...] = variance
    assert y.format == "CB"
    np.testing.assert_allclose(y.data.T, bn(x), rtol=1e-5, atol=1e-5)


def test_batchnorm_running_statistics_keep_shape_dtype_and_carry_no_gradient(x64):
    x = _randn((5, 2, 3), seed=10, dtype=jnp.float64)
    mean = jnp.zeros((1, 1, 3), jnp.float32)  # a model function's shapes
    variance = jnp.ones((1, 1, 3), jnp.float32)
    _, new_mean, new_variance = ops.batchnorm(
        x, jnp.zeros(3), jnp.ones(3), mean, variance, training=True, fmt="BTC"
    )
    assert new_mean.shape == (1, 1, 3) and new_mean.dtype == jnp.float32
    grad = jax.grad(
        lambda x: jnp.sum(
            ops.batchnorm(x, jnp.zeros(3), jnp.ones(3), mean, variance, training=True, fmt="BTC")[1]
        )
    )(x)
    np.testing.assert_array_equal(grad, 0)


# -- layernorm --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "shape", "dimension", "reduction"),
    [
        ("BC", (4, 6), "auto", (-1,)),
        ("BTC", (2, 5, 6), "auto", (-1,)),
        ("BSSC", (2, 3, 4, 6), "auto", (1, 2, 3)),
        ("BSSC", (2, 3, 4, 6), "channel-only", (-1,)),
        ("BTC", (2, 5, 6), "batch-excluded", (1, 2)),
    ],
)
def test_layernorm_matches_nnx_layer_norm(fmt, shape, dimension, reduction):
    x = 2 * _randn(shape, seed=11) + 0.5
    offset, scale = _params(6)
    y = ops.layernorm(df.dlarray(x, fmt), offset, scale, operation_dimension=dimension)
    ln = nnx.LayerNorm(
        6, epsilon=1e-5, reduction_axes=reduction, use_fast_variance=False, rngs=nnx.Rngs(0)
    )
    _copy(ln, offset, scale)
    assert y.format == fmt
    np.testing.assert_allclose(y.data, ln(x), rtol=1e-5, atol=1e-5)


def test_layernorm_channel_axis_first():
    x = _randn((2, 5, 6), seed=12)
    offset, scale = _params(6)
    y = ops.layernorm(df.dlarray(jnp.transpose(x, (2, 0, 1)), "CBT"), offset, scale)
    expected = ops.layernorm(df.dlarray(x, "BTC"), offset, scale)
    np.testing.assert_allclose(df.permute(y, "BTC").data, expected.data, rtol=1e-6, atol=1e-6)


# -- groupnorm and instancenorm ----------------------------------------------------------------


@pytest.mark.parametrize("groups", [1, 2, 3, 6, "all-channels", "channel-wise"])
def test_groupnorm_matches_nnx_group_norm(groups):
    x = 2 * _randn((3, 4, 5, 6), seed=13) - 1
    offset, scale = _params(6)
    y = ops.groupnorm(df.dlarray(x, "BSSC"), groups, offset, scale)
    n = {"all-channels": 1, "channel-wise": 6}.get(groups, groups)
    gn = nnx.GroupNorm(6, num_groups=n, epsilon=1e-5, use_fast_variance=False, rngs=nnx.Rngs(0))
    np.testing.assert_allclose(y.data, _copy(gn, offset, scale)(x), rtol=1e-5, atol=1e-5)


def test_instancenorm_is_groupnorm_with_one_group_per_channel():
    x = _randn((3, 7, 4), seed=14)
    offset, scale = _params(4)
    y = ops.instancenorm(df.dlarray(x, "BTC"), offset, scale)
    gn = nnx.GroupNorm(4, num_groups=4, epsilon=1e-5, use_fast_variance=False, rngs=nnx.Rngs(0))
    np.testing.assert_allclose(y.data, _copy(gn, offset, scale)(x), rtol=1e-5, atol=1e-5)
    sscb = ops.instancenorm(df.permute(df.dlarray(x, "BTC"), "TCB"), offset, scale)
    np.testing.assert_allclose(df.permute(sscb, "BTC").data, y.data, rtol=1e-6, atol=1e-6)


# -- transformations and gradients --------------------------------------------------------------


def test_norms_under_jit_and_vmap():
    x = _randn((3, 2, 4, 6), seed=15)
    offset, scale = _params(6)
    f = jax.jit(lambda x: ops.groupnorm(x, 3, offset, scale, fmt="BTC"))
    ys = jax.vmap(f)(x)
    np.testing.assert_allclose(ys[1], f(x[1]), rtol=1e-6)
    g = jax.vmap(lambda x: ops.layernorm(x, offset, scale, fmt="BTC"))(x)
    np.testing.assert_allclose(g[2], ops.layernorm(x[2], offset, scale, fmt="BTC"), rtol=1e-6)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, o, s: ops.batchnorm(x, o, s, fmt="BSC")[0],
        lambda x, o, s: ops.layernorm(x, o, s, fmt="BSC"),
        lambda x, o, s: ops.layernorm(x, o, s, fmt="BSC", operation_dimension="batch-excluded"),
        lambda x, o, s: ops.groupnorm(x, 2, o, s, fmt="BSC"),
        lambda x, o, s: ops.instancenorm(x, o, s, fmt="BSC"),
    ],
    ids=["batchnorm", "layernorm", "layernorm-batch-excluded", "groupnorm", "instancenorm"],
)
def test_gradients_float64(x64, fn):
    x = _randn((3, 5, 4), seed=16, dtype=jnp.float64)
    offset = _randn((4,), seed=17, dtype=jnp.float64)
    scale = _randn((4,), seed=18, dtype=jnp.float64)
    f = lambda x, o, s: jnp.sin(fn(x, o, s))  # noqa: E731
    check_grads(jax.jit(f), (x, offset, scale), order=2, modes=("rev",))


# -- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (
            lambda: ops.batchnorm(jnp.ones((2, 3)), jnp.zeros(3), jnp.ones(3)),
            df.FormatError,
            r"df.ops.batchnorm: x is a plain array",
        ),
        (
            lambda: ops.batchnorm(jnp.ones((2, 3)), jnp.zeros(2), jnp.ones(3), fmt="BC"),
            df.OpError,
            r"offset has shape \(2,\) \(2 values\) but the input has 3 channels",
        ),
        (
            lambda: ops.batchnorm(
                jnp.ones((2, 3)), jnp.zeros(3), jnp.ones(3), jnp.zeros(3), fmt="BC"
            ),
            df.OpError,
            r"give both mean and variance",
        ),
        (
            lambda: ops.batchnorm(
                jnp.ones((2, 3)), jnp.zeros(3), jnp.ones(3), training=True, fmt="BC"
            ),
            df.OpError,
            r"training=True updates running",
        ),
        (
            lambda: ops.batchnorm(jnp.ones((2, 3)), jnp.zeros(3), jnp.ones(3), epsilon=0, fmt="BC"),
            df.OpError,
            r"epsilon must be a positive finite number; got 0",
        ),
        (
            lambda: ops.batchnorm(
                jnp.ones((2, 3)),
                jnp.zeros(3),
                jnp.ones(3),
                jnp.zeros(3),
                jnp.ones(3),
                training=True,
                mean_decay=2,
                fmt="BC",
            ),
            df.OpError,
            r"mean_decay must be in \[0, 1\]; got 2",
        ),
        (
            lambda: ops.layernorm(jnp.ones((2, 3)), jnp.zeros(3), jnp.ones(3), fmt="BT"),
            df.FormatError,
            r"layernorm normalizes with per-channel parameters.*'BT'.*no 'C'",
        ),
        (
            lambda: ops.layernorm(
                jnp.ones((2, 3)), jnp.zeros(3), jnp.ones(3), fmt="BC", operation_dimension="spatial"
            ),
            df.OpError,
            r"operation_dimension must be one of 'auto', 'channel-only'",
        ),
        (
            lambda: ops.groupnorm(jnp.ones((2, 6)), 4, jnp.zeros(6), jnp.ones(6), fmt="BC"),
            df.OpError,
            r"6 channels, which cannot be split into num_groups=4",
        ),
        (
            lambda: ops.groupnorm(jnp.ones((2, 6)), "all", jnp.zeros(6), jnp.ones(6), fmt="BC"),
            df.OpError,
            r"num_groups must be a positive int, 'all-channels' or 'channel-wise'",
        ),
    ],
)
def test_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()

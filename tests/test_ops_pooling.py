"""Tests of difffn/ops/_pooling.py: max_pool and avg_pool against flax.nnx's pooling functions."""

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


CASES = [
    # (shape, pool_size, options, nnx window, nnx strides, nnx padding)
    ((2, 7, 6, 3), 2, {}, (2, 2), (1, 1), "VALID"),
    ((2, 7, 6, 3), (3, 2), dict(stride=(2, 1), padding=1), (3, 2), (2, 1), ((1, 1), (1, 1))),
    ((2, 7, 6, 3), 3, dict(stride=2, padding="same"), (3, 3), (2, 2), "SAME"),
    ((2, 9, 3), 2, dict(stride=2), (2,), (2,), "VALID"),
    ((2, 5, 4, 6, 3), (2, 2, 3), dict(stride=2, padding=((0, 1), (0, 0), (1, 1))), (2, 2, 3),
     (2, 2, 2), ((0, 1), (0, 0), (1, 1))),
]  # fmt: skip


@pytest.mark.parametrize(("shape", "pool", "options", "window", "strides", "padding"), CASES)
def test_max_and_avg_pool_match_nnx(shape, pool, options, window, strides, padding):
    x = _randn(shape, seed=1)
    fmt = "B" + "S" * (len(shape) - 2) + "C"
    y_max = ops.max_pool(df.dlarray(x, fmt), pool, **options)
    y_avg = ops.avg_pool(df.dlarray(x, fmt), pool, **options)
    y_mean = ops.avg_pool(df.dlarray(x, fmt), pool, padding_value="mean", **options)
    assert y_max.format == y_avg.format == fmt
    np.testing.assert_array_equal(y_max.data, nnx.max_pool(x, window, strides, padding))
    np.testing.assert_allclose(
        y_avg.data, nnx.avg_pool(x, window, strides, padding), rtol=1e-6, atol=1e-6
    )
    expected = nnx.avg_pool(x, window, strides, padding, count_include_pad=False)
    np.testing.assert_allclose(y_mean.data, expected, rtol=1e-6, atol=1e-6)


def test_global_pooling_keeps_unit_axes_and_other_formats():
    x = _randn((2, 4, 3, 5), seed=2)
    gmax = ops.max_pool(df.permute(df.dlarray(x, "BSSC"), "SSCB"), "global")
    assert (gmax.format, gmax.shape) == ("SSCB", (1, 1, 5, 2))
    np.testing.assert_array_equal(gmax.data[0, 0].T, np.asarray(x).max(axis=(1, 2)))
    gavg = ops.avg_pool(x, "global", fmt="BSSC")
    np.testing.assert_allclose(gavg[:, 0, 0], np.asarray(x).mean(axis=(1, 2)), rtol=1e-6)
    seq = ops.avg_pool(df.dlarray(x[:, 0], "BTC"), "global")  # sequences pool over T
    assert seq.shape == (2, 1, 5)


def test_integer_input():
    x = jnp.arange(16, dtype=jnp.int32).reshape(1, 4, 4, 1)
    assert ops.max_pool(x, 2, padding=1, fmt="BSSC").dtype == jnp.int32
    assert ops.avg_pool(x, 2, fmt="BSSC").dtype == jnp.float32


def test_pooling_under_jit_vmap_and_gradients_float64(x64):
    x = _randn((3, 2, 5, 5, 2), seed=3, dtype=jnp.float64)
    pool = jax.jit(lambda x: ops.max_pool(x, 2, stride=2, padding="same", fmt="BSSC"))
    ys = jax.vmap(pool)(x)
    np.testing.assert_array_equal(ys[1], pool(x[1]))
    for f in (
        lambda x: ops.avg_pool(x, 3, stride=2, padding=1, padding_value="mean", fmt="BSSC"),
        lambda x: ops.avg_pool(x, 2, padding="same", fmt="BSSC"),
        lambda x: ops.max_pool(x, 2, stride=2, fmt="BSSC"),
        lambda x: ops.max_pool(x, "global", fmt="BSSC"),
    ):
        check_grads(jax.jit(lambda x, f=f: jnp.sin(f(x))), (x[0],), order=1, modes=("rev",))


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: ops.max_pool(jnp.ones((1, 4, 4, 1)), 2), df.FormatError,
         r"df.ops.max_pool: x is a plain array"),
        (lambda: ops.max_pool(df.dlarray(jnp.ones((2, 3)), "BC"), 2), df.FormatError,
         r"pooling needs some 'S' or a 'T' axis.*'BC'"),
        (lambda: ops.max_pool(df.dlarray(jnp.ones((1, 4, 4, 1)), "BSSC"), (2, 2, 2)),
         df.FormatError, r"pooling needs 3 'S' \(or 'S' and 'T'\) axes"),
        (lambda: ops.avg_pool(df.dlarray(jnp.ones((1, 4, 4, 1)), "BSSC"), 0), df.OpError,
         r"pool_size must be an int or 2 ints"),
        (lambda: ops.avg_pool(df.dlarray(jnp.ones((1, 4, 4, 1)), "BSSC"), 2,
                              padding_value="replicate"), df.OpError,
         r"padding_value must be 0 or 'mean'"),
        (lambda: ops.max_pool(df.dlarray(jnp.ones((1, 2, 2, 1)), "BSSC"), 3), df.OpError,
         r"smaller than the pooling window \(3\)"),
    ],
)  # fmt: skip
def test_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()

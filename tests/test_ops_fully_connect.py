"""Tests of difffn/ops/_fully_connect.py: fully_connect against flax.nnx.Linear."""

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


@pytest.mark.parametrize(
    ("fmt", "shape", "out_fmt", "rows"),
    [
        ("BC", (3, 5), "BC", lambda x: x),
        ("BSSC", (3, 2, 2, 5), "BC", lambda x: x.reshape(3, 20)),
        ("SSCB", (2, 2, 5, 3), "BC", lambda x: jnp.transpose(x, (3, 0, 1, 2)).reshape(3, 20)),
        ("BTC", (3, 4, 5), "BTC", lambda x: x),
        ("TBC", (4, 3, 5), "TBC", lambda x: x),
        ("CBT", (5, 3, 4), "BTC", lambda x: jnp.transpose(x, (1, 2, 0))),
        ("SC", (4, 5), "C", lambda x: x.reshape(20)),
    ],
)
def test_fully_connect_matches_nnx_linear(fmt, shape, out_fmt, rows):
    x = _randn(shape, seed=1)
    features = int(np.prod([n for n, label in zip(shape, fmt) if label not in "BT"]))
    w, b = _randn((features, 6), seed=2), _randn((6,), seed=3)
    linear = nnx.Linear(features, 6, rngs=nnx.Rngs(0))
    linear.kernel[...] = w
    linear.bias[...] = b
    y = ops.fully_connect(df.dlarray(x, fmt), w, b)
    assert y.format == out_fmt
    np.testing.assert_allclose(y.data, linear(rows(x)), rtol=1e-5, atol=1e-5)
    plain = ops.fully_connect(x, w, b, fmt=fmt)
    np.testing.assert_array_equal(plain, y.data)


def test_fully_connect_jit_vmap_and_gradients_float64(x64):
    x = _randn((4, 3, 2, 2, 3), seed=4, dtype=jnp.float64)
    w, b = _randn((12, 5), seed=5, dtype=jnp.float64), _randn((5,), seed=6, dtype=jnp.float64)
    f = jax.jit(lambda x, w, b: jnp.sin(ops.fully_connect(x, w, b, fmt="BSSC")))
    ys = jax.vmap(f, in_axes=(0, None, None))(x, w, b)
    np.testing.assert_allclose(ys[3], f(x[3], w, b), rtol=1e-12)
    check_grads(f, (x[0], w, b), order=2, modes=("rev",))
    assert ops.fully_connect(x[0], w, fmt="BSSC").shape == (3, 5)  # no bias


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: ops.fully_connect(jnp.ones((2, 3)), jnp.ones((3, 2))), df.FormatError,
         r"df.ops.fully_connect: x is a plain array"),
        (lambda: ops.fully_connect(df.dlarray(jnp.ones((2, 3)), "BT"), jnp.ones((3, 2))),
         df.FormatError, r"flattens the 'S', 'C' and 'U' axes.*'BT' has none"),
        (lambda: ops.fully_connect(df.dlarray(jnp.ones((2, 2, 3)), "BSC"), jnp.ones((3, 2))),
         df.OpError, r"the input has 6 features .* weights has shape \(3, 2\).*\(6, output_size\)"),
        (lambda: ops.fully_connect(df.dlarray(jnp.ones((2, 3)), "BC"), jnp.ones((3, 2)),
                                   jnp.ones(3)), df.OpError, r"bias has shape \(3,\); expected 2"),
    ],
)  # fmt: skip
def test_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()

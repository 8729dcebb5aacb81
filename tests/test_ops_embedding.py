"""Tests of difffn/ops/_embedding.py: embed (against nnx.Embed) and the one-hot pair."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.test_util import check_grads

import difffn as df

WORDS, DIM = 10, 4


def _table(dtype=jnp.float32):
    return jnp.asarray(np.random.default_rng(0).standard_normal((WORDS, DIM)), dtype)


def _indices(shape, seed=1):
    return jnp.asarray(np.random.default_rng(seed).integers(0, WORDS, shape), jnp.int32)


def test_embed_matches_nnx_embed():
    table = _table()
    module = nnx.Embed(WORDS, DIM, rngs=nnx.Rngs(0))
    module.embedding[...] = table
    idx = _indices((3, 6))
    y = df.ops.embed(df.dlarray(idx, "BT"), table)
    assert (y.format, y.shape) == ("BTC", (3, 6, DIM))
    np.testing.assert_array_equal(y.data, module(idx))


@pytest.mark.parametrize(("fmt", "expected"), [("BTC", "BTC"), ("CBT", "CBT"), ("TB", "TBC")])
def test_embed_puts_vectors_on_the_c_axis(fmt, expected):
    table = _table()
    idx = _indices((3, 6))  # (B, T)
    base = table[idx]  # (B, T, DIM)
    data = {"BTC": idx[:, :, None], "CBT": idx[None], "TB": idx.T}[fmt]
    y = df.ops.embed(df.dlarray(data, fmt), table)
    assert y.format == expected
    want = {"BTC": base, "CBT": jnp.moveaxis(base, -1, 0), "TB": jnp.swapaxes(base, 0, 1)}[fmt]
    np.testing.assert_array_equal(y.data, want)


def test_embed_rounds_float_indices_and_plain_input_stays_plain():
    table = _table()
    y = df.ops.embed(jnp.array([[1.0, 2.9999]]), table, fmt="BT")
    assert not isinstance(y, df.FormattedArray)
    np.testing.assert_array_equal(y, table[jnp.array([[1, 3]])])


def test_out_of_range_indices_error_when_known_and_nan_under_jit():
    table = _table()
    with pytest.raises(df.OpError, match=r"df\.ops\.embed: 2 index value\(s\) outside \[0, 10\)"):
        df.ops.embed(jnp.array([[3, 10, -1]]), table, fmt="BT")
    y = jax.jit(lambda i: df.ops.embed(i, table, fmt="BT"))(jnp.array([[3, 10]]))
    np.testing.assert_array_equal(y[0, 0], table[3])
    assert bool(jnp.isnan(y[0, 1]).all())


def test_embed_gradient_float64_and_vmap(x64):
    table = _table(jnp.float64)
    idx = jnp.array([[1, 4, 1], [0, 9, 4]])
    f = lambda w: jnp.sum(jnp.sin(df.ops.embed(idx, w, fmt="BT")))  # noqa: E731
    check_grads(jax.jit(f), (table,), order=1, modes=("rev",), eps=1e-6, atol=1e-8, rtol=1e-7)
    grad = jax.grad(f)(table)
    assert float(jnp.abs(grad[2]).max()) == 0.0  # rows never looked up get no gradient
    rows = jax.vmap(lambda i: df.ops.embed(i, table, fmt="T"))(idx)
    np.testing.assert_array_equal(rows, table[idx])


def test_onehot_encode_matches_numpy_eye():
    labels = jnp.array([[2, 0, 1], [1, 1, 0]])
    y = df.ops.onehot_encode(df.dlarray(labels, "BT"), 3)
    assert (y.format, y.shape, y.dtype) == ("BTC", (2, 3, 3), jnp.float32)
    np.testing.assert_array_equal(y.data, np.eye(3)[np.asarray(labels)])
    channels_first = df.ops.onehot_encode(df.dlarray(labels[:, None], "BCT"), 3)
    assert channels_first.format == "BCT"
    np.testing.assert_array_equal(jnp.moveaxis(channels_first.data, 1, -1), y.data)
    plain = df.ops.onehot_encode(jnp.array([2, 5]), 3, dtype=jnp.int32)
    np.testing.assert_array_equal(plain, [[0, 0, 1], [0, 0, 0]])


def test_onehot_decode_inverts_encode_and_breaks_ties_to_the_first():
    labels = _indices((4, 5)) % 3
    encoded = df.ops.onehot_encode(df.dlarray(labels, "BT"), 3)
    decoded = df.ops.onehot_decode(encoded)
    assert (decoded.format, decoded.dtype) == ("BT", jnp.int32)
    np.testing.assert_array_equal(decoded.data, labels)
    ties = df.ops.onehot_decode(jnp.array([[0.5, 0.5, 0.0]]), fmt="BC")
    np.testing.assert_array_equal(ties, [0])
    assert not isinstance(df.ops.onehot_decode(df.dlarray(jnp.ones(3), "C")), df.FormattedArray)
    jitted = jax.jit(df.ops.onehot_decode, static_argnames="fmt")(encoded.data, fmt="BTC")
    np.testing.assert_array_equal(jitted, labels)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: df.ops.embed(jnp.zeros((2, 3), jnp.int32), _table()), df.FormatError,
         r"df\.ops\.embed: x is a plain array of shape \(2, 3\) without a format"),
        (lambda: df.ops.embed(df.dlarray(jnp.zeros((2, 3, 2), jnp.int32), "BTC"), _table()),
         df.FormatError, r"the indices' 'C' axis has size 2; it must have size 1"),
        (lambda: df.ops.embed(jnp.zeros((2, 3), jnp.int32), jnp.ones(4), fmt="BT"), df.OpError,
         r"df\.ops\.embed: weights has shape \(4,\); expected \(num_words, dimension\)"),
        (lambda: df.ops.onehot_encode(jnp.zeros(3), 0), df.OpError,
         r"num_classes must be a positive int; got 0"),
        (lambda: df.ops.onehot_decode(jnp.zeros((2, 3))), df.FormatError,
         r"df\.ops\.onehot_decode: x is a plain array"),
        (lambda: df.ops.onehot_decode(df.dlarray(jnp.zeros((2, 3)), "BT")), df.FormatError,
         r"the input format 'BT' has no 'C' axis to decode along"),
    ],
)  # fmt: skip
def test_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()

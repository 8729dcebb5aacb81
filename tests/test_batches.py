"""Tests of difffn/_batches.py: the real rows of a batch padded share by share."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import difffn as df
from difffn._core._batches import Keep, pad_with_first, real_rows


def test_real_rows_keep_each_shares_first_rows_under_jit():
    # 2 shares of 3 observations, each padded to 4 with copies of its first (as each process
    # pads its own share); the batch axis is the second ("CB")
    rng = np.random.default_rng(0)
    shares = [rng.normal(size=(5, 3)).astype(np.float32) for _ in range(2)]
    padded = np.concatenate([pad_with_first(s, 4, 1) for s in shares], axis=1)
    assert padded.shape == (5, 8)
    np.testing.assert_array_equal(padded[:, 3], shares[0][:, 0])  # a copy of the first row
    keep = Keep(shares=2, rows=3, padded=4)
    got = jax.jit(lambda y: real_rows(y, keep))(df.dlarray(padded, "CB"))
    assert got.format == "CB"
    np.testing.assert_array_equal(np.asarray(got.data), np.concatenate(shares, axis=1))
    plain = jax.jit(lambda y: real_rows(y, keep, axis=1))(padded)
    np.testing.assert_array_equal(np.asarray(plain), np.concatenate(shares, axis=1))


def test_the_padding_gets_no_gradient(x64):
    # a mean over the real rows of a padded batch: its gradient is that of the mean over the
    # unpadded batch on the real rows (by autodiff of the unpadded loss), zero on the padding
    rng = np.random.default_rng(1)
    real = rng.normal(size=(6, 2))
    keep = Keep(shares=2, rows=3, padded=5)
    padded = np.concatenate([pad_with_first(real[:3], 5, 0), pad_with_first(real[3:], 5, 0)])

    def loss(y):
        return jnp.mean(jnp.sin(real_rows(y, keep)) ** 2)

    real_at, padding_at = np.array([0, 1, 2, 5, 6, 7]), np.array([3, 4, 8, 9])
    grad = np.asarray(jax.grad(loss)(padded))
    expected = jax.grad(lambda y: jnp.mean(jnp.sin(y) ** 2))(real)
    np.testing.assert_allclose(grad[real_at], expected, rtol=1e-12)
    np.testing.assert_array_equal(grad[padding_at], 0.0)
    hessian = np.asarray(jax.hessian(loss)(padded))  # second order: no padding either
    assert not np.any(hessian[padding_at]) and not np.any(hessian[:, :, padding_at])
    assert np.any(hessian[real_at])

"""benchmarks/bench_matmul_precision.py: the rounding it reports, and its custom backward.

The errors are properties of the arithmetic, measured against NumPy's float64 product, not of
this machine: float32 about 1e-7, bfloat16 operands about 2e-3, the three-product split about
5e-6. No timing is asserted.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import bench_matmul_precision as bench


def test_the_benchmark_measures_the_rounding_each_product_names():
    rows = bench.products(quick=True)
    assert [row["size"] for row in rows] == bench.SIZES[True]
    for row in rows:
        error = row["error"]
        assert error["float32"] < 1e-5, row
        assert 1e-4 < error["bf16 x1"] < 2e-2, row
        assert 1e-4 < error["bf16 out"] < 2e-2, row
        assert error["bf16 x3"] < 1e-4, row
        assert all(ms > 0 for ms in row["ms"].values()), row


def test_products_summing_in_float32_differentiate_as_jax_does():
    keys = jax.random.split(jax.random.key(2), 3)
    x = jax.random.normal(keys[0], (8, 16)).astype(jnp.bfloat16)
    w = jax.random.normal(keys[1], (16, 4)).astype(jnp.bfloat16)
    g = jax.random.normal(keys[2], (8, 4))

    def loss(product):
        return lambda x, w: jnp.sum(product(x, w).astype(jnp.float32) * g)

    def autodiff(a, b):  # the same forward, JAX's own transpose (float32 cotangents)
        return jax.lax.dot(a, b, preferred_element_type=jnp.float32).astype(a.dtype)

    got = jax.grad(loss(bench.summing_in_float32), argnums=(0, 1))(x, w)
    want = jax.grad(loss(autodiff), argnums=(0, 1))(x, w)
    exact = jax.grad(loss(lambda a, b: a @ b), argnums=(0, 1))(
        x.astype(jnp.float32), w.astype(jnp.float32)
    )
    np.testing.assert_array_equal(
        np.asarray(bench.summing_in_float32(x, w), np.float32), np.asarray(autodiff(x, w))
    )
    for mine, jaxs, reference in zip(got, want, exact, strict=True):
        assert mine.dtype == jaxs.dtype == jnp.bfloat16
        # the cotangent rounded to bfloat16 before the products: within bfloat16's rounding
        np.testing.assert_allclose(np.asarray(mine, np.float32), np.asarray(jaxs, np.float32),
                                   rtol=2e-2, atol=2e-2)  # fmt: skip
        np.testing.assert_allclose(np.asarray(mine, np.float32), np.asarray(reference),
                                   rtol=2e-2, atol=2e-2)  # fmt: skip

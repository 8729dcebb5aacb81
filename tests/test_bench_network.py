"""The per-call candidates of ``benchmarks/bench_network`` compute the same MLP.

Timing is never asserted; the benchmark's rows must compare the same computation: ``net.predict``
on a cache hit, a user's jitted model function that calls the network's layers, and the same
math hand-written over the weights. The model function compiles once for repeated calls (a cache
hit is what the row times).
"""

import jax
import numpy as np

from benchmarks import bench_network


def test_candidates_agree_and_model_function_compiles_once():
    key = jax.random.key(0)
    net = bench_network._difffn_mlp(key)
    x = jax.random.normal(key, (8, bench_network.SIZES[0]))
    expected = np.asarray(bench_network._bare(net)(x))  # hand-written jax.jit over the weights
    called = bench_network._model_function(net)
    np.testing.assert_allclose(np.asarray(called(x)), expected, rtol=1e-6, atol=1e-6)
    compiled = bench_network._apply_layers._cache_size()
    for _ in range(2):
        np.testing.assert_allclose(np.asarray(called(x)), expected, rtol=1e-6, atol=1e-6)
    assert compiled >= 1
    assert bench_network._apply_layers._cache_size() == compiled
    predicted = net.predict(x)
    np.testing.assert_allclose(np.asarray(predicted), expected, rtol=1e-6, atol=1e-6)

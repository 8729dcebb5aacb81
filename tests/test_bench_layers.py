"""benchmarks/bench_layers.py's flax.nnx baselines run and differentiate what they should."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from benchmarks.bench_layers import _nnx_step


def test_the_batch_norm_baseline_differentiates_flax_nnx_in_training_mode(key):
    # flax.nnx's BatchNorm writes its batch statistics while the step is differentiated; the
    # baseline must let it (it raised flax's TraceContextError once) and return the gradient of
    # normalization with the batch's own statistics
    module = nnx.BatchNorm(4, use_running_average=False, rngs=nnx.Rngs(0))
    x = jax.random.normal(key, (6, 4))
    upstream = jax.random.normal(jax.random.fold_in(key, 1), (6, 4))
    step, args = _nnx_step(module, x, upstream)
    params, dx = step(*args)

    def normalized(x):
        mean, var = x.mean(0, keepdims=True), x.var(0, keepdims=True)
        return (x - mean) / jnp.sqrt(var + module.epsilon)

    want = jax.grad(lambda x: jnp.sum(normalized(x) * upstream))(x)
    np.testing.assert_allclose(dx, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(params["bias"][...], upstream.sum(0), rtol=1e-5)

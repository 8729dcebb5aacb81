"""df.clear_caches and the bounded trace cache (difffn/_cache.py).

The memory bound is measured in a fresh Python process: RSS from /proc/self/statm after
gc.collect(), a tiny network predicting on batch sizes it has not seen.
"""

from __future__ import annotations

import json
import textwrap

import jax
import jax.numpy as jnp
import pytest
from helpers import run_python

import difffn as df


def _mlp(key):
    layers = [df.layers.FeatureInput(3), df.layers.FullyConnected(2), df.layers.ReLU()]
    return df.Network(layers).initialize(key=key)


def test_clear_caches_drops_difffn_and_jax_entries_and_recompiles_the_same_numbers(key):
    net = _mlp(key)
    x = jax.random.normal(key, (4, 3))
    before = net.predict(x).data
    user_jit = jax.jit(lambda v: jnp.sin(v) * 2)
    user_jit(x)
    assert net.cache_info().entries == 1 and user_jit._cache_size() == 1
    misses = net.cache_info().misses

    df.clear_caches()

    assert net.cache_info().entries == 0
    assert user_jit._cache_size() == 0  # JAX's own C++ dispatch cache for the user's function
    after = net.predict(x).data
    assert net.cache_info().misses == misses + 1  # compiled again
    assert jnp.array_equal(before, after)


_SERVICE = textwrap.dedent(
    """
    import gc, json, os, sys, warnings
    import jax, jax.numpy as jnp
    import difffn as df

    warnings.simplefilter("ignore", df.RetraceWarning)
    clear = sys.argv[1] == "clear"

    def rss_mib():
        gc.collect()
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    net = df.Network([df.layers.FeatureInput(2, normalization="none"),
                      df.layers.FullyConnected(1)]).initialize(key=jax.random.key(0))
    for n in range(1, 5):  # warm-up
        net.predict(jnp.ones((n, 2))).data.block_until_ready()
    df.clear_caches()
    start, peak, growth, entries = rss_mib(), [], [], []
    for i in range(1, 17):
        net.predict(jnp.ones((4 + i, 2))).data.block_until_ready()
        entries.append(net.cache_info().entries)
        if i % 4 == 0:
            peak.append(rss_mib() - start)
            if clear:
                df.clear_caches()
            growth.append(rss_mib() - start)
    print(json.dumps({"peak": peak, "growth": growth, "entries": entries,
                      "maxsize": net.cache_info().maxsize}))
    """
)


@pytest.mark.slow
def test_a_service_clearing_every_4_shapes_stays_bounded():
    """16 new shapes, df.clear_caches() every 4: RSS stays within the documented bound.

    Without clearing, each new shape keeps 1.5 to 3 MiB (measured: 63 MiB over 32 shapes, and
    this test fails); with it, nothing accumulates from one clear to the next (1 MiB measured),
    and between clears the process stays within the bound of docs/networks.md: about 20 MiB
    plus 3 MiB per new shape (19 MiB measured for 4 shapes).
    """
    out = run_python(_SERVICE, "clear", env={"DIFFFN_CACHE_SIZE": "4"}, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["maxsize"] == 4 and max(result["entries"]) <= 4, result
    assert max(result["growth"]) < 8, result  # what the clears leave: 1 MiB measured
    assert max(result["peak"]) < 20 + 3 * 4, result

"""df.clear_caches and the bounded trace cache (difffn/_cache.py).

The memory bound is measured in a fresh Python process: RSS from /proc/self/statm after
gc.collect(), a tiny network predicting on batch sizes it has not seen.
"""

from __future__ import annotations

import json
import textwrap

import pytest
from helpers import run_python

_SERVICE = textwrap.dedent(
    """
    import gc, json, os, warnings
    import jax, jax.numpy as jnp, numpy as np
    from jax._src import pjit as jax_pjit, util as jax_util
    import difffn as df

    warnings.simplefilter("ignore", df.RetraceWarning)

    def rss_mib():
        gc.collect()
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    net = df.Network([df.layers.FeatureInput(2, normalization="none"),
                      df.layers.FullyConnected(1)]).initialize(key=jax.random.key(0))
    def traces():  # JAX's cache of traced jaxprs (unbounded), keyed on the traced function
        found = [c for c, name in jax_util._caches.items()
                 if name.startswith("<function trace_to_jaxpr ")]
        return sum(c.cache_info().currsize for c in found) if found else -1

    def records():  # JAX's per-function record of traced input types, which clear_caches keeps
        return sum(len(cases) for cases in jax_pjit._seen_qdds.values())

    for n in range(1, 9):  # warm-up, and the cache full (DIFFFN_CACHE_SIZE=4)
        net.predict(np.ones((n, 2), np.float32)).data.block_until_ready()
    start, entries, traces_start, records_start = rss_mib(), [], traces(), records()
    for n in range(9, 25):  # NumPy inputs of new shapes: only difffn's cache grows, bounded
        net.predict(np.ones((n, 2), np.float32)).data.block_until_ready()
        entries.append(net.cache_info().entries)
    numpy_growth, traces_grown = rss_mib() - start, traces() - traces_start
    records_grown = records() - records_start
    for n in range(25, 33):  # the caller's own jnp.ones of new shapes: JAX keeps each
        jnp.ones((n, 2)).block_until_ready()
    jnp_growth = rss_mib() - start
    x = np.ones((4, 2), np.float32)
    before = net.predict(x).data
    user_jit = jax.jit(lambda v: jnp.sin(v) * 2)
    user_jit(x)
    jit_entries, misses = user_jit._cache_size(), net.cache_info().misses
    df.clear_caches()
    cleared = rss_mib() - start
    facts = {"entries_after_clear": net.cache_info().entries,
             "traces": [traces_grown, traces()], "records": [records_grown, records()],
             "jit_entries": [jit_entries, user_jit._cache_size()]}
    after = net.predict(x).data
    facts.update(recompiled=net.cache_info().misses == misses + 1,
                 same_numbers=bool(jnp.array_equal(before, after)))
    print(json.dumps({"numpy": numpy_growth, "jnp": jnp_growth, "cleared": cleared,
                      "entries": entries, "maxsize": net.cache_info().maxsize, **facts}))
    """
)


@pytest.mark.slow
def test_a_service_on_many_shapes_stays_within_the_bound():
    """16 new NumPy-shaped inputs stay in the cache's bound; df.clear_caches() frees the rest.

    It runs in its own process: clearing JAX's caches in a pytest worker would make every later
    test in that worker compile again.

    With DIFFFN_CACHE_SIZE=4 the cache evicts, and JAX releases an evicted entry's compiled code:
    16 new shapes grow RSS by under 8 MiB (before ``as_array``, NumPy inputs went through
    ``jnp.asarray``, compiled per shape: 1.4 MiB each, over 20 MiB here). The caller's own
    ``jnp.ones`` of 8 new shapes is held by JAX (about 1.3 MiB each) until ``df.clear_caches()``.
    JAX's tracing records of jnp's own jitted functions (the residue, a few KiB per new shape)
    grow whatever difffn evicts, and ``df.clear_caches()`` empties them, the one that
    ``jax.clear_caches()`` leaves included.
    """
    out = run_python(_SERVICE, env={"DIFFFN_CACHE_SIZE": "4"}, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["maxsize"] == 4 and max(result["entries"]) <= 4, result
    assert result["numpy"] < 8, result
    assert result["jnp"] > result["numpy"] + 5, result  # what clear_caches is for
    assert result["cleared"] < result["numpy"] + 2, result
    # clear_caches empties difffn's entries and JAX's own dispatch cache of the caller's jit;
    # the next predict compiles again and gives the same numbers
    assert result["entries_after_clear"] == 0 and result["jit_entries"] == [1, 0], result
    # The residue (docs/networks.md): JAX's trace_to_jaxpr cache (no maxsize) keeps a jaxpr per
    # new shape for jnp's own jitted functions traced inside the network (here jnp.add, the
    # bias), and pjit's record of traced input types an entry, although difffn evicted the
    # traces that called them; df.clear_caches empties both (jax.clear_caches only the first).
    assert result["traces"][0] >= 16 and result["traces"][1] == 0, result
    assert result["records"][0] >= 16 and result["records"][1] == 0, result
    assert result["recompiled"] and result["same_numbers"], result

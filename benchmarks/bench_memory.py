"""Memory: RSS growth of a service predicting on many distinct input shapes, MiB per 1,000 shapes.

Each case runs in a fresh Python process with ``DIFFFN_CACHE_SIZE=8``: a tiny network (4 -> 3,
ReLU) predicts on NumPy inputs of batch sizes it has not seen, after a warm-up, and the resident
set size (``/proc/self/statm``, after ``gc.collect()``) is read at the end. Cases: a bare
``jax.jit`` of the same function (the baseline: JAX keeps every shape), ``net.predict``,
``net.predict`` with ``df.clear_caches()`` every 25 new shapes (it empties JAX's tracing caches,
which keep jaxprs of jnp's own jitted functions per shape: the residue in docs/networks.md),
``net.predict`` on inputs the caller makes with ``jnp.ones`` (jnp keeps a program per shape), and
that with ``df.clear_caches()`` every 25. Linux only (``/proc``).
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys

from ._timing import table

CASES = {
    "jax.jit (baseline)": "bare",
    "net.predict": "net",
    "net.predict, df.clear_caches() every 25": "net-clear",
    "net.predict, jnp.ones inputs": "net-jnp",
    "net.predict, jnp.ones inputs, df.clear_caches() every 25": "net-jnp-clear",
}
CLEAR_EVERY = 25
WARMUP = 10


def _rss_mib() -> float:
    gc.collect()
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _measure(case: str, shapes: int) -> float:
    """Growth in MiB over ``shapes`` new batch sizes (run in its own process)."""
    import warnings

    import jax
    import jax.numpy as jnp
    import numpy as np

    import difffn as df

    warnings.simplefilter("ignore", df.RetraceWarning)
    net = df.Network(
        [
            df.layers.FeatureInput(4, normalization="none"),
            df.layers.FullyConnected(3, name="fc"),
            df.layers.ReLU(),
        ]
    ).initialize(key=jax.random.key(0))
    w, b = net.learnables["fc/weights"], net.learnables["fc/bias"]
    bare = jax.jit(lambda x: jax.nn.relu(x @ w + b[None, :]))

    def call(n):
        x = jnp.ones((n, 4)) if case.startswith("net-jnp") else np.ones((n, 4), np.float32)
        y = bare(x) if case == "bare" else net.predict(x).data
        y.block_until_ready()

    for n in range(1, WARMUP + 1):
        call(n)
    if case.endswith("clear"):
        df.clear_caches()
    start = _rss_mib()
    for i in range(1, shapes + 1):
        call(WARMUP + i)
        if case.endswith("clear") and i % CLEAR_EVERY == 0:
            df.clear_caches()
    return _rss_mib() - start


def run(*, quick: bool = False) -> None:
    shapes = 25 if quick else 100
    rows, growth = [], {}
    for name, case in CASES.items():
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.bench_memory", case, str(shapes)],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "DIFFFN_CACHE_SIZE": "8"},
        )
        growth[name] = float(out.stdout.split()[-1])
    baseline = growth["jax.jit (baseline)"]
    for name, mib in growth.items():
        rows.append([name, f"{mib:7.1f}", f"{mib / shapes * 1000:8.0f}", f"{mib / baseline:6.2f}x"])
    print(f"\n{shapes} new batch sizes after {WARMUP} warm-up calls; RSS growth")
    print(table(rows, ["case", "MiB", "MiB per 1,000 shapes", "vs jax.jit"]))


if __name__ == "__main__":
    print(_measure(sys.argv[1], int(sys.argv[2])))

"""A bounded cache of compiled functions, keyed on an input signature (shape, format, dtype).

MATLAB caches one trace per (size, format, underlying type) of a layer's inputs; difffn does the
same for whole networks. Each entry is its own ``jax.jit`` object, so evicting the least recently
used entry really frees its compiled code: JAX's own caches hold an entry's traces and
executables only while its ``jax.jit`` object lives (measured, docs/networks.md "Acceleration
and the trace cache"). Networks with the same structure share one cache.

What difffn cannot evict is what JAX keeps per shape for functions that live for ever: jnp's
own compiled helpers (``jnp.ones`` of a new shape compiles one), the caller's ``jax.jit``
functions, and the traces (jaxprs) of jnp's jitted functions that each new trace of a network
calls (``jnp.add``, ``jax.nn.relu``): JAX caches those per input shape, keyed on the function,
in ``trace_to_jaxpr`` without a size limit (measured, docs/networks.md). ``clear_caches`` drops
those too.
"""

from __future__ import annotations

import ctypes
import os
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, NamedTuple

import jax

from .._core import FormattedArray, OptionsError, short

DEFAULT_MAXSIZE = 50
SIZE_VARIABLE = "DIFFFN_CACHE_SIZE"


def default_maxsize() -> int:
    """Entries per structure's cache: ``DIFFFN_CACHE_SIZE`` when set (a positive int), else 50."""
    value = os.environ.get(SIZE_VARIABLE, "")
    if not value:
        return DEFAULT_MAXSIZE
    try:
        size = int(value)
    except ValueError:
        size = 0
    if size < 1:
        raise OptionsError(
            f"the environment variable {SIZE_VARIABLE}={value!r} must be a positive int (the "
            f"compiled traces kept per network structure; default {DEFAULT_MAXSIZE})."
        )
    return size


RETRACE_WARNING_AT = 10


class RetraceWarning(UserWarning):
    """A network keeps compiling new traces because its input signatures keep changing."""


class CacheInfo(NamedTuple):
    hits: int
    misses: int
    entries: int
    maxsize: int


def signature(value) -> Hashable:
    """What a compiled trace depends on: shape, dtype and format of every array."""
    leaves, tree = jax.tree.flatten(value)
    parts = []
    for leaf in leaves:
        aval = jax.typeof(leaf) if not isinstance(leaf, (int, float, bool)) else None
        if aval is None:
            parts.append((type(leaf).__name__,))
        else:
            parts.append((tuple(aval.shape), str(aval.dtype), bool(getattr(aval, "weak_type", 0))))
    return tree, tuple(parts)


def describe_signature(value) -> str:
    leaves = jax.tree.leaves(value, is_leaf=lambda x: isinstance(x, FormattedArray))
    return ", ".join(short(x) for x in leaves)


_CACHES: weakref.WeakSet[CompileCache] = weakref.WeakSet()


def clear_caches() -> None:
    """Drop every compiled trace that difffn and JAX hold, and return the memory to the system.

    difffn's trace caches are bounded on their own (``DIFFFN_CACHE_SIZE`` entries per network
    structure). JAX's caches are not, for functions that stay alive: the caller's ``jax.jit``
    functions, jnp's own (``jnp.ones((n, 3))`` of a new ``n`` compiles and keeps about
    1.3 MiB on CPU), and the jaxprs of jnp's jitted functions traced inside each new trace of a
    network (17 to 65 KiB per new input shape for a small network, kept for ever). A
    long-running service that sees many new shapes calls this every so many of them; the next
    call of each network compiles again. Statistics (``cache_info``'s hits and misses) are kept.

    It runs ``jax.clear_caches()``, which also drops the compiled code of the caller's own
    ``jax.jit`` functions; then empties the one per-shape record of JAX's that
    ``jax.clear_caches()`` leaves (see ``_clear_jit_trace_records``); then glibc's
    ``malloc_trim(0)`` (where the C library has it) so that freed memory leaves the process
    instead of staying in the allocator's arenas.

    Examples:
      A service whose own code makes arrays of many shapes (not run here: it would drop every
      compiled program of the process running the documentation's examples; tests/test_cache.py
      runs it in a process of its own)::

          for count, request in enumerate(requests, 1):
              reply(net.predict(prepare(request)))
              if count % 1000 == 0:
                  df.clear_caches()
    """
    for cache in list(_CACHES):
        cache._entries.clear()
    jax.clear_caches()
    _clear_jit_trace_records()
    _malloc_trim()


def _clear_jit_trace_records() -> None:
    """Empty ``jax._src.pjit._seen_qdds``, which ``jax.clear_caches()`` does not (jax 0.10.2).

    For each jitted function it maps every input type it was traced with to the index of a
    trace in ``trace_to_jaxpr``'s cache; a lookup adds an entry (a ``defaultdict``), so jnp's
    jitted functions traced inside each new trace of a network keep one per new input shape for
    ever (measured: 3 per shape for a dense + ReLU network, 5.5 MiB per 1,000 shapes). The
    indices point into caches that ``jax.clear_caches()`` has just emptied, so dropping them
    together keeps the two consistent; JAX offers no public way to. A JAX without the record
    has nothing to clear.
    """
    from jax._src import pjit  # private: the record lives only there

    records = getattr(pjit, "_seen_qdds", None)
    if records is not None:
        records.clear()


def _malloc_trim() -> None:
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc (macOS, musl, Windows): nothing to hand back
        return
    trim(0)


class CompileCache:
    """LRU of compiled callables with hit/miss statistics and a retrace warning."""

    def __init__(self, owner: str, maxsize: int | None = None):
        _CACHES.add(self)
        self.owner = owner
        self.maxsize = default_maxsize() if maxsize is None else maxsize
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[Hashable, Any] = OrderedDict()
        self._warned = False

    def get(self, key: Hashable, build: Callable[[], Any], describe: Callable[[], str]):
        entry = self.lookup(key)
        if entry is not None:
            return entry
        self.misses += 1
        entry = build()
        self._entries[key] = entry
        while len(self._entries) > self.maxsize:
            self._entries.popitem(last=False)
        if self.misses >= RETRACE_WARNING_AT and not self._warned:
            self._warned = True
            warnings.warn(
                f"{self.owner} has compiled {self.misses} traces (cache holds "
                f"{len(self._entries)} of at most {self.maxsize}); each new input signature "
                f"(shape, format, dtype) costs a trace and a compilation. Latest: "
                f"{describe()}. If sizes vary from call to call (e.g. sequence lengths), pad "
                "them to a few fixed sizes (trainnet, minibatchpredict and testnet do for "
                "lists of sequences: sequence_bucketing), or call with acceleration='none'.",
                RetraceWarning,
                stacklevel=4,
            )
        return entry

    def lookup(self, key: Hashable):
        """The entry for ``key`` (counted as a hit), or None when there is none."""
        entry = self._entries.get(key)
        if entry is not None:
            self.hits += 1
            self._entries.move_to_end(key)
        return entry

    def info(self) -> CacheInfo:
        return CacheInfo(self.hits, self.misses, len(self._entries), self.maxsize)

    def clear(self) -> None:
        self._entries.clear()
        self.hits = self.misses = 0
        self._warned = False

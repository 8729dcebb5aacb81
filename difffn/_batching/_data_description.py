"""Training and validation data described as strings: arrays by shape, dtype and a hash.

Data sources name their data this way (in their fingerprints and messages); the run's
fingerprint (``_fingerprint.py``) uses the same descriptions.
"""

from __future__ import annotations

import hashlib

import jax
import jax.numpy as jnp
import numpy as np

from .._core import FormattedArray

_FULL_HASH_BYTES = 1 << 24  # arrays up to this size are hashed whole, larger ones sampled
_SAMPLE = 1 << 20  # elements hashed of a larger array


def describe_array(x) -> str:
    """Shape, dtype and a hash of an array's values (sampled evenly when it is large)."""
    fmt = ""
    if isinstance(x, FormattedArray):
        fmt, x = f" {x.format}", x.data
    shape, dtype = tuple(np.shape(x)), np.dtype(x.dtype).name
    size = int(np.prod(shape, dtype=np.int64))
    if size * np.dtype(dtype).itemsize > _FULL_HASH_BYTES:
        step = max(1, size // _SAMPLE)
        x = (jnp.ravel(x) if isinstance(x, jax.Array) else np.ravel(x))[::step]
    data = np.ascontiguousarray(np.asarray(jax.device_get(x)))
    digest = hashlib.sha256(data.tobytes()).hexdigest()[:16]
    return f"shape {shape} {dtype}{fmt}, hash {digest}"


def describe_data(data, what: str) -> str:
    """Describe training or validation data: arrays by `describe_array`, else by type."""
    if data is None:
        return "None"
    if (
        isinstance(data, (tuple, list))
        and len(data) == 2
        and all(hasattr(x, "shape") for part in data for x in _group(part))
    ):
        return "; ".join(
            f"{name}[{k}] {describe_array(x)}"
            for name, part in zip(("X", "T"), data, strict=True)
            for k, x in enumerate(_group(part))
        )
    length = len(data) if hasattr(data, "__len__") else "unknown"
    return f"an iterable {type(data).__qualname__} of {length} {what} batches"


def _group(part) -> tuple:
    return tuple(part) if isinstance(part, (tuple, list)) else (part,)

"""``TrainingOptions(compilation_cache=folder)``: JAX's persistent compilation cache.

JAX already keeps compiled programs on disk when ``jax_compilation_cache_dir`` is set (see
JAX's "Persistent compilation cache" guide); a second process that compiles the same program
with the same JAX, backend and flags reads it back instead of compiling. This module only turns
that on from the training options: it sets the folder and, where they are still at JAX's
defaults, the two thresholds that keep small programs out of the cache
(``jax_persistent_cache_min_compile_time_secs``, 1 s, and
``jax_persistent_cache_min_entry_size_bytes``), so every program of a training run is cached.
Settings the user made (flags or the ``JAX_*`` environment variables JAX reads at import) are
kept.

The settings are JAX's process-wide configuration: once a training run has set them, later
compilations in the process (prediction, another run) use the cache too.
"""

from __future__ import annotations

import os

import jax
from jax.experimental.compilation_cache import compilation_cache as _jax_cache

# JAX's defaults of the two thresholds (jax/_src/config.py).
_DEFAULT_MIN_COMPILE_TIME_S = 1.0
_DEFAULT_MIN_ENTRY_SIZE = 0


def use(folder: str) -> None:
    """Make JAX read and write compiled programs in ``folder`` (created if missing).

    Args:
      folder: the cache folder (validated by ``TrainingOptions``).
    """
    folder = os.path.abspath(folder)
    os.makedirs(folder, exist_ok=True)
    if jax.config.jax_compilation_cache_dir != folder:
        # JAX opens its cache once per process, at the first compilation after a folder is
        # set; a new folder needs the open one closed first.
        _jax_cache.reset_cache()
        jax.config.update("jax_compilation_cache_dir", folder)
    if jax.config.jax_persistent_cache_min_compile_time_secs == _DEFAULT_MIN_COMPILE_TIME_S:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    if jax.config.jax_persistent_cache_min_entry_size_bytes == _DEFAULT_MIN_ENTRY_SIZE:
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)  # -1: no minimum

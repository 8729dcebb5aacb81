"""JAX's persistent compilation cache, on by default for the programs difffn compiles.

JAX already keeps compiled programs on disk when ``jax_compilation_cache_dir`` is set (see
JAX's "Persistent compilation cache" guide); a second process that compiles the same program
with the same JAX, backend and flags reads it back instead of compiling. This module turns that
on before difffn's first compilations of a script: ``Network.initialize`` (the program of the
initializers, with ``"auto"``) and ``trainnet`` (``TrainingOptions(compilation_cache=...)``), so
a second run of the same script compiles neither.

- ``"auto"`` (the default): the folder the ``DIFFFN_COMPILATION_CACHE`` environment variable
  names (``off`` turns the cache off), else the user's cache folder,
  ``$XDG_CACHE_HOME/difffn/xla`` (``~/.cache/difffn/xla`` when ``XDG_CACHE_HOME`` is unset).
  A folder already in use (given to JAX by the user, or set by difffn earlier in the process)
  is kept;
- a folder: that one; ``None`` or ``False``: off. A folder difffn itself set earlier in the
  process (an ``initialize`` before ``trainnet``) is turned off; one the user gave JAX is left
  alone.

It sets the folder and, where they are still at JAX's defaults, the two thresholds that keep
small programs out of the cache (``jax_persistent_cache_min_compile_time_secs``, 1 s, and
``jax_persistent_cache_min_entry_size_bytes``), so every program of a training run is cached,
and ``jax_compilation_cache_max_size`` (unbounded) to `MAX_SIZE_BYTES`: JAX then evicts
the least recently used programs (its ``LRUCache``, which needs the ``filelock`` package).
Settings the user made (flags or the ``JAX_*`` environment variables JAX reads at import) are
kept.

The settings are JAX's process-wide configuration: once set, later compilations in the process
(prediction, another run) use the cache too.
"""

from __future__ import annotations

import os
import warnings

import jax
from jax.experimental.compilation_cache import compilation_cache as _jax_cache

from .._core import MissingDependencyError, OptionsError, files

ENVIRONMENT_VARIABLE = "DIFFFN_COMPILATION_CACHE"
OFF_WORDS = ("off", "none", "false", "0", "no")
MAX_SIZE_BYTES = 2 * 2**30  # 2 GiB: a few hundred models' programs (a ResNet's are ~10 MiB)

# JAX's defaults of the thresholds and the size bound (jax/_src/config.py).
_DEFAULT_MIN_COMPILE_TIME_S = 1.0
_DEFAULT_MIN_ENTRY_SIZE = 0
_DEFAULT_MAX_SIZE = -1  # no bound
# JAX's LRUCache names an entry ``<key>-cache`` and its last use ``<key>-atime``.
_CACHE_SUFFIX, _ATIME_SUFFIX = "-cache", "-atime"
# The folder difffn set in this process (None: none, or the user's own): what ``None`` turns off.
_ours: str | None = None


def _setting(name: str):
    """JAX's current value of a configuration option (``jax.config`` declares none of them)."""
    return getattr(jax.config, name)


def default_folder() -> str:
    """The user's cache folder for compiled programs: ``$XDG_CACHE_HOME/difffn/xla``, or
    ``~/.cache/difffn/xla`` (the XDG base-directory convention, as ``platformdirs`` resolves it
    on Linux; on Windows ``%LOCALAPPDATA%\\difffn\\xla``)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # the XDG spec: a relative value is invalid, ignore it
        local = os.environ.get("LOCALAPPDATA", "") if os.name == "nt" else ""
        base = local or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "difffn", "xla")


def resolve(option: str | None, who: str = "trainnet") -> str | None:
    """The folder to use for the option's value (validated by ``TrainingOptions``), or None.

    ``"auto"`` reads ``DIFFFN_COMPILATION_CACHE`` (``off``: None; a path: that folder, which
    must be writable) and falls back to `default_folder`; it gives None when JAX already
    has a folder (the user's own setting, or difffn's earlier in the process, is kept). A default
    folder that cannot be made turns the cache off with a warning rather than stopping the run;
    ``who`` (the function that compiles) starts the messages.
    """
    if option != "auto":
        return option
    if _setting("jax_compilation_cache_dir") is not None:
        return None
    value = os.environ.get(ENVIRONMENT_VARIABLE, "").strip()
    if value.lower() in OFF_WORDS:
        return None
    if value:
        return files.writable_folder(
            value,
            lambda problem: OptionsError(
                f"{who}: the environment variable {ENVIRONMENT_VARIABLE}={value!r} names "
                f"{problem}. Fix: name a folder you can write to, or set "
                f"{ENVIRONMENT_VARIABLE}=off to compile without the persistent cache."
            ),
        )
    folder = default_folder()
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as error:
        warnings.warn(
            f"difffn: the compilation cache's default folder {folder!r} cannot be made "
            f"({type(error).__name__}: {error}); {who} compiles without it. Fix: set "
            f"{ENVIRONMENT_VARIABLE} to a writable folder, or to off (no warning).",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    return folder


def use(option: str | None, who: str = "trainnet") -> str | None:
    """Make JAX read and write compiled programs in the option's folder (created if missing).

    Args:
      option: ``TrainingOptions.compilation_cache``: ``"auto"``, a folder or None (off: a
        folder difffn set earlier in the process is turned off).
      who: the function about to compile, named in messages.

    Returns:
      The folder this call set, or None (off, or a folder already in use is kept).
    """
    global _ours
    if option is None:
        if _ours is not None and _setting("jax_compilation_cache_dir") == _ours:
            _jax_cache.reset_cache()
            jax.config.update("jax_compilation_cache_dir", None)
        _ours = None
        return None
    folder = resolve(option, who)
    if folder is None:
        return None
    folder = os.path.abspath(folder)
    os.makedirs(folder, exist_ok=True)
    bound = _setting("jax_compilation_cache_max_size") == _DEFAULT_MAX_SIZE
    if bound:
        _require_filelock(who)
        _date_unused_entries(folder)
    if _setting("jax_compilation_cache_dir") != folder:
        # JAX opens its cache once per process, at the first compilation after a folder is
        # set; a new folder needs the open one closed first.
        _jax_cache.reset_cache()
        jax.config.update("jax_compilation_cache_dir", folder)
    if bound:
        _jax_cache.reset_cache()  # JAX reads the size bound when it opens the cache
        jax.config.update("jax_compilation_cache_max_size", MAX_SIZE_BYTES)
    if _setting("jax_persistent_cache_min_compile_time_secs") == _DEFAULT_MIN_COMPILE_TIME_S:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    if _setting("jax_persistent_cache_min_entry_size_bytes") == _DEFAULT_MIN_ENTRY_SIZE:
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)  # -1: no minimum
    _ours = folder
    return folder


def _require_filelock(who: str) -> None:
    try:
        import filelock  # noqa: F401  (JAX's LRUCache locks the folder with it)
    except ImportError:
        raise MissingDependencyError(
            f"{who}: the compilation cache is bounded in size by JAX's LRU eviction "
            "(jax_compilation_cache_max_size), which needs the 'filelock' package. Fix: "
            "pip install filelock (a dependency of difffn), or turn the cache off with "
            f"TrainingOptions(compilation_cache=None) or {ENVIRONMENT_VARIABLE}=off."
        ) from None


def _date_unused_entries(folder: str) -> None:
    """Give every entry written without a size bound (no ``-atime`` file) its file's date.

    JAX writes the last-use file only while eviction is on; its eviction reads that file for
    every entry and fails on a missing one, so entries an unbounded run wrote in this folder
    (``JAX_COMPILATION_CACHE_DIR`` set by hand, an older difffn) get one, dated by the entry's
    modification time: they are evicted first.
    """
    try:
        names = set(os.listdir(folder))
    except OSError:
        return
    for name in names:
        if not name.endswith(_CACHE_SUFFIX):
            continue
        key = name.removesuffix(_CACHE_SUFFIX)
        if key + _ATIME_SUFFIX in names:
            continue
        try:
            stamp = os.stat(os.path.join(folder, name)).st_mtime_ns
            with open(os.path.join(folder, key + _ATIME_SUFFIX), "wb") as atime:
                atime.write(stamp.to_bytes(8, "little"))
        except OSError:
            pass  # another process evicted it meanwhile

"""Strict settings for the whole suite.

- numpy rank promotion raises inside every test under tests/, so a silent broadcast is a test
  failure (a fixture, not a global switch: the doctests of docs/ show user code, which runs
  with JAX's default setting, and pytest-xdist runs them in the same worker processes);
- every warning is an error (exceptions are listed in pyproject.toml);
- float64 is enabled only by the ``x64`` fixture, inside this test process;
- randomness comes from the ``key`` fixture;
- XLA compiles without LLVM's optimization passes (``XLA_FLAGS``, set here before JAX starts its
  backend, and inherited by the examples and multi-process runs the suite launches): most of the
  suite's time is XLA compiling many small programs once each, which this cuts by about 15%
  (measured on the layer tests); the programs compute the same operations, only less fast.
  Benchmarks and users run with XLA's defaults.
- trainnet's persistent compilation cache (on by default in the user's cache folder) is off
  (``DIFFFN_COMPILATION_CACHE=off``, inherited by the subprocesses the suite launches): the
  suite never writes into the real home folder; tests/test_compilation_cache.py turns it on in
  temporary folders.
"""

from __future__ import annotations

import os

from helpers import TEST_XLA_FLAGS

os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {TEST_XLA_FLAGS}".strip()
os.environ["DIFFFN_COMPILATION_CACHE"] = "off"

import jax  # noqa: E402  (after XLA_FLAGS)
import pytest  # noqa: E402

# Scripts that wrote the committed test data (one needs torch, which the suite never imports).
collect_ignore_glob = ["data/*"]


@pytest.fixture(autouse=True)
def _strict_rank_promotion():
    with jax.numpy_rank_promotion("raise"):
        yield


@pytest.fixture
def key():
    """A fresh typed PRNG key; tests split it, never share it."""
    return jax.random.key(0)


@pytest.fixture
def x64():
    """Run one test with float64 enabled, then restore the previous setting."""
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", previous)

"""Strict settings for the whole suite.

- numpy rank promotion raises, so a silent broadcast is a test failure;
- every warning is an error (exceptions are listed in pyproject.toml);
- float64 is enabled only by the ``x64`` fixture, inside this test process;
- randomness comes from the ``key`` fixture.
"""

from __future__ import annotations

import jax
import pytest

jax.config.update("jax_numpy_rank_promotion", "raise")


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

"""Exporting with jax.export: layouts to symbolic shapes, bytes, and back, with the VJP."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import difffn as df
from difffn._persistence import _export


def test_unknown_sizes_become_shared_symbols():
    specs = _export.input_specs(
        [df.Layout((None, 8, None), "BTC"), df.Layout((None, None, 3), "BTC")]
    )
    assert str(specs[0].shape) == "(batch, 8, c0_2)"
    assert str(specs[1].shape) == "(batch, time, 3)"


def test_a_function_round_trips_through_bytes_with_its_vjp():
    def fn(x, w):
        return jnp.tanh(x) * w

    data = _export.export_bytes(fn, df.Layout((None, 3), "BC"), df.Layout((1, 3), "UC"))
    assert isinstance(data, bytes)
    loaded = _export.load_function(data)
    w = jnp.array([[1.0, 2.0, 3.0]])
    for batch in (1, 5):
        x = jnp.linspace(-1.0, 1.0, 3 * batch).reshape(batch, 3)
        np.testing.assert_allclose(loaded(x, w), fn(x, w), rtol=1e-6)
        np.testing.assert_allclose(
            jax.grad(lambda x: loaded(x, w).sum())(x),
            jax.grad(lambda x: fn(x, w).sum())(x),
            rtol=1e-6,
        )
    np.testing.assert_allclose(loaded(df.dlarray(x, "BC"), w), fn(x, w), rtol=1e-6)


def test_shape_dependent_python_is_a_serialization_error():
    def fn(x):
        return x * 2 if x.shape[0] > 1 else x

    with pytest.raises(df.SerializationError, match=r"could not be exported .*None"):
        _export.export_bytes(fn, df.Layout((None, 3), "BC"))


def test_bad_bytes_and_bad_layouts_are_serialization_errors():
    with pytest.raises(df.SerializationError, match="not a serialized jax.export function"):
        _export.load_function(b"not an export")
    with pytest.raises(df.SerializationError, match="expected a df.Layout"):
        _export.input_specs([np.zeros((2, 3))])

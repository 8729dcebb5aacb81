"""What a user's class defines: its methods and the parameters each takes."""

from __future__ import annotations

import gc
import weakref

import jax.numpy as jnp
import pytest

import difffn as df
from difffn._core._signatures import (
    accepts_key,
    backward_takes_state,
    has_backward,
    has_method,
    positional,
    predict_arity,
)


class Base(df.Layer):
    total: jnp.ndarray | None = df.state(default=None)

    def predict(self, a, b, scale=1.0):
        return (a + b) * scale, self.total

    def forward(self, a, b, *, key):
        return a + b, self.total


class Child(Base):
    def backward(self, a, b, y, dy, dtotal, memory):
        return dy, dy, dtotal


def test_positional_parameters_after_self():
    p = positional(Base.predict)
    assert (p.names, p.required, p.variadic) == (("a", "b", "scale"), ("a", "b"), False)
    assert positional(lambda self, *xs, **kw: None).variadic


def test_what_a_layer_class_defines():
    assert predict_arity(Base) == 2 and Base().num_inputs == 2
    assert has_method(Child, "forward") and has_method(Child(), "predict")  # inherited from Base
    assert not has_method(Base, "initialize") and not has_method(Base, "reset_state")
    assert has_backward(Child) and not has_backward(Base)
    assert accepts_key(Base, "forward") and not accepts_key(Base, "predict")
    assert backward_takes_state(Child, 2, 1)  # X x2, Y, dLdY, dLdSout, memory
    with pytest.raises(df.LayerError, match=r"Child\.backward takes 6 arguments after self"):
        backward_takes_state(Child, 1, 1)


def test_reading_a_signature_keeps_nothing_alive():
    def method(self, x, *, key=None):
        return x

    assert positional(method).names == ("x",)
    ref = weakref.ref(method)
    del method
    gc.collect()
    assert ref() is None

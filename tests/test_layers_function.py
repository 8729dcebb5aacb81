"""Tests of difffn/layers/_function_layer.py: FunctionLayer."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import difffn as df

L = df.layers


def test_num_inputs_from_the_signature():
    assert L.FunctionLayer(jnp.tanh).num_inputs == 1
    assert L.FunctionLayer(jax.nn.gelu).num_inputs == 1  # approximate has a default
    layer = L.FunctionLayer(lambda a, b, c: a + b + c)
    assert (layer.num_inputs, layer.input_names) == (3, ("in1", "in2", "in3"))
    assert L.FunctionLayer(jnp.add, num_inputs=2).num_inputs == 2  # a ufunc takes *args
    named = L.FunctionLayer(lambda a, b: a - b, input_names=("x", "y"))
    assert named.num_inputs == 2


def test_plain_function_keeps_the_input_format():
    layer = L.FunctionLayer(lambda x: 2 * x)
    y = layer(df.dlarray(jnp.ones((2, 3)), "BC"))
    assert y.format == "BC"
    np.testing.assert_array_equal(y.data, 2)
    assert layer.description == "FunctionLayer(<lambda>)"
    assert L.FunctionLayer(jnp.tanh, description="squash").description == "squash"


def test_formattable_is_per_instance():
    seen = []

    def first_row(x):
        seen.append(type(x))
        return x[0]

    layer = L.FunctionLayer(first_row, formattable=True)
    assert layer.formattable is True
    assert L.FunctionLayer.formattable is False and df.Layer.formattable is False
    assert L.FunctionLayer(first_row).formattable is False
    y = layer(df.dlarray(jnp.ones((2, 3)), "BC"))
    assert seen == [df.FormattedArray]
    assert (y.format, y.shape) == ("C", (3,))
    plain = L.FunctionLayer(lambda x: df.stripdims(x) * 2, formattable=True)
    with pytest.raises(df.LayerError, match="is formattable but its output 'out' is a plain"):
        plain(df.dlarray(jnp.ones((2, 3)), "BC"))


def test_acceleratable_is_per_instance():
    def python_branch(x):
        return x if float(jnp.sum(x)) > 0 else -x

    layer = L.FunctionLayer(python_branch, acceleratable=False)
    assert layer.acceleratable is False and L.FunctionLayer.acceleratable is True
    np.testing.assert_array_equal(layer(-jnp.ones(2)), 1)
    with pytest.raises(df.AccelerationError, match="sets acceleratable = False"):
        jax.jit(lambda x: layer(x))(jnp.ones(2))
    with pytest.raises(df.AccelerationError, match=r"or set `acceleratable = False`"):
        jax.jit(lambda x: L.FunctionLayer(python_branch)(x))(jnp.ones(2))


def test_several_outputs_jit_and_grad():
    layer = L.FunctionLayer(lambda x, y: (x * y, x + y), num_outputs=2)
    assert layer.output_names == ("out1", "out2")
    x, y = jnp.arange(3.0), jnp.ones(3)
    product, total = jax.jit(lambda layer, x, y: layer(x, y))(layer, x, y)
    np.testing.assert_array_equal(product, x)
    np.testing.assert_array_equal(total, x + 1)
    assert jax.tree.leaves(layer) == []
    grad = jax.grad(lambda x: jnp.sum(layer(x, y)[0] ** 2))(x)
    np.testing.assert_array_equal(grad, 2 * x)
    partial = L.FunctionLayer(functools.partial(jnp.clip, min=0.0))
    np.testing.assert_array_equal(partial(jnp.array([-1.0, 1.0])), [0.0, 1.0])


def test_bad_arguments():
    with pytest.raises(df.LayerError, match=r"FunctionLayer \(layer 'f'\): fn must be a function"):
        L.FunctionLayer(3, name="f")

    class Unhashable:
        __hash__ = None

        def __call__(self, x):
            return x

    with pytest.raises(df.LayerError, match="fn must be a hashable callable"):
        L.FunctionLayer(Unhashable())
    with pytest.raises(df.LayerError, match="formattable must be True or False"):
        L.FunctionLayer(jnp.tanh, formattable="yes")

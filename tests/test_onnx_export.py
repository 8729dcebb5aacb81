"""Tests of df.export_onnx (difffn/_onnx/_export.py, _lower.py).

ONNX Runtime is the judge: each network is exported, run in ONNX Runtime and compared with
``net.predict`` on the same inputs (float32 tolerance); ``df.import_onnx`` of the file gives a
network with the same outputs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnxruntime as ort
import pytest

import difffn as df

L = df.layers


class LeakyPReLU(df.Layer):
    """A custom layer with a learnable and its own backward (traced through custom_vjp)."""

    alpha: jax.Array = df.learnable()

    def __init__(self, channels, name=None):
        super().__init__(name=name)
        self.alpha = jnp.linspace(0.1, 0.5, channels).reshape(1, 1, 1, channels)

    def predict(self, x):
        return jnp.where(x > 0, x, self.alpha * x)

    def backward(self, x, y, dLdY, memory):
        dx = dLdY * jnp.where(x > 0, 1.0, self.alpha)
        return dx, jnp.sum(dLdY * jnp.where(x > 0, 0.0, x), axis=(0, 1, 2), keepdims=True)


class CumulativeSum(df.Layer):
    def predict(self, x):
        return jnp.cumsum(x, axis=-1)


def cnn():
    return df.Network([
        L.ImageInput((8, 8, 2), normalization="none", name="in"),
        L.Conv2D(3, 4, padding="same", name="conv"),
        L.BatchNorm(name="bn"),
        LeakyPReLU(4, name="prelu"),
        L.MaxPool2D(2, stride=2, name="pool"),
        L.Conv2D(3, 5, stride=2, name="conv2"),
        L.ReLU(name="relu"),
        L.GlobalAveragePool2D(name="gap"),
        L.FullyConnected(3, name="fc"),
        L.Softmax(name="softmax"),
    ]).initialize(key=jax.random.key(0))  # fmt: skip


def ort_run(path, x):
    session = ort.InferenceSession(str(path))
    return session.run(None, {session.get_inputs()[0].name: x})


def test_cnn_with_a_custom_layer_matches_onnx_runtime_for_any_batch(tmp_path):
    net = cnn()
    net = net.replace_layer("bn", net.layers[2].replace(
        trained_mean=jnp.arange(4.0) / 4, trained_variance=jnp.arange(1.0, 5.0)))  # fmt: skip
    path = df.export_onnx(net, tmp_path / "cnn.onnx")
    model = onnx.load(path)
    assert model.graph.input[0].name == "in"
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "B"
    kinds = {node.op_type for node in model.graph.node}
    assert {"Conv", "MaxPool", "MatMul"} <= kinds and "Einsum" not in kinds
    names = {init.name for init in model.graph.initializer}
    assert {"conv.weights", "prelu.alpha", "fc.weights"} <= names
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 8, 8, 2)).astype(np.float32)
        (got,) = ort_run(path, x)
        np.testing.assert_allclose(got, net.predict(x).data, rtol=1e-5, atol=1e-6)


def test_exported_file_imports_back_to_the_same_function(tmp_path):
    net = cnn()
    path = df.export_onnx(net, tmp_path / "cnn.onnx")
    back = df.import_onnx(path)  # the file's metadata says its input is "BSSC"
    kinds = [type(layer).__name__ for layer in back.layers]
    assert kinds.count("Conv2D") == 2 and "MaxPool2D" in kinds
    x = np.random.default_rng(0).standard_normal((2, 8, 8, 2)).astype(np.float32)
    np.testing.assert_allclose(back.predict(x).data, net.predict(x).data, rtol=1e-5, atol=1e-6)
    # exporting the imported network again gives the same outputs; its shape computations
    # need a concrete batch size
    with pytest.raises(df.ONNXExportError, match=r"needs concrete sizes.*Symbolic dimension 'B'"):
        df.export_onnx(back, tmp_path / "again.onnx")
    again = df.export_onnx(back, df.Layout((2, 8, 8, 2), "BSSC"), tmp_path / "again.onnx")
    np.testing.assert_allclose(ort_run(again, x)[0], net.predict(x).data, rtol=1e-5, atol=1e-6)


def test_lstm_with_a_fixed_length_is_unrolled(tmp_path):
    net = df.Network([
        L.SequenceInput(3, name="in"), L.LSTM(4, name="lstm"), L.FullyConnected(2, name="fc"),
    ]).initialize(key=jax.random.key(1))  # fmt: skip
    path = df.export_onnx(net, df.Layout((None, 5, 3), "BTC"), tmp_path / "lstm.onnx")
    x = np.random.default_rng(0).standard_normal((2, 5, 3)).astype(np.float32)
    (got,) = ort_run(path, x)
    np.testing.assert_allclose(got, net.predict(x).data, rtol=1e-5, atol=1e-6)
    with pytest.raises(df.ONNXExportError, match=r"layer 'lstm' uses jax.lax.scan over a symbol"):
        df.export_onnx(net, tmp_path / "any_length.onnx")


def test_an_operation_without_lowering_names_the_layer_and_the_operation(tmp_path):
    net = df.Network([L.FeatureInput(3, name="in"), CumulativeSum(name="running")])
    net = net.initialize(key=jax.random.key(0))
    with pytest.raises(df.ONNXExportError, match=r"layer 'running' uses the JAX operation 'cumsum"):
        df.export_onnx(net, tmp_path / "x.onnx")
    assert not (tmp_path / "x.onnx").exists()


def test_bad_arguments_are_named_errors(tmp_path):
    net = df.Network([L.FeatureInput(3, name="in"), L.FullyConnected(2, name="fc")])
    with pytest.raises(df.ONNXExportError, match="not initialized"):
        df.export_onnx(net, tmp_path / "x.onnx")
    with pytest.raises(df.ONNXExportError, match="last argument must be the file path"):
        df.export_onnx(net.initialize(key=jax.random.key(0)))
    with pytest.raises(df.ONNXExportError, match="expected a df.Network; got LeakyPReLU"):
        df.export_onnx(LeakyPReLU(2), tmp_path / "x.onnx")

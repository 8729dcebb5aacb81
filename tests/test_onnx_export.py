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
    for batch in (x, x[:1], np.concatenate([x, x])):  # the fc flattens 5*B rows: Reshape's -1
        (got,) = ort_run(path, batch)
        np.testing.assert_allclose(got, net.predict(batch).data, rtol=1e-5, atol=1e-6)
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


def roundtrip(net, layout, path, x):
    """Export, check ONNX Runtime against ``net.predict`` on ``x``; the imported file."""
    path = df.export_onnx(net, layout, path)
    (got,) = ort_run(path, x)
    np.testing.assert_allclose(got, net.predict(x).data, rtol=1e-5, atol=1e-5)
    back = df.import_onnx(path)
    np.testing.assert_allclose(back.predict(x).data, got, rtol=1e-5, atol=1e-5)
    return onnx.load(path), [type(layer).__name__ for layer in back.layers]


def test_cnn_layers_export_as_onnx_operators_that_import_back_as_the_same_layers(tmp_path):
    rng = np.random.default_rng(0)
    image = df.Network([
        L.ImageInput((5, 5, 3), normalization="none", name="in"),
        L.TransposedConv2D(3, 4, stride=2, cropping=((1, 0), (0, 1)), name="up"),
        L.AveragePool2D(3, stride=2, padding=1, padding_value="mean", name="pool"),
        L.LeakyReLU(0.2, name="leaky"), L.ClippedReLU(0.9, name="clipped"), L.Tanh(name="tanh"),
        L.Sigmoid(name="sigmoid"), L.Swish(name="swish"), L.Softmax(name="softmax"),
    ]).initialize(key=jax.random.key(0))  # fmt: skip
    x = rng.standard_normal((2, 5, 5, 3)).astype(np.float32)
    model, kinds = roundtrip(image, df.Layout((None, 5, 5, 3), "BSSC"), tmp_path / "a.onnx", x)
    ops = {node.op_type for node in model.graph.node}
    assert {"ConvTranspose", "AveragePool", "LeakyRelu", "Clip", "Softmax"} <= ops
    assert "Exp" not in ops and "Identity" not in ops
    assert {"TransposedConv2D", "AveragePool2D", "LeakyReLU", "ClippedReLU", "Tanh", "Sigmoid",
            "Swish", "Softmax"} <= set(kinds)  # fmt: skip


@pytest.mark.parametrize(
    "layer, fmt, shape",
    [
        (L.Conv1D(3, 4, padding=(1, 2), stride=2, name="conv"), "BTC", (2, 9, 3)),
        (L.Conv3D(2, 3, padding=1, dilation=(1, 2, 1), name="conv"), "BSSSC", (2, 4, 5, 4, 2)),
    ],
)
def test_conv1d_and_conv3d_import_back_as_themselves(layer, fmt, shape, tmp_path):
    # a sequence of a fixed length: the file's Conv pads do not depend on it
    layout = df.Layout((None, *shape[1:]), fmt)
    net = df.Network([layer]).initialize(layout, key=jax.random.key(1))
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    _, kinds = roundtrip(net, layout, tmp_path / "conv.onnx", x)
    entry = "SequenceInput" if fmt == "BTC" else "ONNXInput"
    # the bias add after the convolution is folded into the Conv's bias input
    assert kinds == [entry, type(layer).__name__]


def test_other_cnn_layers_export_and_onnx_runtime_agrees(tmp_path):
    # these export as elementwise math and reductions (GELU as x * (1 + Erf) / 2); their import
    # is the same function, node by node
    net = df.Network([
        L.ImageInput((4, 4, 4), normalization="none", name="in"),
        L.InstanceNorm(name="instance"), L.GroupNorm(2, name="group"), L.LayerNorm(name="layer"),
        L.GELU(name="gelu"),
        L.Resize2D(scale=2, method="bilinear", name="resize"), L.GlobalMaxPool2D(name="gmp"),
    ]).initialize(key=jax.random.key(2))  # fmt: skip
    x = np.random.default_rng(1).standard_normal((2, 4, 4, 4)).astype(np.float32)
    roundtrip(net, df.Layout((None, 4, 4, 4), "BSSC"), tmp_path / "b.onnx", x)


def residual_cnn():
    """A ResNet block: stem conv/BN/ReLU, two conv/BN with a projected shortcut, residual add,
    ReLU, global average pooling, a fully connected layer."""
    net = df.Network([
        L.ImageInput((8, 8, 3), normalization="none", name="in"),
        L.Conv2D(3, 4, padding="same", name="stem"), L.BatchNorm(name="stem_bn"),
        L.ReLU(name="stem_relu"),
        L.Conv2D(3, 6, stride=2, padding="same", name="a"), L.BatchNorm(name="a_bn"),
        L.ReLU(name="a_relu"),
        L.Conv2D(3, 6, padding="same", name="b"), L.BatchNorm(name="b_bn"),
        L.Addition(2, name="add"), L.ReLU(name="relu"),
        L.GlobalAveragePool2D(name="gap"), L.FullyConnected(3, name="fc"),
    ])  # fmt: skip
    net = net.add_layers([
        L.Conv2D(1, 6, stride=2, name="proj"), L.BatchNorm(name="proj_bn"),
    ]).connect_layers("stem_relu", "proj").connect_layers("proj_bn", "add/in2")  # fmt: skip
    net = net.initialize(key=jax.random.key(3))
    rng = np.random.default_rng(4)
    for name in ("stem_bn", "a_bn", "b_bn", "proj_bn"):  # statistics that change the outputs
        layer = net.layer(name)
        c = layer.trained_mean.shape[-1]
        net = net.replace_layer(name, layer.replace(
            trained_mean=jnp.asarray(rng.normal(size=c), jnp.float32),
            trained_variance=jnp.asarray(rng.uniform(0.5, 2.0, c), jnp.float32),
            scale=jnp.asarray(rng.uniform(0.5, 1.5, c), jnp.float32).reshape(layer.scale.shape),
            offset=jnp.asarray(rng.normal(size=c), jnp.float32).reshape(layer.offset.shape)))  # fmt: skip
    return net


def test_inference_graph_has_no_inner_transposes_and_folds_batch_norm(tmp_path):
    net = residual_cnn()
    x = np.random.default_rng(5).standard_normal((3, 8, 8, 3)).astype(np.float32)
    expected = np.asarray(net.predict(x).data)
    plain = onnx.load(df.export_onnx(net, tmp_path / "plain.onnx", optimize=False))
    path = df.export_onnx(net, tmp_path / "fast.onnx")
    fast = onnx.load(path)
    ops = [node.op_type for node in fast.graph.node]
    # one Transpose: the NHWC input to ONNX's NCHW; none between the channel-wise operations
    assert ops.count("Transpose") == 1 and ops[0] == "Transpose"
    assert [n.op_type for n in plain.graph.node].count("Transpose") == 2 * 4
    # batch normalization and the biases are in the convolutions' weights and biases
    assert ops.count("Conv") == 4 and not {"Sub", "Mul"} & set(ops)
    assert ops.count("Relu") == 3 and ops.count("Add") == 2  # the residual add, fc's bias
    assert all(len(n.input) == 3 for n in fast.graph.node if n.op_type == "Conv")
    assert len(fast.graph.initializer) < len(plain.graph.initializer)
    # ONNX Runtime with and without its own graph rewrites agrees with net.predict
    for level in (ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
                  ort.GraphOptimizationLevel.ORT_ENABLE_ALL):  # fmt: skip
        options = ort.SessionOptions()
        options.graph_optimization_level = level
        session = ort.InferenceSession(str(path), options)
        (got,) = session.run(None, {"in": x})
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    back = df.import_onnx(path)
    np.testing.assert_allclose(back.predict(x).data, expected, rtol=1e-5, atol=1e-5)


def test_a_transpose_read_twice_or_a_graph_output_is_kept(tmp_path):
    # the conv's channels-last output is a network output and feeds a ReLU: the Transpose
    # back to channels-last stays for the output, the ReLU may run channels-first
    net = df.Network([
        L.ImageInput((4, 4, 2), normalization="none", name="in"),
        L.Conv2D(1, 3, name="conv"), L.ReLU(name="relu"),
    ])  # fmt: skip
    net = net.add_layers(L.Sigmoid(name="sig")).connect_layers("conv", "sig")
    net = net.initialize(key=jax.random.key(6))
    x = np.random.default_rng(7).standard_normal((2, 4, 4, 2)).astype(np.float32)
    path = df.export_onnx(net, tmp_path / "two.onnx")
    session = ort.InferenceSession(str(path))
    got = dict(zip([o.name for o in session.get_outputs()], session.run(None, {"in": x})))
    for name in net.output_names:
        np.testing.assert_allclose(got[name], net.predict(x, outputs=[name]).data,
                                   rtol=1e-5, atol=1e-6)  # fmt: skip


def test_attention_and_layer_norm_are_unchanged_by_the_rewrites(tmp_path):
    # transposes of the heads sink only where every input agrees; ONNX Runtime without its own
    # rewrites runs exactly the file difffn wrote
    net = df.Network([
        L.SequenceInput(8, name="in"), L.SelfAttention(2, 8, name="attn"),
        L.LayerNorm(name="ln"), L.FullyConnected(3, name="fc"),
    ]).initialize(key=jax.random.key(8))  # fmt: skip
    layout = df.Layout((None, 5, 8), "BTC")
    x = np.random.default_rng(9).standard_normal((2, 5, 8)).astype(np.float32)
    plain = df.export_onnx(net, layout, tmp_path / "plain.onnx", optimize=False)
    fast = df.export_onnx(net, layout, tmp_path / "fast.onnx")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    for path in (plain, fast):
        (got,) = ort.InferenceSession(str(path), options).run(None, {"in": x})
        np.testing.assert_allclose(got, net.predict(x).data, rtol=1e-5, atol=1e-6)
    assert len(onnx.load(fast).graph.node) <= len(onnx.load(plain).graph.node)

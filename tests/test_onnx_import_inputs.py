"""What an imported network is, as a network: old opsets converted, input layers that are
``df.InputLayer`` s (data in ONNX's order on request, a fix line when it comes in that order
anyway), edits that move the outputs, and placeholders that keep the shapes after them."""

from __future__ import annotations

import os

import jax.numpy as jnp
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import difffn as df

CONVERTED = os.path.join(
    os.path.dirname(onnx.__file__), "backend", "test", "data", "pytorch-converted"
)


def _case(name):
    """A PyTorch-converted operator test of the onnx package: model (opset 6), input, output."""
    folder = os.path.join(CONVERTED, name)
    model = onnx.load(os.path.join(folder, "model.onnx"))
    data = os.path.join(folder, "test_data_set_0")
    arrays = []
    for file in ("input_0.pb", "output_0.pb"):
        tensor = onnx.TensorProto()
        with open(os.path.join(data, file), "rb") as f:
            tensor.ParseFromString(f.read())
        arrays.append(numpy_helper.to_array(tensor))
    return model, arrays[0], arrays[1]


@pytest.mark.parametrize("name", ["test_Conv1d", "test_MaxPool1d", "test_Conv2d", "test_Linear"])
def test_opset_6_models_are_converted_and_match_their_outputs(name):
    model, x, expected = _case(name)
    assert model.opset_import[0].version < 9
    net = df.import_onnx(model, input_data_formats="onnx")
    (entry,) = net.input_layers
    assert isinstance(entry, df.InputLayer)
    assert "converted to opset 13 by onnx.version_converter" in entry.description
    y = np.asarray(df.stripdims(net.predict(x)))
    if y.ndim > 2:  # outputs are stored channels-last
        y = np.moveaxis(y, -1, 1)
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)


def _conv1d_model():
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((5, 4, 3)).astype(np.float32), "w")
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="/conv", pads=[1, 1])
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 10])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5, 10])], [w],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_input_layers_are_input_layers_and_take_onnx_order_on_request():
    model = _conv1d_model()
    x = np.random.default_rng(1).standard_normal((2, 4, 10)).astype(np.float32)
    (expected,) = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    stored = df.import_onnx(model)
    (entry,) = stored.input_layers
    assert isinstance(entry, df.InputLayer)
    assert entry.input_layout == df.Layout((None, 10, 4), "BSC")
    y = stored.predict(np.transpose(x, (0, 2, 1)))
    np.testing.assert_allclose(np.moveaxis(np.asarray(df.stripdims(y)), -1, 1), expected,
                               rtol=1e-5, atol=1e-5)  # fmt: skip
    # data in ONNX's order: the error says how to transpose
    with pytest.raises(df.Error, match=r"(?s)expects size 10 on axis 1.*got shape \(2, 4, 10\)"
                       r".*np.transpose\(x, \(0, 2, 1\)\).*input_data_formats='onnx'"):  # fmt: skip
        stored.predict(x)
    onnx_order = df.import_onnx(model, input_data_formats={"x": "BCS"})
    assert onnx_order.input_layers[0].input_layout == df.Layout((None, 4, 10), "BCS")
    y = onnx_order.predict(x)
    np.testing.assert_allclose(np.moveaxis(np.asarray(df.stripdims(y)), -1, 1), expected,
                               rtol=1e-5, atol=1e-5)  # fmt: skip
    with pytest.raises(df.ONNXImportError, match=r"input_data_formats must be 'onnx' or"):
        df.import_onnx(model, input_data_formats=3)


def _classifier():
    rng = np.random.default_rng(2)
    inits = [
        numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "fc1.w"),
        numpy_helper.from_array(rng.standard_normal((3, 2)).astype(np.float32), "fc2.w"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "fc1.w"], ["h"], name="fc1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "fc2.w"], ["logits"], name="fc2"),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 2])], inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_editing_an_imported_network_moves_its_outputs():
    net = df.import_onnx(_classifier())
    assert net.output_names == ("fc2",)
    edited = net.add_layers(df.layers.Softmax(name="sm")).connect_layers("fc2", "sm")
    assert edited.output_names == ("sm",)
    x = np.random.default_rng(3).standard_normal((5, 4)).astype(np.float32)
    logits = np.asarray(df.stripdims(net.predict(x)))
    probabilities = np.asarray(df.stripdims(edited.predict(x)))
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    np.testing.assert_allclose(probabilities, e / e.sum(axis=1, keepdims=True), rtol=1e-5)


def test_an_edit_that_leaves_named_outputs_stale_warns():
    layers = [df.layers.FeatureInput(4, name="in"), df.layers.FullyConnected(2, name="fc")]
    net = df.Network(layers, outputs=["fc"])
    with pytest.warns(UserWarning, match=r"(?s)outputs were named explicitly \(\['fc/out'\].*"
                      r"'fc/out' stays an output while \['sm/out'\] is used by nothing.*Fix"):  # fmt: skip
        edited = net.add_layers(df.layers.Softmax(name="sm")).connect_layers("fc", "sm")
    assert edited.output_names == ("fc",)


def _custom_then_conv(op, domain):
    """x (N, 3, 8, 8) -> op (3 -> 6 channels; torch writes no output type) -> Conv -> Relu ->
    Flatten -> Gemm."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(0.2 * rng.standard_normal((4, 6, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(0.1 * rng.standard_normal(4).astype(np.float32), "b"),
        numpy_helper.from_array(0.05 * rng.standard_normal((5, 256)).astype(np.float32), "fc"),
    ]
    extra = {"axis": 1} if op == "Concat" else {}
    inputs = ["x", "x"] if op == "Concat" else ["x"]
    nodes = [
        helper.make_node(op, inputs, ["d"], name="/double", domain=domain, **extra),
        helper.make_node("Conv", ["d", "w", "b"], ["c"], name="/conv/Conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="/relu"),
        helper.make_node("Flatten", ["r"], ["f"], name="/flatten", axis=1),
        helper.make_node("Gemm", ["f", "fc"], ["y"], name="/fc/Gemm", transB=1),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])], inits,
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    return helper.make_model(graph, opset_imports=opsets)


def test_placeholders_keep_the_shapes_when_the_operator_has_no_output_type():
    net = df.import_onnx(_custom_then_conv("DoubleChannels", "my.ops"), placeholders=True)
    kinds = {layer.name: type(layer).__name__ for layer in net.layers}
    assert list(kinds.values()).count("Placeholder") == 1
    # After a guess, nodes compute in ONNX's order from the sizes they get (no difffn layer
    # that would freeze the guessed sizes): real layers, not placeholders.
    assert kinds["conv_Conv"] == kinds["fc_Gemm"] == "ONNXOperator"
    (placeholder,) = [lyr for lyr in net.layers if isinstance(lyr, df.layers.Placeholder)]
    with pytest.raises(df.LayerError, match=r"stands for the operation 'DoubleChannels'"):
        net.predict(np.ones((1, 8, 8, 3), np.float32))
    double = df.layers.FunctionLayer(
        lambda x: jnp.concatenate([x, x], axis=-1), name=placeholder.name
    )
    fixed = net.replace_layer(placeholder.name, double)
    x = np.random.default_rng(4).standard_normal((2, 3, 8, 8)).astype(np.float32)
    reference = _custom_then_conv("Concat", "").SerializeToString()
    (expected,) = ort.InferenceSession(reference).run(None, {"x": x})
    y = fixed.predict(np.transpose(x, (0, 2, 3, 1)))
    np.testing.assert_allclose(np.asarray(df.stripdims(y)), expected, rtol=1e-4, atol=1e-5)


def _upsampling_node(source: str, custom: bool, inits: list):
    """The custom ``Upsample2x`` (no output type), or ONNX's own nearest Resize by 2 (the
    reference; its scales join ``inits``), from ``source`` to ``"u"``."""
    if custom:
        return helper.make_node("Upsample2x", [source], ["u"], name="/up", domain="my.ops")
    inits.append(numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"))
    return helper.make_node("Resize", [source, "", "scales"], ["u"], name="/up", mode="nearest")


def _classified(nodes, source: str, inits, custom: bool):
    """The model of ``nodes`` then Relu -> Flatten -> Gemm (``fc``, 5 classes) from ``source``,
    for x (N, 3, 8, 8)."""
    nodes = [
        *nodes,
        helper.make_node("Relu", [source], ["r"], name="/relu"),
        helper.make_node("Flatten", ["r"], ["f"], name="/flatten", axis=1),
        helper.make_node("Gemm", ["f", "fc"], ["y"], name="/fc/Gemm", transB=1),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])], inits,
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid("my.ops", 1)] if custom else [])
    return helper.make_model(graph, opset_imports=opsets)


def _custom_then_flatten(custom: bool):
    """x (N, 3, 8, 8) -> op (8x8 -> 16x16; the custom one has no output type) -> Relu ->
    Flatten -> Gemm (768 -> 5). Nothing before the Gemm says the size: only the replacement.
    ``custom=False``: the op is ONNX's own nearest Resize by 2 (the reference)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(0.05 * rng.standard_normal((5, 768)).astype(np.float32), "fc")]
    return _classified([_upsampling_node("x", custom, inits)], "u", inits, custom)


def _upsample(name):
    """Nearest upsampling by 2 of channels-last images (what Upsample2x stands for)."""
    return df.layers.FunctionLayer(
        lambda x: jnp.repeat(jnp.repeat(x, 2, axis=1), 2, axis=2), name=name
    )


def test_a_placeholder_without_output_type_takes_its_sizes_from_the_replacement():
    model = _custom_then_flatten(custom=True)
    assert not [v for v in model.graph.value_info if v.name == "u"]  # no type for its output
    net = df.import_onnx(model, placeholders=True)
    kinds = {layer.name: type(layer).__name__ for layer in net.layers}
    assert [n for n, k in kinds.items() if k == "Placeholder"] == ["up"]  # the Gemm is a layer
    assert kinds["fc_Gemm"] == "ONNXOperator"
    fixed = net.replace_layer("up", _upsample("up"))
    session = ort.InferenceSession(_custom_then_flatten(custom=False).SerializeToString())
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 3, 8, 8)).astype(np.float32)
        (expected,) = session.run(None, {"x": x})
        y = np.asarray(df.stripdims(fixed.predict(np.transpose(x, (0, 2, 3, 1)))))
        assert y.shape == expected.shape == (batch, 5)
        np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5 * np.abs(expected).max())


def test_a_replacement_whose_output_does_not_fit_names_both_layers_and_the_sizes():
    net = df.import_onnx(_custom_then_flatten(custom=True), placeholders=True)
    same_size = net.replace_layer("up", df.layers.FunctionLayer(lambda x: x, name="up"))
    x = np.ones((2, 8, 8, 3), np.float32)
    with pytest.raises(
        df.ONNXImportError,
        match=r"(?s)layer 'fc_Gemm' \(the imported ONNX Gemm node '/fc/Gemm'\) cannot run on its "
        r"inputs' sizes \[\(2, 192\)\] \(ONNX order\), which follow the output of layer 'up'.*"
        r"Layer 'up' replaced a df\.layers\.Placeholder whose output sizes the ONNX file does not "
        r"give; 'fc_Gemm' was imported for inputs of sizes \(N, 768\) \(input 0 axis 1: 768 "
        r"needed, 192 given\)\. Fix: replace 'up' with a layer whose output gives 'fc_Gemm' those "
        r"sizes \(net\.replace_layer\('up', layer\)",
    ):
        same_size.predict(x)
    assert same_size.replace_layer("up", _upsample("up")).predict(x).shape == (2, 5)


def _skip_connection(custom: bool):
    """x (N, 3, 8, 8) -> MaxPool 2 -> op (4x4 -> 8x8; the custom one has no output type) ->
    Concat with x (a U-Net's skip connection) -> Conv -> Relu -> Flatten -> Gemm."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(0.2 * rng.standard_normal((4, 6, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(0.05 * rng.standard_normal((5, 256)).astype(np.float32), "fc"),
    ]
    nodes = [
        helper.make_node(
            "MaxPool", ["x"], ["p"], name="/pool", kernel_shape=[2, 2], strides=[2, 2]
        ),
        _upsampling_node("p", custom, inits),
        helper.make_node("Concat", ["u", "x"], ["c"], name="/cat", axis=1),
        helper.make_node("Conv", ["c", "w"], ["v"], name="/conv", pads=[1, 1, 1, 1]),
    ]
    return _classified(nodes, "v", inits, custom)


def test_a_skip_connection_after_a_placeholder_takes_the_other_inputs_sizes():
    net = df.import_onnx(_skip_connection(custom=True), placeholders=True)
    kinds = {layer.name: type(layer).__name__ for layer in net.layers}
    assert [n for n, k in kinds.items() if k == "Placeholder"] == ["up"]
    fixed = net.replace_layer("up", _upsample("up"))
    x = np.random.default_rng(5).standard_normal((2, 3, 8, 8)).astype(np.float32)
    reference = _skip_connection(custom=False).SerializeToString()
    (expected,) = ort.InferenceSession(reference).run(None, {"x": x})
    y = np.asarray(df.stripdims(fixed.predict(np.transpose(x, (0, 2, 3, 1)))))
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5 * np.abs(expected).max())
    same_size = net.replace_layer("up", df.layers.FunctionLayer(lambda v: v, name="up"))
    with pytest.raises(
        df.ONNXImportError,
        match=r"(?s)layer 'cat' \(the imported ONNX Concat node '/cat'\) cannot run on its "
        r"inputs' sizes \[\(2, 3, 4, 4\), \(2, 3, 8, 8\)\].*'cat' was imported for inputs of sizes "
        r"\(N, 3, 8, 8\), \(N, 3, 8, 8\) \(input 0 axis 2: 8 needed, 4 given; input 0 axis 3: 8 "
        r"needed, 4 given\)\. Fix: replace 'up' with a layer whose output gives 'cat' those sizes",
    ):
        same_size.predict(np.transpose(x, (0, 2, 3, 1)))


def test_a_network_fixed_by_replacing_its_placeholder_exports_back(tmp_path):
    # issue 25 item 3 for the placeholder path: the ONNXOperators after the guess export too
    net = df.import_onnx(_custom_then_flatten(custom=True), placeholders=True)
    up = df.layers.Resize2D(scale=(2, 2), method="nearest", name="up")
    fixed = net.replace_layer("up", up)
    x = np.random.default_rng(7).standard_normal((3, 8, 8, 3)).astype(np.float32)
    y = np.asarray(df.stripdims(fixed.predict(x)))
    path = tmp_path / "fixed.onnx"
    df.export_onnx(fixed, path)
    session = ort.InferenceSession(str(path))
    (exported,) = session.run(None, {session.get_inputs()[0].name: x})
    reference = ort.InferenceSession(_custom_then_flatten(custom=False).SerializeToString())
    (expected,) = reference.run(None, {"x": np.transpose(x, (0, 3, 1, 2))})
    np.testing.assert_allclose(exported, y, rtol=1e-5, atol=1e-6 * np.abs(y).max())
    np.testing.assert_allclose(exported, expected, rtol=1e-4, atol=1e-5 * np.abs(expected).max())

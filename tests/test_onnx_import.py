"""Tests of df.import_onnx (difffn/_onnx/_import.py, _mapping.py, _load.py, _layers.py).

ONNX Runtime is the judge: each model built with ``onnx.helper`` (tests/onnx_models.py) runs in
ONNX Runtime and, imported, in difffn on the same inputs. NCHW images go in as NHWC
(``"BSSC"``), time-major ONNX sequences as ``"BTC"``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from helpers import run_python
from onnx import TensorProto, helper, numpy_helper
from onnx_models import cnn, encoder_block, model

import difffn as df
from difffn._onnx._layers import NodeFunction, ONNXOperator

L = df.layers


def ort_run(m, **feeds):
    session = ort.InferenceSession(m.SerializeToString())
    return session.run(None, feeds)


def op_types(net):
    return [
        f"fn:{layer.fn.op_type}" if isinstance(getattr(layer, "fn", None), NodeFunction)
        else type(layer).__name__
        for layer in net.layers
    ]  # fmt: skip


# -- models against ONNX Runtime ---------------------------------------------------------------


def test_cnn_maps_to_difffn_layers_with_nhwc_data_and_hwio_weights():
    m = cnn()
    net = df.import_onnx(m)
    assert op_types(net) == [
        "ImageInput", "Conv2D", "BatchNorm", "ReLU", "MaxPool2D", "Flatten", "FullyConnected",
        "Softmax",
    ]  # fmt: skip
    x = np.random.default_rng(1).standard_normal((5, 1, 8, 8)).astype(np.float32)
    (want,) = ort_run(m, input=x)
    got = net.predict(x.transpose(0, 2, 3, 1))  # NCHW -> NHWC
    assert got.format == "BC"
    np.testing.assert_allclose(got.data, want, rtol=1e-5, atol=1e-6)
    weights = numpy_helper.to_array(m.graph.initializer[0])
    np.testing.assert_array_equal(net.layer("conv1_Conv").weights, weights.transpose(2, 3, 1, 0))


def test_initializers_are_trainable_learnables_with_their_onnx_names():
    net = df.import_onnx(cnn())
    table = net.learnables
    assert list(table) == [
        "conv1_Conv/weights", "conv1_Conv/bias", "bn1_BatchNormalization/offset",
        "bn1_BatchNormalization/scale", "fc_Gemm/weights", "fc_Gemm/bias",
    ]  # fmt: skip
    assert list(net.state) == [
        "bn1_BatchNormalization/trained_mean", "bn1_BatchNormalization/trained_variance",
    ]  # fmt: skip
    description = net.layer("conv1_Conv").description
    assert "'conv1.weight' (OIHW -> HWIO)" in description and "'conv1.bias'" in description
    assert "'fc.weight' (transposed, rows reordered" in net.layer("fc_Gemm").description
    x = jnp.ones((2, 8, 8, 1))

    def loss(learnables):
        return jnp.sum(net.replace(learnables=learnables).predict(x).data[:, 0])

    grads = jax.grad(loss)(table)
    assert all(float(jnp.abs(g).sum()) > 0 for g in jax.tree.leaves(grads))


def test_onnx_operator_keeps_initializer_names_and_trains_them():
    # x * scale + shift over NCHW: the constants become the ONNXOperator's learnables,
    # reordered channels-last like the data (the operator runs on stored data directly)
    rng = np.random.default_rng(0)
    scale = rng.standard_normal((3, 1, 1)).astype(np.float32)
    m = model(
        [helper.make_node("Mul", ["x", "scale"], ["m"], name="mul"),
         helper.make_node("Tanh", ["m"], ["y"], name="tanh")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 4, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, 4, 5])],
        [numpy_helper.from_array(scale, "scale")],
    )  # fmt: skip
    net = df.import_onnx(m)
    layer = net.layer("mul")
    assert isinstance(layer, ONNXOperator) and isinstance(layer, L.FunctionLayer)
    assert list(layer.params) == ["scale"] and layer.fn.mode == "native"
    assert layer.params["scale"].shape == (1, 1, 1, 3)  # NCHW (1,3,1,1) stored NHWC
    assert list(net.learnables) == ["mul/params"]
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    (want,) = ort_run(m, x=x)
    got = net.predict(x.transpose(0, 2, 3, 1)).data
    np.testing.assert_allclose(np.transpose(got, (0, 3, 1, 2)), want, rtol=1e-6, atol=1e-6)
    grads = jax.grad(
        lambda t: jnp.sum(net.replace(learnables=t).predict(x.transpose(0, 2, 3, 1)).data)
    )(net.learnables)
    assert grads["mul/params"]["scale"].shape == (1, 1, 1, 3)


def test_transformer_encoder_block_matches_onnx_runtime():
    m = encoder_block()
    net = df.import_onnx(m)
    kinds = op_types(net)
    # attention nodes -> SelfAttention; feed-forward MatMul + Add -> FullyConnected
    assert kinds[:3] == ["SequenceInput", "SelfAttention", "Addition"]
    assert kinds.count("FullyConnected") == 2 and "LayerNorm" in kinds
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 5, 8)).astype(np.float32)
        (want,) = ort_run(m, x=x)
        got = net.predict(x)
        assert got.format == "BTC"
        np.testing.assert_allclose(got.data, want, rtol=1e-4, atol=1e-5)


def test_transformer_gradients_match_finite_differences(x64):
    net = df.import_onnx(encoder_block())
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 5, 8)))
    table = net.learnables.map(lambda v: jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), v))

    def loss(t):
        return jnp.sum(jnp.sin(net.replace(learnables=t).predict(x).data))

    grads = jax.grad(loss)(table)
    leaves, tree = jax.tree.flatten(table)
    step = 1e-6
    for which in (0, len(leaves) - 1):  # a FullyConnected weight and a LayerNormalization bias
        direction = jax.random.normal(jax.random.key(which), leaves[which].shape, jnp.float64)

        def shifted(sign, which=which, direction=direction):
            moved = list(leaves)
            moved[which] = moved[which] + sign * step * direction
            return loss(jax.tree.unflatten(tree, moved))

        numeric = (shifted(1) - shifted(-1)) / (2 * step)
        analytic = jnp.sum(jax.tree.leaves(grads)[which] * direction)
        np.testing.assert_allclose(analytic, numeric, rtol=1e-6)


def test_pytorch_style_flatten_with_shape_computation_keeps_the_batch_variable():
    # x.view(x.size(0), -1) after a convolution: Shape -> Gather -> Unsqueeze -> Concat ->
    # Reshape, evaluated while tracing; the Reshape of channels-last data keeps ONNX's order
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 2, 3, 3)).astype(np.float32), "w")
    fc = numpy_helper.from_array(rng.standard_normal((4 * 36, 3)).astype(np.float32), "fc")
    consts = [
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
        numpy_helper.from_array(np.array([0], np.int64), "axis0"),
        numpy_helper.from_array(np.array([-1], np.int64), "minus_one"),
    ]
    m = model(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
            helper.make_node("Shape", ["c"], ["shape"], name="shape"),
            helper.make_node("Gather", ["shape", "zero"], ["batch"], axis=0, name="gather"),
            helper.make_node("Unsqueeze", ["batch", "axis0"], ["batch1"], name="unsqueeze"),
            helper.make_node("Concat", ["batch1", "minus_one"], ["target"], axis=0),
            helper.make_node("Reshape", ["c", "target"], ["flat"], name="view"),
            helper.make_node("MatMul", ["flat", "fc"], ["y"], name="fc"),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        [w, fc, *consts],
    )
    net = df.import_onnx(m)
    assert op_types(net)[:2] == ["ImageInput", "Conv2D"]
    for batch in (1, 4):
        x = rng.standard_normal((batch, 2, 8, 8)).astype(np.float32)
        (want,) = ort_run(m, x=x)
        np.testing.assert_allclose(
            net.predict(x.transpose(0, 2, 3, 1)).data, want, rtol=1e-5, atol=1e-5
        )


def test_a_reshape_that_spells_the_files_batch_size_keeps_the_batch_variable():
    m = model(
        [helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 12])],
        [numpy_helper.from_array(np.array([1, 12], np.int64), "shape")],
    )
    net = df.import_onnx(m)
    x = np.arange(48, dtype=np.float32).reshape(4, 3, 2, 2)
    got = net.predict(x.transpose(0, 2, 3, 1))  # four images though the file says one
    np.testing.assert_array_equal(got.data, x.reshape(4, 12))


# -- inputs and their formats -------------------------------------------------------------------


def test_input_formats_and_shapes_can_be_given():
    m = model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "L"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, "L"])],
        [],
    )
    with pytest.raises(
        df.ONNXImportError,
        match=r"input 'x' has a symbolic size 'L' on axis 2 \(label 'C' of 'BTC', ONNX order\).*"
        r"input_shapes=\{'x': \(None, \.\.\., <size>\)\}",
    ):
        df.import_onnx(m)
    net = df.import_onnx(m, input_shapes={"x": (None, 3, 16)}, input_formats={"x": "BCS"})
    assert net.input_names == ("x",) and net.layers[0].input_format == "BSC"
    assert isinstance(net.layers[0], df.InputLayer)  # an input layer, named like one
    x = np.random.default_rng(0).standard_normal((2, 16, 3)).astype(np.float32)
    np.testing.assert_array_equal(net.predict(x).data, np.maximum(x, 0))
    with pytest.raises(df.ONNXImportError, match=r"input_formats\['x'\] is 'BCX'; expected 3"):
        df.import_onnx(m, input_formats={"x": "BCX"}, input_shapes={"x": (None, 3, 16)})
    with pytest.raises(df.ONNXImportError, match=r"name \['z'\], which are not inputs"):
        df.import_onnx(m, input_shapes={"z": (1,)})


# -- bad input ---------------------------------------------------------------------------------


def test_truncated_and_non_onnx_files_are_named_errors(tmp_path):
    data = cnn().SerializeToString()
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(df.ONNXImportError, match=r"not an ONNX model, or it is truncated"):
        df.import_onnx(truncated)
    text = tmp_path / "notes.onnx"
    text.write_text("these are notes, not a model\n")
    with pytest.raises(df.ONNXImportError, match=r"is not an ONNX model"):
        df.import_onnx(text)
    with pytest.raises(df.ONNXImportError, match=r"no ONNX file at"):
        df.import_onnx(tmp_path / "missing.onnx")
    with pytest.raises(df.ONNXImportError, match=r"takes a file path, bytes or an onnx.ModelProto"):
        df.import_onnx(42)


def test_checker_failures_and_old_opsets_are_named_errors(monkeypatch):
    bad = cnn()
    bad.graph.node[0].input[1] = "no_such_weight"
    with pytest.raises(df.ONNXImportError, match=r"not valid ONNX \(onnx.checker says"):
        df.import_onnx(bad)
    old = model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        [],
        opset=8,
    )
    net = df.import_onnx(old)  # converted by onnx.version_converter
    assert "opset 8 was converted to opset 13" in net.layers[0].description
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(np.asarray(df.stripdims(net.predict(x))), np.maximum(x, 0))
    from onnx import version_converter

    def refuse(model, version):
        raise RuntimeError("no adapter for Relu")

    monkeypatch.setattr(version_converter, "convert_version", refuse)
    with pytest.raises(
        df.ONNXImportError,
        match=r"opset 8; difffn reads opset 9 or newer and converts older ones with "
        r"onnx.version_converter, which failed.*RuntimeError: no adapter for Relu.*Fix: export",
    ):
        df.import_onnx(old)


def test_missing_external_data_is_a_named_error(tmp_path):
    m = cnn(filters=64)  # big enough tensors to go to the data file
    path = tmp_path / "model.onnx"
    onnx.save_model(m, path, save_as_external_data=True, location="model.data",
                    size_threshold=1024)  # fmt: skip
    net = df.import_onnx(path)  # with its data: fine
    assert net.layer("fc_Gemm").weights.shape == (64 * 16, 10)
    (tmp_path / "model.data").unlink()
    with pytest.raises(
        df.ONNXImportError, match=r"tensor\(s\) in external data files that are not in .*"
        r"'fc.weight' in 'model.data'.*Fix: copy the data file"
    ):  # fmt: skip
        df.import_onnx(path)
    with pytest.raises(df.ONNXImportError, match=r"given as bytes or a ModelProto has no folder"):
        df.import_onnx(onnx.load(path, load_external_data=False))


def test_unknown_operators_are_listed_in_one_error():
    m = model(
        [
            helper.make_node("Relu", ["x"], ["a"], name="relu"),
            helper.make_node("FancyNorm", ["a"], ["b"], name="fancy", domain="com.example"),
            helper.make_node("Bernoulli", ["b"], ["c"], name="bernoulli"),
            helper.make_node("Sigmoid", ["c"], ["y"], name="sigmoid"),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, 4, 4])],
        [],
    )
    m.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(df.ONNXImportError) as info:
        df.import_onnx(m)
    message = str(info.value)
    assert "2 problem(s)" in message
    assert "node 'fancy' (FancyNorm, domain 'com.example'): operators outside" in message
    assert "node 'bernoulli' (Bernoulli): difffn has no implementation of this operator" in message
    assert "placeholders=True" in message


def test_placeholders_stand_in_until_replaced():
    m = model(
        [
            helper.make_node("Relu", ["x"], ["a"], name="relu"),
            helper.make_node("Swizzle", ["a"], ["b"], name="swizzle", domain="com.example",
                             mode="fast"),
            helper.make_node("Neg", ["b"], ["y"], name="neg"),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])],
        [],
    )  # fmt: skip
    m.opset_import.append(helper.make_opsetid("com.example", 1))
    net = df.import_onnx(m, placeholders=True)
    placeholder = net.layer("swizzle")
    assert isinstance(placeholder, L.Placeholder)
    assert (placeholder.op_type, placeholder.attributes) == ("Swizzle", (("mode", "fast"),))
    assert placeholder.input_formats == ("BC",) and placeholder.output_formats == ("BC",)
    x = np.array([[-1.0, 2.0, -3.0, 4.0, 5.0]], np.float32)
    with pytest.raises(df.LayerError, match=r"Placeholder \(layer 'swizzle'\) stands for the "
                       r"operation 'Swizzle'.*net.replace_layer\('swizzle', layer\)"):  # fmt: skip
        net.predict(x)
    fixed = net.replace_layer("swizzle", L.FunctionLayer(lambda v: v[:, ::-1], name="swizzle"))
    np.testing.assert_array_equal(fixed.predict(x).data, -np.maximum(x, 0)[:, ::-1])


def test_outputs_that_are_constants_are_refused():
    m = model(
        [helper.make_node("Constant", [], ["y"], value=numpy_helper.from_array(np.ones(2, np.float32)))],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [],
    )  # fmt: skip
    with pytest.raises(df.ONNXImportError, match=r"output 'y' does not depend on the model inputs"):
        df.import_onnx(m)


def test_importing_difffn_does_not_import_onnx():
    result = run_python("import sys, difffn; print('onnx' in sys.modules)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_without_onnx_the_error_says_which_extra_to_install():
    code = (
        "import sys; sys.modules['onnx'] = None\n"
        "import difffn as df\n"
        "try:\n    df.import_onnx('model.onnx')\n"
        "except df.MissingDependencyError as error:\n    print(error)\n"
    )
    result = run_python(code)
    assert "needs the onnx package, which is not installed" in result.stdout
    assert "pip install difffn[onnx]" in result.stdout

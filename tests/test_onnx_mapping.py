"""Tests of the mapping of ONNX nodes to difffn layers (difffn/_onnx/_mapping*.py).

Each model is built with ``onnx.helper`` and run in ONNX Runtime (the judge) and, imported, in
difffn on the same inputs; the tests also check which difffn layer each node became. ONNX's
time-major sequences ``(T, N, C)`` go into difffn batch first (``"BTC"``).
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_models import lstm, model

import difffn as df
from difffn._onnx._layers import NodeFunction

L = df.layers


def ort_run(m, **feeds):
    return ort.InferenceSession(m.SerializeToString()).run(None, feeds)


def op_types(net):
    return [
        f"fn:{layer.fn.op_type}" if isinstance(getattr(layer, "fn", None), NodeFunction)
        else type(layer).__name__
        for layer in net.layers
    ]  # fmt: skip


def tensor(rng, name, shape, scale=0.5):
    return numpy_helper.from_array((scale * rng.standard_normal(shape)).astype(np.float32), name)


def rnn_model(op, rng, *, hidden=4, features=3, steps=5, directions=1, outputs=("Y",),
              bias=True, initial=False, **attributes):  # fmt: skip
    """One ONNX LSTM or GRU node on (T, N, C) input, with the given outputs used."""
    gates = {"LSTM": 4, "GRU": 3}[op]
    inits = [
        tensor(rng, "W", (directions, gates * hidden, features)),
        tensor(rng, "R", (directions, gates * hidden, hidden)),
    ]
    names = ["X", "W", "R"]
    if bias:
        inits.append(tensor(rng, "B", (directions, 2 * gates * hidden), 0.3))
    if initial:  # inputs 3 (B), 4 (sequence_lens), 5 (initial_h), 6 (initial_c)
        names += ["B" if bias else "", "", "initial_h"] + (["initial_c"] if op == "LSTM" else [])
        for name in names[5:]:
            inits.append(tensor(rng, name, (directions, 1, hidden)))
    elif bias:
        names.append("B")
    shapes = {"Y": [steps, directions, "N", hidden], "Y_h": [directions, "N", hidden]}
    node_outputs = [name if name in outputs else "" for name in ("Y", "Y_h")]
    node = helper.make_node(op, names, node_outputs, name=f"/{op.lower()}/{op}",
                            hidden_size=hidden, **attributes)  # fmt: skip
    return model(
        [node],
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [steps, "N", features])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shapes[n]) for n in outputs],
        inits,
        opset=14,
    )


def check_against_onnx_runtime(m, net, x, outputs):
    """difffn's outputs, moved to ONNX's axis order, equal ONNX Runtime's. ONNX Runtime runs
    each sequence alone (its initial states have batch size 1, which it does not broadcast)."""
    runs = [ort_run(m, X=x[:, i : i + 1]) for i in range(x.shape[1])]
    gots = net.predict(x.transpose(1, 0, 2))
    gots = gots if isinstance(gots, tuple) else (gots,)
    for k, (got, name) in enumerate(zip(gots, outputs)):
        want = np.concatenate([run[k] for run in runs], axis=BATCH_AXIS[name])
        np.testing.assert_allclose(got.data.transpose(AXES[name]), want, rtol=1e-5, atol=1e-5)


# stored (N, T, D, H) -> ONNX Y (T, D, N, H); stored (N, D, H) -> ONNX Y_h (D, N, H)
AXES = {"Y": (1, 2, 0, 3), "Y_h": (1, 0, 2)}
BATCH_AXIS = {"Y": 2, "Y_h": 1}


@pytest.mark.parametrize("last", [False, True])
def test_lstm_maps_to_difffn_lstm_with_gates_reordered(last):
    m = lstm(last=last)
    net = df.import_onnx(m)
    kinds = op_types(net)
    assert kinds[:2] == ["SequenceInput", "LSTM"] and "FullyConnected" in kinds
    assert net.layers[1].output_mode == ("last" if last else "sequence")
    x = np.random.default_rng(2).standard_normal((6, 3, 3)).astype(np.float32)  # T, N, C
    (want,) = ort_run(m, X=x)
    got = net.predict(x.transpose(1, 0, 2)).data  # difffn takes BTC
    want = want if last else want.transpose(1, 0, 2)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("output", ["Y", "Y_h"])
def test_bidirectional_lstm_maps_to_bilstm(output):
    rng = np.random.default_rng(0)
    m = rnn_model("LSTM", rng, directions=2, outputs=(output,), initial=True,
                  direction="bidirectional")  # fmt: skip
    net = df.import_onnx(m)
    assert op_types(net) == ["SequenceInput", "BiLSTM", "fn:Reshape"]
    layer = net.layers[1]
    assert layer.output_mode == ("sequence" if output == "Y" else "last")
    assert layer.input_weights.shape == (3, 32) and layer.hidden_state.shape == (1, 8)
    x = rng.standard_normal((5, 2, 3)).astype(np.float32)
    check_against_onnx_runtime(m, net, x, [output])


@pytest.mark.parametrize(
    ("linear_before_reset", "recurrent_bias", "mode"),
    [
        (0, True, "before-multiplication"),
        (1, False, "after-multiplication"),
        (1, True, "recurrent-bias-after-multiplication"),
    ],
)
@pytest.mark.parametrize("output", ["Y", "Y_h"])
def test_gru_maps_to_difffn_gru(linear_before_reset, recurrent_bias, mode, output):
    rng = np.random.default_rng(1)
    m = rnn_model("GRU", rng, outputs=(output,), initial=True,
                  linear_before_reset=linear_before_reset)  # fmt: skip
    if not recurrent_bias:  # PyTorch-like W biases with zero R biases
        bias = next(t for t in m.graph.initializer if t.name == "B")
        values = numpy_helper.to_array(bias).copy()
        values[:, 12:] = 0
        bias.CopyFrom(numpy_helper.from_array(values, "B"))
    net = df.import_onnx(m)
    assert op_types(net) == ["SequenceInput", "GRU", "fn:Reshape"]
    assert net.layers[1].reset_gate_mode == mode
    x = rng.standard_normal((5, 3, 3)).astype(np.float32)
    check_against_onnx_runtime(m, net, x, [output])


@pytest.mark.parametrize(
    ("op", "attributes", "outputs"),
    [
        ("LSTM", {"direction": "reverse"}, ("Y",)),
        ("LSTM", {"input_forget": 1}, ("Y",)),
        ("LSTM", {"clip": 0.5}, ("Y",)),
        ("LSTM", {}, ("Y", "Y_h")),
        ("GRU", {"direction": "bidirectional"}, ("Y",)),
        ("GRU", {"activations": ["Sigmoid", "Relu"]}, ("Y_h",)),
    ],
    ids=["reverse", "input_forget", "clip", "both_outputs", "bidirectional_gru", "relu_gru"],
)
def test_other_rnns_run_as_onnx_operators(op, attributes, outputs):
    rng = np.random.default_rng(0)
    directions = 2 if attributes.get("direction") == "bidirectional" else 1
    m = rnn_model(op, rng, directions=directions, outputs=outputs, **attributes)
    net = df.import_onnx(m)
    assert f"fn:{op}" in op_types(net)
    x = rng.standard_normal((5, 2, 3)).astype(np.float32)
    check_against_onnx_runtime(m, net, x, outputs)


def test_gather_of_a_constant_table_maps_to_embedding():
    table = np.random.default_rng(0).standard_normal((10, 4)).astype(np.float32)
    m = model(
        [helper.make_node("Gather", ["embedding", "ids"], ["y"], axis=0, name="embed")],
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 6, 4])],
        [numpy_helper.from_array(table, "embedding")],
    )
    net = df.import_onnx(m)
    layer = net.layer("embed")
    assert isinstance(layer, L.Embedding) and (layer.num_words, layer.dimension) == (10, 4)
    assert "weights = 'embedding'" in layer.description
    assert list(net.learnables) == ["embed/weights"]  # trainable
    ids = np.array([[1, 2, 3, 4, 5, 9], [0, 0, 1, 1, 2, 7]], np.int64)
    (want,) = ort_run(m, ids=ids)
    got = net.predict(ids.astype(np.int32))
    assert got.format == "BTC"
    np.testing.assert_array_equal(got.data, want)


def test_a_transpose_to_channels_last_is_only_a_relabelling():
    # NCHW -> NHWC, then Flatten: the data is stored NHWC already, so neither needs a
    # FunctionLayer (what df.export_onnx writes, and TensorFlow-born models do)
    rng = np.random.default_rng(0)
    m = model(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
            helper.make_node("Transpose", ["c"], ["t"], perm=[0, 2, 3, 1], name="nhwc"),
            helper.make_node("Flatten", ["t"], ["f"], axis=1, name="flatten"),
            helper.make_node("Gemm", ["f", "fc"], ["y"], name="fc"),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        [tensor(rng, "w", (5, 2, 3, 3)), tensor(rng, "fc", (80, 3))],
    )
    net = df.import_onnx(m)
    assert op_types(net) == ["ImageInput", "Conv2D", "Flatten", "FullyConnected"]
    x = rng.standard_normal((2, 2, 4, 4)).astype(np.float32)
    (want,) = ort_run(m, x=x)
    got = net.predict(x.transpose(0, 2, 3, 1))
    np.testing.assert_allclose(got.data, want, rtol=1e-5, atol=1e-5)


def attention_model(rng, *, scale="Div", keys="one", biases=True, scale_value=None, width=8,
                    heads=2, steps=5, extra_output=False):  # fmt: skip
    """Multi-head self-attention written out in nodes (batch first), in exporters' variants."""
    head = width // heads
    inits = [tensor(rng, f"{n}.weight", (width, width)) for n in "qkvo"]
    inits += [numpy_helper.from_array(np.array([0, 0, heads, head], np.int64), "heads_shape"),
              numpy_helper.from_array(np.array([0, 0, width], np.int64), "model_shape")]  # fmt: skip
    value = scale_value or (np.sqrt(head) if scale == "Div" else 1 / np.sqrt(head))
    inits.append(numpy_helper.from_array(np.array(value, np.float32), "scale"))
    nodes = []
    for n in "qkv":
        projected = f"{n}0"
        nodes.append(helper.make_node("MatMul", ["x", f"{n}.weight"], [projected]))
        if biases:
            inits.append(tensor(rng, f"{n}.bias", (width,), 0.1))
            nodes.append(helper.make_node("Add", [f"{n}.bias", projected], [f"{n}1"]))
            projected = f"{n}1"
        nodes.append(helper.make_node("Reshape", [projected, "heads_shape"], [f"{n}2"]))
    nodes.append(helper.make_node("Transpose", ["q2"], ["q3"], perm=[0, 2, 1, 3]))
    nodes.append(helper.make_node("Transpose", ["v2"], ["v3"], perm=[0, 2, 1, 3]))
    if keys == "one":
        nodes.append(helper.make_node("Transpose", ["k2"], ["k3"], perm=[0, 2, 3, 1]))
    else:
        nodes.append(helper.make_node("Transpose", ["k2"], ["kh"], perm=[0, 2, 1, 3]))
        nodes.append(helper.make_node("Transpose", ["kh"], ["k3"], perm=[0, 1, 3, 2]))
    nodes += [
        helper.make_node("MatMul", ["q3", "k3"], ["s0"]),
        helper.make_node(scale, ["s0", "scale"], ["s1"]),
        helper.make_node("Softmax", ["s1"], ["s2"], axis=-1, name="/attn/Softmax"),
        helper.make_node("MatMul", ["s2", "v3"], ["c0"]),
        helper.make_node("Transpose", ["c0"], ["c1"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["c1", "model_shape"], ["c2"]),
        helper.make_node("MatMul", ["c2", "o.weight"], ["y"]),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", steps, width])]
    if extra_output:  # the attention weights are a model output too
        outputs.append(
            helper.make_tensor_value_info("s2", TensorProto.FLOAT, ["N", heads, steps, steps])
        )
    return model(
        nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", steps, width])],
        outputs, inits,
    )  # fmt: skip


@pytest.mark.parametrize(
    "variant",
    [{}, {"scale": "Mul", "keys": "two"}, {"biases": False}],
    ids=["div_scale", "mul_scale_two_transposes", "no_biases"],
)
def test_self_attention_subgraphs_map_to_self_attention(variant):
    rng = np.random.default_rng(0)
    m = attention_model(rng, **variant)
    net = df.import_onnx(m)
    assert op_types(net) == ["SequenceInput", "SelfAttention"]
    layer = net.layers[1]
    assert (layer.num_heads, layer.num_key_channels, layer.output_size) == (2, 8, 8)
    assert "query_weights = 'q.weight'" in layer.description
    x = rng.standard_normal((3, 5, 8)).astype(np.float32)
    (want,) = ort_run(m, x=x)
    np.testing.assert_allclose(net.predict(x).data, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "variant",
    [{"scale_value": 3.0}, {"extra_output": True}],
    ids=["another_scale", "inner_tensor_is_an_output"],
)
def test_attention_subgraphs_that_differ_import_node_by_node(variant):
    rng = np.random.default_rng(0)
    m = attention_model(rng, **variant)
    net = df.import_onnx(m)
    kinds = op_types(net)
    assert "SelfAttention" not in kinds and "Softmax" in kinds
    x = rng.standard_normal((3, 5, 8)).astype(np.float32)
    wants = ort_run(m, x=x)
    gots = net.predict(x)
    gots = gots if isinstance(gots, tuple) else (gots,)
    np.testing.assert_allclose(gots[0].data, wants[0], rtol=1e-5, atol=1e-5)


def test_self_attention_over_another_axis_runs_as_the_fused_operator():
    # the same subgraph over a spatial axis ("BSC"): difffn's layer is not used, the fused
    # operator computes the same thing in ONNX's order
    rng = np.random.default_rng(0)
    m = attention_model(rng)
    net = df.import_onnx(m, input_formats={"x": "BSC"})
    assert op_types(net) == ["ONNXInput", "fn:SelfAttention"]
    wanted = [f"{n}.{p}" for n in "qkv" for p in ("weight", "bias")] + ["o.weight"]
    assert sorted(net.layers[1].params) == sorted(wanted)  # trainable, by their ONNX names
    x = rng.standard_normal((3, 5, 8)).astype(np.float32)
    (want,) = ort_run(m, x=x)
    np.testing.assert_allclose(net.predict(x).data, want, rtol=1e-5, atol=1e-5)

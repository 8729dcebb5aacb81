"""ONNX models built with ``onnx.helper`` for the ONNX tests and the example (no downloads).

They stand in for what MATLAB's ``exportONNXNetwork`` and PyTorch's ``torch.onnx.export`` write:
NCHW images, a symbolic batch ``N``, weights as named initializers.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper


def _init(rng, name, shape, scale=None):
    scale = (
        np.sqrt(1.0 / max(int(np.prod(shape[1:])) if len(shape) > 1 else 1, 1))
        if scale is None
        else scale
    )
    return numpy_helper.from_array((scale * rng.standard_normal(shape)).astype(np.float32), name)


def model(nodes, inputs, outputs, initializers, opset=17, name="graph"):
    graph = helper.make_graph(nodes, name, inputs, outputs, initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def cnn(seed=0, *, channels=1, size=8, classes=10, filters=8, opset=13):
    """Conv -> BatchNormalization -> Relu -> MaxPool -> Flatten -> Gemm -> Softmax, NCHW."""
    rng = np.random.default_rng(seed)
    half = size // 2
    inits = [
        _init(rng, "conv1.weight", (filters, channels, 3, 3)),
        _init(rng, "conv1.bias", (filters,), 0.1),
        numpy_helper.from_array(
            (1 + 0.1 * rng.standard_normal(filters)).astype(np.float32), "bn1.weight"
        ),
        _init(rng, "bn1.bias", (filters,), 0.1),
        _init(rng, "bn1.running_mean", (filters,), 0.1),
        numpy_helper.from_array(
            rng.uniform(0.5, 1.5, filters).astype(np.float32), "bn1.running_var"
        ),
        _init(rng, "fc.weight", (classes, filters * half * half)),
        _init(rng, "fc.bias", (classes,), 0.1),
    ]
    nodes = [
        helper.make_node("Conv", ["input", "conv1.weight", "conv1.bias"], ["c1"],
                         name="/conv1/Conv", pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
        helper.make_node("BatchNormalization",
                         ["c1", "bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var"],
                         ["b1"], name="/bn1/BatchNormalization", epsilon=1e-5),
        helper.make_node("Relu", ["b1"], ["r1"], name="/relu/Relu"),
        helper.make_node("MaxPool", ["r1"], ["p1"], name="/pool/MaxPool",
                         kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p1"], ["f1"], name="/Flatten", axis=1),
        helper.make_node("Gemm", ["f1", "fc.weight", "fc.bias"], ["logits"], name="/fc/Gemm",
                         transB=1),
        helper.make_node("Softmax", ["logits"], ["output"], name="/Softmax", axis=1),
    ]  # fmt: skip
    return model(
        nodes,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", channels, size, size])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", classes])],
        inits,
        opset=opset,
        name="cnn",
    )


def encoder_block(seed=0, *, steps=5, width=8, heads=2, hidden=16):
    """A transformer encoder block: multi-head self-attention written with MatMul, Add,
    Reshape, Transpose, Div and Softmax, then residual + LayerNormalization, and a ReLU
    feed-forward network with residual + LayerNormalization (post-LN, batch first)."""
    rng = np.random.default_rng(seed)
    head = width // heads
    inits = [_init(rng, f"attn.{n}.weight", (width, width)) for n in ("q", "k", "v", "out")] + [
        _init(rng, f"attn.{n}.bias", (width,), 0.1) for n in ("q", "k", "v", "out")
    ]
    inits += [
        _init(rng, "ffn.1.weight", (width, hidden)),
        _init(rng, "ffn.1.bias", (hidden,), 0.1),
        _init(rng, "ffn.2.weight", (hidden, width)),
        _init(rng, "ffn.2.bias", (width,), 0.1),
        numpy_helper.from_array((1 + 0.1 * rng.standard_normal(width)).astype(np.float32), "ln1.weight"),
        _init(rng, "ln1.bias", (width,), 0.1),
        numpy_helper.from_array((1 + 0.1 * rng.standard_normal(width)).astype(np.float32), "ln2.weight"),
        _init(rng, "ln2.bias", (width,), 0.1),
        numpy_helper.from_array(np.array([0, 0, heads, head], np.int64), "heads_shape"),
        numpy_helper.from_array(np.array([0, 0, width], np.int64), "model_shape"),
        numpy_helper.from_array(np.array(np.sqrt(head), np.float32), "scale"),
    ]  # fmt: skip
    nodes = []
    for n in ("q", "k", "v"):
        nodes += [
            helper.make_node("MatMul", ["x", f"attn.{n}.weight"], [f"{n}0"], name=f"/attn/{n}/MatMul"),
            helper.make_node("Add", [f"{n}0", f"attn.{n}.bias"], [f"{n}1"], name=f"/attn/{n}/Add"),
            helper.make_node("Reshape", [f"{n}1", "heads_shape"], [f"{n}2"], name=f"/attn/{n}/Reshape"),
        ]  # fmt: skip
    nodes += [
        helper.make_node("Transpose", ["q2"], ["q3"], perm=[0, 2, 1, 3], name="/attn/q/Transpose"),
        helper.make_node("Transpose", ["k2"], ["k3"], perm=[0, 2, 3, 1], name="/attn/k/Transpose"),
        helper.make_node("Transpose", ["v2"], ["v3"], perm=[0, 2, 1, 3], name="/attn/v/Transpose"),
        helper.make_node("MatMul", ["q3", "k3"], ["s0"], name="/attn/scores/MatMul"),
        helper.make_node("Div", ["s0", "scale"], ["s1"], name="/attn/scores/Div"),
        helper.make_node("Softmax", ["s1"], ["s2"], axis=-1, name="/attn/Softmax"),
        helper.make_node("MatMul", ["s2", "v3"], ["c0"], name="/attn/context/MatMul"),
        helper.make_node("Transpose", ["c0"], ["c1"], perm=[0, 2, 1, 3], name="/attn/context/Transpose"),
        helper.make_node("Reshape", ["c1", "model_shape"], ["c2"], name="/attn/context/Reshape"),
        helper.make_node("MatMul", ["c2", "attn.out.weight"], ["o0"], name="/attn/out/MatMul"),
        helper.make_node("Add", ["o0", "attn.out.bias"], ["o1"], name="/attn/out/Add"),
        helper.make_node("Add", ["x", "o1"], ["r1"], name="/residual1/Add"),
        helper.make_node("LayerNormalization", ["r1", "ln1.weight", "ln1.bias"], ["h1"],
                         axis=-1, epsilon=1e-5, name="/ln1/LayerNormalization"),
        helper.make_node("MatMul", ["h1", "ffn.1.weight"], ["f0"], name="/ffn/1/MatMul"),
        helper.make_node("Add", ["f0", "ffn.1.bias"], ["f1"], name="/ffn/1/Add"),
        helper.make_node("Relu", ["f1"], ["f2"], name="/ffn/Relu"),
        helper.make_node("MatMul", ["f2", "ffn.2.weight"], ["f3"], name="/ffn/2/MatMul"),
        helper.make_node("Add", ["f3", "ffn.2.bias"], ["f4"], name="/ffn/2/Add"),
        helper.make_node("Add", ["h1", "f4"], ["r2"], name="/residual2/Add"),
        helper.make_node("LayerNormalization", ["r2", "ln2.weight", "ln2.bias"], ["y"],
                         axis=-1, epsilon=1e-5, name="/ln2/LayerNormalization"),
    ]  # fmt: skip
    return model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", steps, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", steps, width])],
        inits,
        name="encoder",
    )


def lstm(seed=0, *, steps=6, features=3, hidden=4, outputs=2, last=False):
    """ONNX LSTM (gates i, o, f, c; time-major X) -> Squeeze of the direction axis -> MatMul +
    Add; ``last=True`` uses Y_h (the last hidden state) instead of the sequence Y."""
    rng = np.random.default_rng(seed)
    inits = [
        _init(rng, "lstm.W", (1, 4 * hidden, features), 0.5),
        _init(rng, "lstm.R", (1, 4 * hidden, hidden), 0.5),
        _init(rng, "lstm.B", (1, 8 * hidden), 0.3),
        _init(rng, "fc.weight", (hidden, outputs)),
        _init(rng, "fc.bias", (outputs,), 0.1),
        numpy_helper.from_array(np.array([0 if last else 1], np.int64), "direction_axis"),
    ]
    y = "" if last else "Y"
    y_h = "Y_h" if last else ""
    nodes = [
        helper.make_node("LSTM", ["X", "lstm.W", "lstm.R", "lstm.B"], [y, y_h], name="/lstm/LSTM",
                         hidden_size=hidden),
        helper.make_node("Squeeze", [y or y_h, "direction_axis"], ["s"], name="/lstm/Squeeze"),
        helper.make_node("MatMul", ["s", "fc.weight"], ["m"], name="/fc/MatMul"),
        helper.make_node("Add", ["m", "fc.bias"], ["out"], name="/fc/Add"),
    ]  # fmt: skip
    out_shape = ["N", outputs] if last else [steps, "N", outputs]
    return model(
        nodes,
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [steps, "N", features])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, out_shape)],
        inits,
        opset=14,
        name="lstm",
    )

"""Tests of the mapping of ONNX nodes to difffn's CNN layers (difffn/_onnx/_mapping_cnn.py) and
of ``Resize`` (difffn/_onnx/_ops_resize.py).

Each model is one or two nodes built with ``onnx.helper``; ONNX Runtime is the judge of the
outputs, and each test checks which difffn layer the node became and that its learnables come
from the node's initializers (named in the layer description). Nodes whose attributes a layer
does not compute exactly stay ONNX operators, and still match ONNX Runtime.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_models import model

import difffn as df
from difffn._onnx import _labels
from difffn._onnx._import import import_model
from difffn._onnx._layers import NodeFunction

L = df.layers
F = TensorProto.FLOAT


def kind(layer) -> str:
    fn = getattr(layer, "fn", None)
    return f"fn:{fn.op_type}" if isinstance(fn, NodeFunction) else type(layer).__name__


def weights(rng, shapes):
    return {name: (0.5 * rng.standard_normal(shape)).astype(np.float32)
            for name, shape in shapes.items()}  # fmt: skip


def one_node(op, x_shape, out_rank, *, params=None, consts=None, opset=17, inputs=None,
             **attributes):  # fmt: skip
    """``op`` on the input ``x`` (``x_shape``, batch ``N``) and the initializers ``params``
    (learnable) and ``consts`` (e.g. scales), in that order unless ``inputs`` says."""
    params, consts = params or {}, consts or {}
    names = inputs or ["x", *params, *consts]
    inits = [numpy_helper.from_array(v, k) for k, v in {**params, **consts}.items()]
    return model(
        [helper.make_node(op, names, ["y"], name="node", **attributes)],
        [helper.make_tensor_value_info("x", F, ["N", *x_shape])],
        [helper.make_tensor_value_info("y", F, [None] * out_rank)],
        inits,
        opset=opset,
    )


def compare(m, layer_kind, *, params=(), x_shape, seed=0):
    """Import ``m``; the node is a ``layer_kind`` holding ``params`` (``(field, ONNX name)``;
    None: not checked); outputs equal ONNX Runtime's on the same data (difffn's in
    channels-last storage order)."""
    result = import_model(m)
    net = result.network
    layer = net.layer("node")
    assert kind(layer) == layer_kind, [kind(x) for x in net.layers]
    if params is not None:
        assert sorted(net.learnables) == sorted(f"node/{field}" for field, _ in params)
        for field, source in params:
            assert f"{field} = {source!r}" in layer.description
    x = np.random.default_rng(seed).standard_normal((2, *x_shape)).astype(np.float32)
    (want,) = ort.InferenceSession(m.SerializeToString()).run(None, {"x": x})
    got = net.predict(_labels.to_storage(x, result.input_labels["x"]))
    got = _labels.to_onnx(np.asarray(got.data), result.output_labels["y"])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    return layer


def test_conv_transpose_maps_to_transposed_conv2d_with_pads_as_cropping():
    p = weights(np.random.default_rng(0), {"W": (3, 2, 3, 3), "B": (2,)})
    m = one_node("ConvTranspose", (3, 4, 4), 4, params=p, strides=[2, 2], pads=[1, 0, 0, 1])
    layer = compare(m, "TransposedConv2D", params=[("weights", "W"), ("bias", "B")],
                    x_shape=(3, 4, 4))  # fmt: skip
    assert layer.cropping == ((1, 0), (0, 1)) and layer.weights.shape == (3, 3, 2, 3)


@pytest.mark.parametrize(
    "w_shape, x_shape, attributes, layer_kind",
    [
        ((4, 2, 3), (2, 7), dict(pads=[1, 2], strides=[2]), "Conv1D"),
        ((3, 2, 3, 2, 3), (2, 4, 4, 5), dict(pads=[1, 0, 1, 1, 0, 1], dilations=[1, 1, 2]),
         "Conv3D"),
    ],
)  # fmt: skip
def test_conv_with_one_or_three_spatial_axes(w_shape, x_shape, attributes, layer_kind):
    p = weights(np.random.default_rng(1), {"W": w_shape, "B": w_shape[:1]})
    m = one_node("Conv", x_shape, len(w_shape), params=p, **attributes)
    compare(m, layer_kind, params=[("weights", "W"), ("bias", "B")], x_shape=x_shape)


@pytest.mark.parametrize(
    "attributes, layer_kind",
    [
        (dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), "AveragePool2D"),
        (dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1),
         "AveragePool2D"),
        (dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1), "AveragePool2D"),
        # ceil_mode's extra window is not counted even with count_include_pad: no layer does that
        (dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1, count_include_pad=1),
         "fn:AveragePool"),
    ],
)  # fmt: skip
def test_average_pool(attributes, layer_kind):
    layer = compare(one_node("AveragePool", (2, 5, 5), 4, **attributes), layer_kind,
                    x_shape=(2, 5, 5))  # fmt: skip
    if layer_kind == "AveragePool2D":
        include = attributes.get("count_include_pad", 0)
        assert layer.padding_value == (0 if include else "mean")


def test_global_max_pool():
    compare(one_node("GlobalMaxPool", (3, 4, 5), 4), "GlobalMaxPool2D", x_shape=(3, 4, 5))


@pytest.mark.parametrize(
    "op, opset, shapes, attributes, layer_kind",
    [
        ("InstanceNormalization", 17, {"s": (4,), "b": (4,)}, dict(epsilon=1e-3), "InstanceNorm"),
        ("GroupNormalization", 21, {"s": (4,), "b": (4,)}, dict(num_groups=2), "GroupNorm"),
    ],
)  # fmt: skip
def test_instance_and_group_normalization(op, opset, shapes, attributes, layer_kind):
    p = weights(np.random.default_rng(2), shapes)
    m = one_node(op, (4, 3, 3), 4, params=p, opset=opset, **attributes)
    layer = compare(m, layer_kind, params=[("scale", "s"), ("offset", "b")], x_shape=(4, 3, 3))
    assert layer.epsilon == pytest.approx(attributes.get("epsilon", 1e-5))
    assert layer.scale.shape == (4,)


def test_layer_normalization_over_channels_maps_to_layer_norm():
    p = weights(np.random.default_rng(3), {"s": (5,), "b": (5,)})
    m = one_node("LayerNormalization", (5,), 2, params=p, epsilon=1e-4)
    layer = compare(m, "LayerNorm", params=[("scale", "s"), ("offset", "b")], x_shape=(5,))
    assert layer.operation_dimension == "channel-only"


def test_layer_normalization_over_an_image_stays_an_operator():
    # axis 1 of NCHW normalizes over C, H and W with a (C, H, W) scale: not per channel
    p = weights(np.random.default_rng(3), {"s": (2, 3, 3), "b": (2, 3, 3)})
    m = one_node("LayerNormalization", (2, 3, 3), 4, params=p, axis=1)
    compare(m, "fn:LayerNormalization", params=None, x_shape=(2, 3, 3))


@pytest.mark.parametrize(
    "consts, attributes, expected",
    [
        ({"scales": [1, 1, 2, 2]}, dict(coordinate_transformation_mode="asymmetric",
                                        nearest_mode="floor"),
         dict(method="nearest", geometric_transform_mode="asymmetric", scale=(2.0, 2.0))),
        ({"scales": [1, 1, 1.5, 2.5]}, dict(nearest_mode="round_prefer_ceil"),
         dict(nearest_rounding_mode="round", geometric_transform_mode="half-pixel")),
        ({"sizes": [2, 3, 7, 5]}, dict(mode="linear"),
         dict(method="bilinear", output_size=(7, 5))),
    ],
)  # fmt: skip
def test_resize_maps_to_resize2d_where_the_modes_match(consts, attributes, expected):
    arrays = {k: np.array(v, np.int64 if k == "sizes" else np.float32) for k, v in consts.items()}
    names = ["x", "", "scales" if "scales" in arrays else "", "sizes" if "sizes" in arrays else ""]
    m = one_node("Resize", (3, 4, 3), 4, consts=arrays, inputs=names[: 4 if "sizes" in arrays else 3],
                 opset=13, **attributes)  # fmt: skip
    layer = compare(m, "Resize2D", x_shape=(3, 4, 3))
    for option, value in expected.items():
        assert getattr(layer, option) == value


def test_resize_modes_difffn_lacks_are_named():
    scales = {"scales": np.array([1, 1, 2, 2], np.float32)}
    m = one_node("Resize", (1, 4, 4), 4, consts=scales, inputs=["x", "", "scales"], opset=13)
    with pytest.raises(df.ONNXImportError, match=r"node 'node' \(Resize\).*round_prefer_floor"):
        df.import_onnx(m)  # ONNX's default nearest mode rounds halves down; Resize2D's up


@pytest.mark.parametrize(
    "op, opset, consts, attributes, layer_kind, option",
    [
        ("LeakyRelu", 17, {}, dict(alpha=0.2), "LeakyReLU", ("scale", 0.2)),
        ("Clip", 13, {"lo": 0.0, "hi": 0.6}, {}, "ClippedReLU", ("ceiling", 0.6)),
        ("Clip", 10, {}, dict(min=0.0, max=0.5), "ClippedReLU", ("ceiling", 0.5)),
        ("Clip", 13, {"lo": -0.5, "hi": 0.5}, {}, "fn:Clip", None),
        ("Tanh", 17, {}, {}, "Tanh", None),
        ("Sigmoid", 17, {}, {}, "Sigmoid", None),
        ("Gelu", 20, {}, {}, "GELU", ("approximation", "none")),
        ("Gelu", 20, {}, dict(approximate="tanh"), "GELU", ("approximation", "tanh")),
        ("Identity", 17, {}, {}, "Identity", None),
    ],
)  # fmt: skip
def test_activations(op, opset, consts, attributes, layer_kind, option):
    arrays = {k: np.array(v, np.float32) for k, v in consts.items()}
    m = one_node(op, (3, 2, 2), 4, consts=arrays, opset=opset, **attributes)
    layer = compare(m, layer_kind, x_shape=(3, 2, 2))
    if option is not None:
        assert getattr(layer, option[0]) == pytest.approx(option[1])


def test_x_times_sigmoid_x_is_swish_and_a_gate_is_a_multiplication():
    # y = x * sigmoid(x) (Swish); then a squeeze-and-excitation gate: y * sigmoid(mean(y))
    m = model(
        [
            helper.make_node("Sigmoid", ["x"], ["s"], name="node"),
            helper.make_node("Mul", ["s", "x"], ["sw"], name="swish_mul"),
            helper.make_node("GlobalAveragePool", ["sw"], ["pooled"], name="pool"),
            helper.make_node("Sigmoid", ["pooled"], ["gate"], name="gate"),
            helper.make_node("Mul", ["sw", "gate"], ["y"], name="scale"),
        ],
        [helper.make_tensor_value_info("x", F, ["N", 3, 4, 4])],
        [helper.make_tensor_value_info("y", F, ["N", 3, 4, 4])],
        [],
    )
    layer = compare(m, "Swish", x_shape=(3, 4, 4))
    net = df.import_onnx(m)
    assert [kind(x) for x in net.layers] == [
        "ImageInput", "Swish", "GlobalAveragePool2D", "Sigmoid", "Multiplication",
    ]  # fmt: skip
    assert layer.description == "ONNX Sigmoid node 'node' times its input (Mul node 'swish_mul')"

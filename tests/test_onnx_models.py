"""The classic model-zoo architectures that the onnx package ships in light form, imported.

``onnx/backend/test/data/light/light_<model>.onnx`` are the zoo's graphs (opset 9, NCHW) with
every weight replaced by ``ConstantOfShape(<shape initializer>)`` of 0.02; the onnx backend test
runner feeds them ``arange(n).reshape(shape) / n`` (``Runner.generate_dummy_data`` with
``random=False``) and compares with ``light_<model>_output_0.pb``. difffn does the same, and,
because constant weights would hide a wrong channel order (every channel is alike), also
replaces each ``ConstantOfShape`` weight with random values (He-scaled for convolutions and
fully connected layers, near-identity for normalizations), adds the pre-softmax scores as a
second output, and compares with ONNX Runtime on a random image (for three of the models, two
random images run as one batch: the file fixes the batch to 1; ONNX Runtime runs them one by
one).
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import difffn as df
from difffn._onnx import _labels
from difffn._onnx._import import import_model

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
MODELS = [
    "bvlc_alexnet",
    "densenet121",
    "inception_v1",
    "inception_v2",
    "resnet50",
    "shufflenet",
    "squeezenet",
    "vgg19",
    "zfnet512",
]
MAPPED = {"Conv", "BatchNormalization", "Relu", "MaxPool", "Gemm", "Softmax", "Sum", "Concat"}
# two random images as one batch (the file fixes the batch to 1); the others run one image
BATCHED = {"shufflenet", "squeezenet", "inception_v1"}
# the onnx runner's tolerances for these models (onnx.backend.test.case.model)
RTOL = {"densenet121": 2e-3}


def dummy_input(model) -> np.ndarray:
    initializers = {t.name for t in model.graph.initializer}
    info = next(i for i in model.graph.input if i.name not in initializers)
    shape = tuple(d.dim_value for d in info.type.tensor_type.shape.dim)
    n = int(np.prod(shape))
    return (np.arange(n).reshape(shape) / n).astype(np.float32)


def _consumers(graph, name):
    return [(node, list(node.input).index(name)) for node in graph.node if name in node.input]


def _random_weights(model, rng):
    """A copy of ``model`` whose ConstantOfShape weights are random initializers."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    kept, randomized = [], {}
    for node in graph.node:
        if node.op_type != "ConstantOfShape":
            kept.append(node)
            continue
        name = node.output[0]
        shape = tuple(int(n) for n in inits[node.input[0]])
        users = _consumers(graph, name)
        while users and users[0][0].op_type == "Unsqueeze":
            users = _consumers(graph, users[0][0].output[0])
        op, position = (users[0][0].op_type, users[0][1]) if users else ("", 0)
        if op in ("Conv", "Gemm") and position == 1:
            fan_in = int(np.prod(shape[1:]))
            value = rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)
        elif op == "BatchNormalization" and position == 4:
            value = rng.uniform(0.5, 1.5, shape)
        elif op == "BatchNormalization" and position == 1 or op == "Mul":
            value = 1 + 0.1 * rng.standard_normal(shape)
        else:
            value = 0.1 * rng.standard_normal(shape)
        randomized[name] = numpy_helper.from_array(value.astype(np.float32), name)
    # the light files also hold an initializer of each weight's name (IR 3 input defaults)
    others = [t for t in graph.initializer if t.name not in randomized]
    del graph.initializer[:]
    graph.initializer.extend([*others, *randomized.values()])
    del graph.node[:]
    graph.node.extend(kept)
    copy.ir_version = max(copy.ir_version, 4)  # initializers that are not graph inputs
    return copy


def _with_scores(model):
    """The model with the softmax's input as a second output (DenseNet ends with scores)."""
    softmax = next((n for n in model.graph.node if n.op_type == "Softmax"), None)
    if softmax is None:
        return model
    inferred = onnx.shape_inference.infer_shapes(model).graph.value_info
    model.graph.output.append(next(v for v in inferred if v.name == softmax.input[0]))
    return model


def _predict(result, x, acceleration="auto"):
    net = result.network
    x = _labels.to_storage(x, next(iter(result.input_labels.values())))
    ys = net.predict(x, acceleration=acceleration)
    ys = ys if isinstance(ys, tuple) else (ys,)
    labels = list(result.output_labels.values())
    return [_labels.to_onnx(np.asarray(df.stripdims(y)), lab) for y, lab in zip(ys, labels)]


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_light_model_matches_the_shipped_output_and_onnx_runtime(name):
    path = os.path.join(LIGHT, f"light_{name}.onnx")
    model = onnx.load(path)
    expected = numpy_helper.to_array(onnx.load_tensor(path.replace(".onnx", "_output_0.pb")))

    # 1. The file as the onnx runner uses it: constant weights, the dummy input. With part 2's
    # scores output the network's structure is part 2's, so part 2 reuses this compiled program
    # for one image (equal structures share it). (Not for two: the constant weights make scores
    # of 1e12 or more, where a batch of two, summed in another order, moves the softmax.)
    rng = np.random.default_rng(0)
    randomized = _with_scores(_random_weights(model, rng))
    result = import_model(_with_scores(model))
    # convolutions, normalizations, ReLUs, max pools, fully connected and softmax layers are
    # difffn's own (channels-last, no transposes); LRN, AveragePool, channel shuffles are not
    generic = {layer.fn.op_type for layer in result.network.layers if hasattr(layer, "fn")}
    assert not generic & MAPPED, generic & MAPPED
    # SqueezeNet's constant weights give scores of 1e10: compiled whole, XLA recomputes the
    # global average inside the softmax's fusions in another summation order, and a 1e-8
    # relative difference is far beyond exp's range (NaN); run it layer by layer instead.
    acceleration = "none" if name == "squeezenet" else "auto"
    got = _predict(result, dummy_input(model), acceleration)[0]
    np.testing.assert_allclose(got, expected, rtol=RTOL.get(name, 1e-3), atol=1e-7)

    # 2. Random weights, pre-softmax scores too, against ONNX Runtime.
    result = import_model(randomized)
    images = 2 if name in BATCHED else 1
    x = rng.standard_normal((images, *dummy_input(model).shape[1:])).astype(np.float32)
    outputs = _predict(result, x)
    session = ort.InferenceSession(randomized.SerializeToString())
    initializers = {t.name for t in randomized.graph.initializer}
    feed = next(i.name for i in session.get_inputs() if i.name not in initializers)
    for i in range(images):
        wanted = session.run(None, {feed: x[i : i + 1]})
        assert np.abs(wanted[-1]).max() > 1e-3  # the random weights make distinct scores
        for got, want in zip(outputs, wanted):
            scale = np.abs(want).max()
            np.testing.assert_allclose(
                got[i : i + 1].reshape(want.shape), want, rtol=1e-3, atol=1e-4 * scale
            )

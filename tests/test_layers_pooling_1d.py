"""Tests of difffn/layers/_pooling_1d.py and its ONNX entries (difffn/_onnx/_mapping_pool_1d.py):
MaxPool1D, AveragePool1D, GlobalMaxPool1D and GlobalAveragePool1D against flax.nnx, jax.numpy
and ONNX Runtime."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from flax import nnx
from onnx import TensorProto, helper

import difffn as df

L = df.layers


def _randn(shape, *, seed=0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def _pad(x, padding, value):
    return jnp.pad(x, ((0, 0), padding, (0, 0)), constant_values=value)


@pytest.mark.parametrize(
    ("layer", "peer"),
    [
        (L.MaxPool1D(3, stride=2), lambda x: nnx.max_pool(x, (3,), (2,))),
        (L.MaxPool1D(2), lambda x: nnx.max_pool(x, (2,), (1,))),
        (L.MaxPool1D(3, padding=(2, 1)), lambda x: nnx.max_pool(_pad(x, (2, 1), -jnp.inf), (3,))),
        (L.MaxPool1D(2, stride=2, padding="same"), lambda x: nnx.max_pool(x, (2,), (2,), "SAME")),
        (L.AveragePool1D(2, stride=2), lambda x: nnx.avg_pool(x, (2,), (2,))),
        (L.AveragePool1D(3, padding=1), lambda x: nnx.avg_pool(_pad(x, (1, 1), 0.0), (3,))),
        (
            L.AveragePool1D(3, padding=1, padding_value="mean"),
            lambda x: nnx.avg_pool(x, (3,), padding=((1, 1),), count_include_pad=False),
        ),
        (L.GlobalAveragePool1D(), lambda x: jnp.mean(x, axis=1)),
        (L.GlobalMaxPool1D(), lambda x: jnp.max(x, axis=1)),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, df.Layer) else "",
)
def test_values_and_gradients_match_flax_nnx_and_jax_numpy(layer, peer):
    x = _randn((2, 9, 3), seed=1)
    up = _randn(peer(x).shape, seed=2)
    y = layer(df.dlarray(x, "BTC"))
    np.testing.assert_allclose(y.data, peer(x), rtol=1e-6, atol=1e-6)
    ours = jax.grad(lambda x: jnp.sum(layer(df.dlarray(x, "BTC")).data * up))(x)
    theirs = jax.grad(lambda x: jnp.sum(peer(x) * up))(x)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    ("fmt", "shape", "pooled", "global_shape", "global_fmt"),
    [
        ("BTC", (2, 8, 3), (2, 4, 3), (2, 3), "BC"),  # sequences: time is pooled, then dropped
        ("CBT", (3, 2, 8), (3, 2, 4), (3, 2), "CB"),
        ("BSC", (2, 8, 3), (2, 4, 3), (2, 1, 3), "BSC"),  # 1-D images keep S, of size 1
        ("BSCT", (2, 8, 3, 5), (2, 4, 3, 5), (2, 1, 3, 5), "BSCT"),  # over S, not T
    ],
)
def test_the_axis_pooled_follows_matlab(fmt, shape, pooled, global_shape, global_fmt):
    x = df.dlarray(_randn(shape), fmt)
    y = L.MaxPool1D(2, stride=2)(x)
    assert (y.format, y.shape) == (fmt, pooled)
    axis = fmt.index("S" if "S" in fmt else "T")
    np.testing.assert_array_equal(
        L.GlobalMaxPool1D()(x).data.reshape(global_shape),
        jnp.max(x.data, axis=axis).reshape(global_shape),
    )
    g = L.GlobalAveragePool1D()(x)
    assert (g.format, g.shape) == (global_fmt, global_shape)


def test_plain_input_is_batch_time_channels():
    x = _randn((2, 6, 3))
    np.testing.assert_array_equal(L.MaxPool1D(2, stride=2)(x), nnx.max_pool(x, (2,), (2,)))


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: L.MaxPool1D(0), r"MaxPool1D .*pool_size must be a positive int; got 0"),
        (lambda: L.MaxPool1D(2, stride=(1, 2)), r"stride must be a positive int; got \(1, 2\)"),
        (lambda: L.AveragePool1D(2, padding="valid"), r"padding must be 'same', a non-negative"),
        (lambda: L.MaxPool1D(2, padding=3), r"padding must be at most pool_size=2 on each side"),
        (lambda: L.AveragePool1D(2, padding_value=1), r"padding_value must be 0 or 'mean'"),
    ],
)
def test_bad_options_are_named_errors(make, match):
    with pytest.raises(df.LayerError, match=match):
        make()


def test_a_2d_image_is_a_named_error():
    with pytest.raises(df.FormatError, match=r"MaxPool1D .*takes a sequence.*got format 'BSSC'"):
        L.MaxPool1D(2)(df.dlarray(jnp.ones((1, 4, 4, 1)), "BSSC"))


def test_a_1d_classifier_on_sequences_of_any_length_at_least_min_length(key):
    net = df.Network([
        L.SequenceInput(3, min_length=6),
        L.Conv1D(3, 4), L.MaxPool1D(2, stride=2), L.Conv1D(2, 4), L.GlobalAveragePool1D(),
        L.FullyConnected(2), L.Softmax(),
    ]).initialize(key=key)  # fmt: skip
    for length in (6, 7, 20):
        y = net.predict(jnp.ones((2, length, 3)))
        assert (y.format, y.shape) == ("BC", (2, 2))


def test_onnx_export_agrees_with_onnx_runtime_and_imports_back_as_the_layers(tmp_path):
    layers = [
        L.MaxPool1D(3, stride=2, padding=1, name="max"),
        L.AveragePool1D(2, padding=(1, 0), padding_value="mean", name="avg"),
    ]
    layout = df.Layout((None, 9, 3), "BTC")
    net = df.Network(layers).initialize(layout, key=jax.random.key(0))
    path = df.export_onnx(net, layout, tmp_path / "pool.onnx")
    x = np.random.default_rng(0).standard_normal((2, 9, 3)).astype(np.float32)
    session = ort.InferenceSession(str(path))
    (got,) = session.run(None, {session.get_inputs()[0].name: x})
    np.testing.assert_allclose(got, net.predict(x).data, rtol=1e-6, atol=1e-6)
    assert {"MaxPool", "AveragePool"} <= {n.op_type for n in onnx.load(path).graph.node}
    back = df.import_onnx(path)
    assert {"MaxPool1D", "AveragePool1D"} <= {type(layer).__name__ for layer in back.layers}
    np.testing.assert_allclose(back.predict(x).data, got, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    ("pool", "layer"),
    [("GlobalAveragePool", "GlobalAveragePool1D"), ("GlobalMaxPool", "GlobalMaxPool1D")],
)
def test_onnx_files_from_other_tools_import_as_the_layers(pool, layer, tmp_path):
    # N x C x L: a MaxPool over the length, then a global pool (output N x C x 1), as a
    # PyTorch or MATLAB export of a 1-D CNN writes them; ONNX Runtime is the judge
    nodes = [
        helper.make_node("MaxPool", ["x"], ["m"], kernel_shape=[2], strides=[2], pads=[0, 1]),
        helper.make_node("AveragePool", ["m"], ["a"], kernel_shape=[3], pads=[1, 1]),
        helper.make_node(pool, ["a"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "pool1d",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 9])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    path = tmp_path / "pool1d.onnx"
    onnx.save(model, path)
    x = np.random.default_rng(1).standard_normal((2, 4, 9)).astype(np.float32)
    (want,) = ort.InferenceSession(str(path)).run(None, {"x": x})
    net = df.import_onnx(path)
    kinds = [type(lyr).__name__ for lyr in net.layers]
    assert kinds[1:] == ["MaxPool1D", "AveragePool1D", layer]
    # difffn stores channels last: N x L x C
    got = net.predict(df.dlarray(np.transpose(x, (0, 2, 1)), "BSC"))
    np.testing.assert_allclose(np.transpose(got.data, (0, 2, 1)), want, rtol=1e-6, atol=1e-6)


def test_the_functional_ops_pool_sequences_over_time_as_flax_nnx_does():
    # df.ops.max_pool / avg_pool (MATLAB's maxpool, avgpool) are the 1-D layers' kernels
    x = _randn((2, 9, 3), seed=3)
    y = df.ops.max_pool(df.dlarray(x, "BTC"), 3, stride=2)
    np.testing.assert_array_equal(y.data, nnx.max_pool(x, (3,), (2,)))
    z = df.ops.avg_pool(x, 2, stride=2, fmt="BTC")
    np.testing.assert_allclose(z, nnx.avg_pool(x, (2,), (2,)), rtol=1e-6)
    g = df.ops.max_pool(df.dlarray(x, "BTC"), "global")  # MATLAB's maxpool(X, "global")
    assert (g.format, g.shape) == ("BTC", (2, 1, 3))
    np.testing.assert_array_equal(g.data[:, 0], jnp.max(x, axis=1))

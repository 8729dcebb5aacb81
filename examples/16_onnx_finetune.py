"""15: import an ONNX CNN, swap in a custom layer, check it, fine-tune it, export it back.

A network that comes out of MATLAB (``exportONNXNetwork``) or PyTorch (``torch.onnx.export``)
is an ONNX file. This script
1. builds such a file with ``onnx.helper`` (a small CNN for 8x8 images in ONNX's NCHW order,
   standing in for a file from another framework, so nothing is downloaded);
2. imports it with ``df.import_onnx``: its nodes become difffn layers (Conv -> Conv2D,
   BatchNormalization -> BatchNorm, ...), its weights learnables reordered to channels-last;
3. replaces the first ReLU with a custom layer (a per-channel leaky ReLU with a learnable slope
   and its own backward) and checks it with ``df.check_layer``;
4. fine-tunes the network on scikit-learn's handwritten digits with ``df.trainnet``;
5. exports it with ``df.export_onnx``, runs the file in ONNX Runtime and prints the test
   accuracy of both (they agree: the file computes what ``net.predict`` computes).

Run: ``python examples/16_onnx_finetune.py [--small]``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper, numpy_helper

import difffn as df


def onnx_cnn(path: Path) -> Path:
    """An ONNX CNN (NCHW) for 8x8 one-channel images and 10 classes, with random weights."""
    rng = np.random.default_rng(0)

    def weight(name, shape, scale):
        value = (rng.standard_normal(shape) * scale).astype(np.float32)
        return numpy_helper.from_array(value, name)

    initializers = [
        weight("conv1.weight", (8, 1, 3, 3), 0.5), weight("conv1.bias", (8,), 0.1),
        numpy_helper.from_array(np.ones(8, np.float32), "bn1.scale"),
        numpy_helper.from_array(np.zeros(8, np.float32), "bn1.bias"),
        numpy_helper.from_array(np.zeros(8, np.float32), "bn1.mean"),
        numpy_helper.from_array(np.ones(8, np.float32), "bn1.var"),
        weight("conv2.weight", (16, 8, 3, 3), 0.2), weight("conv2.bias", (16,), 0.1),
        weight("fc.weight", (10, 16), 0.3), weight("fc.bias", (10,), 0.1),
    ]  # fmt: skip
    node = helper.make_node
    nodes = [
        node("Conv", ["image", "conv1.weight", "conv1.bias"], ["c1"], name="conv1",
             pads=[1, 1, 1, 1]),
        node("BatchNormalization", ["c1", "bn1.scale", "bn1.bias", "bn1.mean", "bn1.var"],
             ["b1"], name="bn1"),
        node("Relu", ["b1"], ["r1"], name="relu1"),
        node("MaxPool", ["r1"], ["p1"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]),
        node("Conv", ["p1", "conv2.weight", "conv2.bias"], ["c2"], name="conv2",
             pads=[1, 1, 1, 1]),
        node("Relu", ["c2"], ["r2"], name="relu2"),
        node("GlobalAveragePool", ["r2"], ["g"], name="gap"),
        node("Flatten", ["g"], ["f"], name="flatten"),
        node("Gemm", ["f", "fc.weight", "fc.bias"], ["logits"], name="fc", transB=1),
        node("Softmax", ["logits"], ["probabilities"], name="softmax", axis=1),
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes,
        "digits_cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 1, 8, 8])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", 10])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


class ChannelLeakyReLU(df.Layer):
    """max(x, 0) + slope * min(x, 0), with one learnable slope per channel."""

    slope: jax.Array = df.learnable(default=None)

    def initialize(self, layout, *, key):
        if self.slope is not None:
            return self
        shape = [1] * layout.ndim
        shape[layout.finddim("C")[0]] = layout.size("C")
        return self.replace(slope=jnp.full(shape, 0.1))

    def predict(self, x):
        return jnp.where(x > 0, x, self.slope * x)

    def backward(self, x, y, dLdY, memory):
        dLdX = dLdY * jnp.where(x > 0, 1.0, self.slope)
        axes = tuple(i for i, n in enumerate(self.slope.shape) if n == 1)
        # arithmetic, not jnp.where, so XLA:CPU fuses it into the sum; -0.0 keeps the zero
        # unshared with `x > 0` (docs/performance.md, "Custom backwards")
        dLdSlope = jnp.sum(dLdY * jnp.minimum(x, -0.0), axis=axes, keepdims=True)
        return dLdX, dLdSlope


def main(small: bool) -> dict[str, float]:
    folder = Path(os.environ.get("DIFFFN_OUTPUT_DIR") or tempfile.mkdtemp())
    source = onnx_cnn(folder / "digits_cnn.onnx")

    net = df.import_onnx(source)
    print(f"imported {source.name}:")
    print(net.summary())

    # the custom layer takes the ReLU's place (same name, so the connections stay)
    net = net.replace_layer("relu1", ChannelLeakyReLU(name="relu1"))
    net = net.initialize(key=jax.random.key(0))
    layout = df.Layout((4 if small else 16, 8, 8, 8), "BSSC")  # what relu1 receives
    report = df.check_layer(net.layer("relu1"), layout)
    print(report)

    X_train, T_train, X_test, T_test = df.data.digits()  # (N, 8, 8, 1) "BSSC" images
    if small:
        X_train, T_train = X_train[:256], T_train[:256]
    options = df.TrainingOptions(
        "adam",
        initial_learn_rate=0.01,
        max_epochs=2 if small else 30,
        mini_batch_size=64,
        shuffle="every-epoch",
        verbose=False,
    )
    start = time.perf_counter()
    net, info = df.trainnet(X_train, T_train, net, "crossentropy", options, key=jax.random.key(1))
    print(f"fine-tuned in {time.perf_counter() - start:.1f} s "
          f"({len(info.training_history)} iterations)")  # fmt: skip
    difffn_accuracy = df.testnet(net, X_test, T_test, "accuracy")

    exported = df.export_onnx(net, folder / "digits_cnn_finetuned.onnx")
    session = onnxruntime.InferenceSession(str(exported))
    scores = np.asarray(session.run(None, {"image": X_test.astype(np.float32)})[0])
    onnx_accuracy = 100.0 * float(np.mean(np.argmax(scores, axis=1) == T_test))
    difference = float(np.max(np.abs(scores - np.asarray(net.predict(X_test).data))))
    print(f"test accuracy: difffn {difffn_accuracy:.2f}%, ONNX Runtime {onnx_accuracy:.2f}% "
          f"(largest score difference {difference:.1e})")  # fmt: skip
    return {"difffn": difffn_accuracy, "onnxruntime": onnx_accuracy, "difference": difference}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=str(__doc__).splitlines()[0])
    parser.add_argument("--small", action="store_true", help="tiny settings for the test suite")
    main(parser.parse_args().small)

"""The model's inputs as difffn input layers, and the labels each input gets.

An input's labels (ONNX axis order) come from ``input_formats``, else from what it feeds (an
RNN's layout, a convolution's image) and its rank; images become ``ImageInput``, features
``FeatureInput``, sequences ``SequenceInput``, and every other input an ``ONNXInput``. A mixin
of ``Importer`` (``_import``): it writes the importer's table of tensor kinds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .._core import ONNXImportError
from ..layers import FeatureInput, FunctionLayer, ImageInput, SequenceInput
from . import _labels
from ._import_values import Runtime
from ._layers import ONNXInput, ToStorage
from ._load import Node
from ._ops import Unsupported, np_dtype

# Sizes a variable batch or sequence length takes while the graph is imported: not 1, which
# broadcasts (ambiguous), and not each other, so that a size computed from one is told apart.
STAND_IN = {"B": 3, "T": 5}


class Inputs:
    """``Importer``'s graph inputs (uses ``input_shapes``, ``input_formats``, ``consumers``,
    ``layers``, ``entries``, ``values`` and ``unique``)."""

    input_shapes: dict[str, Any]
    input_formats: dict[str, Any]
    consumers: dict[str, list[tuple[Node | None, int]]]
    values: dict[str, Any]
    entries: list[tuple[int, str, list, bool]]
    layers: list
    connections: list
    note: str
    onnx_order: set[str]
    variable_sizes: list[str]
    unique: Callable[[str], str]

    def _input_labels(self, name: str, rank: int, elem_type: int) -> str:
        if name in self.input_formats:
            labels = self.input_formats[name]
            if (
                not isinstance(labels, str)
                or len(labels) != rank
                or not set(labels) <= set("BCSTU")
                or labels != _labels.valid(labels)
            ):
                raise ONNXImportError(
                    f"df.import_onnx: input_formats[{name!r}] is {labels!r}; expected {rank} "
                    "labels from B, C, S, T, U (B, C, T at most once) in ONNX axis order, e.g. "
                    "'BCSS' for NCHW images."
                )
            return labels
        uses = [node for node, _ in self.consumers[name] if node is not None]
        if rank == 3:
            for node in uses:
                if node.op_type in ("LSTM", "GRU", "RNN"):
                    layout = dict(node.attributes).get("layout", 0)
                    return "BTC" if layout else "TBC"
                if node.op_type in ("Conv", "ConvTranspose", "MaxPool", "AveragePool"):
                    return "BCS"
        if rank == 2 and elem_type not in (1, 10, 11, 16):  # integers: token ids
            return "BT"
        return _labels.default_labels(rank)

    def _add_input(self, info) -> str:
        if info.elem_type == -1:
            raise ONNXImportError(
                f"df.import_onnx: the model input {info.name!r} is not a tensor (a sequence, map "
                "or optional); difffn imports tensor inputs only."
            )
        dims = info.dims
        if info.name in self.input_shapes:
            dims = tuple(self.input_shapes[info.name])
        if dims is None:
            raise ONNXImportError(
                f"df.import_onnx: the model input {info.name!r} has no shape in the file. Fix: "
                f"df.import_onnx(path, input_shapes={{{info.name!r}: (None, ...)}}) with its "
                "sizes in ONNX order (None for the batch)."
            )
        labels = self._input_labels(info.name, len(dims), info.elem_type)
        shape, stand_in = [], []
        for axis, (label, n) in enumerate(zip(labels, dims)):
            if isinstance(n, int) and n >= 0:
                shape.append(None if label == "B" else n)
                stand_in.append(n)
                if label == "B":
                    self.variable_sizes.append(f"{info.name!r} axis {axis} (batch)")
            elif label in "BT":
                shape.append(None)
                stand_in.append(STAND_IN[label])
                what = {"B": "batch", "T": "sequence length"}[label]
                self.variable_sizes.append(f"{info.name!r} axis {axis} ({what})")
            else:
                example = ["None" if lab == "B" else "..." for lab in labels]
                example[axis] = "<size>"
                raise ONNXImportError(
                    f"df.import_onnx: the model input {info.name!r} has a symbolic size "
                    f"{n!r} on axis {axis} (label {label!r} of {labels!r}, ONNX order); difffn "
                    "needs that size fixed (only batch and time may vary). Fix: "
                    f"df.import_onnx(path, input_shapes={{{info.name!r}: "
                    f"({', '.join(example)})}})."
                )
        try:
            dtype = np_dtype(info.elem_type)
        except Unsupported as error:
            raise ONNXImportError(
                f"df.import_onnx: the model input {info.name!r}: {error}."
            ) from None
        name = self.unique(info.name)
        onnx_order = info.name in self.onnx_order
        if onnx_order:
            layer = ONNXInput(tuple(shape), labels, labels, np.dtype(dtype).name, name=name)
            where = f"taken in ONNX's order {labels!r}"
        else:
            layer = self._input_layer(name, labels, shape, dtype, 0 in stand_in)
            where = f"{labels!r} in ONNX order ({_labels.storage_format(labels)!r} here)"
        layer = layer.replace(description=f"ONNX input {info.name!r}, {where}{self.note}")
        self.entries.append((len(self.layers), labels, shape, onnx_order))
        self.layers.append(layer)
        port = (name, "out")
        if onnx_order:  # the network stores it channels-last, as every imported tensor
            step = FunctionLayer(
                ToStorage(labels),
                formattable=True,
                num_inputs=1,
                name=self.unique(f"{info.name}_to_storage"),
                description=f"ONNX input {info.name!r}: {labels!r} to difffn's storage order",
            )
            self.layers.append(step)
            self.connections.append((f"{name}/out", f"{step.name}/in"))
            port = (step.name, "out")
        self.values[info.name] = Runtime(port, labels, tuple(stand_in), dtype)
        return labels

    def _input_layer(self, name, labels, shape, dtype, empty):
        floating = np.issubdtype(dtype, np.floating) and not empty
        sizes = dict(zip(labels, shape))
        if floating and labels == "BCSS":
            _, c, h, w = shape
            return ImageInput((h, w, c), normalization="none", name=name)
        if floating and labels == "BC":
            return FeatureInput(shape[1], name=name)
        if floating and labels in ("BTC", "TBC"):
            return SequenceInput(sizes["C"], name=name)
        perm = _labels.storage_perm(labels)
        shape = tuple(shape[i] for i in perm)
        storage = _labels.storage_format(labels)
        return ONNXInput(shape, storage, labels, np.dtype(dtype).name, name=name)

"""What the rules that map ONNX nodes to difffn layers share (``_mapping``, ``_mapping_rnn``,
``_mapping_attention``): reading a node's inputs, placing a layer and naming its ONNX sources.

A rule takes the importer, the node's ``NodeInfo`` and its output shapes, dtypes and labels; it
adds layers and returns True, or returns False and the importer makes an ``ONNXOperator``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeGuard

import numpy as np

from ._import_values import NodeInfo, Runtime
from ._ops import Unsupported


def runtime(imp: Any, info: NodeInfo, i: int) -> Runtime | None:
    """The runtime tensor at input ``i`` (a ``Runtime``), or None."""
    if i < len(info.input_kinds) and info.input_kinds[i] == "runtime":
        return imp.values[info.inputs[i]]
    return None


def shape_of(x: Runtime) -> tuple[int, ...]:
    """The ONNX shape of a runtime tensor, which a tensor after a placeholder may lack."""
    if x.shape is None:
        raise Unsupported("its input shapes are unknown (after a placeholder)")
    return x.shape


def const(info: NodeInfo, i: int) -> np.ndarray | None:
    """The constant at input ``i`` (a NumPy array), or None."""
    if i < len(info.input_kinds) and info.input_kinds[i] == "const":
        return info.input_values[i]
    return None


def absent(info: NodeInfo, i: int) -> bool:
    return i >= len(info.input_kinds) or info.input_kinds[i] == "absent"


def floating(array: np.ndarray | None) -> TypeGuard[np.ndarray]:
    """Whether ``array`` is a floating-point array (not None)."""
    return array is not None and np.issubdtype(array.dtype, np.floating)


def used(imp, name: str) -> bool:
    """Whether the tensor ``name`` feeds a node or is a graph output."""
    return bool(name) and bool(imp.consumers.get(name))


def add(imp, info, layer, inputs, out_labels, out_shapes, out_dtypes, order=None) -> bool:
    """Place ``layer`` fed by the tensors ``inputs``; its outputs are the node's outputs."""
    imp.place(layer, inputs)
    for i, name in enumerate(info.outputs[: len(out_labels)]):
        imp.set_output(
            name,
            layer.name,
            layer.output_names[i],
            out_labels[i],
            out_shapes[i],
            out_dtypes[i],
            order,
        )
    return True


def describe(info, parts) -> str:
    """A layer description naming the ONNX sources of its parameters."""
    names = ", ".join(f"{field} = {source}" for field, source in parts)
    return f"ONNX {info.node.op_type} node {info.node.name!r}: {names}"


def source(info, i, how: str = "") -> str:
    return f"{info.inputs[i]!r}{f' ({how})' if how else ''}"


def with_outputs(info, outputs):
    """``info`` of a node whose outputs are another node's (a fused MatMul + Add)."""
    return dataclasses.replace(info, outputs=tuple(outputs))

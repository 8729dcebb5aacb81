"""ONNX pooling nodes over one window axis that become difffn's 1-D pooling layers.

``MaxPool`` and ``AveragePool`` on a rank-3 tensor (``N x C x L``, labeled ``"BCS"`` or
``"BCT"``) become ``MaxPool1D`` / ``AveragePool1D``; ``GlobalMaxPool`` and ``GlobalAveragePool``
on a 1-D image (``"BCS"``) become ``GlobalMaxPool1D`` / ``GlobalAveragePool1D``, which keep the
``S`` axis of size 1 as ONNX does. Over time (``"BCT"``) the global layers drop the time axis
(MATLAB's ``"CBT"`` -> ``"CB"``) while ONNX keeps it of size 1: those nodes stay
``ONNXOperator``s. As in ``_mapping_cnn``, a rule maps a node only where the layer computes
exactly what the node does, and returns False otherwise.
"""

from __future__ import annotations

import numpy as np

from ..layers import AveragePool1D, GlobalAveragePool1D, GlobalMaxPool1D, MaxPool1D
from ._mapping_base import add, runtime
from ._ops import ints
from ._ops_nn import window_pads


def _window_input(imp, info):
    """The node's input when it is a rank-3 floating tensor in ONNX order, else None."""
    x = runtime(imp, info, 0)
    if x is None or x.labels not in ("BCS", "BCT") or x.order is not None:
        return None
    if not np.issubdtype(x.dtype, np.floating) or any(
        d != 1 for d in ints(info.a.get("dilations"))
    ):
        return None
    return x


def _window(info, x):
    """``(pool_size, stride, (left, right), extra)``, or None when the node is not 1-D."""
    a = info.a
    kernel = ints(a.get("kernel_shape"))
    if len(kernel) != 1:
        return None
    strides = ints(a.get("strides")) or (1,)
    pads, extra = window_pads(
        a, x.shape[2:], kernel, strides, (1,), ceil_mode=bool(a.get("ceil_mode", 0))
    )
    if max(pads[0]) > kernel[0]:  # the layers' rule (MATLAB's): no window of padding alone
        return None
    return kernel[0], strides[0], tuple(pads[0]), extra[0]


def _place(cls, imp, info, out_shapes, out_dtypes, out_labels, **options) -> bool:
    x = runtime(imp, info, 0)
    if x is not None and x.labels == "BCT":  # over time: the output is a sequence too
        out_labels = ["BCT"]
    layer = cls(
        **options,
        name=imp.unique(info.node.name),
        description=f"ONNX {info.node.op_type} node {info.node.name!r}",
    )
    return add(imp, info, layer, [info.inputs[0]], out_labels, out_shapes, out_dtypes)


def max_pool(imp, info, out_shapes, out_dtypes, out_labels) -> bool:
    x = _window_input(imp, info)
    if x is None or len(info.outputs) > 1 or info.a.get("storage_order", 0):
        return False
    window = _window(info, x)
    if window is None:
        return False
    size, stride, pads, _ = window  # ceil_mode's extra padding is -inf: it never wins
    return _place(
        MaxPool1D, imp, info, out_shapes, out_dtypes, out_labels,
        pool_size=size, stride=stride, padding=pads,
    )  # fmt: skip


def average_pool(imp, info, out_shapes, out_dtypes, out_labels) -> bool:
    """``count_include_pad=1`` is ``padding_value=0``, ``0`` is ``"mean"`` (as in 2-D)."""
    x = _window_input(imp, info)
    if x is None:
        return False
    window = _window(info, x)
    if window is None:
        return False
    size, stride, pads, extra = window
    include = bool(info.a.get("count_include_pad", 0))
    if include and extra:  # ceil_mode's extra padding is not counted: no layer option for it
        return False
    return _place(
        AveragePool1D, imp, info, out_shapes, out_dtypes, out_labels,
        pool_size=size, stride=stride, padding=pads, padding_value=0 if include else "mean",
    )  # fmt: skip


def _global(cls):
    def rule(imp, info, out_shapes, out_dtypes, out_labels) -> bool:
        x = runtime(imp, info, 0)
        if x is None or x.labels != "BCS" or x.order is not None:
            return False
        if not np.issubdtype(x.dtype, np.floating):
            return False
        return _place(cls, imp, info, out_shapes, out_dtypes, out_labels)

    return rule


global_average_pool = _global(GlobalAveragePool1D)
global_max_pool = _global(GlobalMaxPool1D)

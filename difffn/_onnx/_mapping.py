"""ONNX nodes that become difffn's own layers, with their weights reordered for difffn.

Each rule looks at one node (and, for MatMul + Add, its consumer) and either adds difffn layers
and returns True, or returns False and the importer makes an ``ONNXOperator`` instead. A rule
applies only where the difffn layer computes exactly what the ONNX node does on the tensor's
layout: Conv ``OIHW`` weights become ``HWIO``, an LSTM's ``iofc`` gate blocks become difffn's
(MATLAB's) ``ifgo``, a Flatten of channels-last images reorders the rows of the fully connected
weights that follow instead of the data.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ..layers import (
    ELU,
    Addition,
    BatchNorm,
    Concatenation,
    Conv2D,
    Dropout,
    Embedding,
    Flatten,
    FullyConnected,
    GlobalAveragePool2D,
    MaxPool2D,
    ReLU,
    Softmax,
)
from . import _labels, _mapping_attention, _mapping_cnn, _mapping_pool_1d, _mapping_rnn
from ._mapping_base import (
    absent,
    add,
    const,
    describe,
    floating,
    runtime,
    shape_of,
    source,
    used,
    with_outputs,
)
from ._ops import axis_of, ints
from ._ops_nn import window_pads
from ._ops_tensor import flatten_axis


def try_map(imp, info, out_shapes, out_dtypes, out_labels) -> bool:
    rule = _RULES.get(info.node.op_type)
    if rule is None:
        return False
    return bool(rule(imp, info, out_shapes, out_dtypes, out_labels))


# -- convolution and pooling --------------------------------------------------------------------


def _conv(imp, info, out_shapes, out_dtypes, out_labels):
    a = info.a
    x, w = runtime(imp, info, 0), const(info, 1)
    b = const(info, 2)
    if x is None or x.labels != "BCSS" or x.order is not None or not floating(w) or w.ndim != 4:
        return False
    if not (absent(info, 2) or (floating(b) and b.shape == (w.shape[0],))):
        return False
    kernel = tuple(int(n) for n in w.shape[2:])
    strides = ints(a.get("strides")) or (1, 1)
    dilations = ints(a.get("dilations")) or (1, 1)
    if a.get("auto_pad", "NOTSET") == "SAME_UPPER":
        padding = "same"
    else:
        pads, _ = window_pads(a, shape_of(x)[2:], kernel, strides, dilations)
        padding = tuple(pads)
    num_filters = int(w.shape[0])
    bias = b if b is not None else np.zeros(num_filters, w.dtype)
    layer = Conv2D(
        kernel,
        num_filters,
        stride=strides,
        padding=padding,
        dilation=dilations,
        groups=int(a.get("group", 1)),
        weights=jnp.asarray(np.transpose(w, (2, 3, 1, 0))),
        bias=jnp.asarray(bias),
        name=imp.unique(info.node.name),
        description=describe(
            info,
            [
                ("weights", source(info, 1, "OIHW -> HWIO")),
                ("bias", source(info, 2) if b is not None else "zeros (the node has none)"),
            ],
        ),
    )
    return add(imp, info, layer, [info.inputs[0]], out_labels, out_shapes, out_dtypes)


def _max_pool(imp, info, out_shapes, out_dtypes, out_labels):
    a = info.a
    x = runtime(imp, info, 0)
    if x is None or x.labels != "BCSS" or x.order is not None or len(info.outputs) > 1:
        return False
    if not np.issubdtype(x.dtype, np.floating):
        return False
    if any(d != 1 for d in ints(a.get("dilations"))) or a.get("storage_order", 0):
        return False
    kernel = ints(a.get("kernel_shape"))
    strides = ints(a.get("strides")) or (1, 1)
    if a.get("auto_pad", "NOTSET") == "SAME_UPPER":
        padding = "same"
    else:
        pads, _ = window_pads(
            a, shape_of(x)[2:], kernel, strides, (1, 1), ceil_mode=bool(a.get("ceil_mode", 0))
        )
        padding = tuple(pads)
    layer = MaxPool2D(
        kernel,
        stride=strides,
        padding=padding,
        name=imp.unique(info.node.name),
        description=f"ONNX MaxPool node {info.node.name!r}",
    )
    return add(imp, info, layer, [info.inputs[0]], out_labels, out_shapes, out_dtypes)


def _global_average_pool(imp, info, out_shapes, out_dtypes, out_labels):
    x = runtime(imp, info, 0)
    if x is None or x.labels != "BCSS" or x.order is not None:
        return False
    layer = GlobalAveragePool2D(
        name=imp.unique(info.node.name),
        description=f"ONNX GlobalAveragePool node {info.node.name!r}",
    )
    return add(imp, info, layer, [info.inputs[0]], out_labels, out_shapes, out_dtypes)


# -- normalization ---------------------------------------------------------------------------------


def _batch_norm(imp, info, out_shapes, out_dtypes, out_labels):
    a = info.a
    x = runtime(imp, info, 0)
    found = [const(info, i) for i in range(1, 5)]
    params = [p for p in found if floating(p) and p.ndim == 1]
    if x is None or x.order is not None or x.labels[1:2] != "C" or len(info.outputs) > 1:
        return False
    if a.get("training_mode", 0) or len(params) < len(found):
        return False
    epsilon, momentum = a.get("epsilon", 1e-5), a.get("momentum", 0.9)
    if not (epsilon > 0 and 0 <= momentum <= 1):
        return False
    scale, offset, mean, variance = params
    layer = BatchNorm(
        epsilon=float(epsilon),
        mean_decay=1 - float(momentum),
        variance_decay=1 - float(momentum),
        scale=jnp.asarray(scale),
        offset=jnp.asarray(offset),
        trained_mean=jnp.asarray(mean),
        trained_variance=jnp.asarray(variance),
        name=imp.unique(info.node.name),
        description=describe(
            info,
            [
                ("scale", source(info, 1)),
                ("offset", source(info, 2)),
                ("trained_mean", source(info, 3)),
                ("trained_variance", source(info, 4)),
            ],
        ),
    )
    return add(imp, info, layer, [info.inputs[0]], out_labels, out_shapes, out_dtypes)


# -- fully connected -------------------------------------------------------------------------------


def _fully_connected(imp, info, x_name, weights, bias, parts, out_labels, out_shapes, out_dtypes):
    x = imp.values[x_name]
    if x.order is not None:
        # the input is an image flattened channels-last: reorder the rows instead of the data
        weights = weights[np.argsort(x.order)]
        note = "rows reordered for channels-last flattening"
        source = parts[0][1]
        source = source[:-1] + f", {note})" if source.endswith(")") else f"{source} ({note})"
        parts[0] = (parts[0][0], source)
    layer = FullyConnected(
        int(weights.shape[1]),
        weights=weights,
        bias=bias,
        name=imp.unique(info.node.name),
        description=describe(info, parts),
    )
    return add(imp, info, layer, [x_name], out_labels, out_shapes, out_dtypes)


def _gemm(imp, info, out_shapes, out_dtypes, out_labels):
    a = info.a
    x, w, c = runtime(imp, info, 0), const(info, 1), const(info, 2)
    if x is None or x.labels != "BC" or a.get("transA", 0) or not floating(w) or w.ndim != 2:
        return False
    weights = w.T if a.get("transB", 0) else w
    units = weights.shape[1]
    if c is not None and (not floating(c) or c.size not in (1, units) or c.ndim > 2):
        return False
    if c is not None and c.ndim == 2 and c.shape[0] != 1:
        return False
    if not absent(info, 2) and c is None:
        return False
    alpha, beta = a.get("alpha", 1.0), a.get("beta", 1.0)
    weights = weights * alpha if alpha != 1 else weights
    if c is None:
        bias, bias_source = np.zeros(units, weights.dtype), "zeros (the node has none)"
    else:
        bias = np.broadcast_to(c.reshape(-1) * beta, (units,)).copy()
        bias_source = source(info, 2, f"times beta={beta}" if beta != 1 else "")
    how = ("transposed" if a.get("transB", 0) else "") + (
        f", times alpha={alpha}" if alpha != 1 else ""
    )
    parts = [("weights", source(info, 1, how.strip(", "))), ("bias", bias_source)]
    return _fully_connected(
        imp, info, info.inputs[0], weights, bias, parts, out_labels, out_shapes, out_dtypes
    )


def _matmul(imp, info, out_shapes, out_dtypes, out_labels):
    x, w = runtime(imp, info, 0), const(info, 1)
    if x is None or not floating(w) or w.ndim != 2:
        return False
    if len(x.labels) < 2 or x.labels[-1] != "C" or set(x.labels[:-1]) - set("BT"):
        return False
    units = w.shape[1]
    bias, bias_source, add = None, "zeros (the MatMul has no Add)", None
    users = imp.consumers.get(info.outputs[0], [])
    if len(users) == 1 and users[0][0] is not None and users[0][0].op_type == "Add":
        add = users[0][0]
        other = add.inputs[1 - users[0][1]]
        value = imp.values.get(other)
        constant = getattr(value, "value", None)
        if (
            floating(constant)
            and constant.size == units
            and constant.shape[-1:] == (units,)
            and constant.ndim <= len(x.labels)
        ):
            bias, bias_source = constant.reshape(-1).astype(w.dtype), repr(other)
        else:
            add = None
    if bias is None:
        bias = np.zeros(units, w.dtype)
    parts = [("weights", source(info, 1)), ("bias", bias_source)]
    labels, shapes, dtypes = out_labels, out_shapes, out_dtypes
    if add is not None:
        imp.skip.add(id(add))
        info = with_outputs(info, add.outputs)
    return _fully_connected(imp, info, info.inputs[0], w, bias, parts, labels, shapes, dtypes)


# -- activations and merges --------------------------------------------------------------------


def _relu(imp, info, out_shapes, out_dtypes, out_labels):
    x = runtime(imp, info, 0)
    if x is None or not np.issubdtype(x.dtype, np.floating):
        return False
    layer = ReLU(name=imp.unique(info.node.name), description=f"ONNX Relu node {info.node.name!r}")
    return add(imp, info, layer, [info.inputs[0]], out_labels, out_shapes, out_dtypes, x.order)


def _elu(imp, info, out_shapes, out_dtypes, out_labels):
    x = runtime(imp, info, 0)
    alpha = info.a.get("alpha", 1.0)
    if x is None or not alpha > 0 or not np.issubdtype(x.dtype, np.floating):
        return False
    layer = ELU(
        alpha=float(alpha),
        name=imp.unique(info.node.name),
        description=f"ONNX Elu node {info.node.name!r}",
    )
    return add(imp, info, layer, [info.inputs[0]], out_labels, out_shapes, out_dtypes, x.order)


def _softmax(imp, info, out_shapes, out_dtypes, out_labels):
    a = info.a
    x = runtime(imp, info, 0)
    if x is None or x.order is not None or "C" not in x.labels:
        return False
    rank = len(x.labels)
    if a.opset >= 13:
        axis = a.get("axis", -1) % rank
        if x.labels[axis] != "C":
            return False
    else:
        axis = a.get("axis", 1) % rank
        if x.labels[axis] != "C" or any(n != 1 for n in shape_of(x)[axis + 1 :]):
            return False
        if any(label in "BT" for label in x.labels[axis + 1 :]):
            return False
    layer = Softmax(
        name=imp.unique(info.node.name), description=f"ONNX Softmax node {info.node.name!r}"
    )
    return add(imp, info, layer, [info.inputs[0]], out_labels, out_shapes, out_dtypes)


def _dropout(imp, info, out_shapes, out_dtypes, out_labels):
    x = runtime(imp, info, 0)
    if x is None or any(used(imp, name) for name in info.outputs[1:]):
        return False
    ratio = info.a.get("ratio", 0.5) if info.a.opset < 12 else const(info, 1)
    if ratio is None:
        if not absent(info, 1):
            return False
        ratio = 0.5
    ratio = float(np.asarray(ratio).reshape(()))
    if not 0 <= ratio < 1:
        return False
    layer = Dropout(
        ratio, name=imp.unique(info.node.name), description=f"ONNX Dropout node {info.node.name!r}"
    )
    return add(imp, info, layer, [info.inputs[0]], out_labels[:1], out_shapes, out_dtypes, x.order)


def _addition(imp, info, out_shapes, out_dtypes, out_labels):
    found = [runtime(imp, info, i) for i in range(len(info.inputs))]
    values = [v for v in found if v is not None and v.order is None]
    if len(found) < 2 or len(values) < len(found):
        return False
    if len({v.labels for v in values}) > 1 or len({tuple(shape_of(v)) for v in values}) > 1:
        return False
    if not np.issubdtype(values[0].dtype, np.floating):
        return False
    layer = Addition(
        len(values),
        name=imp.unique(info.node.name),
        description=f"ONNX {info.node.op_type} node {info.node.name!r}",
    )
    return add(imp, info, layer, list(info.inputs), out_labels, out_shapes, out_dtypes)


def _concat(imp, info, out_shapes, out_dtypes, out_labels):
    found = [runtime(imp, info, i) for i in range(len(info.inputs))]
    values = [v for v in found if v is not None and v.order is None]
    if len(found) < 2 or len(values) < len(found):
        return False
    labels = values[0].labels
    if any(v.labels != labels for v in values):
        return False
    label = labels[info.a.get("axis") % len(labels)]
    if label not in "CBT":
        return False
    layer = Concatenation(
        len(values),
        label=label,
        name=imp.unique(info.node.name),
        description=f"ONNX Concat node {info.node.name!r}",
    )
    return add(imp, info, layer, list(info.inputs), out_labels, out_shapes, out_dtypes)


def _flatten(imp, info, out_shapes, out_dtypes, out_labels):
    x = runtime(imp, info, 0)
    if x is None or x.order is not None or x.shape is None:
        return False
    if info.node.op_type == "Flatten":
        if flatten_axis(info.a, len(x.labels)) != 1:
            return False
    elif len(out_shapes[0]) != 2 or out_shapes[0] != (x.shape[0], int(np.prod(x.shape[1:]))):
        return False
    if x.labels == "BC":
        imp.values[info.outputs[0]] = x
        return True
    order = None
    if x.labels.startswith("B") and set(x.labels[1:-1]) == {"S"} and x.labels[-1] == "C":
        how = "channels-last, as ONNX's"  # an image transposed to NHWC: the same order
    elif x.labels.startswith("BC") and set(x.labels[2:]) == {"S"}:
        how = "channels-last order"
        stored = tuple(x.shape[i] for i in _labels.storage_perm(x.labels))[1:]
        if any(n != 1 for n in x.shape[2:]):
            # ONNX flattens (c, h, w); difffn stores (h, w, c): ONNX's feature j is stored
            # feature order[j]
            positions = np.arange(int(np.prod(stored))).reshape(stored)
            order = np.moveaxis(positions, -1, 0).reshape(-1)
    else:
        return False
    layer = Flatten(
        name=imp.unique(info.node.name),
        description=f"ONNX {info.node.op_type} node {info.node.name!r} ({how})",
    )
    return add(imp, info, layer, [info.inputs[0]], ["BC"], out_shapes, out_dtypes, order)


def _transpose(imp, info, out_shapes, out_dtypes, out_labels):
    """A Transpose that moves no stored axis (e.g. NCHW -> NHWC of channels-last data) is
    only a relabelling: its output is its input's port, with the new labels."""
    x = runtime(imp, info, 0)
    if x is None or x.order is not None or x.shape is None:
        return False
    perm = ints(info.a.get("perm")) or tuple(reversed(range(len(x.labels))))
    stored_in = _labels.storage_perm(x.labels)
    stored_out = tuple(perm[j] for j in _labels.storage_perm(out_labels[0]))
    if stored_in != stored_out:
        return False
    assert x.port is not None  # only a failed node's outputs have none, and they stop the walk
    imp.set_output(info.outputs[0], *x.port, out_labels[0], out_shapes[0], out_dtypes[0])
    return True


def _embedding(imp, info, out_shapes, out_dtypes, out_labels):
    """Gather of rows of a constant matrix by runtime token ids: ``Embedding``. (ONNX counts
    negative ids from the end; ``Embedding`` maps every id outside the table to the last row,
    the same for ``-1`` only: exporters write non-negative ids.)"""
    table, ids = const(info, 0), runtime(imp, info, 1)
    if not floating(table) or table.ndim != 2 or ids is None or ids.order is not None:
        return False
    if axis_of(info.a.get("axis", 0), 2) != 0 or "C" in ids.labels:
        return False
    if not np.issubdtype(ids.dtype, np.integer) or out_labels[0] != ids.labels + "C":
        return False
    num_words, dimension = (int(n) for n in table.shape)
    layer = Embedding(
        dimension,
        num_words,
        weights=jnp.asarray(table),
        name=imp.unique(info.node.name),
        description=describe(info, [("weights", source(info, 0))]),
    )
    return add(imp, info, layer, [info.inputs[1]], out_labels, out_shapes, out_dtypes)


_RULES = {
    "Conv": lambda *args: _conv(*args) or _mapping_cnn.conv(*args),
    "BatchNormalization": _batch_norm,
    "Gemm": _gemm,
    "MatMul": _matmul,
    "Relu": _relu,
    "Elu": _elu,
    "Softmax": _softmax,
    "Dropout": _dropout,
    "Add": _addition,
    "Sum": _addition,
    "Concat": _concat,
    "Flatten": _flatten,
    "Reshape": _flatten,
    "Gather": _embedding,
    "Transpose": _transpose,
    "SelfAttention": _mapping_attention.map_self_attention,
    **_mapping_rnn.RULES,
    **_mapping_cnn.RULES,
    # 1-D pooling, where the 2-D rules do not apply
    "MaxPool": lambda *args: _max_pool(*args) or _mapping_pool_1d.max_pool(*args),
    "AveragePool": lambda *args: (
        _mapping_cnn.average_pool(*args) or _mapping_pool_1d.average_pool(*args)
    ),
    "GlobalAveragePool": lambda *args: (
        _global_average_pool(*args) or _mapping_pool_1d.global_average_pool(*args)
    ),
    "GlobalMaxPool": lambda *args: (
        _mapping_cnn.global_max_pool(*args) or _mapping_pool_1d.global_max_pool(*args)
    ),
}

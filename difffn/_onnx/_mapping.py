"""ONNX nodes that become difffn's own layers, with their weights reordered for difffn.

Each rule looks at one node (and, for MatMul + Add, its consumer) and either adds difffn layers
and returns True, or returns False and the importer makes an ``ONNXOperator`` instead. A rule
applies only where the difffn layer computes exactly what the ONNX node does on the tensor's
layout: Conv ``OIHW`` weights become ``HWIO``, an LSTM's ``iofc`` gate blocks become difffn's
(MATLAB's) ``ifgo``, a Flatten of channels-last images reorders the rows of the fully connected
weights that follow instead of the data.
"""

from __future__ import annotations

import numpy as np

from ..layers import (
    ELU,
    LSTM,
    Addition,
    BatchNorm,
    Concatenation,
    Conv2D,
    Dropout,
    Flatten,
    FullyConnected,
    GlobalAveragePool2D,
    MaxPool2D,
    ReLU,
    Softmax,
)
from . import _labels
from ._layers import NodeFunction
from ._ops import Attrs, FrozenArray, ints
from ._ops_nn import window_pads
from ._ops_tensor import flatten_axis


def try_map(imp, info, out_shapes, out_dtypes, out_labels) -> bool:
    rule = _RULES.get(info.node.op_type)
    if rule is None:
        return False
    return bool(rule(imp, info, out_shapes, out_dtypes, out_labels))


# -- helpers ---------------------------------------------------------------------------------------


def _runtime(imp, info, i):
    if i < len(info.input_kinds) and info.input_kinds[i] == "runtime":
        return imp.values[info.inputs[i]]
    return None


def _const(info, i):
    if i < len(info.input_kinds) and info.input_kinds[i] == "const":
        return info.input_values[i]
    return None


def _absent(info, i) -> bool:
    return i >= len(info.input_kinds) or info.input_kinds[i] == "absent"


def _float(array) -> bool:
    return array is not None and np.issubdtype(array.dtype, np.floating)


def _used(imp, name: str) -> bool:
    return bool(name) and bool(imp.consumers.get(name))


def _add(imp, info, layer, inputs, out_labels, out_shapes, out_dtypes, order=None) -> bool:
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


def _describe(info, parts) -> str:
    names = ", ".join(f"{field} = {source}" for field, source in parts)
    return f"ONNX {info.node.op_type} node {info.node.name!r}: {names}"


def _source(info, i, how: str = "") -> str:
    return f"{info.inputs[i]!r}{f' ({how})' if how else ''}"


# -- convolution and pooling --------------------------------------------------------------------


def _conv(imp, info, out_shapes, out_dtypes, out_labels):
    a = info.a
    x, w = _runtime(imp, info, 0), _const(info, 1)
    b = _const(info, 2)
    if x is None or x.labels != "BCSS" or x.order is not None or not _float(w) or w.ndim != 4:
        return False
    if not (_absent(info, 2) or (_float(b) and b.shape == (w.shape[0],))):
        return False
    kernel = tuple(int(n) for n in w.shape[2:])
    strides = ints(a.get("strides")) or (1, 1)
    dilations = ints(a.get("dilations")) or (1, 1)
    if a.get("auto_pad", "NOTSET") == "SAME_UPPER":
        padding = "same"
    else:
        pads, _ = window_pads(a, x.shape[2:], kernel, strides, dilations)
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
        weights=np.transpose(w, (2, 3, 1, 0)),
        bias=bias,
        name=imp.unique(info.node.name),
        description=_describe(
            info,
            [
                ("weights", _source(info, 1, "OIHW -> HWIO")),
                ("bias", _source(info, 2) if b is not None else "zeros (the node has none)"),
            ],
        ),
    )
    return _add(imp, info, layer, [info.inputs[0]], out_labels, out_shapes, out_dtypes)


def _max_pool(imp, info, out_shapes, out_dtypes, out_labels):
    a = info.a
    x = _runtime(imp, info, 0)
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
            a, x.shape[2:], kernel, strides, (1, 1), ceil_mode=bool(a.get("ceil_mode", 0))
        )
        padding = tuple(pads)
    layer = MaxPool2D(
        kernel,
        stride=strides,
        padding=padding,
        name=imp.unique(info.node.name),
        description=f"ONNX MaxPool node {info.node.name!r}",
    )
    return _add(imp, info, layer, [info.inputs[0]], out_labels, out_shapes, out_dtypes)


def _global_average_pool(imp, info, out_shapes, out_dtypes, out_labels):
    x = _runtime(imp, info, 0)
    if x is None or x.labels != "BCSS" or x.order is not None:
        return False
    layer = GlobalAveragePool2D(
        name=imp.unique(info.node.name),
        description=f"ONNX GlobalAveragePool node {info.node.name!r}",
    )
    return _add(imp, info, layer, [info.inputs[0]], out_labels, out_shapes, out_dtypes)


# -- normalization ---------------------------------------------------------------------------------


def _batch_norm(imp, info, out_shapes, out_dtypes, out_labels):
    a = info.a
    x = _runtime(imp, info, 0)
    params = [_const(info, i) for i in range(1, 5)]
    if x is None or x.order is not None or x.labels[1:2] != "C" or len(info.outputs) > 1:
        return False
    if a.get("training_mode", 0) or not all(_float(p) and p.ndim == 1 for p in params):
        return False
    epsilon, momentum = a.get("epsilon", 1e-5), a.get("momentum", 0.9)
    if not (epsilon > 0 and 0 <= momentum <= 1):
        return False
    scale, offset, mean, variance = params
    layer = BatchNorm(
        epsilon=float(epsilon),
        mean_decay=1 - float(momentum),
        variance_decay=1 - float(momentum),
        scale=scale,
        offset=offset,
        trained_mean=mean,
        trained_variance=variance,
        name=imp.unique(info.node.name),
        description=_describe(
            info,
            [
                ("scale", _source(info, 1)),
                ("offset", _source(info, 2)),
                ("trained_mean", _source(info, 3)),
                ("trained_variance", _source(info, 4)),
            ],
        ),
    )
    return _add(imp, info, layer, [info.inputs[0]], out_labels, out_shapes, out_dtypes)


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
        description=_describe(info, parts),
    )
    return _add(imp, info, layer, [x_name], out_labels, out_shapes, out_dtypes)


def _gemm(imp, info, out_shapes, out_dtypes, out_labels):
    a = info.a
    x, w, c = _runtime(imp, info, 0), _const(info, 1), _const(info, 2)
    if x is None or x.labels != "BC" or a.get("transA", 0) or not _float(w) or w.ndim != 2:
        return False
    weights = w.T if a.get("transB", 0) else w
    units = weights.shape[1]
    if c is not None and (not _float(c) or c.size not in (1, units) or c.ndim > 2):
        return False
    if c is not None and c.ndim == 2 and c.shape[0] != 1:
        return False
    if not _absent(info, 2) and c is None:
        return False
    alpha, beta = a.get("alpha", 1.0), a.get("beta", 1.0)
    weights = weights * alpha if alpha != 1 else weights
    if c is None:
        bias, bias_source = np.zeros(units, weights.dtype), "zeros (the node has none)"
    else:
        bias = np.broadcast_to(c.reshape(-1) * beta, (units,)).copy()
        bias_source = _source(info, 2, f"times beta={beta}" if beta != 1 else "")
    how = ("transposed" if a.get("transB", 0) else "") + (
        f", times alpha={alpha}" if alpha != 1 else ""
    )
    parts = [("weights", _source(info, 1, how.strip(", "))), ("bias", bias_source)]
    return _fully_connected(
        imp, info, info.inputs[0], weights, bias, parts, out_labels, out_shapes, out_dtypes
    )


def _matmul(imp, info, out_shapes, out_dtypes, out_labels):
    x, w = _runtime(imp, info, 0), _const(info, 1)
    if x is None or not _float(w) or w.ndim != 2:
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
            _float(constant)
            and constant.size == units
            and constant.shape[-1:] == (units,)
            and constant.ndim <= len(x.labels)
        ):
            bias, bias_source = constant.reshape(-1).astype(w.dtype), repr(other)
        else:
            add = None
    if bias is None:
        bias = np.zeros(units, w.dtype)
    parts = [("weights", _source(info, 1)), ("bias", bias_source)]
    labels, shapes, dtypes = out_labels, out_shapes, out_dtypes
    if add is not None:
        imp.skip.add(id(add))
        info = _with_outputs(info, add.outputs)
    return _fully_connected(imp, info, info.inputs[0], w, bias, parts, labels, shapes, dtypes)


def _with_outputs(info, outputs):
    from dataclasses import replace

    return replace(info, outputs=tuple(outputs))


# -- activations and merges --------------------------------------------------------------------


def _relu(imp, info, out_shapes, out_dtypes, out_labels):
    x = _runtime(imp, info, 0)
    if x is None or not np.issubdtype(x.dtype, np.floating):
        return False
    layer = ReLU(name=imp.unique(info.node.name), description=f"ONNX Relu node {info.node.name!r}")
    return _add(imp, info, layer, [info.inputs[0]], out_labels, out_shapes, out_dtypes, x.order)


def _elu(imp, info, out_shapes, out_dtypes, out_labels):
    x = _runtime(imp, info, 0)
    alpha = info.a.get("alpha", 1.0)
    if x is None or not alpha > 0 or not np.issubdtype(x.dtype, np.floating):
        return False
    layer = ELU(
        alpha=float(alpha),
        name=imp.unique(info.node.name),
        description=f"ONNX Elu node {info.node.name!r}",
    )
    return _add(imp, info, layer, [info.inputs[0]], out_labels, out_shapes, out_dtypes, x.order)


def _softmax(imp, info, out_shapes, out_dtypes, out_labels):
    a = info.a
    x = _runtime(imp, info, 0)
    if x is None or x.order is not None or "C" not in x.labels:
        return False
    rank = len(x.labels)
    if a.opset >= 13:
        axis = a.get("axis", -1) % rank
        if x.labels[axis] != "C":
            return False
    else:
        axis = a.get("axis", 1) % rank
        if x.labels[axis] != "C" or any(n != 1 for n in x.shape[axis + 1 :]):
            return False
        if any(label in "BT" for label in x.labels[axis + 1 :]):
            return False
    layer = Softmax(
        name=imp.unique(info.node.name), description=f"ONNX Softmax node {info.node.name!r}"
    )
    return _add(imp, info, layer, [info.inputs[0]], out_labels, out_shapes, out_dtypes)


def _dropout(imp, info, out_shapes, out_dtypes, out_labels):
    x = _runtime(imp, info, 0)
    if x is None or any(_used(imp, name) for name in info.outputs[1:]):
        return False
    ratio = info.a.get("ratio", 0.5) if info.a.opset < 12 else _const(info, 1)
    if ratio is None:
        if not _absent(info, 1):
            return False
        ratio = 0.5
    ratio = float(np.asarray(ratio).reshape(()))
    if not 0 <= ratio < 1:
        return False
    layer = Dropout(
        ratio, name=imp.unique(info.node.name), description=f"ONNX Dropout node {info.node.name!r}"
    )
    return _add(imp, info, layer, [info.inputs[0]], out_labels[:1], out_shapes, out_dtypes, x.order)


def _addition(imp, info, out_shapes, out_dtypes, out_labels):
    values = [_runtime(imp, info, i) for i in range(len(info.inputs))]
    if len(values) < 2 or any(v is None or v.order is not None for v in values):
        return False
    if len({v.labels for v in values}) > 1 or len({tuple(v.shape) for v in values}) > 1:
        return False
    if not np.issubdtype(values[0].dtype, np.floating):
        return False
    layer = Addition(
        len(values),
        name=imp.unique(info.node.name),
        description=f"ONNX {info.node.op_type} node {info.node.name!r}",
    )
    return _add(imp, info, layer, list(info.inputs), out_labels, out_shapes, out_dtypes)


def _concat(imp, info, out_shapes, out_dtypes, out_labels):
    values = [_runtime(imp, info, i) for i in range(len(info.inputs))]
    if len(values) < 2 or any(v is None or v.order is not None for v in values):
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
    return _add(imp, info, layer, list(info.inputs), out_labels, out_shapes, out_dtypes)


def _flatten(imp, info, out_shapes, out_dtypes, out_labels):
    x = _runtime(imp, info, 0)
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
    if not (x.labels.startswith("BC") and set(x.labels[2:]) == {"S"}):
        return False
    stored = tuple(x.shape[i] for i in _labels.storage_perm(x.labels))[1:]
    order = None
    if any(n != 1 for n in x.shape[2:]):
        # ONNX flattens (c, h, w); difffn stores (h, w, c): feature j of ONNX is stored order[j]
        positions = np.arange(int(np.prod(stored))).reshape(stored)
        order = np.moveaxis(positions, -1, 0).reshape(-1)
    layer = Flatten(
        name=imp.unique(info.node.name),
        description=f"ONNX {info.node.op_type} node {info.node.name!r} (channels-last order)",
    )
    return _add(imp, info, layer, [info.inputs[0]], ["BC"], out_shapes, out_dtypes, order)


# -- recurrent ------------------------------------------------------------------------------------

_GATE_FUNCTIONS = {"sigmoid": "sigmoid", "hardsigmoid": "hard-sigmoid"}
_STATE_FUNCTIONS = {"tanh": "tanh", "softsign": "softsign"}


def _ifgo(blocks: np.ndarray, hidden: int) -> np.ndarray:
    """ONNX's gate blocks (i, o, f, c) along axis 0, reordered to difffn's (i, f, c, o)."""
    i, o, f, c = (blocks[k * hidden : (k + 1) * hidden] for k in range(4))
    return np.concatenate([i, f, c, o])


def _lstm(imp, info, out_shapes, out_dtypes, out_labels):
    a = info.a
    x = _runtime(imp, info, 0)
    w, r = _const(info, 1), _const(info, 2)
    if x is None or x.order is not None or not (_float(w) and _float(r)):
        return False
    layout = a.get("layout", 0)
    if x.labels != ("BTC" if layout else "TBC") or w.shape[0] != 1:
        return False
    if a.get("direction", "forward") != "forward" or a.get("clip") is not None:
        return False
    if a.get("input_forget", 0) or not all(_absent(info, i) for i in (4, 7)):
        return False
    names = [n.lower() for n in (a.get("activations") or ("Sigmoid", "Tanh", "Tanh"))]
    if a.get("activation_alpha") is not None or a.get("activation_beta") is not None:
        return False
    if len(names) != 3 or names[1] != names[2]:
        return False
    gate, state = _GATE_FUNCTIONS.get(names[0]), _STATE_FUNCTIONS.get(names[1])
    if gate is None or state is None:
        return False
    hidden = int(r.shape[-1])
    initial = []
    for i in (5, 6):
        value = _const(info, i)
        if _absent(info, i):
            initial.append(np.zeros((1, hidden), np.float32))
        elif _float(value) and value.size == hidden:
            initial.append(value.reshape(1, hidden))
        else:
            return False
    outputs = list(info.outputs) + [""] * (3 - len(info.outputs))
    use_y, use_h, use_c = (_used(imp, name) for name in outputs)
    if use_c or (use_y and use_h) or not (use_y or use_h):
        return False
    b = _const(info, 3)
    if _absent(info, 3):
        bias = np.zeros(4 * hidden, w.dtype)
    elif _float(b):
        bias = _ifgo(b[0, : 4 * hidden] + b[0, 4 * hidden :], hidden)
    else:
        return False
    name = imp.unique(info.node.name)
    layer = LSTM(
        hidden,
        output_mode="sequence" if use_y else "last",
        gate_activation_function=gate,
        state_activation_function=state,
        input_weights=_ifgo(w[0], hidden).T,
        recurrent_weights=_ifgo(r[0], hidden).T,
        bias=bias,
        hidden_state=initial[0],
        cell_state=initial[1],
        name=name,
        description=_describe(
            info,
            [
                ("input_weights", _source(info, 1, "iofc -> ifgo, transposed")),
                ("recurrent_weights", _source(info, 2, "iofc -> ifgo, transposed")),
                (
                    "bias",
                    _source(info, 3, "W and R biases summed, iofc -> ifgo")
                    if b is not None
                    else "zeros (the node has none)",
                ),
            ],
        ),  # fmt: skip
    )
    imp.place(layer, [info.inputs[0]])
    # The LSTM gives Y without its direction axis ("TBC" or "BTC"), or Y_h without it ("BC");
    # an Unsqueeze (a reshape of stored data) puts the axis back.
    if use_y:
        inner_labels, axis, target = x.labels, (2 if layout else 1), outputs[0]
        shape = out_shapes[0]
    else:
        inner_labels, axis, target = "BC", (1 if layout else 0), outputs[1]
        shape = out_shapes[1]
    inner_shape = tuple(n for i, n in enumerate(shape) if i != axis)
    inner = f"{target}#difffn-lstm"
    imp.set_output(inner, name, "out", inner_labels, inner_shape, out_dtypes[0])
    _unsqueeze(imp, inner, target, axis, name + "_direction_axis", info.a.opset)
    return True


def _unsqueeze(imp, source: str, target: str, axis: int, name: str, opset: int) -> None:
    from ..layers import FunctionLayer

    value = imp.values[source]
    labels = value.labels[:axis] + "U" + value.labels[axis:]
    shape = value.shape[:axis] + (1,) + value.shape[axis:]
    opset = max(opset, 13)
    fn = NodeFunction(
        "Unsqueeze",
        Attrs("Unsqueeze", (), opset, name, 1),
        (("input", 0, None), ("const", FrozenArray(np.array([axis], np.int64)))),
        (value.labels,),
        (labels,),
        "reshape",
    )
    layer = FunctionLayer(
        fn,
        formattable=True,
        num_inputs=1,
        name=imp.unique(name),
        description=f"the ONNX direction axis of {target!r}",
    )
    imp.place(layer, [source])
    imp.set_output(target, layer.name, "out", labels, shape, value.dtype)


_RULES = {
    "Conv": _conv,
    "MaxPool": _max_pool,
    "GlobalAveragePool": _global_average_pool,
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
    "LSTM": _lstm,
}

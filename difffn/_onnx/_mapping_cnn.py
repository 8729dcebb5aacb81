"""ONNX nodes that become difffn's CNN layers: 1-D and 3-D and transposed convolutions, average
and global max pooling, instance, group and layer normalization, resizing, and activations.

Each rule maps a node only where the layer computes exactly what the node does (padding,
``count_include_pad`` and ``ceil_mode``, epsilon, the axes normalized, rounding modes); any other
node returns False and stays an ``ONNXOperator`` over difffn's implementation of the operator.
Weights are reordered to difffn's channels-last orders (``OIW -> WIO``, ``OIDHW -> DHWIO``, a
transposed convolution's ``IOHW -> HWOI``) and the layer description names their ONNX sources.
"""

from __future__ import annotations

import math
from typing import TypeGuard

import jax.numpy as jnp
import numpy as np

from ..layers import (
    GELU,
    AveragePool2D,
    ClippedReLU,
    Conv1D,
    Conv3D,
    GlobalMaxPool2D,
    GroupNorm,
    Identity,
    InstanceNorm,
    LayerNorm,
    LeakyReLU,
    Multiplication,
    Resize2D,
    Sigmoid,
    Swish,
    Tanh,
    TransposedConv2D,
)
from ._import_values import Runtime
from ._mapping_base import (
    absent,
    add,
    const,
    describe,
    floating,
    runtime,
    shape_of,
    source,
    with_outputs,
)
from ._ops import Unsupported, ints
from ._ops_nn import window_pads
from ._ops_resize import resize_options


def _image(x: Runtime | None, dims: int) -> TypeGuard[Runtime]:
    """An NC + ``dims`` spatial axes tensor, not reordered, of floating point."""
    return (
        x is not None
        and x.labels == "BC" + "S" * dims
        and x.order is None
        and np.issubdtype(x.dtype, np.floating)
    )


def _name(imp, info) -> str:
    return imp.unique(info.node.name)


def _plain(cls, imp, info, out_shapes, out_dtypes, out_labels, description=None, **options):
    """A layer with no learnables on the node's first input (its flattening order kept)."""
    x = runtime(imp, info, 0)
    assert x is not None  # every rule that calls this has checked its input
    layer = cls(
        **options,
        name=_name(imp, info),
        description=description or f"ONNX {info.node.op_type} node {info.node.name!r}",
    )
    return add(imp, info, layer, [info.inputs[0]], out_labels, out_shapes, out_dtypes, x.order)


def _elementwise_input(imp, info):
    x = runtime(imp, info, 0)
    if x is None or not np.issubdtype(x.dtype, np.floating):
        return None
    return x


# -- convolution ---------------------------------------------------------------------------------


def conv(imp, info, out_shapes, out_dtypes, out_labels):
    """Conv over 1 or 3 spatial axes (2 is ``_mapping._conv``'s): ``Conv1D`` / ``Conv3D``."""
    a = info.a
    x, w, b = runtime(imp, info, 0), const(info, 1), const(info, 2)
    if x is not None and x.labels == "BCT" and floating(w) and w.ndim == 3:
        # over time (what df.export_onnx writes for sequences): Conv1D too, where the padding
        # does not depend on the length (a stand-in at import)
        if a.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
            return False
        out_labels = ["BCT"]
    elif x is None or not floating(w) or w.ndim not in (3, 5) or not _image(x, w.ndim - 2):
        return False
    if x.order is not None or not np.issubdtype(x.dtype, np.floating):
        return False
    if int(a.get("group", 1)) != 1 or not (absent(info, 2) or (floating(b) and b.ndim == 1)):
        return False
    dims = w.ndim - 2
    kernel = tuple(int(n) for n in w.shape[2:])
    strides = ints(a.get("strides")) or (1,) * dims
    dilations = ints(a.get("dilations")) or (1,) * dims
    pads, _ = window_pads(a, shape_of(x)[2:], kernel, strides, dilations)
    bias = b if b is not None else np.zeros(w.shape[0], w.dtype)
    if dims == 1:
        cls, weights, how = Conv1D, np.transpose(w, (2, 1, 0)), "OIW -> WIO"
        kernel, strides, dilations, pads = kernel[0], strides[0], dilations[0], tuple(pads[0])
    else:
        cls, weights, how = Conv3D, np.transpose(w, (2, 3, 4, 1, 0)), "OIDHW -> DHWIO"
        pads = tuple(tuple(p) for p in pads)
    layer = cls(
        kernel,
        int(w.shape[0]),
        stride=strides,
        padding=pads,
        dilation=dilations,
        weights=jnp.asarray(weights),
        bias=jnp.asarray(bias),
        name=_name(imp, info),
        description=describe(
            info,
            [
                ("weights", source(info, 1, how)),
                ("bias", source(info, 2) if b is not None else "zeros (the node has none)"),
            ],
        ),
    )
    return add(imp, info, layer, [info.inputs[0]], out_labels, out_shapes, out_dtypes)


def conv_transpose(imp, info, out_shapes, out_dtypes, out_labels):
    """A 2-D ConvTranspose without groups, dilation, output padding or an output shape:
    ``TransposedConv2D`` with ONNX's pads as its cropping."""
    a = info.a
    x, w, b = runtime(imp, info, 0), const(info, 1), const(info, 2)
    if not _image(x, 2) or not floating(w) or w.ndim != 4 or int(a.get("group", 1)) != 1:
        return False
    if any(d != 1 for d in ints(a.get("dilations"))) or any(ints(a.get("output_padding"))):
        return False
    if a.get("output_shape") is not None or a.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        return False
    if not (absent(info, 2) or (floating(b) and b.shape == (w.shape[1],))):
        return False
    flat = ints(a.get("pads")) if a.get("auto_pad", "NOTSET") == "NOTSET" else ()
    flat = flat or (0, 0, 0, 0)
    if min(flat) < 0:
        return False
    num_filters = int(w.shape[1])
    layer = TransposedConv2D(
        tuple(int(n) for n in w.shape[2:]),
        num_filters,
        stride=ints(a.get("strides")) or (1, 1),
        cropping=((flat[0], flat[2]), (flat[1], flat[3])),
        weights=jnp.asarray(np.transpose(w, (2, 3, 1, 0))),
        bias=jnp.asarray(b if b is not None else np.zeros(num_filters, w.dtype)),
        name=_name(imp, info),
        description=describe(
            info,
            [
                ("weights", source(info, 1, "IOHW -> HWOI")),
                ("bias", source(info, 2) if b is not None else "zeros (the node has none)"),
            ],
        ),
    )
    return add(imp, info, layer, [info.inputs[0]], out_labels, out_shapes, out_dtypes)


# -- pooling -------------------------------------------------------------------------------------


def average_pool(imp, info, out_shapes, out_dtypes, out_labels):
    """A 2-D AveragePool: ``count_include_pad=0`` leaves padding out of each average
    (``padding_value="mean"``); ``count_include_pad=1`` counts it as zeros (``0``), which
    ``ceil_mode``'s extra end padding would not be."""
    a = info.a
    x = runtime(imp, info, 0)
    if not _image(x, 2) or any(d != 1 for d in ints(a.get("dilations"))):
        return False
    kernel = ints(a.get("kernel_shape"))
    strides = ints(a.get("strides")) or (1, 1)
    pads, extra = window_pads(
        a, shape_of(x)[2:], kernel, strides, (1, 1), ceil_mode=bool(a.get("ceil_mode", 0))
    )
    include = bool(a.get("count_include_pad", 0))
    if include and any(extra):
        return False
    return _plain(
        AveragePool2D,
        imp,
        info,
        out_shapes,
        out_dtypes,
        out_labels,
        pool_size=kernel,
        stride=strides,
        padding=tuple(tuple(p) for p in pads),
        padding_value=0 if include else "mean",
    )


def global_max_pool(imp, info, out_shapes, out_dtypes, out_labels):
    if not _image(runtime(imp, info, 0), 2):
        return False
    return _plain(GlobalMaxPool2D, imp, info, out_shapes, out_dtypes, out_labels)


# -- normalization -------------------------------------------------------------------------------


def _offset_scale(info, scale_at: int, bias_at: int, channels: int):
    """The node's per-channel scale and bias constants (a zero bias where it has none)."""
    scale, bias = const(info, scale_at), const(info, bias_at)
    if not floating(scale) or scale.shape != (channels,):
        return None
    if bias is None:
        if not absent(info, bias_at):
            return None
        return scale, np.zeros(channels, scale.dtype), "zeros (the node has none)"
    if not floating(bias) or bias.shape != (channels,):
        return None
    return scale, bias, source(info, bias_at)


def _unused_extra_outputs(imp, info) -> bool:
    return not any(imp.consumers.get(name) for name in info.outputs[1:] if name)


def instance_norm(imp, info, out_shapes, out_dtypes, out_labels):
    x = runtime(imp, info, 0)
    if x is None or len(x.labels) < 3 or not _image(x, len(x.labels) - 2):
        return False
    parts = _offset_scale(info, 1, 2, shape_of(x)[1])
    if parts is None:
        return False
    return _normalization(imp, info, InstanceNorm, parts, out_shapes, out_dtypes, out_labels)


def group_norm(imp, info, out_shapes, out_dtypes, out_labels):
    """GroupNormalization (opset 21: per-channel scale and bias; ``onnx.checker`` refuses
    opset 18's per-group ones)."""
    a = info.a
    x = runtime(imp, info, 0)
    if x is None or len(x.labels) < 3 or not _image(x, len(x.labels) - 2):
        return False
    channels, groups = shape_of(x)[1], int(a.get("num_groups"))
    if a.get("stash_type", 1) != 1 or channels % groups:
        return False
    parts = _offset_scale(info, 1, 2, channels)
    if parts is None:
        return False
    return _normalization(
        imp, info, GroupNorm, parts, out_shapes, out_dtypes, out_labels, num_groups=groups
    )


def layer_norm(imp, info, out_shapes, out_dtypes, out_labels):
    """LayerNormalization over the last axis, where that axis is the channels: ``LayerNorm``
    over ``C`` only (``operation_dimension="channel-only"``)."""
    a = info.a
    x = runtime(imp, info, 0)
    if x is None or x.order is not None or not np.issubdtype(x.dtype, np.floating):
        return False
    rank = len(x.labels)
    if a.get("axis", -1) % rank != rank - 1 or x.labels[-1] != "C":
        return False
    if a.get("stash_type", 1) != 1 or not _unused_extra_outputs(imp, info):
        return False
    parts = _offset_scale(info, 1, 2, shape_of(x)[-1])
    if parts is None:
        return False
    return _normalization(
        imp,
        info,
        LayerNorm,
        parts,
        out_shapes,
        out_dtypes,
        out_labels[:1],
        operation_dimension="channel-only",
    )


def _normalization(imp, info, cls, parts, out_shapes, out_dtypes, out_labels, **options):
    scale, bias, bias_source = parts
    epsilon = float(info.a.get("epsilon", 1e-5))
    if not epsilon > 0:
        return False
    layer = cls(
        **options,
        epsilon=epsilon,
        scale=scale,
        offset=bias,
        name=_name(imp, info),
        description=describe(info, [("scale", source(info, 1)), ("offset", bias_source)]),
    )
    return add(imp, info, layer, [info.inputs[0]], out_labels, out_shapes, out_dtypes)


# -- resizing ------------------------------------------------------------------------------------


def resize(imp, info, out_shapes, out_dtypes, out_labels):
    x = runtime(imp, info, 0)
    if not _image(x, 2):
        return False
    try:
        options = resize_options(info.a, x.shape, const(info, 2), const(info, 3))
    except Unsupported:
        return False
    return _plain(Resize2D, imp, info, out_shapes, out_dtypes, out_labels, **options)


# -- activations and merges ----------------------------------------------------------------------


def leaky_relu(imp, info, out_shapes, out_dtypes, out_labels):
    alpha = float(info.a.get("alpha", 0.01))
    if _elementwise_input(imp, info) is None or not math.isfinite(alpha):
        return False
    return _plain(LeakyReLU, imp, info, out_shapes, out_dtypes, out_labels, scale=alpha)


def clip(imp, info, out_shapes, out_dtypes, out_labels):
    """Clip to ``[0, c]`` with ``c > 0``: ``ClippedReLU(c)`` (ReLU6 is ``c = 6``)."""
    a = info.a
    if _elementwise_input(imp, info) is None:
        return False
    if a.opset < 11:
        low, high = a.get("min"), a.get("max")
    else:
        low, high = const(info, 1), const(info, 2)
    if low is None or high is None or np.size(low) != 1 or np.size(high) != 1:
        return False
    low, high = float(np.asarray(low).reshape(())), float(np.asarray(high).reshape(()))
    if low != 0 or not (0 < high < math.inf):
        return False
    return _plain(ClippedReLU, imp, info, out_shapes, out_dtypes, out_labels, ceiling=high)


def tanh(imp, info, out_shapes, out_dtypes, out_labels):
    if _elementwise_input(imp, info) is None:
        return False
    return _plain(Tanh, imp, info, out_shapes, out_dtypes, out_labels)


def sigmoid(imp, info, out_shapes, out_dtypes, out_labels):
    """Sigmoid; ``x * Sigmoid(x)`` (the Mul its only consumer) is ``Swish``."""
    x = _elementwise_input(imp, info)
    if x is None:
        return False
    users = imp.consumers.get(info.outputs[0], [])
    if len(users) == 1 and users[0][0] is not None and users[0][0].op_type == "Mul":
        mul = users[0][0]
        if len(mul.inputs) == 2 and mul.inputs[1 - users[0][1]] == info.inputs[0]:
            imp.skip.add(id(mul))
            fused = f"ONNX Sigmoid node {info.node.name!r} times its input (Mul node {mul.name!r})"
            info = with_outputs(info, mul.outputs)
            return _plain(Swish, imp, info, out_shapes, out_dtypes, out_labels, fused)
    return _plain(Sigmoid, imp, info, out_shapes, out_dtypes, out_labels)


def swish(imp, info, out_shapes, out_dtypes, out_labels):
    if _elementwise_input(imp, info) is None or info.a.get("alpha", 1.0) != 1:
        return False
    return _plain(Swish, imp, info, out_shapes, out_dtypes, out_labels)


def gelu(imp, info, out_shapes, out_dtypes, out_labels):
    approximation = info.a.get("approximate", "none")
    if _elementwise_input(imp, info) is None or approximation not in ("none", "tanh"):
        return False
    return _plain(GELU, imp, info, out_shapes, out_dtypes, out_labels, approximation=approximation)


def identity(imp, info, out_shapes, out_dtypes, out_labels):
    if runtime(imp, info, 0) is None:
        return False
    return _plain(Identity, imp, info, out_shapes, out_dtypes, out_labels)


def multiplication(imp, info, out_shapes, out_dtypes, out_labels):
    """Mul of two runtime tensors of one format: ``Multiplication`` (size-1 axes broadcast,
    except batch and time, whose sizes are stand-ins at import)."""
    found = [runtime(imp, info, i) for i in range(len(info.inputs))]
    values = [v for v in found if v is not None and v.order is None]
    if len(found) != 2 or len(values) < len(found):
        return False
    first, second = values
    if first.labels != second.labels or not np.issubdtype(first.dtype, np.floating):
        return False
    for label, m, n in zip(first.labels, shape_of(first), shape_of(second)):
        if m != n and (label in "BT" or 1 not in (m, n)):
            return False
    layer = Multiplication(
        2, name=_name(imp, info), description=f"ONNX Mul node {info.node.name!r}"
    )
    return add(imp, info, layer, list(info.inputs), out_labels, out_shapes, out_dtypes)


RULES = {
    "ConvTranspose": conv_transpose,
    "AveragePool": average_pool,
    "GlobalMaxPool": global_max_pool,
    "InstanceNormalization": instance_norm,
    "GroupNormalization": group_norm,
    "LayerNormalization": layer_norm,
    "Resize": resize,
    "LeakyRelu": leaky_relu,
    "Clip": clip,
    "Tanh": tanh,
    "Sigmoid": sigmoid,
    "Swish": swish,
    "Gelu": gelu,
    "Identity": identity,
    "Mul": multiplication,
}

"""Neural-network ONNX operators: convolution, pooling, normalization, softmax, Gemm, MatMul.

Inputs are in ONNX's order (``N, C, D1, ..., Dk`` for images; weights ``O, I/group, k1, ...``).
The convolutions and pools are ``jax.lax.conv_general_dilated`` and ``jax.lax.reduce_window``
with ONNX's padding rules (``auto_pad``, ``ceil_mode``) worked out from the static sizes.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import _labels
from ._ops import Attrs, Unsupported, aligned, axis_of, floating, ints, op, require_float

_SPEC = {1: "H", 2: "HW", 3: "DHW"}


def _check_image(a: Attrs, node, *, rank_from=0) -> None:
    require_float(a, node)
    shape = node.input_shapes[rank_from]
    if shape is not None and not 3 <= len(shape) <= 5:
        raise Unsupported(f"{a.op_type} on a rank-{len(shape)} input (1-, 2- or 3-D images only)")
    if a.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
        raise Unsupported(f"auto_pad={a.get('auto_pad')!r}")


def same_pads(size, kernel, stride, dilation, lower=False):
    """ONNX's SAME_UPPER (extra padding at the end) or SAME_LOWER, for one axis."""
    extent = (kernel - 1) * dilation + 1
    out = -(-size // stride)
    total = max((out - 1) * stride + extent - size, 0)
    small = total // 2
    return (total - small, small) if lower else (small, total - small)


def window_pads(a: Attrs, spatial, kernel, strides, dilations, *, ceil_mode=False):
    """Per spatial axis ``(begin, end)`` padding, from ``auto_pad``/``pads`` and ``ceil_mode``.

    With ``ceil_mode`` the end padding grows so that the last (partial) window exists, as long
    as it starts inside the input or its begin padding (ONNX Runtime's and PyTorch's rule).
    Returns ``(pads, extra)``: ``extra`` is the part of the end padding that ``ceil_mode``
    added (pools do not count it in averages).
    """
    k = len(spatial)
    auto_pad = a.get("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = [
            same_pads(n, f, s, d, lower=auto_pad == "SAME_LOWER")
            for n, f, s, d in zip(spatial, kernel, strides, dilations)
        ]
        return pads, [0] * k
    flat = ints(a.get("pads")) if auto_pad == "NOTSET" else ()
    flat = flat or (0,) * (2 * k)
    pads = [(flat[i], flat[i + k]) for i in range(k)]
    extra = [0] * k
    if ceil_mode:
        for i, (n, f, s, d) in enumerate(zip(spatial, kernel, strides, dilations)):
            extent = (f - 1) * d + 1
            padded = n + pads[i][0] + pads[i][1]
            out = -(-(padded - extent) // s) + 1
            if (out - 1) * s >= n + pads[i][0]:
                out -= 1
            extra[i] = max((out - 1) * s + extent - padded, 0)
            pads[i] = (pads[i][0], pads[i][1] + extra[i])
    return pads, extra


# -- convolution -----------------------------------------------------------------------------------


def _check_conv(a, node):
    _check_image(a, node)


@op("Conv", check=_check_conv, labels=_labels.image)
def conv(a, x, w, b=None):
    k = x.ndim - 2
    strides = ints(a.get("strides")) or (1,) * k
    dilations = ints(a.get("dilations")) or (1,) * k
    kernel = w.shape[2:]
    pads, _ = window_pads(a, x.shape[2:], kernel, strides, dilations)
    spec = _SPEC[k]
    dtype = jnp.result_type(x, w)
    y = lax.conv_general_dilated(
        x.astype(dtype),
        w.astype(dtype),
        window_strides=strides,
        padding=pads,
        rhs_dilation=dilations,
        dimension_numbers=("NC" + spec, "OI" + spec, "NC" + spec),
        feature_group_count=int(a.get("group", 1)),
    )
    if b is not None:
        y = y + jnp.reshape(b.astype(dtype), (1, -1) + (1,) * k)
    return y


@op("ConvTranspose", check=_check_conv, labels=_labels.image)
def conv_transpose(a, x, w, b=None):
    k = x.ndim - 2
    groups = int(a.get("group", 1))
    strides = ints(a.get("strides")) or (1,) * k
    dilations = ints(a.get("dilations")) or (1,) * k
    output_padding = ints(a.get("output_padding")) or (0,) * k
    kernel = w.shape[2:]
    spatial = x.shape[2:]
    extents = [(f - 1) * d + 1 for f, d in zip(kernel, dilations)]
    full = [
        s * (n - 1) + extra + e for s, n, extra, e in zip(strides, spatial, output_padding, extents)
    ]
    auto_pad = a.get("auto_pad", "NOTSET")
    output_shape = ints(a.get("output_shape"))
    if not output_shape and auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        output_shape = tuple(n * s for n, s in zip(spatial, strides))
    if output_shape:
        output_shape = output_shape[-k:]
        pads = []
        for total in (f - o for f, o in zip(full, output_shape)):
            small = total // 2
            upper = auto_pad == "SAME_UPPER"
            pads.append((small, total - small) if upper else (total - small, small))
    elif auto_pad == "VALID":
        pads = [(0, 0)] * k
    else:
        flat = ints(a.get("pads")) or (0,) * (2 * k)
        pads = [(flat[i], flat[i + k]) for i in range(k)]
    # A transposed convolution is a convolution of the stride-dilated input with the flipped
    # kernel, input and output channels swapped within each group.
    c_in, c_out_group = w.shape[0], w.shape[1]
    kernel_oi = jnp.reshape(w, (groups, c_in // groups, c_out_group, *kernel))
    kernel_oi = jnp.swapaxes(kernel_oi, 1, 2)
    kernel_oi = kernel_oi.reshape(groups * c_out_group, c_in // groups, *kernel)
    kernel_oi = jnp.flip(kernel_oi, axis=tuple(range(2, 2 + k)))
    conv_pads = [
        (e - 1 - lo, e - 1 - hi + extra)
        for e, (lo, hi), extra in zip(extents, pads, output_padding)
    ]
    positive = [(max(lo, 0), max(hi, 0)) for lo, hi in conv_pads]
    dtype = jnp.result_type(x, w)
    spec = _SPEC[k]
    y = lax.conv_general_dilated(
        x.astype(dtype),
        kernel_oi.astype(dtype),
        window_strides=(1,) * k,
        padding=positive,
        lhs_dilation=strides,
        rhs_dilation=dilations,
        dimension_numbers=("NC" + spec, "OI" + spec, "NC" + spec),
        feature_group_count=groups,
    )
    crop = tuple(
        slice(max(-lo, 0), y.shape[2 + i] - max(-hi, 0)) for i, (lo, hi) in enumerate(conv_pads)
    )
    y = y[(slice(None), slice(None), *crop)]
    if b is not None:
        y = y + jnp.reshape(b.astype(dtype), (1, -1) + (1,) * k)
    return y


# -- pooling ---------------------------------------------------------------------------------------


def _check_pool(a, node):
    if a.op_type != "MaxPool":
        require_float(a, node)
    shape = node.input_shapes[0]
    if shape is not None and not 3 <= len(shape) <= 5:
        raise Unsupported(f"{a.op_type} on a rank-{len(shape)} input (1-, 2- or 3-D images only)")
    if a.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
        raise Unsupported(f"auto_pad={a.get('auto_pad')!r}")
    if len(node.outputs) > 1 and node.outputs[1]:
        raise Unsupported(f"{a.op_type} with the Indices output")
    if a.get("storage_order", 0):
        raise Unsupported("MaxPool storage_order=1")


def _pool_setup(a, x):
    kernel = ints(a.get("kernel_shape"))
    k = len(kernel)
    strides = ints(a.get("strides")) or (1,) * k
    dilations = ints(a.get("dilations")) or (1,) * k
    pads, extra = window_pads(
        a, x.shape[2:], kernel, strides, dilations, ceil_mode=bool(a.get("ceil_mode", 0))
    )
    window = (1, 1, *kernel)
    all_strides = (1, 1, *strides)
    all_dilations = (1, 1, *dilations)
    all_pads = ((0, 0), (0, 0), *pads)
    return window, all_strides, all_dilations, all_pads, extra


@op("MaxPool", check=_check_pool, labels=_labels.image)
def max_pool(a, x):
    window, strides, dilations, pads, _ = _pool_setup(a, x)
    lowest = -np.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).min
    # a concrete (NumPy) initial value: JAX then writes reduce_window_max, which exports
    return lax.reduce_window(
        x, np.array(lowest, x.dtype), lax.max, window, strides, pads, window_dilation=dilations
    )


@op("AveragePool", check=_check_pool, labels=_labels.image)
def average_pool(a, x):
    window, strides, dilations, pads, extra = _pool_setup(a, x)
    x = floating(x)
    total = lax.reduce_window(
        x, np.zeros((), x.dtype), lax.add, window, strides, pads, window_dilation=dilations
    )
    if a.get("count_include_pad", 0):
        # explicit padding counts, the ceil_mode extension does not
        shape = [n + lo + hi - e for n, (lo, hi), e in zip(x.shape[2:], pads[2:], extra)]
        ones = jnp.ones((1, 1, *shape), x.dtype)
        count_pads = ((0, 0), (0, 0), *((0, e) for e in extra))
    else:
        ones = jnp.ones((1, 1, *x.shape[2:]), x.dtype)
        count_pads = pads
    count = lax.reduce_window(
        ones, np.zeros((), x.dtype), lax.add, window, strides, count_pads,
        window_dilation=dilations,
    )  # fmt: skip
    return total / count


@op("LpPool", check=_check_pool, labels=_labels.image)
def lp_pool(a, x):
    window, strides, dilations, pads, _ = _pool_setup(a, x)
    p = float(a.get("p", 2))
    total = lax.reduce_window(
        jnp.abs(x) ** p, np.zeros((), x.dtype), lax.add, window, strides, pads,
        window_dilation=dilations,
    )  # fmt: skip
    return total ** (1 / p)


@op("GlobalAveragePool", check=_check_image, labels=_labels.image)
def global_average_pool(a, x):
    return jnp.mean(x, axis=tuple(range(2, x.ndim)), keepdims=True)


@op("GlobalMaxPool", check=_check_image, labels=_labels.image)
def global_max_pool(a, x):
    return jnp.max(x, axis=tuple(range(2, x.ndim)), keepdims=True)


@op("GlobalLpPool", check=_check_image, labels=_labels.image)
def global_lp_pool(a, x):
    p = float(a.get("p", 2))
    return jnp.sum(jnp.abs(x) ** p, axis=tuple(range(2, x.ndim)), keepdims=True) ** (1 / p)


# -- normalization ---------------------------------------------------------------------------------


def _per_channel(v, ndim):
    return jnp.reshape(v, (1, -1) + (1,) * (ndim - 2))


def _check_batchnorm(a, node):
    require_float(a, node)
    if a.opset < 9 and not a.get("spatial", 1):
        raise Unsupported("BatchNormalization spatial=0")


@op("BatchNormalization", check=_check_batchnorm, labels=_labels.keep)
def batch_normalization(a, x, scale, bias, mean, var):
    epsilon = a.get("epsilon", 1e-5)
    if not a.get("training_mode", 0):
        inv = lax.rsqrt(_per_channel(var, x.ndim) + epsilon)
        y = (x - _per_channel(mean, x.ndim)) * inv * _per_channel(scale, x.ndim)
        return y + _per_channel(bias, x.ndim)
    axes = (0, *range(2, x.ndim))
    batch_mean = jnp.mean(x, axis=axes)
    batch_var = jnp.var(x, axis=axes)
    inv = lax.rsqrt(_per_channel(batch_var, x.ndim) + epsilon)
    y = (x - _per_channel(batch_mean, x.ndim)) * inv * _per_channel(scale, x.ndim)
    y = y + _per_channel(bias, x.ndim)
    momentum = a.get("momentum", 0.9)
    running_mean = mean * momentum + batch_mean * (1 - momentum)
    running_var = var * momentum + batch_var * (1 - momentum)
    return y, running_mean.astype(mean.dtype), running_var.astype(var.dtype)


@op("InstanceNormalization", check=require_float, labels=_labels.keep)
def instance_normalization(a, x, scale, bias):
    axes = tuple(range(2, x.ndim))
    mean = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.var(x, axis=axes, keepdims=True)
    y = (x - mean) * lax.rsqrt(var + a.get("epsilon", 1e-5))
    return y * _per_channel(scale, x.ndim) + _per_channel(bias, x.ndim)


def _stash(a, x):
    stash = a.get("stash_type", 1)
    if stash == 1:
        return jnp.promote_types(x.dtype, jnp.float32)
    if stash == 11:
        return jax.dtypes.canonicalize_dtype(np.float64)
    raise Unsupported(f"stash_type={stash}")


def _check_layernorm(a, node):
    require_float(a, node)
    if a.get("stash_type", 1) not in (1, 11):
        raise Unsupported(f"stash_type={a.get('stash_type')}")


@op("LayerNormalization", check=_check_layernorm, labels=_labels.keep)
def layer_normalization(a, x, scale, bias=None):
    axis = axis_of(a.get("axis", -1), x.ndim)
    axes = tuple(range(axis, x.ndim))
    work = x.astype(_stash(a, x))
    mean = jnp.mean(work, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(work - mean), axis=axes, keepdims=True)
    inv = lax.rsqrt(var + a.get("epsilon", 1e-5))
    y, scale = aligned(((work - mean) * inv).astype(x.dtype), scale)
    y = y * scale
    if bias is not None:
        y, bias = aligned(y, bias)
        y = y + bias
    return y, mean, inv


def _check_groupnorm(a, node):
    require_float(a, node)
    if a.get("stash_type", 1) not in (1, 11):
        raise Unsupported(f"stash_type={a.get('stash_type')}")


@op("GroupNormalization", check=_check_groupnorm, labels=_labels.keep)
def group_normalization(a, x, scale, bias):
    groups = int(a.get("num_groups"))
    n, c = x.shape[:2]
    work = x.astype(_stash(a, x)).reshape(n, groups, -1)
    mean = jnp.mean(work, axis=2, keepdims=True)
    var = jnp.var(work, axis=2, keepdims=True)
    y = ((work - mean) * lax.rsqrt(var + a.get("epsilon", 1e-5))).reshape(x.shape).astype(x.dtype)
    if a.opset < 21:  # opset 18: one scale and bias per group
        scale, bias = jnp.repeat(scale, c // groups), jnp.repeat(bias, c // groups)
    return y * _per_channel(scale, x.ndim) + _per_channel(bias, x.ndim)


@op("LRN", check=require_float, labels=_labels.keep)
def lrn(a, x):
    size = int(a.get("size"))
    alpha, beta, bias = a.get("alpha", 1e-4), a.get("beta", 0.75), a.get("bias", 1.0)
    window = (1, size) + (1,) * (x.ndim - 2)
    pads = ((0, 0), ((size - 1) // 2, size - 1 - (size - 1) // 2)) + ((0, 0),) * (x.ndim - 2)
    square_sum = lax.reduce_window(
        jnp.square(x), np.zeros((), x.dtype), lax.add, window, (1,) * x.ndim, pads
    )
    return x / (bias + alpha / size * square_sum) ** beta


@op("LpNormalization", check=require_float, labels=_labels.keep)
def lp_normalization(a, x):
    axis = axis_of(a.get("axis", -1), x.ndim)
    p = int(a.get("p", 2))
    if p == 1:
        norm = jnp.sum(jnp.abs(x), axis=axis, keepdims=True)
    else:
        norm = jnp.sqrt(jnp.sum(jnp.square(x), axis=axis, keepdims=True))
    safe = jnp.where(norm == 0, 1, norm)
    return jnp.where(norm == 0, jnp.zeros((), x.dtype), x / safe)  # 0 / 0 is 0 in ONNX


@op("MeanVarianceNormalization", check=require_float, labels=_labels.keep)
def mean_variance_normalization(a, x):
    axes = tuple(axis_of(i, x.ndim) for i in (ints(a.get("axes")) or (0, 2, 3)))
    mean = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(x), axis=axes, keepdims=True) - jnp.square(mean)
    return (x - mean) / (jnp.sqrt(var) + 1e-9)


# -- softmax family --------------------------------------------------------------------------------


def _softmax_like(fn):
    def impl(a, x):
        x = floating(x)
        if a.opset >= 13:
            return fn(x, axis_of(a.get("axis", -1), x.ndim))
        axis = axis_of(a.get("axis", 1), x.ndim)
        flat = jnp.reshape(x, (math.prod(x.shape[:axis]), -1))
        return jnp.reshape(fn(flat, 1), x.shape)

    return impl


def _hardmax(x, axis):
    return jax.nn.one_hot(jnp.argmax(x, axis=axis), x.shape[axis], axis=axis, dtype=x.dtype)


op("Softmax", check=require_float, labels=_labels.keep)(_softmax_like(jax.nn.softmax))
op("LogSoftmax", check=require_float, labels=_labels.keep)(_softmax_like(jax.nn.log_softmax))
op("Hardmax", check=require_float, labels=_labels.keep)(_softmax_like(_hardmax))


def _check_dropout(a, node):
    if a.opset < 7 and not a.get("is_test", 0):
        raise Unsupported("Dropout in training mode (is_test=0)")
    if len(node.inputs) > 2 and node.inputs[2]:
        if node.input_kinds[2] != "const":
            raise Unsupported("Dropout with a training_mode computed at run time")
        if bool(np.asarray(node.input_values[2])):
            raise Unsupported("Dropout with training_mode=True (random masks cannot match)")


@op("Dropout", static=(1, 2), check=_check_dropout, labels=_labels.keep)
def dropout(a, x, ratio=None, training_mode=None):
    return x, jnp.ones(x.shape, bool)


# -- matrix products -------------------------------------------------------------------------------


@op("MatMul", labels=_labels.matmul)
def matmul(a, x, y):
    return jnp.matmul(x, y)


@op("Gemm", labels=_labels.matmul)
def gemm(a, x, y, c=None):
    if a.get("transA", 0):
        x = x.T
    if a.get("transB", 0):
        y = y.T
    out = a.get("alpha", 1.0) * jnp.matmul(x, y)
    if c is not None:
        out, c = aligned(out, c)
        out = out + a.get("beta", 1.0) * c
    return out.astype(jnp.result_type(x, y))


@op("Einsum")
def einsum(a, *xs):
    return jnp.einsum(a.get("equation").replace(" ", ""), *xs)

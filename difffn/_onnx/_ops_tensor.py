"""ONNX operators that move data around: reshapes, slices, gathers, padding, shapes, constants.

Shapes, axes, pads, repeats and the like are static inputs (NumPy arrays known while tracing);
``Shape``, ``Size``, ``ConstantOfShape``, ``Range`` and ``Constant`` return NumPy arrays, so the
importer can fold them, or evaluate them from the static shapes of traced arrays.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from . import _labels
from ._ops import Attrs, Unsupported, axis_of, ints, jax_dtype, op


def axes_argument(a: Attrs, values, index: int, *, since: int, rank: int):
    """Axes from the attribute (before opset ``since``) or the static input ``index``."""
    if a.opset < since:
        axes = a.get("axes")
    else:
        axes = values[index] if len(values) > index else None
    if axes is None:
        return None
    return tuple(sorted(axis_of(i, rank, "axes") for i in ints(axes)))


# -- reshapes ----------------------------------------------------------------------------------


def reshape_target(in_shape, shape, allowzero=False) -> tuple[int, ...]:
    """ONNX's Reshape target: 0 copies the input size (unless ``allowzero``), -1 is inferred."""
    out = [int(in_shape[i]) if (s == 0 and not allowzero) else int(s) for i, s in enumerate(shape)]
    if out.count(-1) > 1:
        raise Unsupported(f"Reshape to {list(shape)} has more than one -1")
    if -1 in out:
        known = math.prod(n for n in out if n != -1)
        total = math.prod(in_shape)
        out[out.index(-1)] = total // known if known else 0
    if math.prod(out) != math.prod(in_shape):
        raise Unsupported(f"Reshape of shape {tuple(in_shape)} to {list(shape)}")
    return tuple(out)


@op("Reshape", static=(1,), labels=_labels.reshape)
def reshape(a, x, shape):
    return jnp.reshape(x, reshape_target(x.shape, ints(shape), a.get("allowzero", 0)))


def flatten_axis(a, rank: int) -> int:
    """Flatten's axis: in [-rank, rank], negative counting from the end."""
    axis = int(a.get("axis", 1))
    if not -rank <= axis <= rank:
        raise Unsupported(f"Flatten axis={axis} for rank {rank}")
    return axis + rank if axis < 0 else axis


@op("Flatten", labels=_labels.reshape)
def flatten(a, x):
    axis = flatten_axis(a, x.ndim)
    return jnp.reshape(x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))


@op("Transpose", labels=_labels.transpose)
def transpose(a, x):
    perm = ints(a.get("perm")) or tuple(reversed(range(x.ndim)))
    return jnp.transpose(x, perm)


def _squeeze_axes(ctx):
    axes = axes_argument(ctx.a, ctx.values, 1, since=13, rank=len(ctx.labels[0]))
    if axes is None:
        return tuple(i for i, n in enumerate(ctx.shapes[0]) if n == 1)
    return axes


@op("Squeeze", static=(1,), labels=_labels.dropped(_squeeze_axes))
def squeeze(a, x, axes=None):
    found = axes_argument(a, (None, axes), 1, since=13, rank=x.ndim)
    if found is None:
        found = tuple(i for i, n in enumerate(x.shape) if n == 1)
    return jnp.squeeze(x, found)


def _unsqueeze_axes(ctx):
    rank = len(ctx.labels[0])
    values = ctx.values
    raw = ctx.a.get("axes") if ctx.a.opset < 13 else values[1]
    return tuple(axis_of(i, rank + len(ints(raw))) for i in ints(raw))


@op("Unsqueeze", static=(1,), labels=_labels.inserted(_unsqueeze_axes))
def unsqueeze(a, x, axes=None):
    raw = ints(a.get("axes") if a.opset < 13 else axes)
    rank = x.ndim + len(raw)
    # a constant folded at import stays NumPy: jnp would compile a program per weight shape
    xp = np if isinstance(x, np.ndarray) else jnp
    return xp.expand_dims(x, tuple(sorted(axis_of(i, rank) for i in raw)))


# -- joining and splitting ------------------------------------------------------------------------


@op("Concat", labels=_labels.keep)
def concat(a, *xs):
    xs = [x for x in xs if x is not None]
    axis = axis_of(a.get("axis"), xs[0].ndim)
    return jnp.concatenate(xs, axis=axis)


@op("Split", static=(1,), labels=_labels.keep)
def split(a, x, split_sizes=None):
    axis = axis_of(a.get("axis", 0), x.ndim)
    sizes = ints(a.get("split")) if a.opset < 13 else ints(split_sizes)
    if not sizes:
        n = a.num_outputs if a.get("num_outputs") is None else int(a.get("num_outputs"))
        chunk = -(-x.shape[axis] // n)
        sizes = [min(chunk, x.shape[axis] - i * chunk) for i in range(n)]
    points = np.cumsum(sizes)[:-1]
    return tuple(jnp.split(x, points, axis=axis))


@op("Slice", static=(1, 2, 3, 4), labels=_labels.keep)
def slice_(a, x, starts=None, ends=None, axes=None, steps=None):
    if a.opset < 10:
        starts, ends, axes = a.get("starts"), a.get("ends"), a.get("axes")
    starts, ends = ints(starts), ints(ends)
    axes = ints(axes) or tuple(range(len(starts)))
    steps = ints(steps) or (1,) * len(starts)
    index = [slice(None)] * x.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps):
        if step == 0:
            raise Unsupported("Slice with a step of 0")
        index[axis_of(axis, x.ndim)] = slice(start, end, step)  # Python's clamping is ONNX's
    return x[tuple(index)]


# -- gathering and scattering ----------------------------------------------------------------------


def _wrap(indices, size):
    """Negative indices count from the end of an axis of ``size`` (per last index axis)."""
    indices = jnp.asarray(indices)
    size = jnp.reshape(jnp.asarray(size), (1,) * (indices.ndim - jnp.ndim(size)) + jnp.shape(size))
    return jnp.where(indices < 0, indices + size, indices)


def _gather_labels(ctx):
    data, indices = ctx.labels[0], ctx.labels[1]
    axis = axis_of(ctx.a.get("axis", 0), len(data))
    return [_labels.valid(data[:axis] + indices + data[axis + 1 :])]


@op("Gather", labels=_gather_labels)
def gather(a, x, indices):
    axis = axis_of(a.get("axis", 0), x.ndim)
    return jnp.take(x, _wrap(indices, x.shape[axis]), axis=axis)


@op("GatherElements", labels=_labels.keep)
def gather_elements(a, x, indices):
    axis = axis_of(a.get("axis", 0), x.ndim)
    return jnp.take_along_axis(x, _wrap(indices, x.shape[axis]), axis=axis)


@op("GatherND")
def gather_nd(a, x, indices):
    batch_dims = int(a.get("batch_dims", 0))

    def gather_one(data, idx):
        k = idx.shape[-1]
        idx = _wrap(idx, jnp.asarray(data.shape[:k]))
        return data[tuple(idx[..., i] for i in range(k))]

    fn = gather_one
    for _ in range(batch_dims):
        fn = jax.vmap(fn)
    return fn(x, jnp.asarray(indices))


def _scatter(data, where, updates, reduction):
    at = data.at[where]
    if reduction == "none":
        return at.set(updates)
    if reduction == "add":
        return at.add(updates)
    if reduction == "mul":
        return at.multiply(updates)
    if reduction == "max":
        return at.max(updates)
    if reduction == "min":
        return at.min(updates)
    raise Unsupported(f"reduction={reduction!r}")


@op("ScatterElements", "Scatter", labels=_labels.keep)
def scatter_elements(a, data, indices, updates):
    axis = axis_of(a.get("axis", 0), data.ndim)
    indices = _wrap(indices, data.shape[axis])
    grid = list(jnp.meshgrid(*(jnp.arange(n) for n in indices.shape), indexing="ij"))
    grid[axis] = indices
    return _scatter(data, tuple(grid), updates, a.get("reduction", "none"))


@op("ScatterND", labels=_labels.keep)
def scatter_nd(a, data, indices, updates):
    indices = jnp.asarray(indices)
    k = indices.shape[-1]
    indices = _wrap(indices, jnp.asarray(data.shape[:k]))
    where = tuple(indices[..., i] for i in range(k))
    return _scatter(data, where, updates, a.get("reduction", "none"))


# -- broadcasting, tiling, padding -----------------------------------------------------------------


@op("Expand", static=(1,))
def expand(a, x, shape):
    return jnp.broadcast_to(x, np.broadcast_shapes(x.shape, ints(shape)))


@op("Tile", static=(1,), labels=_labels.keep)
def tile(a, x, repeats):
    return jnp.tile(x, ints(repeats))


_PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "edge", "wrap": "wrap"}


def _check_pad(a, node):
    if a.get("mode", "constant") not in _PAD_MODES:
        raise Unsupported(f"Pad mode={a.get('mode')!r}")


@op("Pad", static=(1, 2, 3), check=_check_pad, labels=_labels.keep)
def pad(a, x, pads=None, constant_value=None, axes=None):
    if a.opset < 11:
        pads, value = ints(a.get("pads")), a.get("value", 0.0)
    else:
        pads = ints(pads)
        value = 0 if constant_value is None or not np.size(constant_value) else constant_value
    rank = x.ndim
    axes = tuple(axis_of(i, rank) for i in ints(axes)) or tuple(range(rank))
    k = len(axes)
    widths = [(0, 0)] * rank
    for i, axis in enumerate(axes):
        widths[axis] = (pads[i], pads[i + k])
    # negative pads crop
    crop = tuple(slice(max(-lo, 0), n - max(-hi, 0)) for (lo, hi), n in zip(widths, x.shape))
    x = x[crop]
    widths = [(max(lo, 0), max(hi, 0)) for lo, hi in widths]
    mode = _PAD_MODES[a.get("mode", "constant")]
    if mode == "constant":
        return jnp.pad(x, widths, constant_values=jnp.asarray(value).astype(x.dtype).reshape(()))
    return jnp.pad(x, widths, mode=mode)


# -- shapes and constants --------------------------------------------------------------------------


@op("Shape", meta={0: "shape"})
def shape(a, x):
    rank = len(x.shape)
    start = a.get("start", 0)
    end = a.get("end", rank)
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    return np.array(x.shape[start:end], np.int64)


@op("Size", meta={0: "shape"})
def size(a, x):
    return np.array(math.prod(x.shape), np.int64)


@op("ConstantOfShape", static=(0,))
def constant_of_shape(a, shape):
    value = a.get("value")
    value = np.zeros(1, np.float32) if value is None else np.asarray(value)
    return np.full(ints(shape), value.reshape(-1)[0], value.dtype)


def _check_constant(a, node):
    for name in ("sparse_value", "value_string", "value_strings"):
        if name in a:
            raise Unsupported(f"Constant with {name}")


@op("Constant", check=_check_constant)
def constant(a):
    if "value" in a:
        return np.asarray(a.get("value"))
    for name, dtype in (
        ("value_float", np.float32),
        ("value_floats", np.float32),
        ("value_int", np.int64),
        ("value_ints", np.int64),
    ):
        if name in a:
            return np.asarray(a.get(name), dtype)
    raise Unsupported("Constant without a value")


@op("Range", static=(0, 1, 2))
def range_(a, start, limit, delta):
    start, limit, delta = (np.asarray(v).reshape(()) for v in (start, limit, delta))
    count = max(int(np.ceil((limit - start) / delta)), 0)
    return (start + np.arange(count, dtype=start.dtype) * delta).astype(start.dtype)


@op("EyeLike", meta={0: "shape"})
def eye_like(a, x):
    dtype = np.float32 if a.get("dtype") is None else jax_dtype(a.get("dtype"))
    return np.eye(x.shape[0], x.shape[1], k=int(a.get("k", 0)), dtype=dtype)


# -- rearrangements --------------------------------------------------------------------------------


@op("DepthToSpace", labels=_labels.keep)
def depth_to_space(a, x):
    b = int(a.get("blocksize"))
    n, c, h, w = x.shape
    if a.get("mode", "DCR") == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return y.reshape(n, c // (b * b), h * b, w * b)


@op("SpaceToDepth", labels=_labels.keep)
def space_to_depth(a, x):
    b = int(a.get("blocksize"))
    n, c, h, w = x.shape
    y = x.reshape(n, c, h // b, b, w // b, b)
    if a.get("mode", "DCR") == "DCR":
        y = y.transpose(0, 3, 5, 1, 2, 4)
    else:
        y = y.transpose(0, 1, 3, 5, 2, 4)
    return y.reshape(n, c * b * b, h // b, w // b)


@op("Trilu", static=(1,), labels=_labels.keep)
def trilu(a, x, k=None):
    k = int(np.asarray(k).reshape(())) if k is not None and np.size(k) else 0
    return jnp.triu(x, k) if a.get("upper", 1) else jnp.tril(x, k)


@op("CumSum", static=(1,), labels=_labels.keep)
def cumsum(a, x, axis):
    axis = axis_of(int(np.asarray(axis).reshape(())), x.ndim)
    if a.get("reverse", 0):
        x = jnp.flip(x, axis)
    y = jnp.cumsum(x, axis=axis)
    if a.get("exclusive", 0):
        y = y - x
    return jnp.flip(y, axis) if a.get("reverse", 0) else y


@op("OneHot", static=(1,))
def one_hot(a, indices, depth, values):
    depth = int(np.asarray(depth).reshape(()))
    axis = axis_of(a.get("axis", -1), jnp.ndim(indices) + 1)
    indices = jnp.asarray(indices)
    if not jnp.issubdtype(indices.dtype, jnp.integer):
        indices = indices.astype(jnp.int32)  # ONNX allows any numeric type
    indices = jnp.where(indices < 0, indices + depth, indices)
    hot = jax.nn.one_hot(indices, depth, axis=axis, dtype=bool)
    return jnp.where(hot, values[1], values[0])


def _check_topk(a, node):
    if node.input_kinds[1] == "runtime":
        raise Unsupported("TopK with k computed at run time")


@op("TopK", static=(1,), check=_check_topk, labels=_labels.keep)
def top_k(a, x, k):
    k = int(np.asarray(k).reshape(-1)[0]) if a.opset >= 10 else int(a.get("k"))
    axis = axis_of(a.get("axis", -1), x.ndim)
    moved = jnp.moveaxis(x, axis, -1)
    # stable order of ties: the lower index first, as ONNX requires
    descending = bool(a.get("largest", 1))
    order = jnp.argsort(moved, axis=-1, stable=True, descending=descending)[..., :k]
    values = jnp.take_along_axis(moved, order, axis=-1)
    return jnp.moveaxis(values, -1, axis), jnp.moveaxis(order, -1, axis)

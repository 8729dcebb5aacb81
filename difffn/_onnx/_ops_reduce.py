"""ONNX reductions: ``Reduce*`` over axes, ``ArgMax`` and ``ArgMin``.

The axes are an attribute before opset 13 (``ReduceSum``) or 18 (the others) and a static input
since; ``noop_with_empty_axes`` keeps the input when no axes are given.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.scipy.special import logsumexp

from ._ops import axis_of, floating, op
from ._ops_tensor import axes_argument


def _axes(a, values, rank):
    since = 13 if a.op_type == "ReduceSum" else 18
    axes = axes_argument(a, values, 1, since=since, rank=rank)
    if not axes:
        if a.get("noop_with_empty_axes", 0) and a.opset >= since:
            return ()
        return tuple(range(rank))
    return axes


def _reduce_labels(ctx):
    if ctx.a.get("keepdims", 1):
        return [ctx.labels[0]]
    axes = _axes(ctx.a, ctx.values, len(ctx.labels[0]))
    return ["".join(x for i, x in enumerate(ctx.labels[0]) if i not in axes)]


_REDUCTIONS = {
    "ReduceSum": lambda x, axes, keep: jnp.sum(x, axis=axes, keepdims=keep),
    "ReduceMean": lambda x, axes, keep: jnp.mean(floating(x), axis=axes, keepdims=keep).astype(
        x.dtype
    ),
    "ReduceMax": lambda x, axes, keep: jnp.max(x, axis=axes, keepdims=keep),
    "ReduceMin": lambda x, axes, keep: jnp.min(x, axis=axes, keepdims=keep),
    "ReduceProd": lambda x, axes, keep: jnp.prod(x, axis=axes, keepdims=keep),
    "ReduceL1": lambda x, axes, keep: jnp.sum(jnp.abs(x), axis=axes, keepdims=keep),
    "ReduceL2": lambda x, axes, keep: jnp.sqrt(
        jnp.sum(jnp.square(floating(x)), axis=axes, keepdims=keep)
    ).astype(x.dtype),
    "ReduceSumSquare": lambda x, axes, keep: jnp.sum(jnp.square(x), axis=axes, keepdims=keep),
    "ReduceLogSum": lambda x, axes, keep: jnp.log(jnp.sum(x, axis=axes, keepdims=keep)),
    "ReduceLogSumExp": lambda x, axes, keep: logsumexp(x, axis=axes, keepdims=keep).astype(x.dtype),
}


def _reduction(name, fn):
    def impl(a, x, axes=None):
        found = _axes(a, (None, axes), x.ndim)
        if not found and x.ndim:
            return x
        empty = any(x.shape[i] == 0 for i in found)
        if empty and name in ("ReduceMax", "ReduceMin"):
            high = name == "ReduceMin"  # the identity of min is the largest value
            if x.dtype == jnp.bool_:
                fill = high
            elif jnp.issubdtype(x.dtype, jnp.integer):
                info = jnp.iinfo(x.dtype)
                fill = info.max if high else info.min
            else:
                fill = jnp.inf if high else -jnp.inf
            shape = [1 if i in found else n for i, n in enumerate(x.shape)]
            y = jnp.full(shape, fill, x.dtype)
            return y if a.get("keepdims", 1) else jnp.squeeze(y, found)
        return fn(x, found, bool(a.get("keepdims", 1)))

    op(name, static=(1,), labels=_reduce_labels)(impl)


for _name, _fn in _REDUCTIONS.items():
    _reduction(_name, _fn)


def _arg_labels(ctx):
    labels = ctx.labels[0]
    if ctx.a.get("keepdims", 1):
        return [labels]
    axis = axis_of(ctx.a.get("axis", 0), len(labels))
    return [labels[:axis] + labels[axis + 1 :]]


def _arg(find):
    def impl(a, x):
        axis = axis_of(a.get("axis", 0), x.ndim)
        if a.get("select_last_index", 0):
            flipped = jnp.flip(x, axis)
            index = x.shape[axis] - 1 - find(flipped, axis=axis)
        else:
            index = find(x, axis=axis)
        if a.get("keepdims", 1):
            index = jnp.expand_dims(index, axis)
        return index

    return impl


op("ArgMax", labels=_arg_labels)(_arg(jnp.argmax))
op("ArgMin", labels=_arg_labels)(_arg(jnp.argmin))

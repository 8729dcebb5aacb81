"""How ONNX tensors map onto difffn's formats: axis labels in ONNX order, storage channels-last.

Every tensor of an imported graph gets one difffn label per ONNX axis, in ONNX's axis order
(``"BCSS"`` for an NCHW image, ``"TBC"`` for an ONNX RNN's ``(seq, batch, features)``,
``"BC"`` for features; ``"U"`` where nothing is known). difffn stores the tensor with its axes
sorted by label, ``B`` first, then ``T``, ``S``, ``U`` and ``C`` last, keeping the ONNX order
among equal labels: NCHW images are stored NHWC (``"BSSC"``), ``"TBC"`` sequences ``"BTC"``,
``"BUUU"`` tensors as they are. So difffn's layers see their usual formats, a Transpose that only
reorders known labels costs nothing, and the weights, not the data, are reordered at import.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_PRIORITY = {"B": 0, "T": 1, "S": 2, "U": 3, "C": 4}


def storage_perm(labels: str) -> tuple[int, ...]:
    """The ONNX axes in storage order: ``stored = onnx.transpose(perm)``."""
    return tuple(sorted(range(len(labels)), key=lambda i: (_PRIORITY[labels[i]], i)))


def storage_format(labels: str) -> str:
    """difffn's format of the stored tensor (``"BCSS"`` -> ``"BSSC"``)."""
    return "".join(labels[i] for i in storage_perm(labels))


def inverse(perm) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argsort(perm))


def to_storage(x, labels: str):
    """An array in ONNX order, reordered into storage order (NumPy or JAX)."""
    perm = storage_perm(labels)
    return x if perm == tuple(range(len(perm))) else x.transpose(perm)


def to_onnx(x, labels: str):
    """An array in storage order, reordered into ONNX order."""
    perm = storage_perm(labels)
    return x if perm == tuple(range(len(perm))) else x.transpose(inverse(perm))


def valid(labels: str) -> str:
    """``labels`` with repeats of ``B``, ``C`` and ``T`` turned into ``U`` (difffn's rule)."""
    seen, out = set(), []
    for label in labels:
        if label in "BCT" and label in seen:
            label = "U"
        seen.add(label)
        out.append(label)
    return "".join(out)


def default_labels(rank: int) -> str:
    """The labels an input of this rank gets when nothing else says (MATLAB's defaults)."""
    return {0: "", 1: "U", 2: "BC", 3: "BTC", 4: "BCSS", 5: "BCSSS"}.get(rank, "U" * rank)


def reshaped(in_labels: str, in_shape: Sequence[int] | None, out_shape: Sequence[int]) -> str:
    """Labels after a Reshape/Flatten: leading ``B``/``T`` axes whose sizes are unchanged stay;
    one remaining axis is ``C``; a batch of images (``B`` and 3 or 4 more axes) is ``BCSS..``;
    otherwise ``U``."""
    prefix = ""
    if in_shape is not None and out_shape is not None:
        for label, n, m in zip(in_labels, in_shape, out_shape):
            if label in "BT" and n == m:
                prefix += label
            else:
                break
    rest = len(out_shape) - len(prefix)
    if rest == 0:
        return prefix
    if rest == 1:
        return prefix + "C"
    if prefix == "B" and rest in (3, 4):
        return "BC" + "S" * (rest - 1)
    return prefix + "U" * rest


# -- label rules for the operator registry ------------------------------------------------------
#
# A rule takes a LabelContext and returns one label string (or None: "U"s) per output.


class LabelContext:
    """What a label rule may look at: the node's attributes, and per input its labels, shape
    and static value (``None`` for runtime values), and the output shapes."""

    def __init__(self, a, labels, shapes, values, out_shapes):
        self.a, self.labels, self.shapes = a, labels, shapes
        self.values, self.out_shapes = values, out_shapes


def keep(ctx):
    """Every output of the first input's rank keeps that input's labels."""
    first = ctx.labels[0]
    return [first if s is not None and len(s) == len(first) else None for s in ctx.out_shapes]


def image(ctx):
    """``B, C, S...``: the outputs of convolutions and pools."""
    return ["BC" + "S" * (len(s) - 2) if s is not None and len(s) >= 3 else None
            for s in ctx.out_shapes]  # fmt: skip


def reshape(ctx):
    return [reshaped(ctx.labels[0], ctx.shapes[0], ctx.out_shapes[0])]


def transpose(ctx):
    labels = ctx.labels[0]
    perm = ctx.a.get("perm") or tuple(reversed(range(len(labels))))
    return ["".join(labels[int(p)] for p in perm)]


def dropped(axes):
    """A rule: the axes ``axes(ctx)`` are removed (Squeeze, reductions without keepdims)."""

    def rule(ctx):
        removed = axes(ctx)
        return ["".join(x for i, x in enumerate(ctx.labels[0]) if i not in removed)]

    return rule


def inserted(axes):
    """A rule: new ``U`` axes at the output positions ``axes(ctx)`` (Unsqueeze)."""

    def rule(ctx):
        labels = list(ctx.labels[0])
        for axis in sorted(axes(ctx)):
            labels.insert(axis, "U")
        return ["".join(labels)]

    return rule


def matmul(ctx):
    x = ctx.labels[0]
    rank = len(ctx.out_shapes[0])
    if len(x) >= 2 and len(x) == rank:
        return [x[:-1] + ("C" if "C" not in x[:-1] else "U")]
    return [None]

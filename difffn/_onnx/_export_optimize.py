"""Inference rewrites of an exported graph (``df.export_onnx(..., optimize=True)``, the default).

The lowering writes one JAX equation at a time, so a channels-last network's file holds a
``Transpose`` to ONNX's channels-first order before every ``Conv`` or pool and one back after it,
and a batch normalization as ``Sub``/``Mul``/``Add`` of per-channel constants after the
convolution. This pass rewrites the node list (the outputs stay the same up to float rounding):

1. transposes sink: an elementwise operation (``Add``, ``Max``, ``Relu``, ...) whose non-constant
   inputs are all ``Transpose`` outputs with one permutation runs before the transpose instead
   (its constants transposed here), and a reduction over axes that keeps the other axes' order
   reads the untransposed input; two consecutive transposes compose, and vanish when they undo
   each other. Between consecutive channel-wise operations no transpose is left;
2. a ``Conv`` followed by an ``Add``, ``Sub`` or ``Mul`` of a per-output-channel constant (a
   bias, a batch normalization in inference) takes the constant into its weights and bias (as
   torch.onnx.export's Conv-BatchNorm fusion and ONNX Runtime's ``ConvAddFusion``/
   ``ConvMulFusion`` do);
3. ``Max(x, 0)`` becomes ``Relu`` (which ONNX Runtime fuses into a convolution before it),
   and nodes whose outputs nothing reads are removed.

Constants are the graph's initializers; values computed from constants alone were already
folded by the lowering (``_lower.Lowering._fold``), so every rewrite here sees them as arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_UNARY = {"Relu", "Sigmoid", "Tanh", "Exp", "Log", "Neg", "Abs", "Sqrt", "Erf", "Floor", "Ceil",
          "Sin", "Cos", "Reciprocal", "Sign", "Not", "LeakyRelu", "Cast", "Identity"}  # fmt: skip
_BINARY = {"Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "Equal", "Less", "LessOrEqual",
           "Greater", "GreaterOrEqual", "And", "Or", "Where", "Clip"}  # fmt: skip
_REDUCE = {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd"}
_CONV_FOLDS = {"Add", "Sub", "Mul"}


def optimize(
    nodes, initializers: dict, outputs, helper, numpy_helper, fresh
) -> tuple[list, dict[str, Any]]:
    """The rewritten ``(nodes, initializers)``.

    Args:
      nodes: the graph's NodeProtos in topological order (not modified).
      initializers: ``{name: TensorProto}``.
      outputs: the graph's output names (kept).
      helper, numpy_helper: ``onnx.helper`` and ``onnx.numpy_helper``.
      fresh: ``hint -> unused name`` (the lowering's).
    """
    graph = _Graph(nodes, initializers, set(outputs), helper, numpy_helper, fresh)
    changed = True
    while changed:
        changed = graph.compose_transposes() or graph.sink_transposes()
    graph.remove_unused()  # the transposes the sinking left behind
    graph.max_zero_as_relu()
    while graph.fold_into_conv():
        pass
    graph.remove_unused()
    return graph.nodes, graph.tensors()


class _Graph:
    def __init__(self, nodes, initializers, outputs, helper, numpy_helper, fresh):
        self.nodes = [_copy(node) for node in nodes]
        self.consts = {n: numpy_helper.to_array(t) for n, t in initializers.items()}
        self.originals = dict(initializers)  # unchanged constants keep their TensorProto
        self.outputs = outputs
        self.helper, self.numpy_helper, self.fresh = helper, numpy_helper, fresh

    # -- reading the graph ---------------------------------------------------------------------

    def index(self) -> None:
        """Who writes and how often each name is read (rebuilt before each rewrite)."""
        self.producers = {o: n for n in self.nodes for o in n.output}
        self.reads: dict[str, int] = {}
        for node in self.nodes:
            for name in node.input:
                self.reads[name] = self.reads.get(name, 0) + 1

    def producer(self, name: str):
        return self.producers.get(name)

    def consumers(self, name: str) -> list:
        return [n for n in self.nodes if name in n.input]

    def uses(self, name: str) -> int:
        return self.reads.get(name, 0) + (name in self.outputs)

    def transpose_of(self, name: str):
        """``(input, perm)`` when ``name`` is a Transpose's output, else None."""
        node = self.producer(name)
        if node is None or node.op_type != "Transpose":
            return None
        return node.input[0], _perm(node)

    def const(self, array, hint: str) -> str:
        name = self.fresh(hint)
        self.consts[name] = np.asarray(array)
        return name

    def set_const(self, name: str, array, users: int = 1) -> str:
        """``array`` under ``name`` when only ``users`` nodes read it, else under a new name."""
        if self.uses(name) <= users:
            self.consts[name] = np.asarray(array)
            self.originals.pop(name, None)
            return name
        return self.const(array, name)

    def tensors(self) -> dict:
        used = {i for n in self.nodes for i in n.input}
        return {
            name: self.originals.get(name) or self.numpy_helper.from_array(value, name)
            for name, value in self.consts.items()
            if name in used
        }

    def rename_uses(self, old: str, new: str) -> None:
        for node in self.nodes:
            for k, name in enumerate(node.input):
                if name == old:
                    node.input[k] = new

    # -- 1. transposes -------------------------------------------------------------------------

    def compose_transposes(self) -> bool:
        """Transpose of a Transpose: one transpose, or none when they undo each other."""
        self.index()
        for node in self.nodes:
            if node.op_type != "Transpose":
                continue
            inner = self.transpose_of(node.input[0])
            if inner is None:
                continue
            source, first = inner
            perm = [first[q] for q in _perm(node)]
            if perm == list(range(len(perm))) and node.output[0] not in self.outputs:
                self.rename_uses(node.output[0], source)
                self.nodes.remove(node)
            else:
                node.input[0] = source
                _set_perm(node, perm)
            return True
        return False

    def sink_transposes(self) -> bool:
        self.index()
        for position, node in enumerate(self.nodes):
            if node.op_type in _UNARY or node.op_type in _BINARY:
                if self._sink_elementwise(position, node):
                    return True
            elif node.op_type in _REDUCE and self._reduce_untransposed(node):
                return True
        return False

    def _sink_elementwise(self, position, node) -> bool:
        perm = None
        for name in node.input:
            if name in self.consts or not name:
                continue
            source = self.transpose_of(name)
            if source is None or (perm is not None and source[1] != perm):
                return False
            if self.uses(name) != list(node.input).count(name):  # read elsewhere too: keep
                return False
            perm = source[1]
        if perm is None:
            return False
        rank, back = len(perm), list(np.argsort(perm))
        if any(self.consts[n].ndim > rank for n in node.input if n in self.consts):
            return False
        for k, name in enumerate(node.input):
            if not name:
                continue
            if name in self.consts:
                value = self.consts[name]
                if value.size != 1:
                    full = value.reshape((1,) * (rank - value.ndim) + value.shape)
                    node.input[k] = self.const(np.transpose(full, back), name)
            else:
                node.input[k] = self.transpose_of(name)[0]  # type: ignore[index]
        out = node.output[0]
        node.output[0] = self.fresh(f"{out}:channels_first")
        transpose = self.helper.make_node(
            "Transpose", [node.output[0]], [out], f"{node.name}/Transpose", perm=perm
        )
        self.nodes.insert(position + 1, transpose)
        return True

    def _reduce_untransposed(self, node) -> bool:
        """A reduction without kept axes reads the untransposed input when the axes it keeps
        stay in the same order (global pooling of channels-last data)."""
        source = self.transpose_of(node.input[0])
        if source is None or len(node.input) < 2 or node.input[1] not in self.consts:
            return False
        if _attribute(node, "keepdims", 1) != 0:
            return False
        x, perm = source
        rank = len(perm)
        axes = [int(a) % rank for a in np.ravel(self.consts[node.input[1]])]
        kept = [perm[k] for k in range(rank) if k not in axes]
        if kept != sorted(kept):
            return False
        node.input[0] = x
        node.input[1] = self.const(np.array(sorted(perm[a] for a in axes), np.int64), "axes")
        return True

    # -- 2. per-channel constants into convolutions ---------------------------------------------

    def fold_into_conv(self) -> bool:
        self.index()
        for conv in self.nodes:
            if conv.op_type != "Conv" or conv.input[1] not in self.consts:
                continue
            y = conv.output[0]
            users = self.consumers(y)
            if y in self.outputs or len(users) != 1 or users[0].op_type not in _CONV_FOLDS:
                continue
            op = users[0]
            if list(op.input).count(y) != 1 or (op.op_type == "Sub" and op.input[0] != y):
                continue
            other = op.input[1] if op.input[0] == y else op.input[0]
            weights = self.consts[conv.input[1]]
            channels = _per_channel(self.consts.get(other), weights.shape[0], weights.ndim)
            if channels is None:
                continue
            bias_name = conv.input[2] if len(conv.input) > 2 and conv.input[2] else None
            if bias_name is not None and bias_name not in self.consts:
                continue
            bias = self.consts[bias_name] if bias_name else np.zeros(weights.shape[0])
            bias = bias.astype(weights.dtype)
            if op.op_type == "Mul":
                scale = channels.reshape((-1,) + (1,) * (weights.ndim - 1))
                conv.input[1] = self.set_const(conv.input[1], weights * scale)
                bias = bias * channels
            else:
                bias = bias + channels if op.op_type == "Add" else bias - channels
            if bias_name:
                name = self.set_const(bias_name, bias)
            elif self.uses(other) == 1:  # the bias add's constant: its name (``conv.bias``)
                name = self.set_const(other, bias)
            else:
                name = self.const(bias, "bias")
            while len(conv.input) < 3:
                conv.input.append("")
            conv.input[2] = name
            conv.output[0] = op.output[0]
            self.nodes.remove(op)
            return True
        return False

    def max_zero_as_relu(self) -> None:
        """``Max(x, 0)`` (how ``jax.nn.relu`` lowers) as ``Relu``, which ONNX Runtime fuses
        into the convolution before it."""
        for node in self.nodes:
            if node.op_type != "Max" or len(node.input) != 2:
                continue
            zero = [n for n in node.input if n in self.consts and self.consts[n].size == 1]
            if len(zero) != 1 or float(self.consts[zero[0]].reshape(())) != 0.0:
                continue
            (x,) = [n for n in node.input if n != zero[0]]
            if x in self.consts:
                continue
            node.op_type = "Relu"
            del node.input[:]
            node.input.append(x)

    # -- 3. ----------------------------------------------------------------------------------

    def remove_unused(self) -> None:
        changed = True
        while changed:
            read = {i for n in self.nodes for i in n.input} | self.outputs
            kept = [n for n in self.nodes if any(o in read for o in n.output)]
            changed = len(kept) != len(self.nodes)
            self.nodes = kept


def _per_channel(value, channels: int, rank: int):
    """``value`` as a vector over a convolution's output channels (axis 1 of its output), when
    it broadcasts along that axis only; else None."""
    if value is None or value.ndim > rank or not np.issubdtype(value.dtype, np.floating):
        return None
    if value.size == 1:
        return np.full(channels, value.reshape(()), value.dtype)
    full = value.reshape((1,) * (rank - value.ndim) + value.shape)
    if full.shape[1] != channels or any(s != 1 for k, s in enumerate(full.shape) if k != 1):
        return None
    return full.reshape(channels)


def _attribute(node, name: str, default=None):
    for attribute in node.attribute:
        if attribute.name == name:
            return list(attribute.ints) if attribute.ints else attribute.i
    return default


def _perm(node) -> list[int]:
    return [int(p) for p in _attribute(node, "perm", [])]


def _set_perm(node, perm) -> None:
    for attribute in node.attribute:
        if attribute.name == "perm":
            del attribute.ints[:]
            attribute.ints.extend(int(p) for p in perm)


def _copy(node):
    copy = type(node)()
    copy.CopyFrom(node)
    return copy

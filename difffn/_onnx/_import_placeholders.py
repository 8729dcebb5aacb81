"""Placeholders: a node that cannot be imported, and the nodes after one whose sizes it hides.

With ``import_onnx(..., placeholders=True)`` a node that cannot be imported becomes a
``df.layers.Placeholder`` with the node's inputs and outputs. Where the file gives no type for
its outputs (PyTorch writes none for a custom operator's), their sizes are a *guess*: the first
input's, with the channels that a consumer's weights take. Every tensor computed from a guess
carries it (``Runtime.guess``, the placeholder's layer name), and the nodes it feeds are imported
as ``ONNXOperator`` s, which compute in ONNX's order from the sizes of the data they get when
the network runs (no mapping to a difffn layer, which would freeze the guessed sizes, e.g. the
feature order of a Flatten before a fully connected layer). A node that cannot run on the
guessed sizes is imported at the sizes it implies (`Placeholders.fit`): the channels its weights
take (a Gemm after a Flatten takes as many features as its weights have rows), or the sizes of
its other input (a Concat or an Add of a skip connection), not turned into a placeholder too.
So the replacement of the unknown operator alone decides the sizes: with
``net.replace_layer(name, layer)`` the network runs at the replacement's output sizes, and
where they do not fit a node after it, the node's error names the placeholder, the sizes it
needs and gets, and the fix (``_layers``).

A mixin of ``Importer`` (``_import``), beside the emission of layers (``_import_emit``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ..layers import Placeholder
from . import _labels
from ._import_values import Const, NodeInfo, Runtime
from ._load import Node, Subgraph
from ._ops import Unsupported, np_dtype


class Placeholders:
    """``Importer``'s placeholders and guessed sizes (uses ``values``, ``spec``, ``consumers``,
    ``placeholders``, ``fail``, ``unique`` and ``place``)."""

    values: dict[str, Any]
    consumers: dict
    spec: Any
    placeholders: bool
    fail: Callable[[Node, str], None]  # the importer's
    unique: Callable[[str], str]  # the importer's
    place: Callable[[Any, Any], None]  # the emission's

    def _unsupported(self, node: Node, reason: str) -> None:
        if not self.placeholders:
            self.fail(node, reason)
            self._broken(node)
            return
        runtime = [n for n in dict.fromkeys(node.inputs) if isinstance(self.values.get(n), Runtime)]
        constants = {
            n: self.values[n].value
            for n in node.inputs
            if n and isinstance(self.values.get(n), Const)
        }
        out_labels = []
        for name in node.outputs:
            info = self.spec.value_info.get(name)
            if info is not None and info.dims is not None:
                out_labels.append(_labels.default_labels(len(info.dims)))
            else:  # shape inference does not know the operator: guess its first input's
                out_labels.append(self.values[runtime[0]].labels if runtime else None)
        layer = Placeholder(
            node.op_type,
            reason=reason,
            attributes=tuple((k, v) for k, v in node.attributes if not isinstance(v, Subgraph)),
            constants=constants or None,
            input_formats=tuple(_labels.storage_format(self.values[n].labels) for n in runtime),
            output_formats=tuple(
                "" if lab is None else _labels.storage_format(lab) for lab in out_labels
            ),
            num_inputs=max(len(runtime), 1),
            num_outputs=max(len(node.outputs), 1),
            name=self.unique(node.name),
        )
        if not runtime:
            self.fail(node, reason + "; and it has no runtime input to attach a placeholder to")
            self._broken(node)
            return
        self.place(layer, runtime)
        for i, name in enumerate(node.outputs):
            if not name:
                continue
            info = self.spec.value_info.get(name)
            shape = None
            if info is not None and info.dims is not None:
                shape = tuple(d if isinstance(d, int) and d > 0 else 1 for d in info.dims)
            elif out_labels[i] is not None:
                shape = self._guessed_shape(name, self.values[runtime[0]])
            labels = out_labels[i] if out_labels[i] is not None else ""
            dtype = self.values[runtime[0]].dtype
            if info is not None and info.elem_type > 0:
                try:
                    dtype = np_dtype(info.elem_type)
                except Unsupported:
                    pass  # the replacement decides; the first input's type is the guess
            guess = layer.name if info is None or info.dims is None else None
            port = (layer.name, layer.output_names[i])
            self.values[name] = Runtime(port, labels, shape, dtype, guess=guess)

    def _guessed_shape(self, name: str, first: Runtime):
        """A placeholder output's shape when the file gives none (torch writes no type for a
        custom operator's output): its first input's, with the channels its consumers take
        (a Conv's or Gemm's weights say how many), so that the layers after it import."""
        shape = first.shape
        if shape is None or "C" not in first.labels:
            return shape
        for node, position in self.consumers.get(name, []):
            channels = self._channels_taken(node, position)
            if channels is not None:
                shape = list(shape)
                shape[first.labels.index("C")] = channels
                return tuple(shape)
        return shape

    def _channels_taken(self, node, position: int):
        """How many channels (features) ``node`` takes on its data input, from its weights."""
        if node is None or position != 0 or len(node.inputs) < 2:
            return None
        weights = self.values.get(node.inputs[1])
        if not isinstance(weights, Const) or weights.value.ndim == 0:
            return None
        w, attrs = weights.value, dict(node.attributes)
        if node.op_type == "Conv" and w.ndim >= 3:
            return int(w.shape[1]) * int(attrs.get("group", 1))
        if node.op_type == "ConvTranspose" and w.ndim >= 3:
            return int(w.shape[0])
        if node.op_type == "Gemm" and w.ndim == 2:
            return int(w.shape[1] if attrs.get("transB", 0) else w.shape[0])
        if node.op_type == "MatMul" and w.ndim == 2:
            return int(w.shape[0])
        if node.op_type in ("BatchNormalization", "InstanceNormalization") and w.ndim == 1:
            return int(w.shape[0])
        return None

    def _broken(self, node: Node) -> None:
        for name in node.outputs:
            if name:
                self.values[name] = Runtime(None, "", None, None)

    # -- nodes after a guess ------------------------------------------------------------------

    def guess_of(self, info: NodeInfo) -> str | None:
        """The placeholder whose guessed sizes one of the node's runtime inputs follows."""
        for name, kind in zip(info.inputs, info.input_kinds):
            if kind == "runtime" and self.values[name].guess:
                return self.values[name].guess
        return None

    def fit(self, info: NodeInfo, attempt):
        """``attempt(info)`` at the guessed sizes, else at the first sizes for the guessed
        inputs that the node itself implies (`_implied`) and that it can run on.

        Returns ``(info, attempt's result)``, ``info`` at the sizes used; those sizes become the
        guessed tensors' (a consumer's need is the best knowledge of them). Raises the first
        ``Unsupported`` when no sizes fit.
        """
        try:
            return info, attempt(info)
        except Unsupported as error:
            first = error
        for sizes in self._implied(info):
            shapes = [sizes.get(name, shape) for name, shape in zip(info.inputs, info.input_shapes)]
            trial = dataclasses.replace(info, input_shapes=shapes)
            try:
                result = attempt(trial)
            except Unsupported:
                continue
            for name, shape in sizes.items():
                self.values[name] = dataclasses.replace(self.values[name], shape=shape)
            return trial, result
        raise first

    def _implied(self, info: NodeInfo):
        """Sizes ``{tensor: ONNX shape}`` for the node's guessed inputs, most specific first:
        the channels its weights take (a Conv, a Gemm after a Flatten), then the sizes of an
        input that is not a guess and has the same labels (an Add or a Concat of a skip
        connection), with and without its channels."""
        guessed = {}
        known = []
        for name, kind in zip(info.inputs, info.input_kinds):
            value = self.values.get(name) if kind == "runtime" else None
            if value is None or value.shape is None:
                continue
            if value.guess:
                guessed[name] = value
            else:
                known.append(value)
        first = guessed.get(info.inputs[0]) if info.inputs else None
        if first is not None and "C" in first.labels:
            channels = self._channels_taken(info.node, 0)
            if channels is not None:
                axis = first.labels.index("C")
                shape = tuple(channels if i == axis else n for i, n in enumerate(first.shape))
                yield {info.inputs[0]: shape}
        for partner in known:
            same = {n: v for n, v in guessed.items() if v.labels == partner.labels}
            if not same:
                continue
            yield {n: tuple(partner.shape) for n in same}
            if "C" in partner.labels:
                axis = partner.labels.index("C")
                yield {
                    n: tuple(v.shape[i] if i == axis else d for i, d in enumerate(partner.shape))
                    for n, v in same.items()
                }

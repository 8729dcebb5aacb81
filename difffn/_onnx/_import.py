"""``df.import_onnx``: an ONNX graph to a ``df.Network`` of difffn layers.

The importer walks the nodes in order and gives every tensor one of three kinds
(``_import_values``):

* a constant (initializers, ``Constant`` nodes, and everything computed from constants only:
  folded with difffn's own operator implementations, ``_import_fold``);
* a program (computed from constants and the *shapes* of runtime tensors, e.g. PyTorch's
  ``Shape -> Gather -> Concat -> Reshape``): evaluated while tracing, so the batch may vary;
* a runtime value: the output port of a layer (``_import_emit``).

A node with runtime inputs becomes a difffn layer where one matches (``_mapping*.py``: Conv2D,
BatchNorm, FullyConnected, LSTM, TransposedConv2D, ...), else an ``ONNXOperator`` (a
``FunctionLayer`` over the operator, ``_ops*.py``). Tensors carry difffn labels in ONNX axis
order and are stored channels-last (``_labels.py``); the model's inputs become input layers
(``_import_inputs``). Floating-point constants that feed a layer become its learnables;
shapes, axes and the like stay static. Every node that cannot be imported is collected into one
``df.ONNXImportError`` (or becomes a ``df.layers.Placeholder``).

This module is the walk: ``Importer`` visits each node, sorts its inputs by kind and hands it
to folding, deferral or emission (mixins over the one table of tensor kinds it owns).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from typing import Any

from .._core import Error, ONNXImportError
from .._network import Network
from ..layers import FunctionLayer, Placeholder
from . import _labels, _limits, _mapping_attention
from ._export import FORMATS_KEY
from ._import_emit import Emission
from ._import_fold import Folding
from ._import_inputs import Inputs
from ._import_placeholders import Placeholders
from ._import_values import Const, Deferred, ImportResult, NodeInfo, Runtime
from ._layers import NodeFunction, ONNXEntry, Step
from ._load import CONVERTED_KEY, GraphSpec, Node, Subgraph, load_model, read_graph
from ._ops import Attrs, FrozenArray, Unsupported, lookup


def import_onnx(
    path_or_model: Any,
    *,
    placeholders: bool = False,
    input_shapes: dict[str, Any] | None = None,
    input_formats: dict[str, Any] | None = None,
    input_data_formats: dict[str, str] | str | None = None,
    max_tensor_bytes: int = _limits.DEFAULT_MAX_TENSOR_BYTES,
) -> Network:
    """Import an ONNX model as a ``df.Network`` (MATLAB's ``importNetworkFromONNX``).

    Nodes become difffn layers where one computes exactly what the node does (Conv ->
    ``Conv1D``/``Conv2D``/``Conv3D``, ConvTranspose -> ``TransposedConv2D``, BatchNormalization,
    InstanceNormalization, GroupNormalization, LayerNormalization -> the normalization layers,
    Gemm / MatMul+Add -> ``FullyConnected``, LSTM -> ``LSTM``, pooling, Resize, activations,
    Softmax, Add, Mul, Concat, Flatten, Dropout, Identity; the table is in ``docs/onnx.md``)
    and ``FunctionLayer`` s over difffn's implementation of the ONNX operator otherwise. Images
    are NCHW in ONNX and channels-last (``"BSSC"``) in difffn: weights are reordered at import,
    and the network takes and returns NHWC data. Floating-point initializers become
    learnables: the layer named after the node holds them, and its ``description`` gives their
    ONNX names (``ONNXOperator`` layers key them by ONNX name). See ``docs/onnx.md``.

    Args:
      path_or_model: a ``.onnx`` path, the model's bytes, or an ``onnx.ModelProto``.
      placeholders: put a ``df.layers.Placeholder`` in place of every node that cannot be
        imported, instead of raising.
      input_shapes: ``{input name: shape}`` in ONNX order (``None`` for the batch), for inputs
        whose sizes the file leaves symbolic.
      input_formats: ``{input name: labels}`` in ONNX axis order (MATLAB's
        ``InputDataFormats``), e.g. ``"BCSS"`` (NCHW image), ``"TBC"``, ``"BC"``; by default
        chosen from the rank and what the input feeds, or read from the file's metadata
        when ``df.export_onnx`` wrote it.
      input_data_formats: the network takes these inputs in ONNX's axis order (MATLAB's
        ``InputDataFormats``): ``{input name: labels}`` in ONNX order (e.g. ``"BCS"`` for a
        PyTorch ``Conv1d``'s NCL input; it also sets ``input_formats``), or ``"onnx"`` for every
        input with its labels. Otherwise inputs are taken in difffn's storage order (channels
        last: NHWC images, NLC signals).
      max_tensor_bytes: the most bytes of any one tensor the import builds (initializers,
        external data, constant-folded nodes such as ``ConstantOfShape``, ``Expand``,
        ``Range``); default 4 GiB. A larger one is an ``ONNXImportError`` naming it, before it
        is allocated where its size is known from the node. Raise it for models with larger
        weights.

    Returns:
      An initialized ``df.Network``.

    Raises:
      MissingDependencyError: onnx is not installed (``pip install difffn[onnx]``).
      ONNXImportError: the file is not ONNX, is truncated, fails
        ``onnx.checker``, has an opset older than 9, misses external data; an input size that
        difffn needs is symbolic; or nodes cannot be imported (all listed in one error).

    Examples:
      >>> import numpy as np, onnx
      >>> from onnx import helper, TensorProto, numpy_helper
      >>> import difffn as df
      >>> w = numpy_helper.from_array(np.ones((3, 2), np.float32), "fc.weight")
      >>> graph = helper.make_graph(
      ...     [helper.make_node("MatMul", ["x", "fc.weight"], ["y"], name="fc")], "g",
      ...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
      ...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])], [w])
      >>> model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
      >>> net = df.import_onnx(model)
      >>> [type(layer).__name__ for layer in net.layers]
      ['FeatureInput', 'FullyConnected']
      >>> net.predict(np.ones((4, 3), np.float32)).shape
      (4, 2)
    """
    return import_model(
        path_or_model,
        placeholders=placeholders,
        input_shapes=input_shapes,
        input_formats=input_formats,
        input_data_formats=input_data_formats,
        max_tensor_bytes=max_tensor_bytes,
    ).network


def import_model(
    path_or_model,
    *,
    placeholders=False,
    input_shapes=None,
    input_formats=None,
    input_data_formats=None,
    max_tensor_bytes: int = _limits.DEFAULT_MAX_TENSOR_BYTES,
):
    """``import_onnx``, returning an `ImportResult`."""
    with _limits.bound(max_tensor_bytes):
        return _import_model(
            path_or_model, placeholders, input_shapes, input_formats, input_data_formats
        )


def _import_model(path_or_model, placeholders, input_shapes, input_formats, input_data_formats):
    model = load_model(path_or_model)
    spec = _mapping_attention.fuse(read_graph(model))
    if input_formats is None:  # a file df.export_onnx wrote says its inputs' formats
        props = {p.key: p.value for p in model.metadata_props}
        input_formats = json.loads(props.get(FORMATS_KEY, "{}"))
    input_formats, onnx_order = _data_formats(spec, dict(input_formats), input_data_formats)
    importer = Importer(spec, placeholders, dict(input_shapes or {}), input_formats)
    importer.onnx_order = onnx_order
    props = {p.key: p.value for p in model.metadata_props}
    if CONVERTED_KEY in props:
        importer.note = (
            f"; the file's opset {props[CONVERTED_KEY]} was converted to opset {spec.opset} by "
            "onnx.version_converter"
        )
    return importer.run()


def _data_formats(spec: GraphSpec, input_formats: dict, given) -> tuple[dict, set[str]]:
    """``input_formats`` with those that ``input_data_formats`` gives, and the inputs taken in
    ONNX's order."""
    names = [i.name for i in spec.inputs]
    if given is None:
        return input_formats, set()
    if isinstance(given, str) and given == "onnx":
        return input_formats, set(names)
    if not isinstance(given, dict) or not all(isinstance(v, str) for v in given.values()):
        raise ONNXImportError(
            f"df.import_onnx: input_data_formats must be 'onnx' or {{input name: labels in ONNX "
            f"order}}; got {given!r}. Fix: e.g. input_data_formats={{{names[0]!r}: 'BCS'}} "
            "(labels from B, C, S, T, U), or input_data_formats='onnx'."
        )
    for name, labels in given.items():
        if name in input_formats and input_formats[name] != labels:
            raise ONNXImportError(
                f"df.import_onnx: input_formats[{name!r}] is {input_formats[name]!r} but "
                f"input_data_formats[{name!r}] is {labels!r}. Fix: give the labels once, in "
                "input_data_formats."
            )
    return {**input_formats, **given}, set(given)


def layer_name(name: str) -> str:
    """A difffn layer name from an ONNX name (``/`` separates ports in difffn)."""
    cleaned = re.sub(r"[/\s]+", "_", name).strip("_")
    return cleaned or "node"


class Importer(Inputs, Folding, Emission, Placeholders):
    def __init__(self, spec: GraphSpec, placeholders: bool, input_shapes, input_formats):
        self.spec = spec
        self.placeholders = placeholders
        self.input_shapes = input_shapes
        self.input_formats = input_formats
        self.values: dict[str, object] = {}
        self.layers: list = []
        self.connections: list[tuple[str, str]] = []
        self.problems: list[str] = []
        self.used_names: set[str] = set()
        self.steps: dict[str, Step] = {}
        self.consumers: dict[str, list[tuple[Node | None, int]]] = defaultdict(list)
        self.skip: set[int] = set()  # nodes (by id) fused into an earlier layer
        for node in spec.nodes:
            for i, name in enumerate(node.inputs):
                if name:
                    self.consumers[name].append((node, i))
        for name in spec.outputs:
            self.consumers[name.name].append((None, 0))
        self.graph_outputs = {info.name for info in spec.outputs}
        self.entries: list[tuple[int, str, list, bool]] = []  # index, labels, shape, ONNX order
        self.onnx_order: set[str] = set()  # inputs the network takes in ONNX's axis order
        self.note = ""  # said in every input layer's description (an opset conversion)
        self.variable_sizes: list[str] = []  # the inputs' sizes that may vary, for messages

    # -- the walk ---------------------------------------------------------------------------------

    def run(self) -> ImportResult:
        unknown = sorted(set(self.input_shapes) - {i.name for i in self.spec.inputs})
        unknown += sorted(set(self.input_formats) - {i.name for i in self.spec.inputs})
        if unknown:
            names = [i.name for i in self.spec.inputs]
            raise ONNXImportError(
                f"df.import_onnx: input_shapes/input_formats name {unknown}, which are not "
                f"inputs of the model; its inputs are {names}."
            )
        for name, value in self.spec.initializers.items():
            self.values[name] = value if isinstance(value, Unsupported) else Const(value)
        input_labels = {}
        for info in self.spec.inputs:
            input_labels[info.name] = self._add_input(info)
        for node in self.spec.nodes:
            self._node(node)
        if self.problems:
            count = len(self.problems)
            listed = "\n".join(f"  - {p}" for p in self.problems)
            raise ONNXImportError(
                f"df.import_onnx: {count} problem(s) in the model:\n{listed}\nFix: for "
                "operators difffn lacks, import with placeholders=True and replace each "
                "df.layers.Placeholder with net.replace_layer(name, layer); for sizes, pass "
                "input_shapes."
            )
        outputs, output_labels = [], {}
        for info in self.spec.outputs:
            value = self.values.get(info.name)
            if not isinstance(value, Runtime) or value.port is None:
                raise ONNXImportError(
                    f"df.import_onnx: the model output {info.name!r} does not depend on the "
                    "model inputs (it is a constant); difffn networks compute their outputs "
                    "from inputs. Fix: remove it from the model's outputs."
                )
            port = value.port
            if value.order is not None:
                port = self._in_onnx_order(info.name, port, value)
            outputs.append("/".join(port))
            output_labels[info.name] = value.labels
        # A network of input layers is traced when it is built (its layouts checked). A
        # placeholder cannot run (MATLAB returns a network with placeholders uninitialized), and
        # a graph may tie an input's sizes to each other: such a network takes its inputs
        # through ONNXEntry layers, which check the data when the network runs.
        if not any(isinstance(layer, Placeholder) for layer in self.layers):
            try:
                return ImportResult(self._network(outputs), input_labels, output_labels)
            except Error:
                pass  # the graph ties the sizes of an input to each other: see below
        return ImportResult(self._network(outputs, entries=True), input_labels, output_labels)

    def _network(self, outputs, *, entries=False) -> Network:
        """The network, its inputs entered by input layers or, with ``entries``, by
        ``ONNXEntry`` layers, which check the data's sizes but are not traced when the network
        is built."""
        layers = list(self.layers)
        if entries:
            for index, labels, shape, onnx_order in self.entries:
                perm = range(len(labels)) if onnx_order else _labels.storage_perm(labels)
                layers[index] = ONNXEntry(
                    tuple(shape[i] for i in perm),
                    labels if onnx_order else _labels.storage_format(labels),
                    labels,
                    getattr(layers[index], "input_dtype", "float32"),
                    name=layers[index].name,
                    description=layers[index].description,
                )
        # Each layer a chain of its own: every input is wired by a connection. The outputs are
        # named only where the network's own (every unused output, in layer order) differ, so
        # that an edit moves them as in any network.
        used = {source for source, _ in self.connections}
        default = [
            f"{layer.name}/{port}"
            for layer in layers
            for port in layer.output_names
            if f"{layer.name}/{port}" not in used
        ]
        return Network([[layer] for layer in layers], connections=self.connections,
                       outputs=None if default == list(outputs) else outputs)  # fmt: skip

    def _in_onnx_order(self, name: str, port: tuple[str, str], value: Runtime) -> tuple[str, str]:
        """The port of a network output flattened channels-last (``value``, at ``port``), put
        back in ONNX's feature order."""
        fn = NodeFunction(
            "Identity",
            Attrs("Identity", (), self.spec.opset, name, 1),
            (("input", 0, FrozenArray(value.order)),),
            (value.labels,),
            (value.labels,),
        )
        layer = FunctionLayer(
            fn,
            formattable=True,
            num_inputs=1,
            name=self.unique(f"{name}_onnx_order"),
            description=f"ONNX's feature order for the output {name!r}",
        )
        self.layers.append(layer)
        self.connections.append(("/".join(port), f"{layer.name}/in"))
        return (layer.name, "out")

    def fail(self, node: Node, reason: str) -> None:
        domain = f", domain {node.domain!r}" if node.domain not in ("", "ai.onnx") else ""
        self.problems.append(f"node {node.name!r} ({node.op_type}{domain}): {reason}")

    def unique(self, name: str) -> str:
        base = layer_name(name)
        candidate, k = base, 1
        while candidate in self.used_names:
            k += 1
            candidate = f"{base}_{k}"
        self.used_names.add(candidate)
        return candidate

    # -- nodes ------------------------------------------------------------------------------------

    def _node(self, node: Node) -> None:
        if id(node) in self.skip:
            return
        inputs = [self.values.get(name) if name else None for name in node.inputs]
        if any(isinstance(v, Runtime) and v.port is None for v in inputs):
            if lookup(node.op_type, node.domain) is None:  # every unknown operator is listed
                self.fail(node, _unknown(node))
            self._broken(node)  # otherwise downstream of a failed node: already reported
            return
        missing = [n for n, v in zip(node.inputs, inputs) if n and v is None]
        if missing:
            self.fail(node, f"its inputs {missing} are produced nowhere")
            self._broken(node)
            return
        bad = next((v for v in inputs if isinstance(v, Unsupported)), None)
        if bad is not None:
            self._unsupported(node, f"an initializer uses {bad}")
            return
        definition = lookup(node.op_type, node.domain)
        if definition is None:
            self._unsupported(node, _unknown(node))
            return
        for key, value in node.attributes:
            if isinstance(value, (Subgraph, Unsupported)):
                self._unsupported(node, f"attribute {key!r}: {value}")
                return
        a = Attrs(
            node.op_type,
            node.attributes,
            self.spec.opset,
            node.name,
            len(node.outputs),
            "" if node.domain == "ai.onnx" else node.domain,
        )
        try:
            info = self._info(node, a, inputs)  # programs' stand-in values: may raise
            if definition.check is not None:
                # at guessed sizes (after a placeholder), at the sizes the node implies
                check = definition.check
                info, _ = self.fit(info, lambda i: check(a, i))
            meta = dict(definition.meta)
            data = {k for i, k in enumerate(info.input_kinds) if i not in meta} - {"absent"}
            looked_at = [
                i for i in meta if i < len(node.inputs) and info.input_kinds[i] == "runtime"
            ]
            is_output = any(name in self.graph_outputs for name in node.outputs)
            if "runtime" not in data and not (is_output and looked_at):
                # A size read from a runtime tensor is evaluated while tracing (a Program):
                # any axis may follow the batch or a sequence length (after a transpose or a
                # reshape its labels no longer say so), and tracing fixes every size anyway.
                fixed = all(meta[i] == "dtype" for i in looked_at) and not any(
                    i < len(node.inputs) and info.input_kinds[i] == "program" for i in meta
                )
                if "program" in data or not fixed:
                    self._defer(node, a)
                else:
                    self._fold(node, a, info)
            else:
                for position in definition.static:
                    if position < len(node.inputs) and info.input_kinds[position] == "runtime":
                        raise Unsupported(
                            f"its input {position} ({node.inputs[position]!r}: a shape, axes or "
                            "similar) is computed from data at run time; difffn needs it known "
                            "when the network is traced (from constants or tensor shapes)"
                        )
                self._runtime(node, a, info, definition)
        except Unsupported as error:
            self._unsupported(node, str(error))

    def _info(self, node: Node, a: Attrs, inputs) -> NodeInfo:
        kinds, values, shapes, dtypes, labels = [], [], [], [], []
        for value in inputs:
            if value is None:
                kinds.append("absent")
                values.append(None)
                shapes.append(None)
                dtypes.append(None)
                labels.append(None)
            elif isinstance(value, Const):
                kinds.append("const")
                values.append(value.value)
                shapes.append(value.value.shape)
                dtypes.append(value.value.dtype)
                rank = value.value.ndim
                labels.append("U" * (rank - 1) + "C" if rank else "")
            elif isinstance(value, Deferred):
                kinds.append("program")
                values.append(None)
                shapes.append(None)
                dtypes.append(None)
                labels.append(None)
            else:
                kinds.append("runtime")
                values.append(None)
                shapes.append(value.shape)
                dtypes.append(value.dtype)
                labels.append(value.labels)
        # programs: their stand-in values give shapes and dtypes to checks
        for i, name in enumerate(node.inputs):
            if kinds[i] == "program":
                stand_in = self.stand_in(name)
                shapes[i], dtypes[i] = stand_in.shape, stand_in.dtype
                labels[i] = "U" * stand_in.ndim
        return NodeInfo(node, a, node.inputs, node.outputs, kinds, values, shapes, dtypes, labels)


def _unknown(node: Node) -> str:
    if node.domain not in ("", "ai.onnx"):
        return "operators outside the default ONNX domain are not supported"
    return "difffn has no implementation of this operator"

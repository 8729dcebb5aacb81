"""``df.import_onnx``: an ONNX graph to a ``df.Network`` of difffn layers.

The importer walks the nodes in order and gives every tensor one of three kinds:

* a constant (initializers, ``Constant`` nodes, and everything computed from constants only:
  folded here with difffn's own operator implementations);
* a program (computed from constants and the *shapes* of runtime tensors, e.g. PyTorch's
  ``Shape -> Gather -> Concat -> Reshape``): evaluated while tracing, so the batch may vary;
* a runtime value: the output port of a layer.

A node with runtime inputs becomes a difffn layer where one matches (``_mapping.py``: Conv2D,
BatchNorm, FullyConnected, LSTM, ...), else an ``ONNXOperator`` (a ``FunctionLayer`` over the
operator, ``_ops*.py``). Tensors carry difffn labels in ONNX axis order and are stored
channels-last (``_labels.py``). Floating-point constants that feed a layer become its
learnables; shapes, axes and the like stay static. Every node that cannot be imported is
collected into one ``df.ONNXImportError`` (or becomes a ``df.layers.Placeholder``).

This module is over the project's ~600 lines on purpose for now: the three tensor kinds above
are one walk over the graph, and the walk, the folding of constants and programs, and the
emission of layers share one table of tensor kinds that each step reads and writes. Splitting
it (walk / folding / emission, each with that table passed in) is the planned next step.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections import defaultdict

import jax
import numpy as np

from .._errors import NetworkError, ONNXImportError
from .._format import Layout
from .._network import Network
from ..layers import FeatureInput, FunctionLayer, ImageInput, Placeholder, SequenceInput
from . import _labels, _mapping, _mapping_attention
from ._export import FORMATS_KEY
from ._layers import NodeFunction, ONNXInput, ONNXOperator, Program, Step, expand_to
from ._load import GraphSpec, Node, Subgraph, load_model, read_graph
from ._ops import Attrs, FrozenArray, Unsupported, lookup, np_dtype


@dataclasses.dataclass
class Runtime:
    """A tensor computed when the network runs: a layer output port.

    ``shape`` is in ONNX order with stand-in sizes for the batch (and unknown sequence
    lengths); ``order`` is set when difffn flattened an image channels-last: feature ``j`` of
    the ONNX tensor is the stored feature ``order[j]``.
    """

    port: tuple[str, str] | None
    labels: str
    shape: tuple[int, ...] | None
    dtype: np.dtype | None
    order: np.ndarray | None = None


@dataclasses.dataclass
class Const:
    value: np.ndarray


@dataclasses.dataclass
class Deferred:
    """A value computed from constants and shapes (its producing node's outputs)."""


@dataclasses.dataclass
class NodeInfo:
    """What operator checks and mappings may look at for one node."""

    node: Node
    a: Attrs
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    input_kinds: list[str]  # "runtime", "const", "program" or "absent"
    input_values: list  # constants' values (np.ndarray), else None
    input_shapes: list
    input_dtypes: list
    input_labels: list


@dataclasses.dataclass
class ImportResult:
    """The network, and the ONNX labels of its inputs and outputs (tests read these)."""

    network: Network
    input_labels: dict[str, str]
    output_labels: dict[str, str]


def import_onnx(
    path_or_model, *, placeholders=False, input_shapes=None, input_formats=None
) -> Network:
    """Import an ONNX model as a ``df.Network`` (MATLAB's ``importNetworkFromONNX``).

    Nodes become difffn layers where one matches (Conv -> ``Conv2D``, BatchNormalization ->
    ``BatchNorm``, Gemm / MatMul+Add -> ``FullyConnected``, LSTM -> ``LSTM``, Relu, Elu,
    Softmax, MaxPool, GlobalAveragePool, Add, Concat, Flatten, Dropout) and
    ``FunctionLayer`` s over difffn's implementation of the ONNX operator otherwise. Images
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
    ).network


def import_model(path_or_model, *, placeholders=False, input_shapes=None, input_formats=None):
    """``import_onnx``, returning an :class:`ImportResult`."""
    model = load_model(path_or_model)
    spec = _mapping_attention.fuse(read_graph(model))
    if input_formats is None:  # a file df.export_onnx wrote says its inputs' formats
        props = {p.key: p.value for p in model.metadata_props}
        input_formats = json.loads(props.get(FORMATS_KEY, "{}"))
    return Importer(spec, placeholders, dict(input_shapes or {}), dict(input_formats)).run()


def layer_name(name: str) -> str:
    """A difffn layer name from an ONNX name (``/`` separates ports in difffn)."""
    cleaned = re.sub(r"[/\s]+", "_", name).strip("_")
    return cleaned or "node"


class Importer:
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
        self.consumers: dict[str, list[tuple[Node, int]]] = defaultdict(list)
        self.skip: set[int] = set()  # nodes (by id) fused into an earlier layer
        for node in spec.nodes:
            for i, name in enumerate(node.inputs):
                if name:
                    self.consumers[name].append((node, i))
        for name in spec.outputs:
            self.consumers[name.name].append((None, 0))
        self.graph_outputs = {info.name for info in spec.outputs}
        self.entries: list[tuple[int, str, list]] = []  # input layers: index, labels, shape

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
            if value.order is not None:
                value = self._in_onnx_order(info.name, value)
            outputs.append("/".join(value.port))
            output_labels[info.name] = value.labels
        # A network of input layers is traced when it is built, and one input layer needs all
        # inputs entered by input layers. A placeholder cannot run, and an input of another
        # kind (integers, a rank without an input layer) is not one: such a network takes its
        # inputs as they are (MATLAB returns a network with placeholders uninitialized).
        if not any(isinstance(layer, (Placeholder, ONNXInput)) for layer in self.layers):
            try:
                return ImportResult(self._network(outputs), input_labels, output_labels)
            except NetworkError:
                pass  # the graph ties the first axis of an input to other sizes: see below
        return ImportResult(self._network(outputs, entries=True), input_labels, output_labels)

    def _network(self, outputs, *, entries=False) -> Network:
        """The network, its inputs entered by input layers or, with ``entries``, by
        ``ONNXInput`` layers, which check the data's sizes but are not traced when the network
        is built."""
        layers = list(self.layers)
        if entries:
            for index, labels, shape in self.entries:
                perm = _labels.storage_perm(labels)
                layers[index] = ONNXInput(
                    tuple(shape[i] for i in perm),
                    _labels.storage_format(labels),
                    name=layers[index].name,
                )
        # each layer a chain of its own: every input is wired by a connection
        return Network([[layer] for layer in layers], connections=self.connections,
                       outputs=outputs)  # fmt: skip

    def _in_onnx_order(self, name: str, value: Runtime) -> Runtime:
        """A network output flattened channels-last, put back in ONNX's feature order."""
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
        self.connections.append(("/".join(value.port), f"{layer.name}/in"))
        return Runtime((layer.name, "out"), value.labels, value.shape, value.dtype)

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

    # -- inputs -----------------------------------------------------------------------------------

    def _input_labels(self, name: str, rank: int, elem_type: int) -> str:
        if name in self.input_formats:
            labels = self.input_formats[name]
            if (
                not isinstance(labels, str)
                or len(labels) != rank
                or not set(labels) <= set("BCSTU")
                or labels != _labels.valid(labels)
            ):
                raise ONNXImportError(
                    f"df.import_onnx: input_formats[{name!r}] is {labels!r}; expected {rank} "
                    "labels from B, C, S, T, U (B, C, T at most once) in ONNX axis order, e.g. "
                    "'BCSS' for NCHW images."
                )
            return labels
        uses = [node for node, _ in self.consumers[name] if node is not None]
        if rank == 3:
            for node in uses:
                if node.op_type in ("LSTM", "GRU", "RNN"):
                    layout = dict(node.attributes).get("layout", 0)
                    return "BTC" if layout else "TBC"
                if node.op_type in ("Conv", "ConvTranspose", "MaxPool", "AveragePool"):
                    return "BCS"
        if rank == 2 and elem_type not in (1, 10, 11, 16):  # integers: token ids
            return "BT"
        return _labels.default_labels(rank)

    def _add_input(self, info) -> str:
        if info.elem_type == -1:
            raise ONNXImportError(
                f"df.import_onnx: the model input {info.name!r} is not a tensor (a sequence, map "
                "or optional); difffn imports tensor inputs only."
            )
        dims = info.dims
        if info.name in self.input_shapes:
            dims = tuple(self.input_shapes[info.name])
        if dims is None:
            raise ONNXImportError(
                f"df.import_onnx: the model input {info.name!r} has no shape in the file. Fix: "
                f"df.import_onnx(path, input_shapes={{{info.name!r}: (None, ...)}}) with its "
                "sizes in ONNX order (None for the batch)."
            )
        labels = self._input_labels(info.name, len(dims), info.elem_type)
        shape, stand_in = [], []
        for axis, (label, n) in enumerate(zip(labels, dims)):
            if isinstance(n, int) and n >= 0:
                shape.append(None if label == "B" else n)
                stand_in.append(n)
            elif label in "BT":
                shape.append(None)
                stand_in.append(1)
            else:
                example = ["None" if lab == "B" else "..." for lab in labels]
                example[axis] = "<size>"
                raise ONNXImportError(
                    f"df.import_onnx: the model input {info.name!r} has a symbolic size "
                    f"{n!r} on axis {axis} (label {label!r} of {labels!r}, ONNX order); difffn "
                    "needs that size fixed (only batch and time may vary). Fix: "
                    f"df.import_onnx(path, input_shapes={{{info.name!r}: "
                    f"({', '.join(example)})}})."
                )
        try:
            dtype = np_dtype(info.elem_type)
        except Unsupported as error:
            raise ONNXImportError(
                f"df.import_onnx: the model input {info.name!r}: {error}."
            ) from None
        name = self.unique(info.name)
        layer = self._input_layer(name, labels, shape, dtype, 0 in stand_in)
        self.entries.append((len(self.layers), labels, shape))
        self.layers.append(layer)
        self.values[info.name] = Runtime((name, "out"), labels, tuple(stand_in), dtype)
        return labels

    def _input_layer(self, name, labels, shape, dtype, empty):
        floating = np.issubdtype(dtype, np.floating) and not empty
        sizes = dict(zip(labels, shape))
        if floating and labels == "BCSS":
            _, c, h, w = shape
            return ImageInput((h, w, c), normalization="none", name=name)
        if floating and labels == "BC":
            return FeatureInput(shape[1], name=name)
        if floating and labels in ("BTC", "TBC"):
            return SequenceInput(sizes["C"], name=name)
        perm = _labels.storage_perm(labels)
        return ONNXInput(tuple(shape[i] for i in perm), _labels.storage_format(labels), name=name)

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
        info = self._info(node, a, inputs)
        try:
            if definition.check is not None:
                definition.check(a, info)
            meta = dict(definition.meta)
            data = {k for i, k in enumerate(info.input_kinds) if i not in meta} - {"absent"}
            looked_at = [
                i for i in meta if i < len(node.inputs) and info.input_kinds[i] == "runtime"
            ]
            is_output = any(name in self.graph_outputs for name in node.outputs)
            if "runtime" not in data and not (is_output and looked_at):
                fixed = all(
                    meta[i] == "dtype" or not set(info.input_labels[i]) & set("BT")
                    for i in looked_at
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
        self._place(layer, runtime)
        for i, name in enumerate(node.outputs):
            if not name:
                continue
            info = self.spec.value_info.get(name)
            shape = None
            if info is not None and info.dims is not None:
                shape = tuple(d if isinstance(d, int) and d > 0 else 1 for d in info.dims)
            elif out_labels[i] is not None:
                shape = self.values[runtime[0]].shape
            labels = out_labels[i] if out_labels[i] is not None else ""
            dtype = self.values[runtime[0]].dtype
            if info is not None and info.elem_type > 0:
                try:
                    dtype = np_dtype(info.elem_type)
                except Unsupported:
                    pass  # the replacement decides; the first input's type is the guess
            self.values[name] = Runtime((layer.name, layer.output_names[i]), labels, shape, dtype)

    def _broken(self, node: Node) -> None:
        for name in node.outputs:
            if name:
                self.values[name] = Runtime(None, "", None, None)

    def place(self, layer, inputs) -> None:
        """Add ``layer`` fed by the runtime tensors named ``inputs`` (one per layer input)."""
        self._place(layer, inputs)

    def _place(self, layer, inputs) -> None:
        self.layers.append(layer)
        for name, port in zip(inputs, layer.input_names):
            source = self.values[name]
            self.connections.append(("/".join(source.port), f"{layer.name}/{port}"))

    # -- constants and programs ---------------------------------------------------------------

    def _fold(self, node: Node, a: Attrs, info: NodeInfo) -> None:
        args = []
        for name, kind in zip(node.inputs, info.input_kinds):
            if kind == "const":
                args.append(self.values[name].value)
            elif kind == "runtime":
                value = self.values[name]
                args.append(jax.ShapeDtypeStruct(value.shape, value.dtype))
            elif kind == "program":
                args.append(self.stand_in(name))
            else:
                args.append(None)
        from ._ops import run

        with jax.ensure_compile_time_eval():
            outputs = run(node.op_type, a, args)
        for name, value in zip(node.outputs, outputs):
            if name:
                self.values[name] = Const(np.asarray(value))

    def _defer(self, node: Node, a: Attrs) -> None:
        step = Step(node.op_type, a, node.inputs, node.outputs)
        for name in node.outputs:
            if name:
                self.steps[name] = step
                self.values[name] = Deferred()

    def program(self, name: str) -> Program:
        """The program that computes the deferred tensor ``name``."""
        steps, constants, sources, seen = [], {}, [], set()

        def visit(tensor):
            step = self.steps[tensor]
            if id(step) in seen:
                return
            seen.add(id(step))
            meta = dict(lookup(step.op_type).meta)
            for position, inp in enumerate(step.inputs):
                if not inp:
                    continue
                value = self.values[inp]
                if isinstance(value, Deferred):
                    visit(inp)
                elif isinstance(value, Const):
                    constants[inp] = FrozenArray(value.value)
                elif position in meta and inp not in sources:
                    sources.append(inp)
            steps.append(step)

        visit(name)
        return Program(tuple(steps), tuple(constants.items()), tuple(sources), name)

    def stand_in(self, name: str) -> np.ndarray:
        """A deferred tensor's value at the stand-in sizes (for decisions at import)."""
        program = self.program(name)
        shapes = {}
        for source in program.sources:
            value = self.values[source]
            shapes[source] = jax.ShapeDtypeStruct(value.shape, value.dtype)
        return program.evaluate(shapes)

    # -- runtime nodes --------------------------------------------------------------------------

    def _runtime(self, node: Node, a: Attrs, info: NodeInfo, definition) -> None:
        if node.op_type == "Identity":
            self.values[node.outputs[0]] = self.values[node.inputs[0]]
            return
        if node.op_type == "Reshape" and info.input_kinds[1] == "const":
            info.input_values[1] = self._batch_kept(info)
        out_shapes, out_dtypes = self._output_shapes(node, a, info, definition)
        out_labels = self._output_labels(node, a, info, definition, out_shapes)
        if _mapping.try_map(self, info, out_shapes, out_dtypes, out_labels):
            return
        self.generic(info, definition, out_shapes, out_dtypes, out_labels)

    def _batch_kept(self, info) -> np.ndarray:
        """A Reshape target that spells out the file's batch size copies the batch instead
        (0), so the network takes any batch size."""
        target = np.array(info.input_values[1])
        x = self.values[info.inputs[0]]
        if (
            not info.a.get("allowzero", 0)
            and x.labels.startswith("B")
            and target.size
            and target[0] == x.shape[0]
        ):
            target[0] = 0
        return target

    def _output_shapes(self, node, a, info, definition):
        if any(k == "runtime" and s is None for k, s in zip(info.input_kinds, info.input_shapes)):
            shapes, dtypes = [], []
            for name in node.outputs:
                vi = self.spec.value_info.get(name)
                if vi is None or vi.dims is None:
                    raise Unsupported(
                        "its input shapes are unknown (after a placeholder) and the file does "
                        "not give its output shapes"
                    )
                shapes.append(tuple(d if isinstance(d, int) and d > 0 else 1 for d in vi.dims))
                dtypes.append(None)
            return shapes, dtypes
        static_args, dynamic = {}, []
        for position, (name, kind) in enumerate(zip(node.inputs, info.input_kinds)):
            if kind == "absent":
                static_args[position] = None
            elif position in definition.static:
                static_args[position] = (
                    info.input_values[position] if kind == "const" else self.stand_in(name)
                )
            elif kind == "program":
                stand_in = self.stand_in(name)
                dynamic.append((position, jax.ShapeDtypeStruct(stand_in.shape, stand_in.dtype)))
            else:
                dynamic.append(
                    (position, jax.ShapeDtypeStruct(info.input_shapes[position],
                                                    info.input_dtypes[position]))
                )  # fmt: skip
        count = len(node.inputs)

        def call(*arrays):
            args = [None] * count
            for position, value in static_args.items():
                args[position] = value
            for (position, _), value in zip(dynamic, arrays):
                args[position] = value
            out = definition.fn(a, *args)
            return out if isinstance(out, tuple) else (out,)

        try:
            outs = jax.eval_shape(call, *(spec for _, spec in dynamic))
        except Unsupported:
            raise
        except Exception as error:  # noqa: BLE001 - the model's sizes do not fit the operator
            raise Unsupported(f"it cannot run on its inputs' sizes ({error})") from None
        outs = outs[: len(node.outputs)]
        return [tuple(o.shape) for o in outs], [np.dtype(o.dtype) for o in outs]

    def _output_labels(self, node, a, info, definition, out_shapes):
        runtime = [
            lab
            for lab, kind in zip(info.input_labels, info.input_kinds)
            if kind == "runtime" and lab is not None
        ]
        if definition.labels is not None:
            from ._labels import LabelContext

            context = LabelContext(
                a,
                [lab if lab is not None else "" for lab in info.input_labels],
                info.input_shapes,
                [
                    v if k in ("const",) else None
                    for v, k in zip(info.input_values, info.input_kinds)
                ],
                out_shapes,
            )
            for i, name in enumerate(node.inputs):
                if info.input_kinds[i] == "program" and i in definition.static:
                    context.values[i] = self.stand_in(name)
            labels = definition.labels(context)
        elif definition.elementwise and runtime:
            widest = max(runtime, key=len)
            labels = ["U" * (len(s) - len(widest)) + widest for s in out_shapes]
        else:
            labels = [None] * len(out_shapes)
        result = []
        for lab, shape in zip(labels, out_shapes):
            if lab is None or len(lab) != len(shape):
                lab = "U" * len(shape)
            result.append(_labels.valid(lab))
        return result

    def set_output(self, name, layer_name, port, labels, shape, dtype, order=None) -> None:
        if name:
            self.values[name] = Runtime((layer_name, port), labels, shape, dtype, order)

    def generic(self, info: NodeInfo, definition, out_shapes, out_dtypes, out_labels) -> None:
        """The node as an ``ONNXOperator`` / ``FunctionLayer`` over its ONNX implementation."""
        node, a = info.node, info.a
        out_rank = len(out_labels[0]) if out_labels else 0
        runtime_names = [n for n, k in zip(node.inputs, info.input_kinds) if k == "runtime"]
        runtime_names = list(dict.fromkeys(runtime_names))
        runtime_values = [self.values[n] for n in runtime_names]
        if node.op_type in ("Squeeze", "Unsqueeze") and info.input_kinds[0] == "runtime":
            mode = "reshape"
        elif (
            definition.elementwise
            and runtime_values
            and all(v.labels == out_labels[0] and v.order is None for v in runtime_values)
        ):
            mode = "native"
        else:
            mode = "onnx"
        if mode == "reshape" and runtime_values[0].order is not None:
            mode = "onnx"
        slots, params, programs, sources = [], {}, [], []
        layer_inputs = list(runtime_names)
        for position, (name, kind) in enumerate(zip(node.inputs, info.input_kinds)):
            static = position in definition.static
            if kind == "absent":
                slots.append(("absent",))
            elif kind == "runtime":
                value = self.values[name]
                order = None if value.order is None else FrozenArray(value.order)
                slots.append(("input", layer_inputs.index(name), order))
            elif kind == "const":
                array = info.input_values[position]
                if mode == "native" and not static:
                    array = np.asarray(expand_to(array, out_rank, out_labels[0]))
                if not static and np.issubdtype(array.dtype, np.floating):
                    params[name] = array
                    slots.append(("param", name))
                else:
                    slots.append(("const", FrozenArray(array)))
            else:
                program = self.program(name)
                for source in program.sources:
                    if source not in layer_inputs:
                        layer_inputs.append(source)
                    sources.append((source, layer_inputs.index(source)))
                programs.append(program)
                slots.append(("program", len(programs) - 1))
        for source, _ in sources:
            value = self.values[source]
            if value.order is not None:
                raise Unsupported("the shape of a reordered flattened image is read")
        fn = NodeFunction(
            node.op_type,
            a,
            tuple(slots),
            tuple(self.values[n].labels for n in layer_inputs),
            tuple(out_labels),
            mode,
            tuple(programs),
            tuple(dict.fromkeys(sources)),
        )
        name = self.unique(node.name)
        description = f"ONNX {node.op_type} node {node.name!r}"
        common = dict(
            formattable=True,
            num_inputs=len(layer_inputs),
            num_outputs=len(node.outputs),
            name=name,
            description=description,
        )
        if params:
            layer = ONNXOperator(fn, params=params, **common)
        else:
            layer = FunctionLayer(fn, **common)
        self._place(layer, layer_inputs)
        for i, out in enumerate(node.outputs):
            self.set_output(
                out, name, layer.output_names[i], out_labels[i], out_shapes[i], out_dtypes[i]
            )


def _unknown(node: Node) -> str:
    if node.domain not in ("", "ai.onnx"):
        return "operators outside the default ONNX domain are not supported"
    return "difffn has no implementation of this operator"


def layout_of(value: Runtime) -> Layout:
    """The stored layout of a runtime tensor (stand-in sizes)."""
    perm = _labels.storage_perm(value.labels)
    return Layout(tuple(value.shape[i] for i in perm), _labels.storage_format(value.labels))

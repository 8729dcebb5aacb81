"""Emission of layers: a node with runtime inputs becomes difffn layers.

Where a difffn layer computes exactly what the node does, a rule of ``_mapping`` adds it;
otherwise the node becomes an ``ONNXOperator`` (a ``FunctionLayer`` over difffn's implementation
of the operator, its floating-point constants learnables keyed by ONNX name), and a node that
cannot be imported becomes a ``df.layers.Placeholder`` when asked for. Output shapes come from
``jax.eval_shape`` of the operator at the stand-in sizes, output labels from the operator's
label rule. A mixin of ``Importer`` (``_import``): it reads and writes the importer's table of
tensor kinds and adds layers and connections.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from .._layer import Layer
from ..layers import FunctionLayer
from . import _labels, _mapping
from ._import_values import NodeInfo, Runtime
from ._layers import NodeFunction, ONNXOperator, Program, expand_to
from ._load import GraphSpec, Node
from ._ops import Attrs, FrozenArray, Unsupported


class Emission:
    """``Importer``'s layers for runtime nodes (uses ``values``, ``layers``, ``connections``,
    ``spec``, ``placeholders``, ``fail``, ``unique``, ``program`` and ``stand_in``)."""

    spec: GraphSpec
    placeholders: bool
    values: dict[str, Any]
    consumers: dict[str, list[tuple[Node | None, int]]]
    variable_sizes: list[str]
    fit: Callable[..., Any]  # Placeholders'
    guess_of: Callable[[NodeInfo], str | None]  # Placeholders'
    layers: list[Layer]
    connections: list[tuple[str, str]]
    fail: Callable[[Node, str], None]
    unique: Callable[[str], str]
    program: Callable[[str], Program]
    stand_in: Callable[[str], np.ndarray]

    def place(self, layer, inputs) -> None:
        """Add ``layer`` fed by the runtime tensors named ``inputs`` (one per layer input)."""
        self._place(layer, inputs)

    def _place(self, layer, inputs) -> None:
        self.layers.append(layer)
        for name, port in zip(inputs, layer.input_names):
            source = self.values[name]
            self.connections.append(("/".join(source.port), f"{layer.name}/{port}"))

    def _runtime(self, node: Node, a: Attrs, info: NodeInfo, definition) -> None:
        if node.op_type == "Reshape" and info.input_kinds[1] == "const":
            info.input_values[1] = self._batch_kept(info)
        guess = self.guess_of(info)
        if guess is not None:  # after a placeholder's guessed sizes: see _import_placeholders
            info, (out_shapes, out_dtypes) = self.fit(
                info, lambda i: self._output_shapes(node, a, i, definition)
            )
            out_labels = self._output_labels(node, a, info, definition, out_shapes)
            self.generic(info, definition, out_shapes, out_dtypes, out_labels, after=guess)
            return
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
            context = _labels.LabelContext(
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

    def set_output(
        self, name, layer_name, port, labels, shape, dtype, order=None, guess=None
    ) -> None:
        if name:
            self.values[name] = Runtime((layer_name, port), labels, shape, dtype, order, guess)

    def generic(
        self, info: NodeInfo, definition, out_shapes, out_dtypes, out_labels, after=None
    ) -> None:
        """The node as an ``ONNXOperator`` / ``FunctionLayer`` over its ONNX implementation
        (``after``: the placeholder whose guessed sizes its inputs follow)."""
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
        name = self.unique(node.name)
        fn = NodeFunction(
            node.op_type,
            a,
            tuple(slots),
            tuple(self.values[n].labels for n in layer_inputs),
            tuple(out_labels),
            mode,
            tuple(programs),
            tuple(dict.fromkeys(sources)),
            tuple(tuple(self.values[n].shape or ()) for n in layer_inputs),
            ", ".join(self.variable_sizes),
            (after, name) if after else (),
        )
        description = f"ONNX {node.op_type} node {node.name!r}"
        common: dict[str, Any] = dict(
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
                out,
                name,
                layer.output_names[i],
                out_labels[i],
                out_shapes[i],
                out_dtypes[i],
                guess=after,
            )

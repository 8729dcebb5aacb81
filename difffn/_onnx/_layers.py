"""The layers an imported network holds besides difffn's built-in ones.

* `ONNXOperator`: a ``FunctionLayer`` over one ONNX operator that no difffn layer covers
  (its function is a `NodeFunction`, static and hashable), with the node's floating-point
  constants as learnables, keyed by their ONNX names.
* `ONNXInput`: the entry of an ONNX input that is not an image, a feature vector or a
  sequence (any format and dtype): it labels plain data with its format.

A `NodeFunction` runs the operator in ONNX's axis order: it reorders its inputs from
difffn's storage order (``_labels``), calls the operator, and stores the outputs channels-last
again. Elementwise operators whose inputs share one layout skip both reorderings (their
constants were reordered at import), and ``Squeeze``/``Unsqueeze`` only reshape. Shapes that the
ONNX graph computes from other tensors' shapes (``Shape -> Gather -> Concat -> Reshape``) are
`Program`\\ s, evaluated while tracing from the static shapes, so the batch size may vary.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import InconclusiveDimensionOperation

from .._core import Error, FormatError, FormattedArray, LayerError, Layout, ONNXImportError, dims
from .._layer import InputLayer, Layer, learnable
from ..layers import FunctionLayer
from . import _labels, _limits
from ._ops import Attrs, FrozenArray, Unsupported, registered, run


@dataclasses.dataclass(frozen=True)
class Step:
    """One ONNX node of a `Program`."""

    op_type: str
    attrs: Attrs
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Program:
    """A value the graph computes from constants and the static shapes of runtime tensors.

    ``sources`` name the runtime tensors whose shapes the steps read (only ``Shape``-like
    operators touch them); ``evaluate`` runs the steps while tracing, on concrete values.
    """

    steps: tuple[Step, ...]
    constants: tuple[tuple[str, FrozenArray], ...]
    sources: tuple[str, ...]
    output: str

    def evaluate(self, shapes) -> np.ndarray:
        """The value, given ``{source: jax.ShapeDtypeStruct in ONNX order}`` (computed once
        per program and sizes: layers that share a program, and retraces, reuse it)."""
        key = tuple(sorted((n, tuple(s.shape), str(s.dtype)) for n, s in shapes.items()))
        try:
            return _evaluated(self, key).copy()
        except TypeError:  # unhashable (symbolic) sizes: evaluated each time
            return self._evaluate(shapes)

    def _evaluate(self, shapes) -> np.ndarray:
        env: dict[str, Any] = {name: value.array for name, value in self.constants}
        env.update(shapes)
        with jax.ensure_compile_time_eval():
            for step in self.steps:
                args = [env[n] if n else None for n in step.inputs]
                outputs = _limits.folding(  # bounded, errors named by node
                    step.attrs, step.attrs, args, lambda s=step, a=args: run(s.op_type, s.attrs, a)
                )
                for name, value in zip(step.outputs, outputs):
                    if name:
                        env[name] = value
            return np.asarray(env[self.output])


@functools.lru_cache(maxsize=512)
def _evaluated(program: Program, key) -> np.ndarray:
    shapes = {n: jax.ShapeDtypeStruct(shape, np.dtype(dtype)) for n, shape, dtype in key}
    return program._evaluate(shapes)


def expand_to(value, rank: int, labels: str):
    """A broadcastable operand, given ``rank`` axes (leading ones) and reordered for storage."""
    value = jnp.reshape(value, (1,) * (rank - jnp.ndim(value)) + jnp.shape(value))
    return _labels.to_storage(value, labels)


@dataclasses.dataclass(frozen=True)
class NodeFunction:
    """One ONNX node as a function of its layer's inputs (static, hashable configuration).

    Attributes:
      op_type, attrs: the operator and its attributes (with the model's opset).
      slots: per ONNX input, where its value comes from: ``("input", k, order)`` (the layer's
        input ``k``; ``order`` undoes a feature reordering, or is None), ``("param", key)``,
        ``("const", FrozenArray)``, ``("program", i)`` or ``("absent",)``.
      in_labels: per layer input, the ONNX labels of the tensor it carries.
      out_labels: per output, its ONNX labels (it is stored in ``_labels`` storage order).
      mode: ``"onnx"`` (reorder to ONNX order and back), ``"native"`` (elementwise on stored
        data) or ``"reshape"`` (Squeeze/Unsqueeze: a reshape of stored data).
      programs: the `Program` s of ``("program", i)`` slots.
      sources: per program source name, the layer input that carries that tensor.
      imported: per layer input, its ONNX shape at import (for messages).
      variable: the model inputs' sizes that may vary (for messages).
      after: where the node's inputs follow a ``df.layers.Placeholder`` whose output sizes the
        file does not give (its replacement decides them): ``(placeholder's layer name, this
        node's layer name)``, for messages; else empty.
    """

    op_type: str
    attrs: Attrs
    slots: tuple
    in_labels: tuple[str, ...]
    out_labels: tuple[str, ...]
    mode: str = "onnx"
    programs: tuple[Program, ...] = ()
    sources: tuple[tuple[str, int], ...] = ()
    imported: tuple = ()  # per layer input, its ONNX shape at the import's stand-in sizes
    variable: str = ""  # the model inputs' sizes that may vary, for messages
    after: tuple[str, ...] = ()  # (placeholder layer, own layer): see the docstring

    @property
    def __name__(self):  # FunctionLayer's default description
        return self.op_type

    def __call__(self, *inputs, params=None):
        try:
            return self._call(inputs, params)
        except (jax.errors.ConcretizationTypeError, InconclusiveDimensionOperation):
            raise  # symbolic sizes (df.export_onnx): the exporter says which sizes to give
        except (Unsupported, TypeError, ValueError) as error:
            if isinstance(error, Error):
                raise
            raise ONNXImportError(self._explain(inputs, error)) from None

    def _explain(self, inputs, error) -> str:
        """Why the node cannot run here: its input sizes now and at import."""
        now = [_onnx_shape(tuple(jnp.shape(x)), lab) for x, lab in zip(inputs, self.in_labels)]
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        if self.after:
            return self._explain_after(now, reason)
        message = (
            f"the imported ONNX {self.op_type} node {self.attrs.name!r} cannot run on its "
            f"inputs' sizes {now} (ONNX order): {reason}."
        )
        changed = [
            f"input {k} axis {axis}: {before[axis]} at import, {shape[axis]} now"
            for k, (shape, before) in enumerate(zip(now, self.imported))
            if len(shape) == len(before)
            for axis in range(len(shape))
            if shape[axis] != before[axis]
        ]
        if changed:
            message += (
                f" The sizes that differ from the import ({'; '.join(changed)}) follow the model "
                f"inputs' variable sizes ({self.variable or 'batch'}), but the file fixes a size "
                "this node uses as a constant (not computed from tensor shapes)."
            )
        return message + (
            " Fix: call the network with the sizes the file was exported with, or export the "
            "model with those axes dynamic (torch.onnx.export(..., dynamic_axes=...) or "
            "dynamic_shapes=...)."
        )

    def _explain_after(self, now, reason: str) -> str:
        """The sizes after a replaced placeholder do not fit this node: name both layers."""
        placeholder, own = self.after
        needed = [
            f"input {k} axis {axis}: {before[axis]} needed, {shape[axis]} given"
            for k, (shape, before, labels) in enumerate(zip(now, self.imported, self.in_labels))
            if len(shape) == len(before)
            for axis in range(len(shape))
            if labels[axis] != "B" and shape[axis] != before[axis]
        ]
        imported = [
            "(" + ", ".join("N" if lab == "B" else str(n) for n, lab in zip(shape, labels)) + ")"
            for shape, labels in zip(self.imported, self.in_labels)
        ]
        sizes = f" ({'; '.join(needed)})" if needed else ""
        return (
            f"layer {own!r} (the imported ONNX {self.op_type} node {self.attrs.name!r}) cannot "
            f"run on its inputs' sizes {now} (ONNX order), which follow the output of layer "
            f"{placeholder!r}: {reason.rstrip('.')}. Layer {placeholder!r} replaced a "
            "df.layers.Placeholder whose output sizes the ONNX file does not give; "
            f"{own!r} was imported for inputs of sizes {', '.join(imported)}{sizes}. Fix: "
            f"replace {placeholder!r} with a layer whose output gives {own!r} those sizes "
            f"(net.replace_layer({placeholder!r}, layer); compare layer(x).shape with them, "
            f"for data x that {placeholder!r} receives)."
        )

    def _call(self, inputs, params):
        arrays = [_stored(x, _labels.storage_format(lab)) for x, lab in zip(inputs, self.in_labels)]
        shapes = {
            name: jax.ShapeDtypeStruct(
                _onnx_shape(arrays[k].shape, self.in_labels[k]), arrays[k].dtype
            )
            for name, k in self.sources
        }
        out_rank = len(self.out_labels[0]) if self.out_labels else 0
        static = registered(self.op_type, self.attrs.domain).static
        args = []
        for position, slot in enumerate(self.slots):
            kind = slot[0]
            if kind == "input":
                x = arrays[slot[1]]
                if self.mode == "onnx":
                    x = _labels.to_onnx(x, self.in_labels[slot[1]])
                    if slot[2] is not None:
                        x = jnp.take(x, jnp.asarray(slot[2].array), axis=-1)
                args.append(x)
            elif kind == "param":
                args.append(params[slot[1]])
            elif kind == "const":
                value = slot[1].array
                args.append(value if position in static else jnp.asarray(value))
            elif kind == "program":
                value = self.programs[slot[1]].evaluate(shapes)
                if self.mode == "native" and position not in static:
                    value = expand_to(value, out_rank, self.out_labels[0])
                args.append(value)
            else:
                args.append(None)
        if self.mode == "reshape":
            return self._reshaped(args, arrays)
        outputs = run(self.op_type, self.attrs, args)
        results = []
        for y, labels in zip(outputs, self.out_labels):
            y = jnp.asarray(y)
            if self.mode == "onnx":
                y = _labels.to_storage(y, labels)
            results.append(FormattedArray._wrap(y, _labels.storage_format(labels)))
        return results[0] if len(results) == 1 else tuple(results)

    def _reshaped(self, args, arrays):
        onnx_in = self.slots[0][1]
        x = arrays[onnx_in]
        abstract = jax.ShapeDtypeStruct(_onnx_shape(x.shape, self.in_labels[onnx_in]), x.dtype)
        definition = registered(self.op_type, self.attrs.domain)
        out = jax.eval_shape(lambda v: definition.fn(self.attrs, v, *args[1:]), abstract)
        labels = self.out_labels[0]
        shape = tuple(out.shape[i] for i in _labels.storage_perm(labels))
        return FormattedArray._wrap(jnp.reshape(x, shape), _labels.storage_format(labels))


def _onnx_shape(stored_shape, labels: str) -> tuple[int, ...]:
    return tuple(stored_shape[i] for i in _labels.inverse(_labels.storage_perm(labels)))


def _stored(x, expected: str):
    if isinstance(x, FormattedArray):
        if x.format != expected:
            raise FormatError(
                f"an imported ONNX operator expects data with format {expected!r}; got "
                f"{x.format!r} (shape {x.shape}). Fix: pass data in the imported network's "
                f"layout, e.g. df.permute(x, {expected!r})."
            )
        return x.data
    return jnp.asarray(x)


@dataclasses.dataclass(frozen=True)
class ToStorage:
    """Data in ONNX's axis order (``labels``, e.g. ``"BCSS"``) to difffn's storage order
    (``"BSSC"``): the step after an input that ``import_onnx(..., input_data_formats=...)``
    lets take ONNX's order."""

    labels: str

    @property
    def __name__(self):  # FunctionLayer's default description
        return "ToStorage"

    def __call__(self, x):
        data = x.data if isinstance(x, FormattedArray) else jnp.asarray(x)
        stored = _labels.to_storage(data, self.labels)
        return FormattedArray._wrap(stored, _labels.storage_format(self.labels))


class ONNXOperator(FunctionLayer):
    """A ``FunctionLayer`` over an ONNX operator, with the node's constants as learnables.

    ``params`` maps the ONNX names of the node's floating-point constant inputs (initializers,
    or values folded from them) to arrays, stored as the operator uses them (elementwise
    operators hold them reordered like their channels-last data). ``fn`` is the node's
    `NodeFunction`. Made by ``df.import_onnx``; ``df.export_onnx`` writes it back as the
    same ONNX node.
    """

    params: dict = learnable(default_factory=dict)

    def predict(self, *inputs):
        return self.fn(*inputs, params=self.params)


class ONNXEntry(Layer):
    """The entry of an ONNX input in a network that cannot check its layout when it is built
    (one with ``df.layers.Placeholder`` s, which cannot run): it checks and labels the data.

    ``net.initialize`` then needs the layouts; after the placeholders are replaced,
    ``df.import_onnx`` 's networks otherwise start with `ONNXInput` layers.

    Args:
      input_shape: the input's sizes in storage order, batch and other unknown sizes ``None``.
      input_format: its difffn format (e.g. ``"BSC"`` for a 1-D signal given NCL in ONNX).
      onnx_format: its labels in ONNX axis order (e.g. ``"BCS"``), for messages.
    """

    formattable = True

    input_shape: tuple = ()
    input_format: str = ""
    onnx_format: str = ""
    input_dtype: str = "float32"  # what the model file declares (token ids: "int64")

    def __post_init__(self):
        self.input_shape = tuple(self.input_shape)
        Layout(self.input_shape, self.input_format)  # validates

    @property
    def input_layout(self) -> Layout:
        return Layout(self.input_shape, self.input_format)

    def predict(self, x):
        data = x.data if isinstance(x, FormattedArray) else jnp.asarray(x)
        fmt = dims(x)
        if fmt and fmt != self.input_format:
            raise FormatError(
                f"ONNXInput (layer {self.name!r}) receives data with format "
                f"{self.input_format!r}; got {fmt!r}. Fix: df.permute(x, {self.input_format!r})."
            )
        if data.ndim != len(self.input_shape) or any(
            n is not None and n != m for n, m in zip(self.input_shape, data.shape)
        ):
            raise LayerError(
                f"{type(self).__name__} (layer {self.name!r}) expects shape {self.input_shape} "
                f"(None: any) in format {self.input_format!r}; got {tuple(data.shape)}."
                + _transpose_hint(
                    data.shape, self.input_shape, self.input_format, self.onnx_format
                )  # fmt: skip
            )
        return FormattedArray._wrap(data, self.input_format)


class ONNXInput(ONNXEntry, InputLayer):
    """The input layer of an imported ONNX input (any format and dtype): a ``df.InputLayer``
    that knows the input's layout, checks the data's sizes and labels it with its format.

    Made by ``df.import_onnx`` for inputs that are not images, feature vectors or vector
    sequences (token ids, 1-D signals, volumes, ...); data comes in difffn's storage order
    (channels last) unless the network was imported with ``input_data_formats``.

    Args:
      input_shape: the input's sizes in storage order, batch and other unknown sizes ``None``.
      input_format: its difffn format (e.g. ``"BSC"`` for a 1-D signal given NCL in ONNX).
      onnx_format: its labels in ONNX axis order (e.g. ``"BCS"``), for messages.
      input_dtype: the element type the model file declares (``df.export_onnx`` writes it).

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> from difffn._onnx._layers import ONNXInput
      >>> layer = ONNXInput((None, 16, 2), "BSC", "BCS", name="signal")
      >>> isinstance(layer, df.InputLayer), layer.input_layout
      (True, Layout((None, 16, 2), 'BSC'))
      >>> layer(jnp.ones((4, 16, 2), jnp.int32)).format
      'BSC'
    """


def _transpose_hint(got, shape, fmt: str, onnx_format: str) -> str:
    """How to give data in ONNX's axis order to an input that takes storage order."""
    if not onnx_format or onnx_format == fmt or len(got) != len(shape):
        return ""
    perm = _labels.storage_perm(onnx_format)
    if all(n is None or n == got[p] for n, p in zip(shape, perm)):
        return (
            f" The data looks like ONNX's order {onnx_format!r}. Fix: "
            f"np.transpose(x, {tuple(perm)}), or import with "
            "df.import_onnx(path, input_data_formats=...) to pass ONNX's order."
        )
    return ""

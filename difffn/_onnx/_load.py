"""Reading an ONNX model safely: load, validate, infer shapes, and turn it into plain values.

The ``onnx`` package is imported here, lazily: ``import difffn`` never needs it. A model is read
with protobuf (no code in it is ever run), external data is read only from regular files next to
the model (no absolute paths, no ``..``, no symbolic links: ``_core.files``), each tensor bounded
(``_limits``) and checked against its dims and type before it is built; the model is checked with
``onnx.checker`` and the element types of the inputs of each node against the operator's schema,
and its shapes are inferred with ``onnx.shape_inference``. Every failure is a
[`ONNXImportError`][difffn.ONNXImportError] that says what is wrong with the file and how to fix
it.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from .._core import MissingDependencyError, ONNXImportError, files
from . import _limits
from ._ops import FrozenArray, Unsupported, np_dtype

MIN_OPSET = 9
MAX_FILE_BYTES = 1 << 31  # protobuf's own bound on one message (weights beyond: external data)
INSTALL = "pip install difffn[onnx]"


def onnx_module(what: str = "df.import_onnx"):
    """The ``onnx`` package, or a named error that says how to install it."""
    try:
        import onnx
    except ImportError:
        raise MissingDependencyError(
            f"{what} needs the onnx package, which is not installed. Fix: {INSTALL} (the onnx "
            "extra: onnx and onnxruntime)."
        ) from None
    return onnx


@dataclasses.dataclass(frozen=True)
class Node:
    """One ONNX node, read into plain values."""

    op_type: str
    domain: str
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attributes: tuple[tuple[str, Any], ...]


@dataclasses.dataclass
class TensorInfo:
    """A graph input or output: element type and dims (int, str for a symbol, None unknown)."""

    name: str
    elem_type: int
    dims: tuple | None


@dataclasses.dataclass
class GraphSpec:
    """The parts of a model that the importer reads."""

    opset: int
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    initializers: dict[str, Any]  # name -> np.ndarray, or Unsupported for an unusable dtype
    nodes: list[Node]
    value_info: dict[str, TensorInfo]
    graph_name: str


def load_model(source):
    """A checked ``onnx.ModelProto`` from a path, bytes, or a ``ModelProto``."""
    onnx = onnx_module()
    base_dir = None
    if isinstance(source, onnx.ModelProto):
        model = source
    elif isinstance(source, (bytes, bytearray)):
        model = _parse(onnx, bytes(source), "the bytes given")
    elif isinstance(source, (str, os.PathLike)):
        path = Path(source)
        try:
            data = files.read_regular(
                path, limit=MAX_FILE_BYTES, what="the ONNX file", follow=True, error=ONNXImportError
            )
        except OSError as error:
            raise ONNXImportError(
                f"df.import_onnx: no ONNX file at {str(path)!r} ({error.strerror or error}). "
                "Fix: pass the path of a .onnx file (or the model's bytes, or an "
                "onnx.ModelProto)."
            ) from None
        model = _parse(onnx, data, f"the file {str(path)!r}")
        base_dir = path.parent
    else:
        raise ONNXImportError(
            f"df.import_onnx takes a file path, bytes or an onnx.ModelProto; got "
            f"{type(source).__name__}. Fix: pass the path of the .onnx file, e.g. "
            "df.import_onnx('model.onnx')."
        )
    _load_external_data(onnx, model, base_dir)
    try:
        onnx.checker.check_model(model)
    except Exception as error:  # noqa: BLE001 - ValidationError, and the checker's other errors
        first = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
        raise ONNXImportError(
            f"df.import_onnx: the model is not valid ONNX (onnx.checker says: {first}). Fix: "
            "export it again, or repair it with the onnx package."
        ) from None
    opset = default_opset(model)
    if opset < MIN_OPSET:
        model = _converted(onnx, model, opset)
    return model


CONVERTED_KEY = "difffn.converted_from_opset"
CONVERT_TO = 13


def _converted(onnx, model, opset: int):
    """A model of opset 6-8 converted by the onnx package's version converter (MATLAB's
    importer reads opset 6 and newer); the original opset is kept in its metadata."""
    from onnx import version_converter

    try:
        converted = version_converter.convert_version(model, CONVERT_TO)
        onnx.checker.check_model(converted)
    except Exception as error:  # noqa: BLE001 - the converter raises many kinds
        first = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
        raise ONNXImportError(
            f"df.import_onnx: the model uses ONNX opset {opset}; difffn reads opset "
            f"{MIN_OPSET} or newer and converts older ones with onnx.version_converter, which "
            f"failed for this model ({type(error).__name__}: {first}). Fix: export it again "
            "with a newer opset (torch.onnx.export(..., opset_version=17))."
        ) from None
    entry = converted.metadata_props.add()
    entry.key, entry.value = CONVERTED_KEY, str(opset)
    return converted


def _parse(onnx, data: bytes, where: str):
    from google.protobuf.message import DecodeError

    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as error:
        raise ONNXImportError(
            f"df.import_onnx: {where} is not an ONNX model, or it is truncated ({len(data)} "
            f"bytes; protobuf says: {error}). Fix: check that the file was copied whole and "
            "is a .onnx model."
        ) from None
    if not model.HasField("graph") or not model.opset_import or model.ir_version <= 0:
        raise ONNXImportError(
            f"df.import_onnx: {where} is not an ONNX model ({len(data)} bytes, without a graph "
            "or an opset). Fix: pass a .onnx file exported by MATLAB, PyTorch or the onnx "
            "package."
        )
    return model


def _external_tensors(onnx, model):
    """The tensors of the model (initializers and tensor attributes, subgraphs included) whose
    data lives in external files."""
    found = []

    def visit(graph):
        tensors = list(graph.initializer)
        for node in graph.node:
            for attribute in node.attribute:
                if attribute.HasField("t"):
                    tensors.append(attribute.t)
                tensors.extend(attribute.tensors)
                if attribute.HasField("g"):
                    visit(attribute.g)
                for sub in attribute.graphs:
                    visit(sub)
        for tensor in tensors:
            if tensor.data_location == onnx.TensorProto.EXTERNAL:
                found.append(tensor)

    visit(model.graph)
    return found


def _load_external_data(onnx, model, base_dir) -> None:
    """Read external tensor data from files beside the model, or say which are missing."""
    tensors = _external_tensors(onnx, model)
    if not tensors:
        return
    if base_dir is None:
        names = ", ".join(repr(t.name) for t in tensors[:5])
        raise ONNXImportError(
            f"df.import_onnx: tensors {names} keep their data in external files, and a model "
            "given as bytes or a ModelProto has no folder to find them in. Fix: pass the path "
            "of the .onnx file, with its data files beside it."
        )
    missing = []
    for tensor in tensors:
        location = _external_info(tensor).get("location", "")
        relative = Path(location)
        if not location or relative.is_absolute() or ".." in relative.parts:
            raise ONNXImportError(
                f"df.import_onnx: tensor {tensor.name!r} points at external data "
                f"{location!r}, outside the model's folder; difffn reads external data only "
                "from files beside the model. Fix: move the data file next to the model and "
                "set its location to the file name."
            )
        if not files.inside(base_dir, location):
            if not os.path.lexists(base_dir / relative) and all(
                not (base_dir / Path(*relative.parts[:n])).is_symlink()
                for n in range(1, len(relative.parts))
            ):
                missing.append((tensor.name, location))
                continue
            raise ONNXImportError(
                f"df.import_onnx: the external data of tensor {tensor.name!r}, {location!r}, "
                "is a symbolic link, lies behind one, or is not a regular file; difffn reads "
                "external data only from regular files in the model's folder (a link could "
                "point anywhere). Fix: copy the data file itself next to the model."
            )
    if missing:
        listed = "; ".join(f"{name!r} in {loc!r}" for name, loc in missing[:10])
        raise ONNXImportError(
            f"df.import_onnx: the model keeps {len(missing)} tensor(s) in external data files "
            f"that are not in {str(base_dir)!r}: {listed}. Fix: copy the data file(s) next to "
            "the .onnx file."
        )
    for tensor in tensors:
        _read_external(onnx, tensor, base_dir)


def _external_info(tensor) -> dict[str, str]:
    return {entry.key: entry.value for entry in tensor.external_data}


def _read_external(onnx, tensor, base_dir: Path) -> None:
    """Read one tensor's external data into it: bounded, checked against its dims and type, from
    a regular file opened without following a link (``_core.files``)."""
    info = _external_info(tensor)
    what = f"the external data of tensor {tensor.name!r} ({info['location']!r})"
    try:
        offset = int(info.get("offset", 0))
        length = None if info.get("length") is None else int(info["length"])
    except ValueError:
        raise ONNXImportError(
            f"df.import_onnx: {what} has offset {info.get('offset')!r} and length "
            f"{info.get('length')!r}, which are not whole numbers. Fix: repair or re-export "
            "the model."
        ) from None
    expected = _nbytes(tensor)
    path = base_dir / info["location"]
    fd = files.open_regular(path, os.O_RDONLY, what=what, error=ONNXImportError)
    try:
        size = os.fstat(fd).st_size
        if length is None:
            length = size - offset
        if offset < 0 or length < 0 or offset + length > size:
            raise ONNXImportError(
                f"df.import_onnx: {what} asks for {length} bytes from offset {offset}; the file "
                f"has {size} bytes. Fix: the data file does not belong to this model (or is "
                "truncated): copy it again, or re-export the model."
            )
        if expected is not None and length != expected:
            raise ONNXImportError(
                f"df.import_onnx: tensor {tensor.name!r} has dims {list(tensor.dims)} of "
                f"element type {tensor.data_type}, {expected} bytes; {what} holds {length}. "
                "Fix: repair or re-export the model."
            )
        _limits.check(f"tensor {tensor.name!r}", (length,), np.uint8)
        chunks, done = [], 0
        while done < length:
            chunk = os.pread(fd, min(length - done, 1 << 30), offset + done)
            if not chunk:
                raise ONNXImportError(f"df.import_onnx: {what} changed while it was read.")
            chunks.append(chunk)
            done += len(chunk)
    finally:
        os.close(fd)
    tensor.raw_data = b"".join(chunks)
    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.DEFAULT


def _nbytes(tensor) -> int | None:
    """The bytes a tensor's dims and element type need (None: a type without a fixed size),
    checked against the bound first."""
    try:
        dtype = np_dtype(tensor.data_type)
    except Unsupported:
        return None
    _limits.check(f"tensor {tensor.name!r}", tuple(tensor.dims), dtype)
    return math.prod(tensor.dims) * np.dtype(dtype).itemsize


def default_opset(model) -> int:
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    return 0


def read_graph(model) -> GraphSpec:
    """The model as plain values, with shapes inferred by ``onnx.shape_inference``."""
    onnx = onnx_module()
    try:
        inferred = onnx.shape_inference.infer_shapes(_without_large_weights(onnx, model))
    except Exception:  # noqa: BLE001 - shape inference is a help, not a requirement
        inferred = model
    graph = model.graph
    initializers = {t.name: _tensor(onnx, t, f"initializer {t.name!r}") for t in graph.initializer}
    check_types(onnx, model, inferred)
    nodes = []
    for i, node in enumerate(graph.node):
        _check_text(node, i)
        nodes.append(
            Node(
                op_type=node.op_type,
                domain=node.domain,
                name=node.name or f"{node.op_type}_{i}",
                inputs=tuple(node.input),
                outputs=tuple(node.output),
                attributes=tuple(
                    (a.name, _attribute(onnx, a, f"attribute {a.name!r} of node {node.name!r}"))
                    for a in node.attribute
                ),
            )
        )
    value_info = {}
    for info in (*inferred.graph.value_info, *graph.input, *graph.output):
        value_info[info.name] = _tensor_info(info)
    return GraphSpec(
        opset=default_opset(model),
        inputs=[_tensor_info(i) for i in graph.input if i.name not in initializers],
        outputs=[_tensor_info(o) for o in graph.output],
        initializers=initializers,
        nodes=nodes,
        value_info=value_info,
        graph_name=graph.name,
    )


def check_types(onnx, model, inferred) -> None:
    """Each node's inputs of known element type against its operator's schema (the onnx
    package's): inputs that share a type variable (``T`` of MatMul's ``A`` and ``B``) have one
    type, and that type is one the operator takes.

    Raises:
      ONNXImportError: naming the node, its inputs and their types, and what the schema allows.
    """
    graph = model.graph
    types: dict[str, int] = {t.name: t.data_type for t in graph.initializer}
    for info in (*inferred.graph.value_info, *graph.input):
        kind = info.type.WhichOneof("value")
        if kind == "tensor_type" and info.type.tensor_type.elem_type:
            types.setdefault(info.name, info.type.tensor_type.elem_type)
    opset = default_opset(model)
    for i, node in enumerate(graph.node):
        if node.domain not in ("", "ai.onnx"):
            continue
        try:
            schema = onnx.defs.get_schema(node.op_type, opset, "")
        except Exception:  # noqa: BLE001 - an operator the onnx package does not know: named later
            continue
        if not schema.inputs:
            continue
        allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
        bound: dict[str, tuple[str, str]] = {}
        name = node.name or f"{node.op_type}_{i}"
        for position, tensor in enumerate(node.input):
            if not tensor or tensor not in types:
                continue
            formal = schema.inputs[min(position, len(schema.inputs) - 1)]
            variable = formal.type_str
            got = f"tensor({onnx.TensorProto.DataType.Name(types[tensor]).lower()})"
            if variable in allowed and got not in allowed[variable]:
                raise ONNXImportError(
                    f"df.import_onnx: node {name!r} ({node.op_type}): input {position} "
                    f"({tensor!r}) is {got}; the operator takes {sorted(allowed[variable])} "
                    "there. Fix: repair the model (cast the input with a Cast node)."
                )
            if variable in allowed:
                first = bound.setdefault(variable, (tensor, got))
                if first[1] != got:
                    raise ONNXImportError(
                        f"df.import_onnx: node {name!r} ({node.op_type}): its inputs "
                        f"{first[0]!r} ({first[1]}) and {tensor!r} ({got}) must have one element "
                        f"type (type variable {variable!r} of the operator). Fix: repair the "
                        "model (cast one with a Cast node)."
                    )


_LARGE = 1 << 16  # bytes: weights, never shapes or indices that shape inference reads


def _without_large_weights(onnx, model):
    """``model`` for shape inference: its large initializers as typed graph inputs, no data.

    ``onnx.shape_inference.infer_shapes`` serializes the whole model and parses its result back,
    weights included (VGG-19: about 550 MB, seconds per call); it needs only their shapes. Small
    initializers keep their values: shape inference reads constant shapes, axes and indices.
    """
    graph = model.graph
    large = [t for t in graph.initializer if len(t.raw_data) > _LARGE or t.data_location == 1]
    if not large:
        return model
    names = {t.name for t in large}
    light = onnx.GraphProto(name=graph.name)
    light.node.extend(graph.node)
    light.input.extend(graph.input)
    known = {i.name for i in graph.input}
    light.input.extend(
        onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
        for t in large
        if t.name not in known
    )
    light.output.extend(graph.output)
    light.value_info.extend(graph.value_info)
    light.initializer.extend(t for t in graph.initializer if t.name not in names)
    light.sparse_initializer.extend(graph.sparse_initializer)
    result = onnx.ModelProto(ir_version=model.ir_version)
    result.opset_import.extend(model.opset_import)
    result.functions.extend(model.functions)
    result.graph.CopyFrom(light)
    return result


def _tensor(onnx, tensor, what: str):
    """A tensor's values as an array (bounded, its dims checked against its data), or the
    ``Unsupported`` of an element type difffn does not take."""
    try:
        dtype = np_dtype(tensor.data_type)
    except Unsupported as error:
        return error
    _limits.check(what, tuple(tensor.dims), dtype)
    try:
        array = np.asarray(onnx.numpy_helper.to_array(tensor))
    except Exception as error:  # noqa: BLE001 - the onnx package's errors on inconsistent data
        array = error
    if isinstance(array, Exception) or array.shape != tuple(tensor.dims):
        got = f"{type(array).__name__}: {array}" if isinstance(array, Exception) else array.shape
        raise ONNXImportError(
            f"df.import_onnx: {what} has dims {list(tensor.dims)} of element type "
            f"{np.dtype(dtype).name}, which its data does not fit ({str(got)[:200]}). Fix: "
            "repair or re-export the model."
        )
    return array


def _tensor_info(info) -> TensorInfo:
    kind = info.type.WhichOneof("value")
    if kind != "tensor_type":
        return TensorInfo(info.name, -1, None)
    tensor_type = info.type.tensor_type
    dims = None
    if tensor_type.HasField("shape"):
        dims = tuple(
            d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in tensor_type.shape.dim
        )
    return TensorInfo(info.name, tensor_type.elem_type, dims)


class Subgraph:
    """An attribute that holds a graph (If, Loop, Scan): difffn does not import these."""

    def __repr__(self):
        return "<subgraph>"

    def __eq__(self, other):
        return isinstance(other, Subgraph)

    def __hash__(self):
        return 0


def _attribute(onnx, attribute, what: str):
    kind = onnx.AttributeProto
    t = attribute.type
    if t == kind.FLOAT:
        return float(attribute.f)
    if t == kind.INT:
        return int(attribute.i)
    if t == kind.STRING:
        return attribute.s.decode("utf-8", "replace")
    if t == kind.FLOATS:
        return tuple(float(v) for v in attribute.floats)
    if t == kind.INTS:
        return tuple(int(v) for v in attribute.ints)
    if t == kind.STRINGS:
        return tuple(s.decode("utf-8", "replace") for s in attribute.strings)
    if t == kind.TENSOR:
        value = _tensor(onnx, attribute.t, what)
        return value if isinstance(value, Unsupported) else FrozenArray(value)
    return Subgraph()


def _check_text(node, index: int) -> None:
    """A node's names are text: protobuf hands a string field that is not valid UTF-8 (a damaged
    or crafted file) back as bytes, which nothing downstream expects."""
    fields = {"name": [node.name], "op_type": [node.op_type], "domain": [node.domain]}
    fields["input"], fields["output"] = list(node.input), list(node.output)
    for field, values in fields.items():
        if any(not isinstance(v, str) for v in values):
            raise ONNXImportError(
                f"df.import_onnx: node {index} of the graph has a {field} that is not valid "
                "UTF-8 text (the file is damaged or was not written by an ONNX exporter). Fix: "
                "export the model again."
            )

"""``df.export_onnx``: a network's predict as an ONNX file (MATLAB's ``exportONNXNetwork``).

The network is traced once with ``jax.make_jaxpr`` (symbolic sizes where a layout says
``None``: ``B`` axes share one symbol, so the file takes any batch size), each layer inside a
``jax.named_scope`` of its name, and ``_lower`` writes the jaxpr as ONNX nodes (why by hand and
not with jax2onnx: see ``_lower``). Parameters become initializers named by their place in the
network (``"fc.weights"``; parameters that the lowering combines at export time, such as a
batch norm's scale and variance, keep the first one's name). The file takes and returns
difffn's storage order (channels-last images: ``"BSSC"`` is NHWC); its metadata records the
formats, and ``df.import_onnx`` reads them back, so the file imports as it was exported.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import InconclusiveDimensionOperation

from .._core import Layout, ONNXExportError, dims, dlarray, stripdims, type_name
from .._layer import call_layer
from .._network import Network, needed_layers, resolve_layouts
from ._export_optimize import optimize as _optimize
from ._load import onnx_module
from ._lower import OPSET, Const, Lowering

FORMATS_KEY = "difffn.input_formats"


def export_onnx(
    net: Network,
    *layouts_and_path: Any,
    path: str | os.PathLike[str] | None = None,
    optimize: bool = True,
) -> Path:
    """Write a network's predict as an ONNX file that ONNX Runtime runs.

    Built-in layers and custom layers export alike: the predict is traced and each JAX
    operation is written as ONNX nodes (elementwise math, matmul/einsum, convolution, pooling,
    reshapes, reductions, ``jax.lax.scan`` of a fixed length unrolled, ``DifferentiableFunction``
    and ``custom_jvp`` through their forward pass). Inputs and outputs are in difffn's storage
    order (images NHWC) and keep the network's input and output names.

    Args:
      net: an initialized ``df.Network``.
      *layouts_and_path: one ``df.Layout`` per network input (``None`` sizes become symbolic
        in the file; ``B`` axes share one), then the file path. The layouts may be left out
        when the input layers know them.
      path: the file (instead of the last positional argument).
      optimize: rewrite the graph for inference (default): transposes between channel-wise
        operations removed, batch normalization and biases folded into the convolutions'
        weights (as ``torch.onnx.export`` does), unused nodes dropped. The outputs are the same
        up to float rounding; a folded batch normalization is no longer a node of its own, so
        ``df.import_onnx`` of the file gives a network without it (``optimize=False`` keeps
        every layer's operations, e.g. to fine-tune the imported network).

    Returns:
      The path written.

    Raises:
      MissingDependencyError: onnx is not installed (``pip install difffn[onnx]``).
      ONNXExportError: a layer uses an operation with no ONNX lowering (the message names the
        layer and the operation), the network is not initialized, or the path is missing.
      NetworkError: wrong number of layouts.

    Examples:
      >>> import os, tempfile, jax, numpy as np, onnxruntime
      >>> import difffn as df
      >>> net = df.Network([df.layers.FeatureInput(3, name="in"),
      ...                   df.layers.FullyConnected(2, name="fc"), df.layers.ReLU(name="relu")])
      >>> net = net.initialize(key=jax.random.key(0))
      >>> path = df.export_onnx(net, os.path.join(tempfile.mkdtemp(), "net.onnx"))
      >>> session = onnxruntime.InferenceSession(str(path))
      >>> x = np.ones((4, 3), np.float32)
      >>> (y,) = session.run(None, {"in": x})
      >>> bool(np.allclose(y, net.predict(x).data, atol=1e-6))
      True
    """
    onnx = onnx_module("df.export_onnx")
    from onnx import helper, numpy_helper

    if path is None:
        if not layouts_and_path or not isinstance(layouts_and_path[-1], (str, os.PathLike)):
            raise ONNXExportError(
                "df.export_onnx(net, *layouts, path): the last argument must be the file path "
                "(a str or os.PathLike). Fix: df.export_onnx(net, 'model.onnx')."
            )
        path, layouts = layouts_and_path[-1], layouts_and_path[:-1]
    else:
        layouts = layouts_and_path
    if not isinstance(net, Network):
        raise ONNXExportError(
            f"df.export_onnx expected a df.Network; got {type_name(net)}. Fix: wrap a layer in a "
            "network first, e.g. df.Network([df.layers.FeatureInput(3), layer]).initialize("
            "key=jax.random.key(0))."
        )
    if not net.initialized:
        raise ONNXExportError(
            "df.export_onnx: the network is not initialized. Fix: "
            "net = net.initialize(key=jax.random.key(0)) (or train it) first."
        )
    layouts = _merged_layouts(net, layouts)
    specs, symbols = _input_specs(net, layouts)

    leaves_with_paths, treedef = jax.tree_util.tree_flatten_with_path(net)
    leaves = [leaf for _, leaf in leaves_with_paths]
    param_names = [jax.tree_util.keystr(p).lstrip(".") for p, _ in leaves_with_paths]
    scopes = {_scope(layer.name): layer.name for layer in net.layers}
    output_formats: list[str] = []

    def predict(params, *xs):
        inner = jax.tree_util.tree_unflatten(treedef, params)
        inputs = tuple(dlarray(x, lo.format) for x, lo in zip(xs, layouts, strict=True))
        outputs = _run_scoped(inner, inputs)
        output_formats[:] = [dims(y) for y in outputs]
        return tuple(stripdims(y) for y in outputs)

    try:
        closed = jax.make_jaxpr(predict)(leaves, *specs)
    except (InconclusiveDimensionOperation, jax.errors.ConcretizationTypeError) as error:
        # a layer that needs a concrete size (an imported network's shape computations)
        raise ONNXExportError(
            f"df.export_onnx: the network needs concrete sizes, and the layouts {layouts} leave "
            f"some as None ({str(error).splitlines()[0]}). Fix: give every size in the "
            "layouts, e.g. df.export_onnx(net, df.Layout((1, ...), fmt), path)."
        ) from None
    lowering = Lowering(helper, numpy_helper, symbols, scopes)
    input_names = list(net.input_names)
    args = [Const(np.asarray(v), n) for v, n in zip(leaves, param_names, strict=True)]
    lowering.names.update(input_names)
    results = lowering.run(closed.jaxpr, closed.consts, [*args, *input_names])
    outputs = []
    producers = {out: node for node in lowering.nodes for out in node.output}
    for name, value, aval in zip(net.output_names, results, closed.out_avals, strict=True):
        out_name = lowering.fresh(name)
        tensor = lowering.tensor(value)
        if tensor in producers:  # the node's output takes the name (no Identity to import)
            _rename(lowering.nodes, tensor, out_name)
            del producers[tensor]
        else:
            lowering.nodes.append(
                helper.make_node("Identity", [tensor], [out_name], f"{name}/output")
            )
        outputs.append(_value_info(helper, out_name, aval.shape, aval.dtype))
    nodes, initializers = lowering.nodes, dict[str, Any](lowering.initializers)
    if optimize:
        nodes, initializers = _optimize(
            nodes, initializers, [o.name for o in outputs], helper, numpy_helper, lowering.fresh
        )
    graph = helper.make_graph(
        nodes,
        "difffn",
        [_value_info(helper, n, s.shape, s.dtype) for n, s in zip(input_names, specs, strict=True)],
        outputs,
        list(initializers.values()),
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="difffn"
    )
    helper.set_model_props(
        model,
        {
            FORMATS_KEY: json.dumps({n: lo.format for n, lo in zip(input_names, layouts)}),
            "difffn.output_formats": json.dumps(dict(zip(net.output_names, output_formats))),
        },
    )
    onnx.checker.check_model(model, full_check=True)
    return _write(onnx, model, Path(path))


def _merged_layouts(net: Network, given) -> list[Layout]:
    """The given layouts (or the input layers'), with the sizes the input layers know."""
    if not given and None in net.input_layouts:
        given = tuple(
            known if known is not None else _entry_layout(net, k)
            for k, known in enumerate(net.input_layouts)
        )
    merged = []
    for layout, known in zip(resolve_layouts(net, tuple(given)), net.input_layouts, strict=True):
        if known is not None:
            sizes = (a if a is not None else b for a, b in zip(layout.shape, known.shape))
            layout = Layout(tuple(sizes), layout.format)
        merged.append(layout)
    return merged


def _entry_layout(net, k):
    """The layout an imported network's ``ONNXInput`` for input ``k`` declares, if any."""
    g = net.graph
    for i, sources in enumerate(g.sources):
        if any(s.kind == "input" and s.index == k for s in sources):
            layout = getattr(net.layers[i], "input_layout", None)
            if isinstance(layout, Layout):
                return layout
    return None


def _input_specs(net, layouts):
    """Abstract inputs (float32 unless the input layer says) with symbolic sizes, and where
    each symbol is read from."""
    names, symbols = [], {}
    for k, layout in enumerate(layouts):
        for axis, (size, label) in enumerate(zip(layout.shape, layout.format)):
            if size is None:
                symbol = "B" if label == "B" else f"d{k}_{axis}"
                if symbol not in names:
                    names.append(symbol)
                    symbols[symbol] = (net.input_names[k], axis)
    scope = jax.export.SymbolicScope()
    dims_ = (
        dict(zip(names, jax.export.symbolic_shape(",".join(names), scope=scope))) if names else {}
    )
    specs = []
    for k, layout in enumerate(layouts):
        shape = tuple(
            (dims_["B" if label == "B" else f"d{k}_{axis}"] if size is None else size)
            for axis, (size, label) in enumerate(zip(layout.shape, layout.format))
        )
        specs.append(jax.ShapeDtypeStruct(shape, _input_dtype(net, k)))
    return specs, symbols


def _input_dtype(net, k):
    """float32, or the element type an imported network's input layer declares (token ids)."""
    g = net.graph
    for i, sources in enumerate(g.sources):
        if any(s.kind == "input" and s.index == k for s in sources):
            # int64 token ids are int32 without jax's x64 mode: the file says what JAX computes
            dtype = jnp.dtype(getattr(net.layers[i], "input_dtype", "float32"))
            return jax.dtypes.canonicalize_dtype(dtype)
    return jnp.float32


def _scope(name: str) -> str:
    # jax.named_scope splits on "/": imported layers are named after ONNX nodes ("/conv1/Conv")
    return name.replace("/", "|") or "layer"


def _run_scoped(net, inputs):
    """The network's predict (``_execute.execute``), each layer in a scope of its name."""
    g = net.graph
    values = {}
    for i in g.order:
        if i not in needed_layers(g, g.outputs):
            continue
        layer = net.layers[i]
        ins = tuple(
            inputs[s.index] if s.kind == "input" else values[(s.index, s.port)]
            for s in g.sources[i]
        )
        with jax.named_scope(_scope(layer.name)):
            outs, _ = call_layer(layer, ins, training=False, key=None)
        for o, y in enumerate(outs):
            values[(i, o)] = y
    return tuple(values[w] for w in g.outputs)


def _rename(nodes, old: str, new: str) -> None:
    for node in nodes:
        for ports in (node.input, node.output):
            for i, name in enumerate(ports):
                if name == old:
                    ports[i] = new


def _value_info(helper, name, shape, dtype):
    sizes = [d if isinstance(d, int) else str(d) for d in shape]
    return helper.make_tensor_value_info(
        name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), sizes
    )


def _write(onnx, model, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=path.parent, suffix=".onnx.tmp")
    os.close(handle)
    try:
        onnx.save(model, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path

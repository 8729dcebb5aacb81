"""``df.export`` / ``df.load_exported``: a network's compiled predict as a file, and back.

MATLAB generates code from a trained network; JAX serializes the compiled computation instead.
``df.export(net, *layouts, path)`` traces the network's predict for inputs of the given layouts
(a ``None`` size, e.g. the batch, becomes a symbolic dimension, so one file serves every batch
size), exports it with ``jax.export`` together with its VJP up to ``vjp_order`` (default first
order; so the loaded model can be differentiated with respect to its inputs, custom backwards
included, that many times in reverse mode) and writes the
serialized module with a description (input and output names, input layouts and dtypes,
output formats, the layer names and classes, the difffn and jax versions) to a difffn container
of kind ``"exported"`` (``_container.py``: msgpack, checksum, atomic write).

The file holds StableHLO bytecode and data, never Python code or pickle:
``df.load_exported(path)`` returns an [`ExportedNetwork`][difffn.ExportedNetwork] that runs without
the network's
layer classes being importable. It uses the same export core (``_export.py``) as
``check_layer(..., check_export=True)``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import jax
import jax.numpy as jnp
import numpy as np

from .._core import (
    Data,
    Error,
    FormattedArray,
    Layout,
    NetworkError,
    Output,
    SerializationError,
    __version__,
    as_numbers,
    dims,
    dlarray,
    stripdims,
    type_name,
    validate_format,
)
from .._network import Network, resolve_layouts
from . import _container, _export
from ._container import Optional, check_schema
from ._serialization import _describe, _layout_payload

FORMAT = "difffn.exported"
FORMAT_VERSION = 1
KIND = "exported"


_PLATFORMS = ("cpu", "cuda", "rocm", "tpu")  # jax.export's names


def _check_platforms(platforms) -> None:
    if platforms is None:
        return
    if isinstance(platforms, str):
        platforms = (platforms,)
    for name in platforms:
        if name not in _PLATFORMS:
            hint = " JAX names GPUs 'cuda' (NVIDIA) or 'rocm' (AMD)." if name == "gpu" else ""
            raise SerializationError(
                f"df.export: platforms has {name!r}, which is not a platform JAX exports for; "
                f"they are {list(_PLATFORMS)}.{hint} Fix: e.g. platforms=('cpu', 'cuda')."
            )


def export(
    net: Network,
    *layouts_and_path: Any,
    path: str | os.PathLike[str] | None = None,
    dtype: Any = jnp.float32,
    platforms: Sequence[str] | None = None,
    vjp_order: int = 1,
) -> Path:
    """Export a network's compiled predict to a file (MATLAB's code generation, via jax.export).

    Args:
      net: an initialized ``df.Network`` whose layers are all acceleratable.
      *layouts_and_path: one ``df.Layout`` per network input (``None`` sizes become symbolic
        dimensions: ``B`` axes share one symbol, so any batch size works), then the file
        path. The layouts may be left out when every input's layout is known (input layers
        or ``initialize``); a known layout fills the sizes a given one leaves ``None``.
      path: the file (instead of the last positional argument).
      dtype: the inputs' dtype (default float32), or one per input.
      platforms: where the file may run, e.g. ``("cpu", "cuda")`` (default: this machine's).
      vjp_order: how many reverse-mode derivatives the file keeps (``jax.export``'s
        ``vjp_order``): 1 (default) for ``jax.grad`` of the loaded model, 2 for
        ``jax.grad(jax.grad(...))``, 0 for none (a smaller file).

    Returns:
      The path written (atomically).

    Raises:
      SerializationError: the network cannot be traced for these layouts (the message says
        why), a layer is not acceleratable, or the file cannot be written.
      NetworkError: wrong number of layouts, or a layout its input layer does not accept.

    Examples:
      >>> import jax, jax.numpy as jnp, tempfile, os
      >>> import difffn as df
      >>> net = df.Network([df.layers.FeatureInput(3, name="in"),
      ...                   df.layers.FullyConnected(2, name="fc")])
      >>> net = net.initialize(key=jax.random.key(0))
      >>> path = df.export(net, os.path.join(tempfile.mkdtemp(), "net.difffn"))
      >>> model = df.load_exported(path)
      >>> model.input_layouts, model.output_formats
      ((Layout((None, 3), 'BC'),), ('BC',))
      >>> x = jnp.ones((5, 3))
      >>> bool(jnp.allclose(model(x).data, net.predict(x).data))
      True
    """
    if path is None:
        if not layouts_and_path or not isinstance(layouts_and_path[-1], (str, os.PathLike)):
            raise SerializationError(
                "df.export(net, *layouts, path): the last argument must be the file path (a "
                f"str or os.PathLike); got {_last(layouts_and_path)}. Fix: "
                "df.export(net, df.Layout((None, ...), 'B...'), 'model.difffn')."
            )
        path, layouts = layouts_and_path[-1], layouts_and_path[:-1]
    else:
        layouts = layouts_and_path
    if not isinstance(net, Network):
        raise SerializationError(
            f"df.export expected a df.Network; got {type_name(net)}. Fix: df.export(net, "
            "*layouts, path=...) with net a df.Network (wrap a single layer: "
            "df.Network([layer]))."
        )
    if not isinstance(vjp_order, int) or isinstance(vjp_order, bool) or vjp_order < 0:
        raise SerializationError(
            f"df.export: vjp_order is {vjp_order!r}; expected a non-negative int (how many "
            "reverse-mode derivatives the file keeps). Fix: vjp_order=1 (default) or 2."
        )
    if not net.initialized:
        raise SerializationError(
            "df.export: the network is not initialized. Fix: "
            "net = net.initialize(..., key=jax.random.key(0)) (or train it) first."
        )
    eager = [layer.name for layer in net.layers if not layer.acceleratable]
    if eager:
        raise SerializationError(
            f"df.export: layer(s) {eager} set acceleratable = False: they run eagerly and cannot "
            "be traced, so jax.export cannot export them. Fix: express value-dependent branches "
            "with jnp.where or jax.lax.cond and drop acceleratable = False."
        )
    _check_platforms(platforms)
    layouts = _merged_layouts(net, layouts)
    dtypes = list(dtype) if isinstance(dtype, (tuple, list)) else [dtype] * len(layouts)
    output_formats: list[str] = []

    def predict(*xs):
        inputs = tuple(dlarray(x, lo.format) for x, lo in zip(xs, layouts, strict=True))
        outputs, _ = net.run(inputs, None, training=False)
        output_formats[:] = [dims(y) for y in outputs]
        return tuple(stripdims(y) for y in outputs)

    exported = _export.export_function(predict, *layouts, dtype=dtypes, platforms=platforms)
    data = _export.serialize(exported, vjp_order=vjp_order)
    payload = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "difffn_version": __version__,
        "jax_version": jax.__version__,
        "exported": data,
        "vjp_order": vjp_order,
        "platforms": list(exported.platforms),
        "input_names": list(net.input_names),
        "output_names": list(net.output_names),
        "input_layouts": [_layout_payload(lo) for lo in layouts],
        "input_dtypes": [np.dtype(d).name for d in dtypes],
        "output_formats": list(output_formats),
        "structure": _describe(net),
    }
    return _container.write(path, KIND, payload)


_LAYOUT = {"shape": [int], "format": str}
SCHEMA = {  # every field load_exported reads, checked before anything is built from it
    "format_version": int,
    "exported": bytes,
    "platforms": [str],
    "input_names": [str],
    "output_names": [str],
    "input_layouts": [_LAYOUT],
    "input_dtypes": [str],
    "output_formats": [str],
    "structure": {"layers": [{"name": str, "class": str}]},
}
_OPTIONAL = {
    "vjp_order": Optional(int),
    "difffn_version": Optional(str),
    "jax_version": Optional(str),
}


def load_exported(path: str | os.PathLike[str]) -> ExportedNetwork:
    """Load a network written by [`export`][difffn.export]; no layer class is imported or run.

    Trust: an exported file carries compiled code for XLA (StableHLO bytecode, which JAX
    deserializes and XLA compiles and runs), like a TensorFlow SavedModel. difffn checks the
    container (checksum) and every field of its description (types, shapes, counts, dtypes)
    before it hands the bytecode to JAX, and turns JAX's deserialization errors into
    ``SerializationError``; but JAX's deserializer and XLA are not hardened against crafted
    bytecode (it can crash or hang the process). Load only exported files you trust. Files of
    ``df.save`` and checkpoints hold data only (arrays and names; no code is ever deserialized).

    Raises:
      SerializationError: the file is damaged, not a difffn export, from a newer difffn, a
        field that does not fit the schema (named, expected vs got), or its module cannot be
        deserialized by this jax or does not match its description.
    """
    payload = _container.read(path, KIND)
    source = str(path)
    if payload.get("format") != FORMAT:
        raise SerializationError(f"{source!r} does not hold a difffn exported network.")
    check_schema(payload, {"format_version": int}, source=source)
    if payload["format_version"] > FORMAT_VERSION:
        raise SerializationError(
            f"{source!r} holds an exported network in format version "
            f"{payload['format_version']}, newer than this difffn reads ({FORMAT_VERSION}). Fix: "
            "upgrade difffn."
        )
    check_schema(payload, SCHEMA, source=source)
    for key, schema in _OPTIONAL.items():
        check_schema(payload.get(key), schema, source=source, where=f"the payload[{key!r}]")
    layouts, dtypes = _check_description(payload, source)
    vjp_order = payload.get("vjp_order", 1)
    try:
        exported = _export.load_exported(payload["exported"])
    except SerializationError as error:
        raise SerializationError(
            f"{source!r}: {error} It was exported with jax {payload.get('jax_version')}; this is "
            f"jax {jax.__version__}. Fix: export it again with this jax."
        ) from None
    _check_module(exported, payload, layouts, source)
    return ExportedNetwork(
        exported,
        input_names=tuple(payload["input_names"]),
        output_names=tuple(payload["output_names"]),
        input_layouts=layouts,
        input_dtypes=dtypes,
        output_formats=tuple(payload["output_formats"]),
        layers=tuple((d["name"], d["class"]) for d in payload["structure"]["layers"]),
        difffn_version=payload.get("difffn_version"),
        source=source,
        vjp_order=int(vjp_order),
    )


def _check_description(payload, source: str) -> tuple[tuple[Layout, ...], tuple[str, ...]]:
    """The input layouts and dtypes of an export's description, checked for consistency."""
    names, layouts, dtypes = (
        payload["input_names"],
        payload["input_layouts"],
        payload["input_dtypes"],
    )
    if not len(names) == len(layouts) == len(dtypes):
        _malformed(
            source,
            f"it lists {len(names)} input names, {len(layouts)} input layouts and "
            f"{len(dtypes)} input dtypes (one each per input)",
        )
    if len(payload["output_names"]) != len(payload["output_formats"]):
        _malformed(
            source,
            f"it lists {len(payload['output_names'])} output names and "
            f"{len(payload['output_formats'])} output formats",
        )
    vjp_order = payload.get("vjp_order", 1)
    if vjp_order is None or vjp_order < 0:
        _malformed(source, f"vjp_order is {vjp_order!r}; expected an int >= 0")
    unknown = [p for p in payload["platforms"] if p not in _PLATFORMS]
    if unknown:
        _malformed(source, f"platforms has {unknown}; expected names of {list(_PLATFORMS)}")
    result = []
    for n, d in enumerate(layouts):
        where = f"the payload['input_layouts'][{n}]"
        if any(size < -1 for size in d["shape"]):
            _malformed(source, f"{where}['shape'] is {d['shape']}; sizes are >= 0 (-1: any)")
        try:
            layout = Layout(tuple(None if size < 0 else size for size in d["shape"]), d["format"])
        except Error as error:
            _malformed(source, f"{where} is not a layout ({error})")
        result.append(layout)
    for n, name in enumerate(dtypes):
        try:
            dtype = np.dtype(name)
        except TypeError:
            dtype = None
        if dtype is None or dtype.kind not in "biuf" or dtype.name != name:
            _malformed(source, f"the payload['input_dtypes'][{n}] is {name!r}, not a dtype name")
    for n, fmt in enumerate(payload["output_formats"]):
        if fmt:
            try:
                validate_format(fmt)
            except Error as error:
                _malformed(source, f"the payload['output_formats'][{n}] is {fmt!r} ({error})")
    return tuple(result), tuple(dtypes)


def _check_module(exported, payload, layouts, source: str) -> None:
    """The deserialized module takes and returns what the description says."""
    ins, outs = exported.in_avals, exported.out_avals
    if len(ins) != len(layouts) or len(outs) != len(payload["output_names"]):
        _malformed(
            source,
            f"its module takes {len(ins)} input(s) and returns {len(outs)}; its description "
            f"lists {len(layouts)} and {len(payload['output_names'])}",
        )
    for n, (aval, layout, dtype) in enumerate(zip(ins, layouts, payload["input_dtypes"])):
        if len(aval.shape) != layout.ndim or aval.dtype != np.dtype(dtype):
            _malformed(
                source,
                f"input {n + 1} of its module is {aval.str_short()}; its description says "
                f"{layout} {dtype}",
            )
    for n, (aval, fmt) in enumerate(zip(outs, payload["output_formats"])):
        if fmt and len(aval.shape) != len(fmt):
            _malformed(
                source,
                f"output {n + 1} of its module is {aval.str_short()}; its description gives it "
                f"the format {fmt!r}",
            )


def _malformed(source: str, what: str) -> NoReturn:
    raise SerializationError(
        f"{source!r} is malformed: {what}. Its checksum is right, so it was written this way (by "
        "another program, or another version). Fix: export the network again with df.export, "
        "or use another copy."
    )


class ExportedNetwork:
    """A network loaded by [`load_exported`][difffn.load_exported]: its compiled predict, callable
    like ``predict``.

    ``model(*inputs)`` takes one array per input (plain, or formatted with the input's format)
    with any size where the export's layout said ``None``; it returns the outputs like
    ``Network.predict`` does: one output or a tuple, each a ``df.FormattedArray`` with the
    format the network gave it (plain when it had none; ``df.stripdims`` gives the array).
    It works under ``jax.jit`` and ``jax.grad``/``jax.vjp`` (up to ``vjp_order`` times, through
    the exported VJP, custom backwards included).

    Attributes:
      input_names, output_names: the network's.
      input_layouts: one ``df.Layout`` per input (``None``: any size).
      input_dtypes: the dtype names the inputs are cast to.
      output_formats: the format of each output (``""``: plain).
      layers: ``(name, class)`` of each layer of the exported network (a description only).
      platforms: where it runs (``"cpu"``, ``"cuda"``, ...).
      vjp_order: how many reverse-mode derivatives the file keeps (1 for older files).
      exported: the ``jax.export.Exported``.
    """

    def __init__(
        self,
        exported: Any,
        *,
        input_names: Sequence[str],
        output_names: Sequence[str],
        input_layouts: Any,
        input_dtypes: Any,
        output_formats: Any,
        layers: Any,
        difffn_version: str | None,
        source: Any,
        vjp_order: int = 1,
    ) -> None:
        self.exported = exported
        self.input_names = input_names
        self.output_names = output_names
        self.input_layouts = input_layouts
        self.input_dtypes = input_dtypes
        self.output_formats = output_formats
        self.layers = layers
        self.difffn_version = difffn_version
        self.source = source
        self.vjp_order = vjp_order

    @property
    def platforms(self) -> tuple[str, ...]:
        return tuple(self.exported.platforms)

    def __call__(self, *inputs: Data) -> Output:
        xs = self._check_inputs(inputs)
        platform = jax.export.default_export_platform()
        if platform not in self.platforms:
            raise SerializationError(
                f"{self.source!r} was exported for platforms {list(self.platforms)}; this "
                f"machine runs {platform!r}. Fix: export with platforms=({platform!r}, ...)."
            )
        outputs = self.exported.call(*xs)
        outputs = tuple(
            dlarray(y, f) if f else y for y, f in zip(outputs, self.output_formats, strict=True)
        )
        return outputs[0] if len(outputs) == 1 else outputs

    predict = __call__

    def _check_inputs(self, inputs) -> list[Any]:
        if len(inputs) != len(self.input_names):
            raise NetworkError(
                f"the exported network takes {len(self.input_names)} input(s) "
                f"{list(self.input_names)}; got {len(inputs)}. Fix: pass one array per input, "
                "in that order."
            )
        xs = []
        for x, name, layout, dtype in zip(
            inputs, self.input_names, self.input_layouts, self.input_dtypes, strict=True
        ):
            if isinstance(x, FormattedArray):
                if x.format != layout.format:
                    raise NetworkError(
                        f"exported network input {name!r} expects format {layout.format!r}; "
                        f"got {x.format!r}. Fix: df.permute(x, {layout.format!r})."
                    )
                x = x.data
            x = jnp.asarray(
                as_numbers(x, what=f"exported network input {name!r}", error=NetworkError)
            )
            bad = x.ndim != layout.ndim or any(
                want is not None and want != got
                for want, got in zip(layout.shape, x.shape, strict=True)
            )
            if bad:
                raise NetworkError(
                    f"exported network input {name!r} expects {layout} (None: any size); got "
                    f"shape {x.shape}. Fix: pass data of the layout the network was exported "
                    "for (or export it again for these sizes)."
                )
            if x.dtype != np.dtype(dtype):
                if not jnp.can_cast(x.dtype, dtype, casting="same_kind"):
                    raise NetworkError(
                        f"exported network input {name!r} expects {dtype}; got {x.dtype}, "
                        f"which does not cast safely. Fix: x.astype({dtype!r})."
                    )
                x = x.astype(dtype)
            xs.append(x)
        return xs

    def __repr__(self) -> str:
        ins = ", ".join(
            f"{n}: {lo}" for n, lo in zip(self.input_names, self.input_layouts, strict=True)
        )
        return (
            f"ExportedNetwork(inputs=[{ins}], outputs={list(self.output_names)}, "
            f"platforms={list(self.platforms)})"
        )


def _last(args) -> str:
    return "nothing" if not args else type_name(args[-1])


def _merged_layouts(net: Network, given) -> list[Layout]:
    """The export layouts: the given ones (or the known ones), known sizes filled in."""
    layouts = resolve_layouts(net, tuple(given))
    known = net.input_layouts
    merged = []
    for layout, k in zip(layouts, known, strict=True):
        if k is not None:
            layout = Layout(
                tuple(
                    a if a is not None else b for a, b in zip(layout.shape, k.shape, strict=True)
                ),
                layout.format,
            )
        merged.append(layout)
    return merged

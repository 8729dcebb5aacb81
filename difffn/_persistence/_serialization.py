"""``df.save`` / ``df.load``: a network's parameters and a description of its structure.

The file (see ``_container.py``: msgpack, checksum, atomic write) holds every array leaf of the
network by its pytree path (``.fc1.weights``), each leaf's kind (learnable, state, constant), the
learn-rate and L2 factors, the recorded layouts, and a description of the structure (layer names
and classes, ports, connections). It never holds code: loading restores the values into a
network of the same structure that the caller provides (``like=``), after checking everything.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._core import Layout, SerializationError, current_path
from .._layer import InputLayer, leaf_kinds, walk
from .._network import Network
from .._network import set_factor as _set_factor
from . import _container
from ._container import Each, Optional, check_schema

FORMAT = "difffn.network"
FORMAT_VERSION = 1
_LIKE_FIX = (
    " Fix: pass like= a network built as the saved one was (the same layers, sizes and names)."
)


def save(path: str | os.PathLike[str], net: Network) -> Path:
    """Save a network's parameters, factors and structure description to ``path``.

    The write is atomic: after a crash, ``path`` holds the old file or the new one.

    Examples:
      >>> import jax, jax.numpy as jnp, tempfile, os
      >>> import difffn as df
      >>> def network():
      ...     return df.Network([df.layers.FeatureInput(3, normalization="none", name="in"),
      ...                        df.layers.FullyConnected(2, name="fc")])
      >>> net = network().initialize(key=jax.random.key(0))
      >>> path = os.path.join(tempfile.mkdtemp(), "net.difffn")
      >>> _ = df.save(path, net)
      >>> loaded = df.load(path, like=network())
      >>> bool(jnp.all(loaded.learnables["fc/weights"] == net.learnables["fc/weights"]))
      True
    """
    if not isinstance(net, Network):
        raise SerializationError(
            f"df.save(path, net) expected a df.Network as net; got {type(net).__name__}. Fix: "
            "df.save('model.difffn', net): the path first, then the network (wrap a single "
            "layer: df.Network([layer]))."
        )
    return _container.write(path, "network", network_payload(net))


def load(path: str | os.PathLike[str], *, like: Network | None = None) -> Network:
    """Load parameters saved by [`save`][difffn.save] into a network of the same structure.

    ``like`` gives the structure (layer classes, names, connections); it may be uninitialized.
    ``path`` may also be a training checkpoint file of an earlier release
    (``net_checkpoint__*.difffn``): its network is loaded. Everything is checked before
    anything is built: a damaged file, a file of another
    structure (the first differing parameter is named, with expected and found shape and
    dtype), a newer format, or a file that is not a difffn file are each a clear
    ``df.SerializationError``.

    Raises:
      SerializationError: no ``like`` network (it is required: the file holds no code), or any
        of the problems above.
    """
    if not isinstance(like, Network):
        raise SerializationError(
            f"df.load(path, like=...) needs a df.Network giving the structure (difffn files "
            f"hold values, never code); got {'no like=' if like is None else type(like).__name__}."
            " Fix: df.load(path, like=make_network()), with the function that built the saved "
            "network."
        )
    if os.path.isfile(os.path.join(path, "difffn_manifest.json")):
        raise SerializationError(
            f"{str(path)!r} is a trainnet checkpoint folder (orbax), not a df.save file. Fix: "
            "continue the run with df.trainnet(..., resume_from=path), or read its arrays with "
            "orbax: orbax.checkpoint.PyTreeCheckpointer().restore(path + '/arrays')."
        )
    payload = _container.read(path, ("network", "checkpoint"))
    if payload.get("format") == "difffn.checkpoint" and isinstance(payload.get("network"), dict):
        payload = payload["network"]
    return restore_network(payload, like, source=str(path))


# -- payload ---------------------------------------------------------------------------------------


def network_payload(net: Network) -> dict[str, Any]:
    """The msgpack-ready description and values of a network."""
    values, parameters = {}, []
    for (path, leaf), kind in zip(
        jax.tree_util.tree_flatten_with_path(net)[0], leaf_kinds(net), strict=True
    ):
        key = jax.tree_util.keystr(path)
        array, dtype = _to_numpy(leaf)
        values[key] = array
        parameters.append({"path": key, "kind": kind, "shape": list(array.shape), "dtype": dtype})
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "structure": _describe(net),
        "parameters": parameters,
        "values": values,
        "factors": [list(f) for f in _collect_factors(net)],
        "layouts": _layouts_payload(net),
    }


_NAMES = [str]
SCHEMA = {
    "format": str,
    "format_version": int,
    "structure": {
        "layers": [{"name": str, "class": str, "inputs": _NAMES, "outputs": _NAMES}],
        "connections": [_NAMES],
        "input_names": _NAMES,
        "output_names": _NAMES,
    },
    "parameters": [{"path": str, "kind": str, "shape": [int], "dtype": str}],
    "values": Each(np.ndarray),
    "factors": [[(str, int, float)]],
    "layouts": Optional([[[{"shape": [int], "format": str}]]]),
}


def restore_network(payload: dict[str, Any], like: Network, *, source: str) -> Network:
    """Check ``payload`` against ``like`` and build the restored network (or raise)."""
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise SerializationError(f"{source!r} does not hold a difffn network.")
    check_schema(payload, {"format_version": int}, source=source)
    if payload["format_version"] > FORMAT_VERSION:
        raise SerializationError(
            f"{source!r} holds a network saved in format version {payload['format_version']}, "
            f"newer than this difffn reads ({FORMAT_VERSION}). Fix: upgrade difffn."
        )
    check_schema(payload, SCHEMA, source=source)
    for p in payload["parameters"]:
        value = payload["values"].get(p["path"])
        if value is None or tuple(value.shape) != tuple(p["shape"]):
            held = "no values" if value is None else f"values of shape {tuple(value.shape)}"
            raise SerializationError(
                f"{source!r} is malformed: parameter {p['path']!r} is listed with shape "
                f"{tuple(p['shape'])} but has {held}. Fix: write it again with df.save, or use "
                "another copy."
            )
    _check_structure(payload["structure"], _describe(like), source)
    values = payload["values"]
    like = _fill_input_statistics(like, payload)
    if not like.initialized:
        like = _abstract_initialized(like, payload.get("layouts"), source)
    expected = [
        (jax.tree_util.keystr(path), leaf)
        for path, leaf in jax.tree_util.tree_flatten_with_path(like)[0]
    ]
    saved = {p["path"]: p for p in payload["parameters"]}
    for key, leaf in expected:
        if key not in saved:
            raise SerializationError(
                f"{source!r} does not match the network: parameter {key!r} is missing from the "
                "file (it was saved from a network of another structure)." + _LIKE_FIX
            )
        want_shape, want_dtype = tuple(np.shape(leaf)), _dtype_name(leaf)
        got_shape, got_dtype = tuple(saved[key]["shape"]), saved[key]["dtype"]
        if (want_shape, want_dtype) != (got_shape, got_dtype):
            raise SerializationError(
                f"{source!r} does not match the network at parameter {key!r}: the network "
                f"expects shape {want_shape} {want_dtype}; the file has {got_shape} {got_dtype}."
                + _LIKE_FIX
            )
    extra = sorted(set(saved) - {k for k, _ in expected})
    if extra:
        raise SerializationError(
            f"{source!r} does not match the network: the file has parameter(s) {extra[:5]} that "
            "the network lacks." + _LIKE_FIX
        )
    leaves = [_from_numpy(values[key], saved[key]["dtype"]) for key, _ in expected]
    net = jax.tree.unflatten(jax.tree.structure(like), leaves)
    for layer_path, field, kind, value in payload.get("factors", []):
        net = _set_factor(net, f"{layer_path}/{field}" if layer_path else field, kind, value)
    layouts = _layouts_from_payload(payload.get("layouts"))
    if net.recorded_layouts is None and layouts is not None:
        net = net.with_layers(net.layers, recorded_layouts=layouts)
    return net


def _fill_input_statistics(like: Network, payload: dict[str, Any]) -> Network:
    """Input layers of ``like`` whose statistics are still empty take the file's.

    ``trainnet`` computes them from the training data; a freshly built network (the usual
    ``like=``) has them empty, and the trained values are part of the model.
    """
    saved = {p["path"]: p for p in payload["parameters"]}
    for layer in like.layers:
        if not isinstance(layer, InputLayer):
            continue
        prefix = f".{layer.name}."
        changes = {}
        for path, entry in saved.items():
            field = path[len(prefix) :]
            if (
                path.startswith(prefix)
                and field.isidentifier()
                and entry["kind"] == "constant"
                and field in layer.__dict__
                and getattr(layer, field) is None
            ):
                changes[field] = _from_numpy(payload["values"][path], entry["dtype"])
        if changes:
            like = like.replace_layer(layer.name, layer.replace(**changes))
    return like


def network_structure(net: Network) -> dict[str, Any]:
    """The layers (names, classes, ports) and connections of ``net``, without its arrays."""
    return _describe(net)


def check_network_structure(saved: dict[str, Any], net: Network, source: str) -> None:
    """Raise a named error at the first layer or connection where ``net`` differs from
    ``saved`` (a `network_structure`, read from a file: its form is checked first)."""
    check_schema(saved, SCHEMA["structure"], source=source, where="the network's structure")
    _check_structure(saved, _describe(net), source)


def _describe(net: Network) -> dict[str, Any]:
    return {
        "layers": [
            {
                "name": layer.name,
                "class": f"{type(layer).__module__}.{type(layer).__qualname__}",
                "inputs": list(layer.input_names),
                "outputs": list(layer.output_names),
            }
            for layer in net.layers
        ],
        "connections": [list(c) for c in net.connections],
        "input_names": list(net.input_names),
        "output_names": list(net.output_names),
    }


def _check_structure(saved: dict[str, Any], current: dict[str, Any], source: str) -> None:
    saved_layers, layers = saved["layers"], current["layers"]
    for i, (s, c) in enumerate(zip(saved_layers, layers, strict=False)):  # lengths next
        if (s["name"], current_path(s["class"])) != (c["name"], c["class"]):
            raise SerializationError(
                f"{source!r} does not match the network at layer {i + 1}: the network has "
                f"{c['name']!r} ({c['class']}); the file has {s['name']!r} ({s['class']})."
                + _LIKE_FIX
            )
    if len(saved_layers) != len(layers):
        raise SerializationError(
            f"{source!r} does not match the network: the file has {len(saved_layers)} layers, "
            f"the network {len(layers)}." + _LIKE_FIX
        )
    if [list(c) for c in saved["connections"]] != current["connections"]:
        raise SerializationError(
            f"{source!r} does not match the network: the layers are connected differently."
            + _LIKE_FIX
        )


def _abstract_initialized(like: Network, layouts_data, source: str) -> Network:
    """``like`` initialized abstractly (shapes only), to know the shapes it expects."""
    recorded = _layouts_from_payload(layouts_data)
    layouts = []
    for name, (i, j), known in zip(
        like.input_names, like.graph.inputs, like.input_layouts, strict=True
    ):
        if known is None and recorded is not None:
            known = recorded[i][0][j]
        if known is None:
            raise SerializationError(
                f"{source!r}: cannot tell the layout of network input {name!r}. Fix: pass an "
                "initialized network as like=."
            )
        layouts.append(known)
    return jax.eval_shape(lambda: like.initialize(*layouts, key=jax.random.key(0)))


def _collect_factors(net: Network):
    """``(layer path, field, kind, value)`` of every factor set explicitly, nested layers too."""
    for p in walk(net):
        for field, kind, value in p.layer._factors:
            if field == p.field:
                yield (p.layer_path, field, kind, value)


def _layouts_payload(net: Network):
    if net.recorded_layouts is None:
        return None
    return [
        [[_layout_payload(lo) for lo in ins], [_layout_payload(lo) for lo in outs]]
        for ins, outs in net.recorded_layouts
    ]


def _layout_payload(layout: Layout):
    return {"shape": [-1 if s is None else int(s) for s in layout.shape], "format": layout.format}


def _layouts_from_payload(data):
    if data is None:
        return None

    def layout(d):
        return Layout(tuple(None if s < 0 else s for s in d["shape"]), d["format"])

    return tuple(
        (tuple(layout(d) for d in ins), tuple(layout(d) for d in outs)) for ins, outs in data
    )


# -- arrays ----------------------------------------------------------------------------------------


def _dtype_name(leaf) -> str:
    return np.dtype(leaf.dtype).name


def _to_numpy(leaf) -> tuple[np.ndarray, str]:
    if isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        raise SerializationError(
            "the network holds a jax.random key as a parameter, which df.save does not store. "
            "Fix: keep keys outside layers and pass them to forward(key=...)."
        )
    array = np.asarray(leaf)
    return array, array.dtype.name


def _from_numpy(array, dtype: str):
    return jnp.asarray(array, dtype=dtype)

"""Editing a network's graph: MATLAB's addLayers, connectLayers, disconnectLayers, removeLayers
and replaceLayer, each a function of (network, ...) that returns a new network.

Every edit works on what a network is made of: its layers and its edges (``Graph.connections``,
as ``("layer/out", "layer/in")`` pairs). It changes them and rebuilds the static graph with
``build_graph``, the one validation that ``df.Network(...)`` also uses, so an unknown name, a port
fed twice or a cycle reads the same either way (prefixed with the edit that caused it). What the
edits follow from MATLAB:

* ``add_layers`` connects the new layers in order (a chain) and to nothing else;
* ``remove_layers`` removes the layers and every edge to or from them, and reconnects nothing;
* ``replace_layer`` feeds the first new layer from the old layer's inputs and lets the last new
  layer feed what the old one fed, matching ports by name (MATLAB's default ``ReconnectBy``) or
  by position;
* a network may be incomplete (dangling inputs) while it is edited; initializing or running it
  names every dangling input.

The layers an edit does not touch are the same objects (parameters, state, factors kept). When
the network was initialized (or every layer is) and the edited one is complete, the layouts are
propagated again, tracing only the layers whose inputs changed; if the sizes no longer fit, the
layouts are dropped and ``initialize``/``predict`` name the layer. The compiled-trace cache
belongs to a structure: an edit that changes the graph or a layer's structure gets a fresh one.
"""

from __future__ import annotations

import dataclasses
import warnings

import jax

from .._core import NetworkError
from .._layer import InputLayer, Layer
from ._graph import build_graph, name_layers
from ._propagate import propagate

_RECONNECT = ("name", "order")


def add_layers(net, layers):
    """``net`` with ``layers`` (a layer or a chain) added, connected in order only."""
    what = "add_layers"
    new = _as_chain(layers, what)
    _check_names(new, taken=net.graph.names, what=what)
    combined = name_layers([*net.layers, *new])
    first = len(net.layers)
    chain = list(range(first, len(combined)))
    return _rebuild(net, combined, [chain], net.connections, _outputs(net), what)


def connect_layers(net, source: str, destination: str):
    """``net`` with the edge ``source`` (an output) -> ``destination`` (an input) added."""
    g = net.graph
    what = f"connect_layers({source!r}, {destination!r})"
    src = g.port(source, kind="output", what=what)
    dst = g.port(destination, kind="input", what=what)
    src_name, dst_name = g.port_name(*src, "output"), g.port_name(*dst, "input")
    if isinstance(net.layers[dst[0]], InputLayer):
        raise NetworkError(
            f"{what}: {g.names[dst[0]]!r} is an input layer; its input is a network input and "
            "cannot be fed by another layer. Fix: connect to a layer that follows it."
        )
    fed = g.sources[dst[0]][dst[1]]
    if fed.kind == "layer":
        previous = g.port_name(fed.index, fed.port, "output")
        raise NetworkError(
            f"{what}: input {dst_name!r} is already fed by {previous!r}; an input takes exactly "
            f"one connection. Fix: net.disconnect_layers({previous!r}, {dst_name!r}) first, or "
            "merge both with an Addition or Concatenation layer."
        )
    edges = (*net.connections, (src_name, dst_name))
    outputs = _outputs(net)
    if outputs is not None and src_name in outputs:
        _warn_stale(g, what, outputs, src_name, dst[0], edges)
    return _rebuild(net, net.layers, [], edges, outputs, what)


def _warn_stale(g, what, outputs, src_name, dst, edges):
    """An output named explicitly now feeds a layer whose results nothing uses: the network
    keeps the named outputs (the edit does not move them), which is worth saying."""
    fed = {c[0] for c in edges}
    unused = [
        g.port_name(dst, o, "output")
        for o in range(len(g.ports[dst][1]))
        if g.port_name(dst, o, "output") not in fed and g.port_name(dst, o, "output") not in outputs
    ]
    if unused:
        warnings.warn(
            f"{what}: the network's outputs were named explicitly ({list(outputs)}, e.g. by "
            f"df.import_onnx or Network(..., outputs=...)), and {src_name!r} stays an output "
            f"while {unused} is used by nothing. Fix: give the outputs again, e.g. "
            f"df.Network([[layer] for layer in net.layers], connections=net.connections, "
            f"outputs={unused!r}).",
            UserWarning,
            stacklevel=3,
        )


def disconnect_layers(net, source: str, destination: str):
    """``net`` without the edge ``source`` -> ``destination``."""
    g = net.graph
    what = f"disconnect_layers({source!r}, {destination!r})"
    src = g.port(source, kind="output", what=what)
    dst = g.port(destination, kind="input", what=what)
    src_name, dst_name = g.port_name(*src, "output"), g.port_name(*dst, "input")
    edge = (src_name, dst_name)
    if edge not in net.connections:
        layer = g.names[dst[0]]
        into = [c for c in net.connections if c[1].partition("/")[0] == layer]
        raise NetworkError(
            f"{what}: there is no connection {src_name!r} -> {dst_name!r}; the connections "
            f"into layer {layer!r} are {into}. Fix: name one of those."
        )
    edges = tuple(c for c in net.connections if c != edge)
    return _rebuild(net, net.layers, [], edges, _outputs(net), what)


def remove_layers(net, names):
    """``net`` without the layers ``names`` (a name or a list of names) and their edges."""
    g = net.graph
    names = [names] if isinstance(names, str) else list(names)
    what = f"remove_layers({names!r})"
    unknown = [n for n in names if n not in g.names]
    if unknown:
        raise NetworkError(
            f"{what}: the network has no layer named {unknown}; its layers are {list(g.names)}. "
            "Fix: use names from that list."
        )
    removed = set(names)
    if removed == set(g.names):
        raise NetworkError(
            f"{what} would remove every layer; a network needs at least one. Fix: build a new "
            "df.Network from the layers you want."
        )
    kept = [layer for layer in net.layers if layer.name not in removed]
    edges = tuple(
        (s, d)
        for s, d in net.connections
        if s.partition("/")[0] not in removed and d.partition("/")[0] not in removed
    )
    outputs = _outputs(net)
    if outputs is not None:
        outputs = [o for o in outputs if o.partition("/")[0] not in removed] or None
    return _rebuild(net, kept, [], edges, outputs, what)


def replace_layer(net, name: str, layers, *, reconnect_by: str = "name"):
    """``net`` with layer ``name`` replaced by a layer or a chain of layers (MATLAB's rules)."""
    g = net.graph
    what = f"replace_layer({name!r}, ...)"
    if reconnect_by not in _RECONNECT:
        raise NetworkError(
            f"{what}: reconnect_by={reconnect_by!r}; expected one of {list(_RECONNECT)}. Fix: "
            "reconnect_by='name' (ports matched by name) or 'order' (by position)."
        )
    if name not in g.names:
        raise NetworkError(
            f"{what}: the network has no layer named {name!r}; its layers are {list(g.names)}. "
            "Fix: use one of those names."
        )
    i = g.names.index(name)
    old = net.layers[i]
    new = _as_chain(layers, what)
    _check_names(new, taken=[n for n in g.names if n != name], what=what)
    combined = name_layers([*net.layers[:i], *new, *net.layers[i + 1 :]])
    new = combined[i : i + len(new)]
    if len(new) == 1 and _same_place(old, new[0]):
        return _relayout(net, combined, g)  # in the old one's place: the same graph
    first, last = new[0], new[-1]

    def move(spec: str, kind: str) -> str:
        layer, _, port = spec.partition("/")
        if layer != name:
            return spec
        target = first if kind == "input" else last
        return f"{target.name}/{_map_port(what, old, target, port, kind, reconnect_by)}"

    edges = tuple((move(s, "output"), move(d, "input")) for s, d in net.connections)
    outputs = _outputs(net)
    if outputs is not None:
        outputs = [move(o, "output") for o in outputs]
    chain = list(range(i, i + len(new)))
    return _rebuild(net, combined, [chain], edges, outputs, what)


# -- helpers -------------------------------------------------------------------------------------


def _as_chain(layers, what: str) -> list[Layer]:
    if isinstance(layers, Layer):
        return [layers]
    if isinstance(layers, (list, tuple)) and layers and all(isinstance(x, Layer) for x in layers):
        return list(layers)
    if isinstance(layers, (list, tuple)):
        bad = [x for x in layers if not isinstance(x, Layer)]
        got = f"a list containing a {type(bad[0]).__name__}" if bad else "an empty list"
    else:
        got = type(layers).__name__
    raise NetworkError(
        f"{what}: expected a df.Layer or a non-empty list of df.Layer (a chain); got {got}."
    )


def _check_names(new: list[Layer], *, taken, what: str) -> None:
    given = [layer.name for layer in new if layer.name]
    clash = sorted({n for n in given if n in taken})
    if clash:
        raise NetworkError(
            f"{what}: layer names must be unique; {clash} already name layers of the network. "
            "Fix: give the new layers other names (or name='' for automatic ones)."
        )
    twice = sorted({n for n in given if given.count(n) > 1})
    if twice:
        raise NetworkError(
            f"{what}: layer names must be unique; {twice} appear more than once among the new "
            "layers. Fix: rename them (or name='' for automatic ones)."
        )


def _same_place(old: Layer, new: Layer) -> bool:
    """Whether ``new`` fits the graph exactly where ``old`` was (name, ports, input layer)."""
    return (new.name, new.input_names, new.output_names, isinstance(new, InputLayer)) == (
        old.name,
        old.input_names,
        old.output_names,
        isinstance(old, InputLayer),
    )


def _map_port(what, old, new, port, kind, reconnect_by) -> str:
    """The port of ``new`` that takes over ``old``'s ``port`` (an input or an output)."""
    old_ports = old.input_names if kind == "input" else old.output_names
    new_ports = new.input_names if kind == "input" else new.output_names
    if reconnect_by == "name" and port in new_ports:
        return port
    position = old_ports.index(port)
    if reconnect_by == "order" and position < len(new_ports):
        return new_ports[position]
    wanted = repr(port) if reconnect_by == "name" else f"number {position + 1}"
    fix = (
        "reconnect_by='order' to match ports by position, or give the new layer that port"
        if reconnect_by == "name"
        else "a layer with enough ports, or connect it yourself after replacing"
    )
    raise NetworkError(
        f"{what}: {kind} '{old.name}/{port}' is connected, but the "
        f"{'first' if kind == 'input' else 'last'} new layer {new.name!r} has no {kind} "
        f"{wanted} (its {kind}s are {list(new_ports)}). Fix: {fix}."
    )


def _same_sizes(old: Layer, new: Layer) -> bool:
    """Whether ``new`` surely maps input layouts to the same output layouts as ``old``.

    True for the same class with the same configuration and parameters of the same shapes and
    dtypes (values and factors may differ, as after ``set_learn_rate_factor``): such a layer
    keeps its recorded layouts without being traced again.
    """
    if new is old:
        return True
    if type(new) is not type(old):
        return False
    for field in dataclasses.fields(old):
        a, b = getattr(old, field.name), getattr(new, field.name)
        if a is b:
            continue
        leaves_a, tree_a = jax.tree.flatten(a)
        leaves_b, tree_b = jax.tree.flatten(b)
        if tree_a != tree_b or not all(map(_same_leaf, leaves_a, leaves_b)):
            return False
    return True


def _same_leaf(a, b) -> bool:
    if hasattr(a, "shape") and hasattr(a, "dtype"):  # arrays: only the shape can matter
        return hasattr(b, "shape") and (a.shape, a.dtype) == (b.shape, getattr(b, "dtype", None))
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - a value without a plain equality: treat it as changed
        return False


def _outputs(net):
    """The outputs the user named (as ``"layer/port"``), or None for the default ones."""
    g = net.graph
    if not g.explicit_outputs:
        return None
    return [g.port_name(i, o, "output") for i, o in g.outputs]


def _rebuild(net, layers, chains, edges, outputs, what: str):
    try:
        graph = build_graph(layers, chains, edges, outputs)
    except NetworkError as error:
        raise NetworkError(f"{what}: {error}") from None
    return _relayout(net, layers, graph)


def _relayout(net, layers, graph):
    """The edited network, with its layouts propagated again where that is possible."""
    layers = tuple(layers)
    recorded = None
    known = net.recorded_layouts is not None or all(layer.initialized for layer in layers)
    if known and not graph.dangling:
        before = dict(zip(net.graph.input_names, net.input_layouts))
        inputs = [
            layers[i].input_layout if isinstance(layers[i], InputLayer) else before.get(name)
            for (i, _), name in zip(graph.inputs, graph.input_names)
        ]
        if None not in inputs:
            previous = {}
            if net.recorded_layouts is not None:
                now = {layer.name: layer for layer in layers}
                for layer, rec in zip(net.layers, net.recorded_layouts):
                    same = now.get(layer.name)
                    if same is not None and _same_sizes(layer, same):
                        previous[layer.name] = (same, rec)
            candidate = net.with_layers(layers, graph=graph, recorded_layouts=None)
            try:
                recorded = propagate(
                    candidate, inputs, None, abstract=True, previous=previous
                ).recorded_layouts
            except Exception:  # noqa: BLE001 - checked again, and named, at initialize/predict
                recorded = None
    if graph == net.graph and recorded == net.recorded_layouts:
        return net.with_layers(layers)  # keeps the token (and cache) if no structure changed
    return net.with_layers(layers, graph=graph, recorded_layouts=recorded)

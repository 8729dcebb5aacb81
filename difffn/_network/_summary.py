"""``net.summary()``: the table of a network's layers, and what ``net.plot()`` draws from.

One row per layer in topological order: name, type, input and output layouts, where its inputs
come from (a ``from`` column, for networks that are not a plain chain: ``"layer"`` or
``"layer/output"`` per input, ``"<input>"`` for a network input), its learnable and state
values, and its description; then the totals: learnable, state and all values, with their bytes
(each leaf's size times its dtype's item size).

Layouts are the ones ``initialize`` recorded. A network that has none recorded but whose inputs
all have known layouts (input layers, as an imported ONNX network's) gets them by propagating
those layouts abstractly (``jax.eval_shape``: nothing runs); otherwise its layouts show ``?``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._core import Error, Layout
from .._layer import LEARNABLE, STATE
from .._layer import parameters as _parameters
from ._propagate import propagate


@dataclass(frozen=True)
class Edge:
    """One connection: layer ``source``'s output ``source_port`` feeds ``target``'s input
    ``target_port``; ``layout`` is the value's (None when unknown)."""

    source: str
    source_port: str
    target: str
    target_port: str
    layout: Layout | None


def layout_text(layout: Layout | None) -> str:
    """``?,8,8,1:BSSC`` (``?`` for an unknown size, or for an unknown layout)."""
    if layout is None:
        return "?"
    sizes = ",".join("?" if s is None else str(s) for s in layout.shape)
    return f"{sizes}:{layout.format}"


def resolved_layouts(net):
    """Per layer ``(input layouts, output layouts)``: the recorded ones, or propagated from the
    input layouts when every input's is known; None when neither is possible."""
    if net.recorded_layouts is not None:
        return net.recorded_layouts
    cached = net.__dict__.get("_resolved_layouts", False)
    if cached is not False:
        return cached
    resolved = None
    known = net.input_layouts
    if not net.graph.dangling and known and all(lo is not None for lo in known):
        try:
            resolved = propagate(net, list(known), None, abstract=True, previous={})
            resolved = resolved.recorded_layouts
        except Error:
            resolved = None  # the summary still shows the layers, with "?" layouts
    net.__dict__["_resolved_layouts"] = resolved
    return resolved


def values_and_bytes(tree, kind: str) -> tuple[int, int]:
    """How many values the parameters of ``kind`` hold, and their bytes."""
    count = size = 0
    for p in _parameters.walk(tree):
        if p.kind != kind:
            continue
        for leaf in p.leaves:
            n = int(getattr(leaf, "size", 0) or 0)
            count += n
            dtype = getattr(leaf, "dtype", None)
            size += n * (dtype.itemsize if dtype is not None else 0)
    return count, size


def edges(net) -> list[Edge]:
    """Every layer-to-layer connection, with the layout of the value it carries."""
    g = net.graph
    layouts = resolved_layouts(net)
    found = []
    for i in g.order:
        for j, source in enumerate(g.sources[i]):
            if source.kind != "layer":
                continue
            layout = layouts[source.index][1][source.port] if layouts is not None else None
            found.append(
                Edge(
                    g.names[source.index],
                    g.ports[source.index][1][source.port],
                    g.names[i],
                    g.ports[i][0][j],
                    layout,
                )
            )
    return found


def is_chain(net) -> bool:
    """Whether each layer takes one input, from the layer before it (or a network input)."""
    g = net.graph
    previous = None
    for i in g.order:
        sources = g.sources[i]
        if len(sources) > 1:
            return False
        if sources and sources[0].kind == "layer" and sources[0].index != previous:
            return False
        if len(g.ports[i][1]) > 1:
            return False
        previous = i
    return len(g.outputs) == 1


def _source_text(g, source) -> str:
    if source.kind == "input":
        return f"<{g.input_names[source.index]}>"
    if source.kind == "dangling":
        return "(unconnected)"
    name = g.names[source.index]
    ports = g.ports[source.index][1]
    return name if len(ports) == 1 else f"{name}/{ports[source.port]}"


def byte_text(n: int) -> str:
    """``5,992 bytes``; with a rounded size from 10 kB on (``1,234,567 bytes, 1.2 MB``)."""
    text = f"{n:,} bytes"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= 10 * scale or (unit == "kB" and n >= 10_000):
            return f"{text}, {n / scale:.3g} {unit}"
    return text


def summary(net) -> str:
    """The table (see the module docstring)."""
    g = net.graph
    layouts = resolved_layouts(net)
    chain = is_chain(net)
    header = ["#", "name", "type", "inputs", "outputs"]
    if not chain:
        header.append("from")
    header += ["learnables", "state", "description"]
    rows = []
    for n, i in enumerate(g.order):
        layer = net.layers[i]
        ins = outs = "?"
        if layouts is not None:
            ins = ", ".join(layout_text(lo) for lo in layouts[i][0])
            outs = ", ".join(layout_text(lo) for lo in layouts[i][1])
        row = [str(n + 1), layer.name, layer.type, ins, outs]
        if not chain:
            row.append(", ".join(_source_text(g, s) for s in g.sources[i]) or "-")
        learnables = values_and_bytes(layer, LEARNABLE)[0]
        state = values_and_bytes(layer, STATE)[0]
        row += [f"{learnables:,}", f"{state:,}", layer.description]
        rows.append(row)
    widths = [max(len(r[c]) for r in [header, *rows]) for c in range(len(header))]

    def line(r):
        return "  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip()

    lines = [line(header), line(["-" * w for w in widths]), *map(line, rows)]
    learnables, learnable_bytes = values_and_bytes(net, LEARNABLE)
    state, state_bytes = values_and_bytes(net, STATE)
    lines.append(
        f"{len(net.layers)} layers, inputs {list(net.input_names)}, outputs "
        f"{list(net.output_names)}" + ("" if net.initialized else " (not initialized)")
    )
    lines.append(
        f"{learnables:,} learnable parameters ({byte_text(learnable_bytes)}), {state:,} state "
        f"values ({byte_text(state_bytes)}), {learnables + state:,} in total "
        f"({byte_text(learnable_bytes + state_bytes)})"
    )
    return "\n".join(lines)

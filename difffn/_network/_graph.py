"""The static graph of a network: which value feeds which layer input, in which order.

A list of layers is a chain (MATLAB's layer array); a list may also hold sub-lists, each a chain of
its own (MATLAB's ``addLayers`` of several arrays). ``connections`` add edges between named ports
(``"src"`` or ``"src/out2"`` to ``"dst"`` or ``"dst/in2"``). Within a chain, a layer's first
input comes from the previous layer's first output unless an explicit connection feeds it or it is
an input layer.

Network inputs are the input layers' inputs; in a network without input layers, they are the
layer inputs that nothing feeds (named ``"layer/in"``). In a network with input layers, a layer
input that nothing feeds is *dangling*: the graph records it (a network may be incomplete while it
is being edited, as MATLAB allows) and ``check_connected`` names every such input when the network
is initialized or run. Network outputs are, by default, the layer outputs that feed nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .._core import NetworkError
from .._layer import InputLayer, Layer


@dataclass(frozen=True)
class Source:
    """Where a layer input comes from: network input ``index``, or layer ``index``'s ``port``."""

    kind: str  # "input", "layer", or "dangling" (nothing feeds it; index into Graph.dangling)
    index: int
    port: int = 0


@dataclass(frozen=True)
class Graph:
    names: tuple[str, ...]
    sources: tuple[tuple[Source, ...], ...]  # per layer, per layer input
    inputs: tuple[tuple[int, int], ...]  # network input -> (layer, layer input)
    input_names: tuple[str, ...]
    outputs: tuple[tuple[int, int], ...]  # network output -> (layer, layer output)
    output_names: tuple[str, ...]
    order: tuple[int, ...]  # topological order of layer indices
    connections: tuple[tuple[str, str], ...]  # every edge, as ("src/out", "dst/in")
    ports: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...]  # per layer: input, output names
    dangling: tuple[tuple[int, int], ...] = ()  # (layer, layer input) that nothing feeds
    explicit_outputs: bool = False  # outputs named by the user (else: every unused output)

    def index(self, name: str) -> int:
        try:
            return self.names.index(name)
        except ValueError:
            raise NetworkError(
                f"the network has no layer named {name!r}; its layers are {list(self.names)}. "
                "Fix: use one of those names."
            ) from None

    def port(self, spec: str, *, kind: str, what: str) -> tuple[int, int]:
        """``"layer"`` or ``"layer/port"`` to (layer index, port index), validated."""
        return _parse(spec, self.ports, self.names, kind=kind, what=what)

    def port_name(self, i: int, j: int, kind: str) -> str:
        """``"layer/port"`` of layer ``i``'s input or output ``j``."""
        return f"{self.names[i]}/{self.ports[i][0 if kind == 'input' else 1][j]}"

    def check_connected(self) -> None:
        """Raise a ``NetworkError`` naming every dangling input (before initializing or running)."""
        if self.dangling:
            ports = [self.port_name(i, j, "input") for i, j in self.dangling]
            raise NetworkError(
                f"the network has unconnected (dangling) inputs {ports}; a network with input "
                "layers must feed every other layer input. Fix: "
                f"net.connect_layers('source_layer', {ports[0]!r}) for each, or remove those "
                "layers with net.remove_layers([...])."
            )


def _port_error(what, name, ports, kind):
    return NetworkError(
        f"{what}: layer {name!r} has no {kind} {ports[1]!r}; its {kind}s are {list(ports[0])}. "
        f"Fix: name one of them, as '{name}/{ports[0][0]}'."
    )


def _parse(spec: str, ports, names: Sequence[str], *, kind: str, what: str):
    """``"layer"`` / ``"layer/port"`` to (layer index, port index)."""
    if not isinstance(spec, str) or not spec:
        raise NetworkError(f"{what}: expected a 'layer' or 'layer/port' string; got {spec!r}.")
    layer_name, _, port = spec.partition("/")
    if layer_name not in names:
        raise NetworkError(
            f"{what}: no layer named {layer_name!r}; the layers are {list(names)}. Fix: use one "
            "of those names."
        )
    i = names.index(layer_name)
    port_names = ports[i][1] if kind == "output" else ports[i][0]
    if not port:
        if len(port_names) != 1:
            raise NetworkError(
                f"{what}: layer {layer_name!r} has {len(port_names)} {kind}s {list(port_names)}; "
                f"say which, e.g. '{layer_name}/{port_names[0]}'."
            )
        return i, 0
    if port not in port_names:
        raise _port_error(what, layer_name, (port_names, port), kind)
    return i, port_names.index(port)


def _port_name(layer: Layer, name: str, port: int, kind: str) -> str:
    ports = layer.output_names if kind == "output" else layer.input_names
    return f"{name}/{ports[port]}"


def build_graph(
    layers: Sequence[Layer],
    chains: Sequence[Sequence[int]],
    connections: Sequence[tuple[str, ...]],
    outputs: Sequence[str] | None,
) -> Graph:
    """Validate the wiring and compute the graph (names must already be unique)."""
    names = tuple(layer.name for layer in layers)
    ports = tuple((layer.input_names, layer.output_names) for layer in layers)
    targets: dict[tuple[int, int], tuple[int, int]] = {}
    for n, pair in enumerate(connections):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise NetworkError(
                f"connections[{n}] is {pair!r}; expected a pair ('src[/out]', 'dst[/in]')."
            )
        src_spec, dst_spec = pair
        what = f"connection {src_spec!r} -> {dst_spec!r}"
        src = _parse(src_spec, ports, names, kind="output", what=what)
        dst = _parse(dst_spec, ports, names, kind="input", what=what)
        if isinstance(layers[dst[0]], InputLayer):
            raise NetworkError(
                f"{what}: {names[dst[0]]!r} is an input layer; its input is a network input and "
                "cannot be connected to another layer."
            )
        if dst in targets:
            previous = targets[dst]
            raise NetworkError(
                f"{what}: input {_port_name(layers[dst[0]], names[dst[0]], dst[1], 'input')!r} "
                f"is already fed by "
                f"{_port_name(layers[previous[0]], names[previous[0]], previous[1], 'output')!r};"
                " each input takes exactly one connection (use an Addition or Concatenation "
                "layer to merge)."
            )
        targets[dst] = src
    for chain in chains:
        for prev, cur in zip(chain, chain[1:]):
            if isinstance(layers[cur], InputLayer) or (cur, 0) in targets:
                continue
            targets[(cur, 0)] = (prev, 0)

    has_input_layers = any(isinstance(layer, InputLayer) for layer in layers)
    inputs, input_names, dangling = [], [], []
    sources: list[tuple[Source, ...]] = []
    for i, layer in enumerate(layers):
        if isinstance(layer, InputLayer):
            sources.append((Source("input", len(inputs)),))
            inputs.append((i, 0))
            input_names.append(names[i])
            continue
        row = []
        for j in range(layer.num_inputs):
            if (i, j) in targets:
                s = targets[(i, j)]
                row.append(Source("layer", s[0], s[1]))
            elif has_input_layers:
                row.append(Source("dangling", len(dangling)))
                dangling.append((i, j))
            else:
                row.append(Source("input", len(inputs)))
                inputs.append((i, j))
                input_names.append(_port_name(layer, names[i], j, "input"))
        sources.append(tuple(row))

    order = _topological_order(names, sources)

    used = {(s.index, s.port) for row in sources for s in row if s.kind == "layer"}
    if outputs is None:
        out = [
            (i, o)
            for i, layer in enumerate(layers)
            for o in range(layer.num_outputs)
            if (i, o) not in used
        ]
    else:
        if isinstance(outputs, str):
            outputs = [outputs]
        out = [
            _parse(spec, ports, names, kind="output", what=f"outputs entry {spec!r}")
            for spec in outputs
        ]
        if len(set(out)) != len(out):
            raise NetworkError(f"outputs {list(outputs)} names the same output twice.")
    if not out:
        raise NetworkError("the network has no outputs; name them with outputs=[...].")
    output_names = tuple(
        names[i] if layers[i].num_outputs == 1 else _port_name(layers[i], names[i], o, "output")
        for i, o in out
    )
    edges = tuple(
        (
            _port_name(layers[s.index], names[s.index], s.port, "output"),
            _port_name(layers[i], names[i], j, "input"),
        )
        for i, row in enumerate(sources)
        for j, s in enumerate(row)
        if s.kind == "layer"
    )
    graph = Graph(
        names=names,
        sources=tuple(sources),
        inputs=tuple(inputs),
        input_names=tuple(input_names),
        outputs=tuple(out),
        output_names=output_names,
        order=order,
        connections=edges,
        ports=ports,
        dangling=tuple(dangling),
        explicit_outputs=outputs is not None,
    )
    return graph


def _topological_order(names, sources) -> tuple[int, ...]:
    n = len(names)
    consumers: list[list[int]] = [[] for _ in range(n)]
    pending = [0] * n
    for i, row in enumerate(sources):
        for s in row:
            if s.kind == "layer":
                consumers[s.index].append(i)
                pending[i] += 1
    ready = [i for i in range(n) if pending[i] == 0]
    order = []
    while ready:
        i = ready.pop(0)
        order.append(i)
        for c in consumers[i]:
            pending[c] -= 1
            if pending[c] == 0:
                ready.append(c)
    if len(order) != n:
        raise NetworkError(
            f"the connections form a cycle through {_find_cycle(names, sources, set(order))}. "
            "Networks are acyclic; for recurrence use a recurrent layer (e.g. df.layers.LSTM) "
            "or a custom layer with state. Fix: remove the connection that closes the cycle."
        )
    return tuple(order)


def _find_cycle(names, sources, done) -> str:
    remaining = [i for i in range(len(names)) if i not in done]
    feeds = {
        i: [s.index for s in sources[i] if s.kind == "layer" and s.index not in done]
        for i in remaining
    }
    start = remaining[0]
    path, seen = [start], {start}
    while True:
        nxt = feeds[path[-1]][0]
        if nxt in seen:
            cycle = path[path.index(nxt) :] + [nxt]
            return " <- ".join(repr(names[i]) for i in cycle)
        path.append(nxt)
        seen.add(nxt)


# -- from a list of layers ------------------------------------------------------------------------


def flatten_layers(layers):
    if isinstance(layers, Layer):
        layers = [layers]
    if not isinstance(layers, (list, tuple)) or not layers:
        raise NetworkError(
            f"Network(layers) expected a non-empty list of df.Layer (or of lists of layers); "
            f"got {'an empty ' if not layers else ''}{type(layers).__name__}. Fix: e.g. "
            "df.Network([df.layers.FeatureInput(3), df.layers.FullyConnected(2)])."
        )
    flat, chains = [], []
    current: list[int] = []
    for item in layers:
        if isinstance(item, Layer):
            current.append(len(flat))
            flat.append(item)
        elif isinstance(item, (list, tuple)):
            if current:
                chains.append(current)
                current = []
            chain = []
            for sub in item:
                if not isinstance(sub, Layer):
                    raise NetworkError(
                        f"Network(layers): a chain contains {type(sub).__name__}; expected "
                        "df.Layer objects."
                    )
                chain.append(len(flat))
                flat.append(sub)
            chains.append(chain)
        else:
            raise NetworkError(
                f"Network(layers): got {type(item).__name__} {item!r:.40}; expected df.Layer "
                "objects (or lists of them, one per chain). Fix: pass layer objects, e.g. "
                "df.layers.ReLU() instead of 'relu'."
            )
    if current:
        chains.append(current)
    return flat, chains


def name_layers(layers: list[Layer]) -> list[Layer]:
    names = [layer.name for layer in layers]
    for name in names:
        if name and "/" in name:
            raise NetworkError(f"layer name {name!r} contains '/', which separates port names.")
    given = [n for n in names if n]
    duplicates = sorted({n for n in given if given.count(n) > 1})
    if duplicates:
        raise NetworkError(
            f"layer names must be unique; {duplicates} appear more than once. Fix: rename them, "
            "or leave names empty for automatic ones."
        )
    taken, counters, result = set(given), {}, []
    for layer in layers:
        if not layer.name:
            base = type(layer).__name__.lower()
            while True:
                counters[base] = counters.get(base, 0) + 1
                candidate = f"{base}_{counters[base]}"
                if candidate not in taken:
                    break
            taken.add(candidate)
            layer = layer.replace(name=candidate)
        result.append(layer)
    return result

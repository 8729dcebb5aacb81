"""``Network`` (MATLAB's ``dlnetwork``): layers wired into a graph, a pure function of its inputs.

A network is an immutable pytree whose leaves are its layers' parameters; its graph, the layouts
recorded at ``initialize`` and a structure token are static. ``predict`` / ``forward`` compile the
whole network once per input signature (shape, format, dtype) and cache the compiled function
(bounded, least recently used out); layers with ``acceleratable = False`` run eagerly between
compiled segments. Inside a user's own ``jax.jit`` / ``jax.grad``, the network simply traces.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from . import _cache
from ._errors import AccelerationError, Error, NetworkError
from ._format import FormattedArray, Layout, dims, dlarray
from ._graph import Graph, build_graph
from ._layer import LEARNABLE, STATE, InputLayer, Layer, NetworkBase, call_layer
from ._table import ParameterTable

_ACCELERATION = ("auto", "none")
_TRACING_ERRORS = (
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerArrayConversionError,
    jax.errors.TracerIntegerConversionError,
)


class _Token:
    """Static identity of a network structure; carries the compile cache of that structure."""

    __slots__ = ("key", "_hash", "cache", "__weakref__")

    def __init__(self, key):
        self.key = key
        self._hash = hash(key)
        self.cache = _cache.CompileCache("Network")

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        return self is other or (isinstance(other, _Token) and self.key == other.key)


@jax.tree_util.register_pytree_with_keys_class
class Network(NetworkBase):
    """A network of layers (MATLAB ``dlnetwork``).

    Args:
      layers: a list of layers (a chain), or a list whose items are layers or lists of layers
        (each list a chain of its own).
      connections: ``("src[/out]", "dst[/in]")`` pairs that add edges between named ports.
      outputs: names (``"layer"`` or ``"layer/out2"``) of the network outputs; default: every
        layer output that feeds nothing.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> import difffn as df
      >>> net = df.Network([
      ...     df.layers.FeatureInput(3, normalization="none", name="in"),
      ...     df.layers.FullyConnected(2, name="fc"),
      ...     df.layers.Softmax(name="softmax"),
      ... ]).initialize(key=jax.random.key(0))
      >>> net.input_names, net.output_names
      (('in',), ('softmax',))
      >>> y = net.predict(jnp.ones((4, 3)))
      >>> df.dims(y), y.shape
      ('BC', (4, 2))
    """

    def __init__(self, layers, *, connections=(), outputs=None):
        flat, chains = _flatten_layers(layers)
        flat = _name_layers(flat)
        graph = build_graph(flat, chains, tuple(tuple(c) for c in connections), outputs)
        self._set(tuple(flat), graph, layouts=None)
        if all(isinstance(flat[i], InputLayer) for i, _ in graph.inputs):
            # Input layers fix every input layout: check that the sizes fit, abstractly.
            _propagate(self, [flat[i].input_layout for i, _ in graph.inputs], None, abstract=True)

    def _set(self, layers, graph, layouts) -> None:
        self._layers = layers
        self._graph = graph
        self._layouts = layouts
        self._token = _Token((graph, layouts, tuple(jax.tree.structure(lyr) for lyr in layers)))

    def _rebuild(self, layers: Sequence[Layer]) -> Network:
        """The same graph with other layers.

        When no layer's structure changed (only parameter values did), the new network keeps
        the structure token, and with it the compiled-trace cache.
        """
        layers = tuple(layers)
        new = object.__new__(Network)
        same = all(
            a is b or jax.tree.structure(a) == jax.tree.structure(b)
            for a, b in zip(layers, self._layers)
        )
        if same:
            new._layers, new._graph, new._layouts, new._token = (
                layers,
                self._graph,
                self._layouts,
                self._token,
            )
        else:
            new._set(layers, self._graph, self._layouts)
        return new

    # -- pytree ------------------------------------------------------------------------------

    def tree_flatten(self):  # the fast path JAX uses when it needs no key paths
        return self._layers, (self._graph, self._layouts, self._token)

    def tree_flatten_with_keys(self):
        children = tuple((jax.tree_util.GetAttrKey(layer.name), layer) for layer in self._layers)
        return children, (self._graph, self._layouts, self._token)

    @classmethod
    def tree_unflatten(cls, aux, layers):
        new = object.__new__(cls)
        new._graph, new._layouts, new._token = aux
        new._layers = tuple(layers)
        return new

    # -- structure -----------------------------------------------------------------------------

    @property
    def layers(self) -> tuple[Layer, ...]:
        return self._layers

    @property
    def connections(self) -> tuple[tuple[str, str], ...]:
        """Every edge as ``("src/out", "dst/in")``, chains included."""
        return self._graph.connections

    @property
    def input_names(self) -> tuple[str, ...]:
        return self._graph.input_names

    @property
    def output_names(self) -> tuple[str, ...]:
        return self._graph.output_names

    @property
    def initialized(self) -> bool:
        cached = self.__dict__.get("_initialized")
        if cached is None:  # networks are immutable: compute once per object
            cached = self.__dict__["_initialized"] = all(lyr.initialized for lyr in self._layers)
        return cached

    @property
    def has_state(self) -> bool:
        """True when some layer (or a network nested in one) has state parameters."""
        cached = self.__dict__.get("_has_state")
        if cached is None:
            cached = self.__dict__["_has_state"] = any(lyr.state_names for lyr in self._layers)
        return cached

    @property
    def acceleratable(self) -> bool:
        """True when every layer can be compiled (the whole network is one trace)."""
        cached = self.__dict__.get("_acceleratable")
        if cached is None:
            cached = self.__dict__["_acceleratable"] = all(
                lyr.acceleratable for lyr in self._layers
            )
        return cached

    def layer(self, name: str) -> Layer:
        """The layer called ``name``."""
        return self._layers[self._graph.index(name)]

    def replace_layer(self, name: str, layer: Layer) -> Network:
        """A network with layer ``name`` replaced (same name, same ports)."""
        i = self._graph.index(name)
        old = self._layers[i]
        if not isinstance(layer, Layer):
            raise NetworkError(f"replace_layer({name!r}, ...) expected a df.Layer; got {layer!r}.")
        if (layer.name, layer.input_names, layer.output_names) != (
            old.name,
            old.input_names,
            old.output_names,
        ):
            raise NetworkError(
                f"replace_layer({name!r}, ...): the new layer must keep the name and ports of "
                f"the old one ({old.name!r}, inputs {old.input_names}, outputs "
                f"{old.output_names}); got ({layer.name!r}, {layer.input_names}, "
                f"{layer.output_names})."
            )
        layers = list(self._layers)
        layers[i] = layer
        return self._rebuild(layers)

    # -- parameters ----------------------------------------------------------------------------

    @property
    def learnables(self) -> ParameterTable:
        """Table of learnable parameters (layer, parameter, value); nested networks by path."""
        return ParameterTable(_parameter_rows(self, LEARNABLE))

    @property
    def state(self) -> ParameterTable:
        """Table of state parameters (layer, parameter, value)."""
        return ParameterTable(_parameter_rows(self, STATE))

    def replace(self, *, learnables=None, state=None) -> Network:
        """A network with some learnable and/or state values replaced.

        Args:
          learnables: a ``ParameterTable`` (or mapping ``"layer/parameter"`` → value) with any
            subset of the learnable rows.
          state: the same for state parameters (e.g. the table ``forward`` returns).
        """
        net = self
        for table, kind in ((learnables, LEARNABLE), (state, STATE)):
            if table is not None:
                net = _assign(net, table, kind)
        return net

    def reset_state(self) -> Network:
        """A network whose layers have their state reset (``Layer.reset_state``)."""
        return self._rebuild([layer.reset_state() for layer in self._layers])

    # -- initialize ----------------------------------------------------------------------------

    def initialize(self, *layouts_or_examples, key) -> Network:
        """Fill the parameters that are still empty, from the input layouts.

        Args:
          *layouts_or_examples: one ``df.Layout`` or example array per network input; may be
            omitted for inputs that come from input layers.
          key: a ``jax.random`` key.
        """
        layouts = self._input_layouts(layouts_or_examples)
        tracing = any(isinstance(v, jax.core.Tracer) for v in jax.tree.leaves((self, key)))
        if self.acceleratable and not tracing:
            # One compiled program for every initializer: compiling each random draw on its
            # own (eagerly) costs seconds. It runs once, so XLA's optimizations are not worth
            # their compile time (a CNN's initializers: 0.4 s instead of 1.6 s).
            try:
                traced = jax.jit(
                    lambda net, key: _propagate(net, layouts, key, abstract=False)
                ).trace(self, key)
            except (*_TRACING_ERRORS, AccelerationError):
                pass  # an initialize with Python logic on values: run it eagerly instead
            else:
                lowered = traced.lower()
                try:
                    compiled = lowered.compile({"xla_backend_optimization_level": 0})
                except Exception:  # noqa: BLE001 - a backend without the option: defaults
                    compiled = lowered.compile()
                return compiled(self, key)
        return _propagate(self, layouts, key, abstract=False)

    def _input_layouts(self, given) -> list[Layout]:
        g = self._graph
        if given and len(given) != len(g.inputs):
            raise NetworkError(
                f"initialize got {len(given)} layouts/examples; the network has {len(g.inputs)} "
                f"input(s) {list(g.input_names)}. Fix: pass one per input, in that order."
            )
        layouts = []
        for k, (i, j) in enumerate(g.inputs):
            layer = self._layers[i]
            known = layer.input_layout if isinstance(layer, InputLayer) else None
            if given:
                layouts.append(_as_layout(given[k], known, g.input_names[k]))
            elif known is not None:
                layouts.append(known)
            elif self._layouts is not None:
                layouts.append(self._layouts[i][0][j])
            else:
                raise NetworkError(
                    f"network input {g.input_names[k]!r} has no input layer, so initialize needs "
                    "its layout. Fix: net.initialize(df.Layout((None, ...), 'BC'), ..., key=...) "
                    "with one layout (or formatted example array) per input."
                )
        return layouts

    # -- running ---------------------------------------------------------------------------------

    def predict(self, *inputs, outputs=None, acceleration="auto", return_state=False):
        """Outputs of the network at prediction time (MATLAB ``predict``).

        Args:
          *inputs: one array per network input (``df.FormattedArray``, or plain when the input's
            format is known from an input layer or ``initialize``).
          outputs: names of the outputs to return (default: the network outputs).
          acceleration: ``"auto"`` (compiled, cached per input signature) or ``"none"``.
          return_state: also return the state table (stateful layers such as LSTM update it).

        Returns:
          One output, or a tuple of outputs; with ``return_state``, ``(outputs, state)``.
        """
        values, states = self._run(
            inputs, None, training=False, outputs=outputs, acceleration=acceleration
        )
        out = values[0] if len(values) == 1 else values
        return (out, self._state_table(states)) if return_state else out

    def forward(self, *inputs, key=None, outputs=None, acceleration="auto"):
        """Outputs at training time and the updated state (MATLAB ``forward``).

        Returns:
          ``(outputs, state)``: one output or a tuple, and a ``ParameterTable`` of the new state
          values (put it back with ``net.replace(state=state)``).
        """
        values, states = self._run(
            inputs, key, training=True, outputs=outputs, acceleration=acceleration
        )
        return (values[0] if len(values) == 1 else values), self._state_table(states)

    def cache_info(self) -> _cache.CacheInfo:
        """Compiled-trace cache statistics (hits, misses, entries, maxsize) for this structure."""
        return self._token.cache.info()

    def _wanted(self, outputs) -> tuple[tuple[int, int], ...]:
        if outputs is None:
            return self._graph.outputs
        if isinstance(outputs, str):
            outputs = [outputs]
        return tuple(
            self._graph.port(o, kind="output", what=f"outputs entry {o!r}") for o in outputs
        )

    def _run(self, inputs, key, *, training, outputs, acceleration):
        if acceleration not in _ACCELERATION:
            raise NetworkError(
                f"acceleration={acceleration!r}; expected one of {list(_ACCELERATION)}."
            )
        if not self.initialized:
            missing = [lyr.name for lyr in self._layers if not lyr.initialized]
            raise NetworkError(
                f"the network is not initialized (layers {missing} have empty parameters). Fix: "
                "net = net.initialize(key=jax.random.key(0)) (with layouts for inputs that have "
                "no input layer)."
            )
        xs = self._prepare_inputs(inputs)
        wanted = self._wanted(outputs) if outputs is not None else self._graph.outputs
        tracing = isinstance(key, jax.core.Tracer) or any(
            isinstance(x.data if isinstance(x, FormattedArray) else x, jax.core.Tracer) for x in xs
        )
        if acceleration == "none" or tracing:
            return execute(self, xs, key, training=training, wanted=wanted)
        if not self.acceleratable:
            return _execute_segmented(self, xs, key, training=training, wanted=wanted)
        cache_key = ("forward" if training else "predict", wanted, _input_signature(xs, key))
        compiled = self._token.cache.get(
            cache_key,
            lambda: jax.jit(functools.partial(execute, training=training, wanted=wanted)),
            lambda: _cache.describe_signature(xs),
        )
        return compiled(self, xs, key)

    def _prepare_inputs(self, inputs) -> tuple:
        g = self._graph
        if len(inputs) != len(g.inputs):
            raise NetworkError(
                f"the network takes {len(g.inputs)} input(s) {list(g.input_names)}; got "
                f"{len(inputs)}."
            )
        known = self._known_input_layouts()
        prepared = []
        for k, x in enumerate(inputs):
            layout, name = known[k], g.input_names[k]
            if not isinstance(x, (FormattedArray, jax.Array)):
                x = jnp.asarray(x)
            if layout is None:
                prepared.append(x)
                continue
            if not isinstance(x, FormattedArray):
                if x.ndim != layout.ndim:
                    raise NetworkError(
                        f"network input {name!r} expects {layout.ndim}-D data with format "
                        f"{layout.format!r} ({layout}); got a plain array of shape {x.shape}."
                    )
                x = FormattedArray._wrap(x, layout.format)  # the rank was just checked
            elif x.format != layout.format:
                raise NetworkError(
                    f"network input {name!r} expects format {layout.format!r}; got "
                    f"{x.format!r}. Fix: df.permute(x, {layout.format!r}) or relabel with "
                    "df.dlarray."
                )
            for axis, (want, got) in enumerate(zip(layout.shape, x.shape)):
                if want is not None and want != got:
                    raise NetworkError(
                        f"network input {name!r} expects size {want} on axis {axis} "
                        f"({layout.format[axis]!r}) of {layout}; got shape {x.shape}."
                    )
            prepared.append(x)
        return tuple(prepared)

    def _known_input_layouts(self) -> list[Layout | None]:
        cached = self.__dict__.get("_known_layouts")
        if cached is None:  # networks are immutable: compute once per object
            cached = self.__dict__["_known_layouts"] = self._compute_known_input_layouts()
        return cached

    def _compute_known_input_layouts(self) -> list[Layout | None]:
        known = []
        for i, j in self._graph.inputs:
            layer = self._layers[i]
            if isinstance(layer, InputLayer):
                known.append(layer.input_layout)
            elif self._layouts is not None:
                known.append(self._layouts[i][0][j])
            else:
                known.append(None)
        return known

    def _state_table(self, states) -> ParameterTable:
        rows = []
        for layer, values in zip(self._layers, states):
            for n, v in zip(layer.state_names, values):
                if isinstance(v, ParameterTable):  # the state of a nested network
                    rows += [(layer.name, f"{n}/{path}", val) for path, val in v.items()]
                else:
                    rows.append((layer.name, n, v))
        return ParameterTable(rows)

    def with_layer_states(self, states: Sequence[Sequence[Any]]) -> Network:
        """A network whose layers hold new state values (one tuple per layer, from ``execute``)."""
        return self._rebuild(
            [
                layer._with_state(s) if layer.state_names else layer
                for layer, s in zip(self._layers, states)
            ]
        )

    # -- display ---------------------------------------------------------------------------------

    def summary(self) -> str:
        """A table of the layers: name, type, input/output layouts, parameter counts."""
        header = ("#", "name", "type", "inputs", "outputs", "learnables")
        rows = []
        total = 0
        for n, i in enumerate(self._graph.order):
            layer = self._layers[i]
            count = _count(layer, LEARNABLE)
            total += count
            ins = outs = "?"
            if self._layouts is not None:
                ins = ", ".join(_layout_text(lo) for lo in self._layouts[i][0])
                outs = ", ".join(_layout_text(lo) for lo in self._layouts[i][1])
            rows.append((str(n + 1), layer.name, layer.type, ins, outs, f"{count:,}"))
        widths = [max(len(r[c]) for r in [header, *rows]) for c in range(len(header))]

        def line(r):
            return "  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip()

        lines = [line(header), line(["-" * w for w in widths]), *map(line, rows)]
        lines.append(
            f"{len(self._layers)} layers, {total:,} learnable parameters, inputs "
            f"{list(self.input_names)}, outputs {list(self.output_names)}"
            + ("" if self.initialized else " (not initialized)")
        )
        return "\n".join(lines)

    def __repr__(self):
        state = "initialized" if self.initialized else "not initialized"
        return (
            f"Network({len(self._layers)} layers, inputs={list(self.input_names)}, "
            f"outputs={list(self.output_names)}, {_count(self, LEARNABLE):,} learnables, {state})"
        )


# -- construction helpers --------------------------------------------------------------------------


def _flatten_layers(layers):
    if isinstance(layers, Layer):
        layers = [layers]
    if not isinstance(layers, (list, tuple)) or not layers:
        raise NetworkError(
            f"Network(layers) expected a non-empty list of df.Layer (or of lists of layers); "
            f"got {type(layers).__name__}."
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
                f"Network(layers): got {type(item).__name__}; expected df.Layer objects (or "
                "lists of them, one per chain)."
            )
    if current:
        chains.append(current)
    return flat, chains


def _name_layers(layers: list[Layer]) -> list[Layer]:
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


def _as_layout(value, known: Layout | None, name: str) -> Layout:
    if isinstance(value, Layout):
        layout = value
    elif isinstance(value, FormattedArray):
        layout = Layout.of(value)
    elif hasattr(value, "shape") and known is not None:
        layout = Layout(tuple(value.shape), known.format)
    else:
        raise NetworkError(
            f"network input {name!r}: expected a df.Layout or a formatted example "
            f"(df.dlarray(x, fmt)); got {type(value).__name__}."
        )
    if known is not None and (
        layout.format != known.format
        or any(
            a is not None and b is not None and a != b for a, b in zip(layout.shape, known.shape)
        )
        or layout.ndim != known.ndim
    ):
        raise NetworkError(
            f"network input {name!r}: its input layer expects {known}; got {layout}."
        )
    return layout


_PLACEHOLDER = {"B": 2, "T": 3}


def _concrete(layout: Layout) -> tuple[int, ...]:
    return tuple(
        size if size is not None else _PLACEHOLDER.get(label, 4)
        for size, label in zip(layout.shape, layout.format)
    )


def _output_layout(value, unknown_labels: set[str]) -> Layout:
    fmt = dims(value) or "U" * len(value.shape)
    shape = tuple(
        None if label in unknown_labels else int(size) for size, label in zip(value.shape, fmt)
    )
    return Layout(shape, fmt)


def _propagate(net: Network, input_layouts, key, *, abstract: bool) -> Network:
    """Initialize layers in topological order and record their input/output layouts."""
    g = net._graph
    layers = list(net._layers)
    dtype = jnp.float32
    unknown = {lab for lo in input_layouts for s, lab in zip(lo.shape, lo.format) if s is None}
    out_layouts: dict[tuple[int, int], Layout] = {}
    recorded: list[Any] = [None] * len(layers)
    for i in g.order:
        layer = layers[i]
        ins = tuple(
            input_layouts[s.index] if s.kind == "input" else out_layouts[(s.index, s.port)]
            for s in g.sources[i]
        )
        layer_key = jax.random.fold_in(key, i) if key is not None else jax.random.key(0)
        try:
            if abstract and layer.acceleratable:
                layer = jax.eval_shape(
                    lambda lyr=layer, k=layer_key, ins=ins: lyr.initialize(*ins, key=k)
                )
            else:
                layer = layer.initialize(*ins, key=layer_key)
            if not isinstance(layer, Layer) or layer.name != layers[i].name:
                raise NetworkError(
                    f"{type(layers[i]).__name__}.initialize must return the layer (e.g. "
                    "self.replace(...)); got "
                    + (type(layer).__name__ if not isinstance(layer, Layer) else "a renamed layer")
                    + "."
                )
            if isinstance(layer, InputLayer):
                outs = (ins[0],)
            elif not layer.acceleratable:
                # It cannot be traced: run it on placeholder data to learn its output sizes.
                xs = tuple(
                    dlarray(jnp.zeros(_concrete(lo), dtype), lo.format)
                    if lo.format
                    else jnp.zeros(_concrete(lo), dtype)
                    for lo in ins
                )
                outs = tuple(_output_layout(v, unknown) for v in call_layer(layer, xs)[0])
            else:
                fmts = tuple(lo.format for lo in ins)
                values = jax.eval_shape(
                    lambda lyr, *xs, fmts=fmts: call_layer(
                        lyr, tuple(dlarray(x, f) if f else x for x, f in zip(xs, fmts))
                    )[0],
                    layer,
                    *(jax.ShapeDtypeStruct(_concrete(lo), dtype) for lo in ins),
                )
                outs = tuple(_output_layout(v, unknown) for v in values)
        except NetworkError:
            raise
        except Error as error:
            raise NetworkError(
                f"layer {layer.name!r} ({type(layer).__name__}) does not fit its inputs "
                f"{[str(lo) for lo in ins]}: {error}"
            ) from error
        except (TypeError, ValueError) as error:
            raise NetworkError(
                f"layer {layers[i].name!r} ({type(layers[i]).__name__}) failed on inputs "
                f"{[str(lo) for lo in ins]} (a size mismatch?): {type(error).__name__}: "
                f"{str(error).splitlines()[0]}"
            ) from error
        for o, lo in enumerate(outs):
            out_layouts[(i, o)] = lo
        recorded[i] = (ins, outs)
        if not abstract:
            layers[i] = layer
    if abstract:
        return net
    new = object.__new__(Network)
    new._set(tuple(layers), g, tuple(recorded))
    return new


# -- running ---------------------------------------------------------------------------------------


def execute(net: Network, inputs, key, *, training: bool, wanted):
    """Run the graph: returns (outputs for ``wanted``, new state values per layer)."""
    g = net._graph
    needed = _needed_layers(g, wanted)
    values: dict[tuple[int, int], Any] = {}
    states: list[tuple] = [lyr._state_values() for lyr in net._layers]
    for i in g.order:
        if i not in needed:
            continue
        layer = net._layers[i]
        ins = tuple(
            inputs[s.index] if s.kind == "input" else values[(s.index, s.port)]
            for s in g.sources[i]
        )
        layer_key = jax.random.fold_in(key, i) if key is not None else None
        outs, new_state = call_layer(layer, ins, training=training, key=layer_key)
        for o, y in enumerate(outs):
            values[(i, o)] = y
        if layer.state_names:
            states[i] = new_state
    return tuple(values[w] for w in wanted), tuple(states)


@functools.lru_cache(maxsize=256)
def _needed_layers_cached(g: Graph, wanted) -> frozenset[int]:
    needed, stack = set(), [i for i, _ in wanted]
    while stack:
        i = stack.pop()
        if i in needed:
            continue
        needed.add(i)
        stack += [s.index for s in g.sources[i] if s.kind == "layer"]
    return frozenset(needed)


def _needed_layers(g: Graph, wanted) -> frozenset[int]:
    return _needed_layers_cached(g, tuple(wanted))


def _execute_segmented(net: Network, inputs, key, *, training: bool, wanted):
    """Compiled runs of acceleratable layers, with the others run eagerly in between."""
    g = net._graph
    needed = _needed_layers(g, wanted)
    order = [i for i in g.order if i in needed]
    segments: list[tuple[bool, tuple[int, ...]]] = []
    for i in order:
        eager = not net._layers[i].acceleratable
        if segments and not eager and not segments[-1][0]:
            segments[-1] = (False, segments[-1][1] + (i,))
        else:
            segments.append((eager, (i,)))
    env: dict[str, Any] = {f"in{k}": x for k, x in enumerate(inputs)}
    states = [lyr._state_values() for lyr in net._layers]
    for n, (eager, members) in enumerate(segments):
        later = {w for w in wanted}
        for _, m in segments[n + 1 :]:
            later |= {(s.index, s.port) for j in m for s in g.sources[j] if s.kind == "layer"}
        produced = sorted(
            (i, o) for i in members for o in range(net._layers[i].num_outputs) if (i, o) in later
        )
        consumed = sorted(
            {_env_key(s) for j in members for s in g.sources[j]}
            - {f"v{i}_{o}" for i in members for o in range(net._layers[i].num_outputs)}
        )
        args = {k: env[k] for k in consumed}
        if eager:
            out_env, seg_states = _run_members(net, members, args, key, training, produced)
        else:
            cache_key = ("segment", n, training, tuple(produced), _cache.signature((args, key)))
            compiled = net._token.cache.get(
                cache_key,
                lambda m=members, p=tuple(produced): jax.jit(
                    functools.partial(_run_members_static, members=m, training=training, produced=p)
                ),
                lambda args=args: _cache.describe_signature(args),
            )
            out_env, seg_states = compiled(net, args, key)
        env.update(out_env)
        for i, s in seg_states.items():
            states[int(i)] = s
    return tuple(env[f"v{i}_{o}"] for i, o in wanted), tuple(states)


def _input_signature(xs, key):
    """What a compiled trace depends on, for network inputs: format, shape, dtype."""
    parts = []
    for x in xs:
        fmt = None
        if isinstance(x, FormattedArray):
            fmt, x = x.format, x.data
        parts.append((fmt, x.shape, x.dtype, getattr(x, "weak_type", False)))
    if key is not None:
        key = (key.shape, key.dtype)
    return tuple(parts), key


def _env_key(source) -> str:
    return f"in{source.index}" if source.kind == "input" else f"v{source.index}_{source.port}"


def _run_members(net, members, env, key, training, produced):
    g = net._graph
    local = dict(env)
    seg_states = {}
    for i in members:
        layer = net._layers[i]
        ins = tuple(local[_env_key(s)] for s in g.sources[i])
        layer_key = jax.random.fold_in(key, i) if key is not None else None
        outs, new_state = call_layer(layer, ins, training=training, key=layer_key)
        for o, y in enumerate(outs):
            local[f"v{i}_{o}"] = y
        if layer.state_names:
            seg_states[str(i)] = tuple(new_state)
    return {f"v{i}_{o}": local[f"v{i}_{o}"] for i, o in produced}, seg_states


def _run_members_static(net, env, key, *, members, training, produced):
    return _run_members(net, members, env, key, training, produced)


# -- parameter tables ------------------------------------------------------------------------------


def _parameter_rows(net: Network, kind: str, prefix: str = ""):
    rows = []
    for layer in net._layers:
        for field, field_kind in type(layer)._field_kinds.items():
            value = getattr(layer, field)
            if isinstance(value, Network):
                if field_kind == LEARNABLE:
                    for lay, par, val in _parameter_rows(value, kind):
                        rows.append((layer.name, f"{field}/{lay}/{par}", val))
                continue
            if field_kind == kind:
                rows.append((layer.name, field, value))
    return rows


def _assign(net: Network, table, kind: str) -> Network:
    items = table.items() if hasattr(table, "items") else table
    updates: dict[str, dict[str, Any]] = {}
    for path, value in items:
        layer_name, _, parameter = path.partition("/")
        updates.setdefault(layer_name, {})[parameter] = value
    layers = list(net._layers)
    for layer_name, params in updates.items():
        i = net._graph.index(layer_name)
        layers[i] = _assign_layer(layers[i], params, kind)
    return net._rebuild(layers)


def _assign_layer(layer: Layer, params: dict[str, Any], kind: str) -> Layer:
    cls = type(layer)
    direct, nested = {}, {}
    for path, value in params.items():
        field, _, rest = path.partition("/")
        if field not in cls._field_kinds:
            raise NetworkError(
                f"layer {layer.name!r} ({cls.__name__}) has no parameter {path!r}; its "
                f"{kind} parameters are {list(_kind_fields(layer, kind))}."
            )
        if rest:
            nested.setdefault(field, {})[rest] = value
        elif cls._field_kinds[field] != kind:
            raise NetworkError(
                f"layer {layer.name!r} ({cls.__name__}) parameter {field!r} is not a {kind} "
                f"parameter; its {kind} parameters are {list(_kind_fields(layer, kind))}."
            )
        else:
            direct[field] = value
    for field, sub in nested.items():
        inner = getattr(layer, field)
        if not isinstance(inner, Network):
            raise NetworkError(
                f"layer {layer.name!r}: {field!r} does not hold a network, so '{field}/...' "
                "paths do not apply."
            )
        direct[field] = _assign(inner, sub, kind)
    new = object.__new__(cls)
    new.__dict__.update(layer.__dict__)
    new.__dict__.update(direct)
    return new


def _kind_fields(layer: Layer, kind: str):
    return [f for f, k in type(layer)._field_kinds.items() if k == kind]


def _count(obj, kind: str) -> int:
    if isinstance(obj, Network):
        return sum(_count(layer, kind) for layer in obj._layers)
    total = 0
    for field, field_kind in type(obj)._field_kinds.items():
        value = getattr(obj, field)
        if isinstance(value, Network) and field_kind == LEARNABLE:
            total += _count(value, kind)
        elif field_kind == kind and value is not None:
            total += sum(int(jnp.size(v)) for v in jax.tree.leaves(value))
    return total


def _layout_text(layout: Layout) -> str:
    sizes = ",".join("?" if s is None else str(s) for s in layout.shape)
    return f"{sizes}:{layout.format}"


def leaf_kinds(tree) -> list[str]:
    """The kind (learnable/state/constant) of every leaf of a network or layer, in leaf order."""
    if isinstance(tree, Network):
        return [k for layer in tree._layers for k in leaf_kinds(layer)]
    if isinstance(tree, Layer):
        kinds = []
        for field in tree.__dict__["_leaf_fields"]:
            value = getattr(tree, field)
            field_kind = type(tree)._field_kinds[field]
            if isinstance(value, (Network, Layer)):
                nested = leaf_kinds(value)
                if field_kind != LEARNABLE:
                    nested = ["constant"] * len(nested)
                kinds += nested
            else:
                kind = field_kind if field_kind in (LEARNABLE, STATE) else "constant"
                kinds += [kind] * len(jax.tree.leaves(value))
        return kinds
    return ["constant"] * len(jax.tree.leaves(tree))


def learnable_mask(tree):
    """A pytree like ``tree`` with True at learnable leaves (for optax.masked, partitioning)."""
    kinds = leaf_kinds(tree)
    return jax.tree.unflatten(jax.tree.structure(tree), [k == LEARNABLE for k in kinds])

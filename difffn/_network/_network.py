"""``Network`` (MATLAB's ``dlnetwork``): layers wired into a graph, a pure function of its inputs.

A network is an immutable pytree whose leaves are its layers' parameters; its graph, the layouts
recorded at ``initialize`` and a structure token are static. ``predict`` / ``forward`` compile the
whole network once per input signature (shape, format, dtype) and cache the compiled function
(bounded, least recently used out); layers with ``acceleratable = False`` run eagerly between
compiled segments. Inside a user's own ``jax.jit`` / ``jax.grad``, the network simply traces.

Package-internal API (what the floors above use): ``graph``,
``input_layouts``, ``input_layers``, ``recorded_layouts``, ``compile_cache``, ``output_ports``,
``prepare_inputs``, ``run``, ``with_layers`` and ``with_layer_states``. How the graph executes
lives in ``_execute.py``, how initialization propagates layouts in ``_propagate.py``, how the
graph is edited (``add_layers``, ``connect_layers``, ...) in ``_graph_edit.py``.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import jax
from jax.core import Tracer

from .._core import (
    CONCRETIZATION_ERRORS,
    AccelerationError,
    Layout,
    NetworkError,
    check_key,
    compile_once,
)
from .._core import mask as _mask
from .._layer import LEARNABLE, STATE, InputLayer, Layer, NetworkBase, ParameterTable
from .._layer import parameters as _parameters
from . import _cache, _compilation_cache, _execute, _graph_edit, _network_inputs, _plot, _summary
from ._graph import Graph, build_graph, flatten_layers, name_layers
from ._merged_draws import merged_draws
from ._propagate import propagate, resolve_layouts

_KEEP = object()  # with_layers: keep the recorded layouts


class _Token:
    """Static identity of a network structure; carries the compile cache of that structure.

    Interned (``of``): networks built separately with equal structure, or loaded twice, share
    one token and so one compile cache, for as long as some network of that structure lives.
    """

    __slots__ = ("key", "_hash", "cache", "__weakref__")
    _interned: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

    def __init__(self, key):
        self.key = key
        self._hash = hash(key)
        self.cache = _cache.CompileCache("Network")

    @classmethod
    def of(cls, key) -> _Token:
        token = cls._interned.get(key)
        if token is None:
            token = cls._interned[key] = cls(key)
        return token

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

    def __init__(
        self,
        layers: Layer | Sequence[Layer | Sequence[Layer]],
        *,
        connections: Sequence[tuple[str, str]] = (),
        outputs: Sequence[str] | None = None,
    ) -> None:
        flat, chains = flatten_layers(layers)
        flat = name_layers(flat)
        graph = build_graph(flat, chains, tuple(tuple(c) for c in connections), outputs)
        self._set(tuple(flat), graph, layouts=None)
        entries = [lyr for lyr in (flat[i] for i, _ in graph.inputs) if isinstance(lyr, InputLayer)]
        if not graph.dangling and len(entries) == len(graph.inputs):
            # Input layers fix every input layout: check that the sizes fit, abstractly.
            # The output sizes it learns are kept for initialize (``memo``), which then traces
            # each layer's initializer but not its call again.
            self._shape_memo: dict | None = {}
            propagate(
                self,
                [lyr.input_layout for lyr in entries],
                None,
                abstract=True,
                memo=self._shape_memo,
            )

    def _set(self, layers, graph, layouts) -> None:
        self._layers = layers
        self._graph = graph
        self._layouts = layouts
        self._token = _Token.of((graph, layouts, tuple(jax.tree.structure(lyr) for lyr in layers)))

    def with_layers(
        self, layers: Sequence[Layer], *, recorded_layouts=_KEEP, graph: Graph | None = None
    ) -> Network:
        """The same graph (or ``graph``, after an edit) with other layers and, if given, layouts.

        When no layer's structure changed (only parameter values did) and the graph and layouts
        are kept, the new network keeps the structure token, and with it the compiled-trace cache.
        """
        layers = tuple(layers)
        new = object.__new__(Network)
        graph = self._graph if graph is None else graph
        layouts = self._layouts if recorded_layouts is _KEEP else recorded_layouts
        same = (
            graph is self._graph
            and layouts is self._layouts
            and all(
                a is b or jax.tree.structure(a) == jax.tree.structure(b)
                for a, b in zip(layers, self._layers)
            )
        )
        if same:
            new._layers, new._graph, new._layouts, new._token = (
                layers,
                self._graph,
                self._layouts,
                self._token,
            )
        else:
            new._set(layers, graph, layouts)
        return new

    # -- pytree ------------------------------------------------------------------------------

    def tree_flatten(self):  # the fast path JAX uses when it needs no key paths
        return self._layers, (self._graph, self._layouts, self._token)

    def tree_flatten_with_keys(self):
        # Key names come from the static graph, not the children: tree utilities (orbax's
        # metadata trees, tree.map with is_leaf) put arbitrary values in the layer slots.
        keys = map(jax.tree_util.GetAttrKey, self._graph.names)
        return tuple(zip(keys, self._layers)), (self._graph, self._layouts, self._token)

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

    # -- editing (MATLAB addLayers, connectLayers, ...; each returns a new network) ----------

    def add_layers(self, layers: Layer | Sequence[Layer]) -> Network:
        """A network with ``layers`` added, connected in order, not to the existing layers.

        Args:
          layers: a layer, or a list of layers (a chain: each feeds the next). Unnamed layers
            get unique names; a given name must not be taken.

        Returns:
          The new network; connect it with ``connect_layers``. Until every layer input is fed,
          the network can be edited but not initialized or run.

        Raises:
          NetworkError: not layers, or a name that is taken.

        Examples:
          >>> import difffn as df
          >>> net = df.Network([df.layers.FeatureInput(4, name="in"), df.layers.ReLU(name="r")])
          >>> net = net.add_layers([df.layers.FullyConnected(2, name="fc"), df.layers.Softmax()])
          >>> net.connections
          (('in/out', 'r/in'), ('fc/out', 'softmax_1/in'))
        """
        return _graph_edit.add_layers(self, layers)

    def connect_layers(self, source: str, destination: str) -> Network:
        """A network with an edge from output ``source`` to input ``destination``.

        Args:
          source: ``"layer"``, or ``"layer/out"`` for a layer with several outputs.
          destination: ``"layer"``, or ``"layer/in"`` for a layer with several inputs.

        Raises:
          NetworkError: an unknown layer or port, an input that is already fed, an input layer
            as the destination, or an edge that would close a cycle (each named).

        Examples:
          >>> import difffn as df
          >>> net = df.Network([
          ...     df.layers.FeatureInput(4, name="in"), df.layers.ReLU(name="relu"),
          ...     df.layers.Addition(2, name="add"),
          ... ]).connect_layers("in", "add/in2")
          >>> net.connections[-1]
          ('in/out', 'add/in2')
        """
        return _graph_edit.connect_layers(self, source, destination)

    def disconnect_layers(self, source: str, destination: str) -> Network:
        """A network without the edge from output ``source`` to input ``destination``.

        Raises:
          NetworkError: an unknown layer or port, or no such edge (the message lists the edges
            into the destination layer).
        """
        return _graph_edit.disconnect_layers(self, source, destination)

    def remove_layers(self, names: str | Sequence[str]) -> Network:
        """A network without the layers ``names`` (a name or a list) and their connections.

        The layers that they fed are not reconnected: their inputs are left unconnected.

        Raises:
          NetworkError: a name that is not a layer of the network, or every layer named.
        """
        return _graph_edit.remove_layers(self, names)

    def replace_layer(
        self, name: str, layers: Layer | Sequence[Layer], *, reconnect_by: str = "name"
    ) -> Network:
        """A network with layer ``name`` replaced by a layer or a chain of layers.

        The old layer's inputs feed the first new layer, and the last new layer feeds what the
        old one fed (MATLAB ``replaceLayer``). The new layers may have other names and ports.
        A single layer with the same name and ports takes the old one's place (e.g. with
        new parameter values); the trace cache is kept when its structure is the same too.

        Args:
          name: the layer to replace.
          layers: a layer, or a list of layers (a chain).
          reconnect_by: ``"name"``: each connection keeps its port name (``in2`` of the old
            layer becomes ``in2`` of the first new one); ``"order"``: its port position.

        Raises:
          NetworkError: an unknown layer, a name that is taken, or a connection that has no
            port to go to on the new layers (the message says which).

        Examples:
          >>> import difffn as df
          >>> net = df.Network([
          ...     df.layers.FeatureInput(4, name="in"), df.layers.ReLU(name="relu"),
          ...     df.layers.FullyConnected(2, name="fc"),
          ... ])
          >>> net = net.replace_layer("relu", [df.layers.BatchNorm(name="bn"),
          ...                                  df.layers.ELU(name="elu")])
          >>> [layer.name for layer in net.layers]
          ['in', 'bn', 'elu', 'fc']
          >>> net.connections
          (('in/out', 'bn/in'), ('bn/out', 'elu/in'), ('elu/out', 'fc/in'))
        """
        return _graph_edit.replace_layer(self, name, layers, reconnect_by=reconnect_by)

    # -- parameters ----------------------------------------------------------------------------

    @property
    def learnables(self) -> ParameterTable:
        """Table of learnable parameters (layer, parameter, value); nested networks by path."""
        return _parameters.table(self, LEARNABLE)

    @property
    def state(self) -> ParameterTable:
        """Table of state parameters (layer, parameter, value)."""
        return _parameters.table(self, STATE)

    def replace(
        self, *, learnables: ParameterTable | None = None, state: ParameterTable | None = None
    ) -> Network:
        """A network with some learnable and/or state values replaced.

        Args:
          learnables: a ``ParameterTable`` (or mapping ``"layer/parameter"`` → value) with any
            subset of the learnable rows.
          state: the same for state parameters (e.g. the table ``forward`` returns).

        Raises:
          NetworkError: a layer or parameter that the network does not have.
          LayerError: a value that does not fit the one it replaces: a learnable of another
            shape, or of another kind of dtype (floating vs integer; the precision may change);
            a state of another kind of dtype (its shape may change).
        """
        net = self
        for table, kind in ((learnables, LEARNABLE), (state, STATE)):
            if table is not None:
                net = _parameters.assign(net, table, kind)
        return net

    def reset_state(self) -> Network:
        """A network whose layers have their state reset (``Layer.reset_state``)."""
        return self.with_layers([layer.reset_state() for layer in self._layers])

    # -- initialize ----------------------------------------------------------------------------

    def initialize(self, *layouts_or_examples: Any, key: jax.Array | None = None) -> Network:
        """Fill the parameters that are still empty, from the input layouts.

        The initializers run as one compiled program. Like ``trainnet``, this turns JAX's
        persistent compilation cache on in the user's cache folder (``DIFFFN_COMPILATION_CACHE``
        moves it or, set to ``off``, turns it off; see ``TrainingOptions(compilation_cache=...)``),
        so a second run of the same script reads the program back instead of compiling it.

        Args:
          *layouts_or_examples: one ``df.Layout`` or example array per network input; may be
            omitted for inputs that come from input layers.
          key: a ``jax.random`` key (required).

        Raises:
          NetworkError: no key, or a layout that does not fit the network's inputs.
          OptionsError: ``DIFFFN_COMPILATION_CACHE`` names a folder that cannot be written.
        """
        check_key("Network.initialize", key, NetworkError)
        layouts = resolve_layouts(self, layouts_or_examples)
        tracing = any(isinstance(v, Tracer) for v in jax.tree.leaves((self, key)))
        if self.acceleratable and not tracing:
            # One compiled program for every initializer: compiling each random draw on its
            # own (eagerly) costs seconds. Its independent Threefry draws run as one call per
            # depth (_merged_draws: the same values, a third of the kernels), compiled for one
            # run (_core.compile_once: the benchmark transformer's initializers 0.24 s of
            # compiling instead of 0.89 s). The persistent cache is on from here ("auto", as
            # trainnet's default): a second run of the script reads this program back instead
            # of compiling it.
            _compilation_cache.use("auto", "Network.initialize")

            memo = getattr(self, "_shape_memo", None)

            def initializers(net: Network, key: jax.Array) -> Network:
                return propagate(net, layouts, key, abstract=False, memo=memo)

            try:
                traced = jax.jit(merged_draws(initializers)).trace(self, key)
            except (*CONCRETIZATION_ERRORS, AccelerationError):
                pass  # an initialize with Python logic on values: run it eagerly instead
            else:
                return compile_once(traced.lower())(self, key)
        return propagate(self, layouts, key, abstract=False)

    # -- running ---------------------------------------------------------------------------------

    def predict(
        self,
        *inputs: Any,
        outputs: str | Sequence[str] | None = None,
        acceleration: str = "auto",
        return_state: bool = False,
        mask: Any = None,
        **named: Any,
    ) -> Any:
        """Outputs of the network at prediction time (MATLAB ``predict``).

        Args:
          *inputs: one array per network input (``df.FormattedArray``, or plain when the input's
            format is known from an input layer or ``initialize``).
          outputs: names of the outputs to return (default: the network outputs).
          acceleration: ``"auto"`` (compiled, cached per input signature) or ``"none"``.
          return_state: also return the state table (stateful layers such as LSTM update it).
          mask: padding masks of padded sequences (``df.padsequences`` makes them): a boolean
            ``(batch, time)`` array, True at the steps that hold data, for a network with one
            input, or a tuple with one mask (or None) per input. Recurrent layers keep their
            state through padded steps and ``SelfAttention`` ignores them (see
            ``docs/training.md``, "Sequences of different lengths").

        Returns:
          One output, or a tuple of outputs; with ``return_state``, ``(outputs, state)``.

        Examples:
          >>> import jax, jax.numpy as jnp
          >>> import difffn as df
          >>> net = df.Network([df.layers.SequenceInput(2), df.layers.GRU(3, output_mode="last")])
          >>> net = net.initialize(key=jax.random.key(0))
          >>> x, mask = df.padsequences([jnp.ones((4, 2)), jnp.ones((2, 2))])
          >>> y = net.predict(x, mask=mask)          # the second's last step is its step 2
          >>> bool(jnp.allclose(y.data[1], net.predict(x[1:, :2]).data[0], atol=1e-6))
          True
        """
        if mask is None and not return_state and not named and acceleration == "auto":
            found = _execute.run_seen(self, inputs, None, training=False, outputs=outputs)
            if found is not None:  # a cache hit: the same outputs as below, without the checks
                values = found[0]
                return values[0] if len(values) == 1 else values
        self._no_named_inputs("predict", named)
        values, states, *_ = self.run(
            inputs, None, training=False, outputs=outputs, acceleration=acceleration, masks=mask
        )
        out = values[0] if len(values) == 1 else values
        return (out, _parameters.state_table(self, states)) if return_state else out

    def _no_named_inputs(self, method: str, named: dict) -> None:
        if named:
            raise NetworkError(
                f"Network.{method} takes the inputs positionally, in the order of "
                f"net.input_names {list(self.input_names)}; got keyword argument(s) "
                f"{sorted(named)}. Fix: net.{method}(*arrays), one array per input, in that "
                "order."
            )

    def forward(
        self,
        *inputs: Any,
        key: jax.Array | None = None,
        outputs: str | Sequence[str] | None = None,
        acceleration: str = "auto",
        mask: Any = None,
        **named: Any,
    ) -> tuple[Any, ParameterTable]:
        """Outputs at training time and the updated state (MATLAB ``forward``).

        ``mask`` is as for `predict`.

        Returns:
          ``(outputs, state)``: one output or a tuple, and a ``ParameterTable`` of the new state
          values (put it back with ``net.replace(state=state)``).
        """
        self._no_named_inputs("forward", named)
        check_key("Network.forward", key, NetworkError, optional=True)
        values, states, *_ = self.run(
            inputs, key, training=True, outputs=outputs, acceleration=acceleration, masks=mask
        )
        return (values[0] if len(values) == 1 else values), _parameters.state_table(self, states)

    def cache_info(self) -> _cache.CacheInfo:
        """Compiled-trace cache statistics (hits, misses, entries, maxsize) for this structure."""
        return self._token.cache.info()

    # -- the package-internal API (the module docstring lists it) ----------------------------------

    @property
    def graph(self) -> Graph:
        """The static graph: sources of every layer input, order, network inputs and outputs."""
        return self._graph

    @property
    def compile_cache(self) -> _cache.CompileCache:
        """The compiled-trace cache shared by every network of this structure."""
        return self._token.cache

    @property
    def recorded_layouts(self):
        """Per layer, ``(input layouts, output layouts)`` recorded by ``initialize`` (or None)."""
        return self._layouts

    @property
    def input_layers(self) -> tuple[InputLayer | None, ...]:
        """Per network input, the input layer that receives it (None where there is none)."""
        cached = self.__dict__.get("_input_layers")
        if cached is None:
            cached = self.__dict__["_input_layers"] = tuple(
                self._layers[i] if isinstance(self._layers[i], InputLayer) else None
                for i, _ in self._graph.inputs
            )
        return cached

    @property
    def input_layouts(self) -> tuple[Layout | None, ...]:
        """Per network input, its layout where known (an input layer's, or the recorded one)."""
        cached = self.__dict__.get("_input_layouts")
        if cached is None:  # networks are immutable: compute once per object
            known = []
            for layer, (i, j) in zip(self.input_layers, self._graph.inputs):
                if layer is not None:
                    known.append(layer.input_layout)
                elif self._layouts is not None:
                    known.append(self._layouts[i][0][j])
                else:
                    known.append(None)
            cached = self.__dict__["_input_layouts"] = tuple(known)
        return cached

    def output_ports(self, outputs=None) -> tuple[tuple[int, int], ...]:
        """``(layer index, output index)`` of each output named (default: the network outputs)."""
        if outputs is None:
            return self._graph.outputs
        if isinstance(outputs, str):
            outputs = [outputs]
        return tuple(
            self._graph.port(o, kind="output", what=f"outputs entry {o!r}") for o in outputs
        )

    def run(
        self, inputs, key=None, *, training: bool, outputs=None, acceleration="auto", masks=None
    ) -> tuple[Any, ...]:
        """Run the network: ``(values of the outputs, new state values per layer)``.

        Checks and prepares the inputs (``prepare_inputs``), then lets ``_execute.run`` pick how
        to execute: traced (under a transformation), one compiled trace per input signature, or
        compiled segments around layers that must run eagerly. ``outputs`` is a list of names or
        already resolved ``output_ports``. With padding ``masks`` (one mask, or a tuple with one
        per input; ``_mask``) the result has a third item: the mask of each output, or None.
        """
        seen = None
        if acceleration == "auto" and masks is None:
            result = _execute.run_seen(self, inputs, key, training=training, outputs=outputs)
            if result is not None:
                return result
            seen = _execute.dispatch_key(inputs, key, training=training, outputs=outputs)
        if acceleration not in _execute.ACCELERATION:
            raise NetworkError(
                f"acceleration={acceleration!r}; expected one of {list(_execute.ACCELERATION)}. "
                "Fix: 'auto' (compiled, cached per input signature) or 'none' (op by op)."
            )
        self._graph.check_connected()
        if not self.initialized:
            missing = [lyr.name for lyr in self._layers if not lyr.initialized]
            raise NetworkError(
                f"the network is not initialized (layers {missing} have empty parameters). Fix: "
                "net = net.initialize(key=jax.random.key(0)) (with layouts for inputs that have "
                "no input layer)."
            )
        xs = self.prepare_inputs(inputs)
        masks = _mask.prepare(self.input_names, xs, masks, error=NetworkError)
        if outputs is None:
            wanted = self._graph.outputs
        elif isinstance(outputs, tuple) and all(isinstance(o, tuple) for o in outputs):
            wanted = outputs
        else:
            wanted = self.output_ports(outputs)
        return _execute.run(
            self,
            xs,
            key,
            training=training,
            wanted=wanted,
            acceleration=acceleration,
            masks=masks,
            seen=seen,
        )

    def prepare_inputs(self, inputs) -> tuple:
        """Check the network inputs against the known layouts; label plain arrays."""
        return _network_inputs.prepare(self, inputs)

    def with_layer_states(self, states: Sequence[Sequence[Any]]) -> Network:
        """A network whose layers hold new state values (one tuple per layer, from ``execute``)."""
        return self.with_layers(
            [
                layer._with_state(s) if layer.state_names else layer
                for layer, s in zip(self._layers, states)
            ]
        )

    # -- display ---------------------------------------------------------------------------------

    def summary(self) -> str:
        """A table of the layers: name, type, input/output layouts, where each input comes from
        (for graphs), learnable and state values, description; then the counts and bytes of the
        learnable, state and all values (``_summary``)."""
        return _summary.summary(self)

    def plot(self, path=None, *, title: str | None = None):
        """A picture of the layer graph (MATLAB ``plot(net)``, Keras ``plot_model``).

        Each layer is a box (its name and type), each connection an arrow labelled with the
        layout of the value it carries; layers are placed in rows by their depth from the
        inputs. Drawn with matplotlib (``pip install 'difffn[plot]'``).

        Args:
          path: where to save the picture (``.png``, ``.svg`` or ``.pdf``, by its suffix);
            None: only return the figure.
          title: the figure's title (default: none).

        Returns:
          the matplotlib ``Figure`` (a notebook shows it).

        Raises:
          MissingDependencyError: matplotlib is not installed.
          NetworkError: ``path`` has a suffix matplotlib cannot write.
        """
        return _plot.plot(self, path, title=title)

    def __repr__(self) -> str:
        state = "initialized" if self.initialized else "not initialized"
        learnables = _parameters.count(self, LEARNABLE)
        return (
            f"Network({len(self._layers)} layers, inputs={list(self.input_names)}, "
            f"outputs={list(self.output_names)}, {learnables:,} learnables, {state})"
        )

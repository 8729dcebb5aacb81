"""Initializing a network: layouts flow through the graph, each layer fills its parameters.

``propagate`` visits the layers in topological order, calls each layer's ``initialize`` with the
layouts of its inputs, and learns the layouts of its outputs without running real data (with
``jax.eval_shape``; layers that cannot be traced run once on placeholder data). It records every
layer's input and output layouts in the network (they give ``summary`` its sizes and let a loaded
network check its inputs). ``abstract=True`` only checks that the sizes fit (used when a network
is built from input layers); with ``previous`` (after a graph edit) it also records the layouts,
and the layers that an edit left as they were, on the inputs they had, keep their recorded output
layouts without being traced again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._core import (
    Error,
    FormattedArray,
    Layout,
    NetworkError,
    dims,
    dlarray,
    raised_at,
    to_device,
)
from .._layer import InputLayer, Layer, call_layer


def resolve_layouts(net, given) -> list[Layout]:
    """One layout per network input, from what the caller gave (layouts or examples) or knows."""
    g = net.graph
    g.check_connected()
    if given and len(given) != len(g.inputs):
        raise NetworkError(
            f"initialize got {len(given)} layouts/examples; the network has {len(g.inputs)} "
            f"input(s) {list(g.input_names)}. Fix: pass one per input, in that order."
        )
    layouts = []
    for k, known in enumerate(net.input_layouts):
        if given:
            layer = net.input_layers[k]
            expected = layer.input_layout if layer is not None else None
            layouts.append(_as_layout(given[k], expected, g.input_names[k]))
        elif known is not None:
            layouts.append(known)
        else:
            raise NetworkError(
                f"network input {g.input_names[k]!r} has no input layer, so initialize needs "
                "its layout. Fix: net.initialize(df.Layout((None, ...), 'BC'), ..., key=...) "
                "with one layout (or formatted example array) per input."
            )
    return layouts


def _as_layout(value, known: Layout | None, name: str) -> Layout:
    if isinstance(value, Layout):
        layout = value
    elif isinstance(value, FormattedArray):
        layout = Layout.of(value)
    elif hasattr(value, "shape") and known is not None:
        layout = Layout(tuple(value.shape), known.format)
    else:
        # A tuple of sizes has no format: an error with the exact fix, as for layer.initialize,
        # rather than a guess.
        sizes = tuple(value) if isinstance(value, (tuple, list)) else (None, 3)
        fmt = repr(known.format) if known is not None else "fmt"
        raise NetworkError(
            f"network input {name!r}: expected a df.Layout or a formatted example "
            f"(df.dlarray(x, fmt)); got {type(value).__name__}"
            + (f" {value!r}" if isinstance(value, (tuple, list)) else "")
            + f". Fix: net.initialize(df.Layout({sizes!r}, {fmt}), key=key), with the input's "
            "sizes and format."
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


_BATCH = 2  # the batch size that stands in for an unknown one
_LONGEST = 1 << 12  # the longest stand-in length tried before giving up


def _concrete(layout: Layout, length: int) -> tuple[int, ...]:
    stand_in = {"B": _BATCH, "T": length}
    return tuple(
        size if size is not None else stand_in.get(label, 4)
        for size, label in zip(layout.shape, layout.format)
    )


def _output_layout(value, unknown_labels: set[str]) -> Layout:
    fmt = dims(value) or "U" * len(value.shape)
    shape = tuple(
        None if label in unknown_labels else int(size) for size, label in zip(value.shape, fmt)
    )
    return Layout(shape, fmt)


class _Failed(Exception):
    """A layer failed at one stand-in length: its index and the error to raise."""

    def __init__(self, index: int, error: BaseException):
        super().__init__(index)
        self.index, self.error = index, error


# Key implementations whose fold_in is elementwise in the data, so that a vectorized fold_in
# gives each element's own key (unsafe_rbg's rng_bit_generator batches as one stream: not it).
_ELEMENTWISE_FOLD_IN = frozenset({"threefry2x32", "rbg"})


def _layer_keys(key: jax.Array | None, count: int) -> Callable[[int], jax.Array] | None:
    """Layer i's key, ``fold_in(key, i)``; None without a key.

    For Threefry (and rbg) keys, one vectorized ``fold_in`` makes them all in one equation:
    one per layer became a dozen each in the initializers' program once ``_merged_draws``
    spells them out (issue 29). Other implementations fold in layer by layer."""
    if key is None:
        return None
    if str(jax.random.key_impl(key)) in _ELEMENTWISE_FOLD_IN:
        keys = jax.vmap(jax.random.fold_in, (None, 0))(key, jnp.arange(count))
        return lambda i: keys[i]
    return lambda i: jax.random.fold_in(key, i)


def _placeholder_key() -> jax.Array:
    """``jax.random.key(0)``'s value, made on the host: a key for checking layouts, where no
    value is kept (``jax.random.key`` compiles two programs on its first call)."""
    return jax.random.wrap_key_data(to_device(np.zeros(2, np.uint32)), impl="threefry2x32")


def _signature(layer) -> tuple | None:
    """The layer's structure and its leaves' shapes and dtypes (what ``jax.eval_shape`` of
    its call sees), or None when a leaf is not an array."""
    leaves, tree = jax.tree.flatten(layer)
    try:
        return tree, tuple(
            (tuple(v.shape), np.dtype(v.dtype), bool(getattr(v, "weak_type", False)))
            for v in leaves
        )
    except (AttributeError, TypeError):
        return None


def _remembered(memo, key, layer) -> tuple | None:
    """``(output layouts, output sizes)`` that ``memo`` holds for ``layer`` at ``key``, or None."""
    if not memo or key not in memo:
        return None
    signature = _signature(layer)
    try:
        same = signature is not None and bool(signature == memo[key][0])
    except Exception:  # a static field whose == is not a bool (an array): trace the layer again
        same = False
    return memo[key][1:] if same else None


def propagate(net, input_layouts, key, *, abstract: bool, previous=None, memo=None):
    """Initialize layers in topological order and record their input/output layouts.

    ``previous``: ``{layer name: (layer, (input layouts, output layouts))}`` recorded before an
    edit; ``abstract`` propagation then returns the network with the layouts recorded.

    ``memo``: a dict that an abstract propagation fills with each layer's output sizes, keyed by
    the layer's place, input layouts, stand-in sizes and the network's unknown size labels (its
    output layouts leave those unknown), next to the shapes of its initialized
    parameters. A later propagation given the same dict (``Network.initialize`` after the
    constructor's check) takes a layer's output sizes from it when its initialized parameters
    have those shapes, instead of tracing the layer again (``jax.eval_shape``: the benchmark
    transformer's 35 layers, about 0.05 s of a run's start).

    An unknown time length is stood in by the input layers' ``min_length`` (their promise: any
    length from it on). A layer that cannot run on it is a ``NetworkError`` that names the layer
    and the shortest length it needs. Without an input layer that promises a length (a bare
    layout), the stand-in is the shortest length every layer accepts.
    """
    promised = [
        getattr(layer, "min_length", None)
        for layer, lo in zip(net.input_layers, input_layouts)
        if layer is not None and "T" in lo.format and lo.shape[lo.format.index("T")] is None
    ]
    promised = [n for n in promised if isinstance(n, int)]
    length = max(promised, default=1)
    try:
        return _propagate_at(net, input_layouts, key, abstract, previous, length, memo)
    except _Failed as caught:
        failed = caught
    # Raised outside the ``except`` so that the layer's error keeps its own cause and context.
    needed = None
    if _unknown_length(input_layouts):
        needed = _shortest(net, input_layouts, key, abstract, previous, length)
    if needed is None:
        raise failed.error
    if not promised:
        try:
            return _propagate_at(net, input_layouts, key, abstract, previous, needed, memo)
        except _Failed as caught:  # not expected: it ran at this length while searching
            failed = caught
        raise failed.error
    layer = net.layers[failed.index]
    inputs = [
        f"{lyr.name!r} (min_length={lyr.min_length})"
        for lyr in net.input_layers
        if lyr is not None and isinstance(getattr(lyr, "min_length", None), int)
    ]
    raise NetworkError(
        f"layer {layer.name!r} ({type(layer).__name__}) cannot run on sequences of length "
        f"{length}, the min_length of input layer {', '.join(inputs)}; every layer of the "
        f"network runs on sequences of at least {needed} steps. Fix: SequenceInput(..., "
        f"min_length={needed}) (then shorter sequences are refused), or pad inside the "
        "network (e.g. padding='same') so that shorter sequences fit."
    ) from None


def _unknown_length(input_layouts) -> bool:
    return any(
        s is None and lab == "T" for lo in input_layouts for s, lab in zip(lo.shape, lo.format)
    )


def _shortest(net, input_layouts, key, abstract, previous, length) -> int | None:
    """The shortest stand-in length above ``length`` at which every layer runs, or None."""

    def runs(n: int) -> bool:
        try:
            _propagate_at(net, input_layouts, key, abstract, previous, n)
        except _Failed:
            return False
        return True

    # One try at the longest stand-in first: an error no length fixes (a format or channel
    # mismatch) costs one more pass, not a search.
    if length >= _LONGEST or not runs(_LONGEST):
        return None
    low, high = length, _LONGEST
    while high - low > 1:  # runs(high) and not runs(low); longer runs as well as shorter
        middle = (low + high) // 2
        if runs(middle):
            high = middle
        else:
            low = middle
    return high


def _propagate_at(net, input_layouts, key, abstract, previous, length, memo=None):
    g = net.graph
    layers = list(net.layers)
    dtype = jnp.float32
    unknown = {lab for lo in input_layouts for s, lab in zip(lo.shape, lo.format) if s is None}
    out_layouts: dict[tuple[int, int], Layout] = {}
    # The stand-in sizes each value has (unknown sizes are None in its layout), so that a layer
    # sees the length its predecessors really give it.
    out_sizes: dict[tuple[int, int], tuple[int, ...]] = {}
    recorded: list[Any] = [None] * len(layers)
    # Checking sizes only (abstract) of a network whose layers can all be traced: one trace of
    # the whole walk (``jax.eval_shape``) instead of two per layer (issue 29: the benchmark
    # transformer's 70 traces took 0.1-0.2 s of a run's start).
    inline = abstract and all(layer.acceleratable for layer in layers)

    def walk() -> None:
        layer_key_at = _layer_keys(key, len(layers))
        for i in g.order:
            layer = layers[i]
            ins = tuple(
                input_layouts[s.index] if s.kind == "input" else out_layouts[(s.index, s.port)]
                for s in g.sources[i]
            )
            sizes = tuple(
                _concrete(input_layouts[s.index], length)
                if s.kind == "input"
                else out_sizes[(s.index, s.port)]
                for s in g.sources[i]
            )
            memo_key = (i, ins, sizes, frozenset(unknown))
            before = previous.get(layer.name) if previous else None
            if before is not None and before[0] is layer and before[1][0] == ins:
                recorded[i] = before[1]
                for o, lo in enumerate(before[1][1]):
                    out_layouts[(i, o)] = lo
                    out_sizes[(i, o)] = _concrete(lo, length)
                continue
            layer_key = layer_key_at(i) if layer_key_at is not None else _placeholder_key()
            try:
                if abstract and layer.acceleratable and not inline:
                    layer = jax.eval_shape(
                        lambda lyr=layer, k=layer_key, ins=ins: lyr.initialize(*ins, key=k)
                    )
                else:
                    layer = layer.initialize(*ins, key=layer_key)
                if not isinstance(layer, Layer) or layer.name != layers[i].name:
                    raise NetworkError(
                        f"{type(layers[i]).__name__}.initialize must return the layer (e.g. "
                        "self.replace(...)); got "
                        + (
                            type(layer).__name__
                            if not isinstance(layer, Layer)
                            else "a renamed layer"
                        )
                        + "."
                    )
                if isinstance(layer, InputLayer):
                    outs, out_shapes = (ins[0],), (sizes[0],)
                elif (known := _remembered(memo, memo_key, layer)) is not None:
                    outs, out_shapes = known
                elif inline or not layer.acceleratable:
                    # Inside the one trace of the whole network, a call on tracers; a layer
                    # that cannot be traced runs on placeholder data to give its output sizes.
                    xs = tuple(
                        dlarray(jnp.zeros(n, dtype), lo.format)
                        if lo.format
                        else jnp.zeros(n, dtype)
                        for lo, n in zip(ins, sizes)
                    )
                    values = call_layer(layer, xs)[0]
                    outs = tuple(_output_layout(v, unknown) for v in values)
                    out_shapes = tuple(tuple(int(n) for n in v.shape) for v in values)
                else:
                    fmts = tuple(lo.format for lo in ins)
                    values = jax.eval_shape(
                        lambda lyr, *xs, fmts=fmts: call_layer(
                            lyr, tuple(dlarray(x, f) if f else x for x, f in zip(xs, fmts))
                        )[0],
                        layer,
                        *(jax.ShapeDtypeStruct(n, dtype) for n in sizes),
                    )
                    outs = tuple(_output_layout(v, unknown) for v in values)
                    out_shapes = tuple(tuple(int(n) for n in v.shape) for v in values)
            except Error as error:
                # The layer's own error keeps its type (``except df.LayerError`` catches it); the
                # network adds where it happened.
                error.add_note(
                    f"(while the network initialized layer {layers[i].name!r} "
                    f"({type(layers[i]).__name__}) on inputs {[str(lo) for lo in ins]})"
                )
                raise _Failed(i, error) from None
            except (TypeError, ValueError) as error:
                where = raised_at(error)
                raise _Failed(
                    i,
                    NetworkError(
                        f"layer {layers[i].name!r} ({type(layers[i]).__name__}) failed on inputs "
                        f"{[str(lo) for lo in ins]} (a size mismatch?): {type(error).__name__}: "
                        f"{str(error).splitlines()[0]}" + (f" (at {where})" if where else "")
                    ),
                ) from None
            if memo is not None and abstract and layer.acceleratable:
                signature = _signature(layer)
                if signature is not None:
                    memo[memo_key] = (signature, outs, out_shapes)
            for o, lo in enumerate(outs):
                out_layouts[(i, o)] = lo
                out_sizes[(i, o)] = out_shapes[o]
            recorded[i] = (ins, outs)
            if not abstract:
                layers[i] = layer

    jax.eval_shape(walk) if inline else walk()
    if abstract and previous is None:
        return net
    return net.with_layers(layers, recorded_layouts=tuple(recorded))

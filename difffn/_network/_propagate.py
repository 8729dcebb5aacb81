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

from typing import Any

import jax
import jax.numpy as jnp

from .._core import Error, FormattedArray, Layout, NetworkError, dims, dlarray, raised_at
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


def propagate(net, input_layouts, key, *, abstract: bool, previous=None):
    """Initialize layers in topological order and record their input/output layouts.

    ``previous``: ``{layer name: (layer, (input layouts, output layouts))}`` recorded before an
    edit; ``abstract`` propagation then returns the network with the layouts recorded.
    """
    g = net.graph
    layers = list(net.layers)
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
        before = previous.get(layer.name) if previous else None
        if before is not None and before[0] is layer and before[1][0] == ins:
            recorded[i] = before[1]
            for o, lo in enumerate(before[1][1]):
                out_layouts[(i, o)] = lo
            continue
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
        except Error as error:
            # The layer's own error keeps its type (``except df.LayerError`` catches it); the
            # network adds where it happened.
            error.add_note(
                f"(while the network initialized layer {layers[i].name!r} "
                f"({type(layers[i]).__name__}) on inputs {[str(lo) for lo in ins]})"
            )
            raise
        except (TypeError, ValueError) as error:
            where = raised_at(error)
            raise NetworkError(
                f"layer {layers[i].name!r} ({type(layers[i]).__name__}) failed on inputs "
                f"{[str(lo) for lo in ins]} (a size mismatch?): {type(error).__name__}: "
                f"{str(error).splitlines()[0]}" + (f" (at {where})" if where else "")
            ) from None
        for o, lo in enumerate(outs):
            out_layouts[(i, o)] = lo
        recorded[i] = (ins, outs)
        if not abstract:
            layers[i] = layer
    if abstract and previous is None:
        return net
    return net.with_layers(layers, recorded_layouts=tuple(recorded))

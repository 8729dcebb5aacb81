"""Running a network's graph: traced whole, compiled and cached, or in compiled/eager segments.

``run`` is the one entry point (``Network.run`` calls it): it decides how the graph executes.

* Inside a transformation that traces (the user's ``jax.jit``/``jax.grad``, trainnet's step), an
  acceleratable network simply traces through ``execute``.
* Called on concrete arrays, an acceleratable network runs one compiled trace of the whole graph,
  cached per input signature (shape, format, dtype) in the structure's ``CompileCache``.
* A network with layers that set ``acceleratable = False`` runs in segments: maximal runs of
  acceleratable layers are compiled (and cached), the others run eagerly in between. This holds
  under ``jax.grad`` too (the segments are jitted functions of JVP tracers), which is how trainnet
  trains such networks.

Padding masks (``_mask``) travel beside the inputs: each value computed from a masked input
carries the input's mask while it keeps the input's batch and time sizes, and a layer whose
method takes ``mask`` gets the mask of its first input. With masks, ``run`` also returns the mask
of each output (None where it has none).

A network whose sizes were never checked (built from initialized layers, or edited so that the
layouts could not be propagated) may fail inside a layer with JAX's shape error; ``run`` then
propagates the layouts to name the layer that does not fit, and raises that instead.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
from jax.core import Tracer

from .._core import AccelerationError, Error, FormattedArray
from .._core import mask as _mask
from .._layer import call_layer
from . import _cache
from ._graph import Graph
from ._propagate import propagate

ACCELERATION = ("auto", "none")


def run(
    net, inputs, key, *, training: bool, wanted, acceleration: str = "auto", masks=None, seen=None
):
    """Run ``net`` on prepared inputs; returns (values for ``wanted``, new state per layer),
    and with ``masks`` (one per input, None where it has none) the masks of those values.

    ``seen`` is ``dispatch_key`` of the raw inputs: when the compiled path runs, the network
    object remembers which cache entry those inputs reached, for ``run_seen``.
    """
    try:
        result = _run(
            net,
            inputs,
            key,
            training=training,
            wanted=wanted,
            acceleration=acceleration,
            masks=masks,
        )
    except (TypeError, ValueError) as error:
        layouts = net.input_layouts
        if (
            net.recorded_layouts is None
            and None not in layouts
            and not isinstance(error, AccelerationError)
        ):
            try:
                propagate(net, list(layouts), None, abstract=True)
            except Error as found:  # names the layer whose sizes do not fit
                raise found from None
        raise
    if seen is not None and masks is None and acceleration == "auto" and net.acceleratable:
        memo = net.__dict__.setdefault("_seen", {})
        if len(memo) >= net.compile_cache.maxsize:
            memo.clear()
        memo[seen] = _compiled_key(inputs, key, training=training, wanted=wanted)
    return result


_CONCRETE: dict[type, bool] = {}


def _concrete(kind: type) -> bool:
    """Whether values of this type are concrete JAX arrays (not tracers), memoized per type."""
    found = _CONCRETE.get(kind)
    if found is None:
        found = _CONCRETE[kind] = issubclass(kind, jax.Array) and not issubclass(kind, Tracer)
    return found


def dispatch_key(inputs, key, *, training: bool, outputs):
    """A cheap key of raw, concrete inputs (format, shape, dtype), or None when there is none.

    A network object that has run inputs with this key before (checked, prepared, compiled)
    reaches the same compiled entry again without repeating the checks (``run_seen``).
    """
    if not (outputs is None or isinstance(outputs, str)):
        return None
    parts = []
    for x in inputs:
        fmt = None
        if type(x) is FormattedArray:
            fmt, x = x.format, x.data
        if not _concrete(type(x)):
            return None
        parts.append((fmt, x.shape, x.dtype, x.weak_type))
    if key is not None:
        if not _concrete(type(key)):
            return None
        key = (key.shape, key.dtype)
    return training, outputs, tuple(parts), key


def run_seen(net, inputs, key, *, training: bool, outputs):
    """The compiled run of raw inputs like ones this network object has run before, or None.

    "Like" is ``dispatch_key``: the same formats, shapes and dtypes, key and options. The
    inputs were checked and prepared then, so the cache entry they reached runs them again at
    the cost of a compiled call. None sends the caller down the full path (which records the
    key): inputs never seen, tracers, or an entry evicted since.
    """
    memo = net.__dict__.get("_seen")
    if memo is None:
        return None
    seen = dispatch_key(inputs, key, training=training, outputs=outputs)
    if seen is None or (cache_key := memo.get(seen)) is None:
        return None
    compiled = net.compile_cache.lookup(cache_key)
    if compiled is None:
        return None
    datas = [x.data if type(x) is FormattedArray else x for x in inputs]
    return compiled(flat_parameters(net), datas, key, None)


def _compiled_key(inputs, key, *, training: bool, wanted):
    return ("forward" if training else "predict", wanted, input_signature(inputs, key))


def _run(net, inputs, key, *, training: bool, wanted, acceleration: str, masks):
    tracing = isinstance(key, Tracer) or any(
        isinstance(x.data if isinstance(x, FormattedArray) else x, Tracer)
        for x in (*inputs, *(masks or ()))
    )
    run_here = functools.partial(execute, training=training, wanted=wanted)
    # Masked runs of networks with eager layers go op by op: segments would carry the masks too.
    if acceleration == "none" or (masks is not None and not net.acceleratable):
        return run_here(net, inputs, key, masks)
    if not net.acceleratable:
        return execute_segmented(net, inputs, key, training=training, wanted=wanted)
    if tracing:
        return run_here(net, inputs, key, masks)
    cache_key = _compiled_key(inputs, key, training=training, wanted=wanted)
    if masks is not None:
        cache_key += (_cache.signature(masks),)
    compiled = net.compile_cache.get(
        cache_key,
        lambda: _compile_flat(net, cache_key[2][0], training=training, wanted=wanted),
        lambda: _cache.describe_signature(inputs),
    )
    datas = [x.data if isinstance(x, FormattedArray) else x for x in inputs]
    return compiled(flat_parameters(net), datas, key, masks)


def flat_parameters(net) -> list:
    """The network's pytree leaves, flattened once per (immutable) network object.

    A compiled call flattens its arguments on every call, and a network's flattening runs
    Python code per layer (pytree nodes registered from Python). Calling the compiled function
    with the leaves instead costs one flattening of a list of arrays, in C++.
    """
    leaves = net.__dict__.get("_flat_parameters")
    if leaves is None:
        leaves = net.__dict__["_flat_parameters"] = jax.tree.leaves(net.layers)
    return leaves


def _compile_flat(net, inputs_signature, *, training: bool, wanted):
    """``jax.jit`` of ``execute`` as a function of the network's leaves and the inputs' data.

    The structure (layer treedef, graph, layouts) and the input formats are fixed per entry:
    every network sharing the compile cache has them equal (the structure token's key).
    """
    layers_def = jax.tree.structure(net.layers)
    rebuild = functools.partial(type(net).tree_unflatten, (net.graph, net.recorded_layouts, None))
    formats = [fmt for fmt, *_ in inputs_signature]

    def flat(leaves, datas, key, masks):
        layers = jax.tree.unflatten(layers_def, leaves)
        xs = tuple(
            x if fmt is None else FormattedArray._wrap(x, fmt)
            for x, fmt in zip(datas, formats, strict=True)
        )
        return execute(rebuild(layers), xs, key, masks, training=training, wanted=wanted)

    return jax.jit(flat)


def execute(net, inputs, key, masks=None, *, training: bool, wanted):
    """Run the graph op by op (traced when called under a transformation)."""
    g = net.graph
    layers = net.layers
    needed = needed_layers(g, wanted)
    values: dict[tuple[int, int], Any] = {}
    value_masks: dict[tuple[int, int], Any] = {}
    states: list[tuple] = [lyr._state_values() for lyr in layers]
    for i in g.order:
        if i not in needed:
            continue
        layer = layers[i]
        ins = tuple(
            inputs[s.index] if s.kind == "input" else values[(s.index, s.port)]
            for s in g.sources[i]
        )
        mask = None
        if masks is not None:
            found = (
                masks[s.index] if s.kind == "input" else value_masks.get((s.index, s.port))
                for s in g.sources[i]
            )
            mask = next((m for m in found if m is not None), None)
        layer_key = jax.random.fold_in(key, i) if key is not None else None
        outs, new_state = call_layer(
            layer, ins, training=training, key=layer_key, mask=_mask.for_value(mask, ins[0])
        )
        for o, y in enumerate(outs):
            values[(i, o)] = y
            if (kept := _mask.for_value(mask, y)) is not None:
                value_masks[(i, o)] = kept
        if layer.state_names:
            states[i] = new_state
    outputs = tuple(values[w] for w in wanted)
    if masks is None:
        return outputs, tuple(states)
    return outputs, tuple(states), tuple(value_masks.get(w) for w in wanted)


@functools.lru_cache(maxsize=256)
def _needed_layers(g: Graph, wanted) -> frozenset[int]:
    needed, stack = set(), [i for i, _ in wanted]
    while stack:
        i = stack.pop()
        if i in needed:
            continue
        needed.add(i)
        stack += [s.index for s in g.sources[i] if s.kind == "layer"]
    return frozenset(needed)


def needed_layers(g: Graph, wanted) -> frozenset[int]:
    """The layers that the outputs ``wanted`` depend on."""
    return _needed_layers(g, tuple(wanted))


def execute_segmented(net, inputs, key, *, training: bool, wanted):
    """Compiled runs of acceleratable layers, with the others run eagerly in between."""
    g = net.graph
    layers = net.layers
    needed = needed_layers(g, wanted)
    order = [i for i in g.order if i in needed]
    segments: list[tuple[bool, tuple[int, ...]]] = []
    for i in order:
        eager = not layers[i].acceleratable
        if segments and not eager and not segments[-1][0]:
            segments[-1] = (False, segments[-1][1] + (i,))
        else:
            segments.append((eager, (i,)))
    env: dict[str, Any] = {f"in{k}": x for k, x in enumerate(inputs)}
    states = [lyr._state_values() for lyr in layers]
    for n, (eager, members) in enumerate(segments):
        later = set(wanted)
        for _, m in segments[n + 1 :]:
            later |= {(s.index, s.port) for j in m for s in g.sources[j] if s.kind == "layer"}
        produced = sorted(
            (i, o) for i in members for o in range(layers[i].num_outputs) if (i, o) in later
        )
        consumed = sorted(
            {_env_key(s) for j in members for s in g.sources[j]}
            - {f"v{i}_{o}" for i in members for o in range(layers[i].num_outputs)}
        )
        args = {k: env[k] for k in consumed}
        if eager:
            out_env, seg_states = _run_members(net, members, args, key, training, produced)
        else:
            cache_key = ("segment", n, training, tuple(produced), _cache.signature((args, key)))
            compiled = net.compile_cache.get(
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


def input_signature(xs, key):
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
    g = net.graph
    local = dict(env)
    seg_states = {}
    for i in members:
        layer = net.layers[i]
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

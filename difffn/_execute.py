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

A network whose sizes were never checked (built from initialized layers, or edited so that the
layouts could not be propagated) may fail inside a layer with JAX's shape error; ``run`` then
propagates the layouts to name the layer that does not fit, and raises that instead.
"""

from __future__ import annotations

import functools
from typing import Any

import jax

from . import _cache
from ._errors import AccelerationError, Error
from ._format import FormattedArray
from ._graph import Graph
from ._layer_call import call_layer
from ._propagate import propagate

ACCELERATION = ("auto", "none")


def run(net, inputs, key, *, training: bool, wanted, acceleration: str = "auto"):
    """Run ``net`` on prepared inputs; returns (values for ``wanted``, new state per layer)."""
    try:
        return _run(net, inputs, key, training=training, wanted=wanted, acceleration=acceleration)
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


def _run(net, inputs, key, *, training: bool, wanted, acceleration: str):
    tracing = isinstance(key, jax.core.Tracer) or any(
        isinstance(x.data if isinstance(x, FormattedArray) else x, jax.core.Tracer) for x in inputs
    )
    if acceleration == "none":
        return execute(net, inputs, key, training=training, wanted=wanted)
    if not net.acceleratable:
        return execute_segmented(net, inputs, key, training=training, wanted=wanted)
    if tracing:
        return execute(net, inputs, key, training=training, wanted=wanted)
    cache_key = ("forward" if training else "predict", wanted, input_signature(inputs, key))
    compiled = net.compile_cache.get(
        cache_key,
        lambda: jax.jit(functools.partial(execute, training=training, wanted=wanted)),
        lambda: _cache.describe_signature(inputs),
    )
    return compiled(net, inputs, key)


def execute(net, inputs, key, *, training: bool, wanted):
    """Run the graph op by op (traced when called under a transformation)."""
    g = net.graph
    layers = net.layers
    needed = needed_layers(g, wanted)
    values: dict[tuple[int, int], Any] = {}
    states: list[tuple] = [lyr._state_values() for lyr in layers]
    for i in g.order:
        if i not in needed:
            continue
        layer = layers[i]
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

"""The initializers' program with its random draws merged: one Threefry call per depth.

``Network.initialize`` compiles every layer's initializer into one program. Each random draw
(``jax.random.uniform``, ``normal``, ``split``, ``fold_in``) on a Threefry key becomes its own
``threefry2x32`` computation in that program, and XLA:CPU compiles each one, with the code that
turns its bits into numbers, into kernels of its own: for the transformer of
``benchmarks/bench_models.py`` (66 parameters, about 130 draws) that is 427 kernels and 0.9 s
of compiling, most of a cold ``initialize``, for a program that then runs in 50 ms.

Threefry is elementwise in its four operands (two key words, two counter words), so the draws
that do not depend on each other's results can run as one call on their operands concatenated,
and their bits come out exactly as they would one by one. This module rewrites the traced
initializers that way:

1. ``jax.make_jaxpr`` traces the initializers as they are (a user's error surfaces here, as
   before);
2. its equations are flattened into one list, without tracing again: nested ``jit`` calls are
   inlined, and each draw on a scalar Threefry key is replaced by the equations of the key
   implementation's own ``random_bits`` / ``split`` / ``fold_in`` (``jax.extend.random.
   threefry_prng_impl``, traced once per kind and shape), so every ``threefry2x32`` equation
   sits in the list;
3. the equations that no output depends on are dropped (merging would otherwise keep every
   draw alive: its bits are sliced out of the one call);
4. the list is evaluated in the caller's trace depth by depth (a draw's depth: how many draws
   lie on its longest chain of inputs), each depth's ``threefry2x32`` equations as one.

The values are bit-identical to the unmerged program's (``tests/test_initialize_program.py``
compares them with ``jax.random`` run eagerly). Each equation is evaluated in the context it was
traced in, and each draw is spelled out with the Threefry layout it was traced under
(``jax.threefry_partitionable``). Draws on other key implementations, on arrays of keys, a
``fold_in`` of an array, and draws inside control flow (``scan``, ``cond``, custom derivatives)
are left as they are; a program with side effects (a ``jax.debug.print`` in an initializer) is
not reordered; anything this rewrite cannot read falls back to the program as traced (the tests
hold that the built-in layers' programs never do). Written here because JAX has no pass that
batches independent PRNG calls (``jax.vmap`` does, for draws of one shape only). Measured in
``docs/performance.md`` ("What changed after that").
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend import core as jex_core
from jax.extend import random as jex_random

_THREEFRY = jex_random.threefry2x32_p
_IMPL = jex_random.threefry_prng_impl
_CALLS = {"pjit": "jaxpr", "jit": "jaxpr", "closed_call": "call_jaxpr"}  # the program's param
_DRAWS = frozenset({"random_bits", "random_split", "random_fold_in"})


def merged_draws(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with its independent Threefry draws run as one call per depth (same values)."""

    @functools.wraps(fn)  # jit names the program (and its cache file) after fn
    def run(*args: Any) -> Any:
        flat, tree = jax.tree.flatten(args)
        closed, shapes = jax.make_jaxpr(
            lambda *leaves: fn(*jax.tree.unflatten(tree, leaves)), return_shape=True
        )(*flat)
        outputs = jax.tree.structure(shapes)
        values = None
        if not closed.effects:  # a side effect keeps its place: the program as traced
            try:
                values = _run_flat(closed, flat)
            except Exception:  # noqa: BLE001 - an equation this rewrite cannot read: as traced
                values = None
        if values is None:
            values = _as_traced(closed, flat)
        return jax.tree.unflatten(outputs, values)

    return run


def _as_traced(closed: Any, args: Sequence[Any]) -> list[Any]:
    """The program evaluated as traced, unmerged (JAX's ``jaxpr_as_fun``)."""
    return list(jex_core.jaxpr_as_fun(closed)(*args))


def _bind(eqn: Any, args: Sequence[Any]) -> list[Any]:
    """One equation bound in the caller's trace, in its own context (as ``eval_jaxpr`` does:
    the Threefry layout, ``compute_on``, XLA metadata it was traced under)."""
    params = eqn.primitive.get_bind_params(eqn.params)
    with eqn.ctx.manager:
        out = eqn.primitive.bind(*args, **params)
    return list(out) if eqn.primitive.multiple_results else [out]


# -- 2. one flat list of equations -----------------------------------------------------------------


class _Ref:
    """A value of the flat list (a variable of one inlined copy of a jaxpr)."""

    __slots__ = ()


class _Node:
    """One equation of the flat list: the original equation, on references."""

    __slots__ = ("eqn", "ins", "outs")

    def __init__(self, eqn: Any, ins: list[Any], outs: list[_Ref]) -> None:
        self.eqn, self.ins, self.outs = eqn, ins, outs


def _one_threefry_draw(eqn: Any) -> bool:
    """A draw from one scalar Threefry key (and, for ``fold_in``, one scalar datum)."""
    if eqn.primitive.name not in _DRAWS:
        return False
    key = eqn.invars[0].aval
    return (
        str(getattr(key, "dtype", None)) == f"key<{_IMPL.tag}>"  # a Threefry key's dtype
        and all(getattr(v.aval, "shape", None) == () for v in eqn.invars)
    )


@functools.lru_cache(maxsize=256)
def _draw_jaxpr(name: str, params: tuple, key_dtype: Any, data_aval: Any, layout: bool) -> Any:
    """The key implementation's own computation of one draw, from the typed key, traced with
    the Threefry layout (``jax.threefry_partitionable``) the draw was traced under."""
    p = dict(params)
    key = jax.ShapeDtypeStruct((), key_dtype)
    words = jax.random.key_data
    wrap = functools.partial(jax.random.wrap_key_data, impl="threefry2x32")
    with jax.threefry_partitionable(layout):
        if name == "random_bits":
            bits = _IMPL.random_bits
            return jax.make_jaxpr(lambda k: bits(words(k), p["bit_width"], p["shape"]))(key)
        if name == "random_split":
            return jax.make_jaxpr(lambda k: wrap(_IMPL.split(words(k), p["shape"])))(key)
        data = jax.ShapeDtypeStruct(data_aval.shape, data_aval.dtype)
        return jax.make_jaxpr(lambda k, d: wrap(_IMPL.fold_in(words(k), d)))(key, data)


def _flatten(
    jaxpr: Any, consts: Sequence[Any], ins: Sequence[Any], nodes: list, values: dict
) -> list[Any]:
    """Append ``jaxpr``'s equations to ``nodes`` on references; return its outputs' references.

    ``ins``: references (or ``Literal``\\ s) for its inputs; ``values``: the constants' values.
    """
    env: dict[Any, Any] = dict(zip(jaxpr.invars, ins))
    for var, value in zip(jaxpr.constvars, consts):
        env[var] = ref = _Ref()
        values[ref] = value
    read = lambda v: v if isinstance(v, jex_core.Literal) else env[v]  # noqa: E731
    for eqn in jaxpr.eqns:
        args = [read(v) for v in eqn.invars]
        name = eqn.primitive.name
        inner = eqn.params.get(_CALLS[name]) if name in _CALLS else None
        if inner is not None:
            if isinstance(inner, jex_core.ClosedJaxpr):
                outs = _flatten(inner.jaxpr, inner.consts, args, nodes, values)
            else:
                outs = _flatten(inner, (), args, nodes, values)
        elif _one_threefry_draw(eqn):
            data = eqn.invars[1].aval if name == "random_fold_in" else None
            params = tuple(sorted(eqn.params.items()))
            layout = bool(eqn.ctx.threefry_partitionable)
            closed = _draw_jaxpr(name, params, eqn.invars[0].aval.dtype, data, layout)
            outs = _flatten(closed.jaxpr, closed.consts, args, nodes, values)
        else:
            outs = [_Ref() for _ in eqn.outvars]
            nodes.append(_Node(eqn, args, outs))
        env.update(zip(eqn.outvars, outs))
    return [read(v) for v in jaxpr.outvars]


# -- 3. what the outputs need ------------------------------------------------------------------


def _needed(nodes: list[_Node], outputs: Sequence[Any]) -> list[_Node]:
    """The nodes that the outputs depend on, in order. Merging would keep every draw alive
    (its bits are sliced out of one call), so the draws nobody reads (the key of a layer
    without parameters) are dropped first, as JAX's dead-code elimination would have."""
    wanted = {r for r in outputs if isinstance(r, _Ref)}  # references hash by identity
    kept: list[_Node] = []
    for node in reversed(nodes):
        if any(r in wanted for r in node.outs):
            kept.append(node)
            wanted.update(r for r in node.ins if isinstance(r, _Ref))
    kept.reverse()
    return kept


# -- 4. depth by depth -------------------------------------------------------------------------


def _run_flat(closed: Any, args: Sequence[Any]) -> list[Any]:
    """Evaluate ``closed`` flattened, the ``threefry2x32`` equations of each depth as one call.

    A Threefry equation's depth is one more than its inputs' deepest; any other equation's is
    its inputs' deepest. Depth by depth: first the Threefry equations (their inputs are all of
    smaller depths, already evaluated), then the others in program order.
    """
    nodes: list[_Node] = []
    values: dict[Any, Any] = {}
    inputs = [_Ref() for _ in args]
    values.update(zip(inputs, args))
    outputs = _flatten(closed.jaxpr, closed.consts, inputs, nodes, values)
    nodes = _needed(nodes, outputs)
    depth: dict[Any, int] = {}
    draws: list[list[_Node]] = [[]]
    others: list[list[_Node]] = [[]]
    for node in nodes:
        d = max((depth.get(r, 0) for r in node.ins if isinstance(r, _Ref)), default=0)
        d += node.eqn.primitive is _THREEFRY
        while len(draws) <= d:
            draws.append([])
            others.append([])
        (draws if node.eqn.primitive is _THREEFRY else others)[d].append(node)
        depth.update((r, d) for r in node.outs)
    read = lambda r: r.val if isinstance(r, jex_core.Literal) else values[r]  # noqa: E731
    for level_draws, level_others in zip(draws, others):
        if len(level_draws) == 1:
            level_others = [*level_draws, *level_others]
        elif level_draws:
            values.update(_threefry_at_once(level_draws, read))
        for node in level_others:
            values.update(zip(node.outs, _bind(node.eqn, [read(r) for r in node.ins])))
    return [read(r) for r in outputs]


def _threefry_at_once(nodes: list[_Node], read: Callable[[Any], Any]) -> dict:
    """Several ``threefry2x32`` equations as one call on their operands, concatenated.

    Written with ``lax`` so that each operand takes one equation (a scalar key word one
    broadcast, a counter array one reshape) and each result one slice (and a reshape when it
    is not a vector): the equations of this program are most of its tracing and lowering."""
    shapes = [tuple(node.eqn.outvars[0].aval.shape) for node in nodes]

    def flat(value: Any, shape: tuple[int, ...]) -> Any:
        value = jnp.asarray(value)
        size = math.prod(shape)
        if value.ndim == 0:
            return lax.broadcast_in_dim(value, (size,), ())
        value = jnp.broadcast_to(value, shape)
        return value if value.ndim == 1 else lax.reshape(value, (size,))

    operands = [
        lax.concatenate([flat(read(node.ins[i]), s) for node, s in zip(nodes, shapes)], 0)
        for i in range(4)
    ]
    first, second = _THREEFRY.bind(*operands)
    results, start = {}, 0
    for node, shape in zip(nodes, shapes):
        stop = start + math.prod(shape)
        for out, bits in zip(node.outs, (first, second)):
            part = lax.slice(bits, (start,), (stop,))
            results[out] = part if len(shape) == 1 else lax.reshape(part, shape)
        start = stop
    return results

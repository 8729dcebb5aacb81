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
2. a second trace inlines nested ``jit`` calls and writes each draw on a scalar Threefry key as
   the key implementation's own ``random_bits`` / ``split`` / ``fold_in`` (``jax.extend.random.
   threefry_prng_impl``), so every ``threefry2x32`` equation sits at the top level;
3. the result is evaluated in the caller's trace depth by depth (a draw's depth: how many draws
   lie on its longest chain of inputs), each depth's ``threefry2x32`` equations as one.

The values are bit-identical to the unmerged program's (``tests/test_initialize_program.py``
compares them with ``jax.random`` run eagerly). Draws on other key implementations, on arrays of
keys, and inside control flow (``scan``, ``cond``, custom derivatives) are left as they are;
a program with side effects (a ``jax.debug.print`` in an initializer) is not reordered; anything
this rewrite cannot read falls back to the program as traced. Written here because JAX has no
pass that batches independent PRNG calls (``jax.vmap`` does, for draws of one shape only).
Measured in ``docs/performance.md`` ("Where the cold first step goes").
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.extend import core as jex_core
from jax.extend import random as jex_random

_THREEFRY = jex_random.threefry2x32_p
_IMPL = jex_random.threefry_prng_impl
_CALLS = frozenset({"pjit", "jit", "closed_call", "core_call"})
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
        if closed.effects:  # a side effect keeps its place: the program as traced
            return jax.tree.unflatten(outputs, _evaluate(closed.jaxpr, closed.consts, flat))
        try:
            expanded = jax.make_jaxpr(lambda *leaves: _inline(closed.jaxpr, closed.consts, leaves))(
                *flat
            )
            values = _by_depth(expanded.jaxpr, expanded.consts, flat)
        except Exception:  # noqa: BLE001 - an equation this rewrite cannot read: as traced
            values = _evaluate(closed.jaxpr, closed.consts, flat)
        return jax.tree.unflatten(outputs, values)

    return run


def _bind(eqn: Any, args: Sequence[Any]) -> list[Any]:
    params = eqn.primitive.get_bind_params(eqn.params)
    out = eqn.primitive.bind(*args, **params)
    return list(out) if eqn.primitive.multiple_results else [out]


def _reader(env: dict) -> Callable[[Any], Any]:
    return lambda v: v.val if isinstance(v, jex_core.Literal) else env[v]


def _evaluate(jaxpr: Any, consts: Sequence[Any], args: Sequence[Any]) -> list[Any]:
    """``jaxpr`` evaluated in the caller's trace, equation by equation."""
    env = dict(zip(jaxpr.constvars, consts)) | dict(zip(jaxpr.invars, args))
    read = _reader(env)
    for eqn in jaxpr.eqns:
        env.update(zip(eqn.outvars, _bind(eqn, [read(v) for v in eqn.invars])))
    return [read(v) for v in jaxpr.outvars]


def _scalar_threefry_key(aval: Any) -> bool:
    dtype = getattr(aval, "dtype", None)
    return (
        getattr(aval, "shape", None) == ()
        and dtype is not None
        and jnp.issubdtype(dtype, jax.dtypes.prng_key)
        and str(dtype) == f"key<{_IMPL.tag}>"
    )


@functools.lru_cache(maxsize=256)
def _draw_jaxpr(name: str, params: tuple, data_aval: Any) -> Any:
    """The key implementation's own computation of one draw, on the key's two words."""
    words = jax.ShapeDtypeStruct((2,), jnp.uint32)
    p = dict(params)
    if name == "random_bits":
        return jax.make_jaxpr(lambda k: _IMPL.random_bits(k, p["bit_width"], p["shape"]))(words)
    if name == "random_split":
        return jax.make_jaxpr(lambda k: _IMPL.split(k, p["shape"]))(words)
    data = jax.ShapeDtypeStruct(data_aval.shape, data_aval.dtype)
    return jax.make_jaxpr(lambda k, d: _IMPL.fold_in(k, d))(words, data)


def _inline(jaxpr: Any, consts: Sequence[Any], args: Sequence[Any]) -> list[Any]:
    """Evaluate ``jaxpr`` with ``jit`` calls inlined and scalar-Threefry-key draws spelled out."""
    env = dict(zip(jaxpr.constvars, consts)) | dict(zip(jaxpr.invars, args))
    read = _reader(env)
    for eqn in jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        name = eqn.primitive.name
        if name in _CALLS and "jaxpr" in eqn.params:
            inner = eqn.params["jaxpr"]
            if isinstance(inner, jex_core.ClosedJaxpr):
                outs = _inline(inner.jaxpr, inner.consts, ins)
            else:
                outs = _inline(inner, (), ins)
        elif name in _DRAWS and _scalar_threefry_key(eqn.invars[0].aval):
            data_aval = eqn.invars[1].aval if name == "random_fold_in" else None
            closed = _draw_jaxpr(name, tuple(sorted(eqn.params.items())), data_aval)
            words = jax.random.key_data(ins[0])
            outs = _inline(closed.jaxpr, closed.consts, [words, *ins[1:]])
            if name != "random_bits":  # split and fold_in give keys
                outs = [jax.random.wrap_key_data(outs[0], impl="threefry2x32")]
        else:
            outs = _bind(eqn, ins)
        env.update(zip(eqn.outvars, outs))
    return [read(v) for v in jaxpr.outvars]


def _by_depth(jaxpr: Any, consts: Sequence[Any], args: Sequence[Any]) -> list[Any]:
    """Evaluate a flat ``jaxpr``, the ``threefry2x32`` equations of each depth as one call.

    A Threefry equation's depth is one more than its inputs' deepest; any other equation's is
    its inputs' deepest. Depth by depth: first the Threefry equations (their inputs are all of
    smaller depths, already evaluated), then the others in program order.
    """
    depth: dict[Any, int] = {}
    draws: list[list[Any]] = [[]]
    others: list[list[Any]] = [[]]
    for eqn in jaxpr.eqns:
        d = max((depth.get(v, 0) for v in eqn.invars if not isinstance(v, jex_core.Literal)), default=0)
        d += eqn.primitive is _THREEFRY
        while len(draws) <= d:
            draws.append([])
            others.append([])
        (draws if eqn.primitive is _THREEFRY else others)[d].append(eqn)
        depth.update((v, d) for v in eqn.outvars)
    env = dict(zip(jaxpr.constvars, consts)) | dict(zip(jaxpr.invars, args))
    read = _reader(env)
    for level_draws, level_others in zip(draws, others):
        if len(level_draws) == 1:
            level_others = [*level_draws, *level_others]
        elif level_draws:
            env.update(_threefry_at_once(level_draws, read))
        for eqn in level_others:
            env.update(zip(eqn.outvars, _bind(eqn, [read(v) for v in eqn.invars])))
    return [read(v) for v in jaxpr.outvars]


def _threefry_at_once(eqns: list[Any], read: Callable[[Any], Any]) -> dict:
    """Several ``threefry2x32`` equations as one call on their operands, concatenated."""
    shapes = [tuple(eqn.outvars[0].aval.shape) for eqn in eqns]
    operands = [
        jnp.concatenate(
            [jnp.ravel(jnp.broadcast_to(read(eqn.invars[i]), s)) for eqn, s in zip(eqns, shapes)]
        )
        for i in range(4)
    ]
    first, second = _THREEFRY.bind(*operands)
    results, start = {}, 0
    for eqn, shape in zip(eqns, shapes):
        stop = start + math.prod(shape)
        results[eqn.outvars[0]] = first[start:stop].reshape(shape)
        results[eqn.outvars[1]] = second[start:stop].reshape(shape)
        start = stop
    return results

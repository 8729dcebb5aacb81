"""The twin ``custom_vjp``: one builder for ``DifferentiableFunction`` and ``Layer.backward``.

A custom operation whose ``fwd`` calls *the operation itself* (JAX's recommended pattern) keeps
its user rules at every order: an outer derivative of the outputs sees the same ``backward``
(or ``jvp``) again instead of differentiating the forward body. What the user's forward also
returns for the backward only — the *memory values* — is differentiated by autodiff of the
forward instead, and needs the operation to return them: that is the *inner* twin, which
returns ``(a, b, memory static structure, memory arrays)`` where the *outer* twin (the one
users call) returns only ``(a, b)``. ``fwd`` always calls the inner twin, so first-order
residuals are exactly what the rule keeps, and what the memory's derivative needs is kept only
by the inner twin, which exists only under an outer derivative.

Under an outer *forward* mode (``jax.hessian`` is forward over reverse), the outputs ``fwd``
computes need tangents, which a ``jax.custom_vjp`` gets by autodiff of its fwd's body: with
``inner_jvp``, ``fwd`` then calls a third twin (``_tangent_map.forward_over_reverse``), whose
tangent map is ``inner_jvp`` when forward mode runs it and ``bwd`` when reverse mode transposes
it. ``fwd`` calls it whenever an outer derivative may still come: under an outer derivative's
trace, and in any staged program (``jax.jit``, ``jax.checkpoint`` or a ``scan`` body *inside*
the derivative trace the rule before the outer derivative meets it). Only eager values (a
``jax.vmap`` of them included) keep the plain twins.

Both ``DifferentiableFunction`` (``_function_rules.Operation``) and a layer's custom backward
(``_layer._layer_backward``) are built with `twin_custom_vjp`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
from jax.core import Tracer

from .._core import DifferentiableFunctionError
from . import _tangent_map
from ._primitive import custom_vjp

try:
    from jax._src.interpreters.batching import BatchTracer
except ImportError:  # pragma: no cover - depends on the JAX version
    BatchTracer = ()  # every tracer then counts as one an outer derivative may differentiate


class Twin(NamedTuple):
    """The two operations: ``outer`` (what callers call) and ``inner`` (it also returns the
    memory values; ``outer`` itself when there are none)."""

    outer: Callable[..., Any]
    inner: Callable[..., Any]


def twin_custom_vjp(
    full: Callable[..., Any],
    fwd: Callable[..., Any],
    bwd: Callable[..., Any],
    *,
    memory: bool = True,
    jvp: Callable[..., Any] | None = None,
    inner_jvp: Callable[..., Any] | None = None,
    name: str,
    forward_mode_message: str | None = None,
    error: type[Exception] = DifferentiableFunctionError,
) -> Twin:
    """The outer and inner twins of one custom operation, both on ``_primitive.custom_vjp``.

    Args:
      full: ``full(*args) -> (a, b, memory_static, memory_arrays)``: the operation's two results
        (outputs, and their structure or new state) and its memory values.
      fwd: ``fwd(inner, call_inner, *primals) -> (result, residuals)``: ``call_inner(*values)``
        is the inner twin (the operation itself, with its memory values); ``result`` is what it
        returned (the outer twin passes on its first two items).
      bwd: ``bwd(inner, residuals, cotangents)``: the cotangents of ``(a, b)``, and for the
        inner twin also of ``(memory_static, memory_arrays)``.
      memory: whether the operation may return memory values (``False``: the inner twin is the
        outer one).
      jvp: optional ``jvp(inner, primals, tangents, out_avals)``, the forward-mode rule.
      inner_jvp: optional forward-mode rule of the operation *inside* ``fwd`` only, for an
        operation without ``jvp``: under an outer forward mode (``jax.hessian``, ``jax.jvp`` of a
        gradient) the outputs ``fwd`` computes get their tangents from it, as the outputs of a
        ``jax.custom_vjp`` fwd get theirs by autodiff of fwd's body, while the operation's
        backward is differentiated as usual. Reverse mode still uses ``bwd`` at every order.
      name, forward_mode_message, error: as for ``_primitive.custom_vjp``.
    """
    twins: list[Callable[..., Any]] = []

    def call_inner(*values):
        if len(twins) == 2 and _under_derivative(values):
            return twins[1](*values)
        return twins[0](*values)

    def outer_primal(*args):
        return tuple(full(*args)[:2])

    def outer_fwd(*primals):
        result, residuals = fwd(False, call_inner, *primals)
        return tuple(result[:2]), residuals

    def rule(given, inner: bool):
        if given is None:
            return None
        return lambda primals, tangents, avals: given(inner, primals, tangents, avals)

    def make(primal, fwd_, bwd_, jvp_):
        return custom_vjp(
            primal,
            fwd_,
            bwd_,
            jvp=jvp_,
            name=name,
            forward_mode_message=forward_mode_message,
            error=error,
        )

    def build(jvp_rule):
        if not memory:
            return make(
                outer_primal, outer_fwd, lambda r, c: bwd(False, r, c), rule(jvp_rule, False)
            )
        return make(
            full,
            lambda *primals: fwd(True, call_inner, *primals),
            lambda r, c: bwd(True, r, c),
            rule(jvp_rule, True),
        )

    outer = make(outer_primal, outer_fwd, lambda r, c: bwd(False, r, c), rule(jvp, False))
    inner = build(jvp) if memory else outer
    twins.append(inner)
    if inner_jvp is not None and inner_jvp is not jvp and _tangent_map.AVAILABLE:
        # The operation for fwd under a possible outer derivative: forward mode by inner_jvp,
        # reverse mode by bwd (see _tangent_map).
        given = inner_jvp
        twins.append(
            _tangent_map.forward_over_reverse(
                full if memory else outer_primal,
                (lambda *p: fwd(True, call_inner, *p)) if memory else outer_fwd,
                lambda r, c: bwd(memory, r, c),
                lambda primals, tangents, avals: given(memory, primals, tangents, avals),
                name=name,
            )
        )
    return Twin(outer, inner)


def _under_derivative(values) -> bool:
    """Whether an outer derivative may differentiate ``values``: an outer derivative's trace
    (JVP or linearize: ``jax.hessian``, ``jax.jvp`` or ``jax.linearize`` of a gradient, grad of
    grad), or a staged program (``jax.jit``, ``jax.checkpoint``, a ``scan`` body), which an
    outer derivative may differentiate after it is traced (``jax.hessian(jax.jit(loss))``)."""
    return any(_may_be_differentiated(v) for v in jax.tree.leaves(values))


def _may_be_differentiated(value) -> bool:
    """Any tracer but a ``jax.vmap`` of concrete values: eager values have no outer derivative."""
    while isinstance(value, BatchTracer):
        value = value.val
    return isinstance(value, Tracer)

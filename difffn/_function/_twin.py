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

Both ``DifferentiableFunction`` (``_function_rules.Operation``) and a layer's custom backward
(``_layer._layer_backward``) are built with :func:`twin_custom_vjp`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from .._core import DifferentiableFunctionError
from ._primitive import custom_vjp


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
      name, forward_mode_message, error: as for ``_primitive.custom_vjp``.
    """
    twins: list[Callable[..., Any]] = []

    def call_inner(*values):
        return twins[-1](*values)

    def outer_primal(*args):
        return tuple(full(*args)[:2])

    def outer_fwd(*primals):
        result, residuals = fwd(False, call_inner, *primals)
        return tuple(result[:2]), residuals

    def rule(inner: bool):
        if jvp is None:
            return None
        return lambda primals, tangents, avals: jvp(inner, primals, tangents, avals)

    options = dict(name=name, forward_mode_message=forward_mode_message, error=error)
    outer = custom_vjp(
        outer_primal, outer_fwd, lambda r, c: bwd(False, r, c), jvp=rule(False), **options
    )
    inner = outer
    if memory:
        inner = custom_vjp(
            full,
            lambda *primals: fwd(True, call_inner, *primals),
            lambda r, c: bwd(True, r, c),
            jvp=rule(True),
            **options,
        )
    twins.append(inner)
    return Twin(outer, inner)

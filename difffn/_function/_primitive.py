"""``custom_vjp``: difffn's one custom-derivative mechanism, used by functions and layers.

Normally it is exactly ``jax.custom_vjp(fun)`` with ``fwd``/``bwd`` and ``symbolic_zeros=True``.
Two cases need more, and get difffn's own primitive built on JAX's ``VJPHiPrimitive`` (the
machinery under the coming ``custom_vjp3``), which has separate forward- and reverse-mode rules:

1. A forward-mode rule is given (a ``DifferentiableFunction`` that defines ``jvp``).
   ``jax.custom_vjp`` has no forward mode, and ``jax.custom_jvp`` derives reverse mode by
   transposing the jvp rule, so neither can use the user's ``jvp`` in forward mode (``jax.jvp``,
   ``jax.linearize``) *and* the user's ``backward`` in reverse mode.
2. ``JAX_CUSTOM_VJP3=1``. Then ``jax.custom_vjp`` is itself such a primitive, but with
   ``symbolic_zeros=True`` it cannot be linearized through ``jax.checkpoint`` yet. Here that path
   is the forward rule plus a linear op whose transpose is ``bwd``, with the real perturbed
   flags.

``once_differentiable_guard`` is a third, small primitive on the same machinery: the identity,
whose derivative (reverse or forward) raises, and only when a nonzero derivative actually flows
through it, like PyTorch's ``once_differentiable``.

``VJPHiPrimitive`` is internal to JAX; difffn uses it only in these cases.

Without a forward-mode rule, every traced input passes through ``reverse_only``, the identity,
whose tangent goes through a linear identity that raises ``ForwardModeError`` when it is
*evaluated* (eagerly, or when ``jax.jit`` lowers it) and transposes to the identity. Reverse mode
only transposes it, so it costs nothing there; forward mode (``jax.jvp``, ``jax.jacfwd``,
``jax.hessian``, running ``jax.linearize``'s linear function) evaluates it before the operation's
own tangent, and gets the named error instead of JAX's ``TypeError`` about a ``custom_vjp``.
It is written with JAX's public primitive API (``jax.extend.core.Primitive`` and the
``jax.interpreters`` rule tables), because no JAX mechanism tells forward from reverse mode.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.core
import jax.extend.core as jax_core
import jax.numpy as jnp
from jax.interpreters import ad, batching, mlir

try:
    from jax._src import ad_util
    from jax._src.hijax import VJPHiPrimitive, VmapOf, fake_linear_op
    from jax._src.interpreters.batching import batch_jaxpr2
    from jax._src.tree_util import broadcast_prefix
except ImportError as error:  # pragma: no cover - depends on the JAX version
    _IMPORT_ERROR: ImportError | None = error
    VJPHiPrimitive = VmapOf = object  # type: ignore[assignment,misc]
    # Not there either; every use is behind _require_primitives.
    ad_util: Any = None
    fake_linear_op: Any = None
    batch_jaxpr2: Any = None
    broadcast_prefix: Any = None
else:
    _IMPORT_ERROR = None

from .._core import DifferentiableFunctionError, ForwardModeError, HigherOrderError
from . import _cotangents as ct


class Primal:
    """A primal value and whether the surrounding transformation differentiates it."""

    __slots__ = ("value", "perturbed")

    def __init__(self, value, perturbed: bool):
        self.value = value
        self.perturbed = perturbed


def custom_vjp(
    fun,
    fwd,
    bwd,
    *,
    jvp=None,
    name: str = "custom_vjp",
    forward_mode_message=None,
    error: type[Exception] = DifferentiableFunctionError,
):
    """A callable computing ``fun(*args)``, differentiated with ``fwd``/``bwd`` (and ``jvp``).

    Args:
      fun: the primal function (positional pytree arguments).
      fwd: ``fwd(*args)`` where every array leaf is a ``Primal``-like object with ``.value`` and
        ``.perturbed``; returns ``(outputs, residuals)``.
      bwd: ``bwd(residuals, output_cotangents)``: cotangents may be symbolic zeros (see
        ``_cotangents.is_symbolic_zero``); returns one cotangent (pytree, ``None`` for zero) per
        argument.
      jvp: optional ``jvp(primals, tangents, out_avals) -> output_tangents`` for forward mode
        (tangents may be symbolic zeros; ``out_avals`` is ``fun``'s output structure of avals);
        the outputs themselves come from calling the operation again, so an outer derivative of
        them uses these same rules.
      name: for messages.
      forward_mode_message: the ``ForwardModeError`` message for forward mode without ``jvp``
        (default: a generic one naming ``name``).
      error: the ``df.Error`` class for a user mistake the primitive finds (a closure over a
        traced value).
    """
    public = None
    no_jvp = forward_mode_message or (
        f"{name} defines only a reverse-mode rule and cannot be differentiated in forward mode "
        "(jax.jvp, jax.jacfwd, jax.linearize, jax.hessian)."
    )

    def call(*args):
        nonlocal public
        if jvp is None:
            args = reverse_only(args, no_jvp)
        # JAX's Config sets its flags as attributes at run time; its class does not declare them.
        if jvp is None and not jax.config.jax_custom_vjp3:  # pyright: ignore[reportAttributeAccessIssue]
            if public is None:
                public = jax.custom_vjp(fun)
                public.defvjp(fwd, bwd, symbolic_zeros=True)
                # custom_vjp copies the function's names (functools.update_wrapper) but does not
                # declare them.
                public.__name__ = public.__qualname__ = name  # pyright: ignore[reportAttributeAccessIssue]
            return public(*args)
        _require_primitives(name)
        in_avals = jax.tree.map(jax.typeof, args)
        return _CustomVJPPrimitive(fun, fwd, bwd, jvp, in_avals, name, no_jvp, error)(*args)

    call.__name__ = call.__qualname__ = name
    return call


def _require_primitives(name: str) -> None:
    if _IMPORT_ERROR is not None:  # pragma: no cover
        raise ForwardModeError(
            f"{name} needs JAX's primitive API (jax._src.hijax), which this JAX version "
            f"({jax.__version__}) lacks. Fix: install jax>=0.10.2."
        ) from _IMPORT_ERROR


def _nonzero_flags(tree) -> list[bool]:
    return [not ct.is_symbolic_zero(t) for t in jax.tree.leaves(tree, is_leaf=ct.is_symbolic_zero)]


class _CustomVJPPrimitive(VJPHiPrimitive):  # type: ignore[misc,valid-type]
    def __init__(self, fun, fwd, bwd, jvp, in_avals, name, no_jvp, error):
        self.in_avals = tuple(in_avals)
        self._traced = jax.jit(fun).trace(*in_avals)
        captured = [
            c for c in getattr(self._traced, "_consts", ()) if isinstance(c, jax.core.Tracer)
        ]
        if captured:
            # JAX's own custom_vjp3 refuses this too: the primitive is traced on its own.
            raise error(
                f"{name} closes over a value traced by an enclosing transformation (a "
                f"{type(captured[0]).__name__} of type {captured[0].aval.str_short()}), which "
                "difffn's primitive (used for a class that defines jvp, and under "
                "JAX_CUSTOM_VJP3=1) cannot capture, like JAX's own custom_vjp there. Fix: pass "
                "that value as an input."
            )
        self.out_aval = self._traced.out_avals
        self.params = dict(fun=fun, fwd=fwd, bwd=bwd, jvp_rule=jvp, name=name, no_jvp=no_jvp)
        super().__init__()

    def expand(self, *args):
        return self.fun(*args)

    def vjp_fwd(self, nzs_in, *args):
        wrapped = jax.tree.map(Primal, args, nzs_in)
        return self.fwd(*wrapped)

    def vjp_bwd_retval(self, residuals, output_cotangents):
        cotangents = self.bwd(residuals, output_cotangents)
        flat = broadcast_prefix(tuple(cotangents), self.in_avals, is_leaf=lambda x: x is None)
        flat = [
            ad_util.Zero(aval.to_ct_aval()) if c is None else c
            for c, aval in zip(flat, self.in_avals_flat)
        ]
        return jax.tree.unflatten(self.in_tree, flat)

    def jvp(self, primals, tangents):
        if self.jvp_rule is not None:
            # The outputs come from the operation itself (as a custom_vjp's fwd calls f), so an
            # outer derivative of them uses the user's rules too.
            return self(*primals), self.jvp_rule(primals, tangents, self.out_aval)
        # Reverse mode through jax.checkpoint arrives here: the tangent map is a linear op whose
        # transpose is bwd. Evaluating it (true forward mode) is JAX's own error.
        nonzero = _nonzero_flags(tangents)
        nzs = jax.tree.unflatten(self.in_tree, nonzero)
        outputs, residuals = self.vjp_fwd(nzs, *primals)
        flat_tangents = jax.tree.leaves(tangents, is_leaf=ct.is_symbolic_zero)
        out_tangents = fake_linear_op(self, nonzero, residuals, *flat_tangents)
        return outputs, jax.tree.unflatten(self.out_tree, out_tangents)

    def lin(self, nzs_in, *primals):
        if self.jvp_rule is None:
            raise ForwardModeError(self.no_jvp)
        return self(*primals), primals

    def linearized(self, primals, *tangents):
        return self.jvp_rule(primals, tangents, self.out_aval)

    def batch(self, axis_data, args, dims):
        out_dim = self.batch_dim_rule(axis_data, dims)
        return _VmapOf(self, axis_data, dims, out_dim)(*args), out_dim

    def batch_dim_rule(self, axis_data, in_dims):
        in_dims_flat = self.in_tree.flatten_up_to(in_dims)
        _, out_dims = batch_jaxpr2(self._traced.jaxpr, axis_data, tuple(in_dims_flat))
        return jax.tree.unflatten(self.out_tree, out_dims)


class _VmapOf(VmapOf):  # type: ignore[misc,valid-type]
    """JAX's ``VmapOf`` (a batched ``VJPHiPrimitive``), batched again (``jax.vmap`` of
    ``jax.hessian``: nested vmaps) with unbatched outputs: JAX's own rule compares ``None``
    with an axis there (jax 0.10.2); an unbatched axis stays unbatched here."""

    def batch(self, axis_data, args, dims):
        out_dim = self.batch_dim_rule(axis_data, dims)
        return _VmapOf(self, axis_data, dims, out_dim)(*args), out_dim

    def batch_dim_rule(self, axis_data, in_dims):
        def fix(d, d_):
            return d if (d is None or d_ is None) else d - (d_ < d)

        def unfix(d, d_):
            return d if (d is None or d_ is None) else d + (d_ < d)

        is_none = lambda x: x is None  # noqa: E731
        in_dims_ = jax.tree.map(fix, in_dims, self.in_dims, is_leaf=is_none)
        out_dim = self.prim.batch_dim_rule(axis_data, in_dims_)
        return jax.tree.map(unfix, out_dim, self.out_dim, is_leaf=is_none)


def once_differentiable_guard(values: list, depends_on: list, message: str) -> list:
    """``values``, unchanged; differentiating them through ``depends_on`` raises.

    ``values`` were computed from ``depends_on`` behind ``jax.lax.stop_gradient`` (so the code
    that computed them need not be differentiable). A derivative that reaches them — the
    cotangent of a gradient in reverse mode, a tangent in forward mode — means the computation
    is being differentiated once more: ``HigherOrderError(message)``. Where no derivative flows
    (first order, or an unused second-order result), nothing is raised.

    Args:
      values: arrays (the gradients a once-differentiable backward returned).
      depends_on: arrays they were computed from (cotangents and residuals).
      message: the error message.
    """
    if not values:
        return values
    _require_primitives("once_differentiable")
    args = (list(values), list(depends_on))
    in_avals = jax.tree.map(jax.typeof, args)
    return _Guard(in_avals, message)(*args)


class _Guard(VJPHiPrimitive):  # type: ignore[misc,valid-type]
    def __init__(self, in_avals, message):
        self.in_avals = tuple(in_avals)
        self.out_aval = in_avals[0]
        self.params = dict(message=message)
        super().__init__()

    def expand(self, values, depends_on):
        del depends_on
        return values

    def vjp_fwd(self, nzs_in, values, depends_on):
        del nzs_in, depends_on
        return values, None

    def vjp_bwd_retval(self, residuals, cotangents):
        if any(_nonzero_flags(cotangents)):
            raise HigherOrderError(self.message)
        return jax.tree.map(lambda aval: ad_util.Zero(aval.to_ct_aval()), self.in_avals)

    def jvp(self, primals, tangents):
        if any(_nonzero_flags(tangents)):
            raise HigherOrderError(self.message)
        values, _ = primals
        return values, jax.tree.map(lambda aval: ad_util.Zero(aval.to_tangent_aval()), values)

    def batch_dim_rule(self, axis_data, in_dims):
        del axis_data
        return in_dims[0]


# -- reverse mode only --------------------------------------------------------------------------


def reverse_only(tree, message: str):
    """``tree``, unchanged; differentiating it in forward mode raises ``ForwardModeError``.

    Only traced floating-point leaves can carry a tangent, so only they pass through the guard
    (an eager call outside any transformation binds nothing).
    """

    param = _Message(message)

    def guard(leaf):
        if isinstance(leaf, jax.core.Tracer) and jnp.issubdtype(leaf.dtype, jnp.inexact):
            return _reverse_only_p.bind(leaf, message=param)
        return leaf

    return jax.tree.map(guard, tree)


@dataclasses.dataclass(frozen=True)
class _Message:
    """The error message as a primitive parameter (hashable); printed jaxprs show its start."""

    text: str

    def __str__(self):
        return self.text[:40] + "..." if len(self.text) > 40 else self.text

    __repr__ = __str__


def _identity_lowering(ctx, x, **params):
    del ctx, params
    return [x]


def _raise_forward_mode(*args, message: _Message, **kwargs):
    del args, kwargs
    raise ForwardModeError(message.text)


def _batch_identity(primitive):
    def rule(args, dims, **params):
        return primitive.bind(*args, **params), dims[0]

    return rule


def _reverse_only_jvp(primals, tangents, *, message: _Message):
    (x,), (t,) = primals, tangents
    # The primal passes unguarded: an outer forward mode over this derivative (jax.hessian as
    # jacfwd of jacrev) differentiates the operation's fwd and bwd rules, as JAX's custom_vjp
    # allows; only this level's tangent, which would enter the operation, is guarded.
    y = x
    if type(t) is ad.Zero:
        return y, t
    return y, _forward_tangent_p.bind(t, message=message)


_reverse_only_p = jax_core.Primitive("difffn_reverse_only")
_reverse_only_p.def_impl(lambda x, *, message: x)
_reverse_only_p.def_abstract_eval(lambda aval, *, message: aval)
mlir.register_lowering(_reverse_only_p, _identity_lowering)
batching.primitive_batchers[_reverse_only_p] = _batch_identity(_reverse_only_p)
ad.primitive_jvps[_reverse_only_p] = _reverse_only_jvp

# The tangent map: linear, transposed to the identity in reverse mode, never evaluated there.
_forward_tangent_p = jax_core.Primitive("difffn_forward_tangent")
_forward_tangent_p.def_impl(_raise_forward_mode)
_forward_tangent_p.def_abstract_eval(lambda aval, *, message: aval)
mlir.register_lowering(_forward_tangent_p, _raise_forward_mode)
# Batching a tangent is jax.jacfwd (vmap of jvp): under jax.jit that is found at trace time, where
# JAX's custom_vjp would raise its TypeError when batching its own tangent map.
batching.primitive_batchers[_forward_tangent_p] = _raise_forward_mode
ad.deflinear2(_forward_tangent_p, lambda ct, x, *, message: [ct])
# Under JAX_CUSTOM_VJP3=1, jax.jit first rewrites "high" primitives to plain JAX, in program
# order, and JAX's custom_vjp tangent raises its TypeError there, before any lowering: the
# tangent map is "high" in that mode, so its ForwardModeError comes first.
_forward_tangent_p.is_high = lambda *avals, **params: bool(
    # A flag that JAX's Config sets at run time; its class does not declare it.
    jax.config.jax_custom_vjp3  # pyright: ignore[reportAttributeAccessIssue]
)
_forward_tangent_p.to_lojax = _raise_forward_mode

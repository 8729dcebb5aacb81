"""Forward over reverse: outputs whose tangent map is autodiff when run and ``backward`` when
transposed.

A ``jax.custom_vjp`` fwd computes its outputs with plain JAX code, so an outer derivative of
them — ``jax.hessian`` is forward mode over reverse mode — differentiates that code. difffn's
fwd computes them with the operation itself instead (so that an outer *reverse* derivative uses
``backward`` again), and must give them a forward-mode rule as well. Whether an outer
derivative will run the tangent map (forward mode) or transpose it (reverse mode, also when it
linearizes through ``jax.checkpoint`` by a forward-mode trace) is often unknown when fwd runs:
``jax.jit`` or ``jax.checkpoint`` *inside* the derivative (``jax.hessian(jax.jit(loss))``)
traces fwd to a program first, and the outer transformation meets that program later.

So `forward_over_reverse` wraps the operation in a ``jax.custom_jvp`` whose tangent map is one
linear primitive, ``difffn_tangent_map``, that is both: *evaluated* (forward mode: its
implementation, lowering and batching) it is the given ``jvp`` rule (autodiff of ``forward``);
*transposed* (reverse mode) it is the user's ``bwd``. Without an outer derivative the wrapper
is the operation itself, a ``custom_jvp`` call that ``jax.jit`` compiles to the same program.

Under ``jax.vmap`` the tangent map stays one primitive, with the batching recorded as a stack
of (size, operand axes), so a batched tangent map still transposes to ``bwd`` (batched).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.extend.core as jax_core
import jax.numpy as jnp
from jax.interpreters import ad, batching, mlir

from .._core import Error, ForwardModeError
from . import _cotangents as ct
from ._primitive import Primal

try:
    from jax._src.interpreters import partial_eval as pe
    from jax._src.tree_util import broadcast_prefix
except ImportError:  # pragma: no cover - depends on the JAX version
    pe = broadcast_prefix = None

AVAILABLE = broadcast_prefix is not None
"""Whether this JAX has the internals used here; without them ``twin_custom_vjp`` builds no
forward-over-reverse twin (forward over reverse is then a ``ForwardModeError``)."""


def forward_over_reverse(
    fun: Callable[..., Any],
    fwd: Callable[..., Any],
    bwd: Callable[..., Any],
    jvp: Callable[..., Any],
    *,
    name: str,
) -> Callable[..., Any]:
    """``fun(*args)``, whose outer derivatives use ``jvp`` in forward mode and ``bwd`` in reverse.

    Args:
      fun: the operation (positional pytree arguments).
      fwd: ``fwd(*args) -> (outputs, residuals)``, every array leaf a ``Primal`` (as for
        ``_primitive.custom_vjp``).
      bwd: ``bwd(residuals, output_cotangents)``: one cotangent (pytree, ``None`` for zero) per
        argument.
      jvp: ``jvp(primals, tangents, out_avals) -> output tangents`` (tangents may be symbolic
        zeros; ``out_avals`` is ``fun``'s output structure of avals).
      name: the operation's name in printed programs.
    """

    def operation(*args):
        return fun(*args)

    operation.__name__ = operation.__qualname__ = name
    wrapped = jax.custom_jvp(operation)

    def rule(primals, tangents):
        in_leaves, in_tree = jax.tree.flatten(primals)
        t_leaves = in_tree.flatten_up_to(tangents)
        nonzero = tuple(
            not ct.is_symbolic_zero(t) and _inexact(x) for x, t in zip(in_leaves, t_leaves)
        )
        outputs, residuals = fwd(
            *jax.tree.unflatten(in_tree, [Primal(x, nz) for x, nz in zip(in_leaves, nonzero)])
        )
        out_leaves, out_tree = jax.tree.flatten(outputs)
        res_leaves, res_tree = jax.tree.flatten(residuals)
        out_avals = tuple(jax.typeof(y) for y in out_leaves)
        carried = tuple(_inexact(y) for y in out_leaves)
        zeros = [jax.custom_derivatives.SymbolicZero(a.to_tangent_aval()) for a in out_avals]
        if not any(nonzero) or not any(carried):
            return outputs, jax.tree.unflatten(out_tree, zeros)
        spec = _Rule(
            jvp=jvp,
            bwd=bwd,
            in_tree=in_tree,
            in_avals=tuple(jax.typeof(x) for x in in_leaves),
            out_tree=out_tree,
            out_avals=out_avals,
            res_tree=res_tree,
            nonzero=nonzero,
            carried=carried,
        )
        given = [t for t, nz in zip(t_leaves, nonzero) if nz]
        out = iter(_tangent_map_p.bind(*in_leaves, *res_leaves, *given, rule=spec, batched=()))
        flat = [next(out) if c else z for c, z in zip(carried, zeros)]
        return outputs, jax.tree.unflatten(out_tree, flat)

    wrapped.defjvp(rule, symbolic_zeros=True)
    return wrapped


def autodiff_jvp(fun: Callable[..., Any], *, who: str, fix: str) -> Callable[..., Any]:
    """A forward-mode rule for `forward_over_reverse` (through ``twin_custom_vjp``'s
    ``inner_jvp``): autodiff of ``fun`` in forward mode, as JAX differentiates the body of a
    ``jax.custom_vjp`` fwd. What autodiff cannot differentiate is a ``ForwardModeError``
    naming ``who``, with ``fix``.

    Returns:
      ``jvp(inner, primals, tangents, out_avals) -> output tangents``, the tangents of every
      output leaf of ``fun(*primals)`` (``float0`` for integer ones).
    """

    def jvp(inner, primals, tangents, out_avals):
        del inner, out_avals
        leaves, tree = jax.tree.flatten(primals)
        t_leaves = tree.flatten_up_to(tangents)
        chosen = [
            i
            for i, (x, t) in enumerate(zip(leaves, t_leaves))
            if _inexact(x) and not ct.is_symbolic_zero(t)
        ]

        def of(*values):
            full = list(leaves)
            for i, v in zip(chosen, values):
                full[i] = v
            return fun(*jax.tree.unflatten(tree, full))

        try:
            return jax.jvp(of, [leaves[i] for i in chosen], [t_leaves[i] for i in chosen])[1]
        except Error:
            raise
        except Exception as error:  # JAX's own error about the body
            raise ForwardModeError(
                f"{who} could not be differentiated in forward mode, which forward over reverse "
                f"(jax.hessian, jax.jvp of a gradient) needs: {type(error).__name__}: {error}. "
                f"Fix: {fix}"
            ) from error

    return jvp


def _inexact(x) -> bool:
    return bool(jnp.issubdtype(jax.typeof(x).dtype, jnp.inexact))


@dataclasses.dataclass(frozen=True, eq=False)
class _Rule:
    """One tangent map's rules and structures (a primitive parameter, hashed by identity)."""

    jvp: Callable[..., Any]
    bwd: Callable[..., Any]
    in_tree: Any
    in_avals: tuple
    out_tree: Any
    out_avals: tuple
    res_tree: Any
    nonzero: tuple[bool, ...]
    carried: tuple[bool, ...]

    @property
    def n_known(self) -> int:
        """The operands that are not tangents: the primals and the residuals."""
        return len(self.in_avals) + self.res_tree.num_leaves

    def evaluate(self, operands) -> list:
        """Forward mode: the carried output tangents by ``jvp``."""
        n_p = len(self.in_avals)
        primals = jax.tree.unflatten(self.in_tree, list(operands[:n_p]))
        given = iter(operands[self.n_known :])
        tangents = [
            next(given) if nz else ad.Zero(a.to_tangent_aval())
            for a, nz in zip(self.in_avals, self.nonzero)
        ]
        out_avals = jax.tree.unflatten(self.out_tree, list(self.out_avals))
        result = self.jvp(primals, jax.tree.unflatten(self.in_tree, tangents), out_avals)
        flat = jax.tree.leaves(result, is_leaf=ct.is_symbolic_zero)
        return [
            jnp.zeros(a.shape, a.dtype) if ct.is_symbolic_zero(t) else t
            for t, a, c in zip(flat, self.out_avals, self.carried)
            if c
        ]

    def transpose(self, known, cts) -> list:
        """Reverse mode: the cotangents of the tangent operands by ``bwd`` (zeros included)."""
        residuals = jax.tree.unflatten(self.res_tree, list(known[len(self.in_avals) :]))
        cts = iter(cts)
        flat = [
            next(cts) if c else ad.Zero(a.to_ct_aval())
            for a, c in zip(self.out_avals, self.carried)
        ]
        grads = self.bwd(residuals, jax.tree.unflatten(self.out_tree, flat))
        avals = jax.tree.unflatten(self.in_tree, list(self.in_avals))
        assert broadcast_prefix is not None  # AVAILABLE
        grads = broadcast_prefix(tuple(grads), tuple(avals), is_leaf=lambda x: x is None)
        return [
            jnp.zeros(a.shape, a.dtype) if g is None or ct.is_symbolic_zero(g) else g
            for g, a, nz in zip(grads, self.in_avals, self.nonzero)
            if nz
        ]


# -- the primitive: its rules take the batching stack into account ----------------------------


def _evaluate(rule: _Rule, batched: tuple, operands) -> list:
    if not batched:
        return rule.evaluate(operands)
    size, dims = batched[-1]
    inner = lambda *a: _evaluate(rule, batched[:-1], a)  # noqa: E731
    return jax.vmap(inner, in_axes=dims, axis_size=size)(*operands)


def _transpose(rule: _Rule, batched: tuple, known, cts) -> list:
    if not batched:
        return rule.transpose(known, cts)
    size, dims = batched[-1]
    known_dims, tangent_dims = list(dims[: rule.n_known]), dims[rule.n_known :]
    inner = lambda k, c: _transpose(rule, batched[:-1], k, c)  # noqa: E731
    grads = jax.vmap(inner, in_axes=(known_dims, 0), axis_size=size)(list(known), list(cts))
    # A tangent operand that was not batched gets the sum of its batch of cotangents.
    return [
        jnp.sum(g, 0) if d is None else jnp.moveaxis(g, 0, d) for g, d in zip(grads, tangent_dims)
    ]


def _out_avals(rule: _Rule, batched: tuple) -> list:
    sizes = tuple(size for size, _ in reversed(batched))
    return [
        a.to_tangent_aval().update(shape=sizes + tuple(a.shape))
        for a, c in zip(rule.out_avals, rule.carried)
        if c
    ]


def _impl(*operands, rule, batched):
    return _evaluate(rule, batched, operands)


def _abstract_eval(*avals, rule, batched):
    del avals
    return _out_avals(rule, batched)


def _transpose_rule(cts, *operands, rule, batched):
    known = operands[: rule.n_known]
    cts = [
        jnp.zeros(a.shape, a.dtype) if type(c) is ad.Zero else c
        for c, a in zip(cts, _out_avals(rule, batched))
    ]
    return [None] * rule.n_known + _transpose(rule, batched, known, cts)


def _staging_rule(trace, source_info, *tracers, rule, batched):
    """Staged into a jaxpr like any primitive, but without JAX's cache of abstract evaluations,
    which keys on the parameters and would keep ``rule`` (and the user's class it reaches)
    alive after the class is dropped."""
    params = dict(rule=rule, batched=batched)
    out_avals = _out_avals(rule, batched)
    eqn, out = trace.make_eqn(tracers, out_avals, _tangent_map_p, params, frozenset(), source_info)
    trace.frame.add_eqn(eqn)
    return out


def _batch_rule(args, dims, *, rule, batched):
    dims = tuple(dims)  # None: not batched
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    out = _tangent_map_p.bind(*args, rule=rule, batched=(*batched, (size, dims)))
    return out, [0] * len(out)


def _jvp_rule(primals, tangents, *, rule, batched):
    """A derivative of the tangent map itself (third order and above): autodiff of it."""
    tangents = tuple(ad.instantiate_zeros(t) for t in tangents)
    return jax.jvp(lambda *a: _evaluate(rule, batched, a), tuple(primals), tangents)


_tangent_map_p = jax_core.Primitive("difffn_tangent_map")
_tangent_map_p.multiple_results = True
_tangent_map_p.def_impl(_impl)
_tangent_map_p.def_abstract_eval(_abstract_eval)
mlir.register_lowering(_tangent_map_p, mlir.lower_fun(_impl, multiple_results=True))
batching.primitive_batchers[_tangent_map_p] = _batch_rule
ad.primitive_jvps[_tangent_map_p] = _jvp_rule
ad.primitive_transposes[_tangent_map_p] = _transpose_rule
if pe is not None:
    pe.custom_staging_rules[_tangent_map_p] = _staging_rule

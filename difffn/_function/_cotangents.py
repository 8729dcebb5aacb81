"""What a user backward hands back, made safe: shared by functions and layers.

``jax.custom_vjp`` accepts a gradient of the wrong shape or dtype without a word, and inside
``shard_map`` it rejects the (correct) cotangent of a replicated input because that cotangent
varies over the mesh axes. Everything here runs at trace time, on abstract values, so the checks
cost nothing when the compiled code runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from .._core import BackwardError, ForwardError, is_array

try:  # the internal zero type that JAX's newer custom_vjp hands to rules
    from jax._src.ad_util import Zero as _InternalZero
except ImportError:  # pragma: no cover - depends on the JAX version
    _InternalZero = SymbolicZero


@jax.tree_util.register_static
@dataclass(frozen=True)
class Static:
    """A hashable value carried through JAX as pytree structure, never as an array leaf."""

    value: Any


@dataclass(frozen=True)
class Spec:
    """Shape, dtype and mesh-axis variance of a value, recorded at trace time."""

    shape: tuple[int, ...]
    dtype: Any  # a numpy dtype, or JAX's extended dtype for typed PRNG keys
    vma: frozenset[str]

    @classmethod
    def of(cls, x) -> Spec:
        aval = jax.typeof(x)
        return cls(tuple(aval.shape), aval.dtype, varying_axes(aval))

    @property
    def differentiable(self) -> bool:
        return bool(jnp.issubdtype(self.dtype, jnp.inexact))

    def describe(self) -> str:
        return f"shape {self.shape} and dtype {self.dtype}"


def varying_axes(value_or_aval) -> frozenset[str]:
    """The manual mesh axes (``shard_map``) over which a value varies; empty outside."""
    aval = (
        value_or_aval
        if isinstance(value_or_aval, jax.core.AbstractValue)
        else jax.typeof(value_or_aval)
    )
    vma = getattr(aval, "vma", None)
    if vma is None:
        vma = getattr(getattr(aval, "mat", None), "varying", frozenset())
    return frozenset(vma)


_ARRAY = object()  # marks a memory leaf that travels as a value, not as static structure


def split_memory(memory, who: str) -> tuple[Static, tuple]:
    """A memory value as (static description, array leaves): the arrays become residuals, and
    any other leaf (a Python ``int`` axis, a string) travels as static structure, unchanged.

    Raises:
      ForwardError: a leaf is neither an array nor hashable.
    """
    leaves, tree = jax.tree_util.tree_flatten_with_path(memory)
    static, arrays = [], []
    for path, leaf in leaves:
        if is_array(leaf):
            static.append(_ARRAY)
            arrays.append(jnp.asarray(leaf))
            continue
        try:
            hash(leaf)
        except TypeError:
            raise ForwardError(
                f"{who} returned a memory value{path_text(path)} that is an unhashable "
                f"{type(leaf).__name__}; memory is a pytree of arrays and hashable Python values "
                "(int, float, str, ...). Fix: convert it to an array or a tuple."
            ) from None
        static.append(leaf)
    return Static((tree, tuple(static))), tuple(arrays)


def join_memory(static: Static, arrays) -> Any:
    """The memory value `split_memory` took apart."""
    tree, leaves = static.value
    it = iter(arrays)
    return jax.tree.unflatten(tree, [next(it) if v is _ARRAY else v for v in leaves])


def is_symbolic_zero(ct) -> bool:
    """True for JAX's symbolic zero cotangents (public and internal kinds)."""
    return isinstance(ct, (SymbolicZero, _InternalZero))


def instantiate(ct, spec: Spec):
    """A real array for a cotangent that may be a symbolic zero."""
    if is_symbolic_zero(ct):
        return jnp.zeros(spec.shape, spec.dtype)
    return ct


def sum_to_variance(ct, spec: Spec):
    """Sum a cotangent over the mesh axes its primal does not vary over.

    Inside ``shard_map``, a replicated input used with sharded data gets a cotangent that varies
    per device; its true cotangent is the sum over those devices (the transpose of JAX's implicit
    ``pvary``). A user backward should never have to know this.
    """
    extra = varying_axes(ct) - spec.vma
    if extra:
        ct = jax.lax.psum(ct, tuple(sorted(extra)))
    return ct


def check_gradient(
    grad, spec: Spec, *, who: str, what: str, required: bool, none_means_zero: bool = False
):
    """Validate one gradient a user backward returned; return it ready for JAX (or ``None``).

    Args:
      grad: what the user returned (an array, a Python scalar, ``None``, or something else).
      spec: the primal value's shape and dtype.
      who: ``"SReLUFunction.backward"``, for messages.
      what: ``"the gradient of input 'tl' (2 of 5)"``, for messages.
      required: whether JAX needs this gradient (the compute_gradients flag).
      none_means_zero: ``None`` for a required gradient means zeros (JAX's convention) instead
        of being an error.
    """
    if not spec.differentiable:
        if grad is None or _is_float0(grad):
            return None
        raise BackwardError(
            f"{who} returned {what}, but that value has non-differentiable dtype {spec.dtype} "
            "(integer, boolean or PRNG key); expected None. Fix: return None for that position."
        )
    if grad is None:
        if required and not none_means_zero:
            raise BackwardError(
                f"{who} returned None for {what}, but compute_gradients is True for it: a JAX "
                "transformation differentiates this value. Expected an array with "
                f"{spec.describe()}. Fix: return its gradient (zeros if it truly has none)."
            )
        return None
    if isinstance(grad, (int, float, complex)) and not isinstance(grad, bool):
        grad = np.asarray(grad, spec.dtype)  # a Python scalar takes the value's dtype
    if not is_array(grad):
        raise BackwardError(
            f"{who} returned a {type(grad).__name__} as {what}; expected an array with "
            f"{spec.describe()}. Fix: return a jax array (or None where not needed)."
        )
    got = Spec.of(grad)
    if got.shape != spec.shape or got.dtype != spec.dtype:
        if got.shape != spec.shape:
            fix = (
                "Fix: reduce over the axes that were broadcast in forward "
                "(e.g. jnp.sum(..., axis=..., keepdims=True)) or reshape, so the gradient has "
                "the shape of the value it belongs to."
            )
        else:
            fix = "Fix: cast it, e.g. grad.astype(x.dtype), or keep the computation in that dtype."
        raise BackwardError(
            f"{who} returned {what} with {got.describe()}; expected "
            f"{spec.describe()} (the gradient must match the value it belongs to). {fix}"
        )
    if not required:
        return None  # checked, but JAX discards it anyway; keeping it would only cost memory
    return sum_to_variance(jnp.asarray(grad), spec)


def _is_float0(value) -> bool:
    return getattr(value, "dtype", None) == jax.dtypes.float0


def align_leaves(grad, template, *, who: str, what: str) -> list:
    """The leaves of ``grad`` lined up with ``template``'s; ``None`` may stand for any subtree.

    ``grad`` must have ``template``'s pytree structure, except that ``None`` may replace a leaf
    or a whole subtree (no gradient there), as in JAX's ``custom_vjp``.

    Raises:
      BackwardError: the structures differ (the message shows both).
    """
    from .._core import FormattedArray  # a leaf here, never a node to descend into

    def stop(v):
        return v is None or isinstance(v, FormattedArray)

    def expand(g, sub):
        count = jax.tree.structure(sub).num_leaves
        if g is None:
            return [None] * count
        if not jax.tree_util.treedef_is_leaf(jax.tree.structure(sub)) or count != 1:
            raise ValueError
        return [g.data if isinstance(g, FormattedArray) else g]

    try:
        pieces = jax.tree.map(lambda g, sub: _Piece(expand(g, sub)), grad, template, is_leaf=stop)
    except (ValueError, TypeError):
        expected = structure_text(template)
        got = structure_text(grad, is_leaf=stop)
        raise BackwardError(
            f"{who} returned {what} with structure {got}; expected {expected} (the structure "
            "of the value it belongs to; None may stand for a leaf or a whole subtree without "
            "gradient). Fix: return the gradient as the same kind of container, with the same "
            "keys or fields."
        ) from None
    return [leaf for piece in jax.tree.leaves(pieces, is_leaf=_is_piece) for leaf in piece.leaves]


class _Piece:
    __slots__ = ("leaves",)

    def __init__(self, leaves):
        self.leaves = leaves


def _is_piece(v) -> bool:
    return isinstance(v, _Piece)


def structure_text(tree, *, is_leaf=None) -> str:
    """``Params(w=*, b=*)``, ``{'b': *, 'w': *}``: a pytree's structure, for messages."""

    def render(v) -> str:
        if v is None:
            return "None"
        if is_leaf is not None and is_leaf(v):
            return "*"
        if isinstance(v, tuple) and hasattr(v, "_fields"):  # a namedtuple
            fields = ", ".join(f"{f}={render(getattr(v, f))}" for f in cast(Any, v)._fields)
            return f"{type(v).__name__}({fields})"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k!r}: {render(x)}" for k, x in v.items()) + "}"
        if isinstance(v, (tuple, list)):
            inner = ", ".join(render(x) for x in v) + ("," if len(v) == 1 else "")
            return f"({inner})" if isinstance(v, tuple) else f"[{inner}]"
        children, node = jax.tree_util.tree_flatten(v, is_leaf=lambda x: x is not v)
        if jax.tree_util.treedef_is_leaf(node):
            return "*"
        return f"{type(v).__name__}(" + ", ".join(render(c) for c in children) + ")"

    return render(tree)


def path_text(path) -> str:
    """`` at ['w']`` for a leaf inside a pytree; empty for a value that is itself a leaf."""
    return f" at {jax.tree_util.keystr(path)}" if path else ""


def normalize_returns(result, count: int, *, who: str, names: Sequence[str]) -> tuple:
    """Turn what a user backward returned into a tuple of ``count`` entries, or raise."""
    if count == 1 and not isinstance(result, (tuple, list)):
        return (result,)
    if not isinstance(result, (tuple, list)):
        raise BackwardError(
            f"{who} returned a single {type(result).__name__}; expected a tuple of {count} "
            f"gradients, one per {_listing(names)}, in that order (None where not needed)."
        )
    if len(result) != count:
        raise BackwardError(
            f"{who} returned {len(result)} gradients; expected {count}, one per "
            f"{_listing(names)}, in that order. Fix: return None for a gradient that is not "
            "needed rather than leaving it out."
        )
    return tuple(result)


def _listing(names: Sequence[str]) -> str:
    return "value (" + ", ".join(names) + ")"

"""Running the user's own code inside a trace: what JAX cannot trace is named, with the fix.

Networks compile layers, ``jax.jit`` traces a ``DifferentiableFunction``'s ``forward`` and
``backward``, and ``trainnet`` compiles losses and metrics. User code that JAX cannot trace fails
there with JAX's own error, which names JAX's internals (``_outer_primal``, ``step``) instead of
the user's function. `call` runs one user callable and turns the two such failures into
``df.Error``\\ s that name the user's function, its line and the fix:

* Python control flow or conversions on traced values (``if x > 0``, ``float(x)``): a
  [`AccelerationError`][difffn.AccelerationError] (JAX's error is not chained: its traceback shows
  only JAX's
  frames, and the user's line is named in the message);
* a ``jax.numpy`` function given a ``df.FormattedArray`` (only the elementwise operators take
  one, see ``_formatted_array.py``): a [`FormatError`][difffn.FormatError] that says to use
  ``df.stripdims``. Such a ``TypeError`` is told from the user's other ``TypeError``\\ s without
  reading JAX's message: the function is run again, abstractly (``jax.eval_shape``), on the plain
  arrays, and only if that works were the formats the cause.

Every other exception passes through unchanged: it is the user's own bug, with their traceback.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import jax

from ._describe import raised_at, short
from ._errors import AccelerationError, Error, FormatError
from ._format import FormattedArray
from ._formatted_array import PlainArrayNeeded

CONCRETIZATION_ERRORS = (
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerArrayConversionError,
    jax.errors.TracerIntegerConversionError,
    jax.errors.NonConcreteBooleanIndexError,
)

TRACEABLE_FIX = "express the choice with jnp.where(...) or jax.lax.cond / jax.lax.while_loop"


def call(
    fn: Callable,
    *args,
    what: str,
    fix: str = TRACEABLE_FIX,
    call_fix: str | None = None,
    error: type[Error] = AccelerationError,
    **kwargs,
) -> Any:
    """``fn(*args, **kwargs)``, with tracing failures turned into named errors.

    Args:
      fn: the user's callable.
      *args: its positional arguments (``FormattedArray``\\ s among them are what a
        ``FormatError`` is about).
      what: how messages name it: ``"the loss 'my_loss'"``, ``"MyFunction.forward"``.
      fix: the fixes for Python control flow on traced values, as a sentence fragment.
      call_fix: when given, the arguments are first bound to ``fn``'s signature, and a mismatch
        is an ``error`` whose message ends with this fix (how ``fn`` is called).
      error: the class of the arity error.
      **kwargs: its keyword arguments.

    Raises:
      AccelerationError: ``fn`` uses Python control flow on traced values.
      FormatError: ``fn`` passed a ``FormattedArray`` to a function that takes plain arrays.
    """
    if call_fix is not None:
        _check_arity(fn, args, kwargs, what, call_fix, error)
    try:
        return fn(*args, **kwargs)
    except CONCRETIZATION_ERRORS as failure:
        raise control_flow_error(what, failure, fix) from None
    except TypeError as failure:
        if not isinstance(failure, PlainArrayNeeded) and (
            isinstance(failure, Error) or not _formats_were_the_cause(fn, args, kwargs)
        ):
            raise
        where = raised_at(failure)
        if isinstance(failure, PlainArrayNeeded):  # it says what to do; say where
            at = f" (at {where})" if where else ""
            raise FormatError(f"{what}{at}: {failure}") from None
        raise FormatError(
            f"{what} passed a df.FormattedArray to a function that takes plain arrays "
            f"({type(failure).__name__}: {_first_line(failure)})"
            + (f" (at {where})" if where else "")
            + ". Only the elementwise operators (+, -, *, /, **, comparisons) and indexing keep "
            "a format; jax.numpy and jax.nn functions take the plain array. Fix: use "
            "df.stripdims(Y) there (e.g. jnp.log(df.stripdims(Y))), and df.dlarray(y, fmt) to "
            "label a result again."
        ) from None


def control_flow_error(what: str, failure: BaseException, fix: str) -> AccelerationError:
    """The error for Python control flow or conversions on traced values in ``what``."""
    where = raised_at(failure)
    return AccelerationError(
        f"{what} uses Python control flow or a Python conversion (if/while/bool/int/float) on "
        f"array values, which cannot be traced and compiled. Fixes: {fix}.\nJAX said: "
        f"{_first_line(failure)}" + (f" (at {where})" if where else "")
    )


def _first_line(failure: BaseException) -> str:
    text = str(failure)
    return text.splitlines()[0] if text else type(failure).__name__


def _check_arity(fn, args, kwargs, what, call_fix, error) -> None:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins and some callables have none: nothing to check
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError as failure:
        given = ", ".join(short(a) for a in args)
        raise error(
            f"{what} cannot be called with the {len(args)} argument(s) ({given}): {failure}. "
            f"Fix: {call_fix}"
        ) from None


def _is_formatted(value) -> bool:
    return isinstance(value, FormattedArray)


def _formats_were_the_cause(fn, args, kwargs) -> bool:
    """Whether ``fn`` got a ``FormattedArray`` and runs on the plain arrays instead."""
    leaves = jax.tree.leaves((args, kwargs), is_leaf=_is_formatted)
    if not any(_is_formatted(leaf) for leaf in leaves):
        return False
    plain_args, plain_kwargs = jax.tree.map(
        lambda v: v.data if _is_formatted(v) else v, (args, kwargs), is_leaf=_is_formatted
    )
    arrays, tree = jax.tree.flatten((plain_args, plain_kwargs))
    positions = [i for i, leaf in enumerate(arrays) if isinstance(leaf, jax.Array)]

    def plain(*values):
        filled = list(arrays)
        for i, value in zip(positions, values):
            filled[i] = value
        a, k = jax.tree.unflatten(tree, filled)
        return fn(*a, **k)

    try:
        jax.eval_shape(plain, *(arrays[i] for i in positions))
    except Exception:  # noqa: BLE001 - it fails on plain arrays too: the formats are not the cause
        return False
    return True

"""What ``check_layer`` and ``check_function`` share: data, words, the gradient verdict's outcome.

The two checkers are siblings over this module (neither imports the other):

* `as_key` and `Data`: the caller's key, and deterministic test data drawn from it;
* the value words: `is_array`, `is_floating`, `shape_text`,
  `describe_value`, `index_text`; `cast_floating` for dtype tests;
* `positional_parameters`: the one reading of a user method's signature;
* `compare` and `compare_trees`: values against expected values, with the place of the
  largest difference;
* `CheckModel`: the base of the checkers' numerical models (the gradient sources);
  `gradients_or_without_autodiff`;
* `gradient_outcome` (with the swapped-order hint) and `record_gradient_tests`: a
  verdict of ``_numerical`` turned into a test result with the words a user needs;
* `declared_surrogates`: a class's ``surrogate_gradients``, validated;
* `narrowest_float` and `reference_outcome`: a forward that computes in a narrower
  dtype inside (mixed precision) is checked against JAX autodiff at that dtype's tolerance,
  because float64 finite differences cannot resolve it.
"""

from __future__ import annotations

import dataclasses
import inspect
import time
from collections.abc import Mapping
from typing import Any

import jax
import jax.extend.core as jax_core
import jax.numpy as jnp
import numpy as np

from .._core import CheckError, FormattedArray, type_name
from . import _numerical as numerical
from ._check_report import Recorder, describe_exception, failed, incomplete, passed, skipped

# -- the key and the data -------------------------------------------------------------------------


def as_key(key):
    """A typed ``jax.random`` key from ``None`` (key 0), an int seed, or a key (typed or raw)."""
    if key is None:
        return jax.random.key(0)
    if isinstance(key, int) and not isinstance(key, bool):
        return jax.random.key(key)
    if isinstance(key, jax.Array) and jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        return key
    if isinstance(key, jax.Array) and key.dtype == jnp.uint32 and key.shape == (2,):
        return jax.random.wrap_key_data(key)
    raise CheckError(
        f"key is a {type_name(key)}; expected a jax.random key or an int seed. Fix: "
        "key=jax.random.key(0)."
    )


class Data:
    """Deterministic test data drawn with NumPy from a key: nothing to compile.

    Each draw has a ``tag``; the same key and tag always give the same values.
    """

    def __init__(self, key):
        self.seed = [int(v) for v in np.asarray(jax.random.key_data(key)).ravel()]

    def seq(self, tag: int) -> list[int]:
        return [*self.seed, tag]

    def rng(self, tag: int) -> np.random.Generator:
        return np.random.default_rng(self.seq(tag))

    def normal(self, tag: int, shape, dtype) -> jax.Array:
        values = self.rng(tag).standard_normal(tuple(shape))
        return jnp.asarray(values, dtype=dtype)

    def key(self, tag: int):
        return jax.random.key(int(self.rng(tag).integers(2**31 - 1)))


# -- values, in words -----------------------------------------------------------------------------


def is_array(value) -> bool:
    return isinstance(value, (jax.Array, np.ndarray, FormattedArray, jax.ShapeDtypeStruct))


def is_floating(value) -> bool:
    return is_array(value) and jnp.issubdtype(value.dtype, jnp.floating)


def shape_text(shape) -> str:
    return str(tuple(int(s) for s in shape))


def describe_value(value) -> str:
    """``"float32 array of shape (4, 3)"``, ``"None"``, ``"a tuple"``..."""
    if value is None:
        return "None"
    if isinstance(value, FormattedArray):
        return f"{value.dtype.name} array of shape {shape_text(value.shape)} ({value.format!r})"
    if isinstance(value, (jax.Array, np.ndarray)):
        return f"{value.dtype.name} array of shape {shape_text(value.shape)}"
    return type_name(value)


def index_text(index: int, shape, fmt: str = "") -> str:
    """Element ``index`` of a flat array of ``shape``: ``"(B=0, C=2)"`` with a format, else
    ``"(0, 2)"``."""
    if not shape:
        return "()"
    position = np.unravel_index(index, shape)
    if fmt and len(fmt) == len(shape):
        return (
            "(" + ", ".join(f"{lab}={int(p)}" for lab, p in zip(fmt, position, strict=True)) + ")"
        )
    return str(tuple(int(p) for p in position))


def cast_floating(tree, dtype):
    """Cast every floating leaf of a pytree (a layer, inputs) to ``dtype``."""

    def cast(leaf):
        if isinstance(leaf, (jax.Array, np.ndarray)) and jnp.issubdtype(leaf.dtype, jnp.floating):
            return jnp.asarray(leaf, dtype)
        return leaf

    return jax.tree.map(cast, tree)


def positional_parameters(method):
    """``(parameters after self, required positional ones, whether it takes *args)``."""
    params = list(inspect.signature(method).parameters.values())[1:]
    required = [
        p
        for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    variadic = any(p.kind is p.VAR_POSITIONAL for p in params)
    return params, required, variadic


# -- comparisons ----------------------------------------------------------------------------------


def compare(what: str, expected, got, rtol: float, *, equal_nan: bool = False) -> list[str]:
    """``[]`` when ``got`` is within ``rtol`` (of the largest finite ``|expected|``) of
    ``expected``, else one line saying by how much and where.

    ``equal_nan``: NaN (and the same infinity) in both at the same place counts as equal.
    """
    expected, got = np.asarray(expected), np.asarray(got)
    if expected.shape != got.shape:
        return [f"{what} has shape {shape_text(got.shape)}, expected {shape_text(expected.shape)}"]
    e, g = expected.astype(np.float64), got.astype(np.float64)
    finite = np.abs(e[np.isfinite(e)])
    scale = max(float(np.max(finite, initial=0.0)), 1e-30)
    with np.errstate(invalid="ignore"):
        gap = np.abs(e - g)
        if equal_nan:
            gap = np.where((e == g) | (np.isnan(e) & np.isnan(g)), 0.0, gap)
    gap = np.where(np.isnan(gap), np.inf, gap)
    error = float(np.max(gap, initial=0.0))
    if not error <= rtol * scale:
        k = int(np.argmax(gap)) if gap.size else 0
        where = index_text(k, gap.shape) if gap.size else "()"
        if not np.isfinite(error):
            return [f"{what} is {g.flat[k]:.6g} at {where}, expected {e.flat[k]:.6g}"]
        return [f"{what} differs by {error:.3g} at {where} (relative {error / scale:.3g})"]
    return []


def compare_trees(what: str, expected, got, rtol_for, *, equal_nan: bool = False) -> list[str]:
    """`compare` leaf by leaf; ``rtol_for(expected leaf)`` gives each leaf's tolerance."""
    leaves_e, leaves_g = jax.tree.leaves(expected), jax.tree.leaves(got)
    if len(leaves_e) != len(leaves_g):
        return [f"{what}: {len(leaves_g)} values, expected {len(leaves_e)}"]
    problems = []
    for k, (e, g) in enumerate(zip(leaves_e, leaves_g, strict=True)):
        label = what if len(leaves_e) == 1 else f"{what} {k + 1}"
        problems += compare(label, e, g, rtol_for(e), equal_nan=equal_nan)
    return problems


def non_finite(value, fmt: str = "") -> str:
    """``""`` when every value is finite, else ``"NaN at (B=0, C=2) (3 of 24 values)"``."""
    value = np.asarray(value)
    if not np.issubdtype(value.dtype, np.inexact):
        return ""
    bad = ~np.isfinite(value)
    if not bad.any():
        return ""
    k = int(np.argmax(bad))
    kinds = [
        word
        for word, found in (("NaN", np.isnan(value).any()), ("Inf", np.isinf(value).any()))
        if found
    ]
    return (
        f"{' and '.join(kinds)} at {index_text(k, value.shape, fmt)} ({int(bad.sum())} of "
        f"{value.size} values)"
    )


# -- the numerical model --------------------------------------------------------------------------


class CheckModel:
    """Base of the checkers' models (``_numerical.Model``): the gradient sources.

    A subclass is a frozen dataclass with the fields ``with_backward``, ``with_autodiff`` and
    ``traceable``, and defines ``outputs(args, parts)``, ``backward_gradient(args, parts)`` (the
    code under test, all parts concatenated) and ``cotangents(args)`` (the upstream gradients).
    """

    with_backward: bool
    with_autodiff: bool
    traceable: bool

    def outputs(self, args: Any, parts: tuple) -> list:
        """The outputs at the point ``parts``."""
        raise NotImplementedError

    def runtime_outputs(self, args: Any, parts: tuple) -> list:
        """The outputs at ``parts`` as the runtime computes them (through the custom backward)."""
        raise NotImplementedError

    def backward_gradient(self, args: Any, parts: tuple) -> jax.Array:
        """The gradient from the code under test, all parts concatenated."""
        raise NotImplementedError

    def cotangents(self, args: Any) -> list:
        """The upstream gradients, one per output."""
        raise NotImplementedError

    def gradients(self, args, parts) -> dict:
        """The custom backward's gradient and/or JAX autodiff's (the VJP of the outputs)."""
        result = {}
        if self.with_backward:
            result["backward"] = self.backward_gradient(args, parts)
        if self.with_autodiff:
            outs, vjp = jax.vjp(lambda *p: self.outputs(args, p), *parts)
            cotangents = self.cotangents(args)
            cts = [jnp.asarray(c, y.dtype) for c, y in zip(cotangents, outs, strict=True)]
            result["autodiff"] = jnp.concatenate(vjp(cts))
        return result


def gradients_or_without_autodiff(model, args, parts, *, required: str = ""):
    """``(model, gradients, note)``: the model's gradients at ``parts``; if JAX autodiff fails
    as a reference, the model with it turned off and a note saying so.

    ``required``: when not empty, autodiff is the code under test, so its failure is not
    recoverable: `Unusable` with this text and the error's type.
    """
    try:
        return model, numerical.compute_gradients(model, args, parts), ""
    except Exception as error:  # noqa: BLE001 - retry without the autodiff reference
        if required:
            raise Unusable(f"{required}: {type(error).__name__}") from None
        model = dataclasses.replace(model, with_autodiff=False)
        note = (
            "JAX autodiff of forward is not available as a reference "
            f"({type(error).__name__}); only finite differences were used."
        )
        return model, numerical.compute_gradients(model, args, parts), note


class Unusable(Exception):
    """The gradient check cannot run, for a reason another test reports."""


# -- declared surrogate gradients -----------------------------------------------------------------


def declared_surrogates(cls, checker: str, inputs, learnables=()) -> dict[str, str]:
    """``cls.surrogate_gradients`` (``{input or learnable name: reason}``), validated.

    Raises:
      CheckError: it is not a mapping of names to reasons, or a name is neither an input nor a
        learnable of ``cls``.
    """
    declared = getattr(cls, "surrogate_gradients", None)
    if declared is None:
        return {}
    example = (
        f"surrogate_gradients = {{{(list(inputs) or ['x'])[0]!r}: 'straight-through estimator'}}"
    )
    if not isinstance(declared, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in declared.items()
    ):
        raise CheckError(
            f"{checker}: {cls.__name__}.surrogate_gradients is a {type_name(declared)}; expected "
            "a dict mapping input or learnable names to the reason their gradient is not the "
            f"derivative. Fix: {example}."
        )
    known = list(inputs) + list(learnables)
    for name in declared:
        if name not in known:
            what = f"inputs {list(inputs)}" + (
                f" and learnables {list(learnables)}" if learnables else ""
            )
            raise CheckError(
                f"{checker}: {cls.__name__}.surrogate_gradients names {name!r}, which is not an "
                f"input or learnable of {cls.__name__}; its {what}. Fix: key it by the name "
                f"whose gradient is intentionally not the derivative, e.g. {example}."
            )
    return dict(declared)


def surrogate_outcome(reason: str):
    return skipped(f"declared a surrogate gradient: {reason} (surrogate_gradients)")


SURROGATE_HINT = (
    "If this gradient is intentionally not the derivative (a straight-through estimator, "
    "gradient reversal, clipping), declare it on the class: surrogate_gradients = "
    "{{{name!r}: 'the reason'}}."
)


# -- mixed precision ------------------------------------------------------------------------------

MIXED_PRECISION_RTOL = {"float32": 1e-3, "bfloat16": 5e-2, "float16": 5e-2}
"""Tolerance of a gradient against JAX autodiff, relative to the largest reference value, when
the forward computes in that dtype inside."""


def narrowest_float(fn, *args):
    """The narrowest floating dtype that ``fn(*args)`` computes in (read from its jaxpr), or
    ``None`` when it is float64 throughout or cannot be traced."""
    try:
        closed = jax.make_jaxpr(fn)(*args)
    except Exception:  # noqa: BLE001 - not traceable: no claim either way
        return None
    found = set()
    pending = [closed.jaxpr]
    while pending:
        jaxpr = pending.pop()
        for eqn in jaxpr.eqns:
            for var in eqn.outvars:
                dtype = getattr(var.aval, "dtype", None)
                if dtype is not None and jnp.issubdtype(dtype, jnp.floating):
                    found.add(np.dtype(dtype))
        pending.extend(jax_core.subjaxprs(jaxpr))
    narrow = [d for d in found if d.itemsize < 8]
    return min(narrow, key=lambda d: d.itemsize) if narrow else None


def reference_outcome(
    what,
    got,
    expected,
    *,
    dtype,
    size,
    locate,
    who,
    fix,
    subject="the gradient of the loss",
    reference="JAX autodiff of forward",
):
    """The outcome of a gradient checked against JAX autodiff of a forward that computes in
    ``dtype`` inside (float64 finite differences cannot resolve it)."""
    rtol = MIXED_PRECISION_RTOL.get(np.dtype(dtype).name, 1e-3)
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    scale = float(np.max(np.abs(expected), initial=0.0))
    gap = np.abs(got - expected)
    error = float(np.max(np.where(np.isnan(gap), np.inf, gap), initial=0.0))
    method = (
        f"forward computes in {np.dtype(dtype).name} inside, which float64 finite differences "
        f"cannot resolve, so {subject} was compared with {reference} at "
        f"{np.dtype(dtype).name} tolerance ({rtol:g} of the largest value, {scale:.3g})"
    )
    if error <= rtol * scale:
        return passed(f"{method}: largest difference {error:.3g}")
    lines = [
        f"{subject[0].upper()}{subject[1:]} with respect to {what} ({size}) from {who} "
        f"disagrees with {reference}."
    ]
    lines += numerical.largest_errors(got, expected, range(got.size), locate)
    lines += [f"  ({method})", fix]
    return failed("\n".join(lines))


# -- gradient verdicts, in words ------------------------------------------------------------------


def gradient_outcome(key, verdicts, labels, *, shape, locate, who, fix, note=""):
    """The test outcome for one checked value's gradient verdict, with the words users need.

    Args:
      key: the verdict to describe, in ``verdicts``.
      verdicts: every value's verdict (for the swapped-gradients hint).
      labels: ``{key: "learnable 'alpha'"}`` for every verdict.
      shape: the value's shape (``None`` for a pytree of several arrays).
      locate: element index -> ``"(0, 0, 0, 7)"``.
      who: what computed the gradient under test (``"the custom backward"``).
      fix: the closing ``Fix: ...`` sentence.
      note: an extra line (e.g. that autodiff was unavailable as a reference).
    """
    verdict = verdicts[key]
    what = labels[key]
    method = numerical.describe_method(verdict)
    if verdict.status == "Incomplete":
        reasons = sorted({p.reason for p in verdict.unresolved})
        return incomplete(
            f"the gradient of {what} could not be verified: finite differences were unreliable "
            f"at every sample point ({'; '.join(reasons)}), even after moving it. The function "
            "may be non-differentiable almost everywhere, noisy, or compute in low precision."
        )
    if verdict.status == "Passed":
        return passed("\n".join([f"checked along {method}"] + ([note] if note else [])))
    if shape is not None:
        size = " x ".join(str(s) for s in shape) or "a scalar"
    else:
        size = f"{verdict.segment.size} values"
    lines = [
        f"The gradient of the loss with respect to {what} ({size}) from {who} disagrees with "
        "the numerical derivative."
    ]
    lines += numerical.describe_failure(verdict, locate)
    hint = _swap_hint(key, verdicts, labels)
    if hint:
        lines.append(hint)
    lines.append(fix)
    lines.append(f"(checked along {method})")
    if note:
        lines.append(note)
    return failed("\n".join(lines))


def _swap_hint(key, verdicts, labels) -> str:
    """A hint when this gradient equals another value's expected gradient (order swapped)."""
    verdict = verdicts[key]
    got = verdict.gradients[verdict.under_test]
    for other_key, other in verdicts.items():
        if other_key == key or other.segment.size != verdict.segment.size:
            continue
        reference = other.reference()
        if reference is None or not np.any(reference):
            continue
        scale = float(np.max(np.abs(reference)))
        if float(np.max(np.abs(got - reference))) <= 1e-6 * scale:
            return (
                f"  Hint: these values are the expected gradient of {labels[other_key]}: are two "
                "gradients returned in the wrong order?"
            )
    return ""


def record_gradient_tests(rec: Recorder, test: str, names, compute, *, fixed=None) -> None:
    """Record ``test[name]`` for each name from ``compute()`` (``{name: Outcome}``).

    The time is shared among the results. `Unusable` makes every one Incomplete; any other
    exception (the user's forward or backward raised) makes every one Failed. ``fixed``
    (``{name: Outcome}``, e.g. declared surrogates) holds outcomes decided whatever happens.
    """
    fixed = fixed or {}
    began = time.perf_counter()
    try:
        outcomes = compute()
    except Unusable as reason:
        outcomes = {name: incomplete(str(reason)) for name in names}
    except Exception as error:  # noqa: BLE001 - the user's forward/backward raised
        diagnostic = f"the gradient check could not run:\n{describe_exception(error)}"
        outcomes = {name: failed(diagnostic) for name in names}
    share = (time.perf_counter() - began) / max(len(names), 1)
    for name in names:
        rec.add(f"{test}[{name}]", fixed.get(name, outcomes.get(name)), duration=share)

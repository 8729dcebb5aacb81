r"""``second_order_gradients_are_correct``, for both checkers: is the backward differentiable?

A backward that uses ``jax.lax.stop_gradient`` on a value that depends on the inputs, or is not
JAX-differentiable code, passes every first-order test while the second derivative JAX takes
through it is silently wrong (often 0). This test differentiates the first-order gradient
$g(p)$ as the runtime computes it (through the custom rule) and compares, in float64,
$\nabla_p \langle v, g(p)\rangle$ for a random $v$ with central finite differences
of $\langle v, g(p)\rangle$, per input and learnable, with ``_numerical``'s probes. JAX
autodiff's second derivative of the forward computation serves as the reference where
``_numerical`` finds it agrees with the finite differences.

`SecondOrderModel` wraps a first-order model of either checker, which provides
``outputs`` (the forward, plain), ``runtime_outputs`` (the call as users make it, custom rule
wired in) and ``cotangents``.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from . import _numerical as numerical
from ._check_common import (
    MIXED_PRECISION_RTOL,
    CheckModel,
    Data,
    gradients_or_without_autodiff,
    narrowest_float,
    reference_outcome,
)
from ._check_report import Recorder, describe_exception, failed, incomplete, passed

TEST = "second_order_gradients_are_correct"
FIRST_ORDER_TEST = "gradients_are_correct"


@dataclass(frozen=True)
class SecondOrderModel:
    """$p \\mapsto g(p)$, the first-order gradient through the runtime (a
    ``_numerical.Model``); ``args``: ``(the first-order model's args, v)``."""

    first: CheckModel
    with_autodiff: bool = True
    traceable: bool = True

    def _first_order(self, args, parts, outputs):
        outs, vjp = jax.vjp(lambda *p: outputs(args, p), *parts)
        cotangents = self.first.cotangents(args)
        cts = [jnp.asarray(c, y.dtype) for c, y in zip(cotangents, outs, strict=True)]
        return jnp.concatenate(vjp(cts))

    def gradient(self, args, parts):
        """The first-order gradient as the runtime computes it, all parts concatenated."""
        return self._first_order(args, parts, self.first.runtime_outputs)

    def outputs(self, args, parts):
        return [self.gradient(args[0], parts)]

    def gradients(self, args, parts) -> dict:
        first_args, v = args
        _, vjp = jax.vjp(lambda *p: self.gradient(first_args, p), *parts)
        result = {"backward": jnp.concatenate(vjp(v))}
        if self.with_autodiff:
            hvp = lambda *p: self._first_order(first_args, p, self.first.outputs)  # noqa: E731
            _, vjp = jax.vjp(hvp, *parts)
            result["autodiff"] = jnp.concatenate(vjp(v))
        return result


def skip_reason(cls) -> str:
    """Why the test does not apply to ``cls`` (``""`` when it does)."""
    if getattr(cls, "once_differentiable", False):
        return (
            f"{cls.__name__} sets once_differentiable = True: its backward is declared "
            "first-order only"
        )
    return ""


def blocked_by_first_order(rec: Recorder):
    """Incomplete when a first-order gradient test failed (``None`` otherwise).

    With the second-order rule (outer derivatives use the hand-written backward), a wrong
    first-order gradient makes its derivative wrong too: a checker names the wrong gradient
    once, where it is wrong.
    """
    failing = [
        r.name
        for r in rec.results
        if r.name.startswith(f"{FIRST_ORDER_TEST}[") and r.status == "Failed"
    ]
    if not failing:
        return None
    return incomplete(
        f"first-order gradients are wrong ({', '.join(failing)}); fix those first (the second "
        "derivative differentiates them, so it cannot be right before they are)"
    )


@dataclass(frozen=True)
class Point:
    """The first-order check's point: what the second-order check differentiates around."""

    model: CheckModel  # a first-order model
    args: tuple
    base: np.ndarray
    scale: np.ndarray
    parts: tuple
    segments: tuple
    labels: dict  # segment name -> "input 'x'"
    locators: dict  # segment name -> element index -> "(0, 3)"


def second_order_outcome(
    point: Point, data: Data, *, who: str, trust_reference: bool = True, note: str = ""
):
    """The test's outcome: Passed, Failed naming the input or learnable with the largest
    error, or Incomplete. Must run with float64 enabled.

    ``trust_reference``: JAX autodiff's second derivative of forward is the derivative of the
    gradient under test (no surrogate gradient declared), so a forward computing in a narrower
    dtype inside may be checked against it.
    """
    if not point.model.traceable:
        return incomplete(
            "the forward could not be traced (it was checked eagerly; see "
            "jit_agrees_with_eager), so JAX cannot differentiate its gradient"
        )
    model = SecondOrderModel(point.model, with_autodiff=point.model.with_autodiff)
    size = sum(s.size for s in point.segments)
    v = data.normal(90, (size,), jnp.float64)
    args = (point.args, v)
    try:
        jax.eval_shape(lambda p: model.outputs(args, p), point.parts)
    except Exception as error:  # noqa: BLE001 - the first-order gradient itself failed
        return incomplete(
            "the first-order gradient could not be computed through the runtime (see "
            f"backward_runs):\n{describe_exception(error)}"
        )
    try:
        model, grads, reference_note = gradients_or_without_autodiff(model, args, point.parts)
    except Exception as error:  # noqa: BLE001 - that is the finding
        return failed(
            f"JAX cannot differentiate the gradient from {who}:\n{describe_exception(error)}\n"
            + _FIX
        )
    dtype = None
    if trust_reference and "autodiff" in grads:
        dtype = narrowest_float(lambda p: point.model.outputs(point.args, p), point.parts)
    if dtype is not None and _first_order_agrees(model, point, dtype):
        return _against_reference(point, grads, dtype, who)
    verdicts = numerical.check_gradients(
        model,
        args,
        point.base,
        point.scale,
        [v],
        point.segments,
        seed=data.seq(91),
        gradients=grads,
    )
    notes = [n for n in (note, reference_note) if n]
    return _outcome(point, verdicts, who, notes)


_FIX = (
    "Fix: write backward as differentiable JAX code (jax.numpy operations; no "
    "jax.lax.stop_gradient on values that depend on the inputs, no NumPy conversions or host "
    "callbacks), or, if it is meant to be first-order only, declare it: "
    "once_differentiable = True."
)


def _outcome(point: Point, verdicts, who: str, notes):
    failing = [name for name, v in verdicts.items() if v.status == "Failed"]
    unresolved = [name for name, v in verdicts.items() if v.status == "Incomplete"]
    labels = point.labels
    if failing:
        worst = max(failing, key=lambda name: _worst_error(verdicts[name]))
        verdict = verdicts[worst]
        lines = [
            f"The second derivative through {who} is wrong with respect to {labels[worst]} "
            "(the largest error): JAX's derivative of the gradient <v, dL/dp> disagrees with "
            "central finite differences of that gradient. JAX differentiates backward's code; "
            "a backward that uses jax.lax.stop_gradient or is otherwise not differentiable "
            "gives a silently wrong (often zero) second derivative."
        ]
        lines += numerical.describe_failure(verdict, point.locators[worst])
        others = [labels[n] for n in failing if n != worst]
        if others:
            lines.append(f"  also wrong with respect to: {', '.join(others)}")
        lines.append(_FIX)
        lines.append(f"(checked along {numerical.describe_method(verdict)})")
        return failed("\n".join(lines + notes))
    if unresolved and len(unresolved) == len(verdicts):
        reasons = sorted({p.reason for n in unresolved for p in verdicts[n].unresolved})
        return incomplete(
            "the second derivative could not be verified: finite differences of the gradient "
            f"were unreliable at every sample point ({'; '.join(reasons)}), even after moving it."
        )
    checked = [labels[n] for n in verdicts if n not in unresolved]
    lines = [
        f"JAX's derivative of <v, dL/dp> (the gradient from {who}) agrees with finite "
        "differences of the gradient for "
    ]
    lines[0] += ", ".join(checked)
    if unresolved:
        lines.append(
            "not verified (finite differences unreliable): "
            + ", ".join(labels[n] for n in unresolved)
        )
    return passed("\n".join(lines + notes))


def _worst_error(verdict) -> float:
    errors = [p.relative_error(verdict.under_test) for p in verdict.failing()]
    return max(errors, default=0.0)


def _first_order_agrees(model: SecondOrderModel, point: Point, dtype) -> bool:
    """Whether the gradient under test equals autodiff's of forward (at ``dtype``'s tolerance),
    so that autodiff's second derivative of forward is the reference for its derivative."""
    got = np.asarray(model.gradient(point.args, point.parts))
    expected = np.asarray(model._first_order(point.args, point.parts, point.model.outputs))
    rtol = MIXED_PRECISION_RTOL.get(np.dtype(dtype).name, 1e-3)
    return bool(np.max(np.abs(got - expected), initial=0.0) <= rtol * np.max(np.abs(expected)))


def _against_reference(point: Point, grads, dtype, who: str):
    lines, failures = [], []
    for segment in point.segments:
        got = grads["backward"][segment.start : segment.stop]
        expected = grads["autodiff"][segment.start : segment.stop]
        outcome = reference_outcome(
            point.labels[segment.name],
            got,
            expected,
            dtype=dtype,
            size=f"{segment.size} values",
            locate=point.locators[segment.name],
            who=who,
            fix=_FIX,
            subject="JAX's derivative of <v, dL/dp>",
            reference="JAX autodiff's second derivative of forward",
        )
        if outcome.status == "Failed":
            failures.append(outcome.diagnostic)
        else:
            lines.append(f"{point.labels[segment.name]}: {outcome.diagnostic}")
    if failures:
        return failed("\n".join(failures))
    return passed("\n".join(lines))

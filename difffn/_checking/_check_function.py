"""``check_function``: the checks of ``check_layer``, for a ``DifferentiableFunction``.

``check_function(fcn, *example_inputs)`` runs the tests of ``_check_list`` that
``check_function`` runs (forward, backward, gradients per input, ``compute_gradients``, jit and
vmap), in that order, and returns a [`CheckReport`][difffn.CheckReport]. Pytree inputs are checked
leaf by
leaf (``_check_function_inputs``).

The gradient tests run in float64 (enabled only inside the check) on the example inputs cast to
float64, with random upstream gradients; see ``_numerical.py`` for the method and tolerances.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._core import BackwardError, CheckError, type_name
from .._function import DifferentiableFunction, run_forward
from .._function import input_names as _input_names
from . import _check_second_order as second_order
from ._check_common import (
    Data,
    as_key,
    compare,
    compare_trees,
    declared_surrogates,
    describe_value,
    is_array,
    record_gradient_tests,
    surrogate_outcome,
)
from ._check_function_gradients import FunctionGradients
from ._check_function_inputs import (
    ExampleInputs,
    call_backward,
    describe_input,
    differentiable,
    leaf_gradients,
    output_leaves,
    second_example,
    validate_inputs,
)
from ._check_list import FUNCTION, run_by
from ._check_report import (
    CheckReport,
    Recorder,
    describe_exception,
    failed,
    incomplete,
    passed,
    skipped,
)

GRADIENTS = "gradients_are_correct"
TRANSFORM_RTOL = {"float16": 1e-2, "bfloat16": 1e-2, "float32": 1e-5, "float64": 1e-12}


def check_function(
    fcn: Callable[..., Any], *example_inputs: Any, key: jax.Array | None = None
) -> CheckReport:
    """Check a ``DifferentiableFunction``: forward, backward, gradients, flags and transforms.

    Args:
      fcn: a ``df.DifferentiableFunction`` instance.
      *example_inputs: one example array, or pytree of arrays, per forward input (formats are
        stripped, as in a call). Each floating-point leaf of a pytree input gets its own gradient
        test, named by its path: ``gradients_are_correct[params['w']]``.
      key: a ``jax.random`` key (or an int seed) for the upstream gradients; default
        ``jax.random.key(0)``.

    Returns:
      A [`CheckReport`][difffn.CheckReport] (see [`df.check_layer`][difffn.check_layer]).

    Raises:
      CheckError: ``fcn`` is not a DifferentiableFunction instance, the example inputs do
        not match its forward, or the class's ``surrogate_gradients`` names something that is
        not an input.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> class Cube(df.DifferentiableFunction):
      ...     save_inputs_for_backward = True
      ...     def forward(self, x):
      ...         return x**3
      ...     def backward(self, dy, compute_gradients, x):
      ...         return 3 * x**2 * dy
      >>> report = df.check_function(Cube(), jnp.linspace(-1.0, 1.0, 5))
      >>> report.failed, report["gradients_are_correct[x]"].status
      (0, 'Passed')
    """
    xs = _validate(fcn, example_inputs)
    key = as_key(key)
    recorder = Recorder()
    _FunctionChecker(fcn, xs, key, recorder).run_all()
    inputs = ", ".join(describe_input(x) for x in xs)
    return recorder.report(repr(fcn), inputs)


def _validate(fcn, example_inputs) -> tuple:
    if isinstance(fcn, type) and issubclass(fcn, DifferentiableFunction):
        raise CheckError(
            f"check_function got the class {fcn.__name__}, not an instance. Fix: "
            f"check_function({fcn.__name__}(...), *example_inputs)."
        )
    if not isinstance(fcn, DifferentiableFunction):
        raise CheckError(
            f"check_function got a {type_name(fcn)}; expected a df.DifferentiableFunction "
            "instance. Fix: pass an instance of your subclass (use df.check_layer for a layer)."
        )
    return validate_inputs(type(fcn), example_inputs)


class _FunctionChecker:
    def __init__(self, fcn, xs, key, recorder: Recorder):
        self.fcn, self.xs, self.rec = fcn, xs, recorder
        self.data = Data(key)
        self.cls = type(fcn)
        self.names = _input_names(self.cls, len(xs))
        self.inputs = ExampleInputs(xs, self.names)
        self.leaves = self.inputs.leaves
        self.surrogates = declared_surrogates(self.cls, "check_function", self.names)
        self.gradients = FunctionGradients(fcn, self.inputs, self.data)
        self.outputs = None
        self.unusable: str | None = "backward did not run (see backward_runs)"
        self.invalid: dict[int, str] = {}  # leaf index -> the unusable gradient

    def cotangents(self, outputs, tag: int) -> list:
        """Random upstream gradients, one per output leaf."""
        return [
            self.data.normal(tag + i, y.shape, y.dtype if differentiable(y) else jnp.float32)
            for i, y in enumerate(output_leaves(outputs))
        ]

    def run_all(self) -> None:
        """Run the list; a test with a placeholder records its own results."""
        bodies = {
            "forward_runs": self.test_forward_runs,
            "forward_returns_declared_outputs": self.test_forward_outputs,
            "backward_runs": self.test_backward_runs,
            "backward_returns_valid_gradients": self.test_backward_valid,
            "gradients_are_correct": self.run_gradient_tests,
            "second_order_gradients_are_correct": self.test_second_order,
            "forward_mode_is_correct": self.test_forward_mode,
            "compute_gradients_is_respected": self.test_compute_gradients,
            "jit_agrees_with_eager": self.test_jit,
            "vmap_agrees_with_eager": self.test_vmap,
        }
        for test in run_by(FUNCTION):
            if test.placeholder:
                bodies[test.name]()
            else:
                self.rec.run(test.name, bodies[test.name])

    def _require_forward(self):
        if self.outputs is None:
            raise incomplete("forward did not run (see forward_runs)")

    def test_forward_runs(self):
        self.fcn.forward(*self.xs)

    def test_forward_outputs(self):
        outputs, memory = run_forward(self.fcn, self.xs)
        self.outputs = outputs
        del memory

    def test_backward_runs(self):
        self._require_forward()
        call_backward(
            self.fcn, self.xs, self.cotangents(self.outputs, 100), self.inputs.all_flags()
        )

    def test_backward_valid(self):
        self._require_forward()
        inputs = self.inputs
        self.unusable = "backward did not run (see backward_runs)"
        grads = call_backward(
            self.fcn, self.xs, self.cotangents(self.outputs, 100), inputs.all_flags()
        )
        order = ", ".join(f"dLd{n}" for n in self.names)
        if not isinstance(grads, tuple) or len(grads) != len(self.xs):
            got = f"{len(grads)} values" if isinstance(grads, tuple) else type_name(grads)
            self.unusable = f"backward returned {got} (see backward_returns_valid_gradients)"
            return failed(
                f"backward returned {got}; expected {len(self.xs)} gradients ({order}), one per "
                "input in forward's order (None where compute_gradients is False)."
            )
        try:
            found = leaf_gradients(self.fcn, inputs, grads)
        except BackwardError as error:
            self.unusable = "backward returned a gradient of the wrong structure (see "
            self.unusable += "backward_returns_valid_gradients)"
            return failed(f"{error} Expected {order}, in forward's input order.")
        self.unusable = None
        problems = []
        for k, (x, g) in enumerate(zip(self.leaves, found, strict=True)):
            name, wanted = inputs.leaf_names[k], differentiable(x)
            if wanted and (not is_array(g) or tuple(g.shape) != tuple(x.shape)):
                self.invalid[k] = describe_value(g)
            if g is None:
                if wanted:
                    problems.append(f"the gradient of {name!r} is None")
                continue
            if not wanted:
                problems.append(
                    f"the gradient of {name!r} is {describe_value(g)}; {name!r} is not "
                    "differentiable, expected None"
                )
            elif not is_array(g):
                problems.append(f"the gradient of {name!r} is {describe_value(g)}")
            elif tuple(g.shape) != tuple(x.shape):
                problems.append(
                    f"the gradient of {name!r} has shape {tuple(g.shape)}; expected "
                    f"{tuple(x.shape)}"
                )
            elif g.dtype != x.dtype:
                problems.append(f"the gradient of {name!r} is {g.dtype}; expected {x.dtype}")
        if problems:
            return failed(
                "backward returned invalid gradients: "
                + "; ".join(problems)
                + f". Expected {order}, each with the structure, shapes and dtypes of its input. "
                "Fix: for an input broadcast in forward, sum over the broadcast axes with "
                "keepdims=True."
            )
        return None

    # -- gradients --

    def run_gradient_tests(self) -> None:
        """Record ``gradients_are_correct[NAME]`` for every input leaf, in order."""
        rec, inputs = self.rec, self.inputs
        checked = inputs.differentiable()
        names = list(inputs.leaf_names)
        fixed = {
            inputs.leaf_names[k]: skipped(f"{inputs.label(k)} is {x.dtype}, not differentiable")
            for k, x in enumerate(self.leaves)
            if k not in checked
        }
        for k in checked:
            owner = self.names[inputs.owner[k]]
            if owner in self.surrogates:
                fixed[inputs.leaf_names[k]] = surrogate_outcome(self.surrogates[owner])
        if self.outputs is None or self.unusable:
            reason = "forward did not run" if self.outputs is None else (self.unusable or "")
            for n in names:
                rec.add(f"{GRADIENTS}[{n}]", fixed.get(n, incomplete(reason)))
            return

        def compute():
            with jax.enable_x64(True):
                outcomes = self.gradients.first_order(
                    [k for k in checked if inputs.leaf_names[k] not in fixed]
                )
            for k in self.invalid:
                outcomes[k] = incomplete(
                    f"the backward's gradient for {inputs.label(k)} is unusable (got "
                    f"{self.invalid[k]}); see backward_returns_valid_gradients"
                )
            return {inputs.leaf_names[k]: outcomes[k] for k in outcomes}

        record_gradient_tests(rec, GRADIENTS, names, compute, fixed=fixed)

    def test_second_order(self):
        reason = second_order.skip_reason(self.cls)
        if reason:
            return skipped(reason)
        checked = self.inputs.differentiable()
        if not checked:
            return skipped("no input is differentiable")
        if self.outputs is None or self.unusable or self.invalid:
            reason = self.unusable or "backward returned unusable gradients"
            if self.outputs is None:
                reason = "forward did not run"
            return incomplete(f"{reason} (see backward_returns_valid_gradients)")
        blocked = second_order.blocked_by_first_order(self.rec)
        if blocked is not None:
            return blocked
        with jax.enable_x64(True):
            return self.gradients.second_order(checked, trust_reference=not self.surrogates)

    def test_forward_mode(self):
        if not callable(getattr(self.cls, "jvp", None)) and not self.fcn.jvp_from_forward:
            return skipped(
                "no jvp and jvp_from_forward = False: forward mode is a df.ForwardModeError"
            )
        self._require_forward()
        checked = self.inputs.differentiable()
        if not checked:
            return skipped("no input is differentiable")
        with jax.enable_x64(True):
            return self._forward_mode(checked)

    def _forward_mode(self, checked):
        leaves = [x.astype(jnp.float64) if k in checked else x for k, x in enumerate(self.leaves)]
        tangents = [self.data.normal(500 + k, leaves[k].shape, jnp.float64) for k in checked]

        def f(*values):
            full = list(leaves)
            for k, v in zip(checked, values, strict=True):
                full[k] = v
            return [y for y in jax.tree.leaves(self._call(*full)) if differentiable(y)]

        primals = [leaves[k] for k in checked]
        _, jvp_out = jax.jvp(f, primals, tangents)
        eps = 1e-6
        plus = f(*(x + eps * t for x, t in zip(primals, tangents, strict=True)))
        minus = f(*(x - eps * t for x, t in zip(primals, tangents, strict=True)))
        numerical = [(a - b) / (2 * eps) for a, b in zip(plus, minus, strict=True)]
        problems = compare_trees(
            "jvp against finite differences", numerical, jvp_out, lambda _: 1e-5
        )
        if self.surrogates:  # a surrogate backward is not the derivative, by design
            return failed("; ".join(problems)) if problems else None
        cotangents = [self.data.normal(600 + i, y.shape, y.dtype) for i, y in enumerate(jvp_out)]
        _, vjp = jax.vjp(f, *primals)
        lhs = sum(jnp.vdot(a, b) for a, b in zip(jvp_out, cotangents, strict=True))
        rhs = sum(jnp.vdot(a, b) for a, b in zip(tangents, vjp(cotangents), strict=True))
        problems += compare("<jvp(t), c> against <t, backward(c)>", lhs, rhs, 1e-8)
        if problems:
            how = "jvp" if callable(getattr(self.cls, "jvp", None)) else "autodiff of forward"
            return failed(
                f"forward mode ({how}) disagrees: "
                + "; ".join(problems)
                + ". Fix: make jvp (or forward) and backward compute the same derivative."
            )
        return None

    # -- flags and transformations: the function of its input leaves --

    def _call(self, *leaves):
        return self.fcn(*jax.tree.unflatten(self.inputs.tree, list(leaves)))

    def _vjp(self, leaves, cotangents, chosen):
        def f(*values):
            full = list(leaves)
            for k, v in zip(chosen, values, strict=True):
                full[k] = v
            return jax.tree.leaves(self._call(*full))

        _, vjp = jax.vjp(f, *(leaves[k] for k in chosen))
        return vjp(list(cotangents))

    def test_compute_gradients(self):
        self._require_forward()
        inputs = self.inputs
        checked = inputs.differentiable()
        if len(checked) < 2:
            return passed("a single differentiable input: every flag set is the full one")
        cotangents = self.cotangents(self.outputs, 200)
        full = self._vjp(self.leaves, cotangents, checked)
        problems, extra = [], []
        for position, k in enumerate(checked):
            flags = inputs.flags([j == k for j in range(len(self.leaves))])
            try:
                raw = leaf_gradients(
                    self.fcn, inputs, call_backward(self.fcn, self.xs, cotangents, flags)
                )
            except Exception as error:  # noqa: BLE001 - that is the finding
                problems.append(
                    f"with compute_gradients={flags} backward raised "
                    f"{describe_exception(error).splitlines()[0]}"
                )
                continue
            extra += [
                inputs.leaf_names[j]
                for j, g in enumerate(raw)
                if j != k and g is not None and is_array(g)
            ]
            (alone,) = self._vjp(self.leaves, cotangents, [k])
            problems += compare(
                f"dLd{inputs.leaf_names[k]} asked alone",
                full[position],
                alone,
                _rtol(full[position]),
            )
        if problems:
            return failed(
                "backward does not handle compute_gradients: "
                + "; ".join(problems)
                + ". Fix: compute the gradient of input i when compute_gradients[i] is True (for "
                "a pytree input, per leaf), return None for the others, and do not depend on "
                "which others are asked for."
            )
        if extra:
            names = sorted(set(extra))
            return passed(
                f"backward also computes gradients nobody asked for ({', '.join(names)}); they "
                "are discarded. Return None for them to save the work."
            )
        return None

    def test_jit(self):
        self._require_forward()
        checked = self.inputs.differentiable()
        cotangents = self.cotangents(self.outputs, 300)
        problems = []
        eager, jitted = self._call(*self.leaves), jax.jit(self._call)(*self.leaves)
        problems += compare_trees("outputs", eager, jitted, _rtol, equal_nan=True)
        if checked:
            eager_vjp = self._vjp(self.leaves, cotangents, checked)
            jit_vjp = jax.jit(lambda xs, c: self._vjp(xs, c, checked))(self.leaves, cotangents)
            problems += compare_trees("gradients", eager_vjp, jit_vjp, _rtol, equal_nan=True)
        if problems:
            return failed("jax.jit disagrees with eager: " + "; ".join(problems))
        return None

    def test_vmap(self):
        self._require_forward()
        other = [second_example(self.data.rng(20 + k), x) for k, x in enumerate(self.leaves)]
        stacked = [jnp.stack([a, b]) for a, b in zip(self.leaves, other, strict=True)]
        mapped = jax.vmap(self._call)(*stacked)
        one, two = self._call(*self.leaves), self._call(*other)
        expected = jax.tree.map(lambda a, b: jnp.stack([a, b]), one, two)
        problems = compare_trees("outputs", expected, mapped, _rtol, equal_nan=True)
        checked = self.inputs.differentiable()
        if checked:
            cotangents = self.cotangents(one if isinstance(one, tuple) else (one,), 400)
            stacked_ct = [jnp.stack([c, c]) for c in cotangents]
            mapped_vjp = jax.vmap(lambda xs, c: self._vjp(xs, c, checked))(stacked, stacked_ct)
            expected_vjp = jax.tree.map(
                lambda a, b: jnp.stack([a, b]),
                self._vjp(self.leaves, cotangents, checked),
                self._vjp(other, cotangents, checked),
            )
            problems += compare_trees("gradients", expected_vjp, mapped_vjp, _rtol, equal_nan=True)
        if problems:
            return failed(
                "jax.vmap over a stack of two examples disagrees with calling on each: "
                + "; ".join(problems)
                + ". Fix: forward and backward must treat leading axes like any other (no "
                "hard-coded shapes or axis numbers counted from the front)."
            )
        return None


def _rtol(value) -> float:
    """The tolerance of the transformation tests for ``value``'s dtype."""
    return TRANSFORM_RTOL.get(np.asarray(value).dtype.name, 1e-5)

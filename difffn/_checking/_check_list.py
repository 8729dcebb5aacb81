"""The test list of ``check_layer`` and ``check_function``: one declarative table.

Each `CheckTest` says what the test is called, what it checks, MATLAB's ``checkLayer`` test
it corresponds to (where there is one), which checker runs it and when it is skipped. The
checkers run their tests in this order, so a report lists them in this order too, and the table
in ``docs/checking.md`` is this table (``tests/test_check_list.py`` compares them; regenerate it
with ``python -c "import difffn._checking._check_list as c; print(c.markdown_table())"``).

A parametrized test has a placeholder in its documented name (``predict_keeps_dtype[DTYPE]``):
with ``params`` the report has one result per value (``predict_keeps_dtype[float32]``); without,
one per input or learnable (``gradients_are_correct[alpha]``).
"""

from __future__ import annotations

from dataclasses import dataclass

LAYER, FUNCTION = "check_layer", "check_function"


@dataclass(frozen=True)
class CheckTest:
    """One test of the list."""

    name: str
    checks: str
    checkers: tuple[str, ...]
    skipped: str = ""
    matlab: str = ""
    placeholder: str = ""
    params: tuple[str, ...] = ()

    @property
    def documented_name(self) -> str:
        return f"{self.name}[{self.placeholder}]" if self.placeholder else self.name

    def result_names(self) -> tuple[str, ...]:
        """The names its results get in a report (``()`` when they depend on the subject)."""
        if not self.placeholder:
            return (self.name,)
        return tuple(f"{self.name}[{p}]" for p in self.params)


_BOTH = (LAYER, FUNCTION)
_DTYPES = ("float32", "float64")

TESTS: tuple[CheckTest, ...] = (
    CheckTest(
        "initialize_runs",
        "an uninitialized layer initializes with the layouts and `key`; no parameter is left "
        "`None`",
        (LAYER,),
        skipped="the layer is given initialized",
    ),
    CheckTest(
        "method_signatures_are_well_formed",
        "`forward`, `backward`, `initialize`, `reset_state` take what they must",
        (LAYER,),
        matlab="functionSyntaxesAreCorrect",
    ),
    CheckTest(
        "predict_runs",
        "`predict` runs and returns the declared outputs (and state)",
        (LAYER,),
        matlab="predictDoesNotError",
    ),
    CheckTest(
        "forward_runs",
        "`forward` runs (on a layer: and returns the declared outputs, state and memory)",
        _BOTH,
        matlab="forwardDoesNotError",
    ),
    CheckTest(
        "forward_returns_declared_outputs",
        "`num_outputs` arrays, then `num_memory_values` values",
        (FUNCTION,),
    ),
    CheckTest(
        "forward_and_predict_agree_in_size",
        "same outputs, shapes and formats",
        (LAYER,),
        matlab="forwardPredictAreConsistentInSize",
    ),
    CheckTest(
        "predict_keeps_dtype",
        "outputs and state keep the input's dtype (checked with float64 enabled, so a stray "
        "float64 constant shows)",
        (LAYER,),
        matlab="predictIsConsistentInType",
        placeholder="DTYPE",
        params=_DTYPES,
    ),
    CheckTest(
        "forward_keeps_dtype",
        "the same for `forward`",
        (LAYER,),
        matlab="forwardIsConsistentInType",
        placeholder="DTYPE",
        params=_DTYPES,
    ),
    CheckTest(
        "runs_on_gpu",
        "predict and forward on a GPU, compared with the CPU",
        (LAYER,),
        skipped="no GPU",
    ),
    CheckTest(
        "multiple_observations_are_consistent",
        "predict on a batch equals predict on each observation alone (the `B` label)",
        (LAYER,),
        skipped="no layout has a `B` label, or an output has none",
    ),
    CheckTest(
        "predict_returns_valid_state",
        "state count, shape (an axis of size 1 may grow), dtype; a state field holding a pytree "
        "of arrays, leaf by leaf",
        (LAYER,),
        skipped="no state",
        matlab="predictReturnsValidStates",
    ),
    CheckTest(
        "forward_returns_valid_state",
        "the same for `forward`",
        (LAYER,),
        skipped="no state",
        matlab="forwardReturnsValidStates",
    ),
    CheckTest(
        "reset_state_runs",
        "`reset_state` keeps the state's shapes and changes nothing else",
        (LAYER,),
        skipped="no state",
        matlab="resetStateDoesNotError",
    ),
    CheckTest(
        "initialize_keeps_set_parameters",
        "initializing again changes nothing already set",
        (LAYER,),
        skipped="no `initialize`",
        matlab="initializeDoesNotChangeLearnableParametersWhenTheyAreNotEmpty",
    ),
    CheckTest(
        "formattable_predict_is_formatted",
        "a formattable layer's `predict` returns formatted outputs with a `C` label",
        (LAYER,),
        skipped="not formattable",
        matlab="formattableLayerPredictIsFormatted",
    ),
    CheckTest(
        "formattable_forward_is_formatted",
        "the same for `forward`",
        (LAYER,),
        skipped="not formattable",
        matlab="formattableLayerForwardIsFormatted",
    ),
    CheckTest(
        "backward_runs",
        "`backward` runs with random upstream gradients",
        _BOTH,
        skipped="no `backward` (a layer)",
        matlab="backwardDoesNotError",
    ),
    CheckTest(
        "backward_returns_valid_gradients",
        "one gradient per input and learnable (and state, when a layer's backward takes "
        "`dLdSout`), with their shapes",
        _BOTH,
        skipped="no `backward` (a layer)",
        matlab="backwardIsConsistentInSize",
    ),
    CheckTest(
        "backward_keeps_dtype",
        "gradients keep the dtype of their values",
        (LAYER,),
        skipped="no `backward`",
        matlab="backwardIsConsistentInType",
        placeholder="DTYPE",
        params=_DTYPES,
    ),
    CheckTest(
        "gradients_are_correct",
        "per input and learnable: the gradient agrees with numerical derivatives",
        _BOTH,
        skipped="NAME holds no floating-point values",
        matlab="gradientsAreNumericallyCorrect",
        placeholder="NAME",
    ),
    CheckTest(
        "second_order_gradients_are_correct",
        "the gradient is differentiable: JAX's derivative of `<v, gradient>` (through the custom "
        "rule) agrees with finite differences of the gradient; names the input or learnable "
        "with the largest error (Incomplete when a first-order gradient test failed)",
        _BOTH,
        skipped="the class sets `once_differentiable = True`, or the layer `acceleratable = False`",
    ),
    CheckTest(
        "forward_mode_is_correct",
        "with `jvp` or `jvp_from_forward = True`: `jax.jvp` along random tangents agrees with "
        "finite differences of the call and with the backward (`<jvp(t), c> = <t, vjp(c)>`)",
        (FUNCTION,),
        skipped="no `jvp` and `jvp_from_forward = False` (forward mode is a `df.ForwardModeError`)",
    ),
    CheckTest(
        "compute_gradients_is_respected",
        "one input's gradient asked for alone is the same; `backward` copes with False flags",
        (FUNCTION,),
    ),
    CheckTest(
        "jit_agrees_with_eager",
        "`jax.jit` of the call and of its VJP agree with eager",
        (FUNCTION,),
    ),
    CheckTest(
        "vmap_agrees_with_eager",
        "`jax.vmap` over a stack of two examples agrees with eager",
        (FUNCTION,),
    ),
    CheckTest(
        "forward_agrees_at_precision",
        "with `precision=`: `forward` on inputs and learnables rounded to the compute dtype "
        "agrees with float32 on the same values (8 machine epsilons, normwise); an output that "
        "overflows is named",
        (LAYER,),
        skipped="no `precision` given",
    ),
    CheckTest(
        "gradients_agree_at_precision",
        "with `precision=`: the gradients at the compute dtype (the custom backward, or "
        "autodiff) agree with float32 autodiff of `forward` on the same values; a gradient "
        "that overflows is named",
        (LAYER,),
        skipped="no `precision` given",
    ),
    CheckTest(
        "autodiff_works",
        "without a custom backward, JAX differentiates `predict` and `forward` (finite gradients)",
        (LAYER,),
        skipped="the layer defines `backward`",
        matlab="backwardPropagationDoesNotError",
        placeholder="METHOD",
        params=("predict", "forward"),
    ),
    CheckTest(
        "export_matches_predict",
        "`predict` exports with `jax.export` (symbolic batch) and matches, derivative included",
        (LAYER,),
        skipped="`check_export=False`",
    ),
)


def run_by(checker: str) -> tuple[CheckTest, ...]:
    """The tests ``checker`` (``"check_layer"`` or ``"check_function"``) runs, in order."""
    return tuple(t for t in TESTS if checker in t.checkers)


def markdown_table() -> str:
    """The table of ``docs/checking.md``."""
    rows = [
        "| test | run by | what it checks | MATLAB's test | skipped when |",
        "|---|---|---|---|---|",
    ]
    for t in TESTS:
        matlab = f"`{t.matlab}`" if t.matlab else ""
        by = ", ".join(f"`{c}`" for c in t.checkers)
        rows.append(f"| `{t.documented_name}` | {by} | {t.checks} | {matlab} | {t.skipped} |")
    return "\n".join(rows)

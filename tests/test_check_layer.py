"""check_layer: the checkLayer test list, wrong backwards named, no false alarms, the report.

Layers come from ``layers_for_checks.py``: the seeds' SReLU, PReLU and ELU written from the
formulas, and versions with one realistic mistake each.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import layers_for_checks as L
import numpy as np
import pytest

import difffn as df
from difffn.testing import assert_layer_valid

IMAGES = df.Layout((None, 6, 6, 3), "BSSC")


def failed(report) -> set[str]:
    return {r.name for r in report.results if r.status == "Failed"}


def not_ok(report) -> set[str]:
    return {r.name for r in report.results if r.status in ("Failed", "Incomplete")}


# -- correct layers: zero failures, over many random seeds ----------------------------------------


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("cls", [L.SReLULayer, L.PReLULayer, L.ELULayer], ids=lambda c: c.__name__)
def test_seed_layers_written_correctly_pass(cls, seed):
    report = df.check_layer(cls(), IMAGES, key=seed)
    assert not_ok(report) == set(), str(report)
    assert report.ok
    names = {r.name for r in report.results if r.status == "Passed"}
    assert {"gradients_are_correct[in]", "backward_runs", "predict_runs"} <= names


@pytest.mark.parametrize(
    ("layer", "layouts"),
    [
        (L.ELUWithMemory(), (IMAGES,)),
        (L.WeightedSum(), (df.Layout((None, 5), "BC"), df.Layout((None, 5), "BC"))),
        (L.RunningMean(), (IMAGES,)),
        (L.ChannelPool(), (IMAGES,)),
        (L.EagerTanh(), (df.Layout((3, 4), "BC"),)),
        (L.SReLULayer(), (df.Layout((2, 5, 4), "BTC"),)),
        (L.ScaleAndSine(), (df.Layout((None, 3), "BC"),)),
        (L.Accumulator(), (df.Layout((None, 3), "BC"),)),
    ],
    ids=[
        "memory",
        "two-inputs",
        "state",
        "formattable",
        "not-acceleratable",
        "sequence",
        "two-outputs",
        "state-gradients",
    ],
)
def test_other_correct_layers_pass(layer, layouts):
    report = df.check_layer(layer, *layouts)
    assert report.ok, str(report)


@pytest.mark.parametrize("seed", range(3))
def test_a_sample_point_on_a_kink_is_moved_not_reported(seed):
    # relu(bias) with every bias element exactly at 0: central differences there give half the
    # slope; the checker sees one-sided differences disagree, moves the point, and passes.
    report = df.check_layer(L.ShiftedReLU(), IMAGES, key=seed)
    assert report.ok, str(report)
    assert "move" in report["gradients_are_correct[bias]"].diagnostic


def test_near_kinks_on_a_larger_layout_pass():
    # 8 x 10 x 10 x 8: thresholds sit among hundreds of data points per channel.
    report = df.check_layer(L.SReLULayer(), df.Layout((8, 10, 10, 8), "BSSC"), key=3)
    assert report.ok, str(report)


# -- wrong backwards: the right input or learnable named ------------------------------------------

BUGS = {
    "a-chain-rule-missing": (L.SReLUNoChainRule, {"gradients_are_correct[in]"}),
    "b-learnables-swapped": (
        L.SReLUSwapped,
        {"gradients_are_correct[left_threshold]", "gradients_are_correct[left_slope]"},
    ),
    "c-elu-blog-typo": (L.ELUTypo, {"gradients_are_correct[alpha]"}),
    "d-wrong-axes": (L.PReLUWrongAxes, {"gradients_are_correct[alpha]"}),
    "e-memory-ignored": (L.ELUIgnoresMemory, {"gradients_are_correct[in]"}),
    "wrong-output": (L.ScaleAndSineWrongOutput, {"gradients_are_correct[w]"}),
}


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("bug", list(BUGS))
def test_each_wrong_backward_fails_with_the_culprit_named(bug, seed):
    cls, expected = BUGS[bug]
    report = df.check_layer(cls(), IMAGES, key=seed)
    assert failed(report) == expected, str(report)
    assert report.failed == len(expected) and not report.ok
    for name in expected:
        diagnostic = report[name].diagnostic
        culprit = name[name.index("[") + 1 : -1]
        assert f"'{culprit}'" in diagnostic
        assert re.search(r"largest absolute error \S+ at \(", diagnostic), diagnostic
        assert re.search(r"largest relative error \S+ at \(", diagnostic), diagnostic
        assert "Fix:" in diagnostic
    # the wrong gradient is named once: its derivative is not blamed as well
    second = report["second_order_gradients_are_correct"]
    assert second.status == "Incomplete", str(report)
    assert "first-order gradients are wrong" in second.diagnostic
    assert all(name in second.diagnostic for name in expected), second.diagnostic
    # a failed gradient does not stop the other checks
    assert report["export_matches_predict"].status == "Skipped"
    assert report["autodiff_works[forward]"].status == "Skipped"


def test_state_gradients_are_checked_when_backward_takes_them():
    report = df.check_layer(L.Accumulator(), df.Layout((None, 3), "BC"))
    assert report["gradients_are_correct[total]"].status == "Passed"


def test_a_failure_says_where_with_axis_labels():
    report = df.check_layer(L.SReLUNoChainRule(), IMAGES)
    diagnostic = report["gradients_are_correct[in]"].diagnostic
    assert re.search(r"at \(B=\d+, S=\d+, S=\d+, C=\d+\): got \S+, expected \S+", diagnostic)


def test_swapped_learnables_get_a_hint():
    report = df.check_layer(L.SReLUSwapped(), IMAGES)
    diagnostic = report["gradients_are_correct[left_threshold]"].diagnostic
    assert "expected gradient of learnable 'left_slope'" in diagnostic
    assert "wrong order" in diagnostic


# -- other defects, each caught by its own test ---------------------------------------------------


@pytest.mark.parametrize(
    ("layer", "expected"),
    [
        (L.DtypeChanging(), {"predict_keeps_dtype[float64]", "forward_keeps_dtype[float64]"}),
        (L.SizeMismatch(), {"forward_and_predict_agree_in_size"}),
        (L.BadState(), {"predict_returns_valid_state", "forward_returns_valid_state"}),
        (L.OverwritingInitialize(), {"initialize_keeps_set_parameters"}),
    ],
    ids=["dtype", "size", "state", "initialize"],
)
def test_defects_are_caught_by_the_right_test(layer, expected):
    report = df.check_layer(layer, IMAGES)
    assert failed(report) == expected, str(report)


def test_the_dtype_diagnostic_says_what_and_how_to_fix():
    diagnostic = df.check_layer(L.DtypeChanging(), IMAGES)["predict_keeps_dtype[float64]"]
    assert "output 'out' is float32; expected float64" in diagnostic.diagnostic
    assert "Fix:" in diagnostic.diagnostic


def test_initialize_diagnostic_names_the_parameter():
    result = df.check_layer(L.OverwritingInitialize(), IMAGES)["initialize_keeps_set_parameters"]
    assert "learnable 'alpha'" in result.diagnostic
    assert "if self.alpha is None" in result.diagnostic


def test_state_diagnostic_gives_shapes():
    result = df.check_layer(L.BadState(), IMAGES)["predict_returns_valid_state"]
    assert "state 'count' has shape (6, 6, 3); the layer's is (3,)" in result.diagnostic


class RunningMoments(df.Layer):
    """State held as a dict of arrays (as flax.nnx batch statistics are); ``wrong`` breaks one
    leaf's shape."""

    moments: dict | None = df.state(
        default_factory=lambda: {"mean": jnp.zeros((3,)), "var": jnp.ones((3,))}
    )
    wrong: bool = False

    def predict(self, x):
        x2 = x.reshape(-1, 3)
        mean = 0.9 * self.moments["mean"] + 0.1 * jnp.mean(x2, axis=0)
        var = 0.9 * self.moments["var"] + 0.1 * jnp.var(x2, axis=0)
        return x, {"mean": mean, "var": var[None] if self.wrong else var}


def test_a_state_held_as_a_dict_of_arrays_is_checked_leaf_by_leaf():
    report = df.check_layer(RunningMoments(), IMAGES)
    assert report.ok, str(report)
    assert report["predict_returns_valid_state"].status == "Passed"
    report = df.check_layer(RunningMoments(wrong=True), IMAGES)
    assert failed(report) == {"predict_returns_valid_state", "forward_returns_valid_state"}
    assert "state 'moments'['var'] has shape (1, 3); the layer's is (3,)" in (
        report["predict_returns_valid_state"].diagnostic
    )


class RaisesInPredict(df.Layer):
    def predict(self, x):
        raise ValueError("the data is the wrong shape for this layer")


def test_a_predict_that_raises_fails_predict_runs_and_names_the_line():
    report = df.check_layer(RaisesInPredict(), IMAGES)
    result = report["predict_runs"]
    assert result.status == "Failed"
    assert "ValueError: the data is the wrong shape" in result.diagnostic
    assert "test_check_layer.py" in result.diagnostic and "in predict" in result.diagnostic
    assert report["forward_and_predict_agree_in_size"].status == "Incomplete"


class NoForwardMemory(L.ELULayer):
    """forward without the memory value a layer with backward must return."""

    def forward(self, x, key=None):
        return self.predict(x)


def test_a_forward_without_memory_fails_forward_runs():
    result = df.check_layer(NoForwardMemory(), IMAGES)["forward_runs"]
    assert result.status == "Failed"
    assert "memory" in result.diagnostic


# -- what is skipped, and why ---------------------------------------------------------------------


def test_skipped_tests_say_why():
    report = df.check_layer(L.PReLULayer(), IMAGES)
    assert report["export_matches_predict"].diagnostic == "check_export=False"
    assert "no state" in report["reset_state_runs"].diagnostic
    assert "not formattable" in report["formattable_predict_is_formatted"].diagnostic
    assert "defines backward" in report["autodiff_works[predict]"].diagnostic
    if not any(d.platform == "gpu" for d in jax.devices()):
        assert report["runs_on_gpu"].diagnostic == "no GPU"


def test_a_layout_without_a_batch_label_skips_the_multi_observation_test():
    result = df.check_layer(L.PReLULayer(), df.Layout((6, 3), "SC"))[
        "multiple_observations_are_consistent"
    ]
    assert result.status == "Skipped"
    assert "B (batch) label" in result.diagnostic


class MixesObservations(df.Layer):
    def predict(self, x):
        return x - jnp.mean(x, axis=0, keepdims=True)


def test_mixing_observations_is_caught():
    report = df.check_layer(MixesObservations(), IMAGES)
    assert failed(report) == {"multiple_observations_are_consistent"}, str(report)


def test_export_is_checked_when_asked():
    report = df.check_layer(L.SReLULayer(), IMAGES, check_export=True)
    assert report["export_matches_predict"].status == "Passed", str(report)


def test_autodiff_layers_run_the_autodiff_tests():
    report = df.check_layer(L.RunningMean(), IMAGES)
    assert report["autodiff_works[predict]"].status == "Passed"
    assert report["backward_runs"].status == "Skipped"
    assert report["gradients_are_correct[scale]"].status == "Passed"


# -- the report -----------------------------------------------------------------------------------


def test_the_report_prints_like_matlab():
    report = df.check_layer(L.SReLUSwapped(name="srelu"), IMAGES)
    text = str(report)
    lines = text.splitlines()
    assert lines[0] == "Checking SReLUSwapped (layer 'srelu') with Layout((None, 6, 6, 3), 'BSSC')"
    assert " .  predict_runs" in lines
    assert " F  gradients_are_correct[left_slope]" in lines
    summary = lines.index("Test Summary:")
    # the second-order check differentiates the wrong first-order gradients: Incomplete, not run
    assert re.fullmatch(r"\t \d+ Passed, 2 Failed, 1 Incomplete, \d+ Skipped\.", lines[summary + 1])
    assert re.fullmatch(r"\t Time elapsed: \S+ seconds\.", lines[summary + 2])
    assert text.index("Test Summary:") < text.index("FAILED: gradients_are_correct[left_slope]")
    assert report.passed + report.failed + report.incomplete + report.skipped == len(report)
    assert repr(report).startswith("CheckReport(SReLUSwapped (layer 'srelu'): ")
    assert {r.status for r in report.results} <= {"Passed", "Failed", "Incomplete", "Skipped"}


def test_check_layer_initializes_with_the_key_and_is_deterministic():
    layer = L.SReLUSwapped()
    one, two = df.check_layer(layer, IMAGES, key=7), df.check_layer(layer, IMAGES, key=7)
    a = one["gradients_are_correct[left_slope]"].diagnostic
    assert a == two["gradients_are_correct[left_slope]"].diagnostic
    assert one["initialize_runs"].status == "Passed"
    ready = L.SReLULayer().initialize(IMAGES, key=jax.random.key(0))
    assert df.check_layer(ready, IMAGES)["initialize_runs"].status == "Skipped"


def test_assert_layer_valid():
    report = assert_layer_valid(L.PReLULayer(), IMAGES)
    assert report.ok
    with pytest.raises(AssertionError, match=r"(?s)gradients_are_correct\[alpha\].*Test Summary"):
        assert_layer_valid(L.ELUTypo(), IMAGES)


# -- misuse ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((L.SReLULayer, IMAGES), r"got the class SReLULayer.*Fix: check_layer\(SReLULayer\(\)"),
        ((lambda x: x, IMAGES), r"got a function; expected a df.Layer instance"),
        ((L.SReLULayer(),), r"has 1 input\(s\) \['in'\] but got 0 layout\(s\)"),
        ((L.SReLULayer(), IMAGES, IMAGES), r"but got 2 layout\(s\)"),
        (
            (L.SReLULayer(), np.zeros((4, 6, 6, 3))),
            r"layout 1 .* ndarray.*df.Layout\(\(4, 6, 6, 3\), fmt\)",
        ),
        (
            (L.SReLULayer(), df.dlarray(jnp.zeros((4, 6, 6, 3)), "BSSC")),
            r"FormattedArray.*df.Layout.of\(x\)",
        ),
    ],
    ids=["class", "not-a-layer", "no-layout", "two-layouts", "array", "formatted-array"],
)
def test_misuse_is_a_check_error(args, match):
    with pytest.raises(df.CheckError, match=match):
        df.check_layer(*args)


def test_a_bad_key_is_a_check_error():
    with pytest.raises(df.CheckError, match="expected a jax.random key or an int seed"):
        df.check_layer(L.SReLULayer(), IMAGES, key="zero")


# -- surrogate gradients --------------------------------------------------------------------------


class GradientReversal(df.Layer):
    """Identity forward; backward reverses the gradient (domain-adversarial training)."""

    def predict(self, x):
        return x

    def backward(self, x, y, dLdY, memory):
        return -dLdY


class DeclaredGradientReversal(GradientReversal):
    surrogate_gradients = {"in": "gradient reversal"}


def test_gradient_reversal_fails_undeclared_and_names_the_declaration():
    report = df.check_layer(GradientReversal(), IMAGES)
    assert failed(report) == {"gradients_are_correct[in]"}, str(report)
    assert (
        "surrogate_gradients = {'in': 'the reason'}"
        in report["gradients_are_correct[in]"].diagnostic
    )


def test_declared_gradient_reversal_is_skipped_with_its_reason_and_the_rest_runs():
    report = df.check_layer(DeclaredGradientReversal(), IMAGES)
    assert report.ok, str(report)
    result = report["gradients_are_correct[in]"]
    assert (result.status, result.diagnostic) == (
        "Skipped",
        "declared a surrogate gradient: gradient reversal (surrogate_gradients)",
    )
    undeclared = df.check_layer(GradientReversal(), IMAGES)
    assert [r.name for r in report.results] == [r.name for r in undeclared.results]
    assert report["second_order_gradients_are_correct"].status == "Passed"


class QuantizedScale(df.Layer):
    """x * round(4 w) / 4 per channel; w's gradient passes straight through the rounding."""

    surrogate_gradients = {"w": "straight-through estimator"}
    w: jax.Array | None = df.learnable(
        default_factory=lambda: jnp.array([0.3, 1.1, 2.6]).reshape(1, 1, 1, 3)
    )

    def predict(self, x):
        return x * (jnp.round(4 * self.w) / 4)

    def backward(self, x, y, dLdY, memory):
        return dLdY * (jnp.round(4 * self.w) / 4), L.broadcast_sum(dLdY * x, self.w)


def test_a_declared_surrogate_learnable_is_skipped_and_the_input_still_checked():
    report = df.check_layer(QuantizedScale(), IMAGES)
    assert report.ok, str(report)
    assert report["gradients_are_correct[w]"].status == "Skipped"
    assert "straight-through estimator" in report["gradients_are_correct[w]"].diagnostic
    assert report["gradients_are_correct[in]"].status == "Passed"


class MisnamedSurrogate(QuantizedScale):
    surrogate_gradients = {"out": "straight-through estimator"}


def test_a_surrogate_that_is_no_input_or_learnable_is_a_check_error():
    with pytest.raises(
        df.CheckError,
        match=r"check_layer: MisnamedSurrogate.surrogate_gradients names 'out', which is not an "
        r"input or learnable of MisnamedSurrogate; its inputs \['in'\] and learnables \['w'\]",
    ):
        df.check_layer(MisnamedSurrogate(), IMAGES)


# -- second order ---------------------------------------------------------------------------------


class PReLUStopGradient(L.PReLULayer):
    """Right first derivatives, but alpha is cut out of dLdX's derivative."""

    def backward(self, x, y, dy, memory):
        dx = dy * jnp.where(x > 0, 1.0, jax.lax.stop_gradient(self.alpha))
        return dx, L.broadcast_sum(dy * jnp.minimum(x, 0), self.alpha)


class PReLUFirstOrderOnly(PReLUStopGradient):
    once_differentiable = True


def test_a_stop_gradient_in_backward_fails_the_second_order_test_naming_the_learnable():
    report = df.check_layer(PReLUStopGradient(), IMAGES)
    assert failed(report) == {"second_order_gradients_are_correct"}, str(report)
    diagnostic = report["second_order_gradients_are_correct"].diagnostic
    assert "wrong with respect to learnable 'alpha' (the largest error)" in diagnostic
    assert re.search(r"largest absolute error \S+ at \(0, 0, 0, \d\): got 0, expected", diagnostic)
    assert df.check_layer(L.PReLULayer(), IMAGES)["second_order_gradients_are_correct"].status == (
        "Passed"
    )


def test_once_differentiable_layers_skip_the_second_order_test():
    report = df.check_layer(PReLUFirstOrderOnly(), IMAGES)
    assert report.ok, str(report)
    result = report["second_order_gradients_are_correct"]
    assert result.status == "Skipped"
    assert "once_differentiable = True" in result.diagnostic


class SquareStopGradient(df.DifferentiableFunction):
    save_inputs_for_backward = True

    def forward(self, x):
        return x**2

    def backward(self, dy, compute_gradients, x):
        return 2 * jax.lax.stop_gradient(x) * dy


class UsesSquareStopGradient(df.Layer):
    """No backward of its own: autodiff goes through a function with a first-order backward."""

    def predict(self, x):
        return SquareStopGradient()(x)


def test_the_second_order_test_runs_through_autodiff_layers_too():
    report = df.check_layer(UsesSquareStopGradient(), IMAGES)
    assert failed(report) == {"second_order_gradients_are_correct"}, str(report)
    diagnostic = report["second_order_gradients_are_correct"].diagnostic
    assert "wrong with respect to input 'in'" in diagnostic
    assert "JAX autodiff of forward" in diagnostic


# -- NaN is not batch mixing ----------------------------------------------------------------------


class Log(df.Layer):
    def predict(self, x):
        return jnp.log(x)


def test_a_layer_producing_nan_is_not_blamed_for_mixing_observations():
    report = df.check_layer(Log(), IMAGES)
    assert failed(report) == set(), str(report)
    result = report["multiple_observations_are_consistent"]
    assert result.status == "Incomplete"
    assert re.search(
        r"predict produced non-finite values for the example data \(standard normal values\): "
        r"output 'out' has NaN at \(B=\d, S=\d, S=\d, C=\d\) \(\d+ of 432 values\) in a batch of 4",
        result.diagnostic,
    ), result.diagnostic
    assert "mix" not in result.diagnostic


# -- mixed precision ------------------------------------------------------------------------------


class Float32PReLU(L.PReLULayer):
    """Computes in float32 whatever the data's dtype (mixed precision); returns that dtype."""

    def predict(self, x):
        x32, alpha32 = x.astype(jnp.float32), self.alpha.astype(jnp.float32)
        return (jnp.maximum(x32, 0) + alpha32 * jnp.minimum(x32, 0)).astype(x.dtype)


def test_a_float32_forward_is_checked_against_autodiff_not_left_incomplete():
    report = df.check_layer(Float32PReLU(), IMAGES)
    assert report.ok, str(report)
    for name in ("in", "alpha"):
        diagnostic = report[f"gradients_are_correct[{name}]"].diagnostic
        assert "forward computes in float32 inside" in diagnostic
        assert "compared with JAX autodiff of forward at float32 tolerance" in diagnostic

"""check_layer(..., precision=...): forward and gradients at a mixed-precision compute dtype.

The reference is JAX's own float32 computation (autodiff of the forward) on the same rounded
values; the built-in layers must pass in bfloat16 and float16, the ELU with the blog's typo in
its backward must still fail, and a layer that overflows float16's range is named.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import layers_for_checks as L
import pytest

import difffn as df
from difffn._checking import _check_layer_precision as precision_tests
from difffn._checking import _check_layer_structure as structure
from difffn._checking._check_layer_subject import LayerSubject
from difffn._checking._check_report import Recorder

TESTS = ("forward_agrees_at_precision", "gradients_agree_at_precision")


def at_precision(layer, layout, precision):
    """The two precision tests alone on an initialized layer (what check_layer runs them on),
    without the float64 gradient tests that check_layer runs first."""
    key = jax.random.key(0)
    subject = LayerSubject(layer.initialize(layout, key=key), (layout,), key, Recorder(), precision)
    subject.rec.run("forward_runs", structure.forward_runs, subject)
    return {name: subject.rec.run(name, getattr(precision_tests, name), subject) for name in TESTS}


class Exp(df.Layer):
    """3e4 exp(x): past float16's largest value (65504) for x > 0.78, a fifth of normal data."""

    def predict(self, x):
        return 3e4 * jnp.exp(x)


BUILT_IN = [
    (df.layers.ELU(), df.Layout((None, 5), "BC")),
    (df.layers.Conv2D(3, 4), df.Layout((None, 6, 6, 2), "BSSC")),
    (df.layers.BatchNorm(), df.Layout((None, 6, 6, 3), "BSSC")),
    (df.layers.LayerNorm(), df.Layout((None, 5, 6), "BTC")),
]


@pytest.mark.parametrize("precision", ["bfloat16", "float16"])
@pytest.mark.parametrize(
    ("layer", "layout"), BUILT_IN, ids=[type(layer).__name__ for layer, _ in BUILT_IN]
)
def test_built_in_layers_pass_at_the_compute_dtype(layer, layout, precision):
    results = at_precision(layer, layout, precision)
    assert {name: r.status for name, r in results.items()} == dict.fromkeys(TESTS, "Passed"), {
        name: r.diagnostic for name, r in results.items()
    }


def test_a_wrong_backward_still_fails_at_the_compute_dtype():
    right = at_precision(L.ELULayer(), df.Layout((None, 6), "BC"), "bfloat16")
    assert {r.status for r in right.values()} == {"Passed"}  # the same layer written right
    report = df.check_layer(L.ELUTypo(), df.Layout((None, 6), "BC"), precision="bfloat16")
    assert report["gradients_agree_at_precision"].status == "Failed"
    assert report["forward_agrees_at_precision"].status == "Passed"
    diagnostic = report["gradients_agree_at_precision"].diagnostic
    assert "ELUTypo at precision='bfloat16'" in diagnostic
    assert "gradient dLdalpha (learnable) differs from float32" in diagnostic
    assert "dLdin" not in diagnostic  # the typo is in dLdalpha only
    assert "the custom backward" in diagnostic
    # the same report format: one line per test, the failure among them
    assert "gradients_agree_at_precision" in str(report)


def test_a_float16_overflow_is_named():
    layout = df.Layout((None, 6), "BC")
    results = at_precision(Exp(name="exp"), layout, "float16")
    forward = results["forward_agrees_at_precision"]
    assert forward.status == "Failed"
    assert "Exp (layer 'exp') at precision='float16'" in forward.diagnostic
    assert "forward output 'out' overflows in float16" in forward.diagnostic
    assert "compute the part that overflows in float32" in forward.diagnostic
    assert results["gradients_agree_at_precision"].status == "Failed"
    assert "gradient dLdin (input) overflows in float16" in (
        results["gradients_agree_at_precision"].diagnostic
    )
    # bfloat16 has float32's range: the same layer passes
    assert {r.status for r in at_precision(Exp(), layout, "bfloat16").values()} == {"Passed"}


def test_without_precision_the_tests_are_skipped():
    report = df.check_layer(L.ELULayer(), df.Layout((None, 6), "BC"))
    for name in TESTS:
        assert report[name].status == "Skipped"
        assert "precision='bfloat16'" in report[name].diagnostic


def test_an_unknown_precision_is_a_named_error():
    with pytest.raises(df.CheckError, match=r"precision='float64' is not a compute dtype"):
        df.check_layer(L.ELULayer(), df.Layout((None, 6), "BC"), precision="float64")


def test_the_tolerances_are_eight_machine_epsilons():
    for name in ("bfloat16", "float16"):
        assert precision_tests.TOLERANCES[name] == 8 * float(jnp.finfo(name).eps)
